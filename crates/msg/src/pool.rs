//! The send-buffer pool: registered buffers filled in place and posted without a copy.
//!
//! Every buffer is its own memory region, so filling one (an exclusive `&mut [u8]`, which
//! revokes uroce's access to that region only) never disturbs the others in flight. A
//! buffer is always in exactly one place: the pool's free list, a [`SendBuf`] the
//! application holds, or an endpoint's in-flight table (moved there by the post, moved
//! back to the free list by its send completion, whatever its status).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

use uroce_verbs::mem::ExclusiveGuard;
use uroce_verbs::{AccessFlags, MemBlock, Mr, Pd};

use crate::error::MsgError;
use crate::stats;

/// How long taking exclusive access to an idle buffer may wait (nothing else can hold its
/// gate, so this only guards against a bug turning into a hang).
pub(crate) const GATE_TIMEOUT: Duration = Duration::from_secs(1);

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One registered send buffer. Not public: the application sees it only inside a
/// [`SendBuf`].
pub(crate) struct SendSlot {
    pub(crate) mr: Mr,
    pub(crate) index: u32,
}

/// An endpoint posting a pool's buffers: it hands them back when it processes its
/// completions.
pub(crate) trait PoolUser: Send + Sync {
    /// Process completions now (busy polling).
    fn reclaim(&self);
    /// Someone waits for a buffer: have completions processed without polling (`true`),
    /// or no longer (`false`).
    fn watch(&self, on: bool);
}

pub(crate) struct PoolShared {
    pub(crate) id: u64,
    pub(crate) pd_id: u32,
    pub(crate) buf_size: usize,
    total: usize,
    free: Mutex<Vec<SendSlot>>,
    cond: Condvar,
    wakers: Mutex<Vec<Waker>>,
    in_flight: AtomicUsize,
    users: Mutex<Vec<Weak<dyn PoolUser>>>,
}

/// A pool of registered send buffers of one size, on one protection domain. Cheap to
/// clone (a shared handle); endpoints created with it post its buffers.
#[derive(Clone)]
pub struct SendPool {
    pub(crate) shared: Arc<PoolShared>,
}

impl std::fmt::Debug for SendPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendPool")
            .field("id", &self.shared.id)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Where a pool's buffers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Buffers the pool was created with.
    pub total: usize,
    /// On the free list.
    pub free: usize,
    /// Posted and not yet completed.
    pub in_flight: usize,
    /// Held by the application (`total - free - in_flight`).
    pub held: usize,
}

impl SendPool {
    /// Registers `count` buffers of `buf_size` bytes on `pd`.
    ///
    /// # Errors
    /// [`MsgError::Verbs`] if memory cannot be allocated or registered.
    pub fn new(pd: &Pd, count: usize, buf_size: usize) -> Result<SendPool, MsgError> {
        let mut free = Vec::with_capacity(count);
        for index in 0..count {
            let block = MemBlock::new(buf_size).map_err(MsgError::verbs)?;
            // Local reads only: the engine gathers the payload; no peer may touch it.
            let mr = pd
                .reg_mr(block, AccessFlags::empty())
                .map_err(MsgError::verbs)?;
            let index =
                u32::try_from(index).map_err(|_| MsgError::Verbs("pool too large".into()))?;
            free.push(SendSlot { mr, index });
        }
        // Hand out low indices first.
        free.reverse();
        Ok(SendPool {
            shared: Arc::new(PoolShared {
                id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
                pd_id: pd.id(),
                buf_size,
                total: count,
                free: Mutex::new(free),
                cond: Condvar::new(),
                wakers: Mutex::new(Vec::new()),
                in_flight: AtomicUsize::new(0),
                users: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The size of every buffer.
    pub fn buf_size(&self) -> usize {
        self.shared.buf_size
    }

    /// The number of buffers.
    pub fn capacity(&self) -> usize {
        self.shared.total
    }

    /// Where the buffers are now.
    pub fn stats(&self) -> PoolStats {
        let free = lock(&self.shared.free).len();
        let in_flight = self.shared.in_flight.load(Ordering::Acquire);
        PoolStats {
            total: self.shared.total,
            free,
            in_flight,
            held: self.shared.total.saturating_sub(free + in_flight),
        }
    }

    /// True when every buffer is on the free list exactly once (none leaked, none
    /// duplicated).
    pub fn is_complete(&self) -> bool {
        let free = lock(&self.shared.free);
        let mut seen = vec![false; self.shared.total];
        for s in free.iter() {
            match seen.get_mut(s.index as usize) {
                Some(b) if !*b => *b = true,
                _ => return false,
            }
        }
        seen.iter().all(|b| *b)
    }

    /// A free buffer (length 0), or `None` if every buffer is held or in flight.
    pub fn try_alloc(&self) -> Option<SendBuf> {
        let slot = lock(&self.shared.free).pop()?;
        Some(self.wrap(slot))
    }

    /// `n` free buffers at once, or none.
    pub(crate) fn try_alloc_n(&self, n: usize) -> Option<Vec<SendBuf>> {
        let mut free = lock(&self.shared.free);
        if free.len() < n {
            return None;
        }
        let at = free.len() - n;
        let slots: Vec<SendSlot> = free.drain(at..).collect();
        drop(free);
        Some(slots.into_iter().map(|s| self.wrap(s)).collect())
    }

    /// A free buffer, waiting up to `timeout` (`None`: without limit) for one to come
    /// back from a send completion.
    ///
    /// # Errors
    /// [`MsgError::Timeout`].
    pub fn alloc(&self, timeout: Option<Duration>) -> Result<SendBuf, MsgError> {
        if let Some(b) = self.try_alloc() {
            return Ok(b);
        }
        self.reclaim();
        let deadline = timeout.map(|t| Instant::now() + t);
        self.watch(true);
        let r = self.alloc_wait(deadline);
        self.watch(false);
        r
    }

    fn alloc_wait(&self, deadline: Option<Instant>) -> Result<SendBuf, MsgError> {
        let mut free = lock(&self.shared.free);
        loop {
            if let Some(slot) = free.pop() {
                drop(free);
                return Ok(self.wrap(slot));
            }
            let wait = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(MsgError::Timeout);
                    }
                    (d - now).min(Duration::from_millis(50))
                }
                None => Duration::from_millis(50),
            };
            free = self
                .shared
                .cond
                .wait_timeout(free, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A future that resolves to a free buffer.
    pub fn alloc_async(&self) -> AllocFuture<'_> {
        AllocFuture { pool: self }
    }

    /// Gives a buffer back without sending it (dropping it does the same).
    pub fn give_back(&self, buf: SendBuf) {
        drop(buf);
    }

    fn wrap(&self, slot: SendSlot) -> SendBuf {
        SendBuf {
            slot: Some(slot),
            len: 0,
            pool: self.clone(),
        }
    }

    fn users(&self) -> Vec<Arc<dyn PoolUser>> {
        let mut users = lock(&self.shared.users);
        users.retain(|w| w.strong_count() > 0);
        users.iter().filter_map(Weak::upgrade).collect()
    }

    /// Has every endpoint process its completions (buffers come back).
    fn reclaim(&self) {
        for u in self.users() {
            u.reclaim();
        }
    }

    fn watch(&self, on: bool) {
        for u in self.users() {
            u.watch(on);
        }
    }

    pub(crate) fn register_user(&self, user: Weak<dyn PoolUser>) {
        lock(&self.shared.users).push(user);
    }

    /// A slot comes home (from a dropped [`SendBuf`] or a send completion).
    pub(crate) fn put(&self, slot: SendSlot) {
        lock(&self.shared.free).push(slot);
        self.shared.cond.notify_all();
        let wakers = std::mem::take(&mut *lock(&self.shared.wakers));
        for w in wakers {
            w.wake();
        }
    }

    pub(crate) fn mark_in_flight(&self, n: usize) {
        self.shared.in_flight.fetch_add(n, Ordering::AcqRel);
    }

    pub(crate) fn unmark_in_flight(&self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn register_waker(&self, w: &Waker) {
        lock(&self.shared.wakers).push(w.clone());
    }
}

/// The future of [`SendPool::alloc_async`].
#[derive(Debug)]
pub struct AllocFuture<'a> {
    pool: &'a SendPool,
}

impl std::future::Future for AllocFuture<'_> {
    type Output = SendBuf;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<SendBuf> {
        if let Some(b) = self.pool.try_alloc() {
            return std::task::Poll::Ready(b);
        }
        self.pool.reclaim();
        self.pool.register_waker(cx.waker());
        // Have the endpoints' notifier threads process completions while we wait.
        for u in self.pool.users() {
            u.watch(true);
            u.watch(false);
        }
        // A buffer that came back between the check and the registration.
        match self.pool.try_alloc() {
            Some(b) => std::task::Poll::Ready(b),
            None => std::task::Poll::Pending,
        }
    }
}

/// A send buffer held by the application: fill it in place ([`SendBuf::bytes_mut`],
/// [`SendBuf::set_len`]) and move it into [`crate::Endpoint::try_send`] or
/// [`crate::Endpoint::send`]. It is a different type from a received buffer
/// ([`crate::RecvBuf`]), with no conversion between them; posting moves it, so it cannot
/// be touched or posted again until the pool hands it out anew. Dropping it returns it
/// to the pool.
pub struct SendBuf {
    pub(crate) slot: Option<SendSlot>,
    len: usize,
    pub(crate) pool: SendPool,
}

impl std::fmt::Debug for SendBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBuf")
            .field("index", &self.slot.as_ref().map(|s| s.index))
            .field("len", &self.len)
            .finish()
    }
}

impl SendBuf {
    /// The buffer's capacity (the pool's buffer size).
    pub fn capacity(&self) -> usize {
        self.pool.shared.buf_size
    }

    /// The message length that will be sent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length message.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets the message length; clamped to the capacity.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// The whole registered buffer as an ordinary `&mut [u8]`, written in place (no
    /// copy); the guard borrows the buffer, so it cannot be posted while the guard lives.
    ///
    /// # Errors
    /// [`MsgError::Verbs`] if the region's gate cannot be taken (cannot happen for an
    /// idle buffer).
    pub fn bytes_mut(&mut self) -> Result<SendBytes<'_>, MsgError> {
        let slot = self.slot.as_ref().ok_or(MsgError::Closed)?;
        let guard = slot
            .mr
            .block()
            .exclusive(GATE_TIMEOUT)
            .map_err(MsgError::verbs)?;
        Ok(SendBytes { guard })
    }

    /// Copies `data` in and sets the length (a convenience that costs one payload copy,
    /// counted in [`crate::stats`]); fill [`SendBuf::bytes_mut`] to avoid it.
    ///
    /// # Errors
    /// [`MsgError::TooLong`] if `data` does not fit.
    pub fn copy_from(&mut self, data: &[u8]) -> Result<(), MsgError> {
        if data.len() > self.capacity() {
            return Err(MsgError::TooLong {
                len: data.len(),
                max: self.capacity(),
            });
        }
        {
            let mut b = self.bytes_mut()?;
            if let Some(dst) = b.get_mut(..data.len()) {
                dst.copy_from_slice(data);
            }
        }
        stats::count_copy(data.len());
        self.len = data.len();
        Ok(())
    }

    pub(crate) fn pool_id(&self) -> u64 {
        self.pool.shared.id
    }

    /// Moves the slot out (the post path); the emptied `SendBuf` then drops as nothing.
    pub(crate) fn take_slot(mut self) -> Option<(SendSlot, usize, SendPool)> {
        let slot = self.slot.take()?;
        Some((slot, self.len, self.pool.clone()))
    }
}

impl Drop for SendBuf {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.pool.put(slot);
        }
    }
}

/// Exclusive in-place access to a [`SendBuf`]'s registered memory.
pub struct SendBytes<'a> {
    guard: ExclusiveGuard<'a>,
}

impl std::fmt::Debug for SendBytes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBytes")
            .field("len", &self.guard.len())
            .finish()
    }
}

impl Deref for SendBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.guard
    }
}

impl DerefMut for SendBytes<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.guard
    }
}
