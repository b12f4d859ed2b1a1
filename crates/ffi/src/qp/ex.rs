//! The extended QP's work-request API: `ibv_qp_to_qp_ex` and the function pointers of
//! `struct ibv_qp_ex` that the header inlines `ibv_wr_start`, `ibv_wr_send`,
//! `ibv_wr_rdma_write`, …, `ibv_wr_set_sge_list`, `ibv_wr_complete`, `ibv_wr_abort` call.
//!
//! Every QP's handle container (see `crate::handle`) starts with an `ibv_qp_ex` whose first
//! member is the `ibv_qp` handed out, so `ibv_qp_to_qp_ex` returns the same address.
//! [`init_ops`] (called for every QP by `qp::register_qp`) fills its pointers: the
//! operations of `send_ops_flags` (`ibv_create_qp_ex` with
//! `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`; otherwise every operation the QP type can do, see
//! `supported_send_ops`) get the working functions, every other pointer a function that
//! records `EOPNOTSUPP` for `ibv_wr_complete` (no pointer is NULL, so a program calling an
//! operation it did not ask for gets an error rather than a crash).
//!
//! Building works as in rdma-core: `ibv_wr_start` opens a list; each operation call starts
//! a new work request with the `wr_id` and `wr_flags` the application stored in the
//! `ibv_qp_ex` just before; the setters (`ibv_wr_set_sge*`, `ibv_wr_set_inline_data*`,
//! `ibv_wr_set_ud_addr`, `ibv_wr_set_xrc_srqn`) complete the latest one. Inline data is
//! copied when it is set. The first error (an unknown handle, an operation the QP was not
//! created for, a setter without a work request, …) is kept; `ibv_wr_complete` then returns
//! it and posts nothing. Otherwise it posts the whole list through
//! `QpRef::post_send_all`, which checks every work request, the QP's state and the room in
//! the send queue before it queues the first: the list goes in whole, in order, or not at
//! all. `ibv_wr_abort` discards the list. The per-QP state is a `WrBuilder` in the QP's
//! container.
//!
//! No `ibv_wr_*` call takes the registry lock to find its QP: each one recovers the
//! container from the `ibv_qp_ex` pointer (`Handle::enter`: a magic check and an in-call
//! count, no lock) and holds it for the call; the builder's own mutex is per QP and
//! uncontended when the application serialises its calls on a QP, as the API requires.
//! `ibv_wr_set_ud_addr` recovers the address handle the same way, and `ibv_wr_complete`
//! posts through the container's `QpRef`. The one exception is `ibv_wr_bind_mw`, which
//! resolves the window and the region through their registries, as a BIND_MW work request
//! of `ibv_post_send` does.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use uroce_verbs::{
    AtomicInfo, QpRef, QpType, RdmaInfo, SendFlags, SendOpcode, SendWr, SgList, Sge, UdDest,
};

use crate::abi::*;
use crate::entry::{guard, report, set_errno};
use crate::error::FfiError;
use crate::handle::Handle;
use crate::objects::{AhKind, QpBody, QpKind};

/// Most SGEs or inline buffers one setter call copies (bounds the copy of an absurd count).
const MAX_LIST: usize = 1 << 16;
/// Most work requests one `ibv_wr_start` … `ibv_wr_complete` list holds.
const MAX_WRS: usize = 1 << 20;

/// The `ibv_wr_*` operations uroce executes on a QP of type `t` (`IBV_QP_EX_WITH_*`): RC
/// every operation but TSO (raw packet QPs only), IBA 1.5 ATOMIC WRITE included; XRC_SEND
/// the same but ATOMIC WRITE (the XRC opcode space has none); UC SEND and RDMA WRITE with
/// and without immediate data, BIND_MW and LOCAL_INV (UC has no READ, atomics or SEND
/// with Invalidate); UD SEND with and without immediate data; nothing on an XRC_RECV QP
/// (it has no send queue). (rdma-core 44 has no FLUSH in its API.)
pub(crate) fn supported_send_ops(t: QpType) -> u64 {
    let send = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    let write = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    let rc_xrc = send
        | write
        | IBV_QP_EX_WITH_RDMA_READ
        | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
        | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        | IBV_QP_EX_WITH_LOCAL_INV
        | IBV_QP_EX_WITH_BIND_MW
        | IBV_QP_EX_WITH_SEND_WITH_INV;
    match t {
        QpType::Rc => rc_xrc | IBV_QP_EX_WITH_ATOMIC_WRITE,
        QpType::XrcSend => rc_xrc,
        QpType::Uc => send | write | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW,
        QpType::Ud | QpType::Gsi => send,
        _ => 0,
    }
}

/// Checks `send_ops_flags` of `ibv_create_qp_ex` against what a QP of type `t` can do.
pub(crate) fn check_send_ops(t: QpType, flags: u64) -> Result<(), FfiError> {
    let extra = flags & !supported_send_ops(t);
    if extra == 0 {
        return Ok(());
    }
    Err(FfiError::Refused {
        op: "ibv_create_qp_ex",
        errno: libc::EOPNOTSUPP,
        reason: format!(
            "send_ops_flags {extra:#x} name operations a {t:?} QP of uroce cannot do \
             (it can do {:#x})",
            supported_send_ops(t)
        ),
    })
}

/// The list being built between `ibv_wr_start` and `ibv_wr_complete` / `ibv_wr_abort`.
#[derive(Default)]
struct Building {
    /// Between `ibv_wr_start` and `ibv_wr_complete` / `ibv_wr_abort`.
    started: bool,
    /// The work requests so far; the setters change the last one.
    wrs: Vec<SendWr>,
    /// The first error; nothing is posted when set.
    error: Option<FfiError>,
}

/// One QP's `ibv_wr_*` builder state (see the module doc).
#[derive(Default)]
pub(crate) struct WrBuilder {
    state: Mutex<Building>,
    /// The QP type, for the setters that only one type takes.
    qp_type: Option<QpType>,
}

impl WrBuilder {
    /// The builder of a QP of type `t`.
    pub(crate) fn new(t: QpType) -> WrBuilder {
        WrBuilder {
            state: Mutex::new(Building::default()),
            qp_type: Some(t),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Building> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Building {
    /// Keeps the first error (reported when `ibv_wr_complete` returns it).
    fn fail(&mut self, e: FfiError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// The work request the setters apply to, if building is going fine.
    fn current(&mut self) -> Option<&mut SendWr> {
        if self.error.is_some() {
            return None;
        }
        if self.wrs.is_empty() {
            self.fail(FfiError::Invalid(
                "ibv_wr_set_* called before an ibv_wr_<operation> call",
            ));
            return None;
        }
        self.wrs.last_mut()
    }
}

/// Fills the function pointers of `qpx` (see the module doc): the operations of
/// `send_ops_flags` work, the others record `EOPNOTSUPP`.
pub fn init_ops(qpx: &mut ibv_qp_ex, send_ops_flags: u64) {
    let on = |bit: u64| send_ops_flags & bit != 0;
    qpx.wr_atomic_cmp_swp = Some(if on(IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP) {
        wr_atomic_cmp_swp::<true>
    } else {
        wr_atomic_cmp_swp::<false>
    });
    qpx.wr_atomic_fetch_add = Some(if on(IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) {
        wr_atomic_fetch_add::<true>
    } else {
        wr_atomic_fetch_add::<false>
    });
    qpx.wr_bind_mw = Some(if on(IBV_QP_EX_WITH_BIND_MW) {
        wr_bind_mw::<true>
    } else {
        wr_bind_mw::<false>
    });
    qpx.wr_local_inv = Some(if on(IBV_QP_EX_WITH_LOCAL_INV) {
        wr_local_inv::<true>
    } else {
        wr_local_inv::<false>
    });
    qpx.wr_rdma_read = Some(if on(IBV_QP_EX_WITH_RDMA_READ) {
        wr_rdma_read::<true>
    } else {
        wr_rdma_read::<false>
    });
    qpx.wr_rdma_write = Some(if on(IBV_QP_EX_WITH_RDMA_WRITE) {
        wr_rdma_write::<true>
    } else {
        wr_rdma_write::<false>
    });
    qpx.wr_rdma_write_imm = Some(if on(IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) {
        wr_rdma_write_imm::<true>
    } else {
        wr_rdma_write_imm::<false>
    });
    qpx.wr_send = Some(if on(IBV_QP_EX_WITH_SEND) {
        wr_send::<true>
    } else {
        wr_send::<false>
    });
    qpx.wr_send_imm = Some(if on(IBV_QP_EX_WITH_SEND_WITH_IMM) {
        wr_send_imm::<true>
    } else {
        wr_send_imm::<false>
    });
    qpx.wr_send_inv = Some(if on(IBV_QP_EX_WITH_SEND_WITH_INV) {
        wr_send_inv::<true>
    } else {
        wr_send_inv::<false>
    });
    qpx.wr_send_tso = Some(wr_send_tso);
    qpx.wr_atomic_write = Some(if on(IBV_QP_EX_WITH_ATOMIC_WRITE) {
        wr_atomic_write::<true>
    } else {
        wr_atomic_write::<false>
    });
    qpx.wr_set_ud_addr = Some(wr_set_ud_addr);
    qpx.wr_set_xrc_srqn = Some(wr_set_xrc_srqn);
    qpx.wr_set_inline_data = Some(wr_set_inline_data);
    qpx.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    qpx.wr_set_sge = Some(wr_set_sge);
    qpx.wr_set_sge_list = Some(wr_set_sge_list);
    qpx.wr_start = Some(wr_start);
    qpx.wr_complete = Some(wr_complete);
    qpx.wr_abort = Some(wr_abort);
}

/// Runs `f` on the container body of the QP at `qpx` (its builder and `QpRef`), recovered
/// from the pointer without a lock and counted in for the call (see `crate::handle`). A
/// pointer that is not a live QP is reported and ignored (`None`).
fn with_qp<R>(qpx: *mut ibv_qp_ex, f: impl FnOnce(&QpBody) -> R) -> Option<R> {
    let g = Handle::<QpKind>::enter(qpx);
    match g.as_ref().and_then(|g| g.body()) {
        Some(b) => Some(f(b)),
        None => {
            report(&FfiError::BadHandle { what: "qp" });
            None
        }
    }
}

/// Starts a new work request with opcode `op` (`ENABLED`: the QP was created for it) and
/// lets `fill` set its operation fields.
fn new_wr<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    op: SendOpcode,
    fill: impl FnOnce(&mut SendWr) -> Result<(), FfiError>,
) {
    guard((), || {
        with_qp(qpx, |body| {
            let mut st = body.builder.lock();
            if !st.started {
                report(&FfiError::Invalid(
                    "ibv_wr_<operation> outside ibv_wr_start",
                ));
                return;
            }
            if st.error.is_some() {
                return;
            }
            if !ENABLED {
                st.fail(FfiError::Refused {
                    op: "ibv_wr_complete",
                    errno: libc::EOPNOTSUPP,
                    reason: format!(
                        "{op:?} is not among the QP's send_ops_flags (or not supported)"
                    ),
                });
                return;
            }
            if st.wrs.len() >= MAX_WRS {
                st.fail(FfiError::Invalid("too many work requests in one list"));
                return;
            }
            // SAFETY: `qpx` is the C part of the live container `with_qp` counted in
            // (never freed); the application wrote `wr_id` and `wr_flags` before this
            // call, and does not write them concurrently (the ibv_wr_* calls on one QP are
            // serialised by the application, as in rdma-core).
            let (wr_id, wr_flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
            let Some(flags) = SendFlags::from_bits(wr_flags) else {
                st.fail(FfiError::Invalid("unknown bits in wr_flags"));
                return;
            };
            // Inline data comes only through ibv_wr_set_inline_data*, which sets the flag.
            let mut wr = SendWr {
                wr_id,
                opcode: op,
                flags: flags - SendFlags::INLINE,
                ..SendWr::default()
            };
            match fill(&mut wr) {
                Ok(()) => st.wrs.push(wr),
                Err(e) => st.fail(e),
            }
        });
    })
}

/// A setter on the latest work request.
fn set<F>(qpx: *mut ibv_qp_ex, f: F)
where
    F: FnOnce(&mut SendWr, Option<QpType>) -> Result<(), FfiError>,
{
    guard((), || {
        with_qp(qpx, |body| {
            let b = &body.builder;
            let mut st = b.lock();
            if !st.started {
                report(&FfiError::Invalid("ibv_wr_set_* outside ibv_wr_start"));
                return;
            }
            let t = b.qp_type;
            let r = match st.current() {
                Some(wr) => f(wr, t),
                None => return,
            };
            if let Err(e) = r {
                st.fail(e);
            }
        });
    })
}

unsafe extern "C" fn wr_atomic_cmp_swp<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    new_wr::<ENABLED>(qpx, SendOpcode::AtomicCmpAndSwp, |w| {
        w.atomic = AtomicInfo {
            remote_addr,
            compare_add: compare,
            swap,
            rkey,
        };
        Ok(())
    })
}

unsafe extern "C" fn wr_atomic_fetch_add<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    new_wr::<ENABLED>(qpx, SendOpcode::AtomicFetchAndAdd, |w| {
        w.atomic = AtomicInfo {
            remote_addr,
            compare_add: add,
            swap: 0,
            rkey,
        };
        Ok(())
    })
}

/// `ibv_wr_bind_mw(qpx, mw, rkey, bind_info)`: binds type 2 window `mw` with the new key
/// `rkey` (as an `IBV_WR_BIND_MW` work request).
///
/// # Safety
/// `bind_info` is NULL or readable.
unsafe extern "C" fn wr_bind_mw<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    bind_info: *const ibv_mw_bind_info,
) {
    // Converted before the QP's container is entered: the conversion looks the window and
    // the region up in their registries (the one exception to the lock-free path, as for
    // a BIND_MW work request of `ibv_post_send`).
    let conv = guard(Err(FfiError::Invalid("panic")), || {
        if bind_info.is_null() {
            return Err(FfiError::Invalid("bind_info is NULL"));
        }
        // SAFETY: caller guarantee: a non-NULL bind_info is readable (plain data; its
        // `mr` is only looked up in the registry).
        let info = unsafe { *bind_info };
        let b = ibv_send_wr_bind_mw {
            mw,
            rkey,
            bind_info: info,
        };
        crate::mw::bind_mw_wr_from_c(&b)
    });
    new_wr::<ENABLED>(qpx, SendOpcode::BindMw, |w| {
        w.bind_mw = Some(conv?);
        Ok(())
    })
}

unsafe extern "C" fn wr_local_inv<const ENABLED: bool>(qpx: *mut ibv_qp_ex, rkey: u32) {
    new_wr::<ENABLED>(qpx, SendOpcode::LocalInv, |w| {
        w.invalidate_rkey = rkey;
        Ok(())
    })
}

unsafe extern "C" fn wr_rdma_read<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
) {
    new_wr::<ENABLED>(qpx, SendOpcode::RdmaRead, |w| {
        w.rdma = RdmaInfo { remote_addr, rkey };
        Ok(())
    })
}

unsafe extern "C" fn wr_rdma_write<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
) {
    new_wr::<ENABLED>(qpx, SendOpcode::RdmaWrite, |w| {
        w.rdma = RdmaInfo { remote_addr, rkey };
        Ok(())
    })
}

/// `imm_data` is in network byte order (`__be32`), as in `ibv_send_wr`.
unsafe extern "C" fn wr_rdma_write_imm<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    new_wr::<ENABLED>(qpx, SendOpcode::RdmaWriteWithImm, |w| {
        w.rdma = RdmaInfo { remote_addr, rkey };
        w.imm_data = u32::from_be(imm_data);
        Ok(())
    })
}

unsafe extern "C" fn wr_send<const ENABLED: bool>(qpx: *mut ibv_qp_ex) {
    new_wr::<ENABLED>(qpx, SendOpcode::Send, |_| Ok(()))
}

/// `imm_data` is in network byte order (`__be32`), as in `ibv_send_wr`.
unsafe extern "C" fn wr_send_imm<const ENABLED: bool>(qpx: *mut ibv_qp_ex, imm_data: u32) {
    new_wr::<ENABLED>(qpx, SendOpcode::SendWithImm, |w| {
        w.imm_data = u32::from_be(imm_data);
        Ok(())
    })
}

unsafe extern "C" fn wr_send_inv<const ENABLED: bool>(qpx: *mut ibv_qp_ex, rkey: u32) {
    new_wr::<ENABLED>(qpx, SendOpcode::SendWithInv, |w| {
        w.invalidate_rkey = rkey;
        Ok(())
    })
}

/// TSO is for raw packet QPs, which uroce does not have: `EOPNOTSUPP` at complete.
unsafe extern "C" fn wr_send_tso(qpx: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    new_wr::<false>(qpx, SendOpcode::Tso, |_| Ok(()))
}

/// `ibv_wr_atomic_write(qpx, rkey, remote_addr, atomic_wr)`: IBA 1.5 ATOMIC WRITE of the 8
/// bytes at `atomic_wr` (copied now, in their order) to `remote_addr` (8-byte aligned, or
/// the target answers with an invalid-request NAK: `IBV_WC_REM_INV_REQ_ERR`). The bytes
/// travel with the work request as its inline payload, whatever `max_inline_data` is; a
/// later `ibv_wr_set_sge*` / `ibv_wr_set_inline_data*` replaces them, and must then
/// describe exactly 8 bytes (`EINVAL` at complete otherwise).
///
/// # Safety
/// `atomic_wr` is NULL or readable for 8 bytes.
unsafe extern "C" fn wr_atomic_write<const ENABLED: bool>(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    atomic_wr: *const c_void,
) {
    new_wr::<ENABLED>(qpx, SendOpcode::AtomicWrite, |w| {
        w.rdma = RdmaInfo { remote_addr, rkey };
        let mut data = Vec::with_capacity(8);
        // SAFETY: caller guarantee: a non-NULL atomic_wr is readable for 8 bytes
        // (`copy_inline` refuses NULL).
        unsafe { copy_inline(&mut data, atomic_wr, 8)? };
        put_inline(w, data);
        Ok(())
    })
}

/// `ibv_wr_set_ud_addr(qpx, ah, remote_qpn, remote_qkey)`: the destination of the latest
/// work request of a UD QP (`ah` must be a live address handle).
unsafe extern "C" fn wr_set_ud_addr(
    qpx: *mut ibv_qp_ex,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    set(qpx, |w, t| {
        if !matches!(t, Some(QpType::Ud | QpType::Gsi)) {
            return Err(FfiError::Invalid(
                "ibv_wr_set_ud_addr on a QP that is not UD",
            ));
        }
        // The AH is a handle container too: recovered without a lock, and its counted
        // reference kept in the work request.
        let bad = FfiError::BadHandle { what: "ah" };
        let g = Handle::<AhKind>::enter(ah).ok_or(bad.clone())?;
        let a = g.body().ok_or(bad)?;
        w.ud = Some(UdDest {
            ah: a.reference(),
            remote_qpn: remote_qpn & 0x00ff_ffff,
            remote_qkey,
        });
        Ok(())
    })
}

/// `ibv_wr_set_xrc_srqn(qpx, remote_srqn)`: the target SRQ of the latest work request of
/// an XRC_SEND QP.
unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, remote_srqn: u32) {
    set(qpx, |w, t| {
        if t != Some(QpType::XrcSend) {
            return Err(FfiError::Invalid(
                "ibv_wr_set_xrc_srqn on a QP that is not XRC_SEND",
            ));
        }
        w.xrc_remote_srqn = remote_srqn;
        Ok(())
    })
}

/// Copies `length` bytes at `addr` into `out`.
///
/// # Safety
/// `addr` is readable for `length` bytes when `length > 0`.
unsafe fn copy_inline(
    out: &mut Vec<u8>,
    addr: *const c_void,
    length: usize,
) -> Result<(), FfiError> {
    if length == 0 {
        return Ok(());
    }
    if addr.is_null() {
        return Err(FfiError::Invalid("inline data address is NULL"));
    }
    if length > isize::MAX as usize || out.len().saturating_add(length) > (1 << 30) {
        return Err(FfiError::Invalid("inline data too long"));
    }
    // SAFETY: caller guarantee: `length` readable bytes at `addr` (non-NULL, checked);
    // copied now, never referenced afterwards.
    out.extend_from_slice(unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), length) });
    Ok(())
}

/// Makes `w` carry `data` inline (the QP's `max_inline_data` is checked at complete,
/// except for an ATOMIC WRITE's 8 bytes).
fn put_inline(w: &mut SendWr, data: Vec<u8>) {
    w.flags |= SendFlags::INLINE;
    w.sg_list.clear();
    w.inline_data = data.into();
}

/// `ibv_wr_set_inline_data(qpx, addr, length)`: the payload, copied now.
///
/// # Safety
/// `addr` is readable for `length` bytes.
unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    set(qpx, |w, _| {
        let mut data = Vec::new();
        // SAFETY: caller guarantee on addr/length.
        unsafe { copy_inline(&mut data, addr, length)? };
        put_inline(w, data);
        Ok(())
    })
}

/// `ibv_wr_set_inline_data_list(qpx, num_buf, buf_list)`: the payload gathered from
/// `num_buf` buffers, copied now.
///
/// # Safety
/// `buf_list` holds `num_buf` readable entries, each describing readable memory.
unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    num_buf: usize,
    buf_list: *const ibv_data_buf,
) {
    set(qpx, |w, _| {
        if num_buf > MAX_LIST {
            return Err(FfiError::Invalid("num_buf too large"));
        }
        let mut data = Vec::new();
        if num_buf > 0 {
            if buf_list.is_null() {
                return Err(FfiError::Invalid("buf_list is NULL"));
            }
            // SAFETY: caller guarantee: `num_buf` readable entries (non-NULL, checked).
            let bufs = unsafe { std::slice::from_raw_parts(buf_list, num_buf) };
            for b in bufs {
                // SAFETY: caller guarantee: each entry describes readable memory.
                unsafe { copy_inline(&mut data, b.addr, b.length)? };
            }
        }
        put_inline(w, data);
        Ok(())
    })
}

/// `ibv_wr_set_sge(qpx, lkey, addr, length)`: one local buffer.
unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set(qpx, |w, _| {
        w.flags -= SendFlags::INLINE;
        w.inline_data.clear();
        w.sg_list = vec![Sge { addr, length, lkey }].into();
        Ok(())
    })
}

/// `ibv_wr_set_sge_list(qpx, num_sge, sg_list)`: the local buffers (copied now).
///
/// # Safety
/// `sg_list` holds `num_sge` readable entries.
unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, num_sge: usize, sg_list: *const ibv_sge) {
    set(qpx, |w, _| {
        if num_sge > MAX_LIST {
            return Err(FfiError::Invalid("num_sge too large"));
        }
        let list = if num_sge == 0 {
            SgList::new()
        } else {
            if sg_list.is_null() {
                return Err(FfiError::Invalid("sg_list is NULL"));
            }
            // SAFETY: caller guarantee: `num_sge` readable entries (non-NULL, checked).
            unsafe { std::slice::from_raw_parts(sg_list, num_sge) }
                .iter()
                .map(|s| Sge {
                    addr: s.addr,
                    length: s.length,
                    lkey: s.lkey,
                })
                .collect()
        };
        w.flags -= SendFlags::INLINE;
        w.inline_data.clear();
        w.sg_list = list;
        Ok(())
    })
}

/// `ibv_wr_start(qpx)`: opens a new list (a list still open is discarded).
unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    guard((), || {
        with_qp(qpx, |body| {
            *body.builder.lock() = Building {
                started: true,
                ..Building::default()
            };
        });
    })
}

/// `ibv_wr_abort(qpx)`: discards the list; nothing is posted.
unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    guard((), || {
        with_qp(qpx, |body| {
            *body.builder.lock() = Building::default();
        });
    })
}

/// `ibv_wr_complete(qpx)`: posts the list in order, all or nothing; 0, or the errno value
/// of the first error (recorded while building, or the verbs layer's refusal of a work
/// request: `EINVAL`, `ENOMEM` for a send queue without room for the whole list,
/// `EOPNOTSUPP` for an operation the QP was not created for).
unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        // One lock-free recovery: the list and a counted reference to the QP, which
        // posts it after the container is left (as `ibv_post_send` does).
        let taken = with_qp(qpx, |body| {
            (
                std::mem::take(&mut *body.builder.lock()),
                QpRef::clone(&body.qp),
            )
        });
        let r = match taken {
            None => Err(FfiError::BadHandle { what: "qp" }),
            Some((st, _)) if !st.started => {
                Err(FfiError::Invalid("ibv_wr_complete without ibv_wr_start"))
            }
            Some((Building { error: Some(e), .. }, _)) => Err(e),
            Some((st, q)) => q.post_send_all(st.wrs).map_err(|e| {
                let errno = match e.error {
                    uroce_verbs::PostError::QueueFull { .. } => libc::ENOMEM,
                    _ => libc::EINVAL,
                };
                FfiError::Refused {
                    op: "ibv_wr_complete",
                    errno,
                    reason: e.to_string(),
                }
            }),
        };
        match r {
            Ok(()) => 0,
            Err(e) => {
                report(&e);
                set_errno(e.errno());
                e.errno()
            }
        }
    })
}

/// `ibv_qp_to_qp_ex(qp)` (IBVERBS_1.6): the `ibv_qp_ex` around `qp` (the same address),
/// or NULL + `EINVAL` for a pointer that is not a live QP (checked through its handle
/// container, without a lock).
pub(crate) fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    let live = Handle::<QpKind>::enter(qp.cast::<ibv_qp_ex>())
        .map(|g| Handle::c_ptr(g.handle()))
        .ok_or(FfiError::BadHandle { what: "qp" });
    guard(std::ptr::null_mut(), || match live {
        Ok(p) => p,
        Err(e) => {
            report(&e);
            set_errno(e.errno());
            std::ptr::null_mut()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_ops_follow_the_transport() {
        let rc = supported_send_ops(QpType::Rc);
        assert_ne!(rc & IBV_QP_EX_WITH_ATOMIC_WRITE, 0);
        let xrc = supported_send_ops(QpType::XrcSend);
        assert_eq!(xrc & IBV_QP_EX_WITH_ATOMIC_WRITE, 0);
        assert_eq!(rc & IBV_QP_EX_WITH_TSO, 0);
        assert_ne!(rc & IBV_QP_EX_WITH_BIND_MW, 0);
        assert_eq!(rc & !IBV_QP_EX_WITH_ATOMIC_WRITE, xrc);
        assert!(check_send_ops(QpType::Uc, IBV_QP_EX_WITH_RDMA_WRITE).is_ok());
        assert!(check_send_ops(QpType::Uc, IBV_QP_EX_WITH_BIND_MW).is_ok());
        let e = check_send_ops(QpType::Uc, IBV_QP_EX_WITH_RDMA_READ).unwrap_err();
        assert_eq!(e.errno(), libc::EOPNOTSUPP);
        assert!(check_send_ops(QpType::Ud, IBV_QP_EX_WITH_RDMA_WRITE).is_err());
        assert!(check_send_ops(QpType::Ud, IBV_QP_EX_WITH_SEND_WITH_IMM).is_ok());
        assert!(check_send_ops(QpType::Rc, IBV_QP_EX_WITH_ATOMIC_WRITE).is_ok());
        assert!(check_send_ops(QpType::XrcSend, IBV_QP_EX_WITH_ATOMIC_WRITE).is_err());
        assert!(check_send_ops(QpType::Uc, IBV_QP_EX_WITH_ATOMIC_WRITE).is_err());
        assert!(check_send_ops(QpType::Rc, IBV_QP_EX_WITH_TSO).is_err());
        assert!(check_send_ops(QpType::XrcRecv, IBV_QP_EX_WITH_SEND).is_err());
    }

    /// The `ibv_wr_*` calls find their QP through its container alone: they run to the end
    /// while another thread holds the registry lock (a call that took it would block until
    /// the timeout), and a retired container is refused.
    #[test]
    fn wr_calls_never_take_the_registry_lock() {
        use std::sync::mpsc;
        use std::time::Duration;
        use uroce_verbs::{Context, Device, DeviceConfig, QpCap, QpInitAttr};

        let addr = "10.1.2.44".parse().expect("address");
        let dev = Device::new(DeviceConfig::new("uroce-wrtest", addr)).expect("device");
        let ctx = Context::open(&dev).expect("context");
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx.create_cq(16, None, 0).expect("cq");
        let cap = QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
            .expect("qp");
        // SAFETY: ibv_qp_ex is pointers, integers, pthread objects and Option<fn>, all
        // valid zeroed.
        let mut c: ibv_qp_ex = unsafe { crate::objects::zeroed() };
        init_ops(&mut c, IBV_QP_EX_WITH_SEND);
        let body = QpBody {
            qp,
            builder: WrBuilder::new(QpType::Rc),
            max_inline: 0,
        };
        let h = Handle::<QpKind>::create(c, body);
        let qpx = Handle::c_ptr(h) as usize;
        let built = |q: *mut ibv_qp_ex| {
            let g = Handle::<QpKind>::enter(q).expect("live");
            let b = g.body().expect("body");
            let st = b.builder.lock();
            (st.started, st.wrs.len())
        };

        let registry = crate::objects::objects();
        let (tx, rx) = mpsc::channel();
        let worker = std::thread::spawn(move || {
            let q = qpx as *mut ibv_qp_ex;
            // SAFETY: `q` is the live container's `ibv_qp_ex`, whose pointers `init_ops`
            // filled; the calls are this thread's only use of it.
            let results = unsafe {
                let x = &*q;
                let (start, complete) = (x.wr_start.expect("set"), x.wr_complete.expect("set"));
                // An operation outside send_ops_flags: the list fails with EOPNOTSUPP.
                start(q);
                x.wr_rdma_write.expect("set")(q, 1, 0x1000);
                let disabled = complete(q);
                // A SEND with one SGE is built in the container; the QP is in RESET, so
                // the verbs layer refuses the post (EINVAL) and the list is consumed.
                start(q);
                (*q).wr_id = 7;
                (*q).wr_flags = IBV_SEND_SIGNALED;
                x.wr_send.expect("set")(q);
                x.wr_set_sge.expect("set")(q, 1, 0x2000, 8);
                let during = built(q);
                let in_reset = complete(q);
                (disabled, during, in_reset, built(q))
            };
            tx.send(results).expect("send");
        });
        let r = rx.recv_timeout(Duration::from_secs(10));
        drop(registry);
        worker.join().expect("worker");
        let (disabled, during, in_reset, after) =
            r.expect("the ibv_wr_* calls waited for the registry lock");
        assert_eq!(disabled, libc::EOPNOTSUPP);
        assert_eq!(during, (true, 1), "the SEND was not built in the container");
        assert_eq!(in_reset, libc::EINVAL);
        assert_eq!(after, (false, 0), "ibv_wr_complete left the list in place");

        // SAFETY: created above and registered nowhere else.
        let body = unsafe { Handle::retire(h) }.expect("retire");
        let q = qpx as *mut ibv_qp_ex;
        // SAFETY: a retired container stays readable (type-stable); its C part still holds
        // the functions, which must now refuse the handle.
        let rc = unsafe {
            let x = &*q;
            x.wr_start.expect("set")(q);
            x.wr_complete.expect("set")(q)
        };
        assert_eq!(rc, libc::EINVAL, "a retired QP was used");
        assert!(qp_to_qp_ex(q.cast()).is_null());
        body.qp.destroy().map_err(|(_, e)| e).expect("destroy qp");
        // SAFETY: retired above, not revived.
        unsafe { Handle::recycle(h) };
    }

    #[test]
    fn init_ops_leaves_no_pointer_null_and_disabled_ops_differ() {
        // SAFETY: ibv_qp_ex is pointers, integers, pthread objects and Option<fn>, all
        // valid zeroed.
        let mut a: ibv_qp_ex = unsafe { crate::objects::zeroed() };
        // SAFETY: as above.
        let mut b: ibv_qp_ex = unsafe { crate::objects::zeroed() };
        init_ops(&mut a, supported_send_ops(QpType::Rc));
        init_ops(&mut b, IBV_QP_EX_WITH_SEND);
        assert!(a.wr_send.is_some() && a.wr_complete.is_some() && a.wr_atomic_write.is_some());
        assert_eq!(a.wr_send.map(|f| f as usize), b.wr_send.map(|f| f as usize));
        assert_ne!(
            a.wr_rdma_write.map(|f| f as usize),
            b.wr_rdma_write.map(|f| f as usize)
        );
    }
}
