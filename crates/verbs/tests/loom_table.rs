//! Model check of the reference / unpublish protocol of `uroce_verbs::table` with loom.
//!
//! Run with (exhaustive, about 25 s after the build; add `LOOM_MAX_PREEMPTIONS=3` for a
//! bounded run under a second):
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p uroce-verbs --test loom_table`
//! (`scripts/test` runs exactly this after the main suite).
//!
//! Without `--cfg loom` this file compiles to nothing.

#[cfg(loom)]
mod model {
    use std::time::Duration;

    use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use loom::sync::Arc;
    use uroce_verbs::table::{wait_unreferenced, Table};

    /// A published object. `alive` is cleared by its destructor; `released` counts
    /// destructor runs; `released_on_destroyer` records whether the release happened on the
    /// destroying thread (i.e. inside `destroy`, not later on a looker's thread).
    struct Obj {
        number: u32,
        table: Arc<Table<Obj>>,
        alive: Arc<AtomicBool>,
        released: Arc<AtomicUsize>,
        in_destroyer: Arc<AtomicBool>,
        released_on_destroyer: Arc<AtomicBool>,
    }

    impl Drop for Obj {
        fn drop(&mut self) {
            self.alive.store(false, Ordering::SeqCst);
            self.released.fetch_add(1, Ordering::SeqCst);
            if self.in_destroyer.load(Ordering::SeqCst) {
                self.released_on_destroyer.store(true, Ordering::SeqCst);
            }
            // Step 4: free the number (the entry is retired by now).
            assert!(
                self.table.release(self.number),
                "released exactly once, after unpublish"
            );
        }
    }

    struct Shared {
        table: Arc<Table<Obj>>,
        alive: Arc<AtomicBool>,
        released: Arc<AtomicUsize>,
        in_destroyer: Arc<AtomicBool>,
        released_on_destroyer: Arc<AtomicBool>,
    }

    fn setup() -> (Shared, Arc<Obj>, u32) {
        let table: Arc<Table<Obj>> = Arc::new(Table::new("loom", 16..=31, 4));
        let s = Shared {
            table: table.clone(),
            alive: Arc::new(AtomicBool::new(true)),
            released: Arc::new(AtomicUsize::new(0)),
            in_destroyer: Arc::new(AtomicBool::new(false)),
            released_on_destroyer: Arc::new(AtomicBool::new(false)),
        };
        let (number, owner) = table
            .insert_with(|number| {
                Ok::<_, ()>(Obj {
                    number,
                    table: table.clone(),
                    alive: s.alive.clone(),
                    released: s.released.clone(),
                    in_destroyer: s.in_destroyer.clone(),
                    released_on_destroyer: s.released_on_destroyer.clone(),
                })
            })
            .expect("insert");
        (s, owner, number)
    }

    /// The destroy sequence every object of the crate uses: unpublish, wait, release.
    fn destroy(table: &Table<Obj>, owner: Arc<Obj>, number: u32, in_destroyer: &AtomicBool) {
        drop(table.unpublish(number));
        wait_unreferenced(&owner, 1, Duration::from_secs(1)).expect("references drain");
        in_destroyer.store(true, Ordering::SeqCst);
        drop(owner);
        in_destroyer.store(false, Ordering::SeqCst);
    }

    /// A looker-up (packet processing / event dispatch) races a destroyer.
    #[test]
    fn lookup_races_destroy() {
        loom::model(|| {
            let (s, owner, number) = setup();
            let table = s.table.clone();
            let looker = loom::thread::spawn(move || {
                if let Some(obj) = table.get(number) {
                    // Every holder of a reference sees a live object.
                    assert!(obj.alive.load(Ordering::SeqCst), "use after release");
                    loom::thread::yield_now();
                    assert!(obj.alive.load(Ordering::SeqCst), "use after release");
                    true
                } else {
                    false
                }
            });
            destroy(&s.table, owner, number, &s.in_destroyer);
            // Release happened exactly once, inside destroy, before it returned.
            assert_eq!(s.released.load(Ordering::SeqCst), 1);
            assert!(s.released_on_destroyer.load(Ordering::SeqCst));
            assert!(!s.alive.load(Ordering::SeqCst));
            assert!(s.table.get(number).is_none(), "no lookup after destroy");
            assert!(s.table.is_empty(), "number freed");
            looker.join().expect("looker");
        });
    }

    /// Two lookers, one of which clones its reference (a queued event), race a destroyer.
    #[test]
    fn two_lookups_race_destroy() {
        loom::model(|| {
            let (s, owner, number) = setup();
            let mut lookers = Vec::new();
            for clone_it in [false, true] {
                let table = s.table.clone();
                lookers.push(loom::thread::spawn(move || {
                    if let Some(obj) = table.get(number) {
                        let extra = clone_it.then(|| obj.clone());
                        assert!(obj.alive.load(Ordering::SeqCst), "use after release");
                        drop(obj);
                        if let Some(e) = extra {
                            assert!(e.alive.load(Ordering::SeqCst), "use after release");
                        }
                    }
                }));
            }
            destroy(&s.table, owner, number, &s.in_destroyer);
            assert_eq!(s.released.load(Ordering::SeqCst), 1);
            assert!(s.released_on_destroyer.load(Ordering::SeqCst));
            assert!(s.table.get(number).is_none());
            for l in lookers {
                l.join().expect("looker");
            }
        });
    }

    /// A number freed by a destroy is not reallocated while a concurrent insert runs; the
    /// retired number stays reserved until the release.
    #[test]
    fn insert_races_destroy_without_reuse() {
        loom::model(|| {
            let (s, owner, number) = setup();
            let table = s.table.clone();
            let inserter = loom::thread::spawn(move || {
                let t2 = table.clone();
                let made = table.insert_with(|n| {
                    Ok::<_, ()>(Obj {
                        number: n,
                        table: t2,
                        alive: Arc::new(AtomicBool::new(true)),
                        released: Arc::new(AtomicUsize::new(0)),
                        in_destroyer: Arc::new(AtomicBool::new(false)),
                        released_on_destroyer: Arc::new(AtomicBool::new(false)),
                    })
                });
                let (n, obj) = made.expect("insert");
                assert_ne!(n, number, "a number in use or just freed is never reused");
                // Tear it down the same way.
                drop(table.unpublish(n));
                drop(obj);
                n
            });
            destroy(&s.table, owner, number, &s.in_destroyer);
            let other = inserter.join().expect("inserter");
            assert_ne!(other, number);
            assert_eq!(s.released.load(Ordering::SeqCst), 1);
            assert!(s.table.is_empty());
        });
    }

    /// The real objects: a network lookup raising an event, an application consuming and
    /// acknowledging events, and the QP's destroy, all racing. An event is never queued or
    /// held after the destroy returned, and the QP is released by then.
    #[test]
    fn event_raise_races_qp_destroy() {
        use uroce_verbs::{Context, Device, DeviceConfig, EventType, QpCap, QpInitAttr, QpType};
        loom::model(|| {
            let dev = Device::new(DeviceConfig::new("loom0", "10.0.0.1".parse().expect("ip")))
                .expect("device");
            let ctx = Arc::new(Context::open(&dev).expect("context"));
            let pd = ctx.alloc_pd().expect("pd");
            let cq = ctx.create_cq(1, None, 0).expect("cq");
            let qp = pd
                .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, QpCap::default()))
                .expect("qp");
            let qpn = qp.qp_num();
            let returned = Arc::new(AtomicBool::new(false));
            let raiser = {
                let ctx = ctx.clone();
                loom::thread::spawn(move || {
                    if let Some(q) = ctx.qp_for_packet(qpn) {
                        let _ = q.raise_event(EventType::CommEst);
                    }
                })
            };
            let consumer = {
                let ctx = ctx.clone();
                let returned = returned.clone();
                loom::thread::spawn(move || {
                    if let Some(ev) = ctx.try_get_async_event() {
                        assert!(
                            !returned.load(Ordering::SeqCst),
                            "event held after its QP's destroy returned"
                        );
                        ev.ack();
                    }
                })
            };
            qp.destroy().expect("destroy");
            returned.store(true, Ordering::SeqCst);
            assert_eq!(
                ctx.pending_async_events(),
                0,
                "nothing queued after destroy"
            );
            assert_eq!(ctx.live_objects().qps, 0, "released inside destroy");
            raiser.join().expect("raiser");
            consumer.join().expect("consumer");
            assert_eq!(ctx.pending_async_events(), 0, "nothing queued later either");
            assert_eq!(ctx.table_sizes().0, 0, "QPN released");
        });
    }
}
