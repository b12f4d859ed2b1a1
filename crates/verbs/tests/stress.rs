//! Check 4: threads create QPs, raise events on them and destroy them concurrently.
//!
//! Creator threads create a QP, publish its number, sometimes raise an event on it, and
//! destroy it, recording a global sequence stamp right after `destroy` returned. Raiser
//! threads look random recent QPNs up the way the network does (`qp_for_packet`) and raise
//! events on whatever they find. A consumer thread fetches events, stamps each delivery
//! while holding the event, sometimes holds it a little, then acknowledges it.
//!
//! Checked: no panic; every delivered event's stamp precedes the destroy-return stamp of
//! its QP (no event delivered after its destroy returned); while the consumer holds an
//! event (sometimes for 100 µs), the destroy of its QP has not returned (a held event's QP
//! is never released); no QPN is handed out twice; at the end every table and the event
//! queue are empty and every reference count is back to its owner's.
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use uroce_verbs::{EventType, QpInitAttr, QpType};

const CREATORS: usize = 4;
const ITERATIONS: usize = 500;
const RAISERS: usize = 2;

#[test]
fn concurrent_create_raise_destroy() {
    let start = Instant::now();
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let cq = cq(&ctx, 16);

    let clock = AtomicU64::new(1);
    let recent: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    let destroyed_at: Mutex<HashMap<u32, u64>> = Mutex::new(HashMap::new());
    let created: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    let delivered: Mutex<Vec<(u32, u64)>> = Mutex::new(Vec::new());
    let creators_done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let raised_ok = AtomicU64::new(0);
    let raised_refused = AtomicU64::new(0);
    let qp_events = [
        EventType::CommEst,
        EventType::QpFatal,
        EventType::QpReqErr,
        EventType::QpAccessErr,
        EventType::SqDrained,
    ];

    std::thread::scope(|s| {
        for _ in 0..CREATORS {
            s.spawn(|| {
                let mut rng = rand::rng();
                for _ in 0..ITERATIONS {
                    let qp = pd
                        .create_qp(&QpInitAttr::new(QpType::Ud, &cq, &cq, caps(1)))
                        .expect("create");
                    let qpn = qp.qp_num();
                    created.lock().expect("lock").push(qpn);
                    {
                        let mut r = recent.lock().expect("lock");
                        r.push(qpn);
                        let len = r.len();
                        if len > 64 {
                            r.drain(..len - 64);
                        }
                    }
                    if rng.random_bool(0.5) {
                        let ev = qp_events[rng.random_range(0..qp_events.len())];
                        qp.raise_event(ev).expect("raise on own QP");
                    }
                    if rng.random_bool(0.3) {
                        std::thread::yield_now();
                    }
                    qp.destroy().expect("destroy");
                    let stamp = clock.fetch_add(1, Ordering::SeqCst);
                    destroyed_at.lock().expect("lock").insert(qpn, stamp);
                }
                creators_done.fetch_add(1, Ordering::SeqCst);
            });
        }
        for _ in 0..RAISERS {
            s.spawn(|| {
                let mut rng = rand::rng();
                // Bounded: stops when the creators are done (or after a safety cap).
                for _ in 0..2_000_000 {
                    if creators_done.load(Ordering::SeqCst) == CREATORS {
                        break;
                    }
                    let qpn = {
                        let r = recent.lock().expect("lock");
                        if r.is_empty() {
                            None
                        } else {
                            Some(r[rng.random_range(0..r.len())])
                        }
                    };
                    let Some(qpn) = qpn else {
                        std::thread::yield_now();
                        continue;
                    };
                    if let Some(qp) = ctx.qp_for_packet(qpn) {
                        let ev = qp_events[rng.random_range(0..qp_events.len())];
                        if qp.raise_event(ev).expect("raise") {
                            raised_ok.fetch_add(1, Ordering::Relaxed);
                        } else {
                            raised_refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
        s.spawn(|| {
            let mut rng = rand::rng();
            // Bounded by the stop flag, which the main thread sets after the creators.
            for _ in 0..10_000_000 {
                match ctx.get_async_event(Some(Duration::from_millis(5))) {
                    Ok(ev) => {
                        let qpn = ev.qp().expect("only QP events are raised").qp_num();
                        let stamp = clock.fetch_add(1, Ordering::SeqCst);
                        delivered.lock().expect("lock").push((qpn, stamp));
                        // Hold some events a while: the QP's destroy must wait for us.
                        if rng.random_bool(0.2) {
                            std::thread::sleep(Duration::from_micros(100));
                        }
                        assert!(
                            !destroyed_at.lock().expect("lock").contains_key(&qpn),
                            "destroy of QPN {qpn:#x} returned while its event was still held"
                        );
                        ev.ack();
                    }
                    Err(_) => {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                    }
                }
            }
        });
        // Wait (bounded) for the creators, then stop the consumer.
        for _ in 0..60_000 {
            if creators_done.load(Ordering::SeqCst) == CREATORS {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::SeqCst);
    });

    // No event was delivered after its QP's destroy returned.
    let destroyed_at = destroyed_at.into_inner().expect("lock");
    let delivered = delivered.into_inner().expect("lock");
    assert!(!delivered.is_empty(), "the test delivered events");
    for (qpn, stamp) in &delivered {
        let destroyed = destroyed_at
            .get(qpn)
            .unwrap_or_else(|| panic!("event for QPN {qpn:#x} that was never created"));
        assert!(
            stamp < destroyed,
            "event for QPN {qpn:#x} delivered at {stamp}, after its destroy returned at {destroyed}"
        );
    }
    // No number was handed out twice (2000 allocations are far from the 2^24 wrap).
    let created = created.into_inner().expect("lock");
    assert_eq!(created.len(), CREATORS * ITERATIONS);
    assert_eq!(created.iter().collect::<HashSet<_>>().len(), created.len());
    // Nothing leaked.
    assert_eq!(ctx.table_sizes(), (0, 0, 0), "QP/SRQ/MR tables empty");
    assert_eq!(ctx.pending_async_events(), 0);
    assert_eq!(ctx.live_objects().qps, 0);
    assert_eq!(pd.ref_count(), 1, "only the PD handle");
    assert_eq!(cq.ref_count(), 1, "only the CQ handle");
    assert_eq!(pd.children(), Default::default());
    cq.destroy().expect("cq");
    pd.destroy().expect("pd");
    assert_eq!(ctx.ref_count(), 1, "only the context handle");
    assert_eq!(ctx.live_objects(), Default::default());
    let refused = raised_refused.load(Ordering::Relaxed);
    eprintln!(
        "stress: {} events delivered, {} raised by lookups, {refused} refused, {:?}",
        delivered.len(),
        raised_ok.load(Ordering::Relaxed),
        start.elapsed()
    );
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "bounded run time"
    );
}
