//! Asynchronous events: `ibv_get_async_event` / `ibv_ack_async_event`, on the event queue
//! of the uroce context behind an `ibv_context` (`context->async_fd` is that queue's file
//! descriptor, readable exactly while events are pending).
//!
//! An event names a QP, CQ or SRQ by its C handle; the uroce event holding a counted
//! reference to the object is kept until the application acknowledges it, so — as in
//! rdma-core — destroying the object waits for its events to be acknowledged.
//!
//! All `ibv_open_device` handles of a process share one uroce context (see
//! [`crate::device`]), hence one event queue: an event is returned to whichever handle asks
//! first.

use std::ffi::c_int;
use std::os::fd::AsRawFd as _;
use std::sync::{LazyLock, Mutex, PoisonError};

use uroce_verbs::{AsyncEvent, EventElement};

use crate::abi::*;
use crate::device::{FfiError, Registry};
use crate::entry::*;
use crate::objects::objects;

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

/// The C form of `ev`: the element's handle is looked up among the objects handed out.
/// `None` when the object has no C handle (created through the Rust API only).
fn to_c(ev: &AsyncEvent) -> Option<ibv_async_event> {
    // All eight bytes of the union are initialised first, so that `key` may read them
    // whichever member is set.
    let mut element = ibv_async_event_element {
        wq: std::ptr::null_mut(),
    };
    match ev.element() {
        EventElement::Qp(q) => {
            let qpn = q.qp_num();
            let objs = objects();
            let (&addr, _) = objs
                .qps
                .iter()
                .find(|(_, e)| e.body().is_some_and(|b| b.qp.qp_num() == qpn))?;
            element.qp = addr as *mut ibv_qp;
        }
        EventElement::Cq(c) => {
            element.cq = *objects().cq_by_id.get(&c.id())? as *mut ibv_cq;
        }
        EventElement::Srq(s) => {
            let srqn = s.srq_num();
            let objs = objects();
            let (&addr, _) = objs
                .srqs
                .iter()
                .find(|(_, e)| e.srq().is_some_and(|s| s.srq_num() == srqn))?;
            element.srq = addr as *mut ibv_srq;
        }
        EventElement::Port(p) => element.port_num = c_int::from(*p),
        EventElement::Device => {}
    }
    Some(ibv_async_event {
        element,
        event_type: ev.event_type().as_u32(),
    })
}

/// The key an event is acknowledged by.
fn key(ev: &ibv_async_event) -> EventKey {
    // SAFETY: every member of the union is plain data and all its eight bytes are
    // initialised (`to_c` zeroes them first; a C caller's struct is plain memory).
    let bits = unsafe { ev.element.wq } as u64;
    (ev.event_type, bits)
}

/// One try at the next event for `context`: the event, or the descriptor to wait on.
fn try_next_event(
    context: *mut ibv_context,
) -> Attempt<Result<(ibv_async_event, AsyncEvent), FfiError>> {
    let net = match Registry::net(context) {
        Ok(n) => n,
        Err(e) => return Attempt::Done(Err(e)),
    };
    // Events about objects C never saw (created through the Rust API) are not C's to
    // handle; the loop is bounded by the queue's length.
    for _ in 0..=net.context().pending_async_events() {
        let Some(ev) = net.context().try_get_async_event() else {
            break;
        };
        if let Some(c) = to_c(&ev) {
            return Attempt::Done(Ok((c, ev)));
        }
    }
    let fd = net.context().async_fd().as_raw_fd();
    Attempt::Wait {
        fd,
        keep: Box::new(net),
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
        set_errno(libc::EINVAL);
        return -1;
    }
    blocking_call(-1, || match try_next_event(context) {
        Attempt::Done(Ok((c, ev))) => {
            UNACKED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((key(&c), ev));
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
