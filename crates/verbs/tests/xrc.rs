//! XRC through the verbs object model on networked contexts: an XRC_SEND QP on one device,
//! an XRC domain with XRC SRQs and a target QP on another, packets carried between them by
//! the test (each context has a transport that does nothing; the test drains every
//! engine and hands each packet to the QP its destination address and DestQP name).
//!
//! What is checked (IBA Vol 1 Annex A14 and the verbs semantics of `ibv_open_xrcd`,
//! `ibv_open_qp` and the legacy `reg_xrc_rcv_qp`): a target QP is owned by its domain and
//! keeps delivering after the user that created it has gone, and it is freed exactly when
//! the domain's last user goes; SRQs outside the domain are refused (NAK → the initiator's
//! WR completes with `REM_INV_REQ_ERR`); closes and destroys racing traffic neither crash
//! nor leak.

mod common;

use std::net::IpAddr;
use std::sync::Arc;

use uroce_proto::time::Instant;
use uroce_verbs::{
    AccessFlags, Context, Cq, Device, DeviceConfig, MemBlock, Mr, Pd, QpInitAttr, QpRef, QpState,
    QpType, RcConnect, RecvWr, SendFlags, SendWr, Sge, Srq, SrqInitAttr, Transport, TxPacket,
    WcStatus, Xrcd,
};
use uroce_wire::PacketRepr;

struct Idle;

impl Transport for Idle {
    fn ring(&self, _qpn: u32) {}
    fn poll_progress(&self) -> bool {
        false
    }
    fn flush(&self, _qpn: u32) {}
}

const INI_ADDR: &str = "10.7.0.1";
const TGT_ADDR: &str = "10.7.0.2";

fn node(name: &str, addr: &str) -> (Context, IpAddr) {
    let ip: IpAddr = addr.parse().expect("ip");
    let dev = Device::new(DeviceConfig::new(name, ip)).expect("device");
    let ctx = Context::open(&dev).expect("context");
    assert!(ctx.set_transport(Arc::new(Idle)).is_ok());
    (ctx, ip)
}

/// The target node on [`TGT_ADDR`] with a PD, a CQ of `cqe` entries and a 4 KiB region
/// for receives.
fn target_node(cqe: u32) -> (Context, IpAddr, Pd, Cq, Mr) {
    let (tctx, tip) = node("tgt", TGT_ADDR);
    let pd = tctx.alloc_pd().expect("pd");
    let cq = common::cq(&tctx, cqe);
    let mr = pd
        .reg_mr(
            MemBlock::new(64 * 64).expect("block"),
            AccessFlags::LOCAL_WRITE,
        )
        .expect("mr");
    (tctx, tip, pd, cq, mr)
}

/// Moves packets until no engine has anything to send (bounded). `qps` are the sending
/// QPs to drain; each packet goes to the context whose address it names.
fn pump(qps: &[&QpRef], nodes: &[(&Context, IpAddr)], now: &mut u64) -> usize {
    let mut moved = 0;
    for _round in 0..64 {
        let mut any = false;
        for qp in qps {
            let mut buf = vec![0u8; 16 * 4160];
            let mut out: Vec<TxPacket> = Vec::new();
            *now += 1000;
            let t = qp.engine_transmit(Instant::from_nanos(*now), &mut buf, 4160, 16, &mut out);
            let mut off = 0;
            for p in out.iter().take(t.packets) {
                let bytes = &buf[off..off + p.len];
                off += p.len;
                let pkt = PacketRepr::parse(bytes).expect("engine output parses");
                let Some((ctx, ip)) = nodes.iter().find(|(_, ip)| *ip == p.dst) else {
                    continue;
                };
                // The sender's node: the one with a QP of that number, and when both
                // nodes have one (each context numbers its QPs alike), the node the packet
                // does not go to.
                let holders: Vec<IpAddr> = nodes
                    .iter()
                    .filter(|(c, _)| c.lookup_qp(qp.qp_num()).is_some())
                    .map(|(_, a)| *a)
                    .collect();
                let src = match holders.as_slice() {
                    [one] => *one,
                    _ => nodes
                        .iter()
                        .map(|(_, a)| *a)
                        .find(|a| a != ip)
                        .unwrap_or(*ip),
                };
                if let Some(dst_qp) = ctx.qp_for_packet(pkt.bth.dest_qp) {
                    let from = uroce_verbs::Arrival::new(src, *ip);
                    dst_qp.engine_handle_packet(Instant::from_nanos(*now), &from, &pkt);
                }
                moved += 1;
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    moved
}

struct Initiator {
    ctx: Context,
    ip: IpAddr,
    _pd: Pd,
    cq: Cq,
    mr: Mr,
    qp: uroce_verbs::Qp,
}

fn initiator() -> Initiator {
    let (ctx, ip) = node("ini", INI_ADDR);
    let pd = ctx.alloc_pd().expect("pd");
    let cq = common::cq(&ctx, 64);
    let mut attr = QpInitAttr::new(QpType::XrcSend, &cq, &cq, common::caps(16));
    attr.recv_cq = None;
    attr.cap.max_recv_wr = 0;
    attr.cap.max_recv_sge = 0;
    let qp = pd.create_qp(&attr).expect("xrc send qp");
    let block = MemBlock::new(4096).expect("block");
    let mr = pd.reg_mr(block, AccessFlags::LOCAL_WRITE).expect("mr");
    Initiator {
        ctx,
        ip,
        _pd: pd,
        cq,
        mr,
        qp,
    }
}

fn connect_initiator(ini: &Initiator, tgt_ip: IpAddr, tgt_qpn: u32) {
    let c = RcConnect::new(tgt_ip, tgt_qpn);
    ini.qp.connect_rc(&c).expect("initiator to RTS");
}

fn send_to(ini: &Initiator, wr_id: u64, srqn: u32, text: &[u8]) {
    ini.mr.block().copy_in(0, text).expect("copy");
    let mut wr = SendWr::send(
        wr_id,
        vec![Sge {
            addr: ini.mr.iova(),
            length: text.len() as u32,
            lkey: ini.mr.lkey(),
        }],
    );
    wr.flags = SendFlags::SIGNALED;
    wr.xrc_remote_srqn = srqn;
    ini.qp.post_send(wr).expect("post");
}

fn xrc_srq(xrcd: &Xrcd, pd: &Pd, cq: &Cq, mr: &Mr, n: u64) -> Srq {
    let srq = xrcd
        .create_srq(
            pd,
            cq,
            &SrqInitAttr {
                max_wr: 64,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("xrc srq");
    for k in 0..n {
        srq.post_recv(RecvWr::new(
            k,
            vec![Sge {
                addr: mr.iova() + k * 64,
                length: 64,
                lkey: mr.lkey(),
            }],
        ))
        .expect("post recv");
    }
    srq
}

/// The target QP is created by one user of the domain, which then goes (its QP handle
/// dropped, its domain handle closed): the QP stays published, owned by the domain, and
/// keeps delivering into the SRQ; a second user opens it by number. It is freed exactly
/// when the last user of the domain goes: the QP count, the table lookup and the
/// reference counts say so at each step.
#[test]
fn target_qp_outlives_its_creator_and_dies_with_the_last_domain_user() {
    let ini = initiator();
    let (tctx, tip, pd, cq, mr) = target_node(64);

    let creator = tctx.alloc_xrcd().expect("xrcd");
    let other = creator.share();
    assert_eq!((creator.users(), other.users()), (2, 2));
    assert!(creator.same_domain(&other));
    let srq = xrc_srq(&other, &pd, &cq, &mr, 8);
    let qps_before = tctx.live_objects().qps;

    let c = RcConnect::new(ini.ip, ini.qp.qp_num());
    let tgt_qpn = creator.create_reg_qp(&c).expect("create_reg_qp");
    assert_eq!(creator.registrations(tgt_qpn), 1);
    assert_eq!(tctx.live_objects().qps, qps_before + 1);
    {
        let h = creator.open_qp(tgt_qpn).expect("open");
        assert_eq!(h.query().0.qp_state, QpState::Rtr);
        assert_eq!(h.qp_type(), QpType::XrcRecv);
    }
    connect_initiator(&ini, tip, tgt_qpn);
    // The other user registers too (legacy `reg_xrc_rcv_qp`).
    other.reg_xrc_rcv_qp(tgt_qpn).expect("reg");
    assert_eq!(other.registrations(tgt_qpn), 2);

    // The creator goes: its registration, then its domain handle.
    creator.unreg_xrc_rcv_qp(tgt_qpn).expect("unreg");
    assert!(
        tctx.lookup_qp(tgt_qpn).is_some(),
        "still registered by the other user"
    );
    assert_eq!(other.registrations(tgt_qpn), 1);
    drop(creator);
    assert_eq!(other.users(), 1);
    assert_eq!(other.owned_qps(), vec![tgt_qpn]);
    assert_eq!(tctx.live_objects().qps, qps_before + 1);

    // Still delivering, into the SRQ it names, completions on the SRQ's CQ.
    let nodes = [(&ini.ctx, ini.ip), (&tctx, tip)];
    let mut now = 0;
    for (i, text) in [&b"first"[..], b"second", b"third"].iter().enumerate() {
        send_to(&ini, i as u64, srq.srq_num(), text);
        let tref = tctx.lookup_qp(tgt_qpn).expect("target");
        pump(&[&ini.qp, &tref], &nodes, &mut now);
        let wcs = cq.poll(4);
        assert_eq!(wcs.len(), 1, "{wcs:?}");
        assert_eq!(
            (wcs[0].status, wcs[0].qp_num, wcs[0].byte_len as usize),
            (WcStatus::Success, tgt_qpn, text.len())
        );
        let mut got = vec![0u8; text.len()];
        mr.block()
            .copy_out((wcs[0].wr_id * 64) as usize, &mut got)
            .expect("read");
        assert_eq!(&got[..], *text);
        let s = ini.cq.poll(4);
        assert_eq!(
            s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(i as u64, WcStatus::Success)]
        );
    }

    // The other user opens the QP by number, drops the handle: back to the domain.
    let h = other.open_qp(tgt_qpn).expect("open by the other user");
    assert!(other.owned_qps().is_empty());
    drop(h);
    assert_eq!(other.owned_qps(), vec![tgt_qpn]);
    assert_eq!(tctx.live_objects().qps, qps_before + 1);

    // The last user: busy while its SRQ exists; after that the close frees the QP.
    let (other, e) = other.destroy().expect_err("busy with the SRQ");
    assert!(matches!(e, uroce_verbs::DestroyError::Busy { .. }), "{e}");
    assert!(tctx.lookup_qp(tgt_qpn).is_some());
    srq.destroy().expect("srq");
    let refs = other.ref_count();
    assert_eq!(refs, 2, "the user and the held QP reference the domain");
    assert_eq!(
        other.registrations(tgt_qpn),
        1,
        "closing does not wait for unreg"
    );
    other.destroy().expect("last user");
    assert!(
        tctx.lookup_qp(tgt_qpn).is_none(),
        "freed with the last user"
    );
    assert_eq!(tctx.live_objects().qps, qps_before);
    assert_eq!(tctx.live_objects().xrcds, 0);
}

/// An SRQ of another domain of the same context, and an SRQ number nobody has: the
/// target NAKs, the initiator's WR completes with REM_INV_REQ_ERR, the target QP goes to
/// ERR and raises its event, no WQE of any SRQ is consumed.
#[test]
fn srqs_outside_the_domain_are_refused() {
    for foreign in [true, false] {
        let ini = initiator();
        let (tctx, tip, pd, cq, mr) = target_node(64);
        let mine = tctx.alloc_xrcd().expect("xrcd");
        let theirs = tctx.alloc_xrcd().expect("xrcd");
        let good = xrc_srq(&mine, &pd, &cq, &mr, 2);
        let bad = xrc_srq(&theirs, &pd, &cq, &mr, 2);
        let tgt = mine.create_qp().expect("target");
        tgt.connect_rc(&RcConnect::new(ini.ip, ini.qp.qp_num()))
            .expect("target to RTS");
        connect_initiator(&ini, tip, tgt.qp_num());
        let srqn = if foreign { bad.srq_num() } else { 0x00ab_cdef };
        send_to(&ini, 9, srqn, b"nope");
        let mut now = 0;
        pump(
            &[&ini.qp, &tgt],
            &[(&ini.ctx, ini.ip), (&tctx, tip)],
            &mut now,
        );
        let s = ini.cq.poll(4);
        assert_eq!(
            s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(9, WcStatus::RemInvReqErr)],
            "foreign={foreign}"
        );
        assert_eq!(tgt.query().0.qp_state, QpState::Err);
        assert_eq!(tgt.engine_counters().map(|c| c.bad_xrc_srqn), Some(1));
        assert_eq!((good.len(), bad.len()), (2, 2));
        assert!(cq.poll(4).is_empty());
        let ev = tctx.try_get_async_event().expect("event");
        assert_eq!(ev.event_type(), uroce_verbs::EventType::QpReqErr);
    }
}

/// Closes and destroys of domain users, SRQs and target QP handles race traffic on other
/// threads; bounded rounds. Nothing panics, every send completes (successfully or
/// flushed/errored), and once everything is gone no QP, SRQ or domain is left.
#[test]
fn closes_and_destroys_race_traffic() {
    const ROUNDS: usize = 20;
    for round in 0..ROUNDS {
        let ini = initiator();
        let (tctx, tip, pd, cq, mr) = target_node(256);
        let u1 = tctx.alloc_xrcd().expect("xrcd");
        let u2 = u1.share();
        let srq_a = xrc_srq(&u1, &pd, &cq, &mr, 32);
        let srq_b = xrc_srq(&u2, &pd, &cq, &mr, 32);
        let (na, nb) = (srq_a.srq_num(), srq_b.srq_num());
        let tgt_qpn = u1
            .create_reg_qp(&RcConnect::new(ini.ip, ini.qp.qp_num()))
            .expect("target");
        connect_initiator(&ini, tip, tgt_qpn);
        let tctx = Arc::new(tctx);
        std::thread::scope(|s| {
            let t2 = tctx.clone();
            let ini_ref = &ini;
            let traffic = s.spawn(move || {
                let mut now = 0;
                for k in 0..16u64 {
                    let srqn = if k % 2 == 0 { na } else { nb };
                    ini_ref.mr.block().copy_in(0, b"race").expect("copy");
                    let mut wr = SendWr::send(
                        k,
                        vec![Sge {
                            addr: ini_ref.mr.iova(),
                            length: 4,
                            lkey: ini_ref.mr.lkey(),
                        }],
                    );
                    wr.flags = SendFlags::SIGNALED;
                    wr.xrc_remote_srqn = srqn;
                    // The initiator may be in ERR after a NAK: the post still succeeds
                    // (flushed) or is refused; both are fine here.
                    let _ = ini_ref.qp.post_send(wr);
                    let tref = t2.lookup_qp(tgt_qpn);
                    let mut qps: Vec<&QpRef> = vec![&ini_ref.qp];
                    if let Some(t) = &tref {
                        qps.push(t);
                    }
                    pump(&qps, &[(&ini_ref.ctx, ini_ref.ip), (&t2, tip)], &mut now);
                }
            });
            let closer = s.spawn(move || {
                // Vary the order with the round.
                if round % 2 == 0 {
                    let _ = srq_b.destroy();
                    u1.unreg_xrc_rcv_qp(tgt_qpn).expect("unreg");
                    drop(u1);
                } else {
                    u1.unreg_xrc_rcv_qp(tgt_qpn).expect("unreg");
                    drop(u1);
                    let _ = srq_b.destroy();
                }
                let h = u2.open_qp(tgt_qpn).ok();
                drop(h);
                (u2, srq_a)
            });
            traffic.join().expect("traffic thread");
            let (u2, srq_a) = closer.join().expect("closer thread");
            drop(srq_a);
            drop(u2);
        });
        // Every send completed one way or another.
        let sends = ini.cq.poll(64);
        assert!(sends.len() <= 16, "round {round}: {}", sends.len());
        assert!(tctx.lookup_qp(tgt_qpn).is_none(), "round {round}");
        let live = tctx.live_objects();
        assert_eq!(
            (live.qps, live.srqs, live.xrcds),
            (0, 0, 0),
            "round {round}"
        );
    }
}

/// A target QP created with a number given by the caller (`Xrcd::create_qp_numbered`, the
/// host-wide number a domain shared between processes allots from the reserved top slot)
/// has that number, outside the context's range, and receives as any other; the number is
/// refused while in use, and reserved numbers are refused.
#[test]
fn numbered_target_qp_receives() {
    let ini = initiator();
    let (tctx, tip, pd, cq, mr) = target_node(64);
    let xrcd = tctx.alloc_xrcd().expect("xrcd");
    let srq = xrc_srq(&xrcd, &pd, &cq, &mr, 2);
    let qpn = 0x00ff_0001;
    let tgt = xrcd.create_qp_numbered(qpn).expect("numbered target");
    assert_eq!(tgt.qp_num(), qpn);
    for taken in [qpn, 0, 1, 0x00ff_ffff, 0x0100_0000] {
        assert!(
            matches!(
                xrcd.create_qp_numbered(taken),
                Err(uroce_verbs::CreateQpError::QpnInUse(n)) if n == taken
            ),
            "{taken:#x}"
        );
    }
    tgt.connect_rc(&RcConnect::new(ini.ip, ini.qp.qp_num()))
        .expect("target to RTS");
    connect_initiator(&ini, tip, qpn);
    send_to(&ini, 5, srq.srq_num(), b"numbered");
    let mut now = 0;
    pump(
        &[&ini.qp, &tgt],
        &[(&ini.ctx, ini.ip), (&tctx, tip)],
        &mut now,
    );
    let s = ini.cq.poll(4);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(5, WcStatus::Success)]
    );
    let r = cq.poll(4);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].status, WcStatus::Success);
    assert_eq!(r[0].qp_num, qpn);
    tgt.destroy().map_err(|(_, e)| e).expect("destroy");
    // Free again once destroyed.
    let again = xrcd.create_qp_numbered(qpn).expect("number free again");
    again.destroy().map_err(|(_, e)| e).expect("destroy");
}
