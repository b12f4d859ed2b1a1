//! The process-wide registry of the verbs objects handed out to C callers (protection
//! domains, memory regions, completion channels, CQs, SRQs, QPs, AHs), the handle kinds of
//! the objects the data path reaches without it, and the conversions between the C
//! work-request / completion / attribute structures and uroce-verbs' types.
//!
//! PDs, MRs and channels are heap C structures (`CBox`) registered by address with the
//! uroce object behind them; a pointer an application hands back is only dereferenced after
//! it was found in the registry. A PD or MR is an object of its device file (see
//! `crate::import`) that one or more C handles name: the `ibv_pd` / `ibv_mr` of its
//! allocation and those of `ibv_import_pd` / `ibv_import_mr`, all with the object's
//! handle number. `ibv_dealloc_pd` / `ibv_dereg_mr` through any handle destroys the object
//! (the other handles then name nothing: refused with `EINVAL`), `ibv_unimport_*` frees
//! one handle and leaves the object. QPs, CQs, SRQs and AHs live in handle containers (see
//! `crate::handle`): the data path (`qp_ref`, `cq_ref`, `srq_ref`, a UD WR's AH)
//! recovers them from the pointer without the registry lock, which stays for the control
//! path (create/destroy, the CQ-id → handle map of completion events). The registry lock is
//! never held across a blocking call (waiting for a CQ event, destroying an object that
//! waits for its references to drain).

use std::collections::HashMap;
use std::io::Write as _;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use uroce_net::NetDevice;
use uroce_verbs::UdDest;
use uroce_verbs::{
    AccessFlags, Ah, AhAttr, AtomicInfo, CompChannel, Cq, CqEvent, CqRef, Gid, Mr, PathMigState,
    Pd, Qp, QpAttr, QpCap, QpRef, QpState, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, Sge,
    Srq, SrqRef, WorkCompletion,
};
use uroce_verbs::{AttrMask, WcFlags};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

use crate::abi::*;
use crate::error::FfiError;
use crate::handle::{Handle, HandlePtr, Kind};

/// A C structure allocated by uroce (`Box::into_raw`), freed when this owner is dropped.
/// The address is what the application holds; uroce only touches it through the raw
/// pointer, never through a Rust reference that outlives a call.
pub(crate) struct CBox<T>(NonNull<T>);

// SAFETY: the pointee is plain C data (integers, raw pointers, pthread objects) that is
// only accessed while the registry lock is held or by the owning application; moving the
// owner between threads moves no data.
unsafe impl<T> Send for CBox<T> {}

impl<T> CBox<T> {
    /// Moves `v` to the heap.
    pub(crate) fn new(v: T) -> CBox<T> {
        CBox(NonNull::from(Box::leak(Box::new(v))))
    }

    /// The address handed to the application.
    pub(crate) fn ptr(&self) -> *mut T {
        self.0.as_ptr()
    }
}

impl<T> Drop for CBox<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `CBox::new` and is owned by exactly
        // this `CBox`, which is dropped once.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// Returns a zero-initialised C object.
///
/// # Safety
/// Every field of `T` must be valid when all its bytes are zero (integers, raw pointers,
/// `Option` of function pointers, glibc `pthread_mutex_t`/`pthread_cond_t`, whose zero
/// bytes are their static initialisers).
pub(crate) unsafe fn zeroed<T>() -> T {
    // SAFETY: forwarded caller guarantee.
    unsafe { std::mem::zeroed() }
}

/// What identifies a PD or MR object: its device file and its handle number (the `handle`
/// field of every C handle of it, what `ibv_import_pd` / `ibv_import_mr` take).
pub(crate) type ObjKey = (u64, u32);

/// A protection domain object.
pub(crate) struct PdEntry {
    pub(crate) pd: Pd,
    /// Keeps the network device (and its context) alive while the PD exists.
    pub(crate) net: Arc<NetDevice>,
}

/// One `ibv_pd` handed out for a protection domain (by `ibv_alloc_pd` or
/// `ibv_import_pd`).
pub(crate) struct PdHandle {
    pub(crate) raw: CBox<ibv_pd>,
    /// The PD object it names (a key of `Objects::pd_objs`, absent once destroyed).
    pub(crate) obj: ObjKey,
}

/// A memory region object.
pub(crate) struct MrEntry {
    pub(crate) mr: Mr,
    /// The application address and length of the region (what an imported handle shows).
    pub(crate) addr: usize,
    pub(crate) length: usize,
}

/// One `ibv_mr` handed out for a memory region (by `ibv_reg_mr*` or `ibv_import_mr`).
pub(crate) struct MrHandle {
    pub(crate) raw: CBox<ibv_mr>,
    /// The MR object it names (a key of `Objects::mr_objs`, absent once destroyed).
    pub(crate) obj: ObjKey,
}

/// A completion channel; shared with threads blocked in `ibv_get_cq_event`.
pub(crate) struct ChannelEntry {
    pub(crate) raw: CBox<ibv_comp_channel>,
    pub(crate) ch: Arc<CompChannel>,
    pub(crate) _net: Arc<NetDevice>,
}

/// A completion queue: the registry's control-path state; the `Cq` itself lives in the
/// handle container ([`CqKind`]).
pub(crate) struct CqEntry {
    pub(crate) h: HandlePtr<CqKind>,
    /// Events returned by `ibv_get_cq_event` and not acknowledged yet.
    pub(crate) events: Vec<CqEvent>,
    /// Address of the channel's `ibv_comp_channel` (0: none).
    pub(crate) channel: usize,
    /// The parent domain an extended CQ was created in (`IBV_CQ_INIT_ATTR_MASK_PD`; 0:
    /// none), which cannot be deallocated while the CQ lives.
    pub(crate) parent_domain: usize,
    pub(crate) _net: Arc<NetDevice>,
}

impl CqEntry {
    /// The CQ's `ibv_cq` (the prefix of its `ibv_cq_ex`).
    pub(crate) fn raw(&self) -> *mut ibv_cq {
        self.h.c_ptr().cast()
    }

    /// The CQ (`None` only while a destroy holds it).
    pub(crate) fn body(&self) -> Option<&CqBody> {
        // SAFETY: a registered container is live while the registry lock (held by whoever
        // holds `&self`) is held: destroy unpublishes it before it retires it.
        unsafe { Handle::body_of(self.h.0) }
    }
}

/// A shared receive queue (the `Srq` lives in the handle container, [`SrqKind`]).
pub(crate) struct SrqEntry {
    pub(crate) h: HandlePtr<SrqKind>,
}

impl SrqEntry {
    /// The SRQ (`None` only while a destroy holds it).
    pub(crate) fn srq(&self) -> Option<&Srq> {
        // SAFETY: as for `CqEntry::body`.
        unsafe { Handle::body_of(self.h.0) }
    }
}

/// An address handle (the `Ah` lives in the handle container, [`AhKind`], so that a UD
/// `post_send` finds it without the registry lock).
pub(crate) struct AhEntry {
    pub(crate) h: HandlePtr<AhKind>,
}

/// A queue pair (the `Qp` lives in the handle container, [`QpKind`]).
pub(crate) struct QpEntry {
    pub(crate) h: HandlePtr<QpKind>,
    /// The network device the QP sends through (flushed before the QP is destroyed).
    pub(crate) net: Arc<NetDevice>,
}

// ---------------------------------------------------------------------------------------
// Handle containers (see `crate::handle`).
// ---------------------------------------------------------------------------------------

/// The QP kind: an `ibv_qp_ex` (whose first member is the `ibv_qp`), then the `Qp` and its
/// `ibv_wr_*` builder.
pub(crate) struct QpKind;

/// What a QP container holds besides its C structure.
pub(crate) struct QpBody {
    pub(crate) qp: Qp,
    /// The `ibv_wr_*` list being built (see `crate::qp::ex`): in the container, so that
    /// every `ibv_wr_*` call reaches it from the `ibv_qp_ex` pointer without the registry.
    pub(crate) builder: crate::qp::ex::WrBuilder,
    /// The granted `max_inline_data` (INLINE sends are copied up to it).
    pub(crate) max_inline: u32,
}

static QP_POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static CQ_POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static SRQ_POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static AH_POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// The AH kind: an `ibv_ah`, then the `Ah`.
pub(crate) struct AhKind;

impl Kind for AhKind {
    type C = ibv_ah;
    type Body = Ah;
    const MAGIC: u64 = 0x7572_6f63_6541_4821; // "uroceAH!"
    fn pool() -> &'static Mutex<Vec<usize>> {
        &AH_POOL
    }
}

impl Kind for QpKind {
    type C = ibv_qp_ex;
    type Body = QpBody;
    const MAGIC: u64 = 0x7572_6f63_6551_5021; // "uroceQP!"
    fn pool() -> &'static Mutex<Vec<usize>> {
        &QP_POOL
    }
}

/// The CQ kind: an `ibv_cq_ex` (whose prefix is the `ibv_cq`), then the `Cq` and the
/// state of an `ibv_start_poll` session.
pub(crate) struct CqKind;

/// What a CQ container holds besides its C structure.
pub(crate) struct CqBody {
    pub(crate) cq: Cq,
    /// The `ibv_start_poll` … `ibv_end_poll` session (see `crate::cq::ex`).
    pub(crate) poll: crate::cq::ex::PollSession,
}

impl Kind for CqKind {
    type C = ibv_cq_ex;
    type Body = CqBody;
    const MAGIC: u64 = 0x7572_6f63_6543_5121; // "uroceCQ!"
    fn pool() -> &'static Mutex<Vec<usize>> {
        &CQ_POOL
    }
}

/// The SRQ kind: an `ibv_srq`, then the `Srq`.
pub(crate) struct SrqKind;

impl Kind for SrqKind {
    type C = ibv_srq;
    type Body = Srq;
    const MAGIC: u64 = 0x7572_6f63_6553_5121; // "uroceSQ!"
    fn pool() -> &'static Mutex<Vec<usize>> {
        &SRQ_POOL
    }
}

/// All live objects, keyed by the address of their C structure.
#[derive(Default)]
pub(crate) struct Objects {
    /// PD handles by the address of their `ibv_pd`.
    pub(crate) pds: HashMap<usize, PdHandle>,
    /// PD objects.
    pub(crate) pd_objs: HashMap<ObjKey, PdEntry>,
    /// MR handles by the address of their `ibv_mr`.
    pub(crate) mrs: HashMap<usize, MrHandle>,
    /// MR objects.
    pub(crate) mr_objs: HashMap<ObjKey, MrEntry>,
    pub(crate) channels: HashMap<usize, ChannelEntry>,
    pub(crate) cqs: HashMap<usize, CqEntry>,
    /// CQ id → address of its `ibv_cq` (to map a CQ event back to the C object).
    pub(crate) cq_by_id: HashMap<u32, usize>,
    pub(crate) srqs: HashMap<usize, SrqEntry>,
    pub(crate) qps: HashMap<usize, QpEntry>,
    pub(crate) ahs: HashMap<usize, AhEntry>,
    pub(crate) xrcds: HashMap<usize, crate::xrc::XrcdEntry>,
    /// Parent domains (`ibv_pd`s standing for a PD of `pds`, see `crate::parent_domain`).
    pub(crate) parent_domains: HashMap<usize, crate::parent_domain::ParentDomainEntry>,
    /// Thread domains.
    pub(crate) tds: HashMap<usize, crate::parent_domain::TdEntry>,
    /// Memory windows by the address of their `ibv_mw` (see `crate::mw`).
    pub(crate) windows: HashMap<usize, crate::mw::MwEntry>,
}

static OBJECTS: LazyLock<Mutex<Objects>> = LazyLock::new(|| Mutex::new(Objects::default()));

/// Locks the registry. A panic while it was held (caught at the C boundary) leaves it
/// consistent: every mutation is a single insert or remove.
pub(crate) fn objects() -> MutexGuard<'static, Objects> {
    OBJECTS.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Objects {
    /// The PD object behind `pd`: a protection domain handle's, or the one a parent domain
    /// stands for.
    pub(crate) fn pd(&self, pd: *const ibv_pd) -> Result<&PdEntry, FfiError> {
        let key = self.pd_key(pd)?;
        self.pd_objs
            .get(&key)
            .ok_or(FfiError::BadHandle { what: "pd" })
    }

    /// The key of the PD object `pd` names (a protection domain handle, or a parent
    /// domain), whether or not the object still exists.
    pub(crate) fn pd_key(&self, pd: *const ibv_pd) -> Result<ObjKey, FfiError> {
        match self.parent_domains.get(&(pd as usize)) {
            Some(parent) => Ok(parent.protection),
            None => self
                .pds
                .get(&(pd as usize))
                .map(|h| h.obj)
                .ok_or(FfiError::BadHandle { what: "pd" }),
        }
    }

    /// The MR object behind the handle `mr`.
    pub(crate) fn mr(&self, mr: *const ibv_mr) -> Result<&MrEntry, FfiError> {
        self.mrs
            .get(&(mr as usize))
            .and_then(|h| self.mr_objs.get(&h.obj))
            .ok_or(FfiError::BadHandle { what: "mr" })
    }

    /// A handle number for a new MR of device file `file`: one no live MR object of the
    /// file has (a process-wide counter; 0 is never used).
    pub(crate) fn new_mr_handle(&self, file: u64) -> u32 {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        // At most one number per live MR is skipped, so this ends within
        // `mr_objs.len() + 2` tries.
        for _ in 0..=self.mr_objs.len() + 1 {
            let h = NEXT.fetch_add(1, Ordering::Relaxed);
            if h != 0 && !self.mr_objs.contains_key(&(file, h)) {
                return h;
            }
        }
        unreachable!("more live MRs than tries")
    }

    /// The CQ behind `cq` (control path: the registry lock is held).
    pub(crate) fn cq(&self, cq: *const ibv_cq) -> Result<&Cq, FfiError> {
        self.cqs
            .get(&(cq as usize))
            .and_then(CqEntry::body)
            .map(|b| &b.cq)
            .ok_or(FfiError::BadHandle { what: "cq" })
    }

    /// The SRQ behind `srq` (control path: the registry lock is held).
    pub(crate) fn srq(&self, srq: *const ibv_srq) -> Result<&Srq, FfiError> {
        self.srqs
            .get(&(srq as usize))
            .and_then(SrqEntry::srq)
            .ok_or(FfiError::BadHandle { what: "srq" })
    }
}

/// A counted reference to the CQ behind `cq`, recovered from the handle without a lock
/// (see `crate::handle`).
pub(crate) fn cq_ref(cq: *const ibv_cq) -> Result<CqRef, FfiError> {
    let g = Handle::<CqKind>::enter(cq.cast()).ok_or(FfiError::BadHandle { what: "cq" })?;
    g.body()
        .map(|b| CqRef::clone(&b.cq))
        .ok_or(FfiError::BadHandle { what: "cq" })
}

/// A counted reference to the SRQ behind `srq`, recovered from the handle without a lock.
pub(crate) fn srq_ref(srq: *const ibv_srq) -> Result<SrqRef, FfiError> {
    let g = Handle::<SrqKind>::enter(srq).ok_or(FfiError::BadHandle { what: "srq" })?;
    g.body()
        .map(|s| SrqRef::clone(s))
        .ok_or(FfiError::BadHandle { what: "srq" })
}

/// A counted reference to the QP behind `qp`, and its `max_inline_data`, recovered from
/// the handle without a lock.
pub(crate) fn qp_ref(qp: *const ibv_qp) -> Result<(QpRef, u32), FfiError> {
    let g = Handle::<QpKind>::enter(qp.cast()).ok_or(FfiError::BadHandle { what: "qp" })?;
    g.body()
        .map(|b| (QpRef::clone(&b.qp), b.max_inline))
        .ok_or(FfiError::BadHandle { what: "qp" })
}

// ---------------------------------------------------------------------------------------
// Conversions.
// ---------------------------------------------------------------------------------------

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a device may ignore (relaxed ordering, …).
pub const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// MR access flags from C (optional bits dropped; unknown required bits refused).
pub(crate) fn mr_access(access: i32) -> Result<AccessFlags, FfiError> {
    let bits = (access as u32) & !ACCESS_OPTIONAL_RANGE;
    AccessFlags::from_bits(bits).ok_or(FfiError::Invalid("unknown access flag bits"))
}

/// The 20 bits of a GRH flow label (IBA Vol 1 §8.3.1; the IPv6 flow label of RoCEv2).
pub const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// `ibv_ah_attr` → [`AhAttr`]. A flow label with bits above the 20 is masked, not
/// refused (programs written for other NICs set all ones; only 20 bits reach the wire);
/// `UROCE_DEBUG` says so.
pub(crate) fn ah_from_c(a: &ibv_ah_attr) -> AhAttr {
    // SAFETY: every bit pattern of the 16-byte GID union is a valid `[u8; 16]`.
    let dgid = unsafe { a.grh.dgid.raw };
    let flow_label = a.grh.flow_label & FLOW_LABEL_MASK;
    if flow_label != a.grh.flow_label && crate::entry::debug_enabled() {
        // A failed write to stderr is ignored: diagnostics must not fail the call.
        let _ = writeln!(
            std::io::stderr(),
            "uroce: GRH flow label {:#x} masked to its 20 bits ({flow_label:#x})",
            a.grh.flow_label
        );
    }
    AhAttr {
        dgid: Gid(dgid),
        flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        sl: a.sl,
        static_rate: a.static_rate,
        port_num: a.port_num,
        is_global: a.is_global != 0,
    }
}

/// [`AhAttr`] → `ibv_ah_attr`.
pub(crate) fn ah_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: 0,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// `ibv_qp_cap` → [`QpCap`].
pub(crate) fn cap_from_c(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`QpCap`] → `ibv_qp_cap`.
pub(crate) fn cap_to_c(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn state_from_c(v: u32) -> Result<QpState, FfiError> {
    QpState::from_u32(v).ok_or(FfiError::Invalid("unknown QP state"))
}

/// The attributes `mask` selects from a C `ibv_qp_attr` (unselected fields keep their
/// defaults and are not validated).
pub(crate) fn qp_attr_from_c(a: &ibv_qp_attr, mask: u32) -> Result<(QpAttr, AttrMask), FfiError> {
    let mask = AttrMask::from_bits(mask).ok_or(FfiError::Invalid("unknown attr_mask bits"))?;
    let mut q = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        q.qp_state = state_from_c(a.qp_state)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        q.cur_qp_state = state_from_c(a.cur_qp_state)?;
    }
    if mask.contains(AttrMask::PATH_MTU) {
        q.path_mtu = u8::try_from(a.path_mtu)
            .ok()
            .and_then(Pmtu::from_enum)
            .ok_or(FfiError::Invalid("path_mtu"))?;
    }
    if mask.contains(AttrMask::PATH_MIG_STATE) {
        q.path_mig_state = match a.path_mig_state {
            IBV_MIG_MIGRATED => PathMigState::Migrated,
            IBV_MIG_REARM => PathMigState::Rearm,
            IBV_MIG_ARMED => PathMigState::Armed,
            _ => return Err(FfiError::Invalid("path_mig_state")),
        };
    }
    q.qkey = a.qkey;
    q.rq_psn = Psn::new(a.rq_psn);
    q.sq_psn = Psn::new(a.sq_psn);
    q.dest_qp_num = a.dest_qp_num;
    // Access bits the engine does not know (relaxed ordering, …) are ignored, as devices do.
    q.qp_access_flags = AccessFlags::from_bits_truncate(a.qp_access_flags);
    q.cap = cap_from_c(&a.cap);
    if mask.contains(AttrMask::AV) {
        q.ah_attr = ah_from_c(&a.ah_attr);
    }
    if mask.contains(AttrMask::ALT_PATH) {
        q.alt_ah_attr = ah_from_c(&a.alt_ah_attr);
    }
    q.pkey_index = a.pkey_index;
    q.alt_pkey_index = a.alt_pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    if mask.contains(AttrMask::PORT) {
        q.port_num = a.port_num;
    }
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    q.alt_port_num = a.alt_port_num;
    q.alt_timeout = a.alt_timeout;
    q.rate_limit = a.rate_limit;
    Ok((q, mask))
}

/// [`QpAttr`] → `ibv_qp_attr`.
pub(crate) fn qp_attr_to_c(q: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: q.qp_state.as_u32(),
        cur_qp_state: q.cur_qp_state.as_u32(),
        path_mtu: q.path_mtu.enum_value().into(),
        path_mig_state: q.path_mig_state as u32,
        qkey: q.qkey,
        rq_psn: q.rq_psn.value(),
        sq_psn: q.sq_psn.value(),
        dest_qp_num: q.dest_qp_num,
        qp_access_flags: q.qp_access_flags.bits(),
        cap: cap_to_c(&q.cap),
        ah_attr: ah_to_c(&q.ah_attr),
        alt_ah_attr: ah_to_c(&q.alt_ah_attr),
        pkey_index: q.pkey_index,
        alt_pkey_index: q.alt_pkey_index,
        en_sqd_async_notify: u8::from(q.en_sqd_async_notify),
        sq_draining: u8::from(q.sq_draining),
        max_rd_atomic: q.max_rd_atomic,
        max_dest_rd_atomic: q.max_dest_rd_atomic,
        min_rnr_timer: q.min_rnr_timer,
        port_num: q.port_num,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        rnr_retry: q.rnr_retry,
        alt_port_num: q.alt_port_num,
        alt_timeout: q.alt_timeout,
        rate_limit: q.rate_limit,
    }
}

/// The C SGE list of a work request.
///
/// # Safety
/// `sg_list` is valid for reading `num_sge` entries when `num_sge > 0`.
unsafe fn sges_from_c(sg_list: *const ibv_sge, num_sge: i32) -> Result<Vec<Sge>, FfiError> {
    let n = usize::try_from(num_sge).map_err(|_| FfiError::Invalid("negative num_sge"))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if sg_list.is_null() {
        return Err(FfiError::Invalid("sg_list is NULL"));
    }
    // SAFETY: caller guarantee: `sg_list` holds `num_sge` readable entries (non-NULL).
    let list = unsafe { std::slice::from_raw_parts(sg_list, n) };
    Ok(list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

/// Most SGEs uroce accepts in one C work request before even looking at the QP's limit
/// (bounds the copy of an absurd `num_sge`).
const MAX_C_SGE: i32 = 1 << 16;

/// Converts one C send WR (not following `next`). With `IBV_SEND_INLINE` the payload is
/// copied from the SGE addresses now, as the verbs contract allows the application to
/// reuse the buffers as soon as the post returns.
///
/// # Safety
/// `wr.sg_list` is valid for `wr.num_sge` entries; with `IBV_SEND_INLINE` every SGE
/// describes readable memory.
pub(crate) unsafe fn send_wr_from_c(wr: &ibv_send_wr, max_inline: u32) -> Result<SendWr, FfiError> {
    if wr.num_sge > MAX_C_SGE {
        return Err(FfiError::Invalid("num_sge too large"));
    }
    let opcode = SendOpcode::from_u32(wr.opcode).ok_or(FfiError::Invalid("unknown opcode"))?;
    let flags =
        SendFlags::from_bits(wr.send_flags).ok_or(FfiError::Invalid("unknown send_flags"))?;
    // SAFETY: forwarded caller guarantee on sg_list/num_sge.
    let sges = unsafe { sges_from_c(wr.sg_list, wr.num_sge)? };
    let mut out = SendWr {
        wr_id: wr.wr_id,
        opcode,
        flags,
        ..SendWr::default()
    };
    if flags.contains(SendFlags::INLINE) {
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        // ATOMIC WRITE's 8 bytes are an operand, not inline data: `max_inline_data` does
        // not limit them (its length is checked when the WR is posted).
        if total > u64::from(max_inline) && opcode != SendOpcode::AtomicWrite {
            return Err(FfiError::Invalid("inline data longer than max_inline_data"));
        }
        let mut data = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for s in &sges {
            let len = usize::try_from(s.length).unwrap_or(usize::MAX);
            if len == 0 {
                continue;
            }
            let p = usize::try_from(s.addr).map_err(|_| FfiError::Invalid("inline address"))?
                as *const u8;
            if p.is_null() {
                return Err(FfiError::Invalid("inline SGE address is NULL"));
            }
            // SAFETY: caller guarantee: an inline SGE describes `length` readable bytes at
            // `addr` (non-NULL, checked); they are copied, never referenced afterwards.
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(p, len) });
        }
        out.inline_data = data;
    } else {
        out.sg_list = sges;
    }
    match opcode {
        SendOpcode::SendWithInv | SendOpcode::LocalInv => out.invalidate_rkey = wr.imm_data,
        _ => out.imm_data = u32::from_be(wr.imm_data),
    }
    match opcode {
        // IBA 1.5 ATOMIC WRITE: the target in `wr.rdma`, the 8 bytes from the SGE list
        // (or inline), as rdma-core's `IBV_WR_ATOMIC_WRITE` documents it.
        SendOpcode::RdmaWrite
        | SendOpcode::RdmaWriteWithImm
        | SendOpcode::RdmaRead
        | SendOpcode::AtomicWrite => {
            // SAFETY: the union's rdma member is plain integers; any bits are valid.
            let r = unsafe { wr.wr.rdma };
            out.rdma = RdmaInfo {
                remote_addr: r.remote_addr,
                rkey: r.rkey,
            };
        }
        SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd => {
            // SAFETY: the union's atomic member is plain integers; any bits are valid.
            let a = unsafe { wr.wr.atomic };
            out.atomic = AtomicInfo {
                remote_addr: a.remote_addr,
                compare_add: a.compare_add,
                swap: a.swap,
                rkey: a.rkey,
            };
        }
        SendOpcode::BindMw => {
            // SAFETY: the union's bind_mw member is a pointer and plain integers; any bits
            // are valid (the pointers are only looked up in the registries).
            let b = unsafe { wr.bind_mw_tso.bind_mw };
            out.bind_mw = Some(crate::mw::bind_mw_wr_from_c(&b)?);
        }
        _ => {}
    }
    // SAFETY: the qp_type union's xrc member is one u32; any bits are valid.
    out.xrc_remote_srqn = unsafe { wr.qp_type.xrc.remote_srqn };
    Ok(out)
}

/// The destination of a send WR on a UD QP (`wr.ud`: the address handle, which must be a
/// live one handed out by this library — recovered from the pointer without a lock, see
/// [`crate::handle`] —, the remote QPN and Q_Key). The verbs layer checks that the AH
/// belongs to the QP's PD.
pub(crate) fn ud_dest_from_c(wr: &ibv_send_wr) -> Result<UdDest, FfiError> {
    // SAFETY: the union's ud member is a pointer and two integers; any bits are valid
    // (the pointer is only checked as a handle, see `Handle::enter`).
    let ud = unsafe { wr.wr.ud };
    let bad = FfiError::BadHandle {
        what: "ah (wr.ud.ah)",
    };
    let g = Handle::<AhKind>::enter(ud.ah).ok_or(bad.clone())?;
    let ah = g.body().ok_or(bad)?.reference();
    Ok(UdDest {
        ah,
        remote_qpn: ud.remote_qpn & 0x00ff_ffff,
        remote_qkey: ud.remote_qkey,
    })
}

/// Converts one C receive WR (not following `next`).
///
/// # Safety
/// `wr.sg_list` is valid for `wr.num_sge` entries.
pub(crate) unsafe fn recv_wr_from_c(wr: &ibv_recv_wr) -> Result<RecvWr, FfiError> {
    if wr.num_sge > MAX_C_SGE {
        return Err(FfiError::Invalid("num_sge too large"));
    }
    // SAFETY: forwarded caller guarantee.
    let sges = unsafe { sges_from_c(wr.sg_list, wr.num_sge)? };
    Ok(RecvWr::new(wr.wr_id, sges))
}

/// [`WorkCompletion`] → `ibv_wc`.
pub(crate) fn wc_to_c(wc: &WorkCompletion) -> ibv_wc {
    let imm = if wc.wc_flags.contains(WcFlags::WITH_INV) {
        wc.invalidated_rkey
    } else {
        wc.imm_data.to_be()
    };
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status.as_u32(),
        opcode: wc.opcode.as_u32(),
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm_data: imm,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags: wc.wc_flags.bits(),
        pkey_index: wc.pkey_index,
        slid: wc.slid,
        sl: wc.sl,
        dlid_path_bits: wc.dlid_path_bits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_attr_round_trips_selected_fields() {
        // SAFETY: ibv_qp_attr is integers and arrays of integers.
        let mut a: ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = 3; // IBV_MTU_1024 (verbs.h enum ibv_mtu)
        a.dest_qp_num = 0x12;
        a.rq_psn = 0x1ab_cdef; // beyond 24 bits: the top bits are dropped
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: [7; 16] };
        a.ah_attr.port_num = 1;
        let mask = IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_AV;
        let (q, m) = qp_attr_from_c(&a, mask).expect("valid");
        assert_eq!(m.bits(), mask);
        assert_eq!(q.qp_state, QpState::Rtr);
        assert_eq!(q.path_mtu, Pmtu::Mtu1024);
        assert_eq!(q.rq_psn.value(), 0xab_cdef);
        assert_eq!(q.ah_attr.dgid, Gid([7; 16]));
        let back = qp_attr_to_c(&q);
        assert_eq!(back.qp_state, IBV_QPS_RTR);
        assert_eq!(back.path_mtu, 3);
        assert_eq!(back.dest_qp_num, 0x12);
        // SAFETY: reading the byte view of a GID union.
        assert_eq!(unsafe { back.ah_attr.grh.dgid.raw }, [7; 16]);
    }

    #[test]
    fn qp_attr_rejects_bad_values() {
        // SAFETY: ibv_qp_attr is integers and arrays of integers.
        let mut a: ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = 9;
        assert!(qp_attr_from_c(&a, IBV_QP_STATE).is_err());
        a.qp_state = IBV_QPS_INIT;
        a.path_mtu = 0;
        assert!(qp_attr_from_c(&a, IBV_QP_STATE | IBV_QP_PATH_MTU).is_err());
        // path_mtu is not validated when not selected.
        assert!(qp_attr_from_c(&a, IBV_QP_STATE).is_ok());
        assert!(qp_attr_from_c(&a, 1 << 30).is_err());
    }

    #[test]
    fn inline_send_copies_payload_and_imm_is_host_order() {
        let payload = *b"hello, inline";
        let mut sge = ibv_sge {
            addr: payload.as_ptr() as u64,
            length: payload.len() as u32,
            lkey: 0,
        };
        // SAFETY: ibv_send_wr is integers, raw pointers and unions of those.
        let mut wr: ibv_send_wr = unsafe { zeroed() };
        wr.wr_id = 5;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
        wr.imm_data = 0x0102_0304u32.to_be();
        // SAFETY: sg_list points to one live SGE over `payload`.
        let s = unsafe { send_wr_from_c(&wr, 64) }.expect("valid");
        assert_eq!(s.inline_data, payload);
        assert!(s.sg_list.is_empty());
        assert_eq!(s.imm_data, 0x0102_0304);
        assert_eq!(s.opcode, SendOpcode::SendWithImm);
        // SAFETY: as above.
        assert!(unsafe { send_wr_from_c(&wr, 4) }.is_err(), "inline limit");
        wr.num_sge = -1;
        // SAFETY: a negative count is rejected before sg_list is read.
        assert!(unsafe { send_wr_from_c(&wr, 64) }.is_err());
    }

    #[test]
    fn mr_access_masks_optional_bits_only() {
        let relaxed_ordering = 1 << 20;
        assert_eq!(
            mr_access(IBV_ACCESS_LOCAL_WRITE as i32 | relaxed_ordering).unwrap(),
            AccessFlags::LOCAL_WRITE
        );
        assert!(mr_access(1 << 12).is_err());
    }
}
