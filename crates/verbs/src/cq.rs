//! Completion queues and completion channels.
//!
//! A CQ has a capacity chosen at creation and changed only by [`CqRef::resize`] (never
//! below the completions it holds). Completions are pushed by the QPs attached
//! to it (through the QP's methods) and polled by the application. When a completion finds
//! the CQ full it is **not** stored: the CQ goes into error, `CQ_ERR` is raised once, and
//! that push and every later one fail (the transport then moves the QP to ERR,
//! docs/INTEROP-NOTES.md §7). Entries already queued can still be polled.
//!
//! Notification is one-shot: [`CqRef::req_notify`] arms the CQ for the next completion, or
//! for the next *solicited* completion (a receive whose packet had the SE bit, or any error
//! completion). The first matching completion disarms the CQ and queues it on its
//! [`CompChannel`], whose file descriptor becomes readable; [`CompChannel::get_cq_event`]
//! returns a [`CqEvent`] naming the CQ, which must be acknowledged (dropped or
//! [`CqEvent::ack`]) before the CQ can be destroyed, as with `ibv_ack_cq_events`.
//!
//! Completion timestamps ([`CqRef::enable_timestamps`], for `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`
//! and `…_WALLCLOCK`): a CQ that asked for them reads the clocks it asked for once per
//! completion, when the completion is generated (in `CqCore::push`, before the entry is
//! stored), and returns the [`CompletionStamp`] with it ([`CqRef::poll_stamped`]); a CQ that
//! did not ask reads no clock.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Deref;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::context::{dec, get, try_inc, ContextCore};
use crate::error::{
    AllocError, Children, CreateCqError, DestroyError, NotifyError, ObjectKind, ResizeCqError,
    WaitError,
};
use crate::event::{AsyncEvent, EventElement, EventType, FdQueue, Liveness};
use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering};
use crate::table::wait_unreferenced;
use crate::wc::{WcStatus, WorkCompletion};

/// What a CQ is armed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    /// Any completion.
    Next,
    /// Solicited receive completions and error completions.
    Solicited,
}

struct CqState {
    /// How many completions the CQ holds (`cqe`); under the lock so that a resize and a
    /// push see one value.
    capacity: u32,
    entries: VecDeque<WorkCompletion>,
    /// The timestamps of `entries`, one each, while the CQ stamps ([`CqCore::clocks`] non-zero
    /// from creation on); empty otherwise.
    stamps: VecDeque<CompletionStamp>,
    overrun: bool,
    armed: Option<Armed>,
}

bitflags::bitflags! {
    /// The clocks a CQ stamps its completions with.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Clocks: u32 {
        /// `CLOCK_MONOTONIC` (the device's free-running clock, in ns: a 1 GHz clock).
        const MONOTONIC = 1;
        /// `CLOCK_REALTIME` (wall-clock time, ns since the Unix epoch).
        const REALTIME = 2;
    }
}

/// When a completion was generated: the clocks of [`Clocks`] read in `CqCore::push`, in
/// nanoseconds (0 for a clock the CQ does not stamp with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompletionStamp {
    /// `CLOCK_MONOTONIC`, ns.
    pub monotonic_ns: u64,
    /// `CLOCK_REALTIME`, ns since the Unix epoch.
    pub realtime_ns: u64,
}

impl CompletionStamp {
    /// Reads the clocks of `clocks` ([`Clocks`] bits).
    fn now(clocks: usize) -> CompletionStamp {
        let read = |c| {
            let t = rustix::time::clock_gettime(c);
            (t.tv_sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(t.tv_nsec as u64)
        };
        let has = |c: Clocks| clocks & c.bits() as usize != 0;
        CompletionStamp {
            monotonic_ns: if has(Clocks::MONOTONIC) {
                read(rustix::time::ClockId::Monotonic)
            } else {
                0
            },
            realtime_ns: if has(Clocks::REALTIME) {
                read(rustix::time::ClockId::Realtime)
            } else {
                0
            },
        }
    }
}

/// Reads `CLOCK_MONOTONIC` in ns: the clock of [`CompletionStamp::monotonic_ns`].
pub fn monotonic_ns() -> u64 {
    CompletionStamp::now(Clocks::MONOTONIC.bits() as usize).monotonic_ns
}

/// Why a completion could not be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    /// This push found the CQ full (CQ_ERR was raised).
    Overrun,
    /// The CQ was already in error.
    InError,
}

pub(crate) struct CqCore {
    pub(crate) id: u32,
    pub(crate) ctx: Arc<ContextCore>,
    comp_vector: u32,
    channel: Option<Arc<ChannelCore>>,
    state: Mutex<CqState>,
    /// Which clocks each completion is stamped with ([`Clocks`] bits; 0: none, no clock read).
    clocks: AtomicUsize,
    /// QPs (once per queue using the CQ) and XRC SRQs attached to it.
    pub(crate) attached: AtomicUsize,
    pub(crate) liveness: Liveness,
}

impl CqCore {
    pub(crate) fn create(
        ctx: &Arc<ContextCore>,
        cqe: u32,
        channel: Option<&CompChannel>,
        comp_vector: u32,
    ) -> Result<Cq, CreateCqError> {
        let max = ctx.attr().max_cqe;
        if cqe == 0 || cqe > max {
            return Err(CreateCqError::InvalidSize { cqe, max });
        }
        if let Some(ch) = channel {
            if !Arc::ptr_eq(&ch.core.ctx, ctx) {
                return Err(CreateCqError::ForeignChannel);
            }
        }
        let max_cq = ctx.attr().max_cq;
        if !try_inc(&ctx.live.cqs, max_cq) {
            return Err(CreateCqError::Limit { max: max_cq });
        }
        let channel = channel.map(|ch| {
            ch.core.bound_cqs.fetch_add(1, Ordering::AcqRel);
            ch.core.clone()
        });
        Ok(Cq {
            r: CqRef {
                core: Arc::new(CqCore {
                    id: ctx.next_id(),
                    ctx: ctx.clone(),
                    comp_vector,
                    channel,
                    clocks: AtomicUsize::new(0),
                    state: Mutex::new(CqState {
                        capacity: cqe,
                        entries: VecDeque::new(),
                        stamps: VecDeque::new(),
                        overrun: false,
                        armed: None,
                    }),
                    attached: AtomicUsize::new(0),
                    liveness: Liveness::new(),
                }),
            },
            destroyed: false,
        })
    }

    /// Removes the queued completions of QP `qpn` (the QP moved to RESET); the others keep
    /// their order. Returns how many were removed.
    pub(crate) fn purge_qp(&self, qpn: u32) -> usize {
        let mut st = lock(&self.state);
        let before = st.entries.len();
        if st.stamps.is_empty() {
            st.entries.retain(|wc| wc.qp_num != qpn);
        } else {
            let st = &mut *st;
            let mut kept = st.entries.iter().map(|wc| wc.qp_num != qpn);
            st.stamps.retain(|_| kept.next().unwrap_or(true));
            st.entries.retain(|wc| wc.qp_num != qpn);
        }
        before - st.entries.len()
    }

    /// Stores `wc`; `solicited` says whether it may satisfy a solicited-only arm (receives
    /// whose packet carried SE). Error completions always may.
    pub(crate) fn push(
        this: &Arc<CqCore>,
        wc: WorkCompletion,
        solicited: bool,
    ) -> Result<(), PushError> {
        let clocks = this.clocks.load(Ordering::Relaxed);
        let stamp = (clocks != 0).then(|| CompletionStamp::now(clocks));
        let notify = {
            let mut st = lock(&this.state);
            if st.overrun {
                return Err(PushError::InError);
            }
            if st.entries.len() >= st.capacity as usize {
                st.overrun = true;
                drop(st);
                this.ctx.cq_overruns.fetch_add(1, Ordering::Relaxed);
                this.ctx.events.raise(AsyncEvent::new(
                    EventType::CqErr,
                    EventElement::Cq(CqRef { core: this.clone() }),
                ));
                return Err(PushError::Overrun);
            }
            st.entries.push_back(wc);
            // Stamping started (under this lock) after the clock read above: stamp now, so
            // that every entry of a stamping CQ has its stamp.
            let now_clocks = this.clocks.load(Ordering::Relaxed);
            match stamp {
                Some(stamp) => st.stamps.push_back(stamp),
                None if now_clocks != 0 => st.stamps.push_back(CompletionStamp::now(now_clocks)),
                None => {}
            }
            let fire = match st.armed {
                Some(Armed::Next) => true,
                Some(Armed::Solicited) => solicited || wc.status != WcStatus::Success,
                None => false,
            };
            if fire {
                st.armed = None;
            }
            fire
        };
        if notify {
            if let Some(ch) = &this.channel {
                let cq = CqRef { core: this.clone() };
                let refused = ch.queue.push_if(cq, |c| c.core.liveness.is_published());
                drop(refused);
            }
        }
        Ok(())
    }
}

impl Drop for CqCore {
    fn drop(&mut self) {
        if let Some(ch) = &self.channel {
            dec(&ch.bound_cqs);
        }
        dec(&self.ctx.live.cqs);
    }
}

/// A counted reference to a CQ, with everything but destroy. [`Cq`] dereferences to it;
/// [`CqEvent`]s and `CQ_ERR` events carry one.
#[derive(Clone)]
pub struct CqRef {
    core: Arc<CqCore>,
}

impl CqRef {
    pub(crate) fn core(&self) -> &Arc<CqCore> {
        &self.core
    }

    /// The CQ's id (unique within its context).
    pub fn id(&self) -> u32 {
        self.core.id
    }

    /// The capacity (`cqe`).
    pub fn capacity(&self) -> u32 {
        lock(&self.core.state).capacity
    }

    /// Changes the capacity to `cqe` (`ibv_resize_cq`) and returns it. Completions already
    /// queued are kept, in order; the new size must hold them all and lie in
    /// 1..=`max_cqe`. A CQ that overflowed stays in error.
    ///
    /// # Errors
    /// [`ResizeCqError::InvalidSize`], [`ResizeCqError::TooSmall`].
    pub fn resize(&self, cqe: u32) -> Result<u32, ResizeCqError> {
        let max = self.core.ctx.attr().max_cqe;
        if cqe == 0 || cqe > max {
            return Err(ResizeCqError::InvalidSize { cqe, max });
        }
        let mut st = lock(&self.core.state);
        let pending = st.entries.len();
        if (cqe as usize) < pending {
            return Err(ResizeCqError::TooSmall { cqe, pending });
        }
        st.capacity = cqe;
        Ok(cqe)
    }

    /// The completion vector given at creation.
    pub fn comp_vector(&self) -> u32 {
        self.core.comp_vector
    }

    /// Number of completions waiting to be polled.
    pub fn len(&self) -> usize {
        lock(&self.core.state).entries.len()
    }

    /// Whether no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the CQ overflowed (it then stores no more completions).
    pub fn is_overrun(&self) -> bool {
        lock(&self.core.state).overrun
    }

    /// Removes and returns up to `max` completions, oldest first (`ibv_poll_cq`).
    ///
    /// Polling an empty CQ drives the network once (receives, timers, transmits) when a
    /// transport is installed and no other thread is doing so, then looks again: busy
    /// polling makes progress without waiting for the progress thread.
    pub fn poll(&self, max: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        for attempt in 0..2 {
            {
                let mut st = lock(&self.core.state);
                let n = max.min(st.entries.len());
                if n > 0 || attempt == 1 {
                    out.extend(st.entries.drain(..n));
                    let m = n.min(st.stamps.len());
                    st.stamps.drain(..m);
                    break;
                }
            }
            if max == 0 || !crate::engine::poll_progress(&self.core.ctx) {
                break;
            }
        }
        out
    }

    /// Fills `out` with completions, oldest first; returns how many were written. Drives
    /// progress like [`CqRef::poll`] when the CQ is empty.
    pub fn poll_into(&self, out: &mut [WorkCompletion]) -> usize {
        for attempt in 0..2 {
            {
                let mut st = lock(&self.core.state);
                let n = out.len().min(st.entries.len());
                if n > 0 || attempt == 1 {
                    for (slot, wc) in out.iter_mut().zip(st.entries.drain(..n)) {
                        *slot = wc;
                    }
                    let m = n.min(st.stamps.len());
                    st.stamps.drain(..m);
                    return n;
                }
            }
            if out.is_empty() || !crate::engine::poll_progress(&self.core.ctx) {
                break;
            }
        }
        0
    }

    /// Takes the oldest completion with its timestamp (`None` unless the CQ stamps, see
    /// [`CqRef::enable_timestamps`]). Drives progress like [`CqRef::poll`] when the CQ is
    /// empty.
    pub fn poll_stamped(&self) -> Option<(WorkCompletion, Option<CompletionStamp>)> {
        for attempt in 0..2 {
            {
                let mut st = lock(&self.core.state);
                if let Some(wc) = st.entries.pop_front() {
                    return Some((wc, st.stamps.pop_front()));
                }
                if attempt == 1 {
                    return None;
                }
            }
            if !crate::engine::poll_progress(&self.core.ctx) {
                break;
            }
        }
        None
    }

    /// Makes every later completion carry a [`CompletionStamp`] of `clocks` (one clock read
    /// per clock per completion, at `CqCore::push`). Only a CQ that holds no completion
    /// yet can start stamping (so that each stamp belongs to one entry); returns whether it
    /// stamps now.
    pub fn enable_timestamps(&self, clocks: Clocks) -> bool {
        let st = lock(&self.core.state);
        if !st.entries.is_empty() && self.core.clocks.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.core
            .clocks
            .fetch_or(clocks.bits() as usize, Ordering::Relaxed);
        true
    }

    /// Arms the CQ for one notification on its completion channel (`ibv_req_notify_cq`):
    /// for the next completion, or with `solicited_only` for the next solicited or error
    /// completion. Arming for "next" is not downgraded by a later solicited-only arm.
    pub fn req_notify(&self, solicited_only: bool) -> Result<(), NotifyError> {
        if self.core.channel.is_none() {
            return Err(NotifyError::NoChannel);
        }
        let mut st = lock(&self.core.state);
        st.armed = match (st.armed, solicited_only) {
            (Some(Armed::Next), _) | (_, false) => Some(Armed::Next),
            (_, true) => Some(Armed::Solicited),
        };
        Ok(())
    }

    /// Whether two references name the same CQ.
    pub fn same_cq(&self, other: &CqRef) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }

    /// Live children (QPs and XRC SRQs using the CQ).
    pub fn children(&self) -> Children {
        Children {
            qps: get(&self.core.attached),
            ..Children::default()
        }
    }
}

impl fmt::Debug for CqRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqRef")
            .field("id", &self.core.id)
            .field("capacity", &self.capacity())
            .finish()
    }
}

/// A completion queue (`ibv_cq`). Unique owner handle; dereferences to [`CqRef`].
pub struct Cq {
    r: CqRef,
    destroyed: bool,
}

impl Cq {
    /// Destroys the CQ (`ibv_destroy_cq`): [`DestroyError::Busy`] while QPs or XRC SRQs use
    /// it; otherwise unpublishes it, discards its pending notifications and `CQ_ERR`
    /// events, and waits for unacknowledged ones ([`DestroyError::InUse`] after the
    /// context's destroy timeout).
    pub fn destroy(mut self) -> Result<(), (Cq, DestroyError)> {
        let attached = get(&self.r.core.attached);
        if attached > 0 {
            return Err((
                self,
                DestroyError::Busy {
                    object: ObjectKind::Cq,
                    children: Children {
                        qps: attached,
                        ..Children::default()
                    },
                },
            ));
        }
        match self.retire(true) {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    /// Unpublishes the object and purges its queued events; with `wait`, then waits for
    /// the remaining references (the handle's own excepted).
    fn retire(&self, wait: bool) -> Result<(), DestroyError> {
        let core = &self.r.core;
        core.liveness.unpublish();
        core.ctx
            .events
            .purge(|e| matches!(e.element(), EventElement::Cq(c) if Arc::ptr_eq(&c.core, core)));
        if let Some(ch) = &core.channel {
            drop(ch.queue.remove_where(|c| Arc::ptr_eq(&c.core, core)));
        }
        if !wait {
            return Ok(());
        }
        wait_unreferenced(core, 1, core.ctx.destroy_timeout()).map_err(|e| DestroyError::InUse {
            object: ObjectKind::Cq,
            references: e.references,
        })
    }

    /// Test hook: strong count of the CQ's shared state (1 = only this handle).
    #[doc(hidden)]
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.r.core)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        if !self.destroyed {
            // With QPs attached, the CQ lives on through their references (no wait: they
            // may live much longer); it is released with the last one. Otherwise this is a
            // destroy whose failure (a reference kept past the timeout) only delays the
            // release to the last reference's drop.
            let idle = get(&self.r.core.attached) == 0;
            let _ = self.retire(idle);
        }
    }
}

impl Deref for Cq {
    type Target = CqRef;
    fn deref(&self) -> &CqRef {
        &self.r
    }
}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.r, f)
    }
}

pub(crate) struct ChannelCore {
    id: u32,
    ctx: Arc<ContextCore>,
    queue: FdQueue<CqRef>,
    bound_cqs: AtomicUsize,
}

impl ChannelCore {
    pub(crate) fn create(ctx: &Arc<ContextCore>) -> Result<CompChannel, AllocError> {
        let queue = FdQueue::new().map_err(AllocError::Eventfd)?;
        if !try_inc(&ctx.live.channels, u32::MAX) {
            return Err(AllocError::Limit {
                object: ObjectKind::CompChannel,
                max: u32::MAX,
            });
        }
        Ok(CompChannel {
            core: Arc::new(ChannelCore {
                id: ctx.next_id(),
                ctx: ctx.clone(),
                queue,
                bound_cqs: AtomicUsize::new(0),
            }),
        })
    }
}

impl Drop for ChannelCore {
    fn drop(&mut self) {
        dec(&self.ctx.live.channels);
    }
}

/// A notification that a CQ fired (`ibv_get_cq_event`). Acknowledge it by dropping it or
/// with [`CqEvent::ack`]; the CQ cannot finish being destroyed before.
#[derive(Debug)]
#[must_use = "a CQ event must be acknowledged (ack() or drop) before its CQ can be destroyed"]
pub struct CqEvent {
    cq: CqRef,
}

impl CqEvent {
    /// The CQ that fired (poll it, then re-arm it).
    pub fn cq(&self) -> &CqRef {
        &self.cq
    }

    /// Acknowledges the event (`ibv_ack_cq_events` for one event).
    pub fn ack(self) {
        drop(self);
    }
}

/// A completion channel (`ibv_comp_channel`): delivers CQ notifications through a pollable
/// file descriptor. Unique owner handle; share it by reference (it is `Sync`).
pub struct CompChannel {
    core: Arc<ChannelCore>,
}

impl CompChannel {
    /// The channel's id (unique within its context).
    pub fn id(&self) -> u32 {
        self.core.id
    }

    /// The file descriptor: readable while notifications are pending or after shutdown.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.core.queue.fd()
    }

    /// The next notification, waiting up to `timeout` (`None`: until one arrives or the
    /// channel is shut down).
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<CqEvent, WaitError> {
        self.core.queue.pop(timeout).map(|cq| CqEvent { cq })
    }

    /// The next notification if one is pending.
    pub fn try_get_cq_event(&self) -> Option<CqEvent> {
        self.core.queue.try_pop().map(|cq| CqEvent { cq })
    }

    /// Acknowledges a batch of events (`ibv_ack_cq_events`).
    pub fn ack_cq_events(&self, events: impl IntoIterator<Item = CqEvent>) -> usize {
        events.into_iter().map(CqEvent::ack).count()
    }

    /// Number of pending notifications.
    pub fn pending(&self) -> usize {
        self.core.queue.len()
    }

    /// Wakes every blocked [`CompChannel::get_cq_event`]: they (and later calls) return
    /// [`WaitError::Shutdown`] once no notification is pending. Cancels blocking waits from
    /// another thread.
    pub fn shutdown(&self) {
        self.core.queue.shutdown();
    }

    /// Destroys the channel (`ibv_destroy_comp_channel`): [`DestroyError::Busy`] while CQs
    /// are bound to it.
    pub fn destroy(self) -> Result<(), (CompChannel, DestroyError)> {
        let cqs = get(&self.core.bound_cqs);
        if cqs > 0 {
            return Err((
                self,
                DestroyError::Busy {
                    object: ObjectKind::CompChannel,
                    children: Children {
                        cqs,
                        ..Children::default()
                    },
                },
            ));
        }
        drop(self);
        Ok(())
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // Blocked readers hold `&self`, so none exist now; waking is for clones of the core
        // that bound CQs keep (they never read).
        self.core.queue.shutdown();
    }
}

impl fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel")
            .field("id", &self.core.id)
            .field("pending", &self.core.queue.len())
            .finish()
    }
}
