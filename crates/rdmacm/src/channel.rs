//! Event channels and events (`rdma_event_channel`, `rdma_cm_event`).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, EventfdFlags};

use crate::id::{CmId, CmIdRef, ConnParam, UdParam};
use crate::{lock, CmError};

/// What an event reports; the discriminants are `enum rdma_cm_event_type`'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EventKind {
    /// `resolve_addr` finished.
    AddrResolved = 0,
    /// `resolve_addr` failed.
    AddrError = 1,
    /// `resolve_route` finished.
    RouteResolved = 2,
    /// `resolve_route` failed.
    RouteError = 3,
    /// A connection request (the event's id is the new connection's).
    ConnectRequest = 4,
    /// The REP arrived for an id without a QP: set the QP up, then `establish`.
    ConnectResponse = 5,
    /// Setting up the connection failed locally (QP transition).
    ConnectError = 6,
    /// The peer never answered (REQ, REP or SIDR_REQ retries exhausted).
    Unreachable = 7,
    /// The peer rejected; `status` is the REJ reason (SIDR: the SIDR_REP status).
    Rejected = 8,
    /// The connection is up (UD: the SIDR_REP named the remote QP).
    Established = 9,
    /// The connection is down (DREQ/DREP exchanged or timed out).
    Disconnected = 10,
    /// The device went away.
    DeviceRemoval = 11,
    /// `join_multicast` finished: the event's UD parameters address the group.
    MulticastJoin = 12,
    /// A joined multicast group failed (not raised by uroce: joins are local).
    MulticastError = 13,
    /// The connection's TIMEWAIT ended; its QP may be reused.
    TimewaitExit = 15,
}

/// One event (`rdma_cm_event`). Dropping it acknowledges it (`rdma_ack_cm_event`):
/// [`CmId::destroy`] of its id waits until then.
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// 0, the REJ reason for [`EventKind::Rejected`], or a negative errno
    /// (`-ETIMEDOUT` for [`EventKind::Unreachable`]).
    pub status: i32,
    /// The id the event is for (for a connection request: the new id).
    pub id: CmIdRef,
    /// The listening id of a connection request.
    pub listen_id: Option<CmIdRef>,
    /// The connection parameters (REQ / REP contents, private data after the RDMA-CM
    /// header of a REQ).
    pub param: ConnParam,
    /// UD parameters: the remote QP and Q_Key of an established UD id.
    pub ud: Option<UdParam>,
    new_id: Option<CmId>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("kind", &self.kind)
            .field("status", &self.status)
            .field("id", &self.id.token())
            .field("param", &self.param)
            .field("ud", &self.ud)
            .finish()
    }
}

impl Event {
    pub(crate) fn new(kind: EventKind, id: CmIdRef) -> Event {
        id.event_out();
        Event {
            kind,
            status: 0,
            id,
            listen_id: None,
            param: ConnParam::default(),
            ud: None,
            new_id: None,
        }
    }

    pub(crate) fn with_new_id(mut self, id: CmId) -> Event {
        self.new_id = Some(id);
        self
    }

    /// The private data the event carries.
    pub fn private_data(&self) -> &[u8] {
        &self.param.private_data
    }

    /// Takes ownership of a connection request's new id (accept or reject it, then destroy
    /// it). An id not taken is rejected and destroyed with the event.
    pub fn take_id(&mut self) -> Option<CmId> {
        self.new_id.take()
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // The acknowledgement first: dropping the untaken new id below waits for it.
        self.id.event_acked();
        if let Some(l) = &self.listen_id {
            l.event_acked();
        }
    }
}

pub(crate) struct ChannelInner {
    queue: Mutex<VecDeque<Event>>,
    cv: Condvar,
    fd: OwnedFd,
}

impl ChannelInner {
    /// Queues an event; the descriptor becomes readable.
    pub(crate) fn push(&self, ev: Event) {
        let mut q = lock(&self.queue);
        q.push_back(ev);
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
        self.cv.notify_all();
    }

    /// Removes the undelivered events of id `token` (returned, to be dropped by the caller
    /// outside the lock).
    pub(crate) fn purge(&self, token: u64) -> Vec<Event> {
        let mut q = lock(&self.queue);
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(q.len());
        for ev in q.drain(..) {
            if ev.id.token() == token {
                out.push(ev);
            } else {
                keep.push_back(ev);
            }
        }
        *q = keep;
        if q.is_empty() {
            self.drain_fd();
        }
        out
    }

    /// Resets the descriptor's counter if it is readable. The descriptor is blocking (a C
    /// program may wait on it, or make it `O_NONBLOCK` itself), so it is read only after a
    /// zero-timeout poll found it readable; every read happens under the queue lock.
    fn drain_fd(&self) {
        let mut fds = [rustix::event::PollFd::new(
            &self.fd,
            rustix::event::PollFlags::IN,
        )];
        let ready =
            rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())).unwrap_or(0);
        if ready > 0 {
            let mut buf = [0u8; 8];
            let _ = rustix::io::read(&self.fd, &mut buf);
        }
    }

    fn pop(&self, timeout: Option<Duration>) -> Option<Event> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = lock(&self.queue);
        // Bounded by the deadline (or by an event arriving).
        loop {
            if let Some(ev) = q.pop_front() {
                if q.is_empty() {
                    self.drain_fd();
                }
                return Some(ev);
            }
            let wait = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return None;
                    }
                    d - now
                }
                None => return None,
            };
            q = self
                .cv
                .wait_timeout(q, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// An event channel (`rdma_event_channel`): ids report here; [`EventChannel::fd`] is
/// readable while events are pending.
#[derive(Clone)]
pub struct EventChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("pending", &self.pending())
            .finish()
    }
}

impl EventChannel {
    pub(crate) fn new() -> Result<EventChannel, CmError> {
        // Blocking, as librdmacm's channel descriptor is (see `drain_fd`).
        let fd = eventfd(0, EventfdFlags::CLOEXEC).map_err(|e| CmError::Net(e.to_string()))?;
        Ok(EventChannel {
            inner: Arc::new(ChannelInner {
                queue: Mutex::new(VecDeque::new()),
                cv: Condvar::new(),
                fd,
            }),
        })
    }

    /// The descriptor to poll: readable while events are pending.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// Events waiting.
    pub fn pending(&self) -> usize {
        lock(&self.inner.queue).len()
    }

    /// The next event, waiting up to `timeout` (`rdma_get_cm_event`).
    ///
    /// # Errors
    /// [`CmError::Timeout`].
    pub fn get_event(&self, timeout: Duration) -> Result<Event, CmError> {
        self.inner.pop(Some(timeout)).ok_or(CmError::Timeout)
    }

    /// The next event if one is pending.
    pub fn try_get_event(&self) -> Option<Event> {
        self.inner.pop(None)
    }

    /// The next event, which must be of `kind` (a test and `create_ep` helper).
    ///
    /// # Errors
    /// [`CmError::Timeout`]; [`CmError::Cm`] naming the event that came instead.
    pub fn expect(&self, kind: EventKind, timeout: Duration) -> Result<Event, CmError> {
        let ev = self.get_event(timeout)?;
        if ev.kind == kind {
            Ok(ev)
        } else {
            Err(CmError::Cm(format!(
                "expected {kind:?}, got {:?} (status {})",
                ev.kind, ev.status
            )))
        }
    }
}
