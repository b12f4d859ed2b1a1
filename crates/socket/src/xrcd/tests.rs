//! Unit tests of the domains file: the lifetime rules, the host-wide target QP numbers,
//! the text format, and the protocol with threads standing for processes (each thread
//! has its own pid in the file and its own open file description of the lock, so the
//! `flock` excludes them as it excludes processes).

use super::*;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uroce-xrcd-ut-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const A: DomainId = DomainId {
    dev: 0x803,
    ino: 42,
};
const B: DomainId = DomainId {
    dev: 0x803,
    ino: 43,
};

#[test]
fn the_last_reference_destroys_the_domain_and_its_target_qps() {
    let dir = scratch("last");
    let d = Domains::new(&dir, QpnLayout::default());
    let range = target_qpns(QpnLayout::default());
    assert_eq!(range, 0xFF_0000..=0xFF_FFFE);
    // Process 10 creates the domain and a target QP; process 11 opens it twice.
    let mut l = d.lock_as(10, 1000).unwrap();
    assert!(!l.open_ref(A));
    assert!(matches!(l.create_target_qp(B), Err(XrcdError::NotHeld(_))));
    let q1 = l.create_target_qp(A).unwrap();
    assert_eq!(q1, *range.start());
    l.commit().unwrap();
    let mut l = d.lock_as(11, 1100).unwrap();
    assert!(l.open_ref(A));
    assert!(l.open_ref(A));
    assert_eq!(l.held(A), 2);
    let q2 = l.create_target_qp(A).unwrap();
    l.commit().unwrap();
    assert_eq!(d.read().unwrap().domains[&A].target_qps, vec![q1, q2]);
    // The creator closes: the target QPs stay with the domain.
    let mut l = d.lock_as(10, 1000).unwrap();
    let c = l.close_ref(A).unwrap();
    assert_eq!(c, Closed::default());
    assert!(matches!(l.close_ref(A), Err(XrcdError::NotHeld(_))));
    l.commit().unwrap();
    assert_eq!(d.read().unwrap().domains[&A].target_qps, vec![q1, q2]);
    // Process 11's first close keeps it; its last destroys both QPs and the domain.
    let mut l = d.lock_as(11, 1100).unwrap();
    let c = l.close_ref(A).unwrap();
    assert!(c.still_held && c.destroyed.is_empty());
    assert!(l.destroy_target_qp(A, q1));
    assert!(!l.destroy_target_qp(A, q1));
    let c = l.close_ref(A).unwrap();
    assert_eq!(
        c,
        Closed {
            still_held: false,
            destroyed: vec![q2]
        }
    );
    l.commit().unwrap();
    assert!(d.read().unwrap().domains.is_empty());
    // An uncommitted change is discarded.
    let mut l = d.lock_as(12, 1200).unwrap();
    l.open_ref(B);
    drop(l);
    assert!(d.read().unwrap().domains.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dead_holders_are_reaped_and_a_domain_without_holders_destroyed() {
    let dir = scratch("reap");
    let d = Domains::new(&dir, QpnLayout::default());
    let mut l = d.lock_as(20, 1).unwrap();
    l.open_ref(A);
    let qa = l.create_target_qp(A).unwrap();
    l.open_ref(B);
    let qb = l.create_target_qp(B).unwrap();
    l.commit().unwrap();
    let mut l = d.lock_as(21, 2).unwrap();
    l.open_ref(A);
    l.commit().unwrap();
    // 20 dies: A survives with 21 (and keeps 20's target QP), B is destroyed.
    let mut l = d.lock_as(21, 2).unwrap();
    let r = l.reap_with(|r| r.pid != 20);
    assert_eq!(r.dead.len(), 2);
    assert_eq!(r.destroyed, vec![(B, vec![qb])]);
    assert_eq!(l.state().domains[&A].target_qps, vec![qa]);
    l.commit().unwrap();
    // A process of a reused pid (another start time) is not the holder.
    let mut l = d.lock_as(21, 3).unwrap();
    assert_eq!(l.held(A), 0);
    assert!(matches!(l.close_ref(A), Err(XrcdError::NotHeld(_))));
    l.open_ref(A);
    assert_eq!(
        l.state().domains[&A].refs.len(),
        1,
        "the stale entry replaced"
    );
    drop(l);
    // The real reap: this process lives, a pid that does not exist does not.
    let me = std::process::id();
    let start = crate::host::proc_stat(me).unwrap().1;
    let mut l = d.lock().unwrap();
    l.open_ref(A);
    let r = l.reap();
    assert_eq!(
        r.dead,
        vec![(
            A,
            Reference {
                pid: 21,
                start_time: 2,
                count: 1
            }
        )]
    );
    assert!(r.destroyed.is_empty());
    assert_eq!(
        l.state().domains[&A].refs,
        vec![Reference {
            pid: me,
            start_time: start,
            count: 1
        }]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn target_qp_numbers_are_host_wide_and_never_given_twice() {
    let dir = scratch("qpns");
    let layout = QpnLayout::new(12).unwrap();
    let range = target_qpns(layout);
    assert_eq!(range, 0xFF_F000..=0xFF_FFFE);
    let span = (range.end() - range.start() + 1) as usize;
    let d = Domains::new(&dir, layout);
    let mut l = d.lock_as(30, 1).unwrap();
    l.open_ref(A);
    l.open_ref(B);
    let mut all = Vec::new();
    for i in 0..span {
        let id = if i % 2 == 0 { A } else { B };
        let q = l.create_target_qp(id).unwrap();
        assert!(range.contains(&q) && q != MULTICAST_QPN);
        all.push(q);
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), span, "every number once");
    assert!(matches!(l.create_target_qp(A), Err(XrcdError::Full)));
    // A freed number comes back only when the cursor reaches it.
    let q = *range.start() + 7;
    assert!(l.destroy_target_qp(B, q) || l.destroy_target_qp(A, q));
    assert_eq!(l.create_target_qp(B).unwrap(), q);
    l.commit().unwrap();
    let st = d.read().unwrap();
    assert_eq!(DomainsState::parse(&st.to_text()).unwrap(), st);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_text_round_trips_and_bad_files_are_refused() {
    let mut st = DomainsState {
        cursor: 0xFF_0003,
        ..DomainsState::default()
    };
    st.domains.insert(
        A,
        Domain {
            refs: vec![
                Reference {
                    pid: 1,
                    start_time: 2,
                    count: 3,
                },
                Reference {
                    pid: 4,
                    start_time: 5,
                    count: 1,
                },
            ],
            target_qps: vec![0xFF_0000, 0xFF_0002],
        },
    );
    st.domains.insert(B, Domain::default());
    assert_eq!(DomainsState::parse(&st.to_text()).unwrap(), st);
    for (bad, line) in [
        ("", 1),
        ("nonsense\n", 1),
        ("uroce-xrc 1\nref 1 2 3\n", 2),
        ("uroce-xrc 1\nqp 5\n", 2),
        ("uroce-xrc 1\ndomain 1 2\nref 1 2 0\n", 3),
        ("uroce-xrc 1\ndomain 1 2\nref 1 2 1\nref 1 3 1\n", 4),
        ("uroce-xrc 1\ndomain 1 2\ndomain 1 2\n", 3),
        ("uroce-xrc 1\ncursor 99999999999\n", 2),
        ("uroce-xrc 1\ndomain 1\n", 2),
    ] {
        assert_eq!(
            DomainsState::parse(bad).map_err(|e| e.0),
            Err(line),
            "{bad:?}"
        );
    }
}

/// Threads standing for processes open, create target QPs in, close and die holding one
/// domain, in every interleaving the scheduler gives; after every commit the file says a
/// target QP number is in at most one domain, and a domain exists exactly while some
/// holder holds it; at the end the last holder's close (or a reap) has destroyed it with
/// every target QP it had.
#[test]
fn processes_open_create_close_and_die_concurrently() {
    let dir = scratch("model");
    let d = Domains::new(&dir, QpnLayout::default());
    const PROCS: u32 = 6;
    const ROUNDS: u32 = 40;
    let destroyed = std::sync::Mutex::new(Vec::<u32>::new());
    let created = std::sync::Mutex::new(Vec::<u32>::new());
    std::thread::scope(|s| {
        for p in 0..PROCS {
            let (d, destroyed, created) = (&d, &destroyed, &created);
            s.spawn(move || {
                for round in 0..ROUNDS {
                    // Each round is a new process (pid p, start time round).
                    let (pid, start) = (100 + p, u64::from(round));
                    let mut l = d.lock_as(pid, start).unwrap();
                    l.open_ref(A);
                    l.open_ref(A);
                    let q = l.create_target_qp(A).unwrap();
                    created.lock().unwrap().push(q);
                    l.commit().unwrap();
                    let mut l = d.lock_as(pid, start).unwrap();
                    let c = l.close_ref(A).unwrap();
                    assert!(c.still_held && c.destroyed.is_empty());
                    l.commit().unwrap();
                    let mut l = d.lock_as(pid, start).unwrap();
                    if round % 3 == 0 {
                        // Dies holding its reference: some process reaps it.
                        let r = l.reap_with(|r| (r.pid, r.start_time) != (pid, start));
                        for (_, qs) in r.destroyed {
                            destroyed.lock().unwrap().extend(qs);
                        }
                    } else {
                        let c = l.close_ref(A).unwrap();
                        assert!(!c.still_held);
                        destroyed.lock().unwrap().extend(c.destroyed);
                    }
                    let st = l.state().clone();
                    l.commit().unwrap();
                    let mut seen = std::collections::BTreeSet::new();
                    for dom in st.domains.values() {
                        assert!(!dom.refs.is_empty(), "a domain nobody holds");
                        for q in &dom.target_qps {
                            assert!(seen.insert(*q), "{q:#x} in two domains");
                        }
                    }
                }
            });
        }
    });
    // Every process is gone now: a last reap destroys whatever remains.
    let mut l = d.lock_as(1, 1).unwrap();
    for (_, qs) in l.reap_with(|_| false).destroyed {
        destroyed.lock().unwrap().extend(qs);
    }
    l.commit().unwrap();
    assert!(d.read().unwrap().domains.is_empty());
    let mut created = created.into_inner().unwrap();
    let mut destroyed = destroyed.into_inner().unwrap();
    created.sort_unstable();
    destroyed.sort_unstable();
    assert_eq!(created.len(), (PROCS * ROUNDS) as usize);
    assert_eq!(created, destroyed, "every target QP destroyed exactly once");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Files named after an address (`Domains::named`, a shared device's): the lock and the
/// temporary file are the name with `.lock` / `.tmp` appended, so two addresses that
/// differ only in their last byte keep apart (an extension replaced would merge them).
#[test]
fn named_files_of_two_addresses_keep_apart() {
    let dir = scratch("named");
    let d8 = Domains::named(&dir, "reg-xrc-127.0.0.8", QpnLayout::default());
    let d9 = Domains::named(&dir, "reg-xrc-127.0.0.9", QpnLayout::default());
    assert_eq!(d9.path(), dir.join("reg-xrc-127.0.0.9"));
    let mut l8 = d8.lock_as(10, 1000).unwrap();
    // Not excluded by the other file's lock (a shared lock file would block here).
    let mut l9 = d9.lock_as(10, 1000).unwrap();
    l8.open_ref(A);
    l9.open_ref(B);
    l9.commit().unwrap();
    l8.commit().unwrap();
    assert!(dir.join("reg-xrc-127.0.0.8.lock").exists());
    assert!(dir.join("reg-xrc-127.0.0.9.lock").exists());
    let (s8, s9) = (d8.read().unwrap(), d9.read().unwrap());
    assert_eq!(s8.domains.keys().copied().collect::<Vec<_>>(), vec![A]);
    assert_eq!(s9.domains.keys().copied().collect::<Vec<_>>(), vec![B]);
    let _ = std::fs::remove_dir_all(&dir);
}
