//! The synchronisation primitives of the crate, switchable to `loom`'s model-checked versions.
//!
//! Every `Arc`, `Mutex`, `RwLock` and atomic that takes part in the object lifetime protocol
//! (see the crate docs, "Lifetime rules") comes from here. With `RUSTFLAGS="--cfg loom"` they
//! are `loom`'s instrumented types, so `tests/loom_table.rs` can explore every interleaving
//! of a lookup racing a destroy; in a normal build they are the `std` types.
//!
//! Lock poisoning is ignored on purpose ([`lock`], [`read`], [`write`]): every critical
//! section in this crate leaves its data consistent before it can panic (no panics happen
//! half-way through an update), so a poisoned lock still guards valid data, and refusing to
//! destroy an object because some unrelated thread panicked would only leak it.

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

use std::sync::PoisonError;

/// Locks `m`, recovering the guard if a panicking thread poisoned it (see the module docs).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `l`, ignoring poisoning (see the module docs).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `l`, ignoring poisoning (see the module docs).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// One step of a bounded back-off while waiting for other threads to drop references.
///
/// `attempt` counts from 0. The first attempts only yield (the references we wait for are
/// normally held for microseconds), later ones sleep 10 µs, 20 µs, … capped at 1 ms. Under
/// `loom` it is a plain `yield_now`, which tells the model checker that this thread spins.
pub(crate) fn backoff(attempt: u32) {
    #[cfg(loom)]
    {
        let _ = attempt;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        const YIELDS: u32 = 16;
        if attempt < YIELDS {
            std::thread::yield_now();
        } else {
            let micros = u64::from(attempt - YIELDS + 1)
                .saturating_mul(10)
                .min(1_000);
            std::thread::sleep(std::time::Duration::from_micros(micros));
        }
    }
}
