//! Asynchronous events and the pollable queues that deliver them.
//!
//! [`AsyncEvent`]s (IBA Vol 1 §11.6) are raised by the object layer (CQ overrun, SRQ limit,
//! SQ drained, last WQE reached), by the transport engine (QP errors, communication
//! established) and by the device (port up/down, fatal error). They are queued on the
//! context's event queue, whose file descriptor ([`crate::Context::async_fd`]) is readable
//! while events are pending, and fetched with [`crate::Context::get_async_event`].
//!
//! # Acknowledgement and lifetimes
//!
//! An event that names a QP, CQ or SRQ carries a counted reference to it. Acknowledging the
//! event ([`AsyncEvent::ack`], or dropping it) releases the reference. Destroying the object
//! first marks it unpublished, then removes its undelivered events from the queue, then waits
//! for the references held by delivered-but-unacknowledged events — as `ibv_destroy_qp`
//! waits for `ibv_ack_async_event`. The unpublished check is made *under the queue lock* when
//! an event is queued, and the purge takes the same lock after the flag was cleared, so an
//! event raised concurrently with a destroy is either purged or never queued: no event for
//! an object is ever delivered after its destroy returned.

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};

use crate::cq::CqRef;
use crate::error::{RaiseError, WaitError};
use crate::qp::QpRef;
use crate::srq::SrqRef;
use crate::sync::{lock, AtomicBool, AtomicU64, Mutex, Ordering};

/// Asynchronous event types (`enum ibv_event_type` of `<infiniband/verbs.h>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EventType {
    /// 0: CQ overrun.
    CqErr = 0,
    /// 1: local work queue catastrophic error.
    QpFatal = 1,
    /// 2: invalid request local work queue error.
    QpReqErr = 2,
    /// 3: local access violation work queue error.
    QpAccessErr = 3,
    /// 4: communication established (first packet received in RTR).
    CommEst = 4,
    /// 5: send queue drained (after RTS→SQD).
    SqDrained = 5,
    /// 6: path migrated (APM; not applicable to RoCE).
    PathMig = 6,
    /// 7: path migration error (APM; not applicable to RoCE).
    PathMigErr = 7,
    /// 8: catastrophic device error.
    DeviceFatal = 8,
    /// 9: port became active.
    PortActive = 9,
    /// 10: port went down.
    PortErr = 10,
    /// 11: LID changed (IB SM).
    LidChange = 11,
    /// 12: P_Key table changed (IB SM).
    PkeyChange = 12,
    /// 13: SM changed (IB SM).
    SmChange = 13,
    /// 14: catastrophic SRQ error.
    SrqErr = 14,
    /// 15: the SRQ's WQE count dropped below the armed limit.
    SrqLimitReached = 15,
    /// 16: an SRQ-attached QP in ERR will consume no more SRQ WQEs.
    QpLastWqeReached = 16,
    /// 17: client re-register request (IB SM).
    ClientReregister = 17,
    /// 18: GID table changed.
    GidChange = 18,
    /// 19: work queue catastrophic error.
    WqFatal = 19,
    /// 20: device speed changed.
    DeviceSpeedChange = 20,
}

/// What kind of object an [`EventType`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementKind {
    /// A queue pair.
    Qp,
    /// A completion queue.
    Cq,
    /// A shared receive queue.
    Srq,
    /// A port.
    Port,
    /// The device itself.
    Device,
    /// A work queue (not modelled by uroce: such events cannot be raised).
    Wq,
}

impl EventType {
    /// Every event type, in numeric order.
    pub const ALL: [EventType; 21] = [
        EventType::CqErr,
        EventType::QpFatal,
        EventType::QpReqErr,
        EventType::QpAccessErr,
        EventType::CommEst,
        EventType::SqDrained,
        EventType::PathMig,
        EventType::PathMigErr,
        EventType::DeviceFatal,
        EventType::PortActive,
        EventType::PortErr,
        EventType::LidChange,
        EventType::PkeyChange,
        EventType::SmChange,
        EventType::SrqErr,
        EventType::SrqLimitReached,
        EventType::QpLastWqeReached,
        EventType::ClientReregister,
        EventType::GidChange,
        EventType::WqFatal,
        EventType::DeviceSpeedChange,
    ];

    /// The ABI value.
    pub const fn as_u32(self) -> u32 {
        self as u32
    }

    /// The event type with ABI value `v`, or `None`.
    pub fn from_u32(v: u32) -> Option<EventType> {
        EventType::ALL.iter().copied().find(|e| e.as_u32() == v)
    }

    /// The kind of object the event names (`ibv_async_event.element`).
    pub const fn element_kind(self) -> ElementKind {
        match self {
            EventType::CqErr => ElementKind::Cq,
            EventType::QpFatal
            | EventType::QpReqErr
            | EventType::QpAccessErr
            | EventType::CommEst
            | EventType::SqDrained
            | EventType::PathMig
            | EventType::PathMigErr
            | EventType::QpLastWqeReached => ElementKind::Qp,
            EventType::SrqErr | EventType::SrqLimitReached => ElementKind::Srq,
            EventType::PortActive
            | EventType::PortErr
            | EventType::LidChange
            | EventType::PkeyChange
            | EventType::SmChange
            | EventType::ClientReregister
            | EventType::GidChange => ElementKind::Port,
            EventType::DeviceFatal | EventType::DeviceSpeedChange => ElementKind::Device,
            EventType::WqFatal => ElementKind::Wq,
        }
    }

    /// The verbs name (`IBV_EVENT_...`).
    pub const fn name(self) -> &'static str {
        match self {
            EventType::CqErr => "IBV_EVENT_CQ_ERR",
            EventType::QpFatal => "IBV_EVENT_QP_FATAL",
            EventType::QpReqErr => "IBV_EVENT_QP_REQ_ERR",
            EventType::QpAccessErr => "IBV_EVENT_QP_ACCESS_ERR",
            EventType::CommEst => "IBV_EVENT_COMM_EST",
            EventType::SqDrained => "IBV_EVENT_SQ_DRAINED",
            EventType::PathMig => "IBV_EVENT_PATH_MIG",
            EventType::PathMigErr => "IBV_EVENT_PATH_MIG_ERR",
            EventType::DeviceFatal => "IBV_EVENT_DEVICE_FATAL",
            EventType::PortActive => "IBV_EVENT_PORT_ACTIVE",
            EventType::PortErr => "IBV_EVENT_PORT_ERR",
            EventType::LidChange => "IBV_EVENT_LID_CHANGE",
            EventType::PkeyChange => "IBV_EVENT_PKEY_CHANGE",
            EventType::SmChange => "IBV_EVENT_SM_CHANGE",
            EventType::SrqErr => "IBV_EVENT_SRQ_ERR",
            EventType::SrqLimitReached => "IBV_EVENT_SRQ_LIMIT_REACHED",
            EventType::QpLastWqeReached => "IBV_EVENT_QP_LAST_WQE_REACHED",
            EventType::ClientReregister => "IBV_EVENT_CLIENT_REREGISTER",
            EventType::GidChange => "IBV_EVENT_GID_CHANGE",
            EventType::WqFatal => "IBV_EVENT_WQ_FATAL",
            EventType::DeviceSpeedChange => "IBV_EVENT_DEVICE_SPEED_CHANGE",
        }
    }

    /// Checks that `self` names objects of `kind` (for the `raise_event` methods).
    pub(crate) fn expect_kind(self, kind: ElementKind) -> Result<(), RaiseError> {
        if self.element_kind() == kind {
            Ok(())
        } else {
            Err(RaiseError::WrongElement {
                event: self,
                expected: self.element_kind(),
                given: kind,
            })
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The object an event is about; QP, CQ and SRQ elements hold counted references.
#[derive(Debug)]
pub enum EventElement {
    /// A queue pair.
    Qp(QpRef),
    /// A completion queue.
    Cq(CqRef),
    /// A shared receive queue.
    Srq(SrqRef),
    /// A port (always 1).
    Port(u8),
    /// The device.
    Device,
}

impl EventElement {
    /// Whether the named object is still published (port and device always are).
    fn is_published(&self) -> bool {
        match self {
            EventElement::Qp(q) => q.core().liveness.is_published(),
            EventElement::Cq(c) => c.core().liveness.is_published(),
            EventElement::Srq(s) => s.core().liveness.is_published(),
            EventElement::Port(_) | EventElement::Device => true,
        }
    }

    /// The kind of the element.
    pub fn kind(&self) -> ElementKind {
        match self {
            EventElement::Qp(_) => ElementKind::Qp,
            EventElement::Cq(_) => ElementKind::Cq,
            EventElement::Srq(_) => ElementKind::Srq,
            EventElement::Port(_) => ElementKind::Port,
            EventElement::Device => ElementKind::Device,
        }
    }
}

/// One asynchronous event (`struct ibv_async_event`). Acknowledge it with
/// [`AsyncEvent::ack`] or by dropping it; until then the object it names cannot finish
/// being destroyed.
#[derive(Debug)]
#[must_use = "an event must be acknowledged (ack() or drop) before its object can be destroyed"]
pub struct AsyncEvent {
    event_type: EventType,
    element: EventElement,
}

impl AsyncEvent {
    pub(crate) fn new(event_type: EventType, element: EventElement) -> AsyncEvent {
        AsyncEvent {
            event_type,
            element,
        }
    }

    /// The event type.
    pub fn event_type(&self) -> EventType {
        self.event_type
    }

    /// The object the event is about.
    pub fn element(&self) -> &EventElement {
        &self.element
    }

    /// The QP, for QP events.
    pub fn qp(&self) -> Option<&QpRef> {
        match &self.element {
            EventElement::Qp(q) => Some(q),
            _ => None,
        }
    }

    /// The CQ, for CQ events.
    pub fn cq(&self) -> Option<&CqRef> {
        match &self.element {
            EventElement::Cq(c) => Some(c),
            _ => None,
        }
    }

    /// The SRQ, for SRQ events.
    pub fn srq(&self) -> Option<&SrqRef> {
        match &self.element {
            EventElement::Srq(s) => Some(s),
            _ => None,
        }
    }

    /// Acknowledges the event (`ibv_ack_async_event`), releasing its reference.
    pub fn ack(self) {
        drop(self);
    }
}

/// A one-way "published" flag: set at creation, cleared once by the destroyer.
///
/// Raisers read it under the event queue's lock; destroyers clear it *before* purging the
/// queue under that lock (see the module docs).
#[derive(Debug)]
pub(crate) struct Liveness(AtomicBool);

impl Liveness {
    pub(crate) fn new() -> Liveness {
        Liveness(AtomicBool::new(true))
    }

    pub(crate) fn is_published(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn unpublish(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A queue whose eventfd is readable exactly while items are pending (or after shutdown).
///
/// Level-triggered: every mutation, under the lock, makes the eventfd counter non-zero if
/// the queue is non-empty and zero if it is empty, so `poll(2)` on the fd never reports
/// readiness for a queue that was empty when the lock was released (except after shutdown,
/// which leaves it readable for good so blocked waiters wake up).
pub(crate) struct FdQueue<T> {
    state: Mutex<FdState<T>>,
    fd: OwnedFd,
}

struct FdState<T> {
    items: VecDeque<T>,
    signaled: bool,
    shutdown: bool,
}

impl<T> FdQueue<T> {
    pub(crate) fn new() -> Result<FdQueue<T>, rustix::io::Errno> {
        // Blocking, as rdma-core's descriptors are by default, so that an application's
        // `O_NONBLOCK` on it is an observable wish (the C library honours it). The queue's
        // own reads and writes never block: the counter is only ever 0 or 1 and they
        // happen only when it is 1 or 0 respectively.
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC)?;
        Ok(FdQueue {
            state: Mutex::new(FdState {
                items: VecDeque::new(),
                signaled: false,
                shutdown: false,
            }),
            fd,
        })
    }

    /// Makes the eventfd's readiness match the state (called with the lock held).
    fn sync_signal(&self, st: &mut FdState<T>) {
        let want = !st.items.is_empty() || st.shutdown;
        if want && !st.signaled {
            // A write of 1 neither blocks nor fails on an eventfd whose counter is 0 (the
            // counter is only ever 0 or 1 here); if it failed, the fd would just stay
            // unreadable and blocked waiters fall back to their timeout.
            if rustix::io::write(&self.fd, &1u64.to_ne_bytes()).is_ok() {
                st.signaled = true;
            }
        } else if !want && st.signaled {
            // Reading resets the counter to 0. It is 1 unless somebody outside read the
            // descriptor (a misuse); the zero-timeout poll keeps even that from blocking.
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            let zero = Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            if rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0) {
                let mut buf = [0u8; 8];
                let _ = rustix::io::read(&self.fd, &mut buf);
            }
            st.signaled = false;
        }
    }

    /// Queues `item` if the queue is not shut down and `admit(&item)` holds, evaluated under
    /// the lock. A refused item is handed back (the caller drops it outside the lock).
    pub(crate) fn push_if(&self, item: T, admit: impl FnOnce(&T) -> bool) -> Result<(), T> {
        let mut st = lock(&self.state);
        if st.shutdown || !admit(&item) {
            return Err(item);
        }
        st.items.push_back(item);
        self.sync_signal(&mut st);
        Ok(())
    }

    /// The oldest item, if any.
    pub(crate) fn try_pop(&self) -> Option<T> {
        let mut st = lock(&self.state);
        let item = st.items.pop_front();
        if item.is_some() {
            self.sync_signal(&mut st);
        }
        item
    }

    /// The oldest item, waiting up to `timeout` (`None`: until an item arrives or the queue
    /// is shut down). Pending items are still returned after shutdown.
    pub(crate) fn pop(&self, timeout: Option<Duration>) -> Result<T, WaitError> {
        let deadline = timeout.map(|t| Instant::now().checked_add(t));
        // Each iteration either returns or sleeps in poll(2) until the fd is readable or the
        // deadline passes; it only repeats when another consumer won the race for an item.
        loop {
            {
                let mut st = lock(&self.state);
                if let Some(item) = st.items.pop_front() {
                    self.sync_signal(&mut st);
                    return Ok(item);
                }
                if st.shutdown {
                    return Err(WaitError::Shutdown);
                }
            }
            let remaining = match deadline {
                None | Some(None) => None,
                Some(Some(d)) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(WaitError::Timeout);
                    }
                    Some(d - now)
                }
            };
            self.wait_readable(remaining)?;
        }
    }

    fn wait_readable(&self, remaining: Option<Duration>) -> Result<(), WaitError> {
        let ts = remaining.map(|d| {
            Timespec::try_from(d).unwrap_or(Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            })
        });
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(WaitError::Poll(e)),
        }
    }

    /// Removes every item matching `pred`, returning them (to be dropped outside the lock).
    pub(crate) fn remove_where(&self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut st = lock(&self.state);
        let mut removed = Vec::new();
        let mut kept = VecDeque::with_capacity(st.items.len());
        for item in st.items.drain(..) {
            if pred(&item) {
                removed.push(item);
            } else {
                kept.push_back(item);
            }
        }
        st.items = kept;
        self.sync_signal(&mut st);
        removed
    }

    /// Refuses further pushes and wakes every blocked [`FdQueue::pop`] (they return
    /// [`WaitError::Shutdown`] once the queue is empty).
    pub(crate) fn shutdown(&self) {
        let mut st = lock(&self.state);
        st.shutdown = true;
        self.sync_signal(&mut st);
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        lock(&self.state).shutdown
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.state).items.len()
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The context's asynchronous event queue.
pub(crate) struct EventQueue {
    queue: FdQueue<AsyncEvent>,
    raised: AtomicU64,
    dropped: AtomicU64,
}

impl EventQueue {
    pub(crate) fn new() -> Result<EventQueue, rustix::io::Errno> {
        Ok(EventQueue {
            queue: FdQueue::new()?,
            raised: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues `event` unless its object is unpublished or the queue is shut down. Returns
    /// whether it was queued.
    pub(crate) fn raise(&self, event: AsyncEvent) -> bool {
        match self.queue.push_if(event, |e| e.element.is_published()) {
            Ok(()) => {
                self.raised.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(refused) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                drop(refused);
                false
            }
        }
    }

    /// Raises a port or device event.
    pub(crate) fn raise_unattached(&self, event_type: EventType) -> bool {
        let element = match event_type.element_kind() {
            ElementKind::Port => EventElement::Port(crate::device::PORT_NUM),
            ElementKind::Device => EventElement::Device,
            _ => return false,
        };
        self.raise(AsyncEvent::new(event_type, element))
    }

    /// Removes the queued events `pred` selects; returns how many.
    pub(crate) fn purge(&self, pred: impl FnMut(&AsyncEvent) -> bool) -> usize {
        let removed = self.queue.remove_where(pred);
        let n = removed.len();
        self.dropped.fetch_add(n as u64, Ordering::Relaxed);
        drop(removed);
        n
    }

    pub(crate) fn try_get(&self) -> Option<AsyncEvent> {
        self.queue.try_pop()
    }

    pub(crate) fn get(&self, timeout: Option<Duration>) -> Result<AsyncEvent, WaitError> {
        self.queue.pop(timeout)
    }

    pub(crate) fn shutdown(&self) {
        self.queue.shutdown();
    }

    pub(crate) fn is_shutdown(&self) -> bool {
        self.queue.is_shutdown()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.queue.fd()
    }

    /// (events queued, events refused or purged).
    pub(crate) fn stats(&self) -> (u64, u64) {
        (
            self.raised.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: BorrowedFd<'_>) -> bool {
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut fds, Some(&zero)).expect("poll") == 1
    }

    #[test]
    fn event_type_values_match_spec() {
        // `enum ibv_event_type` values of `<infiniband/verbs.h>`.
        for (v, t) in [
            (0, EventType::CqErr),
            (1, EventType::QpFatal),
            (2, EventType::QpReqErr),
            (3, EventType::QpAccessErr),
            (4, EventType::CommEst),
            (5, EventType::SqDrained),
            (8, EventType::DeviceFatal),
            (9, EventType::PortActive),
            (10, EventType::PortErr),
            (14, EventType::SrqErr),
            (15, EventType::SrqLimitReached),
            (16, EventType::QpLastWqeReached),
        ] {
            assert_eq!(t.as_u32(), v, "{t}");
            assert_eq!(EventType::from_u32(v), Some(t));
        }
        assert_eq!(EventType::from_u32(21), None);
    }

    #[test]
    fn fd_is_readable_exactly_while_items_pending() {
        let q: FdQueue<u32> = FdQueue::new().expect("eventfd");
        assert!(!readable(q.fd()));
        q.push_if(1, |_| true).expect("push");
        q.push_if(2, |_| true).expect("push");
        assert!(readable(q.fd()));
        assert_eq!(q.try_pop(), Some(1));
        assert!(readable(q.fd()), "one item left");
        assert_eq!(q.push_if(3, |_| false), Err(3), "admission refused");
        assert_eq!(q.remove_where(|x| *x == 2), vec![2]);
        assert!(!readable(q.fd()), "purge emptied the queue");
        assert_eq!(
            q.pop(Some(Duration::from_millis(10))),
            Err(WaitError::Timeout)
        );
        q.shutdown();
        assert!(readable(q.fd()), "shutdown wakes pollers");
        assert_eq!(q.push_if(4, |_| true), Err(4));
        assert_eq!(q.pop(None), Err(WaitError::Shutdown));
    }
}
