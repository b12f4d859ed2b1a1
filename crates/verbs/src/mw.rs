//! Memory windows (IBA 10.6.7): the [`Mw`] handle, its entry in the context's window
//! table, and the checks a bind, an invalidation and a remote access through a window make.
//!
//! # Key space
//!
//! Windows share the key format of regions (`index << 12 | random`, see [`crate::mr`]) and
//! the key space: the top [`MAX_MW`] table indices belong to windows, the rest to regions,
//! so a key names at most one object and the transport finds either by the key's index.
//! The low 8 bits of a window's R_Key are its *key field*: a type 2 bind may change them
//! (the application chooses the new R_Key, `ibv_inc_rkey`), a type 1 bind changes them
//! itself, so a key from an earlier binding no longer names the window.
//!
//! # Binding
//!
//! A bind is a send-queue operation in both types: [`Mw::bind`] (type 1, `ibv_bind_mw`)
//! posts a BIND_MW work request that carries the bind, a type 2 window is bound by a
//! BIND_MW work request the application posts ([`crate::qp::SendWr::bind_mw`]). The
//! engine executes it through `Memory::bind_window` when its requester reaches it, in
//! send-queue order, and completes it with `IBV_WC_BIND_MW`. The checks (IBA 10.6.7.2):
//! window and region in the QP's PD; the region registered with `MW_BIND`; the range
//! inside the region; window rights among REMOTE_READ/WRITE/ATOMIC, and REMOTE_WRITE or
//! REMOTE_ATOMIC only on a region with LOCAL_WRITE; a type 2 window unbound (invalidated)
//! and its new R_Key differing from the old one in the key field only. A type 2 window is
//! bound to the QP that bound it: remote accesses and SEND with Invalidate through it are
//! accepted only on that QP. A type 1 bind of length 0 unbinds the window.
//!
//! A bound window holds a counted reference to its region and counts itself in the
//! region's bound-window count: deregistering the region fails with `EBUSY`
//! ([`crate::DestroyError::Busy`]) while the count is non-zero. Deallocating a bound
//! window is allowed: it is invalidated first.

use std::fmt;

use crate::context::{dec, try_inc};
use crate::error::{AllocError, DestroyError, ObjectKind};
use crate::mr::{make_key, AccessFlags, KEY_INDEX_BITS};
use crate::pd::PdCore;
use crate::region::MrEntry;
use crate::sync::{lock, Arc, Mutex, Ordering};
use crate::table::InsertError;

/// Number of table indices (and so of windows per context) reserved for memory windows.
pub const MAX_MW: u32 = 1 << 16;
/// The first table index of the window part of the key space.
pub const FIRST_MW_INDEX: u32 = (1 << KEY_INDEX_BITS) - MAX_MW;

/// Whether `key` lies in the window part of the key space.
pub fn is_window_key(key: u32) -> bool {
    crate::mr::key_index(key) >= FIRST_MW_INDEX
}

/// `ibv_inc_rkey`: the key with its 8-bit key field incremented (the index part kept).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// The window rights a bind may ask for.
const WINDOW_ACCESS: AccessFlags = AccessFlags::REMOTE_READ
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The type of a memory window (`enum ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1: bound with `ibv_bind_mw`, associated with its PD only.
    Type1 = 1,
    /// Type 2: bound with a BIND_MW work request, associated with the QP that bound it.
    Type2 = 2,
}

/// What a bind names (`struct ibv_mw_bind_info`), with the region by its L_Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwBindInfo {
    /// L_Key of the region the window is bound to.
    pub mr_lkey: u32,
    /// First virtual address of the window.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// The window's rights (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC).
    pub access: AccessFlags,
}

/// A BIND_MW work request's bind (`wr.bind_mw` of `struct ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BindMwWr {
    /// The window's current R_Key (names the window).
    pub mw_rkey: u32,
    /// The R_Key the window has once bound (only the key field may differ).
    pub rkey: u32,
    /// The region, range and rights.
    pub info: MwBindInfo,
    /// Set only by [`Mw::bind`]: the bind of a type 1 window.
    type1: bool,
}

impl BindMwWr {
    /// The bind of a BIND_MW work request for the type 2 window whose R_Key is now
    /// `mw_rkey`, giving it `rkey` (usually [`inc_rkey`] of it).
    pub fn new(mw_rkey: u32, rkey: u32, info: MwBindInfo) -> BindMwWr {
        BindMwWr {
            mw_rkey,
            rkey,
            info,
            type1: false,
        }
    }

    /// Whether this is the bind of a type 1 window.
    pub fn is_type1(&self) -> bool {
        self.type1
    }
}

/// A window's region, range and rights while it is bound.
pub(crate) struct Binding {
    pub(crate) mr: Arc<MrEntry>,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) access: AccessFlags,
    /// Type 2: the QP it is bound to.
    pub(crate) qpn: Option<u32>,
}

impl Binding {
    fn new(
        mr: Arc<MrEntry>,
        addr: u64,
        len: u64,
        access: AccessFlags,
        qpn: Option<u32>,
    ) -> Binding {
        mr.bound_windows.fetch_add(1, Ordering::AcqRel);
        Binding {
            mr,
            addr,
            len,
            access,
            qpn,
        }
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        dec(&self.mr.bound_windows);
    }
}

pub(crate) struct MwState {
    /// The current R_Key.
    pub(crate) rkey: u32,
    pub(crate) binding: Option<Binding>,
}

/// A window as the window table stores it.
pub(crate) struct MwEntry {
    pub(crate) pd: Arc<PdCore>,
    pub(crate) mw_type: MwType,
    index: u32,
    pub(crate) state: Mutex<MwState>,
    /// Type 1: the R_Key of the last bind posted (a later bind names it).
    posted_rkey: Mutex<u32>,
}

impl MwEntry {
    pub(crate) fn alloc(pd: &Arc<PdCore>, mw_type: MwType) -> Result<Mw, AllocError> {
        let ctx = &pd.ctx;
        if !try_inc(&ctx.live.mws, MAX_MW) {
            return Err(AllocError::Limit {
                object: ObjectKind::Mw,
                max: MAX_MW,
            });
        }
        let inserted = ctx.mws.insert_with(|index| {
            let rkey = make_key(index, &mut rand::rng())?;
            Ok::<_, crate::mr::MrError>(MwEntry {
                pd: pd.clone(),
                mw_type,
                index,
                state: Mutex::new(MwState {
                    rkey,
                    binding: None,
                }),
                posted_rkey: Mutex::new(rkey),
            })
        });
        match inserted {
            Ok((_, entry)) => {
                pd.children.mws.fetch_add(1, Ordering::AcqRel);
                Ok(Mw {
                    entry,
                    destroyed: false,
                })
            }
            Err(e) => {
                dec(&ctx.live.mws);
                Err(match e {
                    InsertError::Make(_) | InsertError::Full { .. } | InsertError::InUse { .. } => {
                        AllocError::Limit {
                            object: ObjectKind::Mw,
                            max: MAX_MW,
                        }
                    }
                })
            }
        }
    }
}

impl Drop for MwEntry {
    fn drop(&mut self) {
        self.pd.ctx.mws.release(self.index);
        dec(&self.pd.children.mws);
        dec(&self.pd.ctx.live.mws);
    }
}

/// Why a bind or invalidation was refused (see `uroce_proto::memory::MwError`).
pub(crate) use uroce_proto::memory::MwError;

/// Executes a bind for the QP `qpn` of PD `pd_id`; `mr` is the region the bind's L_Key
/// names (already looked up).
pub(crate) fn bind(
    w: &MwEntry,
    pd_id: u32,
    qpn: u32,
    b: &uroce_proto::memory::MwBind,
    mr: Option<Arc<MrEntry>>,
) -> Result<(), MwError> {
    let rkey = b.mw_rkey;
    if w.pd.id != pd_id {
        return Err(MwError::BadWindow { rkey });
    }
    if b.type1 != (w.mw_type == MwType::Type1) {
        return Err(MwError::WrongType { rkey });
    }
    // The window is named by the index part of `mw_rkey` (its key field may be stale: a
    // bind posted after an earlier bind and LOCAL_INV names the key the window had at
    // post time); only the key field of the new R_Key may differ.
    let mut st = lock(&w.state);
    if b.new_rkey >> 8 != st.rkey >> 8 {
        return Err(MwError::BadNewKey {
            rkey,
            new_rkey: b.new_rkey,
        });
    }
    if w.mw_type == MwType::Type2 && st.binding.is_some() {
        return Err(MwError::WrongState { rkey });
    }
    if w.mw_type == MwType::Type1 && b.length == 0 {
        st.binding = None;
        st.rkey = b.new_rkey;
        return Ok(());
    }
    let access = AccessFlags::from_bits(b.access)
        .filter(|a| WINDOW_ACCESS.contains(*a))
        .ok_or(MwError::BadAccess { access: b.access })?;
    let mr = mr
        .filter(|e| e.mr.lkey() == b.mr_lkey && e.mr.pd_id() == pd_id)
        .filter(|e| e.mr.access().contains(AccessFlags::MW_BIND))
        .ok_or(MwError::BadRegion { lkey: b.mr_lkey })?;
    if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !mr.mr.access().contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(MwError::BadAccess { access: b.access });
    }
    let start = mr.mr.iova();
    let inside = b.addr >= start
        && b.addr
            .checked_add(b.length)
            .is_some_and(|end| end <= start.saturating_add(mr.mr.len()));
    if !inside {
        return Err(MwError::OutOfBounds {
            addr: b.addr,
            len: b.length,
        });
    }
    let qpn = (w.mw_type == MwType::Type2).then_some(qpn);
    st.binding = Some(Binding::new(mr, b.addr, b.length, access, qpn));
    st.rkey = b.new_rkey;
    Ok(())
}

/// LOCAL_INV of a type 2 window by a QP of PD `pd_id`.
pub(crate) fn invalidate_local(w: &MwEntry, pd_id: u32, rkey: u32) -> Result<(), MwError> {
    if w.pd.id != pd_id {
        return Err(MwError::BadWindow { rkey });
    }
    if w.mw_type != MwType::Type2 {
        return Err(MwError::WrongType { rkey });
    }
    let mut st = lock(&w.state);
    if st.rkey != rkey {
        return Err(MwError::BadWindow { rkey });
    }
    if st.binding.take().is_none() {
        return Err(MwError::WrongState { rkey });
    }
    Ok(())
}

/// SEND with Invalidate naming a window, arriving on QP `qpn` of PD `pd_id`: only a type 2
/// window bound to that QP can be invalidated by a peer (IBA Vol 1 10.6.7).
pub(crate) fn invalidate_remote(
    w: &MwEntry,
    pd_id: u32,
    qpn: u32,
    rkey: u32,
) -> Result<(), MwError> {
    if w.pd.id != pd_id {
        return Err(MwError::BadWindow { rkey });
    }
    if w.mw_type != MwType::Type2 {
        return Err(MwError::WrongType { rkey });
    }
    let mut st = lock(&w.state);
    if st.rkey != rkey {
        return Err(MwError::BadWindow { rkey });
    }
    match &st.binding {
        Some(b) if b.qpn == Some(qpn) => {
            st.binding = None;
            Ok(())
        }
        Some(_) | None => Err(MwError::WrongState { rkey }),
    }
}

/// The outcome of looking up a remote access through a window.
pub(crate) enum WindowAccess {
    /// Allowed: the region to access (the range is inside the window).
    Region(Arc<MrEntry>),
    /// No bound window with this key for this QP.
    BadKey,
    /// Outside the window.
    OutOfBounds,
    /// The window lacks the right.
    NoPermission,
}

/// Checks a remote access of `len` bytes at `va` through window key `rkey` on QP `qpn` of
/// PD `pd_id` needing `need`.
pub(crate) fn check_access(
    w: &MwEntry,
    pd_id: u32,
    qpn: u32,
    rkey: u32,
    va: u64,
    len: u64,
    need: AccessFlags,
) -> WindowAccess {
    if w.pd.id != pd_id {
        return WindowAccess::BadKey;
    }
    let st = lock(&w.state);
    let Some(b) = st.binding.as_ref().filter(|_| st.rkey == rkey) else {
        return WindowAccess::BadKey;
    };
    if b.qpn.is_some_and(|q| q != qpn) {
        return WindowAccess::BadKey;
    }
    if !b.access.contains(need) {
        return WindowAccess::NoPermission;
    }
    let inside = va >= b.addr
        && va
            .checked_add(len)
            .is_some_and(|end| end <= b.addr.saturating_add(b.len));
    if !inside {
        return WindowAccess::OutOfBounds;
    }
    WindowAccess::Region(b.mr.clone())
}

/// A memory window (`ibv_mw`), allocated by [`crate::Pd::alloc_mw`]. Unique owner handle.
pub struct Mw {
    entry: Arc<MwEntry>,
    destroyed: bool,
}

impl Mw {
    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.entry.mw_type
    }

    /// The window's current R_Key (the key of the last executed bind; for a type 1 window
    /// [`Mw::bind`] returns the key of the bind it posts).
    pub fn rkey(&self) -> u32 {
        lock(&self.entry.state).rkey
    }

    /// Whether the window is bound now.
    pub fn is_bound(&self) -> bool {
        lock(&self.entry.state).binding.is_some()
    }

    /// Binds a type 1 window (`ibv_bind_mw`): posts a BIND_MW work request with `wr_id`
    /// and `flags` on `qp`'s send queue, executed in order with the QP's other work
    /// requests and completed with `IBV_WC_BIND_MW`. Returns the R_Key the window has once
    /// the bind executes (a length of 0 unbinds). Type 2 windows are bound with a BIND_MW
    /// work request ([`crate::qp::SendWr::bind_mw`]).
    pub fn bind(
        &self,
        qp: &crate::qp::QpRef,
        wr_id: u64,
        flags: crate::qp::SendFlags,
        info: MwBindInfo,
    ) -> Result<u32, crate::error::PostError> {
        if self.entry.mw_type != MwType::Type1 {
            return Err(crate::error::PostError::Refused(
                uroce_proto::wr::WrError::OpcodeNotSupported {
                    opcode: crate::qp::SendOpcode::BindMw,
                    qp_type: qp.qp_type(),
                },
            ));
        }
        // The posted key changes under its lock, so concurrent binds each name the key
        // the previous one produces.
        let mut posted = lock(&self.entry.posted_rkey);
        let old = *posted;
        let new = inc_rkey(old);
        let wr = crate::qp::SendWr {
            wr_id,
            opcode: crate::qp::SendOpcode::BindMw,
            flags,
            bind_mw: Some(BindMwWr {
                mw_rkey: old,
                rkey: new,
                info,
                type1: true,
            }),
            ..crate::qp::SendWr::default()
        };
        qp.post_send(wr)?;
        *posted = new;
        Ok(new)
    }

    /// Deallocates the window (`ibv_dealloc_mw`); a bound window is invalidated first.
    pub fn destroy(mut self) -> Result<(), (Mw, DestroyError)> {
        self.retire();
        self.destroyed = true;
        Ok(())
    }

    fn retire(&self) {
        lock(&self.entry.state).binding = None;
        drop(self.entry.pd.ctx.mws.unpublish(self.entry.index));
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        if !self.destroyed {
            self.retire();
        }
    }
}

impl fmt::Debug for Mw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mw")
            .field("type", &self.entry.mw_type)
            .field("rkey", &format_args!("{:#010x}", self.rkey()))
            .field("bound", &self.is_bound())
            .finish()
    }
}
