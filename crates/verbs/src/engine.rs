//! The binding of QPs to the protocol layer's transport engines
//! ([`uroce_proto::engine::Engine`]), and the hook through which the I/O layer drives them.
//!
//! A QP gets its engine at the INIT→RTR transition, on every context (the engine is the
//! QP's only queue implementation; a context without a [`Transport`] never transmits),
//! from `build_engine`, the one factory that knows the transports: it builds the engine for the QP's type from the QP's attributes
//! (RC, and XRC_SEND / XRC_RECV as its two XRC halves: [`uroce_proto::rc::RcQp`]; UC:
//! [`uroce_proto::uc::UcQp`]; UD and GSI: [`uroce_proto::ud::UdQp`], whose largest
//! datagram is the port's active MTU). An XRC target QP resolves each request's SRQ number
//! in the context's SRQ table (only XRC SRQs of its own domain; memory is then checked
//! against that SRQ's PD) and its receive completions go to that SRQ's CQ. Receive
//! WRs posted in INIT move into it. Only the types
//! [`engine_supported`] names can be created on such a context at all (others are refused
//! by `create_qp` with `CreateQpError::UnsupportedType`), so no QP accepts work that no
//! engine would ever carry. From then on
//! `post_send` / `post_recv` go to the engine, and the engine's completions and events are
//! drained into the QP's CQs and the context's event queue after every call into it, under
//! the QP's lock. RTS hands the engine the requester attributes, SQD and ERR are forwarded
//! (ERR flushes through the engine, which completes its queues in posting order), RESET
//! drops it.
//!
//! Memory is reached through [`QpMemory`], the [`Memory`] implementation over the
//! context's MR table with the QP's protection domain bound in: every access looks the
//! region up by key (a counted reference), and the region performs the key, PD, bounds and
//! permission checks.
//!
//! The I/O layer (which sits above this crate) installs a [`Transport`] on the context:
//! posting rings it ([`Transport::ring`]) and polling an empty CQ asks it for progress
//! ([`Transport::poll_progress`]); it calls back into the QP through the `engine_*`
//! methods of [`QpRef`] with packets (and the [`Arrival`] addresses they came with), timer
//! expiries and transmit buffers (getting back each packet's destination address).

use std::net::IpAddr;
use std::sync::Arc as StdArc;

use uroce_proto::engine::LiveAttrs;
pub use uroce_proto::engine::{Arrival, EngineCounters};
use uroce_proto::engine::{Engine, Reply};
use uroce_proto::memory::{
    AtomicOp, LocalAccessError, Memory, RemoteAccessError, RemoteOp as ProtoRemoteOp,
};
use uroce_proto::qp_state::{QpState, QpType};
use uroce_proto::rc::{
    CqKind, Env, PostError as EnginePostError, QpEvent, RcConfig, RcQp, RemoteAccess, RtsAttrs,
    SharedRecvQueue, XrcSrqError, XrcSrqs,
};
use uroce_proto::time::Instant;
use uroce_proto::uc::{UcConfig, UcQp};
use uroce_proto::ud::{UdConfig, UdQp};
use uroce_proto::wr as pwr;
use uroce_wire::PacketRepr;

use crate::context::ContextCore;
use crate::cq::CqCore;
use crate::error::{BatchPostError, CreateQpError, PostError};
use crate::event::EventType;
use crate::mr::{key_index, required_access, AccessError};
use crate::qp::{QpCore, QpInner, QpRef, RecvWr, SendFlags, SendWr};
use crate::srq::SrqCore;
use crate::sync::Arc;

/// How the verbs objects of a context reach the network. Installed once per context by
/// the I/O layer ([`crate::Context::set_transport`]).
pub trait Transport: Send + Sync {
    /// QP `qpn` has new work to send (called after a successful `post_send`, without any
    /// verbs lock held).
    fn ring(&self, qpn: u32);

    /// An application thread polled an empty CQ: drive progress now if no other thread is
    /// doing so. Returns whether anything was done. Called without any verbs lock held.
    fn poll_progress(&self) -> bool;

    /// QP `qpn` is about to be destroyed: send what it still has to send now (waiting for
    /// the network lock if needed). Called without any verbs lock held.
    fn flush(&self, qpn: u32);

    /// The first QP of this context attached to the multicast group `group` (an IP
    /// multicast address, see [`crate::mcast`]): start receiving the group's datagrams.
    /// Called without any verbs lock but the multicast table's own held. The default
    /// (a transport without multicast) accepts and does nothing.
    fn join_group(&self, group: std::net::IpAddr) -> std::io::Result<()> {
        let _ = group;
        Ok(())
    }

    /// The last QP of this context detached from `group`: stop receiving it.
    fn leave_group(&self, group: std::net::IpAddr) {
        let _ = group;
    }
}

/// The installed transport, if any.
pub(crate) type TransportSlot = std::sync::OnceLock<StdArc<dyn Transport>>;

/// Whether a transport engine exists for `qp_type`: the QP types a context with a
/// [`Transport`] (a network device's) creates. The one place to extend when an engine is
/// added to `build_engine` (in this module).
pub const fn engine_supported(qp_type: QpType) -> bool {
    matches!(
        qp_type,
        QpType::Rc | QpType::Uc | QpType::Ud | QpType::Gsi | QpType::XrcSend | QpType::XrcRecv
    )
}

/// On a context with a transport, a QP whose type no engine carries would accept work and
/// never move: `create_qp` refuses it with [`CreateQpError::UnsupportedType`]. Without a
/// transport (the object model on its own, as its tests use it) every type is created.
pub(crate) fn refuse_without_engine(
    ctx: &ContextCore,
    qp_type: QpType,
) -> Result<(), CreateQpError> {
    if ctx.transport.get().is_some() && !engine_supported(qp_type) {
        return Err(CreateQpError::UnsupportedType(qp_type));
    }
    Ok(())
}

/// Memory as one QP's engine sees it: the context's MR table, restricted to the QP's PD.
pub struct QpMemory<'a> {
    ctx: &'a ContextCore,
    /// The PD accesses are checked against: the QP's, or for an XRC target QP the PD of
    /// the XRC SRQ the current packet named (set by [`DomainSrqs::select`]).
    pd_id: std::cell::Cell<u32>,
    /// The QP (type 2 memory windows are bound to one QP).
    qpn: u32,
    /// The region of the previous access (one engine call, e.g. a transmit batch of a
    /// large message, mostly touches one region): saves the table lookup.
    last: std::cell::RefCell<Option<Arc<crate::region::MrEntry>>>,
}

impl<'a> QpMemory<'a> {
    fn new(ctx: &'a ContextCore, pd_id: u32, qpn: u32) -> QpMemory<'a> {
        QpMemory {
            ctx,
            pd_id: std::cell::Cell::new(pd_id),
            qpn,
            last: std::cell::RefCell::new(None),
        }
    }

    fn region(&self, key: u32) -> Option<Arc<crate::region::MrEntry>> {
        let hit = |e: &Arc<crate::region::MrEntry>| e.mr.lkey() == key || e.mr.rkey() == key;
        if let Some(e) = self.last.borrow().as_ref().filter(|e| hit(e)) {
            return Some(e.clone());
        }
        let found = self.ctx.mrs.get(key_index(key)).filter(hit);
        self.last.replace(found.clone());
        found
    }

    fn window(&self, rkey: u32) -> Option<Arc<crate::mw::MwEntry>> {
        self.ctx.mws.get(key_index(rkey))
    }

    /// A remote access through a window key: the checks of [`crate::mw::check_access`],
    /// then the region to copy from or to (its own bounds are checked by the copy).
    fn window_region(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        op: ProtoRemoteOp,
    ) -> Result<Arc<crate::region::MrEntry>, RemoteAccessError> {
        let w = self
            .window(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        let need = required_access(op);
        match crate::mw::check_access(&w, self.pd_id.get(), self.qpn, rkey, va, len, need) {
            crate::mw::WindowAccess::Region(r) => Ok(r),
            crate::mw::WindowAccess::BadKey => Err(RemoteAccessError::BadKey { rkey }),
            crate::mw::WindowAccess::NoPermission => {
                Err(RemoteAccessError::NoPermission { rkey, op })
            }
            crate::mw::WindowAccess::OutOfBounds => {
                Err(RemoteAccessError::OutOfBounds { rkey, va, len })
            }
        }
    }
}

fn local_error(lkey: u32, addr: u64, len: usize, e: AccessError) -> LocalAccessError {
    match e {
        AccessError::WrongKey { .. } | AccessError::WrongPd { .. } | AccessError::Deregistered => {
            LocalAccessError::BadKey { lkey }
        }
        AccessError::NoPermission { .. } => LocalAccessError::NotWritable { lkey },
        AccessError::Revoked => LocalAccessError::Revoked { lkey },
        AccessError::OutOfBounds { .. } | AccessError::Misaligned { .. } => {
            LocalAccessError::OutOfBounds {
                lkey,
                addr,
                len: len as u64,
            }
        }
    }
}

fn remote_error(
    rkey: u32,
    va: u64,
    len: u64,
    op: ProtoRemoteOp,
    e: AccessError,
) -> RemoteAccessError {
    match e {
        AccessError::WrongKey { .. } | AccessError::WrongPd { .. } | AccessError::Deregistered => {
            RemoteAccessError::BadKey { rkey }
        }
        AccessError::NoPermission { .. } => RemoteAccessError::NoPermission { rkey, op },
        AccessError::Revoked => RemoteAccessError::Revoked { rkey },
        AccessError::Misaligned { va } => RemoteAccessError::Misaligned { va },
        AccessError::OutOfBounds { .. } => RemoteAccessError::OutOfBounds { rkey, va, len },
    }
}

impl Memory for QpMemory<'_> {
    fn read_local(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), LocalAccessError> {
        let r = self.region(lkey).ok_or(LocalAccessError::BadKey { lkey })?;
        r.mr.local_read(self.pd_id.get(), lkey, addr, dst)
            .map_err(|e| local_error(lkey, addr, dst.len(), e))
    }

    fn write_local(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), LocalAccessError> {
        let r = self.region(lkey).ok_or(LocalAccessError::BadKey { lkey })?;
        r.mr.local_write(self.pd_id.get(), lkey, addr, src)
            .map_err(|e| local_error(lkey, addr, src.len(), e))
    }

    fn check_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        op: ProtoRemoteOp,
    ) -> Result<(), RemoteAccessError> {
        if len == 0 {
            return Ok(());
        }
        if crate::mw::is_window_key(rkey) {
            return self.window_region(rkey, va, len, op).map(|_| ());
        }
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        r.mr.check_remote(self.pd_id.get(), rkey, va, len, op)
            .map_err(|e| remote_error(rkey, va, len, op, e))
    }

    fn write_remote(&self, rkey: u32, va: u64, src: &[u8]) -> Result<(), RemoteAccessError> {
        if src.is_empty() {
            return Ok(());
        }
        let op = ProtoRemoteOp::Write;
        let len = src.len() as u64;
        if crate::mw::is_window_key(rkey) {
            let r = self.window_region(rkey, va, len, op)?;
            return r
                .mr
                .write(va, src)
                .map_err(|e| remote_error(rkey, va, len, op, e));
        }
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        r.mr.remote_write(self.pd_id.get(), rkey, va, src)
            .map_err(|e| remote_error(rkey, va, len, op, e))
    }

    fn read_remote(&self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), RemoteAccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        let op = ProtoRemoteOp::Read;
        let len = dst.len() as u64;
        if crate::mw::is_window_key(rkey) {
            let r = self.window_region(rkey, va, len, op)?;
            return r
                .mr
                .read(va, dst)
                .map_err(|e| remote_error(rkey, va, len, op, e));
        }
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        r.mr.remote_read(self.pd_id.get(), rkey, va, dst)
            .map_err(|e| remote_error(rkey, va, len, op, e))
    }

    fn atomic_remote(&self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError> {
        let rop = ProtoRemoteOp::Atomic;
        if crate::mw::is_window_key(rkey) {
            if va % 8 != 0 {
                return Err(RemoteAccessError::Misaligned { va });
            }
            let r = self.window_region(rkey, va, 8, rop)?;
            let res = match op {
                AtomicOp::FetchAdd { add } => r.mr.atomic_fetch_add(va, add),
                AtomicOp::CompareSwap { compare, swap } => {
                    r.mr.atomic_compare_swap(va, compare, swap)
                }
            };
            return res.map_err(|e| remote_error(rkey, va, 8, rop, e));
        }
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        let res = match op {
            AtomicOp::FetchAdd { add } => r.mr.remote_fetch_add(self.pd_id.get(), rkey, va, add),
            AtomicOp::CompareSwap { compare, swap } => {
                r.mr.remote_compare_swap(self.pd_id.get(), rkey, va, compare, swap)
            }
        };
        res.map_err(|e| remote_error(rkey, va, 8, rop, e))
    }

    fn atomic_write_remote(
        &self,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), RemoteAccessError> {
        let op = ProtoRemoteOp::Write;
        if crate::mw::is_window_key(rkey) {
            let r = self.window_region(rkey, va, 8, op)?;
            return r
                .mr
                .atomic_store(va, u64::from_ne_bytes(value))
                .map_err(|e| remote_error(rkey, va, 8, op, e));
        }
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        r.mr.remote_atomic_write(self.pd_id.get(), rkey, va, value)
            .map_err(|e| remote_error(rkey, va, 8, op, e))
    }

    /// Only a type 2 memory window bound to this QP can be invalidated by a peer (IBA
    /// 10.6.7.2): a type 1 window, a window bound to another QP, and a region registered
    /// with `reg_mr` (uroce has no fast-registration regions) are refused as a permission
    /// error, an unknown or stale key as a bad key.
    fn invalidate_remote(&self, rkey: u32) -> Result<(), RemoteAccessError> {
        if crate::mw::is_window_key(rkey) {
            let w = self
                .window(rkey)
                .ok_or(RemoteAccessError::BadKey { rkey })?;
            return crate::mw::invalidate_remote(&w, self.pd_id.get(), self.qpn, rkey).map_err(
                |e| match e {
                    crate::mw::MwError::WrongType { .. }
                    | crate::mw::MwError::WrongState { .. } => RemoteAccessError::NoPermission {
                        rkey,
                        op: ProtoRemoteOp::Write,
                    },
                    _ => RemoteAccessError::BadKey { rkey },
                },
            );
        }
        match self.region(rkey) {
            Some(_) => Err(RemoteAccessError::NoPermission {
                rkey,
                op: ProtoRemoteOp::Write,
            }),
            None => Err(RemoteAccessError::BadKey { rkey }),
        }
    }

    fn bind_window(&self, bind: &uroce_proto::memory::MwBind) -> Result<(), crate::mw::MwError> {
        let rkey = bind.mw_rkey;
        let w = self
            .window(rkey)
            .ok_or(crate::mw::MwError::BadWindow { rkey })?;
        let mr = self.ctx.mrs.get(key_index(bind.mr_lkey));
        crate::mw::bind(&w, self.pd_id.get(), self.qpn, bind, mr)
    }

    fn invalidate_local(&self, rkey: u32) -> Result<(), crate::mw::MwError> {
        let w = self
            .window(rkey)
            .ok_or(crate::mw::MwError::BadWindow { rkey })?;
        crate::mw::invalidate_local(&w, self.pd_id.get(), rkey)
    }
}

/// An SRQ as the engine's receive-WQE source.
struct SrqSource<'a>(&'a Arc<SrqCore>);

impl SharedRecvQueue for SrqSource<'_> {
    fn take(&mut self) -> Option<RecvWr> {
        SrqCore::take(self.0)
    }
}

/// The XRC SRQs of an XRC target QP's domain, as the engine resolves them per packet
/// ([`XrcSrqs`]): an SRQ number is looked up in the context's SRQ table (a counted
/// reference) and accepted only if it is an XRC SRQ of the QP's own domain; selecting it
/// also points the QP's memory view at the SRQ's PD.
struct DomainSrqs<'a> {
    ctx: &'a ContextCore,
    xrcd: Option<&'a Arc<crate::xrcd::XrcdCore>>,
    mem: &'a QpMemory<'a>,
    current: Option<Arc<SrqCore>>,
}

impl XrcSrqs for DomainSrqs<'_> {
    fn select(&mut self, srqn: u32) -> Result<(), XrcSrqError> {
        if self.current.as_ref().is_some_and(|s| s.srqn == srqn) {
            return Ok(());
        }
        self.current = None;
        let srq = self.ctx.srqs.get(srqn).ok_or(XrcSrqError::Unknown(srqn))?;
        let same = match (&srq.xrc, self.xrcd) {
            (Some(x), Some(d)) => Arc::ptr_eq(&x.xrcd, d),
            _ => false,
        };
        if !same {
            return Err(XrcSrqError::OtherDomain(srqn));
        }
        self.mem.pd_id.set(srq.pd.id);
        self.current = Some(srq);
        Ok(())
    }

    fn take(&mut self) -> Option<RecvWr> {
        self.current.as_ref().and_then(SrqCore::take)
    }
}

/// Runs `f` with the engine and an [`Env`] for this QP, then drains completions and
/// events. Returns `None` when the QP has no engine.
fn with_engine<R>(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    f: impl FnOnce(&mut dyn Engine, &mut Env<'_>) -> R,
) -> Option<R> {
    let engine = inner.engine.as_deref_mut()?;
    let mem = QpMemory::new(&core.ctx, core.pd.as_ref().map_or(0, |pd| pd.id), core.qpn);
    let r = match &core.srq {
        None if core.qp_type == QpType::XrcRecv => {
            let mut srqs = DomainSrqs {
                ctx: &core.ctx,
                xrcd: core.xrcd.as_ref(),
                mem: &mem,
                current: None,
            };
            let mut env = Env::with_xrc(&mem, &mut srqs);
            f(engine, &mut env)
        }
        Some(srq) => {
            let mut source = SrqSource(srq);
            let mut env = Env::with_srq(&mem, &mut source);
            f(engine, &mut env)
        }
        None => {
            let mut env = Env::new(&mem);
            f(engine, &mut env)
        }
    };
    inner.delivered = drain(core, inner);
    Some(r)
}

/// Moves the engine's completions to the CQs and its events to the event queue. (An
/// engine-detected error needs no mirroring: the engine's state is the QP's.)
fn drain(core: &Arc<QpCore>, inner: &mut QpInner) -> usize {
    let Some(engine) = inner.engine.as_deref_mut() else {
        return 0;
    };
    let mut delivered = 0;
    // Bounded: every round either empties the engine's queues or moves it to ERR, after
    // which a second round only flushes.
    for _round in 0..2 {
        let mut overrun = false;
        while let Some((kind, wc)) = engine.poll_completion() {
            let xrc_cq;
            let cq = match kind {
                CqKind::Send => core.send_cq.as_ref(),
                CqKind::Recv => core.recv_cq.as_ref(),
                CqKind::XrcSrq(srqn) => {
                    // The CQ of the XRC SRQ the WQE came from (it may have been destroyed
                    // since: the completion is then lost with it).
                    xrc_cq = core
                        .ctx
                        .srqs
                        .get(srqn)
                        .and_then(|s| s.xrc.as_ref().map(|x| x.cq.clone()));
                    xrc_cq.as_ref()
                }
            };
            if let Some(cq) = cq {
                if CqCore::push(cq, wc, wc.solicited).is_err() {
                    overrun = true;
                } else {
                    delivered += 1;
                }
            }
        }
        while let Some(ev) = engine.poll_event() {
            let event = match ev {
                QpEvent::CommEst => EventType::CommEst,
                QpEvent::SqDrained => {
                    inner.attr.sq_draining = false;
                    EventType::SqDrained
                }
                QpEvent::LastWqeReached => EventType::QpLastWqeReached,
                QpEvent::QpFatal => EventType::QpFatal,
                QpEvent::QpReqErr => EventType::QpReqErr,
                QpEvent::QpAccessErr => EventType::QpAccessErr,
            };
            QpRef::raise_on(core, event);
        }
        if overrun && engine.state() != QpState::Err {
            // The CQ raised CQ_ERR; the QP cannot complete work any more (IBA: affiliated
            // asynchronous error on the QP).
            engine.set_state(QpState::Err);
            QpRef::raise_on(core, EventType::QpFatal);
            continue;
        }
        break;
    }
    delivered
}

/// The transport engine for `core`'s type, built from the QP's attributes at INIT→RTR;
/// `None` for a type no engine implements (which [`engine_supported`] keeps from being
/// created on a networked context). The only place that names a concrete engine.
fn build_engine(core: &QpCore, inner: &QpInner) -> Option<Box<dyn Engine>> {
    match core.qp_type {
        QpType::Rc => Some(Box::new(RcQp::new_rtr(rc_config(core, inner)))),
        QpType::Ud | QpType::Gsi => Some(Box::new(UdQp::new_rtr(ud_config(core, inner)?))),
        QpType::Uc => Some(Box::new(UcQp::new_rtr(uc_config(core, inner)))),
        // XRC: the RC engine on the XRC opcodes, initiator or target half.
        QpType::XrcSend | QpType::XrcRecv => {
            let mut cfg = rc_config(core, inner);
            cfg.qp_type = core.qp_type;
            Some(Box::new(RcQp::new_rtr(cfg)))
        }
        // The types uroce never creates.
        QpType::Smi | QpType::RawPacket => None,
    }
}

/// The device's own address (GID 0), what a datagram engine puts in the GRH area of a
/// receive as the destination.
fn local_ip(core: &QpCore) -> Option<IpAddr> {
    core.ctx
        .device
        .gid(crate::device::PORT_NUM, 0)
        .ok()
        .map(|g| g.to_ip())
}

/// The P_Key at the QP's `pkey_index` (0xFFFF, the default P_Key, if there is none).
fn pkey(core: &QpCore, inner: &QpInner) -> u16 {
    core.ctx
        .device
        .pkey(crate::device::PORT_NUM, inner.attr.pkey_index)
        .unwrap_or(0xffff)
}

/// The UD (or GSI) engine's configuration from the QP's attributes at INIT→RTR: the
/// Q_Key and P_Key index of INIT, the port's active MTU as the largest datagram (a UD QP
/// has no path MTU attribute), the device's address as the local end of every datagram.
/// `None` when the device has no address (GID 0 empty), which a network device always has.
fn ud_config(core: &QpCore, inner: &QpInner) -> Option<UdConfig> {
    let a = &inner.attr;
    let mut cfg = UdConfig::new(core.qpn, a.qkey, local_ip(core)?);
    cfg.qp_type = core.qp_type;
    cfg.pmtu = core.ctx.device.active_mtu();
    cfg.sq_psn = a.sq_psn;
    cfg.sq_sig_all = core.sq_sig_all;
    cfg.max_send_wr = core.cap.max_send_wr;
    cfg.max_recv_wr = core.cap.max_recv_wr;
    cfg.use_srq = core.srq.is_some();
    cfg.pkey = pkey(core, inner);
    cfg.pkey_index = a.pkey_index;
    Some(cfg)
}

/// The UC engine's configuration from the QP's attributes at INIT→RTR.
fn uc_config(core: &QpCore, inner: &QpInner) -> UcConfig {
    let a = &inner.attr;
    let mut cfg = UcConfig::new(core.qpn, a.dest_qp_num, a.ah_attr.dest_ip());
    cfg.local = path_local_ip(core, inner);
    cfg.pmtu = a.path_mtu;
    cfg.sq_psn = a.sq_psn;
    cfg.rq_psn = a.rq_psn;
    cfg.access = RemoteAccess::from_bits_truncate(a.qp_access_flags.bits());
    cfg.sq_sig_all = core.sq_sig_all;
    cfg.max_send_wr = core.cap.max_send_wr;
    cfg.max_recv_wr = core.cap.max_recv_wr;
    cfg.use_srq = core.srq.is_some();
    cfg.pkey = pkey(core, inner);
    cfg
}

/// The RC engine's configuration from the QP's attributes at INIT→RTR.
fn rc_config(core: &QpCore, inner: &QpInner) -> RcConfig {
    let a = &inner.attr;
    let mut cfg = RcConfig::new(core.qpn, a.dest_qp_num);
    cfg.pmtu = a.path_mtu;
    cfg.sq_psn = a.sq_psn;
    cfg.rq_psn = a.rq_psn;
    cfg.timeout = a.timeout;
    cfg.retry_cnt = a.retry_cnt;
    cfg.rnr_retry = a.rnr_retry;
    cfg.min_rnr_timer = a.min_rnr_timer;
    cfg.max_rd_atomic = a.max_rd_atomic;
    cfg.max_dest_rd_atomic = a.max_dest_rd_atomic;
    cfg.access = RemoteAccess::from_bits_truncate(a.qp_access_flags.bits());
    cfg.sq_sig_all = core.sq_sig_all;
    cfg.max_send_wr = core.cap.max_send_wr;
    cfg.max_recv_wr = core.cap.max_recv_wr;
    cfg.use_srq = core.srq.is_some();
    cfg.pkey = pkey(core, inner);
    cfg.peer = a.ah_attr.dest_ip();
    cfg.local = path_local_ip(core, inner);
    cfg
}

/// A connected QP's own address: the device GID its address vector's source GID index
/// names.
fn path_local_ip(core: &QpCore, inner: &QpInner) -> Option<IpAddr> {
    core.ctx
        .device
        .valid_gid(u32::from(inner.attr.ah_attr.sgid_index))
        .map(|g| g.to_ip())
}

/// Hands a running engine the attributes a modify may change after RTR (access flags, RNR
/// timer, the path, P_Key, Q_Key), as the QP's attributes now hold them; called by
/// `modify` after every modify of a QP with an engine, before the transition (so that an
/// SQD→RTS with a new address vector resumes on the new path). Without it a modify that
/// revoked remote WRITE access in RTS→RTS would have left the responder executing WRITEs.
pub(crate) fn reconfigure_engine(core: &Arc<QpCore>, inner: &mut QpInner) {
    if inner.engine.is_none() {
        return;
    }
    let a = &inner.attr;
    let attrs = LiveAttrs {
        access: RemoteAccess::from_bits_truncate(a.qp_access_flags.bits()),
        min_rnr_timer: a.min_rnr_timer,
        peer: a.ah_attr.dest_ip(),
        local: path_local_ip(core, inner),
        pkey_index: a.pkey_index,
        pkey: pkey(core, inner),
        qkey: a.qkey,
    };
    with_engine(core, inner, |e, _| e.reconfigure(&attrs));
}

/// Applies a state transition to the engine. Returns `true` when the transition was fully
/// handled here (the QP has, or now gets, an engine), `false` when the generic path of
/// `modify` must run (no engine for the type, RESET, INIT, ERR before RTR).
pub(crate) fn modify_engine(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    cur: QpState,
    next: QpState,
) -> bool {
    // Every context builds engines, with or without a transport: a QP has no other queues.
    // Without a transport the engine's output simply waits (nothing is ever transmitted).
    if !engine_supported(core.qp_type) {
        return false;
    }
    match next {
        QpState::Rtr if cur == QpState::Init => {
            let Some(mut engine) = build_engine(core, inner) else {
                return false;
            };
            // Receives posted in INIT move into the engine, in order.
            for wr in inner.take_posted_recvs() {
                // Cannot fail: the verbs queue held at most max_recv_wr of them.
                let _ = engine.post_recv(wr);
            }
            inner.engine = Some(engine);
            true
        }
        QpState::Rts if inner.engine.is_some() => {
            let a = inner.attr;
            let rts = RtsAttrs {
                sq_psn: a.sq_psn,
                timeout: a.timeout,
                retry_cnt: a.retry_cnt,
                rnr_retry: a.rnr_retry,
                max_rd_atomic: a.max_rd_atomic,
            };
            with_engine(core, inner, |e, _| e.enter_rts(rts));
            true
        }
        QpState::Sqd if inner.engine.is_some() => {
            inner.attr.sq_draining = true;
            with_engine(core, inner, |e, _| e.set_state(QpState::Sqd));
            true
        }
        QpState::Err | QpState::Sqe if inner.engine.is_some() => {
            inner.attr.sq_draining = false;
            with_engine(core, inner, |e, _| e.set_state(QpState::Err));
            true
        }
        _ => false,
    }
}

fn engine_post_error(e: EnginePostError, queue: &'static str, max: u32) -> PostError {
    match e {
        EnginePostError::QueueFull => PostError::QueueFull { queue, max },
        EnginePostError::BadState(state) => PostError::InvalidState { queue, state },
        EnginePostError::InvalidWr(reason) => PostError::Refused(reason),
    }
}

/// The protocol layer's form of a verbs send WR: the opcode as is (the engine refuses
/// what its transport does not execute, with a typed reason), the UD destination resolved
/// (the address handle's GID to the IP address it maps to, with its GRH values and SL),
/// the XRC remote SRQ number.
fn to_engine_wr(wr: SendWr) -> pwr::SendWr {
    let inline = wr.flags.contains(SendFlags::INLINE);
    let (remote_addr, rkey) = if wr.opcode.is_atomic() {
        (wr.atomic.remote_addr, wr.atomic.rkey)
    } else {
        (wr.rdma.remote_addr, wr.rdma.rkey)
    };
    pwr::SendWr {
        wr_id: wr.wr_id,
        opcode: wr.opcode,
        flags: wr.flags,
        payload: if inline {
            pwr::SendPayload::Inline(wr.inline_data)
        } else {
            pwr::SendPayload::Sges(wr.sg_list)
        },
        imm_data: wr.imm_data,
        invalidate_rkey: wr.invalidate_rkey,
        remote_addr,
        rkey,
        compare_add: wr.atomic.compare_add,
        swap: wr.atomic.swap,
        ud: wr.ud.as_ref().map(ud_dest),
        remote_srqn: wr.xrc_remote_srqn,
        bind: wr.bind_mw.map(|b| uroce_proto::memory::MwBind {
            mw_rkey: b.mw_rkey,
            new_rkey: b.rkey,
            mr_lkey: b.info.mr_lkey,
            addr: b.info.addr,
            length: b.info.length,
            access: b.info.access.bits(),
            type1: b.is_type1(),
        }),
    }
}

/// `wr.ud` as the engine's destination.
pub(crate) fn ud_dest(ud: &crate::qp::UdDest) -> pwr::UdDest {
    let a = ud.ah.attr();
    pwr::UdDest {
        ip: a.dest_ip(),
        remote_qpn: ud.remote_qpn,
        remote_qkey: ud.remote_qkey,
        traffic_class: a.traffic_class,
        hop_limit: a.hop_limit,
        // 20 bits: checked when the AH was created.
        flow_label: a.flow_label,
        sl: a.sl,
    }
}

/// `post_send` on a QP with an engine (state already checked: RTS or SQD).
pub(crate) fn post_send(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    wr: SendWr,
) -> Result<(), PostError> {
    let ewr = to_engine_wr(wr);
    let max = core.cap.max_send_wr;
    with_engine(core, inner, |e, _| e.post_send(ewr))
        .unwrap_or(Err(EnginePostError::BadState(QpState::Reset)))
        .map_err(|e| engine_post_error(e, "send", max))
}

/// `post_send` of a list on a QP with an engine (state already checked: RTS or SQD), all
/// or none: the engine checks the whole list ([`Engine::check_send_list`]) before the
/// first WR is queued, under the same lock.
pub(crate) fn post_send_all(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    wrs: Vec<SendWr>,
) -> Result<(), BatchPostError> {
    let ewrs: Vec<pwr::SendWr> = wrs.into_iter().map(to_engine_wr).collect();
    let max = core.cap.max_send_wr;
    with_engine(core, inner, |e, _| {
        e.check_send_list(&ewrs)?;
        for (i, w) in ewrs.into_iter().enumerate() {
            // Accepted by the check above; a refusal here would be an engine bug.
            e.post_send(w).map_err(|x| (i, x))?;
        }
        Ok(())
    })
    .unwrap_or(Err((0, EnginePostError::BadState(QpState::Reset))))
    .map_err(|(index, e)| BatchPostError {
        index,
        error: engine_post_error(e, "send", max),
    })
}

/// `post_recv` on a QP with an engine.
pub(crate) fn post_recv(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    wr: RecvWr,
) -> Result<(), PostError> {
    let max = core.cap.max_recv_wr;
    with_engine(core, inner, |e, _| e.post_recv(wr))
        .unwrap_or(Err(EnginePostError::BadState(QpState::Reset)))
        .map_err(|e| engine_post_error(e, "receive", max))
}

/// Tells the context's transport that `core` has work to send.
pub(crate) fn ring(core: &Arc<QpCore>) {
    if let Some(t) = core.ctx.transport.get() {
        t.ring(core.qpn);
    }
}

/// Sends what a QP about to be destroyed still has to send.
pub(crate) fn flush(core: &Arc<QpCore>) {
    if let Some(t) = core.ctx.transport.get() {
        t.flush(core.qpn);
    }
}

/// Asks the context's transport for progress (an application polled an empty CQ).
pub(crate) fn poll_progress(ctx: &ContextCore) -> bool {
    ctx.transport.get().is_some_and(|t| t.poll_progress())
}

/// What a transmit call produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Transmitted {
    /// Packets written.
    pub packets: usize,
    /// Bytes written (sum of the packet lengths).
    pub bytes: usize,
    /// Whether the engine stopped because the room or the packet limit ran out (it may
    /// have more to send).
    pub limited: bool,
}

/// What [`QpRef::engine_handle_packet`] did with a received packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handled {
    /// Work completions delivered to the CQs so far.
    pub delivered: usize,
    /// When the engine's answer may leave ([`Reply::Deferrable`]: an acknowledgement a
    /// polling application's step may hold until its next post).
    pub reply: Reply,
}

/// One packet of a transmit batch: its length in the buffer (packets lie back to back)
/// and the address it goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TxPacket {
    /// Bytes (BTH..ICRC).
    pub len: usize,
    /// Destination IP address (UDP port 4791).
    pub dst: IpAddr,
}

/// The engine-driving API the I/O layer uses. Every method takes the QP's lock for the
/// duration of the call and drains completions and events before returning.
impl QpRef {
    /// Whether the QP has a transport engine (between RTR and RESET).
    pub fn has_engine(&self) -> bool {
        self.lock().engine.is_some()
    }

    /// Hands a received packet (addressed to this QP, ICRC already checked) and the
    /// addresses it came with to the engine. Returns how many work completions it
    /// delivered to the CQs and when the engine's answer may leave, or `None` if the QP
    /// has no engine (the packet is dropped).
    pub fn engine_handle_packet(
        &self,
        now: Instant,
        from: &Arrival,
        pkt: &PacketRepr<'_>,
    ) -> Option<Handled> {
        let core = self.core();
        let mut inner = self.lock();
        let reply = with_engine(core, &mut inner, |e, env| {
            e.handle_packet(now, from, pkt, env)
        })?;
        Some(Handled {
            delivered: inner.delivered,
            reply,
        })
    }

    /// Runs the engine's timers (call when `now` ≥ [`QpRef::engine_poll_timeout`]).
    pub fn engine_handle_timeout(&self, now: Instant) {
        let core = self.core();
        let mut inner = self.lock();
        with_engine(core, &mut inner, |e, env| e.handle_timeout(now, env));
    }

    /// The engine's next timer deadline.
    pub fn engine_poll_timeout(&self) -> Option<Instant> {
        self.lock().engine.as_ref().and_then(|e| e.poll_timeout())
    }

    /// Emits up to `max_packets` packets back to back into `buf` (each BTH..ICRC with the
    /// ICRC zero, for the caller to seal), appending each packet's length and destination
    /// to `out`. A packet is only attempted while at least `max_packet_len` bytes of `buf`
    /// remain.
    pub fn engine_transmit(
        &self,
        now: Instant,
        buf: &mut [u8],
        max_packet_len: usize,
        max_packets: usize,
        out: &mut Vec<TxPacket>,
    ) -> Transmitted {
        let core = self.core();
        let mut inner = self.lock();
        with_engine(core, &mut inner, |e, env| {
            let mut t = Transmitted::default();
            loop {
                if t.packets >= max_packets {
                    t.limited = true;
                    break;
                }
                let Some(room) = buf.get_mut(t.bytes..).filter(|r| r.len() >= max_packet_len)
                else {
                    t.limited = true;
                    break;
                };
                match e.poll_transmit(now, env, room) {
                    Some(tx) => {
                        out.push(TxPacket {
                            len: tx.len,
                            dst: tx.dst,
                        });
                        t.packets += 1;
                        t.bytes += tx.len;
                    }
                    None => break,
                }
            }
            t
        })
        .unwrap_or_default()
    }

    /// The engine's counters, if the QP has an engine.
    pub fn engine_counters(&self) -> Option<EngineCounters> {
        self.lock().engine.as_ref().map(|e| e.counters())
    }

    /// Whether the engine has nothing queued, in flight or waiting (true without one).
    pub fn engine_is_idle(&self) -> bool {
        self.lock().engine.as_ref().is_none_or(|e| e.is_idle())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AhAttr, Context, Device, DeviceConfig, Gid};

    /// A UD WR's address handle becomes the engine's destination: the IP its GID maps to
    /// (IPv4-mapped GIDs to IPv4), the GRH values and SL of the AH, the WR's QPN and Q_Key.
    #[test]
    fn ud_destination_from_the_address_handle() {
        let dev = Device::new(DeviceConfig::new("uroce0", "10.1.2.3".parse().unwrap())).unwrap();
        let ctx = Context::open(&dev).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        for dest in ["10.9.8.7", "fd00::17"] {
            let ip: IpAddr = dest.parse().unwrap();
            let ah = pd
                .create_ah(&AhAttr {
                    dgid: Gid::from_ip(ip),
                    flow_label: 0xABCDE,
                    hop_limit: 3,
                    traffic_class: 0x48,
                    sl: 5,
                    ..AhAttr::default()
                })
                .unwrap();
            let ud = crate::qp::UdDest {
                ah: ah.reference(),
                remote_qpn: 0x12_3456,
                remote_qkey: 0x8000_0000,
            };
            let d = ud_dest(&ud);
            assert_eq!(
                d,
                pwr::UdDest {
                    ip,
                    remote_qpn: 0x12_3456,
                    remote_qkey: 0x8000_0000,
                    traffic_class: 0x48,
                    hop_limit: 3,
                    flow_label: 0xABCDE,
                    sl: 5,
                }
            );
            let wr = SendWr {
                ud: Some(ud),
                xrc_remote_srqn: 7,
                ..SendWr::send(9, Vec::new())
            };
            let e = to_engine_wr(wr);
            assert_eq!((e.ud, e.remote_srqn, e.wr_id), (Some(d), 7, 9));
            assert_eq!(e.opcode, pwr::SendOpcode::Send);
        }
    }
}
