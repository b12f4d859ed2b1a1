//! Drops and counters, SQD, SRQ, RTR, and a no-panic sweep over hostile packets.

use uroce_wire::aeth::{self, NakCode, Syndrome};
use uroce_wire::opcode::{self, op, Transport};
use uroce_wire::{atomic_ack_eth, atomic_eth, feth, ieth, immdt, reth, PacketRepr, Psn};

use super::*;
use crate::qp_state::QpState;
use crate::wr::{SendOpcode, WcStatus};

fn feed(p: &mut Pair, side: Side, pkt: &PacketRepr<'_>) {
    let now = p.now;
    p.with_env(side, |qp, env| qp.receive(now, pkt, env));
}

#[test]
fn packets_that_do_not_belong_are_dropped_and_counted() {
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    // A UC opcode on an RC QP.
    feed(
        &mut p,
        Side::B,
        &PacketRepr::new(bth_to(QPN_B, op::UC_SEND_ONLY, 0), &[]),
    );
    assert_eq!(p.b.counters().dropped_bad_opcode, 1);
    // Another QP's packet.
    feed(
        &mut p,
        Side::B,
        &PacketRepr::new(bth_to(0x33, op::RC_SEND_ONLY, 0), &[]),
    );
    // A P_Key that does not match.
    let mut b = bth_to(QPN_B, op::RC_SEND_ONLY, 0);
    b.pkey = 0x1234;
    feed(&mut p, Side::B, &PacketRepr::new(b, &[]));
    assert_eq!(p.b.counters().dropped_wrong_state, 1);
    assert_eq!(p.b.counters().dropped_bad_pkey, 1);
    // A hand-made WRITE_FIRST without its RETH.
    feed(
        &mut p,
        Side::B,
        &PacketRepr::new(bth_to(QPN_B, op::RC_RDMA_WRITE_FIRST, 0), &[0; 256]),
    );
    assert_eq!(p.b.counters().dropped_bad_opcode, 2);
    // An ACK for a PSN never sent, a READ response nobody asked for.
    let ack = PacketRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 0,
        }),
        ..PacketRepr::new(bth_to(QPN_B, op::RC_ACKNOWLEDGE, 5), &[])
    };
    feed(&mut p, Side::B, &ack);
    let resp = PacketRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 0,
        }),
        ..PacketRepr::new(
            bth_to(QPN_B, op::RC_RDMA_READ_RESPONSE_ONLY, 0),
            &[1, 2, 3, 4],
        )
    };
    feed(&mut p, Side::B, &resp);
    assert_eq!(p.b.counters().dropped_unexpected_responses, 2);
    assert_eq!(p.b.counters().dropped_packets, 6);
    assert_eq!(p.b.counters().packets_received, 6);
    assert_eq!(p.b.state(), QpState::Rts);
    assert!(p.completions(Side::B).is_empty());

    // Nothing is processed in RESET or INIT; responses are not processed in RTR.
    p.b.set_state(QpState::Reset);
    feed(
        &mut p,
        Side::B,
        &PacketRepr::new(bth_to(QPN_B, op::RC_SEND_ONLY, 0), &[]),
    );
    p.b.set_state(QpState::Init);
    feed(
        &mut p,
        Side::B,
        &PacketRepr::new(bth_to(QPN_B, op::RC_SEND_ONLY, 0), &[]),
    );
    p.b.set_state(QpState::Rtr);
    feed(&mut p, Side::B, &ack);
    assert_eq!(p.b.counters().dropped_wrong_state, 4);
}

#[test]
fn late_and_duplicate_acks_are_ignored() {
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.b.post_recv(recv(2, vec![])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A).len(), 1);
    let ack = PacketRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 1,
        }),
        ..PacketRepr::new(bth_to(QPN_A, op::RC_ACKNOWLEDGE, 0), &[])
    };
    feed(&mut p, Side::A, &ack);
    // A stale sequence NAK and a stale error NAK change nothing either.
    for code in [NakCode::PsnSequenceError, NakCode::RemoteAccessError] {
        let nak = PacketRepr {
            aeth: Some(aeth::Repr {
                syndrome: Syndrome::Nak(code),
                msn: 1,
            }),
            ..PacketRepr::new(bth_to(QPN_A, op::RC_ACKNOWLEDGE, 0), &[])
        };
        feed(&mut p, Side::A, &nak);
    }
    assert_eq!(p.a.counters().duplicates_received, 3);
    assert_eq!(p.a.state(), QpState::Rts);
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    p.run();
    assert_eq!(p.completions(Side::A)[0].1.status, WcStatus::Success);
}

#[test]
fn sqd_finishes_started_wrs_then_raises_sq_drained() {
    let mut p = Pair::new();
    p.mem_a.add(1, 0x1000, 4096, ALL);
    for i in 0..3 {
        p.b.post_recv(recv(i, vec![sge(0, 0, 0)])).unwrap();
    }
    p.b.post_recv(recv(9, vec![])).unwrap();
    p.a.post_send(wr(0, SendOpcode::Send, vec![])).unwrap();
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    // Start WR 0 only.
    let mut buf = vec![0u8; 4160];
    let n = p
        .with_env(Side::A, |qp, env| qp.emit(Instant::ZERO, env, &mut buf))
        .unwrap();
    let first = buf[..n].to_vec();
    p.a.set_state(QpState::Sqd);
    assert!(p.events(Side::A).is_empty(), "WR 0 is still outstanding");
    let pkt = PacketRepr::parse(&first).unwrap();
    feed(&mut p, Side::B, &pkt);
    p.run();
    assert_eq!(p.events(Side::A), [QpEvent::SqDrained]);
    let ids: Vec<_> = p.completions(Side::A).iter().map(|c| c.1.wr_id).collect();
    assert_eq!(ids, [0]);
    assert_eq!(p.a.state(), QpState::Sqd);
    // New WRs may be posted in SQD; they wait.
    p.a.post_send(wr(3, SendOpcode::Send, vec![])).unwrap();
    p.run();
    assert!(p.completions(Side::A).is_empty());
    p.a.set_state(QpState::Rts);
    p.run();
    let ids: Vec<_> = p.completions(Side::A).iter().map(|c| c.1.wr_id).collect();
    assert_eq!(ids, [1, 2, 3]);
}

#[test]
fn srq_supplies_receive_wqes_and_last_wqe_reached() {
    let (ca, mut cb) = configs();
    cb.use_srq = true;
    let mut p = Pair::with_configs(ca, cb);
    p.mem_a.add(1, 0x1000, 64, ALL);
    p.mem_a.put(1, 0x1000, b"srq!");
    p.mem_b.add(2, 0x1000, 64, ALL);
    let mut srq = TestSrq::default();
    srq.post(recv(70, vec![sge(0x1000, 4, 2)]));
    srq.post(recv(71, vec![sge(0x1010, 4, 2)]));
    p.srq_b = Some(srq);
    assert!(matches!(
        p.b.post_recv(recv(1, vec![])),
        Err(crate::rc::PostError::InvalidWr(_))
    ));
    p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 4, 1)]))
        .unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![sge(0x1000, 4, 1)]))
        .unwrap();
    p.a.post_send(wr(3, SendOpcode::Send, vec![sge(0x1000, 4, 1)]))
        .unwrap();
    assert!(p.run_until(|p| p.b.counters().rnr_naks_sent == 1));
    assert_eq!(p.mem_b.get(2, 0x1000, 4), b"srq!");
    assert_eq!(p.mem_b.get(2, 0x1010, 4), b"srq!");
    let ids: Vec<_> = p.completions(Side::B).iter().map(|c| c.1.wr_id).collect();
    assert_eq!(ids, [70, 71]);
    p.b.set_state(QpState::Err);
    assert_eq!(p.events(Side::B), [QpEvent::LastWqeReached]);
}

#[test]
fn rtr_responder_only_and_comm_est() {
    let mut p = Pair::new();
    p.b.set_state(QpState::Rtr);
    p.b.post_recv(recv(1, vec![])).unwrap();
    p.b.post_recv(recv(2, vec![])).unwrap();
    p.b.post_send(wr(5, SendOpcode::Send, vec![])).unwrap_err();
    p.a.post_send(wr(1, SendOpcode::Send, vec![])).unwrap();
    p.a.post_send(wr(2, SendOpcode::Send, vec![])).unwrap();
    p.run();
    assert_eq!(p.events(Side::B), [QpEvent::CommEst], "once");
    assert_eq!(p.completions(Side::A).len(), 2);
    assert_eq!(p.completions(Side::B).len(), 2);
}

/// A small deterministic generator (xorshift), independent of the engine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random but well-formed RC packet to `dest_qp` with a PSN near `near`.
fn random_packet<'a>(rng: &mut Rng, dest_qp: u32, near: Psn, payload: &'a [u8]) -> PacketRepr<'a> {
    let opcodes: Vec<u8> = (0u8..=0x1d)
        .filter(|o| opcode::info(*o).is_some_and(|i| i.transport == Transport::Rc))
        .collect();
    assert!(opcodes.contains(&op::RC_FLUSH));
    let opcode = opcodes[rng.below(opcodes.len() as u64) as usize];
    let info = opcode::info(opcode).unwrap();
    let psn = near.wrapping_add(rng.below(8) as u32).wrapping_sub(4);
    let mut b = bth_to(dest_qp, opcode, psn.value());
    b.ack_req = rng.below(2) == 0;
    b.solicited = rng.below(4) == 0;
    let len = if !info.payload {
        0
    } else if let Some(n) = info.exact_payload {
        n
    } else {
        [0usize, 1, 3, 100, 255, 256, 257, 300][rng.below(8) as usize]
    };
    let mut pkt = PacketRepr::new(b, &payload[..len]);
    use uroce_wire::opcode::HeaderSet;
    let h = info.headers;
    let big = |r: &mut Rng| {
        if r.below(3) == 0 {
            r.next()
        } else {
            0x1000 + r.below(0x200)
        }
    };
    // Mostly the key of the region that allows everything.
    let key = |r: &mut Rng| [1u32, 1, 1, 0, 2, 3][r.below(6) as usize];
    if h.contains(HeaderSet::FETH) {
        pkt.feth = Some(feth::Repr {
            selectivity_level: rng.below(4) as u8,
            placement_type: rng.below(16) as u8,
        });
    }
    if h.contains(HeaderSet::RETH) {
        pkt.reth = Some(reth::Repr {
            va: big(rng),
            rkey: key(rng),
            dma_len: [0u32, 1, 256, 700, 0xffff_ffff, 0x8000_0001][rng.below(6) as usize],
        });
    }
    if h.contains(HeaderSet::AETH) {
        let syndrome = match rng.below(4) {
            0 => Syndrome::ACK_NO_CREDIT,
            1 => Syndrome::RnrNak {
                timer: rng.below(32) as u8,
            },
            2 => Syndrome::Nak(NakCode::PsnSequenceError),
            _ => Syndrome::Nak(NakCode::from_code(rng.below(5) as u8)),
        };
        pkt.aeth = Some(aeth::Repr {
            syndrome,
            msn: rng.below(1 << 24) as u32,
        });
    }
    if h.contains(HeaderSet::ATOMIC_ETH) {
        pkt.atomic_eth = Some(atomic_eth::Repr {
            va: big(rng) & !(rng.below(2) * 7),
            rkey: key(rng),
            swap_add: rng.next(),
            compare: rng.next(),
        });
    }
    if h.contains(HeaderSet::ATOMIC_ACK_ETH) {
        pkt.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig: rng.next() });
    }
    if h.contains(HeaderSet::IMMDT) {
        pkt.immdt = Some(immdt::Repr {
            imm: rng.next() as u32,
        });
    }
    if h.contains(HeaderSet::IETH) {
        pkt.ieth = Some(ieth::Repr { rkey: key(rng) });
    }
    pkt
}

#[test]
fn hostile_packets_never_panic() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let payload = bytes(77, 300);
    let mut buf = vec![0u8; 4160];
    let mut total = crate::rc::RcCounters::default();
    for _round in 0..1000u64 {
        let mut p = Pair::new();
        for side in [Side::A, Side::B] {
            let mem = if side == Side::A { &p.mem_a } else { &p.mem_b };
            mem.add(1, 0x1000, 0x400, ALL);
            mem.add(2, 0x1000_0000, 0x100, REMOTE_READ);
            mem.add(3, 0x2000, 0x10, LOCAL_WRITE);
        }
        for i in 0..3 {
            p.b.post_recv(recv(i, vec![sge(0x1000, 300, 1)])).unwrap();
            p.a.post_recv(recv(i, vec![sge(0x1000, 300, 1)])).unwrap();
        }
        // Outstanding work at A so that responses have something to hit.
        p.a.post_send(wr(1, SendOpcode::Send, vec![sge(0x1000, 600, 1)]))
            .unwrap();
        p.a.post_send(rdma(
            2,
            SendOpcode::RdmaRead,
            vec![sge(0x1000, 700, 1)],
            0x1000,
            1,
        ))
        .unwrap();
        let mut fa = rdma(
            3,
            SendOpcode::AtomicFetchAndAdd,
            vec![sge(0x1000, 8, 1)],
            0x1000,
            1,
        );
        fa.compare_add = 1;
        p.a.post_send(fa).unwrap();
        p.round();
        for _ in 0..60 {
            let side = if rng.below(2) == 0 { Side::A } else { Side::B };
            let dest = if side == Side::A { QPN_A } else { QPN_B };
            // Near what the target expects: its responder's ePSN or its oldest unacked PSN.
            let near = match rng.below(3) {
                0 => p.qp(side).resp.epsn,
                1 => p.qp(side).req.comp_psn,
                _ => Psn::new(rng.below(16) as u32),
            };
            let pkt = random_packet(&mut rng, dest, near, &payload);
            // Emit and parse like the network would; hand-made reprs directly too.
            let mut wire = vec![0u8; 4160];
            if let Ok(n) = pkt.emit(&mut wire) {
                if let Ok(parsed) = PacketRepr::parse(&wire[..n]) {
                    feed(&mut p, side, &parsed);
                }
            }
            if rng.below(8) == 0 {
                p.now += core::time::Duration::from_millis(rng.below(50));
                let now = p.now;
                p.with_env(side, |qp, env| qp.handle_timeout(now, env));
            }
            let now = p.now;
            for _ in 0..8 {
                let Some(n) = p.with_env(side, |qp, env| qp.emit(now, env, &mut buf)) else {
                    break;
                };
                let out = PacketRepr::parse(&buf[..n]).expect("engine output parses");
                out.check_pmtu(uroce_wire::Pmtu::Mtu256)
                    .expect("engine output segmented right");
            }
            let _ = p.completions(side);
            let _ = p.events(side);
            // Revive a QP that went to ERR (once its last NAK is out) so that most packets
            // meet live state; sometimes reset a live one too.
            let dead = p.qp(side).state() == QpState::Err && p.qp(side).is_idle();
            if dead || rng.below(200) == 0 {
                p.qp(side).set_state(QpState::Reset);
                p.qp(side).set_state(QpState::Rts);
                for i in 0..3 {
                    p.qp(side)
                        .post_recv(recv(i, vec![sge(0x1000, 300, 1)]))
                        .unwrap();
                }
                if side == Side::A {
                    p.a.post_send(rdma(
                        2,
                        SendOpcode::RdmaRead,
                        vec![sge(0x1000, 700, 1)],
                        0x1000,
                        1,
                    ))
                    .unwrap();
                }
            }
        }
        // Whatever happened, the pair still terminates.
        p.run();
        for c in [p.a.counters(), p.b.counters()] {
            total.error_naks_sent += c.error_naks_sent;
            total.seq_naks_sent += c.seq_naks_sent;
            total.rnr_naks_received += c.rnr_naks_received;
            total.duplicates_received += c.duplicates_received;
            total.dropped_unexpected_responses += c.dropped_unexpected_responses;
            total.read_responses_sent += c.read_responses_sent;
            total.atomic_acks_sent += c.atomic_acks_sent;
            total.implicit_naks += c.implicit_naks;
        }
    }
    // The sweep reached the interesting paths, not just the first drop.
    assert!(total.error_naks_sent > 100, "{total:?}");
    assert!(total.seq_naks_sent > 100, "{total:?}");
    assert!(total.rnr_naks_received > 100, "{total:?}");
    assert!(total.duplicates_received > 100, "{total:?}");
    assert!(total.dropped_unexpected_responses > 100, "{total:?}");
    assert!(total.read_responses_sent > 100, "{total:?}");
    assert!(total.atomic_acks_sent > 50, "{total:?}");
}

#[test]
fn the_answer_to_a_send_or_write_may_wait_a_read_response_and_an_ack_may_not() {
    use crate::engine::Reply;
    let mut p = Pair::new();
    p.b.post_recv(recv(1, vec![])).unwrap();
    let now = p.now;
    let reply = |p: &mut Pair, pkt: &PacketRepr<'_>| {
        p.with_env(Side::B, |qp, env| qp.receive(now, pkt, env))
    };
    let send = PacketRepr::new(bth_to(QPN_B, op::RC_SEND_ONLY, 0), &[]);
    assert_eq!(reply(&mut p, &send), Reply::Deferrable);
    // A duplicate is acknowledged again: that ACK may wait too.
    assert_eq!(reply(&mut p, &send), Reply::Deferrable);
    let read = PacketRepr {
        reth: Some(reth::Repr {
            va: 0,
            rkey: 0x77,
            dma_len: 8,
        }),
        ..PacketRepr::new(bth_to(QPN_B, op::RC_RDMA_READ_REQUEST, 1), &[])
    };
    assert_eq!(reply(&mut p, &read), Reply::Now);
    let ack = PacketRepr {
        aeth: Some(aeth::Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: 0,
        }),
        ..PacketRepr::new(bth_to(QPN_B, op::RC_ACKNOWLEDGE, 5), &[])
    };
    assert_eq!(reply(&mut p, &ack), Reply::Now);
}
