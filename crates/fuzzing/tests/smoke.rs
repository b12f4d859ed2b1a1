//! The fuzz targets' smoke run in the test command: every target over its seed corpus
//! (`fuzz/seeds/<target>/`, made by `write_seeds` below) and then over mutations of it (bit
//! flips, random bytes, insertions, deletions, splices; a seeded generator, so a failure
//! replays) for a time budget per target, `UROCE_FUZZ_SMOKE_SECS` (default 5 s: about a
//! minute for all twelve). A failed invariant panics here with the input that failed
//! (printed as hex, and written to `target/fuzz-smoke-failure-<target>`). The long runs use
//! cargo-fuzz on the same functions (docs/FUZZING.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use uroce_fuzzing::TARGETS;

fn seeds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds")
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(seeds_dir().join(target)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    files.iter().filter_map(|f| std::fs::read(f).ok()).collect()
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// A mutation of one of `pool` (or of nothing).
fn mutate(rng: &mut Rng, pool: &[Vec<u8>]) -> Vec<u8> {
    let mut v = if pool.is_empty() {
        Vec::new()
    } else {
        pool[rng.below(pool.len())].clone()
    };
    for _ in 0..1 + rng.below(8) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let n = 1 + rng.below(32);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(i..i, bytes);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(64));
                v.drain(i..i + n);
            }
            4 if !pool.is_empty() => {
                let other = &pool[rng.below(pool.len())];
                let i = rng.below(v.len() + 1);
                let j = rng.below(other.len() + 1);
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
            _ => v.extend((0..1 + rng.below(16)).map(|_| rng.next() as u8)),
        }
    }
    v.truncate(16 * 1024);
    v
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs `f(input)`, reporting the input if it panics.
fn run_one(name: &str, f: fn(&[u8]), input: &[u8]) {
    if let Err(e) = std::panic::catch_unwind(|| f(input)) {
        let out = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target")
            .join(format!("fuzz-smoke-failure-{name}"));
        let _ = std::fs::write(&out, input);
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!(
            "{name} failed ({why}) on input {} (written to {})",
            hex(input),
            out.display()
        );
    }
}

#[test]
fn every_target_over_its_seeds_and_their_mutations() {
    let secs: u64 = std::env::var("UROCE_FUZZ_SMOKE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let mut report = Vec::new();
    for (i, (name, f)) in TARGETS.iter().enumerate() {
        let pool = seeds(name);
        assert!(
            !pool.is_empty(),
            "no seeds for {name} in {}",
            seeds_dir().display()
        );
        for s in &pool {
            run_one(name, *f, s);
        }
        let mut rng = Rng(0x5eed_0000 + i as u64);
        let start = Instant::now();
        let mut runs = pool.len() as u64;
        // Bounded by the time budget.
        while start.elapsed() < Duration::from_secs(secs) {
            for _ in 0..64 {
                let input = mutate(&mut rng, &pool);
                run_one(name, *f, &input);
                runs += 1;
            }
        }
        report.push(format!("{name}: {runs} inputs"));
    }
    eprintln!("fuzz smoke ({secs} s per target): {}", report.join(", "));
}

#[test]
fn the_engine_seeds_reach_past_the_first_checks() {
    // Each engine target's seeds get packets accepted and WRs completed: the corpus
    // starts the fuzzer deep in the protocol, not at the QPN and PSN checks.
    for (name, _) in TARGETS {
        let mut total = uroce_fuzzing::engines::Reached::default();
        for s in seeds(name) {
            let Some(r) = uroce_fuzzing::engines::reached(name, &s) else {
                break;
            };
            total.completions += r.completions;
            total.transmitted += r.transmitted;
            total.accepted += r.accepted;
        }
        if name.ends_with("_engine") {
            eprintln!("{name}: {total:?}");
            assert!(
                total.accepted > 0 && total.completions > 0 && total.transmitted > 0,
                "{name}: {total:?}"
            );
        }
    }
}

/// Writes the seed corpus (`cargo test -p uroce-fuzzing --test smoke -- --ignored
/// write_seeds`): for each target a few inputs that reach past its first checks.
#[test]
#[ignore = "writes fuzz/seeds; run by hand when the targets change"]
fn write_seeds() {
    for (name, inputs) in uroce_fuzzing_seeds::all() {
        let dir = seeds_dir().join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("seed dir");
        for (i, input) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), input).expect("write seed");
        }
    }
}

/// The seed inputs, built from real packets and MADs.
mod uroce_fuzzing_seeds {
    use std::net::{IpAddr, Ipv4Addr};

    use uroce_proto::cm::{AgentConfig, CmAgent, ConnectParams};
    use uroce_proto::time::Instant;
    use uroce_wire::cm::rdma_cm::{gid_of, CmaHeader, PortSpace, HEADER_LEN};
    use uroce_wire::cm::PathRepr;
    use uroce_wire::ip::{roce_headers, Endpoints};
    use uroce_wire::opcode::op;
    use uroce_wire::{aeth, bth, deth, icrc, reth, xrceth, PacketRepr, Psn};

    fn bth_for(opcode: u8, dest_qp: u32, psn: u32) -> bth::Repr {
        bth::Repr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: true,
            psn: Psn::new(psn),
        }
    }

    fn bytes(p: &PacketRepr<'_>) -> Vec<u8> {
        let mut v = vec![0u8; p.buffer_len()];
        let n = p.emit(&mut v).expect("emit");
        v.truncate(n);
        v
    }

    /// An engine-target command handing `pkt` over with `patch` (see
    /// `uroce_fuzzing::engines::drive`).
    fn packet_cmd(patch: u8, pkt: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8, patch];
        v.extend_from_slice(&(pkt.len() as u16).to_be_bytes());
        v.extend_from_slice(pkt);
        v
    }

    fn engine_seeds(config: &[u8], packets: &[Vec<u8>], acks: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let post_recv = [6u8, 0x04, 0x00]; // a 1 KiB receive
                                           // IBV_WR_SEND (2) of 64 B from the writable region, signalled.
        let post_send = [5u8, 2, 0, 64, 0, 0, 0, 0, 0x10, 0, 0x02];
        let tick = [3u8, 0, 0x10, 0, 0]; // ~1 ms
        let drain = [4u8, 64];
        let mut out = Vec::new();
        for p in packets {
            // In sequence (patch: our QPN, the expected PSN, the Q_Key or SRQ number).
            let mut v = config.to_vec();
            v.extend_from_slice(&post_recv);
            v.extend(packet_cmd(0x0b, p));
            v.extend_from_slice(&drain);
            out.push(v);
        }
        let mut v = config.to_vec();
        v.extend_from_slice(&post_send);
        v.extend_from_slice(&drain);
        v.extend_from_slice(&tick);
        v.extend_from_slice(&drain);
        out.push(v);
        for a in acks {
            // A SEND, then its acknowledgement (patch: our QPN, our first PSN).
            let mut v = config.to_vec();
            v.extend_from_slice(&post_send);
            v.extend_from_slice(&drain);
            v.extend(packet_cmd(0x07, a));
            v.extend_from_slice(&drain);
            out.push(v);
        }
        out
    }

    fn rc_packets(xrc: bool) -> Vec<Vec<u8>> {
        let data = [0x5a_u8; 64];
        let x = |o: u8| if xrc { o | 0xa0 } else { o };
        let xeth = xrc.then_some(xrceth::Repr { srqn: 5 });
        let mut v = Vec::new();
        for opcode in [
            op::RC_SEND_ONLY,
            op::RC_RDMA_WRITE_ONLY,
            op::RC_RDMA_READ_REQUEST,
        ] {
            let mut p = PacketRepr::new(bth_for(x(opcode), 0x12, 7), &data);
            p.xrceth = xeth;
            if opcode != op::RC_SEND_ONLY {
                p.reth = Some(reth::Repr {
                    va: 0x1_0000,
                    rkey: 0x100,
                    dma_len: 64,
                });
            }
            if opcode == op::RC_RDMA_READ_REQUEST {
                p.payload = &[];
            }
            v.push(bytes(&p));
        }
        v
    }

    fn ack(xrc: bool) -> Vec<u8> {
        let opcode = if xrc {
            op::XRC_ACKNOWLEDGE
        } else {
            op::RC_ACKNOWLEDGE
        };
        let mut ack = PacketRepr::new(bth_for(opcode, 0x12, 0x00ff_ff00), &[]);
        ack.aeth = Some(aeth::Repr {
            syndrome: aeth::Syndrome::ACK_NO_CREDIT,
            msn: 1,
        });
        bytes(&ack)
    }

    fn uc_packets() -> Vec<Vec<u8>> {
        let data = [0x5a_u8; 64];
        let send = PacketRepr::new(bth_for(op::UC_SEND_ONLY, 0x12, 7), &data);
        let mut write = PacketRepr::new(bth_for(op::UC_RDMA_WRITE_ONLY, 0x12, 7), &data);
        write.reth = Some(reth::Repr {
            va: 0x1_0000,
            rkey: 0x100,
            dma_len: 64,
        });
        vec![bytes(&send), bytes(&write)]
    }

    fn cma_header() -> Vec<u8> {
        let mut h = vec![0; HEADER_LEN];
        CmaHeader {
            version: 0,
            src_port: 4000,
            src_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            dst_ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        }
        .emit(&mut h)
        .expect("header");
        h
    }

    fn ud_packets() -> Vec<Vec<u8>> {
        let mut p = PacketRepr::new(bth_for(op::UD_SEND_ONLY, 0x12, 0), b"datagram");
        p.deth = Some(deth::Repr {
            qkey: 0x1111_2222,
            src_qp: 0x34,
        });
        vec![bytes(&p)]
    }

    fn req_mad() -> Vec<u8> {
        let to = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let from = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let mut private_data = vec![0; HEADER_LEN];
        CmaHeader {
            version: 0,
            src_port: 4000,
            src_ip: from,
            dst_ip: to,
        }
        .emit(&mut private_data)
        .expect("header");
        let mut a = CmAgent::new(AgentConfig::default());
        a.connect(
            Instant::ZERO,
            &ConnectParams {
                remote: to,
                service_id: PortSpace::Tcp.service_id(7471),
                local_qpn: 0x34,
                starting_psn: 0x1000,
                qkey: 0,
                responder_resources: 4,
                initiator_depth: 4,
                transport_service_type: 0,
                extended_transport_type: 0,
                path: PathRepr {
                    local_lid: 0xffff,
                    remote_lid: 0xffff,
                    local_gid: gid_of(from),
                    remote_gid: gid_of(to),
                    hop_limit: 64,
                    local_ack_timeout: 14,
                    ..PathRepr::default()
                },
                pkey: 0xffff,
                path_mtu: 3,
                retry_count: 7,
                rnr_retry_count: 7,
                cm_response_timeout: 16,
                packet_life_time: 0,
                max_cm_retries: 3,
                srq: false,
                private_data,
            },
        )
        .expect("connect");
        a.poll_transmit().expect("a REQ").1.to_vec()
    }

    fn sealed_ipv4(roce: &[u8]) -> Vec<u8> {
        let ep = Endpoints::roce(
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            49152,
        );
        let mut h = vec![0u8; ep.headers_len().expect("headers")];
        let (ip_len, _) = roce_headers(&ep, roce.len(), &mut h).expect("headers");
        let mut body = roce.to_vec();
        let (ip, udp) = h.split_at(ip_len);
        icrc::seal(ip, udp, &mut body).expect("seal");
        // Sealed for Identification 0 with DF, but the header on the wire carries another
        // (as a Soft-RoCE peer's would): the solver must find 0 and DF.
        let mut ip = ip.to_vec();
        ip[4..6].copy_from_slice(&0x1234_u16.to_be_bytes());
        [ip, udp.to_vec(), body].concat()
    }

    pub fn all() -> Vec<(&'static str, Vec<Vec<u8>>)> {
        let rc_config = [2u8, 14, 7, 7, 2, 2];
        let rc = rc_packets(false);
        let xrc = rc_packets(true);
        let ud = ud_packets();
        let mad = req_mad();
        let mut cm_agent = Vec::new();
        for attr_patch in [0x03u8, 0x05] {
            let mut v = vec![0u8, attr_patch];
            v.extend_from_slice(&mad);
            v.extend_from_slice(&[4, 0, 0x10, 0, 0, 4]);
            cm_agent.push(v);
        }
        cm_agent.push(vec![5, 0, 0, 0x34, 7, 4, 0, 0, 0, 0xff, 10]);
        let sealed: Vec<Vec<u8>> = rc.iter().chain(&ud).map(|p| sealed_ipv4(p)).collect();
        let mut gro = Vec::new();
        for (len, seg, flags, room) in [
            (3000u16, 1040u16, 0u8, 64u8),
            (4096, 0, 0, 64),
            (5000, 1040, 1, 64),
            (10400, 1040, 0, 4),
        ] {
            let mut v = len.to_be_bytes().to_vec();
            v.extend_from_slice(&seg.to_be_bytes());
            v.extend_from_slice(&[flags, room]);
            gro.push(v);
        }
        vec![
            (
                "packet_parser",
                rc.iter()
                    .chain(&xrc)
                    .chain(&ud)
                    .cloned()
                    .chain([ack(false), ack(true)])
                    .collect(),
            ),
            ("rc_engine", engine_seeds(&rc_config, &rc, &[ack(false)])),
            ("uc_engine", engine_seeds(&[2], &uc_packets(), &[])),
            ("ud_engine", engine_seeds(&[2], &ud, &[])),
            ("gsi_engine", engine_seeds(&[2], &ud, &[])),
            (
                "xrc_send_engine",
                engine_seeds(&rc_config, &xrc, &[ack(true)]),
            ),
            ("xrc_recv_engine", engine_seeds(&rc_config, &xrc, &[])),
            ("cm_mad", vec![mad.clone()]),
            ("cm_agent", cm_agent),
            ("rdma_cm_private_data", vec![cma_header()]),
            ("icrc_ident", sealed),
            ("gro_split", gro),
        ]
    }
}
