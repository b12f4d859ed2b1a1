//! XRC domains: the scope of XRC SRQs and XRC_RECV (target) QPs (IBA Vol 1 Annex A14).
//!
//! An [`Xrcd`] counts its users — XRC SRQs and XRC_RECV QPs — and refuses an explicit
//! destroy while any exists ([`DestroyError::Busy`]).
//!
//! **XRC_RECV QPs are owned by the domain.** In verbs an XRC target QP outlives the process
//! that created it: other processes open it by number and it lives until the domain is
//! closed. uroce models this within one process: dropping an XRC_RECV [`Qp`] handle without
//! calling [`Qp::destroy`] hands the QP to its domain — it stays published and keeps
//! receiving — and [`Xrcd::open_qp`] gives out a new handle for it. An explicit
//! [`Qp::destroy`] destroys it. Dropping the [`Xrcd`] handle destroys the QPs the domain
//! owns (QPs that still have a handle keep the domain's state alive through it). Sharing
//! a domain between processes is later work.

use std::fmt;

use crate::context::{dec, get, try_inc, ContextCore};
use crate::cq::Cq;
use crate::error::{
    AllocError, Children, CreateQpError, CreateSrqError, DestroyError, ObjectKind, XrcError,
};
use crate::pd::Pd;
use crate::qp::{Qp, QpCap, QpCore, QpParts};
use crate::srq::{create_xrc, Srq, SrqInitAttr};
use crate::sync::{lock, Arc, AtomicUsize, Mutex};
use uroce_proto::qp_state::QpType;

struct Owned {
    /// Whether the domain handle still exists (adoption is possible).
    open: bool,
    qps: Vec<Arc<QpCore>>,
}

pub(crate) struct XrcdCore {
    pub(crate) id: u32,
    pub(crate) ctx: Arc<ContextCore>,
    /// XRC SRQs of the domain.
    pub(crate) srqs: AtomicUsize,
    /// XRC_RECV QPs of the domain (with or without handles).
    pub(crate) qps: AtomicUsize,
    owned: Mutex<Owned>,
}

impl XrcdCore {
    pub(crate) fn alloc(ctx: &Arc<ContextCore>) -> Result<Xrcd, AllocError> {
        let max = ctx.attr().max_xrcd;
        if !try_inc(&ctx.live.xrcds, max) {
            return Err(AllocError::Limit {
                object: ObjectKind::Xrcd,
                max,
            });
        }
        Ok(Xrcd {
            core: Arc::new(XrcdCore {
                id: ctx.next_id(),
                ctx: ctx.clone(),
                srqs: AtomicUsize::new(0),
                qps: AtomicUsize::new(0),
                owned: Mutex::new(Owned {
                    open: true,
                    qps: Vec::new(),
                }),
            }),
        })
    }

    /// Takes over an XRC_RECV QP whose handle is being dropped. `false` if the domain
    /// handle is gone (the QP is then destroyed by the caller).
    pub(crate) fn adopt(&self, qp: &Arc<QpCore>) -> bool {
        let mut owned = lock(&self.owned);
        if owned.open && qp.liveness.is_published() {
            owned.qps.push(qp.clone());
            true
        } else {
            false
        }
    }
}

impl Drop for XrcdCore {
    fn drop(&mut self) {
        dec(&self.ctx.live.xrcds);
    }
}

/// An XRC domain (`ibv_xrcd`). Unique owner handle.
pub struct Xrcd {
    core: Arc<XrcdCore>,
}

impl Xrcd {
    /// The domain's id (unique within its context).
    pub fn id(&self) -> u32 {
        self.core.id
    }

    /// Creates an XRC SRQ in this domain (`ibv_create_srq_ex` with `IBV_SRQT_XRC`); its
    /// receive completions go to `cq`.
    pub fn create_srq(&self, pd: &Pd, cq: &Cq, attr: &SrqInitAttr) -> Result<Srq, CreateSrqError> {
        create_xrc(&self.core, pd, cq, attr)
    }

    /// Creates an XRC_RECV (target) QP in this domain. It has no send queue, PD or CQ of its
    /// own: receives come from the XRC SRQ each packet names.
    pub fn create_qp(&self) -> Result<Qp, CreateQpError> {
        crate::engine::refuse_without_engine(&self.core.ctx, QpType::XrcRecv)?;
        QpCore::build(
            &self.core.ctx,
            QpParts {
                qp_type: QpType::XrcRecv,
                pd: None,
                send_cq: None,
                recv_cq: None,
                srq: None,
                xrcd: Some(self.core.clone()),
                cap: QpCap::default(),
                sq_sig_all: false,
            },
        )
    }

    /// A new handle for an XRC_RECV QP the domain owns (`ibv_open_qp`).
    pub fn open_qp(&self, qpn: u32) -> Result<Qp, XrcError> {
        let mut owned = lock(&self.core.owned);
        let pos = owned
            .qps
            .iter()
            .position(|q| q.qpn() == qpn)
            .ok_or(XrcError::NoSuchQp(qpn))?;
        let core = owned.qps.swap_remove(pos);
        Ok(Qp::from_core(core))
    }

    /// Numbers of the XRC_RECV QPs the domain owns (whose handles were dropped).
    pub fn owned_qps(&self) -> Vec<u32> {
        let owned = lock(&self.core.owned);
        let mut v: Vec<u32> = owned.qps.iter().map(|q| q.qpn()).collect();
        v.sort_unstable();
        v
    }

    /// The domain's users: XRC SRQs and XRC_RECV QPs.
    pub fn children(&self) -> Children {
        Children {
            qps: get(&self.core.qps),
            srqs: get(&self.core.srqs),
            ..Children::default()
        }
    }

    /// Closes the domain (`ibv_close_xrcd`): [`DestroyError::Busy`] while XRC SRQs or
    /// XRC_RECV QPs (with or without handles) exist.
    pub fn destroy(self) -> Result<(), (Xrcd, DestroyError)> {
        let children = self.children();
        if !children.is_empty() {
            return Err((
                self,
                DestroyError::Busy {
                    object: ObjectKind::Xrcd,
                    children,
                },
            ));
        }
        drop(self);
        Ok(())
    }
}

impl Drop for Xrcd {
    fn drop(&mut self) {
        let orphans = {
            let mut owned = lock(&self.core.owned);
            owned.open = false;
            std::mem::take(&mut owned.qps)
        };
        // Destroy the QPs the domain owns: each becomes a handle again and is dropped,
        // which (the domain being closed) destroys it.
        for core in orphans {
            drop(Qp::from_core(core));
        }
    }
}

impl fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Xrcd")
            .field("id", &self.core.id)
            .field("children", &self.children())
            .finish()
    }
}
