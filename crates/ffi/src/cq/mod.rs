//! Completion channels and CQs: `ibv_create_comp_channel`, `ibv_create_cq`, their
//! destruction, CQ events (`ibv_get_cq_event`, `ibv_ack_cq_events`), the `poll_cq` and
//! `req_notify_cq` slots of `ibv_context.ops`, `ibv_wc_status_str`; [`ex`]: extended CQs
//! (`ibv_create_cq_ex`, `ibv_start_poll`, the `ibv_wc_read_*` accessors); [`resize`]:
//! `ibv_resize_cq`.
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught (`EIO`), handles checked against the registry
//! ([`crate::objects`]) before use, `errno` set on failure; each exported function is a
//! thin wrapper around an internal one that the library's other modules call.

pub mod ex;
pub mod resize;

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::os::fd::AsRawFd as _;
use std::sync::{Arc, LazyLock};

use uroce_verbs::{CompChannel, CqRef, ObjectKind, WcStatus, WorkCompletion};

use crate::abi::*;
use crate::async_events::ObjKind;
use crate::convert::*;
use crate::device::Registry;
use crate::entry::*;
use crate::error::{refuse_if_busy, refused, FfiError};
use crate::handle::{Handle, HandlePtr};
use crate::objects::*;

symver!(
    "uroce_ibv_create_comp_channel",
    "ibv_create_comp_channel@@IBVERBS_1.0"
);
symver!(
    "uroce_ibv_destroy_comp_channel",
    "ibv_destroy_comp_channel@@IBVERBS_1.0"
);
symver!("uroce_ibv_create_cq", "ibv_create_cq@@IBVERBS_1.1");
symver!("uroce_ibv_destroy_cq", "ibv_destroy_cq@@IBVERBS_1.1");
symver!("uroce_ibv_get_cq_event", "ibv_get_cq_event@@IBVERBS_1.1");
symver!("uroce_ibv_ack_cq_events", "ibv_ack_cq_events@@IBVERBS_1.1");
symver!("uroce_ibv_wc_status_str", "ibv_wc_status_str@@IBVERBS_1.1");

/// `ibv_create_comp_channel(context)`: a channel whose `fd` is readable while CQ events
/// are pending; NULL + `errno` on failure.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        ptr_or_null(create_comp_channel(context))
    })
}

/// The body of `ibv_create_comp_channel` (the exported [`uroce_ibv_create_comp_channel`]),
/// for callers inside the library.
pub(crate) fn create_comp_channel(
    context: *mut ibv_context,
) -> Result<*mut ibv_comp_channel, FfiError> {
    let net = Registry::net(context)?;
    let ch = net
        .context()
        .create_comp_channel()
        .map_err(|e| refused("ibv_create_comp_channel", libc::ENOMEM, e))?;
    let raw = CBox::new(ibv_comp_channel {
        context,
        fd: ch.fd().as_raw_fd(),
        refcnt: 0,
    });
    let p = raw.ptr();
    objects().channels.insert(
        p as usize,
        ChannelEntry {
            raw,
            ch: Arc::new(ch),
            _net: net,
        },
    );
    Ok(p)
}

/// `ibv_destroy_comp_channel(channel)`: 0, or `EBUSY` while CQs use it or a thread waits
/// on it, `EINVAL` for an unknown channel.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || errno_value(destroy_comp_channel(channel)))
}

/// The body of `ibv_destroy_comp_channel` (the exported
/// [`uroce_ibv_destroy_comp_channel`]), for callers inside the library.
pub(crate) fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> Result<(), FfiError> {
    let mut objs = objects();
    let entry = objs
        .channels
        .get(&(channel as usize))
        .ok_or(FfiError::BadHandle { what: "channel" })?;
    // SAFETY: registered, live channel allocated by uroce (lock held).
    let refcnt = unsafe { (*entry.raw.ptr()).refcnt };
    if refcnt > 0 || Arc::strong_count(&entry.ch) > 1 {
        return Err(FfiError::Refused {
            op: "ibv_destroy_comp_channel",
            errno: libc::EBUSY,
            reason: "CQs use the channel or a thread waits on it".into(),
        });
    }
    let ChannelEntry { raw, ch, _net } = objs
        .channels
        .remove(&(channel as usize))
        .ok_or(FfiError::BadHandle { what: "channel" })?;
    drop(objs);
    let ch = match Arc::try_unwrap(ch) {
        Ok(ch) => ch,
        Err(ch) => {
            let key = raw.ptr() as usize;
            objects()
                .channels
                .insert(key, ChannelEntry { raw, ch, _net });
            return Err(refused("ibv_destroy_comp_channel", libc::EBUSY, "in use"));
        }
    };
    match ch.destroy() {
        Ok(()) => Ok(()),
        Err((ch, e)) => {
            let key = raw.ptr() as usize;
            objects().channels.insert(
                key,
                ChannelEntry {
                    raw,
                    ch: Arc::new(ch),
                    _net,
                },
            );
            Err(refused("ibv_destroy_comp_channel", libc::EBUSY, e))
        }
    }
}

/// `ibv_create_cq(context, cqe, cq_context, channel, comp_vector)`: a CQ of `cqe`
/// entries, optionally reporting to `channel`; NULL + `errno` (`EINVAL`, `ENOMEM`).
/// `EINVAL` also for a `cqe` outside 1..=`max_cqe` and a `comp_vector` outside
/// 0..`num_comp_vectors`, as rdma-core over the kernel's uverbs reports them.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        ptr_or_null(
            create_cq(
                context,
                cqe,
                cq_context,
                channel,
                comp_vector,
                0,
                std::ptr::null_mut(),
            )
            .map(|c| c.cast()),
        )
    })
}

/// The body of `ibv_create_cq` and `ibv_create_cq_ex`: a CQ container (an `ibv_cq_ex`
/// whose accessors follow `wc_flags`, see [`crate::cq::ex`]), recorded as made in
/// `parent_domain` (NULL: none), which then cannot be deallocated before it.
pub(crate) fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    wc_flags: u64,
    parent_domain: *mut ibv_pd,
) -> Result<*mut ibv_cq_ex, FfiError> {
    let net = Registry::net(context)?;
    let cqe = u32::try_from(cqe).map_err(|_| FfiError::Invalid("negative cqe"))?;
    let vector = u32::try_from(comp_vector).map_err(|_| FfiError::Invalid("negative vector"))?;
    if comp_vector >= crate::device::NUM_COMP_VECTORS {
        return Err(FfiError::Invalid(
            "ibv_create_cq: comp_vector is not below the context's num_comp_vectors",
        ));
    }
    let mut objs = objects();
    let ch = if channel.is_null() {
        None
    } else {
        Some(
            objs.channels
                .get(&(channel as usize))
                .ok_or(FfiError::BadHandle { what: "channel" })?,
        )
    };
    let cq = net
        .context()
        .create_cq(cqe, ch.map(|c| &*c.ch), vector)
        .map_err(|e| refused("ibv_create_cq", libc::EINVAL, e))?;
    let clocks = crate::cq::ex::clocks(wc_flags);
    if !clocks.is_empty() {
        // A new CQ holds no completion: it stamps from its first one.
        cq.enable_timestamps(clocks);
    }
    if let Some(c) = ch {
        // SAFETY: registered, live channel allocated by uroce (lock held).
        unsafe { (*c.raw.ptr()).refcnt += 1 };
    }
    // SAFETY: ibv_cq_ex is pointers, integers, `Option` of function pointers and glibc
    // pthread objects, all valid zeroed (the pthread ones are then their static
    // initialisers).
    let mut c: ibv_cq_ex = unsafe { zeroed() };
    c.context = context;
    c.channel = channel;
    c.cq_context = cq_context;
    c.handle = cq.id();
    c.cqe = c_int::try_from(cq.capacity()).unwrap_or(c_int::MAX);
    crate::cq::ex::init_ops(&mut c, wc_flags);
    let id = cq.id();
    let h = Handle::<CqKind>::create(
        c,
        CqBody {
            cq,
            poll: crate::cq::ex::PollSession::new(),
        },
    );
    let p = Handle::c_ptr(h);
    objs.cq_by_id.insert(id, p as usize);
    crate::async_events::remember(ObjKind::Cq, id, context, p as usize);
    objs.cqs.insert(
        p as usize,
        CqEntry {
            h: HandlePtr(h),
            events: Vec::new(),
            channel: channel as usize,
            parent_domain: parent_domain as usize,
            _net: net,
        },
    );
    Ok(p)
}

/// `ibv_destroy_cq(cq)`: 0, or `EBUSY` while QPs use it, `EINVAL` for an unknown CQ.
/// Events got and not acknowledged are acknowledged implicitly.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || errno_value(destroy_cq(cq)))
}

/// The body of `ibv_destroy_cq` (the exported [`uroce_ibv_destroy_cq`]), for callers inside
/// the library.
pub(crate) fn destroy_cq(cq: *mut ibv_cq) -> Result<(), FfiError> {
    let entry = {
        let mut objs = objects();
        let children = objs.cq(cq)?.children();
        refuse_if_busy("ibv_destroy_cq", ObjectKind::Cq, children)?;
        objs.cqs
            .remove(&(cq as usize))
            .ok_or(FfiError::BadHandle { what: "cq" })?
    };
    let CqEntry {
        h,
        events,
        channel,
        parent_domain,
        _net,
    } = entry;
    drop(events);
    // SAFETY: `h` was just unpublished by this thread.
    let body = match unsafe { Handle::retire(h.0) } {
        Ok(b) => b,
        Err(e) => {
            // A poll session that does not end: the CQ stays (live again).
            objects().cqs.insert(
                cq as usize,
                CqEntry {
                    h,
                    events: Vec::new(),
                    channel,
                    parent_domain,
                    _net,
                },
            );
            return Err(refused("ibv_destroy_cq", libc::EBUSY, format!("{e:?}")));
        }
    };
    let CqBody { cq: c, poll } = body;
    let id = c.id();
    // SAFETY: the container's C part stays readable (type-stable memory).
    let context = unsafe { (*h.c_ptr()).context };
    crate::async_events::forget(ObjKind::Cq, id, cq as usize);
    match c.destroy() {
        Ok(()) => {
            let mut objs = objects();
            objs.cq_by_id.remove(&id);
            if let Some(ch) = objs.channels.get(&channel) {
                // SAFETY: registered, live channel allocated by uroce (lock held).
                unsafe { (*ch.raw.ptr()).refcnt -= 1 };
            }
            drop(objs);
            // SAFETY: retired above, not revived.
            unsafe { Handle::recycle(h.0) };
            Ok(())
        }
        Err((c, e)) => {
            crate::async_events::remember(ObjKind::Cq, id, context, cq as usize);
            // SAFETY: retired above by this thread.
            unsafe { Handle::revive(h.0, CqBody { cq: c, poll }) };
            objects().cqs.insert(
                cq as usize,
                CqEntry {
                    h,
                    events: Vec::new(),
                    channel,
                    parent_domain,
                    _net,
                },
            );
            Err(refused("ibv_destroy_cq", libc::EBUSY, e))
        }
    }
}

/// `ibv_get_cq_event(channel, &cq, &cq_context)`: the next CQ notification of `channel`,
/// waiting for one (in `poll(2)` on the channel's fd, a cancellation point) unless the fd
/// is non-blocking; 0, or -1 + `errno` (`EINVAL` for a bad handle or NULL output,
/// `EAGAIN` when non-blocking and none is pending, `EINTR` when a signal ended the wait).
///
/// # Safety
/// `cq` and `cq_context` are NULL or writable pointers.
#[no_mangle]
pub unsafe extern "C-unwind" fn uroce_ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if cq.is_null() || cq_context.is_null() {
        report(&FfiError::Invalid(
            "ibv_get_cq_event: cq or cq_context is NULL",
        ));
        set_errno(libc::EINVAL);
        return -1;
    }
    blocking_call(-1, || {
        let r: Result<Option<Arc<CompChannel>>, FfiError> = (|| {
            let ch: Arc<CompChannel> = objects()
                .channels
                .get(&(channel as usize))
                .map(|e| Arc::clone(&e.ch))
                .ok_or(FfiError::BadHandle { what: "channel" })?;
            let Some(ev) = ch.try_get_cq_event() else {
                return Ok(Some(ch));
            };
            drop(ch);
            let mut objs = objects();
            let key = *objs
                .cq_by_id
                .get(&ev.cq().id())
                .ok_or(FfiError::BadHandle { what: "cq" })?;
            let entry = objs
                .cqs
                .get_mut(&key)
                .ok_or(FfiError::BadHandle { what: "cq" })?;
            // SAFETY: registered, live CQ allocated by uroce (lock held).
            let user = unsafe { (*entry.raw()).cq_context };
            entry.events.push(ev);
            // SAFETY: the caller passes writable output pointers (checked non-NULL).
            unsafe {
                cq.write(key as *mut ibv_cq);
                cq_context.write(user);
            }
            Ok(None)
        })();
        match r {
            Ok(None) => Attempt::Done(0),
            Ok(Some(ch)) => Attempt::Wait {
                fd: ch.fd().as_raw_fd(),
                keep: Box::new(ch),
            },
            Err(e) => {
                crate::entry::report(&e);
                set_errno(e.errno());
                Attempt::Done(-1)
            }
        }
    })
}

/// `ibv_ack_cq_events(cq, nevents)`: acknowledges events got for `cq` (unknown CQs and
/// surplus counts are ignored).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint) {
    guard((), || {
        let mut objs = objects();
        if let Some(entry) = objs.cqs.get_mut(&(cq as usize)) {
            let n = entry
                .events
                .len()
                .min(usize::try_from(nevents).unwrap_or(usize::MAX));
            entry.events.drain(..n);
            // SAFETY: registered, live CQ allocated by uroce (lock held).
            unsafe {
                let c = entry.raw();
                (*c).comp_events_completed = (*c).comp_events_completed.wrapping_add(nevents);
            }
        }
    })
}

/// `ibv_context.ops.poll_cq(cq, num_entries, wc)`: up to `num_entries` completions into
/// `wc`; the count, or -1 (unknown CQ, negative count, NULL array).
///
/// # Safety
/// `wc` is valid for writing `num_entries` `struct ibv_wc`.
pub unsafe extern "C" fn ops_poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard(-1, || {
        let Ok(n) = usize::try_from(num_entries) else {
            return -1;
        };
        if n == 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let Ok(cq) = cq_ref(cq) else {
            return -1;
        };
        // Through a stack buffer, so a poll allocates nothing; one call takes at most its
        // size (a program that asked for more polls again, as it must anyway).
        let mut buf = [WorkCompletion::default(); POLL_CHUNK];
        let room = buf.get_mut(..n.min(POLL_CHUNK)).unwrap_or_default();
        let got = cq.poll_into(room);
        for (i, w) in room.iter().take(got).enumerate() {
            // SAFETY: `i < got <= num_entries`, and the caller's array holds `num_entries`
            // writable entries.
            unsafe { wc.add(i).write(wc_to_c(w)) };
        }
        c_int::try_from(got).unwrap_or(c_int::MAX)
    })
}

/// Completions one `ibv_poll_cq` call returns at most (the stack buffer it fills).
const POLL_CHUNK: usize = 64;

/// `ibv_context.ops.req_notify_cq(cq, solicited_only)`: arms the CQ; 0 or the errno value.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected, never dereferenced.
pub unsafe extern "C" fn ops_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard(libc::EIO, || {
        errno_value(cq_ref(cq).and_then(|c: CqRef| {
            c.req_notify(solicited_only != 0)
                .map_err(|e| refused("ibv_req_notify_cq", libc::EINVAL, e))
        }))
    })
}

// ---------------------------------------------------------------------------------------
// Strings.
// ---------------------------------------------------------------------------------------

/// NUL-terminated descriptions of every completion status, indexed by ABI value.
static WC_STATUS_STR: LazyLock<Vec<CString>> = LazyLock::new(|| {
    let max = WcStatus::ALL.iter().map(|s| s.as_u32()).max().unwrap_or(0);
    (0..=max.max(IBV_WC_TM_RNDV_INCOMPLETE))
        .map(|v| {
            // The tag-matching statuses have no uroce counterpart (no tag matching).
            let text = match v {
                IBV_WC_TM_ERR => "TM error",
                IBV_WC_TM_RNDV_INCOMPLETE => "TM software rendezvous",
                _ => WcStatus::from_u32(v).map_or("unknown", WcStatus::as_str),
            };
            CString::new(text).unwrap_or_default()
        })
        .collect()
});

/// The text for unknown status values.
const UNKNOWN: &std::ffi::CStr = c"unknown";

/// `ibv_wc_status_str(status)`: a static description ("unknown" for unknown values).
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_wc_status_str(status: c_int) -> *const c_char {
    guard(UNKNOWN.as_ptr(), || {
        usize::try_from(status)
            .ok()
            .and_then(|i| WC_STATUS_STR.get(i))
            .map_or(UNKNOWN.as_ptr(), |s| s.as_ptr())
    })
}
