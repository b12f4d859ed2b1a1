//! Protection domains: the parent of QPs, MRs, SRQs and AHs.

use std::fmt;

use crate::ah::{Ah, AhAttr, AhCore};
use crate::context::{dec, get, try_inc, ContextCore};
use crate::error::{
    AllocError, Children, CreateAhError, CreateQpError, CreateSrqError, DestroyError, ObjectKind,
    RegMrError,
};
use crate::mem::MemBlock;
use crate::mr::AccessFlags;
use crate::qp::{Qp, QpCore, QpInitAttr};
use crate::region::{Mr, MrEntry};
use crate::srq::{Srq, SrqCore, SrqInitAttr};
use crate::sync::{Arc, AtomicUsize};

/// Live children of a PD.
#[derive(Default)]
pub(crate) struct PdChildren {
    pub(crate) qps: AtomicUsize,
    pub(crate) mrs: AtomicUsize,
    pub(crate) srqs: AtomicUsize,
    pub(crate) ahs: AtomicUsize,
    pub(crate) mws: AtomicUsize,
}

pub(crate) struct PdCore {
    pub(crate) id: u32,
    pub(crate) ctx: Arc<ContextCore>,
    pub(crate) children: PdChildren,
}

impl PdCore {
    pub(crate) fn alloc(ctx: &Arc<ContextCore>) -> Result<Pd, AllocError> {
        let max = ctx.attr().max_pd;
        if !try_inc(&ctx.live.pds, max) {
            return Err(AllocError::Limit {
                object: ObjectKind::Pd,
                max,
            });
        }
        Ok(Pd {
            core: Arc::new(PdCore {
                id: ctx.next_id(),
                ctx: ctx.clone(),
                children: PdChildren::default(),
            }),
        })
    }

    pub(crate) fn children(&self) -> Children {
        Children {
            qps: get(&self.children.qps),
            mrs: get(&self.children.mrs),
            srqs: get(&self.children.srqs),
            ahs: get(&self.children.ahs),
            mws: get(&self.children.mws),
            ..Children::default()
        }
    }
}

impl Drop for PdCore {
    fn drop(&mut self) {
        dec(&self.ctx.live.pds);
    }
}

/// A protection domain (`ibv_pd`). Unique owner handle.
///
/// Children (QPs, MRs, SRQs, AHs) keep the PD's state alive, so dropping the handle first
/// is safe; an explicit [`Pd::destroy`] refuses with [`DestroyError::Busy`] while any child
/// is alive, as `ibv_dealloc_pd` does.
pub struct Pd {
    core: Arc<PdCore>,
}

impl Pd {
    pub(crate) fn core(&self) -> &Arc<PdCore> {
        &self.core
    }

    /// The PD's id (unique within its context; memory regions check it).
    pub fn id(&self) -> u32 {
        self.core.id
    }

    /// Creates a QP (`ibv_create_qp`) of type RC, UC, UD, GSI or XRC_SEND. XRC_RECV QPs are
    /// created by [`crate::Xrcd::create_qp`].
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Qp, CreateQpError> {
        QpCore::create(&self.core, attr)
    }

    /// Creates a shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, attr: &SrqInitAttr) -> Result<Srq, CreateSrqError> {
        SrqCore::create(&self.core, attr, None)
    }

    /// Creates an address handle (`ibv_create_ah`).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<Ah, CreateAhError> {
        AhCore::create(&self.core, attr)
    }

    /// Registers `block` as a memory region with `access` rights (`ibv_reg_mr`). Its IOVA is
    /// the block's address (0 with [`AccessFlags::ZERO_BASED`]).
    pub fn reg_mr(&self, block: MemBlock, access: AccessFlags) -> Result<Mr, RegMrError> {
        MrEntry::register(&self.core, block, access, None)
    }

    /// Registers `block` with an explicit IOVA for its first byte (`ibv_reg_mr_iova`).
    pub fn reg_mr_iova(
        &self,
        block: MemBlock,
        access: AccessFlags,
        iova: u64,
    ) -> Result<Mr, RegMrError> {
        MrEntry::register(&self.core, block, access, Some(iova))
    }

    /// Allocates a memory window (`ibv_alloc_mw`) of type 1 or 2, unbound, with an R_Key
    /// of its own; see [`crate::mw`].
    pub fn alloc_mw(&self, mw_type: crate::mw::MwType) -> Result<crate::mw::Mw, AllocError> {
        crate::mw::MwEntry::alloc(&self.core, mw_type)
    }

    /// The live children.
    pub fn children(&self) -> Children {
        self.core.children()
    }

    /// Deallocates the PD (`ibv_dealloc_pd`); [`DestroyError::Busy`] while it has children.
    pub fn destroy(self) -> Result<(), (Pd, DestroyError)> {
        let children = self.core.children();
        if !children.is_empty() {
            return Err((
                self,
                DestroyError::Busy {
                    object: ObjectKind::Pd,
                    children,
                },
            ));
        }
        drop(self);
        Ok(())
    }

    /// Test hook: strong count of the PD's shared state (1 = only this handle).
    #[doc(hidden)]
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.core)
    }
}

impl fmt::Debug for Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pd")
            .field("id", &self.core.id)
            .field("children", &self.core.children())
            .finish()
    }
}
