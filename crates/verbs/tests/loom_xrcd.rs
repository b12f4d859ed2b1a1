//! Model check of the XRC domain lifetime protocol (`uroce_verbs::Xrcd`) with loom: users
//! of one domain closing while another user opens the domain's target QP by number and a
//! packet looks it up. Every interleaving must keep the QP reachable while a user exists,
//! destroy it exactly once when the last user goes, and leave no QP or domain behind.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p uroce-verbs --test loom_xrcd`
//! (`scripts/test` runs it with `loom_table`). Without `--cfg loom` this file compiles to
//! nothing.

#[cfg(loom)]
mod model {
    use uroce_verbs::{Context, Device, DeviceConfig, Xrcd};

    fn setup() -> (Context, Xrcd, Xrcd, u32) {
        let dev = Device::new(DeviceConfig::new("loom0", "10.9.9.9".parse().expect("ip")))
            .expect("device");
        let ctx = Context::open(&dev).expect("context");
        let u1 = ctx.alloc_xrcd().expect("xrcd");
        let u2 = u1.share();
        let qp = u1.create_qp().expect("target qp");
        let qpn = qp.qp_num();
        // The creator's handle goes: the domain holds the QP.
        drop(qp);
        (ctx, u1, u2, qpn)
    }

    /// One user closes while the other opens the QP, drops the handle and closes; a packet
    /// lookup runs on the main thread.
    #[test]
    fn close_races_open_and_lookup() {
        loom::model(|| {
            let (ctx, u1, u2, qpn) = setup();
            let closer = loom::thread::spawn(move || drop(u1));
            let opener = loom::thread::spawn(move || {
                // u2 is a user: the QP must be there.
                let h = u2.open_qp(qpn).expect("open while a user exists");
                assert_eq!(h.qp_num(), qpn);
                drop(h);
                drop(u2);
            });
            let seen = ctx.qp_for_packet(qpn);
            drop(seen);
            closer.join().expect("closer");
            opener.join().expect("opener");
            assert!(ctx.lookup_qp(qpn).is_none(), "destroyed with the last user");
            let live = ctx.live_objects();
            assert_eq!((live.qps, live.xrcds), (0, 0));
        });
    }

    /// Both users close at once: exactly one of them is the last and destroys the QP.
    #[test]
    fn two_last_closes() {
        loom::model(|| {
            let (ctx, u1, u2, qpn) = setup();
            let a = loom::thread::spawn(move || drop(u1));
            let b = loom::thread::spawn(move || drop(u2));
            a.join().expect("a");
            b.join().expect("b");
            assert!(ctx.lookup_qp(qpn).is_none());
            let live = ctx.live_objects();
            assert_eq!((live.qps, live.xrcds), (0, 0));
        });
    }
}
