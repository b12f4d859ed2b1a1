//! Unit tests of the receive path: the one parse a packet gets.

use super::*;
use uroce_wire::opcode::op;
use uroce_wire::{bth, reth, Psn};

/// `recv_batch_with` hands over every accepted packet once, in arrival order, with
/// the parse its check made: the same packets, sources and reprs as `RecvBatch::iter`
/// (which parses again), and what does not pass the check is not handed over.
#[test]
fn packets_are_handed_over_with_their_one_parse() {
    let ip: IpAddr = "127.0.0.1".parse().expect("ip");
    let mut tx = RoceSocket::bind_port(ip, 0).expect("bind");
    let mut rx = RoceSocket::bind_port(ip, 0).expect("bind");
    let dst = rx.local_addr();
    let bth = |opcode, psn| bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp: 0x12,
        ack_req: true,
        psn: Psn::new(psn),
    };
    let payload: Vec<u8> = (0..13u8).collect();
    let reprs = [
        PacketRepr::new(bth(op::RC_SEND_ONLY, 1), &payload[..]),
        PacketRepr {
            reth: Some(reth::Repr {
                va: 0x1000,
                rkey: 0x99,
                dma_len: 12,
            }),
            ..PacketRepr::new(bth(op::RC_RDMA_WRITE_ONLY, 2), &payload[..12])
        },
        PacketRepr::new(bth(op::RC_SEND_ONLY, 3), &[]),
    ];
    let mut bufs: Vec<Vec<u8>> = reprs
        .iter()
        .map(|p| {
            let mut b = vec![0u8; p.buffer_len()];
            p.emit(&mut b).expect("emit");
            tx.seal(dst, &mut b).expect("seal");
            b
        })
        .collect();
    // A corrupted ICRC: dropped by the check, never handed over.
    let mut bad = bufs[0].clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    bufs.insert(1, bad);
    let out: Vec<OutPacket<'_>> = bufs.iter().map(|b| OutPacket { dst, roce: b }).collect();
    assert_eq!(tx.send_batch(&out).expect("send"), out.len());
    let mut batch = RecvBatch::new(8, 2048).expect("batch");
    let mut handed = Vec::new();
    let mut seen = Vec::new();
    let mut read = 0;
    // Bounded: 100 waits of at most 100 ms.
    for _ in 0..100 {
        if read == bufs.len() {
            break;
        }
        let _ = rx.wait_readable(Some(Duration::from_millis(100)));
        let n = rx
            .recv_batch_with(&mut batch, |r| {
                assert_eq!(PacketRepr::parse(r.roce), Ok(r.packet));
                handed.push((r.src, r.packet.bth.psn.value(), r.packet.payload.to_vec()));
            })
            .expect("recv");
        read += n;
        seen.extend(
            batch
                .iter()
                .map(|r| (r.src, r.packet.bth.psn.value(), r.packet.payload.to_vec())),
        );
    }
    assert_eq!(read, bufs.len());
    assert_eq!(handed, seen);
    let src = tx.local_addr();
    assert_eq!(
        handed,
        vec![
            (src, 1, payload.clone()),
            (src, 2, payload[..12].to_vec()),
            (src, 3, Vec::new()),
        ]
    );
    assert_eq!(rx.counters().bad_icrc, 1);
}

/// The Identification checked first (a packet's index in its coalesced datagram) changes
/// what the ICRC check costs, never its answer: a packet sealed for Identification k is
/// found to be k whichever Identification is tried first, one sealed for the uroce
/// header is the uroce header, a corrupted one matches none, and IPv6 has no
/// Identification to try.
#[test]
fn the_identification_tried_first_does_not_change_the_answer() {
    let src: SocketAddr = "127.0.0.1:4791".parse().expect("addr");
    let dst: SocketAddr = "127.0.0.2:4791".parse().expect("addr");
    let packet = |id: u16| {
        let repr = PacketRepr::new(
            uroce_wire::bth::Repr {
                opcode: op::RC_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: 0x12,
                ack_req: false,
                psn: Psn::new(7),
            },
            &[0x5a; 100][..],
        );
        let mut b = vec![0u8; repr.buffer_len()];
        repr.emit(&mut b).expect("emit");
        seal_checked(src, dst, &mut b, id).expect("seal");
        b
    };
    let mut solver = IdentSolver::new();
    let ident = |identification| Ipv4Ident {
        identification,
        dont_fragment: true,
    };
    for sealed in [0u16, 1, 3, 63, 127] {
        let p = packet(sealed);
        for expected in [0u16, 1, 3, 5, 63, 127] {
            assert_eq!(
                check_icrc(src, dst, &p, expected, &mut solver),
                (IcrcCheck::Ok, Some(ident(sealed))),
                "sealed for {sealed}, tried {expected} first"
            );
        }
        let mut bad = p.clone();
        bad[20] ^= 0x10;
        for expected in [0u16, sealed, 5] {
            assert_eq!(
                check_icrc(src, dst, &bad, expected, &mut solver).0,
                IcrcCheck::Mismatch,
                "corrupted, sealed for {sealed}, tried {expected} first"
            );
        }
    }
    let (src6, dst6): (SocketAddr, SocketAddr) = (
        "[::1]:4791".parse().expect("addr"),
        "[::1]:4792".parse().expect("addr"),
    );
    let mut p = packet(0);
    seal_checked(src6, dst6, &mut p, 0).expect("seal");
    assert_eq!(
        check_icrc(src6, dst6, &p, 9, &mut solver),
        (IcrcCheck::Ok, None)
    );
}
