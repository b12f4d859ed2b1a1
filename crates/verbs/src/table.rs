//! Resource tables: numbers the network and events can name (QPN, SRQN, memory-key index)
//! mapped to counted references, with the forward-moving number allocator.
//!
//! # The reference / unpublish protocol
//!
//! A [`Table`] maps a number to an [`Arc`] of the object. The protocol that makes lookups and
//! destroys safe against each other has four steps, and this module provides each one:
//!
//! 1. **Lookup** ([`Table::get`]) clones the `Arc` while holding the table's read lock, so a
//!    reference is only ever taken from an entry that is still published. Holders are
//!    *in-flight users*: packet processing, event dispatch, an application that has not yet
//!    acknowledged an event.
//! 2. **Unpublish** ([`Table::unpublish`]) turns the entry into a *retired* one under the
//!    write lock: from that instant no lookup can succeed, and the number is still reserved
//!    (the allocator skips it) so it cannot be handed to a new object while the old one is
//!    still referenced.
//! 3. **Wait** ([`wait_unreferenced`]) spins with bounded back-off until only the destroyer's
//!    own reference remains. No new reference can appear during the wait: the table no longer
//!    hands any out, and the other sources (queued events) are purged by the owner before it
//!    waits. The wait is bounded by the work in-flight users do while holding a reference —
//!    internal users never block while holding one — and in any case by a timeout, so a
//!    reference an application forgets to drop makes `destroy` fail with "in use" instead of
//!    hanging forever.
//! 4. **Release**: the destroyer drops the last reference ([`Arc::try_unwrap`] succeeds, so the
//!    object's `Drop` runs on the destroyer's thread, exactly once), and the object's `Drop`
//!    calls [`Table::release`] to free the number.
//!
//! # Number allocation
//!
//! Numbers are allocated from an inclusive range by a cursor that only moves forward: each
//! allocation takes the first number at or after the cursor that is neither live nor
//! retired, and the cursor then moves past it; at the end of the range it wraps to the start.
//! A number freed by a destroy is therefore not handed out again until the cursor has gone
//! around the whole range (2^24 − 16 allocations for QPNs), so a late packet or event for an
//! old QP cannot reach a new one. A search probes at most `entries + 1` numbers (pigeonhole:
//! among `entries + 1` distinct numbers one is free), so it is bounded by the table capacity.

use std::collections::HashMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::sync::{backoff, read, write, Arc, RwLock};

/// A table of objects named by a number (see the module docs for the protocol).
pub struct Table<T> {
    name: &'static str,
    inner: RwLock<Inner<T>>,
}

struct Inner<T> {
    slots: HashMap<u32, Slot<T>>,
    first: u32,
    last: u32,
    cursor: u32,
    capacity: usize,
}

enum Slot<T> {
    /// Published: lookups succeed.
    Live(Arc<T>),
    /// Unpublished but not yet released: lookups fail, the number stays reserved.
    Retired,
}

/// Why [`Table::insert_with`] or [`Table::insert_at`] did not insert.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InsertError<E> {
    /// The table already holds `capacity` entries (live or retired).
    #[error("the {table} table is full ({capacity} entries)")]
    Full {
        /// The table's name.
        table: &'static str,
        /// Its capacity.
        capacity: usize,
    },
    /// [`Table::insert_at`]: the number is already taken (live or retired).
    #[error("number {number:#x} is already in use in the {table} table")]
    InUse {
        /// The table's name.
        table: &'static str,
        /// The number asked for.
        number: u32,
    },
    /// The constructor refused.
    #[error(transparent)]
    Make(E),
}

/// [`wait_unreferenced`] gave up: other references still exist after the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{references} other reference(s) still held after the wait")]
pub struct StillReferenced {
    /// How many references beyond the expected ones were still held.
    pub references: usize,
}

impl<T> Table<T> {
    /// An empty table named `name` (for errors) that allocates numbers from `range`
    /// (inclusive) and holds at most `capacity` entries, live or retired.
    ///
    /// An empty range is treated as the single number `range.start()`.
    pub fn new(name: &'static str, range: RangeInclusive<u32>, capacity: usize) -> Table<T> {
        let first = *range.start();
        let last = (*range.end()).max(first);
        Table {
            name,
            inner: RwLock::new(Inner {
                slots: HashMap::new(),
                first,
                last,
                cursor: first,
                capacity,
            }),
        }
    }

    /// The same table with its cursor at `number` (ignored outside the range): the first
    /// allocation tries it.
    #[must_use]
    pub fn starting_at(self, number: u32) -> Table<T> {
        {
            let mut inner = write(&self.inner);
            if (inner.first..=inner.last).contains(&number) {
                inner.cursor = number;
            }
        }
        self
    }

    /// The table's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Allocates the next free number, builds the object with `make(number)` and publishes
    /// it, all under the write lock (so nobody can see the number before the object exists).
    ///
    /// Returns the number and a reference to the new object.
    pub fn insert_with<E>(
        &self,
        make: impl FnOnce(u32) -> Result<T, E>,
    ) -> Result<(u32, Arc<T>), InsertError<E>> {
        let mut inner = write(&self.inner);
        if inner.slots.len() >= inner.capacity {
            return Err(InsertError::Full {
                table: self.name,
                capacity: inner.capacity,
            });
        }
        let Some(number) = inner.find_free() else {
            // Unreachable while capacity <= range size; reported as full otherwise.
            return Err(InsertError::Full {
                table: self.name,
                capacity: inner.capacity,
            });
        };
        let obj = Arc::new(make(number).map_err(InsertError::Make)?);
        inner.slots.insert(number, Slot::Live(obj.clone()));
        inner.cursor = inner.after(number);
        Ok((number, obj))
    }

    /// Like [`Table::insert_with`] but at a fixed `number` (reserved numbers such as the GSI
    /// QP's 1, which may lie outside the allocation range). The cursor does not move.
    pub fn insert_at<E>(
        &self,
        number: u32,
        make: impl FnOnce(u32) -> Result<T, E>,
    ) -> Result<Arc<T>, InsertError<E>> {
        let mut inner = write(&self.inner);
        if inner.slots.contains_key(&number) {
            return Err(InsertError::InUse {
                table: self.name,
                number,
            });
        }
        if inner.slots.len() >= inner.capacity {
            return Err(InsertError::Full {
                table: self.name,
                capacity: inner.capacity,
            });
        }
        let obj = Arc::new(make(number).map_err(InsertError::Make)?);
        inner.slots.insert(number, Slot::Live(obj.clone()));
        Ok(obj)
    }

    /// Step 1: a counted reference to the object published under `number`, taken under the
    /// read lock; `None` if the number is unknown or retired.
    pub fn get(&self, number: u32) -> Option<Arc<T>> {
        match read(&self.inner).slots.get(&number) {
            Some(Slot::Live(obj)) => Some(obj.clone()),
            _ => None,
        }
    }

    /// Step 2: unpublishes `number`. Returns the table's reference (for the destroyer to
    /// drop), or `None` if the number was not live. The number stays reserved until
    /// [`Table::release`].
    pub fn unpublish(&self, number: u32) -> Option<Arc<T>> {
        let mut inner = write(&self.inner);
        match inner.slots.get_mut(&number) {
            Some(slot @ Slot::Live(_)) => match std::mem::replace(slot, Slot::Retired) {
                Slot::Live(obj) => Some(obj),
                Slot::Retired => None,
            },
            _ => None,
        }
    }

    /// Step 4: frees a retired `number` for future allocation. Returns `false` (and changes
    /// nothing) if the number is live or unknown: a live entry must be unpublished first.
    pub fn release(&self, number: u32) -> bool {
        let mut inner = write(&self.inner);
        if matches!(inner.slots.get(&number), Some(Slot::Retired)) {
            inner.slots.remove(&number);
            true
        } else {
            false
        }
    }

    /// Number of published entries.
    pub fn live_len(&self) -> usize {
        read(&self.inner)
            .slots
            .values()
            .filter(|s| matches!(s, Slot::Live(_)))
            .count()
    }

    /// Number of entries, live or retired (numbers that are reserved).
    pub fn len(&self) -> usize {
        read(&self.inner).slots.len()
    }

    /// Whether the table holds no entry at all.
    pub fn is_empty(&self) -> bool {
        read(&self.inner).slots.is_empty()
    }

    /// The published numbers, ascending.
    pub fn live_numbers(&self) -> Vec<u32> {
        let inner = read(&self.inner);
        let mut v: Vec<u32> = inner
            .slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Live(_)))
            .map(|(n, _)| *n)
            .collect();
        v.sort_unstable();
        v
    }

    /// The number the next allocation starts searching at.
    pub fn cursor(&self) -> u32 {
        read(&self.inner).cursor
    }

    /// Test hook: moves the allocation cursor (clamped into the range). Lets tests reach the
    /// wrap-around at the end of the 24-bit space without 16 million allocations.
    #[doc(hidden)]
    pub fn set_cursor(&self, number: u32) {
        let mut inner = write(&self.inner);
        inner.cursor = number.clamp(inner.first, inner.last);
    }
}

impl<T> Inner<T> {
    /// The number after `n` in the allocation range, wrapping to the start.
    fn after(&self, n: u32) -> u32 {
        if n >= self.last || n < self.first {
            self.first
        } else {
            n + 1
        }
    }

    /// The first number at or after the cursor that is not in the table.
    fn find_free(&self) -> Option<u32> {
        let mut candidate = self.cursor.clamp(self.first, self.last);
        let span = u64::from(self.last - self.first) + 1;
        // Bounded: among `slots.len() + 1` distinct numbers one is free (pigeonhole), and the
        // range never has fewer numbers than that when the capacity check passed.
        let probes = (self.slots.len() as u64 + 1).min(span);
        for _ in 0..probes {
            if !self.slots.contains_key(&candidate) {
                return Some(candidate);
            }
            candidate = self.after(candidate);
        }
        None
    }
}

impl<T> fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = read(&self.inner);
        f.debug_struct("Table")
            .field("name", &self.name)
            .field("entries", &inner.slots.len())
            .field("cursor", &inner.cursor)
            .finish()
    }
}

/// Step 3: waits until `obj` has at most `expected` strong references (normally 1: the
/// destroyer's own), backing off between checks, for at most `timeout`.
///
/// Callers must have made sure no new reference can be created (unpublished the number,
/// purged queued events), otherwise the count could rise again after this returns.
/// Under `loom` the timeout is replaced by a bound on the number of checks.
pub fn wait_unreferenced<T>(
    obj: &Arc<T>,
    expected: usize,
    timeout: Duration,
) -> Result<(), StillReferenced> {
    #[cfg(not(loom))]
    let deadline = std::time::Instant::now().checked_add(timeout);
    #[cfg(loom)]
    let _ = timeout;
    let mut attempt: u32 = 0;
    loop {
        let count = Arc::strong_count(obj);
        if count <= expected {
            return Ok(());
        }
        #[cfg(not(loom))]
        let expired = deadline.is_some_and(|d| std::time::Instant::now() >= d);
        #[cfg(loom)]
        let expired = attempt >= 10_000;
        if expired {
            return Err(StillReferenced {
                references: count - expected,
            });
        }
        backoff(attempt);
        attempt = attempt.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_moves_forward_and_skips_used() {
        let t: Table<u32> = Table::new("test", 16..=20, 10);
        let (a, _) = t.insert_with(Ok::<u32, ()>).expect("insert");
        let (b, _) = t.insert_with(Ok::<u32, ()>).expect("insert");
        assert_eq!((a, b), (16, 17));
        // Free 16; the next allocation must not return it (the cursor is at 18).
        let r = t.unpublish(16).expect("live");
        drop(r);
        assert!(t.release(16));
        let (c, _) = t.insert_with(Ok::<u32, ()>).expect("insert");
        assert_eq!(c, 18);
        let (d, _) = t.insert_with(Ok::<u32, ()>).expect("insert");
        let (e, _) = t.insert_with(Ok::<u32, ()>).expect("insert");
        assert_eq!((d, e), (19, 20));
        // Wrap: 16 is free again, 17 is in use.
        let (f, _) = t.insert_with(Ok::<u32, ()>).expect("insert");
        assert_eq!(f, 16);
        // The range is full now (16..=20 all used).
        assert!(matches!(
            t.insert_with(Ok::<u32, ()>),
            Err(InsertError::Full { .. })
        ));
    }

    #[test]
    fn a_table_can_start_where_another_stopped() {
        let t: Table<u32> = Table::new("test", 16..=20, 10).starting_at(19);
        assert_eq!(t.cursor(), 19);
        let numbers: Vec<u32> = (0..3)
            .map(|_| t.insert_with(Ok::<u32, ()>).expect("insert").0)
            .collect();
        assert_eq!(numbers, [19, 20, 16]);
        assert_eq!(t.cursor(), 17);
        // Outside the range: ignored.
        let u: Table<u32> = Table::new("test", 16..=20, 10).starting_at(21);
        assert_eq!(u.cursor(), 16);
    }

    #[test]
    fn retired_numbers_stay_reserved() {
        let t: Table<u32> = Table::new("test", 1..=3, 10);
        for _ in 0..3 {
            t.insert_with(Ok::<u32, ()>).expect("insert");
        }
        let held = t.unpublish(2).expect("live");
        assert!(t.get(2).is_none(), "no lookup after unpublish");
        assert!(!t.release(1), "a live entry cannot be released");
        assert!(matches!(
            t.insert_with(Ok::<u32, ()>),
            Err(InsertError::Full { .. })
        ));
        drop(held);
        assert!(t.release(2));
        assert!(!t.release(2), "released only once");
        let (n, _) = t.insert_with(Ok::<u32, ()>).expect("insert");
        assert_eq!(n, 2);
    }

    #[test]
    fn capacity_and_constructor_errors() {
        let t: Table<u32> = Table::new("test", 0..=100, 2);
        t.insert_with(Ok::<u32, ()>).expect("insert");
        assert_eq!(
            t.insert_with(|_| Err::<u32, _>("no")).map(|_| ()),
            Err(InsertError::Make("no"))
        );
        assert_eq!(t.len(), 1, "a failed constructor leaves no entry");
        t.insert_with(Ok::<u32, ()>).expect("insert");
        assert!(matches!(
            t.insert_with(Ok::<u32, ()>),
            Err(InsertError::Full { capacity: 2, .. })
        ));
        assert!(matches!(
            t.insert_at(0, Ok::<u32, ()>),
            Err(InsertError::InUse { number: 0, .. })
        ));
    }

    #[test]
    fn wait_times_out_then_succeeds() {
        let a = Arc::new(5u8);
        let b = a.clone();
        assert_eq!(
            wait_unreferenced(&a, 1, Duration::from_millis(5)),
            Err(StillReferenced { references: 1 })
        );
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(b);
        });
        assert_eq!(wait_unreferenced(&a, 1, Duration::from_secs(10)), Ok(()));
        h.join().expect("join");
    }

    mod property {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        proptest! {
            #![proptest_config(ProptestConfig {
                cases: 256,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            /// Random inserts and destroys on a small range: each allocation is the first
            /// number after the previous allocation (cyclically) that is neither live nor
            /// retired, so numbers in use are skipped and a just-freed number only comes
            /// back once the cursor has gone around.
            #[test]
            fn allocation_is_first_free_after_previous(
                ops in prop::collection::vec((any::<bool>(), any::<u8>()), 1..200)
            ) {
                const FIRST: u32 = 10;
                const LAST: u32 = 25;
                let t: Table<u32> = Table::new("prop", FIRST..=LAST, 64);
                let mut held: Vec<(u32, Arc<u32>)> = Vec::new();
                let mut reserved: BTreeSet<u32> = BTreeSet::new();
                let mut prev: Option<u32> = None;
                let next = |n: u32| if n >= LAST { FIRST } else { n + 1 };
                for (insert, pick) in ops {
                    if insert {
                        match t.insert_with(Ok::<u32, ()>) {
                            Ok((n, obj)) => {
                                prop_assert!((FIRST..=LAST).contains(&n));
                                prop_assert!(!reserved.contains(&n), "{} is in use", n);
                                let mut probe = prev.map_or(FIRST, next);
                                for _ in 0..=(LAST - FIRST) {
                                    if probe == n {
                                        break;
                                    }
                                    prop_assert!(reserved.contains(&probe), "skipped free {}", probe);
                                    probe = next(probe);
                                }
                                prop_assert_eq!(probe, n);
                                reserved.insert(n);
                                held.push((n, obj));
                                prev = Some(n);
                            }
                            Err(InsertError::Full { .. }) => {
                                prop_assert_eq!(reserved.len() as u32, LAST - FIRST + 1);
                            }
                            Err(e) => prop_assert!(false, "unexpected {:?}", e),
                        }
                    } else if !held.is_empty() {
                        let (n, obj) = held.remove(usize::from(pick) % held.len());
                        let from_table = t.unpublish(n).expect("live");
                        prop_assert!(t.get(n).is_none());
                        drop(from_table);
                        wait_unreferenced(&obj, 1, Duration::ZERO).expect("sole owner");
                        drop(obj);
                        prop_assert!(t.release(n));
                        reserved.remove(&n);
                    }
                    prop_assert_eq!(t.len(), reserved.len());
                }
            }
        }
    }
}
