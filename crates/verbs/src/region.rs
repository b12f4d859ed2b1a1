//! Memory-region objects: the [`Mr`] handle, its entry in the context's key table, and
//! deregistration.
//!
//! The region itself — keys, access checks, bounds-checked copies — is [`crate::mr::MrCore`];
//! the memory it covers is a [`crate::mem::MemBlock`]. This module publishes a region in the
//! context's MR table under the index its keys carry ([`crate::mr::key_index`]), so the
//! transport can look it up by L_Key or R_Key ([`crate::Context::mr_for_key`]).
//!
//! Deregistration follows the crate's lifetime protocol: unpublish the index (no new lookup
//! finds the region), wait for in-flight users to drop their references, release. If
//! references are still held when the destroy timeout expires, the region's memory is
//! *retired* instead ([`crate::mem::MemBlock::retire`]): every later access through a stale
//! reference fails, so `destroy` can still return `Ok` and the application may free raw
//! memory right away. The table index stays reserved until the last reference is gone.

use std::fmt;
use std::ops::Deref;

use crate::context::{dec, try_inc};
use crate::error::{DestroyError, RegMrError};
use crate::mem::MemBlock;
use crate::mr::{make_key, AccessFlags, MrCore};
use crate::pd::PdCore;
use crate::sync::Arc;
use crate::table::{wait_unreferenced, InsertError};

/// A registered region as the MR table stores it.
pub(crate) struct MrEntry {
    pub(crate) mr: MrCore,
    pub(crate) pd: Arc<PdCore>,
    index: u32,
    /// Memory windows bound to the region now (deregistration is refused while non-zero).
    pub(crate) bound_windows: crate::sync::AtomicUsize,
}

impl MrEntry {
    pub(crate) fn register(
        pd: &Arc<PdCore>,
        block: MemBlock,
        access: AccessFlags,
        iova: Option<u64>,
    ) -> Result<Mr, RegMrError> {
        let ctx = &pd.ctx;
        let max = ctx.attr().max_mr;
        if !try_inc(&ctx.live.mrs, max) {
            return Err(RegMrError::Limit { max });
        }
        let inserted = ctx.mrs.insert_with(|index| {
            let mut rng = rand::rng();
            let lkey = make_key(index, &mut rng)?;
            let rkey = make_key(index, &mut rng)?;
            let mr = match iova {
                None => MrCore::new(pd.id, block, access, lkey, rkey)?,
                Some(iova) => MrCore::with_iova(pd.id, block, access, iova, lkey, rkey)?,
            };
            Ok(MrEntry {
                mr,
                pd: pd.clone(),
                index,
                bound_windows: crate::sync::AtomicUsize::new(0),
            })
        });
        match inserted {
            Ok((_, entry)) => {
                pd.children.mrs.fetch_add(1, crate::sync::Ordering::AcqRel);
                Ok(Mr {
                    r: MrRef { entry },
                    destroyed: false,
                })
            }
            Err(e) => {
                dec(&ctx.live.mrs);
                Err(match e {
                    InsertError::Make(e) => RegMrError::Mr(e),
                    InsertError::Full { .. } | InsertError::InUse { .. } => {
                        RegMrError::Limit { max }
                    }
                })
            }
        }
    }
}

impl Drop for MrEntry {
    fn drop(&mut self) {
        self.pd.ctx.mrs.release(self.index);
        // A child counts until it is released (see the crate docs).
        dec(&self.pd.children.mrs);
        dec(&self.pd.ctx.live.mrs);
    }
}

/// A counted reference to a memory region: what the transport holds while it accesses the
/// region. Dereferences to [`MrCore`] for the checks and copies. Never block while holding
/// one: it delays deregistration.
#[derive(Clone)]
pub struct MrRef {
    entry: Arc<MrEntry>,
}

impl MrRef {
    pub(crate) fn from_entry(entry: Arc<MrEntry>) -> MrRef {
        MrRef { entry }
    }

    /// The region's core (keys, checks, copies).
    pub fn core(&self) -> &MrCore {
        &self.entry.mr
    }

    /// The id of the PD the region belongs to.
    pub fn pd_id(&self) -> u32 {
        self.entry.pd.id
    }

    /// Whether two references name the same region.
    pub fn same_region(&self, other: &MrRef) -> bool {
        Arc::ptr_eq(&self.entry, &other.entry)
    }
}

impl Deref for MrRef {
    type Target = MrCore;
    fn deref(&self) -> &MrCore {
        &self.entry.mr
    }
}

impl fmt::Debug for MrRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrRef")
            .field("lkey", &format_args!("{:#010x}", self.entry.mr.lkey()))
            .field("rkey", &format_args!("{:#010x}", self.entry.mr.rkey()))
            .field("len", &self.entry.mr.len())
            .finish()
    }
}

/// A memory region (`ibv_mr`), created by [`crate::Pd::reg_mr`]. Unique owner handle;
/// dereferences to [`MrRef`] (and through it to [`MrCore`]).
pub struct Mr {
    r: MrRef,
    destroyed: bool,
}

impl Mr {
    /// Deregisters the region (`ibv_dereg_mr`); see the module docs. Fails with
    /// [`DestroyError::Busy`] (`EBUSY`) while memory windows are bound to the region
    /// (nothing changes), or if the memory could not be retired in time
    /// ([`DestroyError::Memory`]); the handle is then returned and the region is already
    /// unpublished.
    pub fn destroy(mut self) -> Result<(), (Mr, DestroyError)> {
        let mws = crate::context::get(&self.r.entry.bound_windows);
        if mws > 0 {
            return Err((
                self,
                DestroyError::Busy {
                    object: crate::error::ObjectKind::Mr,
                    children: crate::error::Children {
                        mws,
                        ..crate::error::Children::default()
                    },
                },
            ));
        }
        match self.retire() {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    fn retire(&self) -> Result<(), DestroyError> {
        let entry = &self.r.entry;
        let ctx = &entry.pd.ctx;
        drop(ctx.mrs.unpublish(entry.index));
        let timeout = ctx.destroy_timeout();
        // Bound memory windows hold references until they are invalidated: a handle dropped
        // with windows still bound (only `drop`; `destroy` refuses) retires the memory at
        // once instead of waiting for them.
        let windows = crate::context::get(&entry.bound_windows);
        if windows == 0 && wait_unreferenced(entry, 1, timeout).is_ok() {
            // Ours is the last reference: dropping the handle releases the region.
            return Ok(());
        }
        entry.mr.block().retire(timeout)?;
        Ok(())
    }

    /// Test hook: strong count of the region's entry (1 = only this handle).
    #[doc(hidden)]
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.r.entry)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if !self.destroyed {
            // Best effort: a failure leaves the region unpublished and its memory retiring;
            // it is released with the last reference.
            let _ = self.retire();
        }
    }
}

impl Deref for Mr {
    type Target = MrRef;
    fn deref(&self) -> &MrRef {
        &self.r
    }
}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.r, f)
    }
}

/// Why [`Mr::rereg`] failed, and what became of the region.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReregMrError {
    /// The new attributes are invalid; the old region is unchanged and returned.
    #[error("re-registration refused: {1}")]
    Invalid(Mr, RegMrError),
    /// The new PD belongs to another context; the old region is unchanged and returned.
    #[error("re-registration refused: the PD belongs to another context")]
    ForeignPd(Mr),
    /// The old region could not be retired in time; it is unpublished (no longer usable)
    /// and returned so that it can be deregistered.
    #[error("re-registration: the old region is still in use: {1}")]
    Busy(Mr, DestroyError),
    /// The old region is deregistered but the new one could not be registered.
    #[error("re-registration: registering the new region failed: {0}")]
    Register(RegMrError),
}

impl Mr {
    /// Re-registers the region (`ibv_rereg_mr`): the same region number and keys, now in
    /// `pd`, over `block` (the same memory again or another range), with `access` and byte
    /// 0 at `iova` (`None`: the block's address, 0 with [`AccessFlags::ZERO_BASED`]).
    ///
    /// The new attributes are checked first (nothing changes if they are invalid); then the
    /// old region is deregistered as by [`Mr::destroy`] (so no access through it is in
    /// flight) and the new one published under the old number with the old L_Key and
    /// R_Key. Should the number still be held by a late reference to the old region, the
    /// new region gets fresh keys instead (callers read the keys from the result).
    ///
    /// # Errors
    /// [`ReregMrError`], which says whether the old region is still usable.
    pub fn rereg(
        self,
        pd: &crate::Pd,
        block: MemBlock,
        access: AccessFlags,
        iova: Option<u64>,
    ) -> Result<Mr, ReregMrError> {
        let pd = pd.core();
        let old = &self.r.entry;
        if !Arc::ptr_eq(&pd.ctx, &old.pd.ctx) {
            return Err(ReregMrError::ForeignPd(self));
        }
        let (lkey, rkey, index) = (old.mr.lkey(), old.mr.rkey(), old.index);
        let core = match iova {
            None => MrCore::new(pd.id, block, access, lkey, rkey),
            Some(iova) => MrCore::with_iova(pd.id, block, access, iova, lkey, rkey),
        };
        let core = match core {
            Ok(c) => c,
            Err(e) => return Err(ReregMrError::Invalid(self, RegMrError::Mr(e))),
        };
        if let Err((old, e)) = self.destroy() {
            return Err(ReregMrError::Busy(old, e));
        }
        let ctx = &pd.ctx;
        let max = ctx.attr().max_mr;
        if !try_inc(&ctx.live.mrs, max) {
            return Err(ReregMrError::Register(RegMrError::Limit { max }));
        }
        let mut core = Some(core);
        let inserted = ctx.mrs.insert_at(index, |index| {
            core.take()
                .map(|mr| MrEntry {
                    mr,
                    pd: pd.clone(),
                    index,
                    // destroy() above refused while windows were bound: none are.
                    bound_windows: crate::sync::AtomicUsize::new(0),
                })
                .ok_or(())
        });
        match inserted {
            Ok(entry) => {
                pd.children.mrs.fetch_add(1, crate::sync::Ordering::AcqRel);
                Ok(Mr {
                    r: MrRef { entry },
                    destroyed: false,
                })
            }
            Err(_) => {
                dec(&ctx.live.mrs);
                // The number is still reserved (a late reference to the old region) or
                // the table is full: register afresh, with new keys.
                let core = core.ok_or(ReregMrError::Register(RegMrError::Limit { max }))?;
                let block = core.into_block();
                MrEntry::register(pd, block, access, iova).map_err(ReregMrError::Register)
            }
        }
    }
}
