//! Handle objects: the QP, CQ, SRQ and AH handed to C live at the start of a `#[repr(C)]`
//! container, so that a data-path call (`ibv_post_send`, `ibv_poll_cq`, …) recovers the
//! uroce object from the pointer the program passes, without a lock or a lookup.
//!
//! A container is the C structure (its address is the handle), then a magic word that is
//! [`Kind::MAGIC`] exactly while the object is live, then a count of the calls inside it,
//! then the uroce object (the body). A data-path call [`enter`](Handle::enter)s: the pointer
//! must be non-NULL, aligned and its magic live; the call then counts itself in and checks
//! the magic again (both sequentially consistent, so that it either sees the destroy's
//! clear or the destroy sees its count). Destroy ([`retire`](Handle::retire)) clears the
//! magic, waits until no call is inside (a call holds the container only while it clones
//! the object's counted reference, for one `ibv_wr_*` call on a QP's builder, or for a
//! `ibv_start_poll` … `ibv_end_poll` session) and only then takes the body out.
//!
//! Containers are never returned to the allocator: a destroyed container goes to a pool of
//! its kind and is reused by the next create of that kind (type-stable memory). A stale
//! handle therefore always points to memory of the right type: while its container is
//! pooled the magic is dead and the call is refused (`EINVAL`, NULL); once it is reused
//! the stale handle names the new object — the application's bug, exactly as with
//! rdma-core, where the memory would have been freed, but never a corruption of uroce's
//! state. The pool holds at most the peak number of live objects of each kind.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The magic word of a container whose object was destroyed (or not created yet).
const DEAD: u64 = 0;

/// One kind of handle object.
pub(crate) trait Kind: Sized + 'static {
    /// The C structure at the start of the container.
    type C;
    /// The uroce object and per-object state behind it.
    type Body;
    /// The live magic word (distinct per kind, never [`DEAD`]).
    const MAGIC: u64;
    /// The pool of destroyed containers of this kind (addresses).
    fn pool() -> &'static Mutex<Vec<usize>>;
}

/// A container: the C structure first, then uroce's part.
#[repr(C)]
pub(crate) struct Handle<K: Kind> {
    /// The C structure handed out (its address is the handle).
    pub(crate) c: K::C,
    magic: AtomicU64,
    users: AtomicU32,
    body: UnsafeCell<Option<K::Body>>,
}

/// Why [`Handle::retire`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetireError {
    /// The handle is not live.
    NotLive,
    /// Calls stayed inside the container longer than [`RETIRE_WAIT`] (an `ibv_start_poll`
    /// without `ibv_end_poll`); the object is live again.
    InUse,
}

/// How long a destroy waits for the calls inside a container to leave.
const RETIRE_WAIT: Duration = Duration::from_secs(5);

impl<K: Kind> Handle<K> {
    /// A live container holding `c` and `body` (a pooled one if there is one).
    pub(crate) fn create(c: K::C, body: K::Body) -> NonNull<Handle<K>> {
        let pooled = K::pool()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let h = match pooled.and_then(|a| NonNull::new(a as *mut Handle<K>)) {
            Some(h) => {
                // SAFETY: a pooled address is a container of this kind that is never
                // freed; its magic is dead and its body empty, so no call uses `c` or the
                // body (a stale caller only touches the atomics, and counts itself out
                // when it sees the dead magic). This thread popped it: no other create
                // writes it.
                unsafe {
                    std::ptr::write(&raw mut (*h.as_ptr()).c, c);
                    *(*h.as_ptr()).body.get() = Some(body);
                }
                h
            }
            None => NonNull::from(Box::leak(Box::new(Handle::<K> {
                c,
                magic: AtomicU64::new(DEAD),
                users: AtomicU32::new(0),
                body: UnsafeCell::new(Some(body)),
            }))),
        };
        // SAFETY: `h` is a container of this kind (never freed).
        unsafe { h.as_ref() }
            .magic
            .store(K::MAGIC, Ordering::SeqCst);
        h
    }

    /// The container of the handle `p` if it is live, counted in until the guard drops.
    /// `None` for NULL, a misaligned pointer or a dead magic.
    ///
    /// A pointer that uroce never handed out is read at the magic's offset: the C contract
    /// (a handle is one the library returned) makes that the caller's responsibility.
    pub(crate) fn enter(p: *const K::C) -> Option<Guard<K>> {
        let h = p as *const Handle<K>;
        if h.is_null() || !h.is_aligned() {
            return None;
        }
        // SAFETY: by the C contract `p` is a handle uroce returned for this kind: a
        // container that is never freed (type-stable), so its atomics may be read.
        let hr = unsafe { &*h };
        if hr.magic.load(Ordering::Acquire) != K::MAGIC {
            return None;
        }
        hr.users.fetch_add(1, Ordering::SeqCst);
        if hr.magic.load(Ordering::SeqCst) != K::MAGIC {
            hr.users.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Guard {
            h: NonNull::from(hr),
        })
    }

    /// Destroy's first half: clears the magic (new calls are refused), waits for the calls
    /// inside to leave, and takes the body out. Hand it back with [`Handle::revive`] if the
    /// destroy fails, else recycle the container with [`Handle::recycle`].
    ///
    /// # Safety
    /// `h` is a container from [`Handle::create`] that this thread has unpublished from the
    /// registry (no other control-path call retires or reads its body).
    pub(crate) unsafe fn retire(h: NonNull<Handle<K>>) -> Result<K::Body, RetireError> {
        // SAFETY: caller guarantee: a container of this kind (never freed).
        let hr = unsafe { h.as_ref() };
        if hr
            .magic
            .compare_exchange(K::MAGIC, DEAD, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(RetireError::NotLive);
        }
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        while hr.users.load(Ordering::SeqCst) != 0 {
            if start.elapsed() > RETIRE_WAIT {
                hr.magic.store(K::MAGIC, Ordering::SeqCst);
                return Err(RetireError::InUse);
            }
            spins = spins.saturating_add(1);
            if spins < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        // SAFETY: the magic is dead and no call is inside: nothing else reads the body
        // (callers count themselves in before reading it and out after).
        unsafe { (*hr.body.get()).take() }.ok_or(RetireError::NotLive)
    }

    /// Undoes [`Handle::retire`] after a failed destroy: the object is live again.
    ///
    /// # Safety
    /// `h` was retired by this thread and neither revived nor recycled since.
    pub(crate) unsafe fn revive(h: NonNull<Handle<K>>, body: K::Body) {
        // SAFETY: caller guarantee: retired, so the magic is dead and nothing reads the
        // body.
        let hr = unsafe { h.as_ref() };
        // SAFETY: as above.
        unsafe { *hr.body.get() = Some(body) };
        hr.magic.store(K::MAGIC, Ordering::SeqCst);
    }

    /// Returns a retired container to its pool for reuse.
    ///
    /// # Safety
    /// `h` was retired by this thread and neither revived nor recycled since.
    pub(crate) unsafe fn recycle(h: NonNull<Handle<K>>) {
        K::pool()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(h.as_ptr() as usize);
    }

    /// The body of a live container.
    ///
    /// # Safety
    /// The container is live and stays so while the reference is used: it is registered
    /// and the registry lock is held (destroy unpublishes before it retires), or the
    /// caller holds a [`Guard`] on it.
    pub(crate) unsafe fn body_of<'a>(h: NonNull<Handle<K>>) -> Option<&'a K::Body> {
        // SAFETY: caller guarantee: live, so the body is only read (never taken) meanwhile.
        unsafe { (*h.as_ref().body.get()).as_ref() }
    }

    /// The body of the live container of handle `p` without counting in (for the
    /// accessors of a poll session, which already holds a count). `None` for NULL, a
    /// misaligned pointer or a dead magic.
    ///
    /// # Safety
    /// The caller holds a count on the container (a kept [`Guard`]) while it uses the
    /// reference.
    pub(crate) unsafe fn peek<'a>(p: *const K::C) -> Option<&'a K::Body> {
        let h = p as *const Handle<K>;
        if h.is_null() || !h.is_aligned() {
            return None;
        }
        // SAFETY: C contract: a handle uroce returned, type-stable memory.
        let hr = unsafe { &*h };
        if hr.magic.load(Ordering::Acquire) != K::MAGIC {
            return None;
        }
        // SAFETY: caller guarantee: a count is held, so the body stays in place.
        unsafe { (*hr.body.get()).as_ref() }
    }

    /// The C structure's address.
    pub(crate) fn c_ptr(h: NonNull<Handle<K>>) -> *mut K::C {
        // SAFETY: taking a field address reads nothing.
        unsafe { &raw mut (*h.as_ptr()).c }
    }
}

/// A call counted into a live container (it stays live, its body in place, until drop).
pub(crate) struct Guard<K: Kind> {
    h: NonNull<Handle<K>>,
}

// SAFETY: a guard is a count on type-stable memory; dropping it on another thread only
// decrements that count.
unsafe impl<K: Kind> Send for Guard<K> {}

impl<K: Kind> Guard<K> {
    /// The uroce object.
    pub(crate) fn body(&self) -> Option<&K::Body> {
        // SAFETY: a guard counts a call in, so the container stays live (its body in
        // place) until the guard drops.
        unsafe { Handle::body_of(self.h) }
    }

    /// The container.
    pub(crate) fn handle(&self) -> NonNull<Handle<K>> {
        self.h
    }

    /// Keeps the call counted in past this guard (an `ibv_start_poll` session); undone by
    /// [`Guard::resume`].
    pub(crate) fn keep(self) {
        std::mem::forget(self);
    }

    /// The guard of a call counted in by [`Guard::keep`].
    ///
    /// # Safety
    /// A guard of `h` was kept and not resumed since.
    pub(crate) unsafe fn resume(h: NonNull<Handle<K>>) -> Guard<K> {
        Guard { h }
    }
}

impl<K: Kind> Drop for Guard<K> {
    fn drop(&mut self) {
        // SAFETY: the container is never freed.
        unsafe { self.h.as_ref() }
            .users
            .fetch_sub(1, Ordering::SeqCst);
    }
}

/// A registered container, owned by the registry entry (sendable between threads: the
/// container is never freed and its body is only reached under the rules above).
pub(crate) struct HandlePtr<K: Kind>(pub(crate) NonNull<Handle<K>>);

// SAFETY: see the type's documentation: the pointer is to type-stable memory and every
// access follows the magic/count protocol or the registry lock.
unsafe impl<K: Kind> Send for HandlePtr<K> {}

impl<K: Kind> HandlePtr<K> {
    /// The C structure's address.
    pub(crate) fn c_ptr(&self) -> *mut K::C {
        Handle::c_ptr(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TestKind;
    static POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    impl Kind for TestKind {
        type C = [u64; 2];
        type Body = String;
        const MAGIC: u64 = 0x7465_7374;
        fn pool() -> &'static Mutex<Vec<usize>> {
            &POOL
        }
    }

    /// A second kind with its own pool, so that the tests running in parallel never take
    /// each other's pooled containers.
    struct StressKind;
    static STRESS_POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    impl Kind for StressKind {
        type C = [u64; 2];
        type Body = String;
        const MAGIC: u64 = 0x7374_7265_7373;
        fn pool() -> &'static Mutex<Vec<usize>> {
            &STRESS_POOL
        }
    }

    #[test]
    fn retired_handle_is_refused_and_recycled() {
        let h = Handle::<TestKind>::create([1, 2], "first".into());
        let p = Handle::c_ptr(h) as *const [u64; 2];
        {
            let g = Handle::<TestKind>::enter(p).expect("live");
            assert_eq!(g.body().map(String::as_str), Some("first"));
        }
        // SAFETY: created above, not registered anywhere else.
        let body = unsafe { Handle::retire(h) }.expect("retire");
        assert_eq!(body, "first");
        assert!(
            Handle::<TestKind>::enter(p).is_none(),
            "dead handle entered"
        );
        // SAFETY: retired above.
        assert_eq!(unsafe { Handle::retire(h) }, Err(RetireError::NotLive));
        // SAFETY: retired above, not revived.
        unsafe { Handle::recycle(h) };
        let h2 = Handle::<TestKind>::create([3, 4], "second".into());
        assert_eq!(h2, h, "the pooled container is reused");
        let g = Handle::<TestKind>::enter(p).expect("live again");
        assert_eq!(g.body().map(String::as_str), Some("second"));
        assert!(Handle::<TestKind>::enter(std::ptr::null()).is_none());
        assert!(Handle::<TestKind>::enter((p as usize + 1) as *const _).is_none());
    }

    #[test]
    fn retire_under_concurrent_calls_never_exposes_a_taken_body() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Arc;
        let h = Handle::<StressKind>::create([5, 5], "busy".into());
        let p = Handle::c_ptr(h) as usize;
        let entered = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let entered = Arc::clone(&entered);
                std::thread::spawn(move || {
                    let mut refused_after_dead = 0u32;
                    for _ in 0..200_000 {
                        match Handle::<StressKind>::enter(p as *const [u64; 2]) {
                            Some(g) => {
                                // A counted-in call always finds the body in place.
                                assert_eq!(g.body().map(String::as_str), Some("busy"));
                                entered.fetch_add(1, Ordering::Relaxed);
                            }
                            None => refused_after_dead += 1,
                        }
                    }
                    refused_after_dead
                })
            })
            .collect();
        // Let the callers get going, then retire under them.
        let start = std::time::Instant::now();
        while entered.load(Ordering::Relaxed) < 1000 && start.elapsed() < RETIRE_WAIT {
            std::thread::yield_now();
        }
        // SAFETY: created above, not registered anywhere else.
        let body = unsafe { Handle::retire(h) }.expect("retire");
        assert_eq!(body, "busy");
        let refused: u32 = threads
            .into_iter()
            .map(|t| t.join().expect("a caller saw a taken body"))
            .sum();
        assert!(entered.load(Ordering::Relaxed) >= 1000);
        assert!(refused > 0, "no call was refused after the retire");
        assert!(Handle::<StressKind>::enter(p as *const [u64; 2]).is_none());
        // SAFETY: retired above, not revived.
        unsafe { Handle::recycle(h) };
    }

    #[test]
    fn retire_waits_for_a_guard_then_gives_up() {
        let h = Handle::<TestKind>::create([0, 0], "held".into());
        let p = Handle::c_ptr(h) as *const [u64; 2];
        let g = Handle::<TestKind>::enter(p).expect("live");
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(g);
        });
        // SAFETY: created above, not registered anywhere else.
        let body = unsafe { Handle::retire(h) }.expect("retire after the guard left");
        assert_eq!(body, "held");
        t.join().expect("join");
        // SAFETY: retired above.
        unsafe { Handle::revive(h, body) };
        assert!(Handle::<TestKind>::enter(p).is_some(), "revived");
    }
}
