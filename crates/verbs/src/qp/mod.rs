//! Queue pairs: creation, `modify_qp` / `query_qp`, posting work requests and flushing;
//! the work itself is done by the QP's protocol engine.
//!
//! # State machine
//!
//! [`QpRef::modify`] validates a call with `uroce_proto::qp_state` — the IBTA table as data
//! ([`check_modify`], [`check_sq_drain`], [`QpAttrLimits::check_values`]) — plus the value
//! checks that need the device (port, P_Key index, address vector, access flags, no
//! alternate path on RoCE). Every check runs before anything changes, under the QP's lock,
//! so a rejected modify leaves state and attributes exactly as they were; the error names
//! the offending attribute ([`ModifyQpError::attr`]).
//!
//! Side effects of transitions (roce-spec §3.5, §4 notes):
//! * **→ ERR**: every outstanding send WR completes with `WR_FLUSH_ERR` on the send CQ in
//!   posting order — error completions are generated even for unsignaled WRs — and every
//!   receive WR with `WR_FLUSH_ERR` on the receive CQ in posting order. A QP that receives
//!   from an SRQ flushes only the WQEs it had already taken; the SRQ keeps its WQEs and the
//!   QP raises `QP_LAST_WQE_REACHED`. WRs posted while in ERR are flushed immediately.
//! * **→ RESET**: queues are discarded without completions, and the QP's completions still
//!   queued on its CQs are removed (as rdma-core's providers clean a CQ when a QP moves to
//!   RESET: a QP brought back from ERR does not meet its old flush completions); attributes
//!   return to their initial values.
//! * **RTS → SQD**: no new send WR starts; when none is in flight `SQ_DRAINED` is raised
//!   (immediately if none was in flight). Like the Linux software driver, uroce raises it
//!   whether or not `en_sqd_async_notify` was set. Leaving SQD for anything but ERR is
//!   refused while the send queue still drains.
//!
//! # Posting
//!
//! [`QpRef::post_send`] follows the post rules of roce-spec §4 notes: RESET/INIT/RTR refuse,
//! RTS queues, SQD queues without starting, SQE/ERR flush. Verbs checks what the QP was
//! created with (the SGE count and inline size fit the QP's capabilities, the message the
//! device's `max_msg_sz`, a UD destination's AH is in the QP's PD, an XRC_SEND remote SRQ
//! number has 24 bits); the engine checks the protocol (the opcode suits the QP type,
//! atomics have 8 local bytes and an 8-byte aligned remote address, a UD WR has a
//! destination, ...) and refuses with [`PostError::Refused`] and a typed
//! [`uroce_proto::wr::WrError`]. No check runs twice. A refused WR produces no completion.
//! [`QpRef::post_send_all`] posts a list all or none (every WR, the state and the queue
//! room are checked before the first is queued).
//! [`QpRef::post_recv`] accepts WRs in every state but
//! RESET and refuses on QPs that receive through an SRQ.
//!
//! # One path: the protocol engine
//!
//! A QP's queues are its transport engine's ([`uroce_proto::engine::Engine`], see
//! [`crate::engine`]): the engine is built at INIT→RTR on every context, with or without a
//! transport installed, and from then on every posted WR goes to it, the engine completes
//! WRs (in order, a CQE for a send WR when `sq_sig_all`, the WR was `SIGNALED` or it
//! failed, §3.4; flush errors for every WR on ERR) and raises the QP's events; verbs moves
//! its completions to the CQs and its events to the context's queue. The engine's state is
//! the QP's state (held once, never copied back); verbs keeps one only while the QP has no
//! engine. Before RTR the QP has no engine: receives posted in INIT
//! wait in the QP and move into the engine at RTR (or are flushed if the QP goes to ERR
//! first). Without a transport nothing is ever transmitted; the object model's tests drive
//! traffic through the in-process [`crate::engine::Transport`] of the `loopback` feature.

use std::fmt;
use std::ops::Deref;

use uroce_proto::qp_state::{
    check_modify, check_sq_drain, AttrMask, PostOutcome, QpAttrLimits, QpAttrValues, QpState,
    QpType,
};
use uroce_wire::pmtu::Pmtu;

use crate::context::{dec, try_inc, ContextCore, GSI_QPN, MAX_QPN};
use crate::cq::{Cq, CqCore};
use crate::device::Gid;
use crate::error::{
    BatchPostError, CreateQpError, DestroyError, ModifyQpError, ObjectKind, PostError, RaiseError,
};
use crate::event::{AsyncEvent, ElementKind, EventElement, EventType, Liveness};
use crate::mr::AccessFlags;
use crate::pd::PdCore;
use crate::srq::SrqCore;
use crate::sync::{lock, Arc, Mutex, MutexGuard, Ordering};
use crate::table::{wait_unreferenced, InsertError};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::xrcd::XrcdCore;

mod attr;
mod wr;

pub use attr::{PathMigState, QpAttr, QpCap, QpInitAttr, QpInitInfo};
pub use wr::{
    AtomicInfo, InlineData, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, SgList, Sge, UdDest,
    MAX_RECV_LEN,
};

pub(crate) struct QpInner {
    /// The attributes `modify` set. `attr.qp_state` is the QP's state only while there is
    /// no engine (RESET, INIT, or ERR reached before RTR): from RTR until RESET the state
    /// is the engine's alone (see [`QpInner::state`]), never copied back here.
    pub(crate) attr: QpAttr,
    /// Receive WRs posted in INIT, before the engine exists (they move into it at RTR).
    init_recvs: Vec<RecvWr>,
    /// The transport engine, from the INIT→RTR transition until RESET (on every context).
    pub(crate) engine: Option<Box<dyn uroce_proto::engine::Engine>>,
    /// Completions the last engine call delivered to the CQs.
    pub(crate) delivered: usize,
}

pub(crate) struct QpCore {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) ctx: Arc<ContextCore>,
    pub(crate) pd: Option<Arc<PdCore>>,
    pub(crate) send_cq: Option<Arc<CqCore>>,
    pub(crate) recv_cq: Option<Arc<CqCore>>,
    pub(crate) srq: Option<Arc<SrqCore>>,
    pub(crate) xrcd: Option<Arc<XrcdCore>>,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    pub(crate) inner: Mutex<QpInner>,
    pub(crate) liveness: Liveness,
    /// The connection endpoint bound to the QP (see [`crate::binding`]).
    pub(crate) binding: crate::binding::BindSlot<std::sync::Arc<dyn crate::binding::BindingOwner>>,
}

/// Everything a new QP is made of (validated).
pub(crate) struct QpParts {
    pub(crate) qp_type: QpType,
    pub(crate) pd: Option<Arc<PdCore>>,
    pub(crate) send_cq: Option<Arc<CqCore>>,
    pub(crate) recv_cq: Option<Arc<CqCore>>,
    pub(crate) srq: Option<Arc<SrqCore>>,
    pub(crate) xrcd: Option<Arc<XrcdCore>>,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    /// A number given by the caller (an XRC target QP numbered host-wide by its domain,
    /// see [`crate::Xrcd::create_qp_numbered`]) instead of one from the context's range.
    pub(crate) qpn: Option<u32>,
}

impl QpInner {
    /// The QP's state: the engine's while it has one, else the one kept in `attr`.
    pub(crate) fn state(&self) -> QpState {
        match &self.engine {
            Some(e) => e.state(),
            None => self.attr.qp_state,
        }
    }

    /// Whether the send queue is draining: SQD entered, `SQ_DRAINED` not yet raised.
    pub(crate) fn sq_draining(&self) -> bool {
        self.attr.sq_draining && self.state() == QpState::Sqd
    }

    /// Removes and returns the receive WRs posted and not yet taken (they move into the
    /// engine at INIT→RTR).
    pub(crate) fn take_posted_recvs(&mut self) -> Vec<RecvWr> {
        std::mem::take(&mut self.init_recvs)
    }
}

impl QpCore {
    /// `ibv_create_qp` on a PD (every type but XRC_RECV).
    pub(crate) fn create(pd: &Arc<PdCore>, a: &QpInitAttr<'_>) -> Result<Qp, CreateQpError> {
        let ctx = &pd.ctx;
        let dev = ctx.attr();
        match a.qp_type {
            QpType::Smi | QpType::RawPacket => {
                return Err(CreateQpError::UnsupportedType(a.qp_type))
            }
            QpType::XrcRecv => return Err(CreateQpError::NeedsXrcDomain(a.qp_type)),
            QpType::Rc | QpType::Uc | QpType::Ud | QpType::Gsi | QpType::XrcSend => {}
        }
        crate::engine::refuse_without_engine(ctx, a.qp_type)?;
        let c = a.cap;
        for (cap, value, max) in [
            ("max_send_wr", c.max_send_wr, dev.max_qp_wr),
            ("max_recv_wr", c.max_recv_wr, dev.max_qp_wr),
            ("max_send_sge", c.max_send_sge, dev.max_sge),
            ("max_recv_sge", c.max_recv_sge, dev.max_sge),
            ("max_inline_data", c.max_inline_data, dev.max_inline_data),
        ] {
            if value > max {
                return Err(CreateQpError::CapTooLarge { cap, value, max });
            }
        }
        let same_ctx = |cq: &Cq| Arc::ptr_eq(&cq.core().ctx, ctx);
        let send_cq = a.send_cq.ok_or(CreateQpError::MissingCq {
            qp_type: a.qp_type,
            which: "send",
        })?;
        if !same_ctx(send_cq) {
            return Err(CreateQpError::ForeignObject(ObjectKind::Cq));
        }
        let mut cap = c;
        let (recv_cq, srq) = if a.qp_type == QpType::XrcSend {
            if a.recv_cq.is_some() {
                return Err(CreateQpError::NoReceiveSide {
                    qp_type: a.qp_type,
                    what: "a receive CQ",
                });
            }
            if a.srq.is_some() {
                return Err(CreateQpError::NoReceiveSide {
                    qp_type: a.qp_type,
                    what: "an SRQ",
                });
            }
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
            (None, None)
        } else {
            let recv_cq = a.recv_cq.ok_or(CreateQpError::MissingCq {
                qp_type: a.qp_type,
                which: "recv",
            })?;
            if !same_ctx(recv_cq) {
                return Err(CreateQpError::ForeignObject(ObjectKind::Cq));
            }
            let srq = match a.srq {
                None => None,
                Some(s) => {
                    if !Arc::ptr_eq(&s.core().pd.ctx, ctx) {
                        return Err(CreateQpError::ForeignObject(ObjectKind::Srq));
                    }
                    if s.is_xrc() {
                        return Err(CreateQpError::BadSrq(a.qp_type));
                    }
                    // With an SRQ the QP has no receive queue of its own.
                    cap.max_recv_wr = 0;
                    cap.max_recv_sge = 0;
                    Some(s.core().clone())
                }
            };
            (Some(recv_cq.core().clone()), srq)
        };
        QpCore::build(
            ctx,
            QpParts {
                qp_type: a.qp_type,
                pd: Some(pd.clone()),
                send_cq: Some(send_cq.core().clone()),
                recv_cq,
                srq,
                xrcd: None,
                cap,
                sq_sig_all: a.sq_sig_all,
                qpn: None,
            },
        )
    }

    /// Allocates the QPN (1 for GSI), publishes the QP and counts it in its parents.
    pub(crate) fn build(ctx: &Arc<ContextCore>, parts: QpParts) -> Result<Qp, CreateQpError> {
        let max = ctx.attr().max_qp;
        if !try_inc(&ctx.live.qps, max) {
            return Err(CreateQpError::Limit { max });
        }
        let make = |qpn: u32| -> Result<QpCore, ()> {
            // Count the QP in its parents as it comes to life; Drop undoes exactly this.
            if let Some(pd) = &parts.pd {
                pd.children.qps.fetch_add(1, Ordering::AcqRel);
            }
            for cq in [&parts.send_cq, &parts.recv_cq].into_iter().flatten() {
                cq.attached.fetch_add(1, Ordering::AcqRel);
            }
            if let Some(srq) = &parts.srq {
                srq.qps.fetch_add(1, Ordering::AcqRel);
            }
            if let Some(x) = &parts.xrcd {
                x.qps.fetch_add(1, Ordering::AcqRel);
            }
            Ok(QpCore {
                qpn,
                qp_type: parts.qp_type,
                ctx: ctx.clone(),
                pd: parts.pd.clone(),
                send_cq: parts.send_cq.clone(),
                recv_cq: parts.recv_cq.clone(),
                srq: parts.srq.clone(),
                xrcd: parts.xrcd.clone(),
                cap: parts.cap,
                sq_sig_all: parts.sq_sig_all,
                binding: crate::binding::BindSlot::new(),
                inner: Mutex::new(QpInner {
                    attr: QpAttr {
                        cap: parts.cap,
                        ..QpAttr::default()
                    },
                    init_recvs: Vec::new(),
                    engine: None,
                    delivered: 0,
                }),
                liveness: Liveness::new(),
            })
        };
        let fixed = parts.qpn;
        let inserted = if parts.qp_type == QpType::Gsi {
            ctx.qps.insert_at(GSI_QPN, make)
        } else if let Some(qpn) = fixed {
            ctx.qps.insert_at(qpn, make)
        } else {
            ctx.qps.insert_with(make).map(|(_, core)| core)
        };
        match inserted {
            Ok(core) => Ok(Qp {
                r: QpRef { core },
                destroyed: false,
            }),
            Err(e) => {
                dec(&ctx.live.qps);
                Err(match e {
                    InsertError::InUse { number, .. } if fixed.is_some() => {
                        CreateQpError::QpnInUse(number)
                    }
                    InsertError::InUse { .. } => CreateQpError::GsiExists,
                    InsertError::Full { .. } | InsertError::Make(()) => {
                        CreateQpError::Limit { max }
                    }
                })
            }
        }
    }

    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    fn flush_wc_send(&self, wr: &SendWr) -> WorkCompletion {
        WorkCompletion::error(
            wr.wr_id,
            WcStatus::WrFlushErr,
            wr.opcode.wc_opcode(),
            self.qpn,
        )
    }

    /// Moves a QP without an engine (RESET or INIT) to ERR: the receives posted in INIT
    /// are flushed in order (§3.5). A QP with an engine is moved by the engine, which
    /// flushes its own queues. Called with the lock held.
    fn enter_err_locked(this: &Arc<QpCore>, inner: &mut QpInner) {
        inner.attr.qp_state = QpState::Err;
        inner.attr.sq_draining = false;
        let posted = std::mem::take(&mut inner.init_recvs);
        if let Some(cq) = &this.recv_cq {
            for wr in posted {
                let wc =
                    WorkCompletion::error(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, this.qpn);
                // A full CQ has raised CQ_ERR; the remaining flushes are lost with it.
                let _ = CqCore::push(cq, wc, false);
            }
        }
        if this.srq.is_some() || this.qp_type == QpType::XrcRecv {
            // IBA o11-5.2.5: no further SRQ WQEs will be consumed by this QP.
            QpRef::raise_on(this, EventType::QpLastWqeReached);
        }
    }

    /// Moves the QP to RESET: queues discarded without completions, its completions removed
    /// from its CQs, attributes reset.
    fn enter_reset_locked(&self, inner: &mut QpInner) {
        for cq in [&self.send_cq, &self.recv_cq].into_iter().flatten() {
            cq.purge_qp(self.qpn);
        }
        inner.engine = None;
        inner.init_recvs.clear();
        inner.attr = QpAttr {
            cap: self.cap,
            ..QpAttr::default()
        };
    }

    /// Value checks that need the device or are RoCE-specific.
    fn check_values(&self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyQpError> {
        let dev = &self.ctx.device;
        let invalid = |bit: AttrMask, reason: String| ModifyQpError::InvalidValue {
            attr: bit,
            name: bit.attr_name(),
            reason,
        };
        if mask.contains(AttrMask::PKEY_INDEX) && attr.pkey_index >= dev.attr().max_pkeys {
            return Err(invalid(
                AttrMask::PKEY_INDEX,
                format!(
                    "P_Key index {} is outside the table of {}",
                    attr.pkey_index,
                    dev.attr().max_pkeys
                ),
            ));
        }
        if mask.contains(AttrMask::PORT) && attr.port_num != crate::device::PORT_NUM {
            return Err(invalid(
                AttrMask::PORT,
                format!("port {} does not exist (only port 1)", attr.port_num),
            ));
        }
        let qp_access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC
            | AccessFlags::MW_BIND;
        if mask.contains(AttrMask::ACCESS_FLAGS) && !qp_access.contains(attr.qp_access_flags) {
            return Err(invalid(
                AttrMask::ACCESS_FLAGS,
                format!(
                    "flags {:#x} are not QP access flags",
                    attr.qp_access_flags.difference(qp_access).bits()
                ),
            ));
        }
        if mask.contains(AttrMask::AV) {
            attr.ah_attr
                .validate(dev)
                .map_err(|e| invalid(AttrMask::AV, e.to_string()))?;
        }
        if mask.contains(AttrMask::ALT_PATH) {
            return Err(invalid(
                AttrMask::ALT_PATH,
                "alternate paths (APM) are not supported on RoCE".to_owned(),
            ));
        }
        if mask.contains(AttrMask::DEST_QPN) && attr.dest_qp_num > MAX_QPN {
            return Err(invalid(
                AttrMask::DEST_QPN,
                format!("{:#x} is not a 24-bit QPN", attr.dest_qp_num),
            ));
        }
        Ok(())
    }

    /// The capability checks of a send WR: what the QP was created with and the objects
    /// it was given (no send queue on an XRC target, SGE count, inline size, the device's
    /// largest message, the AH's PD, the width of an XRC SRQ number). Whether the WR is
    /// valid for the transport (opcode for the QP type, atomic operand length and
    /// alignment, inline with READ or atomics, a UD destination, a BIND_MW description) is
    /// the engine's check, made when the WR reaches it; verbs does not repeat it.
    fn validate_send(&self, wr: &SendWr) -> Result<(), PostError> {
        let qp_type = self.qp_type;
        if qp_type == QpType::XrcRecv {
            return Err(PostError::NoQueue {
                qp_type,
                queue: "send",
            });
        }
        if wr.flags.contains(SendFlags::INLINE) {
            // An ATOMIC WRITE's 8 bytes are its operand, carried with the WR as an
            // atomic's compare/swap values are (`ibv_wr_atomic_write` passes them by
            // pointer): `max_inline_data` does not limit them (the engine checks that
            // they are 8).
            if wr.opcode != SendOpcode::AtomicWrite
                && wr.inline_data.len() > self.cap.max_inline_data as usize
            {
                return Err(PostError::InlineTooLong {
                    len: wr.inline_data.len(),
                    max: self.cap.max_inline_data,
                });
            }
        } else if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(PostError::TooManySge {
                num: wr.sg_list.len(),
                max: self.cap.max_send_sge,
            });
        }
        let len = wr.total_len();
        let max_msg = self.ctx.attr().max_msg_sz;
        if len > max_msg {
            return Err(PostError::MessageTooLong { len, max: max_msg });
        }
        if let Some(ud) = &wr.ud {
            let same_pd = self.pd.as_ref().is_some_and(|pd| ud.ah.belongs_to(pd));
            if !same_pd {
                return Err(PostError::ForeignAh);
            }
        }
        if qp_type == QpType::XrcSend && wr.xrc_remote_srqn > MAX_QPN {
            return Err(PostError::BadRemoteSrqn(wr.xrc_remote_srqn));
        }
        Ok(())
    }
}

impl Drop for QpCore {
    fn drop(&mut self) {
        // What the engine counted stays in the context's totals.
        if let Some(e) = crate::sync::lock(&self.inner).engine.as_ref() {
            self.ctx
                .retired_engines
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .add(&e.counters());
        }
        self.ctx.qps.release(self.qpn);
        if let Some(pd) = &self.pd {
            dec(&pd.children.qps);
        }
        for cq in [&self.send_cq, &self.recv_cq].into_iter().flatten() {
            dec(&cq.attached);
        }
        if let Some(srq) = &self.srq {
            dec(&srq.qps);
        }
        if let Some(x) = &self.xrcd {
            dec(&x.qps);
        }
        dec(&self.ctx.live.qps);
    }
}

/// A counted reference to a QP with every operation but destroy. [`Qp`] dereferences to
/// it; QP events and [`crate::Context::qp_for_packet`] hand them out. A destroy waits until
/// all references are dropped, so never keep one longer than needed.
#[derive(Clone)]
pub struct QpRef {
    core: Arc<QpCore>,
}

impl QpRef {
    pub(crate) fn from_core(core: Arc<QpCore>) -> QpRef {
        QpRef { core }
    }

    pub(crate) fn core(&self) -> &Arc<QpCore> {
        &self.core
    }

    pub(crate) fn raise_on(core: &Arc<QpCore>, event: EventType) -> bool {
        core.ctx.events.raise(AsyncEvent::new(
            event,
            EventElement::Qp(QpRef { core: core.clone() }),
        ))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, QpInner> {
        lock(&self.core.inner)
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.core.qpn
    }

    /// Attaches this UD QP to the multicast group `gid` (`ibv_attach_mcast`; see
    /// [`crate::mcast`]). The LID is ignored (RoCE has none).
    ///
    /// # Errors
    /// [`crate::mcast::McastError`]: not a UD QP, not a multicast GID, a limit, or the I/O
    /// layer could not join the IP group.
    pub fn attach_mcast(&self, gid: Gid, _lid: u16) -> Result<(), crate::mcast::McastError> {
        use crate::mcast::{group_ip, is_multicast_gid, McastError};
        if self.core.qp_type != QpType::Ud {
            return Err(McastError::WrongQpType);
        }
        if !is_multicast_gid(gid) {
            return Err(McastError::NotMulticast(gid));
        }
        let ctx = &self.core.ctx;
        let group = group_ip(gid);
        ctx.mcast
            .attach(group, self.core.qpn, || match ctx.transport.get() {
                Some(t) => t.join_group(group),
                None => Ok(()),
            })
    }

    /// Detaches this QP from the multicast group `gid` (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// [`crate::mcast::McastError::NotAttached`] (or `NotMulticast`) when the QP is not
    /// attached to `gid`.
    pub fn detach_mcast(&self, gid: Gid, _lid: u16) -> Result<(), crate::mcast::McastError> {
        use crate::mcast::{group_ip, is_multicast_gid, McastError};
        if !is_multicast_gid(gid) {
            return Err(McastError::NotMulticast(gid));
        }
        let ctx = &self.core.ctx;
        let group = group_ip(gid);
        ctx.mcast.detach(group, self.core.qpn, || {
            if let Some(t) = ctx.transport.get() {
                t.leave_group(group);
            }
        })
    }

    /// Binds the QP to a connection endpoint (see [`crate::binding`]): the caller holds
    /// this reference (a clone it keeps) before the binding is published.
    ///
    /// # Errors
    /// [`crate::BindError::AlreadyBound`] when another endpoint holds the QP,
    /// [`crate::BindError::Destroyed`] once its destroy began.
    pub fn bind_endpoint(
        &self,
        token: u64,
        owner: std::sync::Arc<dyn crate::binding::BindingOwner>,
    ) -> Result<(), crate::binding::BindError> {
        if !self.is_published() {
            return Err(crate::binding::BindError::Destroyed);
        }
        self.core.binding.bind(token, owner)
    }

    /// Frees the binding made under `token`; returns whether it was bound so.
    pub fn unbind_endpoint(&self, token: u64) -> bool {
        self.core.binding.unbind(token)
    }

    /// The token of the endpoint bound now.
    pub fn bound_endpoint(&self) -> Option<u64> {
        self.core.binding.bound_token()
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.core.qp_type
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.lock().state()
    }

    /// Whether the QP is still published (not being destroyed).
    pub fn is_published(&self) -> bool {
        self.core.liveness.is_published()
    }

    /// The id of the QP's PD (`None` for XRC_RECV).
    pub fn pd_id(&self) -> Option<u32> {
        self.core.pd.as_ref().map(|p| p.id)
    }

    /// Whether two references name the same QP.
    pub fn same_qp(&self, other: &QpRef) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }

    /// Current attributes and creation attributes (`ibv_query_qp`).
    pub fn query(&self) -> (QpAttr, QpInitInfo) {
        let inner = self.lock();
        let mut attr = inner.attr;
        attr.qp_state = inner.state();
        attr.sq_draining = inner.sq_draining();
        attr.cur_qp_state = attr.qp_state;
        let c = &self.core;
        (
            attr,
            QpInitInfo {
                qp_type: c.qp_type,
                cap: c.cap,
                sq_sig_all: c.sq_sig_all,
                send_cq: c.send_cq.as_ref().map(|q| q.id),
                recv_cq: c.recv_cq.as_ref().map(|q| q.id),
                srq_num: c.srq.as_ref().map(|s| s.srqn),
                xrcd: c.xrcd.as_ref().map(|x| x.id),
            },
        )
    }

    /// Modifies the QP (`ibv_modify_qp`); see the module docs. On error nothing changed.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyQpError> {
        let core = &self.core;
        if mask.contains(AttrMask::STATE) && matches!(attr.qp_state, QpState::Err | QpState::Reset)
        {
            // What the QP still has to send leaves first, as on destroy: an ACK deferred
            // for the application's next post would be lost with the state, and its peer
            // would see its last SEND flushed by the disconnect that follows
            // (`rdma_disconnect` moves the QP to ERR right after the last completion).
            crate::engine::flush(core);
        }
        let mut inner = self.lock();
        let cur = inner.state();
        let next = if mask.contains(AttrMask::STATE) {
            attr.qp_state
        } else {
            cur
        };
        let cur_attr = mask
            .contains(AttrMask::CUR_STATE)
            .then_some(attr.cur_qp_state);
        check_modify(core.qp_type, cur, next, mask, cur_attr)?;
        check_sq_drain(cur, next, inner.sq_draining())?;
        let max_mtu = core
            .ctx
            .device
            .port_attr(crate::device::PORT_NUM)
            .map(|p| p.max_mtu)
            .unwrap_or(Pmtu::Mtu4096);
        QpAttrLimits::rxe(u32::from(max_mtu.enum_value())).check_values(
            mask,
            &QpAttrValues {
                path_mtu: u32::from(attr.path_mtu.enum_value()),
                timeout: attr.timeout,
                alt_timeout: attr.alt_timeout,
                retry_cnt: attr.retry_cnt,
                rnr_retry: attr.rnr_retry,
                min_rnr_timer: attr.min_rnr_timer,
                max_rd_atomic: u32::from(attr.max_rd_atomic),
                max_dest_rd_atomic: u32::from(attr.max_dest_rd_atomic),
            },
        )?;
        core.check_values(attr, mask)?;
        // Every check passed: apply.
        inner.attr.apply(attr, mask);
        crate::engine::reconfigure_engine(core, &mut inner);
        if next != cur && crate::engine::modify_engine(core, &mut inner, cur, next) {
            return Ok(());
        }
        if next != cur {
            match next {
                QpState::Err => QpCore::enter_err_locked(core, &mut inner),
                QpState::Reset => core.enter_reset_locked(&mut inner),
                QpState::Sqd => {
                    // Without an engine nothing is in flight: drained at once.
                    inner.attr.qp_state = QpState::Sqd;
                    inner.attr.sq_draining = false;
                    QpRef::raise_on(core, EventType::SqDrained);
                }
                other => inner.attr.qp_state = other,
            }
        }
        Ok(())
    }

    /// Posts one send WR (`ibv_post_send`); see the module docs for the rules.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        let core = &self.core;
        core.validate_send(&wr)?;
        let mut inner = self.lock();
        if !core.liveness.is_published() {
            return Err(PostError::Destroyed(ObjectKind::Qp));
        }
        let state = inner.state();
        match state.send_post() {
            None => Err(PostError::InvalidState {
                queue: "send",
                state,
            }),
            // ERR before RTR: no engine to check or flush the WR; flushed here.
            Some(PostOutcome::Flush) if inner.engine.is_none() => {
                if let Some(cq) = &core.send_cq {
                    let _ = CqCore::push(cq, core.flush_wc_send(&wr), false);
                }
                Ok(())
            }
            // The engine checks the WR, then queues it (RTS, SQD) or flushes it (ERR).
            Some(_) => {
                crate::engine::post_send(core, &mut inner, wr)?;
                drop(inner);
                crate::engine::ring(core);
                Ok(())
            }
        }
    }

    /// Posts send WRs in order, all or none (the `ibv_wr_*` API's `ibv_wr_complete`):
    /// every WR is checked against the QP and, under the QP's lock, against the state and
    /// the room left in the send queue before the first is queued. On error nothing was
    /// posted; `index` is the WR that would have been refused (`QueueFull`: the first
    /// that does not fit).
    pub fn post_send_all(&self, wrs: Vec<SendWr>) -> Result<(), BatchPostError> {
        let core = &self.core;
        for (index, wr) in wrs.iter().enumerate() {
            core.validate_send(wr)
                .map_err(|error| BatchPostError { index, error })?;
        }
        if wrs.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        let at_first = |error| BatchPostError { index: 0, error };
        if !core.liveness.is_published() {
            return Err(at_first(PostError::Destroyed(ObjectKind::Qp)));
        }
        let state = inner.state();
        match state.send_post() {
            None => Err(at_first(PostError::InvalidState {
                queue: "send",
                state,
            })),
            Some(PostOutcome::Flush) if inner.engine.is_none() => {
                if let Some(cq) = &core.send_cq {
                    for wr in &wrs {
                        let _ = CqCore::push(cq, core.flush_wc_send(wr), false);
                    }
                }
                Ok(())
            }
            Some(_) => {
                crate::engine::post_send_all(core, &mut inner, wrs)?;
                drop(inner);
                crate::engine::ring(core);
                Ok(())
            }
        }
    }

    /// Posts send WRs in order, stopping at the first refused one (`bad_wr`).
    pub fn post_send_batch(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), BatchPostError> {
        for (index, wr) in wrs.into_iter().enumerate() {
            self.post_send(wr)
                .map_err(|error| BatchPostError { index, error })?;
        }
        Ok(())
    }

    /// Posts one receive WR (`ibv_post_recv`); see the module docs for the rules.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        let core = &self.core;
        let qp_type = core.qp_type;
        if matches!(qp_type, QpType::XrcSend | QpType::XrcRecv) {
            return Err(PostError::NoQueue {
                qp_type,
                queue: "receive",
            });
        }
        if core.srq.is_some() {
            return Err(PostError::SrqAttached);
        }
        if wr.sg_list.len() > core.cap.max_recv_sge as usize {
            return Err(PostError::TooManySge {
                num: wr.sg_list.len(),
                max: core.cap.max_recv_sge,
            });
        }
        let len = wr.total_len();
        if len > MAX_RECV_LEN {
            return Err(PostError::MessageTooLong {
                len,
                max: MAX_RECV_LEN,
            });
        }
        let mut inner = self.lock();
        if !core.liveness.is_published() {
            return Err(PostError::Destroyed(ObjectKind::Qp));
        }
        let state = inner.state();
        match state.recv_post() {
            None => Err(PostError::InvalidState {
                queue: "receive",
                state,
            }),
            Some(PostOutcome::Flush) if inner.engine.is_none() => {
                if let Some(cq) = &core.recv_cq {
                    let wc = WorkCompletion::error(
                        wr.wr_id,
                        WcStatus::WrFlushErr,
                        WcOpcode::Recv,
                        core.qpn,
                    );
                    let _ = CqCore::push(cq, wc, false);
                }
                Ok(())
            }
            // The engine queues the WR, or flushes it in ERR.
            Some(_) if inner.engine.is_some() => crate::engine::post_recv(core, &mut inner, wr),
            Some(_) => {
                // INIT: no engine yet; the WR waits in the QP until RTR.
                if inner.init_recvs.len() >= core.cap.max_recv_wr as usize {
                    return Err(PostError::QueueFull {
                        queue: "receive",
                        max: core.cap.max_recv_wr,
                    });
                }
                inner.init_recvs.push(wr);
                Ok(())
            }
        }
    }

    /// Posts receive WRs in order, stopping at the first refused one (`bad_wr`).
    pub fn post_recv_batch(
        &self,
        wrs: impl IntoIterator<Item = RecvWr>,
    ) -> Result<(), BatchPostError> {
        for (index, wr) in wrs.into_iter().enumerate() {
            self.post_recv(wr)
                .map_err(|error| BatchPostError { index, error })?;
        }
        Ok(())
    }

    /// Raises a QP event on the context's queue (the transport raises `COMM_EST`,
    /// `QP_FATAL`, ...). Returns whether it was queued: not if the QP is being destroyed
    /// or the queue was shut down.
    pub fn raise_event(&self, event: EventType) -> Result<bool, RaiseError> {
        event.expect_kind(ElementKind::Qp)?;
        Ok(QpRef::raise_on(&self.core, event))
    }
}

impl fmt::Debug for QpRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpRef")
            .field("qpn", &format_args!("{:#x}", self.core.qpn))
            .field("type", &self.core.qp_type)
            .finish()
    }
}

/// A queue pair (`ibv_qp`). Unique owner handle; dereferences to [`QpRef`].
///
/// [`Qp::destroy`] (or drop) unpublishes the QPN, discards the QP's undelivered events and
/// waits for outstanding references (unacknowledged events, transport lookups) before the
/// QP is released. An XRC_RECV QP handle that is dropped without `destroy` hands the QP to
/// its XRC domain instead (see [`crate::Xrcd`]).
pub struct Qp {
    r: QpRef,
    destroyed: bool,
}

impl Qp {
    /// Destroys the QP (`ibv_destroy_qp`). On [`DestroyError::InUse`] (references held past
    /// the context's destroy timeout) the QP stays unpublished and the handle is returned:
    /// acknowledge the events and call `destroy` again, or drop it to release the QP with
    /// its last reference.
    pub fn destroy(mut self) -> Result<(), (Qp, DestroyError)> {
        match self.retire() {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    fn retire(&self) -> Result<(), DestroyError> {
        let core = &self.r.core;
        let ctx = &core.ctx;
        // 0. What the QP still has to send (an ACK held back for a post that will not
        // come) leaves now, while the QP can still be found.
        crate::engine::flush(core);
        // 0b. Out of every multicast group (the last member leaves the IP group).
        ctx.mcast.detach_all(core.qpn, |g| {
            if let Some(t) = ctx.transport.get() {
                t.leave_group(g);
            }
        });
        // 1. No new events for it from now on (checked under the event queue's lock).
        core.liveness.unpublish();
        // 2. No new lookups; the QPN stays reserved until the release.
        drop(ctx.qps.unpublish(core.qpn));
        // 2b. No new binding; a bound connection endpoint drops its reference and aborts
        // (see `crate::binding`), before we wait for the references.
        if let Some(owner) = core.binding.kill() {
            owner.qp_destroyed(core.qpn);
        }
        // 3. Undelivered events go (their references with them).
        ctx.events
            .purge(|e| matches!(e.element(), EventElement::Qp(q) if Arc::ptr_eq(&q.core, core)));
        // 4. Wait for in-flight users and unacknowledged events.
        wait_unreferenced(core, 1, ctx.destroy_timeout()).map_err(|e| DestroyError::InUse {
            object: ObjectKind::Qp,
            references: e.references,
        })
        // 5. The release (QpCore::drop) happens when the handle's reference goes.
    }

    /// Test hook: strong count of the QP's shared state (1 = only this handle).
    #[doc(hidden)]
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.r.core)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        if let Some(xrcd) = &self.r.core.xrcd {
            if xrcd.adopt(&self.r.core) {
                return;
            }
        }
        let _ = self.retire();
    }
}

impl Deref for Qp {
    type Target = QpRef;
    fn deref(&self) -> &QpRef {
        &self.r
    }
}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.r, f)
    }
}

impl Qp {
    pub(crate) fn from_core(core: Arc<QpCore>) -> Qp {
        Qp {
            r: QpRef { core },
            destroyed: false,
        }
    }
}
