//! Asynchronous events: `ibv_get_async_event` / `ibv_ack_async_event`, per `ibv_context`.
//!
//! Every `ibv_open_device` handle is its own context with its own event queue, whose
//! `context->async_fd` (an eventfd) is readable exactly while events are pending for it.
//! All handles of a process share one uroce context (see [`crate::device`]), hence one
//! uroce event queue; a pump moves its events to the queues of the C contexts: an event
//! naming a QP, CQ or SRQ goes to the context that created that object (an XRC target QP
//! opened by several contexts goes to each), a port or device event to every open context.
//! The pump runs on a thread of the network device (woken by the uroce queue's descriptor)
//! and also inside `ibv_get_async_event`, serialised by one lock.
//!
//! An event names a QP, CQ or SRQ by its C handle; the uroce event holding a counted
//! reference to the object is kept until the application acknowledges it, so — as in
//! rdma-core — destroying the object waits for its events to be acknowledged. A destroy
//! first forgets the object's owner (no event for it is routed afterwards) and drops its
//! undelivered events from every context queue (`forget`).

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use uroce_net::NetDevice;
use uroce_verbs::{AsyncEvent, EventElement};

use crate::abi::*;
use crate::entry::*;
use crate::error::FfiError;

symver!(
    "uroce_ibv_get_async_event",
    "ibv_get_async_event@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_ack_async_event",
    "ibv_ack_async_event@@IBVERBS_1.1"
);

/// What an event is acknowledged by: its C view (`event_type`, the element's bits).
type EventKey = (u32, u64);

/// Events handed to the application and not acknowledged yet.
static UNACKED: LazyLock<Mutex<Vec<(EventKey, AsyncEvent)>>> =
    LazyLock::new(|| Mutex::new(Vec::new()));

/// The kind of object an event names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ObjKind {
    Qp,
    Cq,
    Srq,
}

/// A C handle of an object: its context and the handle's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    ctx: usize,
    handle: usize,
}

/// (kind, QPN / CQ id / SRQN) → the C handles of the object. A leaf lock (nothing else is
/// locked while it is held but a context queue).
static OWNERS: LazyLock<Mutex<OwnerMap>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// (kind, number) → the C handles of the object.
type OwnerMap = HashMap<(ObjKind, u32), Vec<Owner>>;

/// One C context's queue: events in order, and the eventfd readable while it is non-empty.
pub(crate) struct CtxEvents {
    /// Each event as its key (the C form's type and element bits, see [`from_key`]).
    q: Mutex<VecDeque<(EventKey, Option<AsyncEvent>)>>,
    fd: OwnedFd,
}

/// The C event whose [`key`] is `k` (the element's eight bytes are exactly the key's).
fn from_key(k: EventKey) -> ibv_async_event {
    ibv_async_event {
        element: ibv_async_event_element {
            wq: k.1 as usize as *mut _,
        },
        event_type: k.0,
    }
}

impl CtxEvents {
    fn push(&self, c: ibv_async_event, ev: Option<AsyncEvent>) {
        let mut q = self.q.lock().unwrap_or_else(PoisonError::into_inner);
        if q.is_empty() {
            signal(&self.fd, true);
        }
        q.push_back((key(&c), ev));
    }

    fn pop(&self) -> Option<(ibv_async_event, Option<AsyncEvent>)> {
        let mut q = self.q.lock().unwrap_or_else(PoisonError::into_inner);
        let (k, ev) = q.pop_front()?;
        if q.is_empty() {
            signal(&self.fd, false);
        }
        Some((from_key(k), ev))
    }

    /// Removes the undelivered events whose element is `handle` (dropped by the caller,
    /// outside the lock).
    fn take_for(&self, handle: usize) -> Vec<(EventKey, Option<AsyncEvent>)> {
        let mut q = self.q.lock().unwrap_or_else(PoisonError::into_inner);
        let was = !q.is_empty();
        let (gone, keep): (Vec<_>, Vec<_>) = q.drain(..).partition(|(k, _)| k.1 == handle as u64);
        *q = keep.into();
        if was && q.is_empty() {
            signal(&self.fd, false);
        }
        gone
    }
}

/// Makes the eventfd readable (`on`) or not. The counter is 1 while the queue is non-empty
/// and 0 otherwise (both changes happen under the queue lock), so neither call blocks.
fn signal(fd: &OwnedFd, on: bool) {
    let mut v: u64 = 1;
    let p = (&raw mut v).cast::<libc::c_void>();
    // SAFETY: an 8-byte buffer on our stack and an eventfd we own; a failure (impossible
    // with the counter kept at 0 or 1) only affects readiness, never memory.
    let _ = unsafe {
        if on {
            libc::write(fd.as_raw_fd(), p, 8)
        } else {
            libc::read(fd.as_raw_fd(), p, 8)
        }
    };
}

/// The queues of the open C contexts, by context address. A leaf lock.
static CONTEXTS: LazyLock<Mutex<HashMap<usize, Arc<CtxEvents>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Serialises pumps (so that a context's events keep the uroce queue's order).
static PUMP: Mutex<()> = Mutex::new(());

/// Creates the queue of a new C context; its `async_fd`.
pub(crate) fn open_context(ctx: *mut ibv_context) -> Result<RawFd, FfiError> {
    // SAFETY: eventfd with valid flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(FfiError::Open(format!(
            "eventfd: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a descriptor eventfd just returned, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = fd.as_raw_fd();
    let q = Arc::new(CtxEvents {
        q: Mutex::new(VecDeque::new()),
        fd,
    });
    CONTEXTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(ctx as usize, q);
    Ok(raw)
}

/// Drops the queue of a closed C context (its undelivered events with it).
pub(crate) fn close_context(ctx: *mut ibv_context) {
    let q = CONTEXTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&(ctx as usize));
    drop(q);
}

/// Records that `handle` (created in `ctx`) is a C handle of object `num` of `kind`.
pub(crate) fn remember(kind: ObjKind, num: u32, ctx: *mut ibv_context, handle: usize) {
    OWNERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry((kind, num))
        .or_default()
        .push(Owner {
            ctx: ctx as usize,
            handle,
        });
}

/// Forgets the C handle `handle` of object `num` (before its destroy): no event is routed
/// to it afterwards, and its undelivered events are dropped (releasing their references).
pub(crate) fn forget(kind: ObjKind, num: u32, handle: usize) {
    let owner = {
        let mut owners = OWNERS.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(list) = owners.get_mut(&(kind, num)) else {
            return;
        };
        let found = list.iter().position(|o| o.handle == handle);
        let o = found.map(|i| list.swap_remove(i));
        if list.is_empty() {
            owners.remove(&(kind, num));
        }
        o
    };
    let Some(o) = owner else { return };
    let q = CONTEXTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&o.ctx)
        .cloned();
    if let Some(q) = q {
        drop(q.take_for(o.handle));
    }
}

/// The C form of an event about `element` (all eight bytes of the union initialised, so
/// that `key` may read them whichever member is set).
fn c_event(ev: &AsyncEvent, element: ibv_async_event_element) -> ibv_async_event {
    ibv_async_event {
        element,
        event_type: ev.event_type().as_u32(),
    }
}

/// Routes one uroce event to the queues of the C contexts it concerns (dropped when none:
/// an object C never saw, created through the Rust API).
fn route(ev: AsyncEvent) {
    let (kind, num) = match ev.element() {
        EventElement::Qp(q) => (ObjKind::Qp, q.qp_num()),
        EventElement::Cq(c) => (ObjKind::Cq, c.id()),
        EventElement::Srq(s) => (ObjKind::Srq, s.srq_num()),
        EventElement::Port(p) => {
            let mut element = ibv_async_event_element {
                wq: std::ptr::null_mut(),
            };
            element.port_num = c_int::from(*p);
            return broadcast(c_event(&ev, element), ev);
        }
        EventElement::Device => {
            let element = ibv_async_event_element {
                wq: std::ptr::null_mut(),
            };
            return broadcast(c_event(&ev, element), ev);
        }
    };
    // The owners lock is held while the event is queued, so that `forget` (which takes it
    // first) either prevents the push or sees the event to drop.
    let owners = OWNERS.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(list) = owners.get(&(kind, num)) else {
        return;
    };
    let contexts = CONTEXTS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut ev = Some(ev);
    for o in list {
        let Some(q) = contexts.get(&o.ctx) else {
            continue;
        };
        let mut element = ibv_async_event_element {
            wq: std::ptr::null_mut(),
        };
        match kind {
            ObjKind::Qp => element.qp = o.handle as *mut ibv_qp,
            ObjKind::Cq => element.cq = o.handle as *mut ibv_cq,
            ObjKind::Srq => element.srq = o.handle as *mut ibv_srq,
        }
        let Some(e) = ev.as_ref() else { break };
        let c = c_event(e, element);
        // The first handle keeps the uroce event (its reference, released by the ack);
        // further handles of a shared XRC target QP get the C form only.
        q.push(c, ev.take());
    }
}

/// Queues a port or device event for every open context.
fn broadcast(c: ibv_async_event, ev: AsyncEvent) {
    let contexts = CONTEXTS.lock().unwrap_or_else(PoisonError::into_inner);
    for q in contexts.values() {
        q.push(c, None);
    }
    drop(ev);
}

/// Moves the events pending in `net`'s uroce queue to the C contexts' queues (at most as
/// many as were pending when it started).
pub(crate) fn pump(net: &NetDevice) {
    let _serial = PUMP.lock().unwrap_or_else(PoisonError::into_inner);
    for _ in 0..net.context().pending_async_events() {
        let Some(ev) = net.context().try_get_async_event() else {
            break;
        };
        route(ev);
    }
}

/// The pump thread of a network device: waits on its uroce event queue and routes what
/// arrives, until [`Pump::stop`].
pub(crate) struct Pump {
    stop: Arc<AtomicBool>,
    wake: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long the pump sleeps at most (seconds) before it looks at its stop flag again.
const PUMP_TICK_S: libc::time_t = 1;

impl Pump {
    /// Starts the pump of `net`.
    pub(crate) fn start(net: Weak<NetDevice>) -> Result<Pump, FfiError> {
        // SAFETY: eventfd with valid flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(FfiError::Open(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: a descriptor eventfd just returned, owned by nobody else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let stop = Arc::new(AtomicBool::new(false));
        let (s, w) = (Arc::clone(&stop), Arc::clone(&wake));
        let thread = std::thread::Builder::new()
            .name("uroce-events".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    let Some(n) = net.upgrade() else { break };
                    let mut fds = [
                        libc::pollfd {
                            fd: n.context().async_fd().as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        },
                        libc::pollfd {
                            fd: w.as_raw_fd(),
                            events: libc::POLLIN,
                            revents: 0,
                        },
                    ];
                    let tick = libc::timespec {
                        tv_sec: PUMP_TICK_S,
                        tv_nsec: 0,
                    };
                    // `ppoll`, not `poll`: the crate declares `poll` as unwinding (a
                    // cancellation point, see `entry::blocking_call`); a second,
                    // non-unwinding declaration of the same symbol would make the
                    // compiler drop the landing pads of the cancellable waits.
                    // SAFETY: two valid pollfds on descriptors kept open by `n` and `w`,
                    // a valid timeout and no signal mask.
                    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &tick, std::ptr::null()) };
                    if r > 0 && fds[0].revents != 0 {
                        pump(&n);
                    }
                }
            })
            .map_err(|e| FfiError::Open(format!("event thread: {e}")))?;
        Ok(Pump {
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// Stops the pump and waits for its thread.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        signal(&self.wake, true);
        if let Some(t) = self.thread.take() {
            // A panic of the pump thread has nothing to report here.
            let _ = t.join();
        }
    }
}

/// The key an event is acknowledged by.
fn key(ev: &ibv_async_event) -> EventKey {
    // SAFETY: every member of the union is plain data and all its eight bytes are
    // initialised (`c_event` callers zero them first; a C caller's struct is plain memory).
    let bits = unsafe { ev.element.wq } as u64;
    (ev.event_type, bits)
}

/// One try at the next event for `context`: the event, or the descriptor to wait on.
fn try_next_event(
    context: *mut ibv_context,
) -> Attempt<Result<(ibv_async_event, Option<AsyncEvent>), FfiError>> {
    let net = match crate::device::Registry::net(context) {
        Ok(n) => n,
        Err(e) => return Attempt::Done(Err(e)),
    };
    pump(&net);
    drop(net);
    let q = CONTEXTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&(context as usize))
        .cloned();
    let Some(q) = q else {
        return Attempt::Done(Err(FfiError::BadHandle { what: "context" }));
    };
    if let Some(e) = q.pop() {
        return Attempt::Done(Ok(e));
    }
    let fd = q.fd.as_raw_fd();
    Attempt::Wait {
        fd,
        keep: Box::new(q),
    }
}

/// `ibv_get_async_event(context, event)`: fills `event` with the next asynchronous event,
/// waiting for one (in `poll(2)`, a cancellation point) unless `context->async_fd` is
/// non-blocking. 0, or -1 + `errno`
/// (`EINVAL` for a bad handle or NULL event, `EAGAIN` when non-blocking and none is
/// pending, `EINTR` when a signal interrupted the wait).
///
/// # Safety
/// `event` is NULL or points to a writable `struct ibv_async_event`.
#[no_mangle]
pub unsafe extern "C-unwind" fn uroce_ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    if event.is_null() {
        report(&FfiError::Invalid("ibv_get_async_event: event is NULL"));
        set_errno(libc::EINVAL);
        return -1;
    }
    blocking_call(-1, || match try_next_event(context) {
        Attempt::Done(Ok((c, ev))) => {
            if let Some(ev) = ev {
                UNACKED
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((key(&c), ev));
            }
            // SAFETY: `event` is non-NULL and writable (caller guarantee).
            unsafe { event.write(c) };
            Attempt::Done(0)
        }
        Attempt::Done(Err(e)) => {
            crate::entry::report(&e);
            set_errno(e.errno());
            Attempt::Done(-1)
        }
        Attempt::Wait { fd, keep } => Attempt::Wait { fd, keep },
    })
}

/// `ibv_ack_async_event(event)`: acknowledges an event from `ibv_get_async_event`, letting
/// the destruction of its object complete. Unknown events and NULL are ignored.
///
/// # Safety
/// `event` is NULL or points to a readable `struct ibv_async_event`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_ack_async_event(event: *mut ibv_async_event) {
    guard((), || {
        if event.is_null() {
            return;
        }
        // SAFETY: `event` is non-NULL and readable (caller guarantee).
        let k = key(&unsafe { event.read() });
        let acked = {
            let mut list = UNACKED.lock().unwrap_or_else(PoisonError::into_inner);
            list.iter()
                .position(|(x, _)| *x == k)
                .map(|i| list.swap_remove(i).1)
        };
        // Dropped outside the lock: releasing the reference may wake a destroyer.
        if let Some(ev) = acked {
            ev.ack();
        }
    })
}
