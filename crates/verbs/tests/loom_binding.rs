//! Model check of the QP ↔ connection-endpoint binding protocol (`uroce_verbs::binding`)
//! with loom: an endpoint binding a QP races a second endpoint binding the same QP and the
//! QP's destroy.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p uroce-verbs --test loom_binding`
//! (`scripts/test` runs it after the main suite).
//!
//! Without `--cfg loom` this file compiles to nothing.

#[cfg(loom)]
mod model {
    use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use loom::sync::{Arc, Mutex};
    use uroce_verbs::binding::{BindError, BindSlot};

    /// The QP: its binding slot and whether it is published. The model's reference count
    /// is the loom `Arc`'s strong count.
    struct Qp {
        slot: BindSlot<Arc<Endpoint>>,
        published: AtomicBool,
    }

    /// An endpoint: the QP reference it holds under its lock, and how often it was told
    /// that its QP died.
    struct Endpoint {
        qp: Mutex<Option<Arc<Qp>>>,
        told: AtomicUsize,
        /// Whether its bind succeeded.
        bound: AtomicBool,
    }

    impl Endpoint {
        fn new() -> Arc<Endpoint> {
            Arc::new(Endpoint {
                qp: Mutex::new(None),
                told: AtomicUsize::new(0),
                bound: AtomicBool::new(false),
            })
        }

        /// Step 1: under the endpoint's lock, take the reference, then publish the binding.
        fn bind(ep: &Arc<Endpoint>, token: u64, qp: &Arc<Qp>) -> Result<(), BindError> {
            let mut held = ep.qp.lock().unwrap();
            *held = Some(qp.clone());
            let r = if qp.published.load(Ordering::SeqCst) {
                qp.slot.bind(token, ep.clone())
            } else {
                Err(BindError::Destroyed)
            };
            match r {
                Ok(()) => ep.bound.store(true, Ordering::SeqCst),
                Err(_) => *held = None,
            }
            r
        }

        /// The destroy notification: drop the reference under the lock.
        fn qp_destroyed(&self) {
            self.told.fetch_add(1, Ordering::SeqCst);
            *self.qp.lock().unwrap() = None;
        }
    }

    /// Step 3: unpublish, kill the slot, tell the owner.
    fn destroy(qp: &Arc<Qp>) {
        qp.published.store(false, Ordering::SeqCst);
        if let Some(owner) = qp.slot.kill() {
            owner.qp_destroyed();
        }
    }

    #[test]
    fn bind_races_second_bind_and_destroy() {
        loom::model(|| {
            let qp = Arc::new(Qp {
                slot: BindSlot::new(),
                published: AtomicBool::new(true),
            });
            let (a, b) = (Endpoint::new(), Endpoint::new());
            let ta = {
                let (qp, a) = (qp.clone(), a.clone());
                loom::thread::spawn(move || Endpoint::bind(&a, 1, &qp))
            };
            let tb = {
                let (qp, b) = (qp.clone(), b.clone());
                loom::thread::spawn(move || Endpoint::bind(&b, 2, &qp))
            };
            destroy(&qp);
            let ra = ta.join().unwrap();
            let rb = tb.join().unwrap();
            // At most one endpoint ever bound.
            assert!(!(ra.is_ok() && rb.is_ok()), "two endpoints bound one QP");
            for (ep, r) in [(&a, ra), (&b, rb)] {
                // Told exactly when it bound (the destroy always follows here), never twice.
                let told = ep.told.load(Ordering::SeqCst);
                assert_eq!(told, usize::from(r.is_ok()));
                assert_eq!(r.is_ok(), ep.bound.load(Ordering::SeqCst));
                // No endpoint keeps a reference to the dead QP.
                assert!(ep.qp.lock().unwrap().is_none(), "reference leaked");
            }
            // The QP is dead: nobody can bind it any more.
            assert_eq!(qp.slot.bind(3, a.clone()), Err(BindError::Destroyed));
            // Only the destroyer's reference is left (the owner references it held are
            // gone with the slot's content).
            assert_eq!(Arc::strong_count(&qp), 1);
        });
    }

    #[test]
    fn unbind_only_by_the_binder_then_rebind() {
        loom::model(|| {
            let qp = Arc::new(Qp {
                slot: BindSlot::new(),
                published: AtomicBool::new(true),
            });
            let (a, b) = (Endpoint::new(), Endpoint::new());
            Endpoint::bind(&a, 1, &qp).unwrap();
            let t = {
                let (qp, b) = (qp.clone(), b.clone());
                loom::thread::spawn(move || {
                    // B may bind only after A let go.
                    assert!(!qp.slot.unbind(2));
                    Endpoint::bind(&b, 2, &qp)
                })
            };
            assert!(qp.slot.unbind(1));
            *a.qp.lock().unwrap() = None;
            let rb = t.join().unwrap();
            match rb {
                Ok(()) => assert_eq!(qp.slot.bound_token(), Some(2)),
                Err(e) => {
                    assert_eq!(e, BindError::AlreadyBound);
                    assert_eq!(qp.slot.bound_token(), None);
                }
            }
            // The destroy breaks the QP → owner → QP cycle of a live binding.
            destroy(&qp);
            assert!(b.qp.lock().unwrap().is_none());
            assert_eq!(Arc::strong_count(&qp), 1);
        });
    }
}
