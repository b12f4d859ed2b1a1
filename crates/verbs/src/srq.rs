//! Shared receive queues, basic and XRC.
//!
//! An SRQ holds receive WQEs that any attached QP consumes. Every SRQ has a 24-bit number
//! from the context's SRQ table (XRC packets name their SRQ by it; events and lookups use
//! it too). The limit event is one-shot: [`SrqRef::modify`] with [`SrqAttrMask::LIMIT`] (or
//! a non-zero `srq_limit` at creation) arms it, and the first time a WQE is taken and fewer
//! than `srq_limit` WQEs remain, `SRQ_LIMIT_REACHED` is raised and the limit resets to 0
//! (docs/INTEROP-NOTES.md §7).

use std::collections::VecDeque;
use std::fmt;
use std::ops::Deref;

use crate::context::{dec, get, try_inc};
use crate::cq::{Cq, CqCore};
use crate::error::{
    Children, CreateSrqError, DestroyError, ModifySrqError, ObjectKind, PostError, RaiseError,
};
use crate::event::{AsyncEvent, ElementKind, EventElement, EventType, Liveness};
use crate::pd::{Pd, PdCore};
use crate::qp::{RecvWr, MAX_RECV_LEN};
use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering};
use crate::table::{wait_unreferenced, InsertError};
use crate::xrcd::XrcdCore;

/// Creation attributes (`ibv_srq_init_attr.attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqInitAttr {
    /// Maximum outstanding WRs.
    pub max_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Limit to arm at creation (0 = not armed).
    pub srq_limit: u32,
}

/// Current attributes (`ibv_query_srq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Maximum outstanding WRs.
    pub max_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// The armed limit (0 = not armed).
    pub srq_limit: u32,
}

bitflags::bitflags! {
    /// Which fields [`SrqRef::modify`] changes (`ibv_srq_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR`: resize.
        const MAX_WR = 1;
        /// `IBV_SRQ_LIMIT`: arm the limit event.
        const LIMIT = 2;
    }
}

struct SrqState {
    queue: VecDeque<RecvWr>,
    max_wr: u32,
    limit: u32,
}

/// The XRC part of an XRC SRQ.
pub(crate) struct XrcSrq {
    pub(crate) xrcd: Arc<XrcdCore>,
    pub(crate) cq: Arc<CqCore>,
}

pub(crate) struct SrqCore {
    pub(crate) srqn: u32,
    pub(crate) pd: Arc<PdCore>,
    pub(crate) xrc: Option<XrcSrq>,
    max_sge: u32,
    state: Mutex<SrqState>,
    /// QPs attached (basic SRQs; XRC SRQs are used per packet, not attached).
    pub(crate) qps: AtomicUsize,
    pub(crate) liveness: Liveness,
}

impl SrqCore {
    pub(crate) fn create(
        pd: &Arc<PdCore>,
        attr: &SrqInitAttr,
        xrc: Option<(&Arc<XrcdCore>, &Cq)>,
    ) -> Result<Srq, CreateSrqError> {
        let ctx = &pd.ctx;
        let dev = ctx.attr();
        if attr.max_wr == 0 || attr.max_wr > dev.max_srq_wr {
            return Err(CreateSrqError::InvalidSize {
                what: "max_wr",
                value: attr.max_wr,
                max: dev.max_srq_wr,
            });
        }
        if attr.max_sge == 0 || attr.max_sge > dev.max_srq_sge {
            return Err(CreateSrqError::InvalidSize {
                what: "max_sge",
                value: attr.max_sge,
                max: dev.max_srq_sge,
            });
        }
        if attr.srq_limit > attr.max_wr {
            return Err(CreateSrqError::LimitTooLarge {
                limit: attr.srq_limit,
                max_wr: attr.max_wr,
            });
        }
        if let Some((xrcd, cq)) = xrc {
            if !Arc::ptr_eq(&xrcd.ctx, ctx) {
                return Err(CreateSrqError::ForeignObject(ObjectKind::Xrcd));
            }
            if !Arc::ptr_eq(&cq.core().ctx, ctx) {
                return Err(CreateSrqError::ForeignObject(ObjectKind::Cq));
            }
        }
        let max = dev.max_srq;
        if !try_inc(&ctx.live.srqs, max) {
            return Err(CreateSrqError::Limit { max });
        }
        let inserted = ctx.srqs.insert_with(|srqn| {
            Ok::<_, ()>(SrqCore {
                srqn,
                pd: pd.clone(),
                xrc: xrc.map(|(xrcd, cq)| XrcSrq {
                    xrcd: xrcd.clone(),
                    cq: cq.core().clone(),
                }),
                max_sge: attr.max_sge,
                state: Mutex::new(SrqState {
                    queue: VecDeque::new(),
                    max_wr: attr.max_wr,
                    limit: attr.srq_limit,
                }),
                qps: AtomicUsize::new(0),
                liveness: Liveness::new(),
            })
        });
        let core = match inserted {
            Ok((_, core)) => core,
            Err(InsertError::Full { .. } | InsertError::InUse { .. } | InsertError::Make(())) => {
                dec(&ctx.live.srqs);
                return Err(CreateSrqError::Limit { max });
            }
        };
        pd.children.srqs.fetch_add(1, Ordering::AcqRel);
        if let Some(x) = &core.xrc {
            x.xrcd.srqs.fetch_add(1, Ordering::AcqRel);
            x.cq.attached.fetch_add(1, Ordering::AcqRel);
        }
        Ok(Srq {
            r: SrqRef { core },
            destroyed: false,
        })
    }

    /// Engine: takes the oldest WQE; raises SRQ_LIMIT_REACHED if that crosses the armed
    /// limit.
    pub(crate) fn take(this: &Arc<SrqCore>) -> Option<RecvWr> {
        let (wqe, fire) = {
            let mut st = lock(&this.state);
            let wqe = st.queue.pop_front()?;
            let fire = st.limit > 0 && (st.queue.len() as u64) < u64::from(st.limit);
            if fire {
                st.limit = 0;
            }
            (wqe, fire)
        };
        if fire {
            this.pd.ctx.events.raise(AsyncEvent::new(
                EventType::SrqLimitReached,
                EventElement::Srq(SrqRef { core: this.clone() }),
            ));
        }
        Some(wqe)
    }
}

impl Drop for SrqCore {
    fn drop(&mut self) {
        self.pd.ctx.srqs.release(self.srqn);
        if let Some(x) = &self.xrc {
            dec(&x.xrcd.srqs);
            dec(&x.cq.attached);
        }
        dec(&self.pd.children.srqs);
        dec(&self.pd.ctx.live.srqs);
    }
}

/// A counted reference to an SRQ with everything but destroy; [`Srq`] dereferences to it.
#[derive(Clone)]
pub struct SrqRef {
    core: Arc<SrqCore>,
}

impl SrqRef {
    pub(crate) fn from_core(core: Arc<SrqCore>) -> SrqRef {
        SrqRef { core }
    }

    pub(crate) fn core(&self) -> &Arc<SrqCore> {
        &self.core
    }

    /// The SRQ number (`ibv_get_srq_num`).
    pub fn srq_num(&self) -> u32 {
        self.core.srqn
    }

    /// Whether this is an XRC SRQ.
    pub fn is_xrc(&self) -> bool {
        self.core.xrc.is_some()
    }

    /// The id of the PD the SRQ belongs to.
    pub fn pd_id(&self) -> u32 {
        self.core.pd.id
    }

    /// Number of WQEs queued.
    pub fn len(&self) -> usize {
        lock(&self.core.state).queue.len()
    }

    /// Whether no WQE is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Posts a receive WR (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        if !self.core.liveness.is_published() {
            return Err(PostError::Destroyed(ObjectKind::Srq));
        }
        if wr.sg_list.len() > self.core.max_sge as usize {
            return Err(PostError::TooManySge {
                num: wr.sg_list.len(),
                max: self.core.max_sge,
            });
        }
        let len = wr.total_len();
        if len > MAX_RECV_LEN {
            return Err(PostError::MessageTooLong {
                len,
                max: MAX_RECV_LEN,
            });
        }
        let mut st = lock(&self.core.state);
        if st.queue.len() >= st.max_wr as usize {
            return Err(PostError::QueueFull {
                queue: "SRQ",
                max: st.max_wr,
            });
        }
        st.queue.push_back(wr);
        Ok(())
    }

    /// Current attributes (`ibv_query_srq`).
    pub fn query(&self) -> SrqAttr {
        let st = lock(&self.core.state);
        SrqAttr {
            max_wr: st.max_wr,
            max_sge: self.core.max_sge,
            srq_limit: st.limit,
        }
    }

    /// Modifies the SRQ (`ibv_modify_srq`): [`SrqAttrMask::LIMIT`] arms the limit event,
    /// [`SrqAttrMask::MAX_WR`] resizes. All checks happen before any change.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<(), ModifySrqError> {
        let dev_max = self.core.pd.ctx.attr().max_srq_wr;
        let mut st = lock(&self.core.state);
        let new_max = if mask.contains(SrqAttrMask::MAX_WR) {
            let min = u32::try_from(st.queue.len()).unwrap_or(u32::MAX).max(1);
            if attr.max_wr < min || attr.max_wr > dev_max {
                return Err(ModifySrqError::InvalidSize {
                    requested: attr.max_wr,
                    min,
                    max: dev_max,
                });
            }
            attr.max_wr
        } else {
            st.max_wr
        };
        if mask.contains(SrqAttrMask::LIMIT) && attr.srq_limit > new_max {
            return Err(ModifySrqError::LimitTooLarge {
                limit: attr.srq_limit,
                max_wr: new_max,
            });
        }
        st.max_wr = new_max;
        if mask.contains(SrqAttrMask::LIMIT) {
            st.limit = attr.srq_limit;
        }
        Ok(())
    }

    /// Raises an SRQ event (`SRQ_ERR`, `SRQ_LIMIT_REACHED`) on the context's queue. Returns
    /// whether it was queued (not if the SRQ is being destroyed).
    pub fn raise_event(&self, event: EventType) -> Result<bool, RaiseError> {
        event.expect_kind(ElementKind::Srq)?;
        Ok(self
            .core
            .pd
            .ctx
            .events
            .raise(AsyncEvent::new(event, EventElement::Srq(self.clone()))))
    }

    /// Live children (attached QPs).
    pub fn children(&self) -> Children {
        Children {
            qps: get(&self.core.qps),
            ..Children::default()
        }
    }
}

impl fmt::Debug for SrqRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrqRef")
            .field("srqn", &self.core.srqn)
            .field("xrc", &self.core.xrc.is_some())
            .finish()
    }
}

/// A shared receive queue (`ibv_srq`). Unique owner handle; dereferences to [`SrqRef`].
pub struct Srq {
    r: SrqRef,
    destroyed: bool,
}

impl Srq {
    /// Destroys the SRQ (`ibv_destroy_srq`): [`DestroyError::Busy`] while QPs are attached;
    /// otherwise unpublishes its number, discards its undelivered events and waits for
    /// outstanding references ([`DestroyError::InUse`] after the destroy timeout).
    pub fn destroy(mut self) -> Result<(), (Srq, DestroyError)> {
        let qps = get(&self.r.core.qps);
        if qps > 0 {
            return Err((
                self,
                DestroyError::Busy {
                    object: ObjectKind::Srq,
                    children: Children {
                        qps,
                        ..Children::default()
                    },
                },
            ));
        }
        match self.retire(true) {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    /// Unpublishes the object and purges its queued events; with `wait`, then waits for
    /// the remaining references (the handle's own excepted).
    fn retire(&self, wait: bool) -> Result<(), DestroyError> {
        let core = &self.r.core;
        let ctx = &core.pd.ctx;
        core.liveness.unpublish();
        drop(ctx.srqs.unpublish(core.srqn));
        ctx.events
            .purge(|e| matches!(e.element(), EventElement::Srq(s) if Arc::ptr_eq(&s.core, core)));
        if !wait {
            return Ok(());
        }
        wait_unreferenced(core, 1, ctx.destroy_timeout()).map_err(|e| DestroyError::InUse {
            object: ObjectKind::Srq,
            references: e.references,
        })
    }

    /// Test hook: strong count of the SRQ's shared state (1 = only this handle).
    #[doc(hidden)]
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.r.core)
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        if !self.destroyed {
            // With QPs attached the SRQ lives on through their references (released with
            // the last one); otherwise wait as destroy does.
            let idle = get(&self.r.core.qps) == 0;
            let _ = self.retire(idle);
        }
    }
}

impl Deref for Srq {
    type Target = SrqRef;
    fn deref(&self) -> &SrqRef {
        &self.r
    }
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.r, f)
    }
}

/// Used by [`crate::Xrcd::create_srq`].
pub(crate) fn create_xrc(
    xrcd: &Arc<XrcdCore>,
    pd: &Pd,
    cq: &Cq,
    attr: &SrqInitAttr,
) -> Result<Srq, CreateSrqError> {
    SrqCore::create(pd.core(), attr, Some((xrcd, cq)))
}
