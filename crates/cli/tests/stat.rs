//! What a user sees of the drops: devices on loopback are made to drop a datagram for
//! every reason (Q_Key, no receive WQE, unknown QPN, bad ICRC, P_Key, sequence, RNR,
//! retries, a source that is not the QP's peer), and each counter is read the way a
//! user reads it, with `uroce stat` (device-wide and per QP, also after the QP is gone);
//! and inside `uroce run`, from the presented `hw_counters` files of an unmodified
//! program's device.
//!
//! One test per binary section: the first sets `UROCE_STAT_DIR` for this process.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_net::{seal_for, NetConfig, NetDevice};
use uroce_testkit::{run, skip};
use uroce_verbs::{
    AccessFlags, MemBlock, QpCap, QpInitAttr, QpType, RcConnect, SendFlags, SendOpcode, SendWr,
    Sge, WcStatus,
};
use uroce_wire::opcode::op;
use uroce_wire::{bth, deth, reth, PacketRepr, Psn, ROCEV2_UDP_PORT};

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");
const LIMIT: Duration = Duration::from_secs(20);
const QKEY: u32 = 0x1111;
/// The raw peer's QPN (what the device's RC QPs are connected to).
const PEER_QPN: u32 = 0x99;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn bth_for(opcode: u8, dest_qp: u32, psn: u32, pkey: u16) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: true,
        psn: Psn::new(psn),
    }
}

/// Sends `pkt` from `sock` to `to`, sealed (or with its ICRC flipped: `bad_icrc`).
fn send(sock: &UdpSocket, to: SocketAddr, pkt: &PacketRepr<'_>, bad_icrc: bool) {
    let mut bytes = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut bytes).expect("emit");
    seal_for(sock.local_addr().expect("addr"), to, &mut bytes).expect("seal");
    if bad_icrc {
        let n = bytes.len();
        bytes[n - 1] ^= 0xff;
    }
    sock.send_to(&bytes, to).expect("send");
}

fn ud_send(dest_qp: u32, qkey: u32, pkey: u16) -> PacketRepr<'static> {
    PacketRepr {
        deth: Some(deth::Repr {
            qkey,
            src_qp: PEER_QPN,
        }),
        ..PacketRepr::new(bth_for(op::UD_SEND_ONLY, dest_qp, 0, pkey), b"dgram")
    }
}

/// `uroce stat` output as (device address → (device counters, QP number → counters)).
struct Report {
    text: String,
}

impl Report {
    fn read(dir: &Path) -> Report {
        let mut c = Command::new(UROCE);
        c.args(["stat", "--all", "--dir"]).arg(dir);
        let o = run(c, LIMIT).expect("uroce stat");
        assert!(o.status.success(), "{}", o.stderr);
        Report { text: o.stdout }
    }

    /// The value of `name` in the section of device `addr` (`qpn` None) or of one of its
    /// QPs.
    fn get(&self, addr: &str, qpn: Option<u32>, name: &str) -> Option<u64> {
        let mut in_dev = false;
        let mut in_qp = false;
        for line in self.text.lines() {
            if !line.starts_with(' ') {
                in_dev = line.split_whitespace().nth(1) == Some(addr);
                in_qp = false;
                continue;
            }
            let t = line.trim();
            if let Some(q) = t.strip_prefix("qp ") {
                let n = q.split_whitespace().next().unwrap_or("");
                in_qp = qpn.is_some_and(|want| {
                    u32::from_str_radix(n.trim_start_matches("0x"), 16).ok() == Some(want)
                });
                continue;
            }
            if in_dev && in_qp == qpn.is_some() {
                if let Some((k, v)) = t.split_once(' ') {
                    if k == name {
                        return v.parse().ok();
                    }
                }
            }
        }
        None
    }
}

#[test]
fn every_drop_reason_is_counted_where_uroce_stat_shows_it() {
    let dir = std::env::temp_dir().join(format!("uroce-stat-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY (of the test): the only test of this binary; nothing reads the environment
    // concurrently.
    std::env::set_var(uroce_net::stats::STAT_DIR_ENV, &dir);

    let (b_addr, peer_addr, spoofer_addr, dead) =
        ("127.0.51.2", "127.0.51.9", "127.0.51.66", "127.0.51.77");
    let peer = UdpSocket::bind((ip(peer_addr), ROCEV2_UDP_PORT)).expect("peer socket");
    let spoofer = UdpSocket::bind((ip(spoofer_addr), 0)).expect("spoofer socket");
    let mut cfg = NetConfig::new(ip(b_addr));
    cfg.faults = None;
    let b = NetDevice::open(cfg).expect("device B");
    let to = b.local_addr();
    let ctx = b.context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64, None, 0).expect("cq");
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mr = pd
        .reg_mr(
            MemBlock::new(4096).expect("mem"),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .expect("mr");
    // A UD QP without receives, and two RC QPs connected to the raw peer.
    let ud = pd
        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, cap))
        .expect("ud qp");
    ud.activate_ud(QKEY).expect("UD to RTS");
    let rc_seq = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
        .expect("rc qp");
    let rc_rnr = pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
        .expect("rc qp");
    for q in [&rc_seq, &rc_rnr] {
        q.connect_rc(&RcConnect::new(ip(peer_addr), PEER_QPN))
            .expect("RC to RTS");
    }
    let (ud_qpn, seq_qpn, rnr_qpn) = (ud.qp_num(), rc_seq.qp_num(), rc_rnr.qp_num());

    // The drops, one reason after the other.
    send(&peer, to, &ud_send(ud_qpn, 0x2222, 0xffff), false); // Q_Key
    send(&peer, to, &ud_send(ud_qpn, QKEY, 0xffff), false); // no receive WQE
    send(&peer, to, &ud_send(0x00ab_cdef, QKEY, 0xffff), false); // unknown QPN
    send(&peer, to, &ud_send(ud_qpn, QKEY, 0xffff), true); // bad ICRC
    send(&peer, to, &ud_send(ud_qpn, QKEY, 0x1234), false); // P_Key
    let write = |psn| PacketRepr {
        reth: Some(reth::Repr {
            va: mr.iova(),
            rkey: mr.rkey(),
            dma_len: 4,
        }),
        ..PacketRepr::new(
            bth_for(op::RC_RDMA_WRITE_ONLY, seq_qpn, psn, 0xffff),
            b"oops",
        )
    };
    send(&peer, to, &write(10), false); // out of sequence: a sequence NAK
    send(&peer, to, &write(11), false); // … and dropped
    send(&spoofer, to, &write(0), false); // not from the QP's peer
    send(
        &peer,
        to,
        &PacketRepr::new(bth_for(op::RC_SEND_ONLY, rnr_qpn, 0, 0xffff), b"rnr"),
        false,
    ); // no receive WQE: an RNR NAK

    // A second device whose RC QP's peer never answers: retries, then RETRY_EXC_ERR.
    let mut cfg = NetConfig::new(ip("127.0.51.1"));
    cfg.faults = None;
    let a = NetDevice::open(cfg).expect("device A");
    let a_pd = a.context().alloc_pd().expect("pd");
    let a_cq = a.context().create_cq(16, None, 0).expect("cq");
    let a_mr = a_pd
        .reg_mr(MemBlock::new(64).expect("mem"), AccessFlags::LOCAL_WRITE)
        .expect("mr");
    let lost = a_pd
        .create_qp(&QpInitAttr::new(QpType::Rc, &a_cq, &a_cq, cap))
        .expect("rc qp");
    lost.connect_rc(&RcConnect {
        timeout: 8, // about 1 ms
        retry_cnt: 2,
        ..RcConnect::new(ip(dead), PEER_QPN)
    })
    .expect("RC to RTS");
    lost.post_send(SendWr {
        wr_id: 1,
        opcode: SendOpcode::Send,
        flags: SendFlags::SIGNALED,
        sg_list: vec![Sge {
            addr: a_mr.iova(),
            length: 8,
            lkey: a_mr.lkey(),
        }]
        .into(),
        ..SendWr::default()
    })
    .expect("post");
    let start = Instant::now();
    let wc = loop {
        if let Some(wc) = a_cq.poll(1).pop() {
            break wc;
        }
        assert!(start.elapsed() < LIMIT, "no RETRY_EXC_ERR");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(wc.status, WcStatus::RetryExcErr);

    // Wait (bounded) until B has seen all nine datagrams, then publish.
    let start = Instant::now();
    while b.counters().socket.rx_packets < 9 {
        assert!(start.elapsed() < LIMIT, "B did not receive everything");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    b.publish_stats();
    a.publish_stats();

    let r = Report::read(&dir);
    let dev = |name| r.get(b_addr, None, name).unwrap_or(0);
    for (name, at_least) in [
        ("dropped_bad_qkey", 1),
        ("dropped_no_receive", 1),
        ("unknown_qpn", 1),
        ("bad_icrc", 1),
        ("dropped_bad_pkey", 1),
        ("seq_naks_sent", 1),
        ("dropped_out_of_sequence", 1),
        ("dropped_bad_address", 1),
        ("rnr_naks_sent", 1),
    ] {
        assert!(
            dev(name) >= at_least,
            "device {name} = {}:\n{}",
            dev(name),
            r.text
        );
    }
    let qp = |qpn, name| r.get(b_addr, Some(qpn), name).unwrap_or(0);
    assert_eq!(qp(ud_qpn, "dropped_bad_qkey"), 1, "{}", r.text);
    assert_eq!(qp(ud_qpn, "dropped_no_receive"), 1);
    assert_eq!(qp(ud_qpn, "dropped_bad_pkey"), 1);
    assert_eq!(qp(seq_qpn, "seq_naks_sent"), 1);
    assert_eq!(qp(seq_qpn, "dropped_out_of_sequence"), 1);
    assert_eq!(qp(seq_qpn, "dropped_bad_address"), 1);
    assert_eq!(qp(rnr_qpn, "rnr_naks_sent"), 1);
    let a_qp = |name| r.get("127.0.51.1", Some(lost.qp_num()), name).unwrap_or(0);
    assert_eq!(a_qp("retries"), 2, "{}", r.text);
    assert_eq!(a_qp("retry_exceeded"), 1);
    assert_eq!(r.get("127.0.51.1", None, "retry_exceeded"), Some(1));

    // A QP that goes keeps its counts in the device's totals.
    ud.destroy().expect("destroy");
    b.publish_stats();
    let r = Report::read(&dir);
    assert_eq!(
        r.get(b_addr, None, "dropped_bad_qkey"),
        Some(1),
        "{}",
        r.text
    );
    assert_eq!(r.get(b_addr, Some(ud_qpn), "dropped_bad_qkey"), None);

    // A closed device leaves nothing behind.
    drop((rc_seq, rc_rnr, mr, cq, pd));
    b.close().expect("close");
    drop((lost, a_mr, a_cq, a_pd));
    a.close().expect("close");
    let r = Report::read(&dir);
    assert!(r.text.starts_with("no running uroce device"), "{}", r.text);
    let _ = std::fs::remove_dir_all(&dir);

    hw_counters_inside_uroce_run();
}

/// Inside `uroce run`, an unmodified `ibv_rc_pingpong` server's device keeps the presented
/// `hw_counters` current: after its 50 iterations the files hold what it sent and got.
fn hw_counters_inside_uroce_run() {
    let test = "every_drop_reason_is_counted_where_uroce_stat_shows_it (hw_counters)";
    let dir = PathBuf::from(UROCE)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if !["liburoce_ffi.so", "liburoce_ffi_rdmacm.so"]
        .iter()
        .all(|l| dir.join(l).is_file())
    {
        skip(test, "the C libraries are not built next to uroce");
        return;
    }
    if !Path::new("/usr/bin/ibv_rc_pingpong").exists() {
        skip(test, "ibv_rc_pingpong is missing (install ibverbs-utils)");
        return;
    }
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
        l.local_addr().expect("addr").port().to_string()
    };
    let hw = "/sys/class/infiniband/uroce0/ports/1/hw_counters";
    let script = format!(
        "ibv_rc_pingpong -g 0 -n 50 -p {port} >/dev/null && \
         cat {hw}/sent_pkts {hw}/rcvd_pkts {hw}/rx_packets"
    );
    let server = {
        let mut c = Command::new(UROCE);
        c.args(["run", "--", "sh", "-c", &script])
            .env("UROCE_ADDR", "127.0.51.21")
            .env_remove("UROCE_PRESENT");
        std::thread::spawn(move || run(c, LIMIT))
    };
    std::thread::sleep(Duration::from_millis(500));
    let mut c = Command::new(UROCE);
    c.args([
        "run",
        "--",
        "ibv_rc_pingpong",
        "-g",
        "0",
        "-n",
        "50",
        "-p",
        &port,
    ])
    .arg("127.0.51.21")
    .env("UROCE_ADDR", "127.0.51.22")
    .env_remove("UROCE_PRESENT");
    let client = run(c, LIMIT).expect("client");
    let server = server.join().expect("server thread").expect("server");
    if server
        .stderr
        .contains("running without /sys/class/infiniband")
    {
        skip(
            test,
            "no presentation here (no unprivileged user namespaces)",
        );
        return;
    }
    assert!(client.status.success(), "client: {}", client.stderr);
    assert!(
        server.status.success(),
        "server: {}\n{}",
        server.stdout,
        server.stderr
    );
    let v: Vec<u64> = server
        .stdout
        .lines()
        .map(|l| l.trim().parse().expect("a number"))
        .collect();
    assert_eq!(v.len(), 3, "{}", server.stdout);
    // 50 iterations: 50 messages each way, plus their acknowledgements.
    assert!(v[0] >= 50 && v[1] >= 50, "{v:?}");
    assert_eq!(v[1], v[2], "rcvd_pkts is rxe's name of rx_packets");
}
