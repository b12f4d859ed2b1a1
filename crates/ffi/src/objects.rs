//! The process-wide registry of the verbs objects handed out to C callers (protection
//! domains, memory regions, memory windows, completion channels, CQs, SRQs, QPs, AHs, XRC
//! domains, thread and parent domains) and the handle kinds of the objects the data path
//! reaches without it. The conversions between the C structures and uroce-verbs' types are
//! in [`crate::convert`].
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
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use uroce_net::NetDevice;
use uroce_verbs::{Ah, CompChannel, Cq, CqEvent, CqRef, Mr, Pd, Qp, QpRef, Srq, SrqRef};

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
