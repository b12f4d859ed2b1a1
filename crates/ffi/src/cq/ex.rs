//! Extended CQs: `ibv_create_cq_ex` (the `verbs_context.create_cq_ex` slot) and the
//! `ibv_cq_ex` polling API (`ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll` and the
//! `ibv_wc_read_*` accessors).
//!
//! Every uroce CQ is an `ibv_cq_ex` container (see `crate::handle`): `ibv_create_cq`
//! CQs too, so `ibv_cq_ex_to_cq` (a cast) and every `ibv_cq` call work on both. A poll
//! session holds the CQ's session lock from a successful `ibv_start_poll` to
//! `ibv_end_poll` (released at once when `ibv_start_poll` finds nothing, `ENOENT`), as
//! rdma-core's providers do, so that sessions of several threads do not mix; `ibv_poll_cq`
//! stays usable on the same CQ meanwhile (each completion is returned once, to one of
//! them). The session also counts as a call inside the container, so a destroy waits for
//! `ibv_end_poll`.
//!
//! Completion timestamps: `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` reads `CLOCK_MONOTONIC` in
//! ns — the device clock is a 1 GHz clock, `hca_core_clock` = 1 000 000 kHz in
//! `ibv_query_device_ex`, so cycles are ns — and `…_WALLCLOCK` reads `CLOCK_REALTIME` in ns,
//! each taken once per completion when the completion is generated (when the engine stores
//! it in the CQ, `uroce_verbs::CqRef::enable_timestamps`), only for a CQ that asked for it.
//!
//! What is refused, as rdma-core's rxe provider and the kernel's uverbs refuse it:
//! other `wc_flags` beyond `IBV_WC_STANDARD_FLAGS` (CVLAN, flow tag and tag-matching info)
//! with `EOPNOTSUPP`; unknown `comp_mask` bits with `EINVAL`; the `IGNORE_OVERRUN` flag or
//! unknown flags with `EOPNOTSUPP`. `IBV_CQ_INIT_ATTR_MASK_PD` names a parent domain (or
//! NULL) of the same context (see `crate::parent_domain`); anything else is `EINVAL`. `IBV_CREATE_CQ_ATTR_SINGLE_THREADED` is accepted (a
//! hint; the session lock is uncontended then). An accessor is only set for a field the
//! consumer asked for in `wc_flags` (the others stay NULL, as with rdma-core's providers);
//! `read_opcode`, `read_vendor_err` and `read_wc_flags` are always set.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_uint};
use std::sync::atomic::{AtomicBool, Ordering};

use uroce_verbs::{Clocks, CompletionStamp, WorkCompletion};

use crate::abi::*;
use crate::convert::wc_to_c;
use crate::entry::*;
use crate::error::FfiError;
use crate::handle::{Guard, Handle};
use crate::objects::CqKind;

/// The state of an `ibv_start_poll` … `ibv_end_poll` session of one CQ.
pub(crate) struct PollSession {
    /// Held from a successful `ibv_start_poll` to `ibv_end_poll`.
    lock: UnsafeCell<libc::pthread_mutex_t>,
    /// Whether a session is open (`ibv_end_poll` without one is ignored).
    active: AtomicBool,
    /// The current completion, in its C form (written only by the session's owner).
    cur: UnsafeCell<ibv_wc>,
    /// The current completion's timestamps (zero unless the CQ stamps).
    stamp: UnsafeCell<CompletionStamp>,
}

impl PollSession {
    /// No session.
    pub(crate) fn new() -> PollSession {
        PollSession {
            lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
            active: AtomicBool::new(false),
            // SAFETY: ibv_wc is integers only.
            cur: UnsafeCell::new(unsafe { crate::objects::zeroed() }),
            stamp: UnsafeCell::new(CompletionStamp::default()),
        }
    }
}

/// Completion fields uroce reports: those of `struct ibv_wc` (`IBV_WC_STANDARD_FLAGS`)
/// and both completion timestamps.
pub const SUPPORTED_WC_FLAGS: u64 = IBV_WC_STANDARD_FLAGS
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP
    | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

/// The clocks `wc_flags` asks each completion to be stamped with.
pub(crate) fn clocks(wc_flags: u64) -> Clocks {
    let mut c = Clocks::empty();
    if wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP != 0 {
        c |= Clocks::MONOTONIC;
    }
    if wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK != 0 {
        c |= Clocks::REALTIME;
    }
    c
}

/// Checks `ibv_cq_init_attr_ex` as rxe does; the supported `wc_flags` on success.
pub(crate) fn check_attr(a: &ibv_cq_init_attr_ex) -> Result<u64, FfiError> {
    if a.comp_mask & !(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) != 0 {
        return Err(FfiError::Invalid(
            "unknown ibv_cq_init_attr_ex comp_mask bits",
        ));
    }
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        return Err(FfiError::Unsupported(
            "wc_flags beyond IBV_WC_STANDARD_FLAGS and timestamps (CVLAN, flow tag, TM info)",
        ));
    }
    if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
        && a.flags & !IBV_CREATE_CQ_ATTR_SINGLE_THREADED != 0
    {
        return Err(FfiError::Unsupported(
            "CQ creation flags other than IBV_CREATE_CQ_ATTR_SINGLE_THREADED",
        ));
    }
    Ok(a.wc_flags)
}

/// Sets the polling functions and the accessors `wc_flags` asks for.
pub(crate) fn init_ops(c: &mut ibv_cq_ex, wc_flags: u64) {
    c.start_poll = Some(start_poll);
    c.next_poll = Some(next_poll);
    c.end_poll = Some(end_poll);
    c.read_opcode = Some(read_opcode);
    c.read_vendor_err = Some(read_vendor_err);
    c.read_wc_flags = Some(read_wc_flags);
    let has = |f: u64| wc_flags & f != 0;
    if has(IBV_WC_EX_WITH_BYTE_LEN) {
        c.read_byte_len = Some(read_byte_len);
    }
    if has(IBV_WC_EX_WITH_IMM) {
        c.read_imm_data = Some(read_imm_data);
    }
    if has(IBV_WC_EX_WITH_QP_NUM) {
        c.read_qp_num = Some(read_qp_num);
    }
    if has(IBV_WC_EX_WITH_SRC_QP) {
        c.read_src_qp = Some(read_src_qp);
    }
    if has(IBV_WC_EX_WITH_SLID) {
        c.read_slid = Some(read_slid);
    }
    if has(IBV_WC_EX_WITH_SL) {
        c.read_sl = Some(read_sl);
    }
    if has(IBV_WC_EX_WITH_DLID_PATH_BITS) {
        c.read_dlid_path_bits = Some(read_dlid_path_bits);
    }
    if has(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) {
        c.read_completion_ts = Some(read_completion_ts);
    }
    if has(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) {
        c.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
    }
}

/// `verbs_context.create_cq_ex(context, attr)`: an extended CQ; NULL + `errno`
/// (`EINVAL`, `EOPNOTSUPP`, `ENOMEM`).
///
/// # Safety
/// `attr` is NULL or points to a readable `struct ibv_cq_init_attr_ex`.
pub unsafe extern "C" fn vctx_create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            if attr.is_null() {
                return Err(FfiError::Invalid("cq_init_attr_ex is NULL"));
            }
            // SAFETY: caller guarantee: readable attr (checked non-NULL).
            let a = unsafe { attr.read() };
            let wc_flags = check_attr(&a)?;
            if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 && !a.parent_domain.is_null() {
                crate::parent_domain::check_parent_domain(context, a.parent_domain)?;
            }
            let cqe = c_int::try_from(a.cqe).map_err(|_| FfiError::Invalid("cqe too large"))?;
            let vector =
                c_int::try_from(a.comp_vector).map_err(|_| FfiError::Invalid("comp_vector"))?;
            // The parent domain is recorded with the CQ, which counts against its
            // deallocation (`crate::parent_domain`).
            let parent_domain = if a.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD != 0 {
                a.parent_domain
            } else {
                std::ptr::null_mut()
            };
            crate::cq::create_cq(
                context,
                cqe,
                a.cq_context,
                a.channel,
                vector,
                wc_flags,
                parent_domain,
            )
        })())
    })
}

/// Stores `w` as the session's current completion and publishes its status and wr_id.
///
/// # Safety
/// `cq` is the live container's C part and the caller owns the session.
unsafe fn set_current(
    cq: *mut ibv_cq_ex,
    s: &PollSession,
    w: &WorkCompletion,
    stamp: Option<CompletionStamp>,
) {
    let c = wc_to_c(w);
    // SAFETY: caller guarantee: the session's owner is the only writer of `cur` and of
    // the C struct's `status`/`wr_id`.
    unsafe {
        (*cq).status = c.status;
        (*cq).wr_id = c.wr_id;
        s.cur.get().write(c);
        s.stamp.get().write(stamp.unwrap_or_default());
    }
}

/// `ibv_start_poll(cq, attr)`: opens a session on the oldest completion; 0, `ENOENT`
/// when the CQ is empty (no session then: `ibv_end_poll` must not follow), `EINVAL` for
/// a bad CQ or a non-zero `attr->comp_mask`.
///
/// # Safety
/// `attr` is NULL or readable.
pub unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: caller guarantee: readable attr when non-NULL.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        let Some(g) = Handle::<CqKind>::enter(cq) else {
            return libc::EINVAL;
        };
        let h = g.handle();
        // SAFETY: the guard keeps the container live until it drops or is kept.
        let Some(b) = (unsafe { Handle::body_of(h) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the mutex lives in the live body (it does not move while counted in).
        unsafe { libc::pthread_mutex_lock(b.poll.lock.get()) };
        let Some((wc, stamp)) = b.cq.poll_stamped() else {
            // SAFETY: locked just above by this thread.
            unsafe { libc::pthread_mutex_unlock(b.poll.lock.get()) };
            return libc::ENOENT;
        };
        // SAFETY: this thread holds the session lock.
        unsafe { set_current(cq, &b.poll, &wc, stamp) };
        b.poll.active.store(true, Ordering::Release);
        // The session keeps the call counted in until `end_poll`.
        g.keep();
        0
    })
}

/// `ibv_next_poll(cq)`: moves the session to the next completion; 0 or `ENOENT`.
///
/// # Safety
/// None beyond the C contract (inside a session of this thread).
pub unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: inside a session, whose kept guard holds the container.
        let Some(b) = (unsafe { Handle::<CqKind>::peek(cq) }) else {
            return libc::EINVAL;
        };
        if !b.poll.active.load(Ordering::Acquire) {
            return libc::EINVAL;
        }
        let Some((wc, stamp)) = b.cq.poll_stamped() else {
            return libc::ENOENT;
        };
        // SAFETY: the session's owner (C contract).
        unsafe { set_current(cq, &b.poll, &wc, stamp) };
        0
    })
}

/// `ibv_end_poll(cq)`: closes the session (ignored without one).
///
/// # Safety
/// None beyond the C contract.
pub unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    guard((), || {
        // SAFETY: inside a session, whose kept guard holds the container.
        let Some(b) = (unsafe { Handle::<CqKind>::peek(cq) }) else {
            return;
        };
        if !b.poll.active.swap(false, Ordering::AcqRel) {
            return;
        }
        // SAFETY: the session's owner holds the lock (taken in start_poll).
        unsafe { libc::pthread_mutex_unlock(b.poll.lock.get()) };
        if let Some(h) = std::ptr::NonNull::new(cq.cast::<Handle<CqKind>>()) {
            // SAFETY: `start_poll` kept a guard of this container (the session was active,
            // checked above); this resumes and drops it, last: the body is not used after.
            drop(unsafe { Guard::<CqKind>::resume(h) });
        }
    })
}

/// The current completion of the session on `cq` (zeroes outside a session).
fn current(cq: *mut ibv_cq_ex) -> ibv_wc {
    // SAFETY: C contract: an accessor is called inside a session of this thread, whose
    // kept guard holds the container; the owner is the only writer of `cur`.
    match unsafe { Handle::<CqKind>::peek(cq) } {
        // SAFETY: as above: only the session's owner writes `cur`, and it is this thread.
        Some(b) if b.poll.active.load(Ordering::Acquire) => unsafe { b.poll.cur.get().read() },
        // SAFETY: ibv_wc is integers only.
        _ => unsafe { crate::objects::zeroed() },
    }
}

/// The current completion's timestamps (zeroes outside a session).
fn current_stamp(cq: *mut ibv_cq_ex) -> CompletionStamp {
    // SAFETY: as in `current`.
    match unsafe { Handle::<CqKind>::peek(cq) } {
        // SAFETY: as in `current`: only the session's owner writes `stamp`.
        Some(b) if b.poll.active.load(Ordering::Acquire) => unsafe { b.poll.stamp.get().read() },
        _ => CompletionStamp::default(),
    }
}

/// `ibv_wc_read_completion_ts`: when the completion was generated, in device clock cycles
/// (`CLOCK_MONOTONIC` ns: the device clock runs at 1 GHz).
///
/// # Safety
/// None beyond the C contract (inside a session of this thread).
pub unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    current_stamp(cq).monotonic_ns
}

/// `ibv_wc_read_completion_wallclock_ns`: when the completion was generated,
/// `CLOCK_REALTIME` ns since the Unix epoch.
///
/// # Safety
/// None beyond the C contract (inside a session of this thread).
pub unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    current_stamp(cq).realtime_ns
}

macro_rules! accessor {
    ($(#[$m:meta])* $name:ident -> $t:ty, |$w:ident| $e:expr) => {
        $(#[$m])*
        ///
        /// # Safety
        /// None beyond the C contract (inside a session of this thread).
        pub unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $t {
            let $w = current(cq);
            $e
        }
    };
}

accessor!(
    /// `ibv_wc_read_opcode`.
    read_opcode -> ibv_wc_opcode, |w| w.opcode
);
accessor!(
    /// `ibv_wc_read_vendor_err`.
    read_vendor_err -> u32, |w| w.vendor_err
);
accessor!(
    /// `ibv_wc_read_byte_len`.
    read_byte_len -> u32, |w| w.byte_len
);
accessor!(
    /// `ibv_wc_read_imm_data`: the immediate data (network order), or the invalidated
    /// rkey with `IBV_WC_WITH_INV`, as `ibv_wc.imm_data` carries them.
    read_imm_data -> u32, |w| w.imm_data
);
accessor!(
    /// `ibv_wc_read_qp_num`.
    read_qp_num -> u32, |w| w.qp_num
);
accessor!(
    /// `ibv_wc_read_src_qp`.
    read_src_qp -> u32, |w| w.src_qp
);
accessor!(
    /// `ibv_wc_read_wc_flags`.
    read_wc_flags -> c_uint, |w| w.wc_flags
);
accessor!(
    /// `ibv_wc_read_slid` (0 on RoCE).
    read_slid -> u32, |w| u32::from(w.slid)
);
accessor!(
    /// `ibv_wc_read_sl`.
    read_sl -> u8, |w| w.sl
);
accessor!(
    /// `ibv_wc_read_dlid_path_bits`.
    read_dlid_path_bits -> u8, |w| w.dlid_path_bits
);

#[cfg(test)]
mod tests {
    use super::*;

    fn attr() -> ibv_cq_init_attr_ex {
        // SAFETY: integers and raw pointers.
        unsafe { crate::objects::zeroed() }
    }

    #[test]
    fn attr_checks_follow_rxe() {
        let mut a = attr();
        a.wc_flags = IBV_WC_STANDARD_FLAGS;
        assert_eq!(check_attr(&a), Ok(IBV_WC_STANDARD_FLAGS));
        a.wc_flags |= IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
        assert!(check_attr(&a).is_ok());
        a.wc_flags |= IBV_WC_EX_WITH_CVLAN;
        assert_eq!(check_attr(&a).map_err(|e| e.errno()), Err(libc::EOPNOTSUPP));
        a.wc_flags = 0;
        a.comp_mask = 1 << 2;
        assert_eq!(check_attr(&a).map_err(|e| e.errno()), Err(libc::EINVAL));
        a.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
        a.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
        assert!(check_attr(&a).is_ok());
        a.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
        assert_eq!(check_attr(&a).map_err(|e| e.errno()), Err(libc::EOPNOTSUPP));
    }

    #[test]
    fn accessors_follow_wc_flags() {
        // SAFETY: integers, raw pointers, pthread objects and `Option` of fn pointers.
        let mut c: ibv_cq_ex = unsafe { crate::objects::zeroed() };
        init_ops(&mut c, IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM);
        assert!(c.read_byte_len.is_some() && c.read_qp_num.is_some());
        assert!(c.read_imm_data.is_none() && c.read_sl.is_none());
        assert!(c.read_opcode.is_some() && c.read_completion_ts.is_none());
        init_ops(&mut c, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
        assert!(c.read_completion_wallclock_ns.is_some());
        assert_eq!(
            clocks(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_BYTE_LEN),
            Clocks::MONOTONIC
        );
    }
}
