//! Unit tests of the steering program: a small cBPF evaluator runs the generated
//! programs over sample payloads, and the order model and layouts are checked.

use super::*;

/// A classic BPF evaluator for the instructions the generator emits, with the
/// kernel's semantics for them (loads beyond the packet end the program with 0).
fn run(program: &[Insn], payload: &[u8]) -> u32 {
    let mut a: u32 = 0;
    let mut pc = 0usize;
    // Programs only jump forward, so each instruction runs at most once.
    for _ in 0..=program.len() {
        let Some(i) = program.get(pc) else {
            panic!("fell off the program at {pc}");
        };
        pc += 1;
        match i.code {
            c if c == LD | W | LEN => a = payload.len() as u32,
            c if c == LD | B | ABS => match payload.get(i.k as usize) {
                Some(&b) => a = u32::from(b),
                None => return 0,
            },
            c if c == LD | W | ABS => {
                let k = i.k as usize;
                match payload.get(k..k + 4) {
                    Some(w) => a = u32::from_be_bytes(w.try_into().unwrap()),
                    None => return 0,
                }
            }
            c if c == LD | H | ABS => {
                let k = i.k as usize;
                match payload.get(k..k + 2) {
                    Some(w) => a = u32::from(u16::from_be_bytes(w.try_into().unwrap())),
                    None => return 0,
                }
            }
            c if c == JMP | JA => pc += i.k as usize,
            c if c == ALU | AND | K => a &= i.k,
            c if c == ALU | RSH | K => a >>= i.k,
            c if c == JMP | JEQ | K || c == JMP | JGE | K => {
                let taken = if c == JMP | JEQ | K {
                    a == i.k
                } else {
                    a >= i.k
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            c if c == RET | K => return i.k,
            c if c == RET | RET_A => return a,
            c => panic!("unexpected opcode {c:#x}"),
        }
    }
    panic!("program did not return");
}

/// The program's index and the model's, which must agree.
fn steer(t: &SteeringTable, p: &[Insn], d: &[u8]) -> u32 {
    let got = run(p, d);
    assert_eq!(got, t.index_for_datagram(d), "program and model disagree");
    got
}

/// A datagram to QP1: BTH (UD SEND only), DETH, a CM MAD with attribute `attr` whose
/// body `body` writes, ICRC.
fn gsi(attr: u16, body: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut d = vec![0u8; MIN_MAD_DATAGRAM_LEN as usize + 4];
    d[0] = UD_SEND_ONLY;
    d[5..8].copy_from_slice(&[0, 0, 1]);
    let m = &mut d[MAD_OFFSET as usize..];
    let mut h = mad::Header::new_unchecked(&mut m[..mad::LEN]);
    h.set_base_version(mad::BASE_VERSION);
    h.set_mgmt_class(mad::MGMT_CLASS_CM);
    h.set_class_version(mad::CM_CLASS_VERSION);
    h.set_response_method(false, mad::METHOD_SEND);
    h.set_transaction_id(0x1234_5678_9ABC_DEF0);
    h.set_attribute_id(attr);
    body(&mut m[mad::LEN..mad::MAD_LEN]);
    d
}

/// The peer's communication ID in the messages below: never read by the program.
const PEER_ID: u32 = 0x7E57_0001;

/// A message of `attr` answering or continuing our connection `ours` (its
/// RemoteCommID; SIDR_REP's RequestID).
fn answer(attr: u16, ours: u32) -> Vec<u8> {
    use uroce_wire::cm::{Apr, Drep, Dreq, Lap, Mra, Rej, Rep, Rtu, SidrRep};
    gsi(attr, |b| match attr {
        cm_attr::MRA => {
            let mut v = Mra::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
        }
        cm_attr::REJ => {
            let mut v = Rej::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
        }
        cm_attr::REP => {
            let mut v = Rep::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
            v.set_local_qpn(0x05_0001);
        }
        cm_attr::RTU => {
            let mut v = Rtu::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
        }
        cm_attr::DREQ => {
            let mut v = Dreq::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
            v.set_remote_qpn(0x07_0001);
        }
        cm_attr::DREP => {
            let mut v = Drep::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
        }
        cm_attr::LAP => {
            let mut v = Lap::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
        }
        cm_attr::APR => {
            let mut v = Apr::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_remote_comm_id(ours);
        }
        cm_attr::SIDR_REP => {
            let mut v = SidrRep::new_unchecked(b);
            v.set_request_id(ours);
            v.set_service_id(0xFFFF_FFFF_FFFF_FFFF);
        }
        _ => unreachable!(),
    })
}

/// Every message that carries our communication ID.
const ANSWERS: [u16; 9] = [
    cm_attr::MRA,
    cm_attr::REJ,
    cm_attr::REP,
    cm_attr::RTU,
    cm_attr::DREQ,
    cm_attr::DREP,
    cm_attr::LAP,
    cm_attr::APR,
    cm_attr::SIDR_REP,
];

/// A REQ (or SIDR_REQ) for `service`.
fn request(sidr: bool, service: u64) -> Vec<u8> {
    use uroce_wire::cm::{Req, SidrReq};
    if sidr {
        gsi(cm_attr::SIDR_REQ, |b| {
            let mut v = SidrReq::new_unchecked(b);
            v.set_request_id(PEER_ID);
            v.set_pkey(0xFFFF);
            v.set_service_id(service);
        })
    } else {
        gsi(cm_attr::REQ, |b| {
            let mut v = Req::new_unchecked(b);
            v.set_local_comm_id(PEER_ID);
            v.set_service_id(service);
            v.set_local_qpn(0x05_0002);
        })
    }
}

fn bth_to(qpn: u32) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0] = 0x04; // RC SEND only
    b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    b
}

#[test]
fn layout_splits_and_reserves() {
    let l = QpnLayout::default();
    assert_eq!((l.slot_bits(), l.local_bits(), l.max_slot()), (8, 16, 254));
    assert_eq!(l.qpn(3, 0x1234), Some(0x03_1234));
    assert_eq!(l.slot_of(0x03_1234), 3);
    assert_eq!(l.local_of(0x03_1234), 0x1234);
    assert_eq!(l.qpn(0, 1), None, "slot 0 holds QP0/QP1");
    assert_eq!(l.qpn(255, 0), None, "the top slot holds the multicast QPN");
    assert_eq!(l.qpn(1, 0x1_0000), None);
    assert_eq!(l.slot_of(MULTICAST_QPN), 255);
    assert!(!l.is_member_slot(l.slot_of(MULTICAST_QPN)));
    let l4 = QpnLayout::new(4).unwrap();
    assert_eq!((l4.max_slot(), l4.max_local()), (14, 0xF_FFFF));
    assert_eq!(l4.qpn(14, 7), Some(0xE0_0007));
    assert!(QpnLayout::new(1).is_none() && QpnLayout::new(13).is_none());
    // Communication IDs: the same slots in their top bits.
    assert_eq!(l.comm_ids(3), Some(0x0300_0000..=0x03FF_FFFF));
    assert_eq!(l.comm_slot_of(0x03AB_CDEF), 3);
    assert_eq!(l.comm_ids(0), None);
    assert_eq!(l.comm_ids(255), None);
    assert_eq!(l4.comm_ids(14), Some(0xE000_0000..=0xEFFF_FFFF));
    assert_eq!(l4.comm_slot_of(0xEFFF_FFFF), 14);
    let l12 = QpnLayout::new(12).unwrap();
    assert_eq!(l12.comm_ids(1), Some(0x0010_0000..=0x001F_FFFF));
}

#[test]
fn group_order_models_swap_with_last() {
    let mut o = GroupOrder::from_slots(vec![1, 2, 3, 4]);
    assert!(o.left(2));
    assert_eq!(o.slots(), &[1, 4, 3]);
    o.joined(5);
    assert_eq!(o.index_of(5), Some(3));
    assert!(!o.left(9));
    assert!(o.left(5), "the last leaves: nothing moves");
    assert_eq!(o.slots(), &[1, 4, 3]);
}

#[test]
fn unseen_closes_are_resolved_only_when_their_order_does_not_matter() {
    let o = GroupOrder::from_slots(vec![1, 2, 3, 4]);
    assert_eq!(
        o.after_unseen_closes(&[2]),
        Some(GroupOrder::from_slots(vec![1, 4, 3]))
    );
    // 2 and 3 dying: either order leaves [1, 4].
    assert_eq!(
        o.after_unseen_closes(&[3, 2]),
        Some(GroupOrder::from_slots(vec![1, 4]))
    );
    // 1 and 2: [4, 3] or [3, 4].
    assert_eq!(o.after_unseen_closes(&[1, 2]), None);
    assert_eq!(o.after_unseen_closes(&[]), Some(o.clone()));
    assert_eq!(o.after_unseen_closes(&[9]), Some(o.clone()));
    // All of them: empty whatever the order.
    assert_eq!(
        o.after_unseen_closes(&[1, 2, 3, 4]),
        Some(GroupOrder::default())
    );
    let big = GroupOrder::from_slots((1..=10).collect());
    assert_eq!(big.after_unseen_closes(&[1, 2, 3, 4, 5, 6, 7]), None);
}

#[test]
fn program_steers_each_slot_to_its_index() {
    let l = QpnLayout::default();
    let order = GroupOrder::from_slots(vec![7, 2, 200, 5]);
    let t = SteeringTable::from_order(l, &order).unwrap();
    assert_eq!(t.designated(), 1, "slot 2, the lowest, is at index 1");
    let p = t.program();
    assert!(p.len() <= MAX_INSNS);
    for (i, &slot) in order.slots().iter().enumerate() {
        for local in [0, 1, 0x7FFF, l.max_local()] {
            let qpn = l.qpn(slot, local).unwrap();
            assert_eq!(run(&p, &bth_to(qpn)), i as u32, "qpn {qpn:#x}");
            assert_eq!(t.index_for(qpn), i as u32);
            // A longer packet (payload, ICRC) steers the same.
            let mut long = bth_to(qpn).to_vec();
            long.extend_from_slice(&[0xAB; 40]);
            assert_eq!(run(&p, &long), i as u32);
        }
    }
    // QP0, QP1, unknown slots, the multicast QPN: the designated member.
    for qpn in [
        0,
        1,
        l.qpn(3, 9).unwrap(),
        l.qpn(254, 0).unwrap(),
        MULTICAST_QPN,
    ] {
        assert_eq!(run(&p, &bth_to(qpn)), 1, "qpn {qpn:#x}");
        assert_eq!(t.index_for(qpn), 1);
    }
    // The reserved byte 4 does not disturb the QPN.
    let mut b = bth_to(l.qpn(200, 3).unwrap());
    b[4] = 0xFF;
    assert_eq!(run(&p, &b), 2);
    // Short datagrams: designated, not the kernel's 0 for an out-of-range load.
    for n in 0..12 {
        assert_eq!(run(&p, &bth_to(l.qpn(7, 1).unwrap())[..n]), 1, "len {n}");
    }
    // Probes go where they say.
    for k in [0, 3, 17, u32::MAX] {
        assert_eq!(run(&p, &probe(k, 99)), k);
        assert_eq!(parse_probe(&probe(k, 99)), Some((k, 99)));
    }
    assert_eq!(parse_probe(&bth_to(1)), None);
}

#[test]
fn program_for_other_layouts_and_sizes() {
    let l = QpnLayout::new(4).unwrap();
    let mut t = SteeringTable::new(l, 0);
    t.route(14, 3);
    t.route(1, 2);
    t.route(0, 9); // ignored: slot 0 is designated
    t.route(15, 9); // ignored: reserved
    let p = t.program();
    assert_eq!(run(&p, &bth_to(l.qpn(14, 0xF_FFFF).unwrap())), 3);
    assert_eq!(run(&p, &bth_to(l.qpn(1, 5).unwrap())), 2);
    assert_eq!(run(&p, &bth_to(1)), 0);
    assert_eq!(run(&p, &bth_to(MULTICAST_QPN)), 0);
    // Every member slot of the default layout routed: still within the kernel's
    // limit, every slot right.
    let l = QpnLayout::default();
    let order = GroupOrder::from_slots((1..=l.max_slot()).rev().collect());
    let t = SteeringTable::from_order(l, &order).unwrap();
    let p = t.program();
    assert!(p.len() <= MAX_INSNS, "{}", p.len());
    for slot in 1..=l.max_slot() {
        let qpn = l.qpn(slot, 42).unwrap();
        assert_eq!(run(&p, &bth_to(qpn)), order.index_of(slot).unwrap());
    }
    // The largest layout is cut to the kernel's limit.
    let l = QpnLayout::new(12).unwrap();
    let order = GroupOrder::from_slots((1..=l.max_slot()).collect());
    let p = SteeringTable::from_order(l, &order).unwrap().program();
    assert_eq!(p.len(), FIXED_INSNS + 2 * MAX_ROUTES);
    let top = l.qpn(MAX_ROUTES as u16, 1).unwrap();
    assert_eq!(run(&p, &bth_to(top)), MAX_ROUTES as u32 - 1);
    let cut = l.qpn(MAX_ROUTES as u16 + 1, 1).unwrap();
    assert_eq!(run(&p, &bth_to(cut)), 0, "cut: designated");
    assert!(SteeringTable::from_order(l, &GroupOrder::default()).is_none());
}

const S_TCP: u64 = 0x0000_0000_0106_1C06; // RDMA CM, TCP port space, port 7174
const S_UDP: u64 = 0x0000_0000_0111_1C06;
const S_HIGH: u64 = 0x1111_2222_0106_1C06; // same low word as S_TCP
const S_NO_ROUTE: u64 = 0x0000_0000_0106_0001;

#[test]
fn cm_mads_reach_the_member_that_owns_them() {
    let l = QpnLayout::default();
    let order = GroupOrder::from_slots(vec![7, 2, 200, 5]);
    let mut t = SteeringTable::from_order(l, &order).unwrap();
    t.listen(S_TCP, 200);
    t.listen(S_UDP, 5);
    t.listen(S_HIGH, 7);
    t.listen(S_NO_ROUTE, 9); // slot 9 has no socket in this group
    t.listen(1, 0); // ignored: slot 0 is no member's
    assert_eq!(t.listeners().len(), 4);
    let p = t.program();
    assert_eq!(p.len(), FIXED_INSNS + 2 * 4 + 5 * 3);
    let designated = 1;
    // Messages for our communication IDs: to the member whose slot is the ID's.
    for (i, &slot) in order.slots().iter().enumerate() {
        let ids = l.comm_ids(slot).unwrap();
        for id in [
            *ids.start(),
            ids.start() + 1,
            0x1234 | ids.start(),
            *ids.end(),
        ] {
            for attr in ANSWERS {
                let d = answer(attr, id);
                assert_eq!(steer(&t, &p, &d), i as u32, "attr {attr:#x} id {id:#x}");
                let m = &d[MAD_OFFSET as usize..MIN_MAD_DATAGRAM_LEN as usize];
                assert_eq!(l.cm_answer_slot(m), Some(slot), "attr {attr:#x} id {id:#x}");
                let short = &m[..mad::MAD_LEN - 1];
                assert_eq!(l.cm_answer_slot(short), None);
            }
        }
    }
    // IDs of slot 0 (0 is none), of a slot without a member, of the top slot.
    for id in [0, 1, 0x00FF_FFFF, 0x0300_0000, 0xFE00_0000, u32::MAX] {
        for attr in ANSWERS {
            assert_eq!(steer(&t, &p, &answer(attr, id)), designated, "{id:#x}");
        }
    }
    // REQ and SIDR_REQ: to the listener of the service.
    for sidr in [false, true] {
        assert_eq!(steer(&t, &p, &request(sidr, S_TCP)), 2);
        let d = request(sidr, S_TCP);
        let m = &d[MAD_OFFSET as usize..MIN_MAD_DATAGRAM_LEN as usize];
        assert_eq!(
            l.cm_answer_slot(m),
            None,
            "a request is steered by service ID"
        );
        assert_eq!(steer(&t, &p, &request(sidr, S_UDP)), 3);
        assert_eq!(steer(&t, &p, &request(sidr, S_HIGH)), 0);
        // Nobody listens, or the listener has no socket here: the designated
        // member, which rejects.
        for other in [S_NO_ROUTE, S_TCP + 1, S_TCP ^ 1 << 32, 0, u64::MAX] {
            assert_eq!(steer(&t, &p, &request(sidr, other)), designated);
        }
    }
    // Anything else to QP1: ClassPortInfo, unknown attributes, another class, not
    // a UD SEND only (an immediate would move the MAD), a short MAD.
    for attr in [cm_attr::CLASS_PORT_INFO, 0x0F, 0x1B, 0x0110, 0xFFFF] {
        let d = gsi(attr, |b| b[..8].copy_from_slice(&S_TCP.to_be_bytes()));
        assert_eq!(steer(&t, &p, &d), designated, "attr {attr:#x}");
    }
    let mut other_class = request(false, S_TCP);
    other_class[MGMT_CLASS_AT as usize] = 0x04; // performance management
    assert_eq!(steer(&t, &p, &other_class), designated);
    let mut imm = answer(cm_attr::REP, l.comm_ids(5).unwrap().start() + 9);
    imm[0] = UD_SEND_ONLY + 1;
    assert_eq!(steer(&t, &p, &imm), designated);
    let rep = answer(cm_attr::REP, l.comm_ids(5).unwrap().start() + 9);
    assert_eq!(steer(&t, &p, &rep[..MIN_MAD_DATAGRAM_LEN as usize]), 3);
    // Every truncation of every kind: program and model agree, none falls to the
    // kernel's 0 for a load beyond the end.
    for d in [rep.clone(), request(false, S_TCP), request(true, S_UDP)] {
        for n in 0..d.len() {
            let want = if n < MIN_MAD_DATAGRAM_LEN as usize {
                designated
            } else {
                t.index_for_datagram(&d)
            };
            assert_eq!(steer(&t, &p, &d[..n]), want, "len {n}");
        }
    }
    // To QP0, or to a QP of a member's slot, the same bytes are not a MAD.
    let mut qp0 = request(false, S_TCP);
    qp0[7] = 0;
    assert_eq!(steer(&t, &p, &qp0), designated);
    let mut to_qp = request(false, S_TCP);
    to_qp[5..8].copy_from_slice(&l.qpn(7, 1).unwrap().to_be_bytes()[1..]);
    assert_eq!(steer(&t, &p, &to_qp), 0);
    // The QPN path is unchanged by the listeners.
    for (i, &slot) in order.slots().iter().enumerate() {
        let qpn = l.qpn(slot, 77).unwrap();
        assert_eq!(steer(&t, &p, &bth_to(qpn)), i as u32);
    }
    assert_eq!(steer(&t, &p, &probe(9, 1)), 9);
    // A listener leaves: its REQs go to the designated member.
    t.unlisten(S_TCP);
    let p = t.program();
    assert_eq!(steer(&t, &p, &request(false, S_TCP)), designated);
    assert_eq!(steer(&t, &p, &request(true, S_UDP)), 3);
}

#[test]
fn the_largest_program_holds_every_route_and_listener() {
    // 12 slot bits: MAX_ROUTES routes, MAX_LISTENERS listeners and more.
    let l = QpnLayout::new(12).unwrap();
    let order = GroupOrder::from_slots((1..=l.max_slot()).collect());
    let mut t = SteeringTable::from_order(l, &order).unwrap();
    let slot_of = |i: u64| 1 + (i % MAX_ROUTES as u64) as u16;
    for i in 0..MAX_LISTENERS as u64 + 10 {
        t.listen(S_TCP + i, slot_of(i));
    }
    let p = t.program();
    assert!(p.len() <= MAX_INSNS, "{}", p.len());
    assert_eq!(
        p.len(),
        FIXED_INSNS + 2 * MAX_ROUTES + LISTENER_INSNS * MAX_LISTENERS
    );
    let last = MAX_LISTENERS as u64 - 1;
    let want = order.index_of(slot_of(last)).unwrap();
    assert_eq!(steer(&t, &p, &request(false, S_TCP + last)), want);
    assert_eq!(steer(&t, &p, &request(true, S_TCP)), 0);
    // Beyond the limit: the designated member (index 0, slot 1).
    assert_eq!(steer(&t, &p, &request(false, S_TCP + last + 1)), 0);
    // The last route, by QPN and by communication ID.
    let top = MAX_ROUTES as u16;
    let want = order.index_of(top).unwrap();
    assert_eq!(steer(&t, &p, &bth_to(l.qpn(top, 1).unwrap())), want);
    let id = *l.comm_ids(top).unwrap().end();
    assert_eq!(steer(&t, &p, &answer(cm_attr::DREQ, id)), want);
    let to_srq = |slot| xrc_datagram(0xA4, l.qpn(1, 1).unwrap(), l.qpn(slot, 1).unwrap());
    assert_eq!(steer(&t, &p, &to_srq(top)), want);
    assert_eq!(steer(&t, &p, &to_srq(top + 1)), 0, "cut route");
    let id = *l.comm_ids(top + 1).unwrap().start();
    assert_eq!(steer(&t, &p, &answer(cm_attr::DREQ, id)), 0, "cut route");
}

/// A datagram of opcode `opcode` to `qpn` whose bytes 12-15 are an XRCETH naming `srqn`
/// (a payload and an ICRC after it).
fn xrc_datagram(opcode: u8, qpn: u32, srqn: u32) -> Vec<u8> {
    let mut d = vec![0u8; 40];
    d[0] = opcode;
    d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    d[12] = 0xA5; // reserved: not read
    d[13..16].copy_from_slice(&srqn.to_be_bytes()[1..]);
    d
}

#[test]
fn xrc_requests_go_by_their_srq_and_the_rest_by_qpn() {
    // The opcodes steered by their XRCETH are exactly the ones the opcode table gives
    // an XRCETH (and the unassigned 0xB5 among them).
    for op in 0..=u8::MAX {
        let has = uroce_wire::opcode::info(op)
            .is_some_and(|i| i.headers.contains(uroce_wire::opcode::HeaderSet::XRCETH));
        assert_eq!(is_xrc_request(op), has || op == 0xB5, "{op:#x}");
    }
    let l = QpnLayout::default();
    let order = GroupOrder::from_slots(vec![7, 2, 200, 5]);
    let t = SteeringTable::from_order(l, &order).unwrap();
    let p = t.program();
    assert_eq!(p.len(), FIXED_INSNS + 2 * 4);
    let designated = order.index_of(2).unwrap();
    let target = l.qpn(7, 3).unwrap(); // the XRC target QP (or the initiator)
    for op in 0..=u8::MAX {
        if op == PROBE_OPCODE {
            continue;
        }
        for (srq_slot, srq_local) in [(200, 1), (5, 0xFFFF), (7, 9), (9, 1), (0, 1), (255, 2)] {
            let srqn = (u32::from(srq_slot) << l.local_bits()) | srq_local;
            let d = xrc_datagram(op, target, srqn);
            let want = if is_xrc_request(op) && srq_slot != 0 {
                order.index_of(srq_slot).unwrap_or(designated)
            } else {
                order.index_of(7).unwrap()
            };
            assert_eq!(steer(&t, &p, &d), want, "{op:#x} srqn {srqn:#x}");
            // Every truncation: a request without a whole XRCETH, and anything shorter
            // than a BTH, to the designated member; program and model agree.
            for len in 0..d.len() {
                let got = steer(&t, &p, &d[..len]);
                if len < MIN_STEERED_LEN as usize
                    || (is_xrc_request(op) && len < MIN_XRC_STEERED_LEN as usize)
                {
                    assert_eq!(got, designated, "{op:#x} cut to {len}");
                } else {
                    assert_eq!(got, want, "{op:#x} cut to {len}");
                }
            }
        }
    }
    // The bits above the 24-bit SRQ number (the reserved byte) are not read.
    let mut d = xrc_datagram(0xA4, target, l.qpn(5, 1).unwrap());
    d[12] = 0xFF;
    assert_eq!(steer(&t, &p, &d), order.index_of(5).unwrap());
}
