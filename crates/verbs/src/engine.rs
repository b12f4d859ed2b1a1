//! The binding of RC QPs to the protocol layer's transport engine, and the hook through
//! which the I/O layer drives them.
//!
//! In a context with a [`Transport`] installed (every context of a network device), an RC
//! QP gets its engine ([`uroce_proto::rc::RcQp`]) at the INIT→RTR transition, built
//! from the QP's attributes; receive WRs posted in INIT move into it. From then on
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
//! methods of [`QpRef`] with packets, timer expiries and transmit buffers.

use std::net::IpAddr;
use std::sync::Arc as StdArc;

use uroce_proto::memory::{
    AtomicOp, LocalAccessError, Memory, RemoteAccessError, RemoteOp as ProtoRemoteOp,
};
use uroce_proto::qp_state::{QpState, QpType};
use uroce_proto::rc::{
    CqKind, Env, PostError as EnginePostError, QpEvent, RcConfig, RcCounters, RcQp, RemoteAccess,
    RtsAttrs, SharedRecvQueue,
};
use uroce_proto::time::Instant;
use uroce_proto::wr as pwr;
use uroce_wire::PacketRepr;

use crate::context::ContextCore;
use crate::cq::CqCore;
use crate::error::PostError;
use crate::event::EventType;
use crate::mr::{key_index, AccessError, RemoteOp};
use crate::qp::{QpCore, QpInner, QpRef, RecvWr, SendFlags, SendWr, WrOpcode};
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
}

/// The installed transport, if any.
pub(crate) type TransportSlot = std::sync::OnceLock<StdArc<dyn Transport>>;

/// The engine of one RC QP and what the I/O layer needs to address its packets.
#[derive(Debug)]
pub(crate) struct Engine {
    rc: RcQp,
    peer: IpAddr,
}

/// Memory as one QP's engine sees it: the context's MR table, restricted to the QP's PD.
pub struct QpMemory<'a> {
    ctx: &'a ContextCore,
    pd_id: u32,
    /// The region of the previous access (one engine call, e.g. a transmit batch of a
    /// large message, mostly touches one region): saves the table lookup.
    last: std::cell::RefCell<Option<Arc<crate::region::MrEntry>>>,
}

impl<'a> QpMemory<'a> {
    fn new(ctx: &'a ContextCore, pd_id: u32) -> QpMemory<'a> {
        QpMemory {
            ctx,
            pd_id,
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

fn verbs_op(op: ProtoRemoteOp) -> RemoteOp {
    match op {
        ProtoRemoteOp::Read => RemoteOp::Read,
        ProtoRemoteOp::Write => RemoteOp::Write,
        ProtoRemoteOp::Atomic => RemoteOp::Atomic,
    }
}

impl Memory for QpMemory<'_> {
    fn read_local(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), LocalAccessError> {
        let r = self.region(lkey).ok_or(LocalAccessError::BadKey { lkey })?;
        r.mr.local_read(self.pd_id, lkey, addr, dst)
            .map_err(|e| local_error(lkey, addr, dst.len(), e))
    }

    fn write_local(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), LocalAccessError> {
        let r = self.region(lkey).ok_or(LocalAccessError::BadKey { lkey })?;
        r.mr.local_write(self.pd_id, lkey, addr, src)
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
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        r.mr.check_remote(self.pd_id, rkey, va, len, verbs_op(op))
            .map_err(|e| remote_error(rkey, va, len, op, e))
    }

    fn write_remote(&self, rkey: u32, va: u64, src: &[u8]) -> Result<(), RemoteAccessError> {
        if src.is_empty() {
            return Ok(());
        }
        let op = ProtoRemoteOp::Write;
        let len = src.len() as u64;
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        r.mr.remote_write(self.pd_id, rkey, va, src)
            .map_err(|e| remote_error(rkey, va, len, op, e))
    }

    fn read_remote(&self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), RemoteAccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        let op = ProtoRemoteOp::Read;
        let len = dst.len() as u64;
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        r.mr.remote_read(self.pd_id, rkey, va, dst)
            .map_err(|e| remote_error(rkey, va, len, op, e))
    }

    fn atomic_remote(&self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError> {
        let rop = ProtoRemoteOp::Atomic;
        let r = self
            .region(rkey)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        let res = match op {
            AtomicOp::FetchAdd { add } => r.mr.remote_fetch_add(self.pd_id, rkey, va, add),
            AtomicOp::CompareSwap { compare, swap } => {
                r.mr.remote_compare_swap(self.pd_id, rkey, va, compare, swap)
            }
        };
        res.map_err(|e| remote_error(rkey, va, 8, rop, e))
    }

    /// Regions registered with `reg_mr` cannot be invalidated by a peer (only memory
    /// windows and fast-registration regions can, and uroce has neither yet): an existing
    /// key is refused as a permission error, an unknown one as a bad key.
    fn invalidate_remote(&self, rkey: u32) -> Result<(), RemoteAccessError> {
        match self.region(rkey) {
            Some(_) => Err(RemoteAccessError::NoPermission {
                rkey,
                op: ProtoRemoteOp::Write,
            }),
            None => Err(RemoteAccessError::BadKey { rkey }),
        }
    }
}

/// An SRQ as the engine's receive-WQE source.
struct SrqSource<'a>(&'a Arc<SrqCore>);

impl SharedRecvQueue for SrqSource<'_> {
    fn take(&mut self) -> Option<RecvWr> {
        SrqCore::take(self.0)
    }
}

/// Runs `f` with the engine and an [`Env`] for this QP, then drains completions and
/// events. Returns `None` when the QP has no engine.
fn with_engine<R>(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    f: impl FnOnce(&mut RcQp, &mut Env<'_>) -> R,
) -> Option<R> {
    let engine = inner.engine.as_mut()?;
    let mem = QpMemory::new(&core.ctx, core.pd.as_ref().map_or(0, |pd| pd.id));
    let r = match &core.srq {
        Some(srq) => {
            let mut source = SrqSource(srq);
            let mut env = Env::with_srq(&mem, &mut source);
            f(&mut engine.rc, &mut env)
        }
        None => {
            let mut env = Env::new(&mem);
            f(&mut engine.rc, &mut env)
        }
    };
    inner.delivered = drain(core, inner);
    Some(r)
}

/// Moves the engine's completions to the CQs and its events to the event queue, and
/// mirrors an engine-detected error into the QP's state.
fn drain(core: &Arc<QpCore>, inner: &mut QpInner) -> usize {
    let Some(engine) = inner.engine.as_mut() else {
        return 0;
    };
    let mut delivered = 0;
    // Bounded: every round either empties the engine's queues or moves it to ERR, after
    // which a second round only flushes.
    for _round in 0..2 {
        let mut overrun = false;
        while let Some((kind, wc)) = engine.rc.poll_completion() {
            let cq = match kind {
                CqKind::Send => core.send_cq.as_ref(),
                CqKind::Recv => core.recv_cq.as_ref(),
            };
            if let Some(cq) = cq {
                if CqCore::push(cq, wc, wc.solicited).is_err() {
                    overrun = true;
                } else {
                    delivered += 1;
                }
            }
        }
        while let Some(ev) = engine.rc.poll_event() {
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
        if overrun && engine.rc.state() != QpState::Err {
            // The CQ raised CQ_ERR; the QP cannot complete work any more (IBA: affiliated
            // asynchronous error on the QP).
            engine.rc.set_state(QpState::Err);
            QpRef::raise_on(core, EventType::QpFatal);
            continue;
        }
        break;
    }
    if engine.rc.state() == QpState::Err && inner.attr.qp_state != QpState::Err {
        inner.attr.qp_state = QpState::Err;
        inner.attr.sq_draining = false;
    }
    delivered
}

/// The engine's configuration from the QP's attributes at INIT→RTR.
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
    cfg.pkey = core
        .ctx
        .device
        .pkey(crate::device::PORT_NUM, a.pkey_index)
        .unwrap_or(0xffff);
    cfg
}

/// Applies a state transition to the engine. Returns `true` when the transition was fully
/// handled here (the QP has, or now gets, an engine), `false` when the generic path of
/// `modify` must run (non-RC QPs, RESET, INIT).
pub(crate) fn modify_engine(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    cur: QpState,
    next: QpState,
) -> bool {
    // Without a transport (a context used on its own, as the object-model tests do) the
    // QP keeps its plain queues and the engine-facing queue API of `qp.rs` drives it.
    if core.qp_type != QpType::Rc || core.ctx.transport.get().is_none() {
        return false;
    }
    match next {
        QpState::Rtr if cur == QpState::Init => {
            let mut cfg = rc_config(core, inner);
            cfg.peer = inner.attr.ah_attr.dest_ip();
            let mut rc = RcQp::new_rtr(cfg);
            // Receives posted in INIT move into the engine, in order.
            for wr in inner.take_posted_recvs() {
                // Cannot fail: the verbs queue held at most max_recv_wr of them.
                let _ = rc.post_recv(wr);
            }
            inner.engine = Some(Box::new(Engine {
                rc,
                peer: inner.attr.ah_attr.dest_ip(),
            }));
            inner.attr.qp_state = QpState::Rtr;
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
            inner.attr.qp_state = QpState::Rts;
            with_engine(core, inner, |rc, _| rc.enter_rts(rts));
            true
        }
        QpState::Sqd if inner.engine.is_some() => {
            inner.attr.qp_state = QpState::Sqd;
            inner.attr.sq_draining = true;
            with_engine(core, inner, |rc, _| rc.set_state(QpState::Sqd));
            true
        }
        QpState::Err | QpState::Sqe if inner.engine.is_some() => {
            inner.attr.qp_state = QpState::Err;
            inner.attr.sq_draining = false;
            with_engine(core, inner, |rc, _| rc.set_state(QpState::Err));
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

/// The protocol layer's form of a verbs send WR (RC: no UD or XRC fields).
fn to_engine_wr(wr: SendWr) -> Result<pwr::SendWr, PostError> {
    let opcode = match wr.opcode {
        WrOpcode::RdmaWrite => pwr::SendOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm => pwr::SendOpcode::RdmaWriteWithImm,
        WrOpcode::Send => pwr::SendOpcode::Send,
        WrOpcode::SendWithImm => pwr::SendOpcode::SendWithImm,
        WrOpcode::RdmaRead => pwr::SendOpcode::RdmaRead,
        WrOpcode::AtomicCmpAndSwp => pwr::SendOpcode::AtomicCmpAndSwp,
        WrOpcode::AtomicFetchAndAdd => pwr::SendOpcode::AtomicFetchAndAdd,
        WrOpcode::SendWithInv => pwr::SendOpcode::SendWithInv,
        WrOpcode::LocalInv
        | WrOpcode::BindMw
        | WrOpcode::Tso
        | WrOpcode::Driver1
        | WrOpcode::Flush
        | WrOpcode::AtomicWrite => {
            return Err(PostError::Refused(pwr::WrError::OpcodeNotSupported {
                opcode: pwr::SendOpcode::from_u32(wr.opcode.as_u32())
                    .unwrap_or(pwr::SendOpcode::Driver1),
                qp_type: QpType::Rc,
            }))
        }
    };
    let inline = wr.flags.contains(SendFlags::INLINE);
    let (remote_addr, rkey) = if wr.opcode.is_atomic() {
        (wr.atomic.remote_addr, wr.atomic.rkey)
    } else {
        (wr.rdma.remote_addr, wr.rdma.rkey)
    };
    Ok(pwr::SendWr {
        wr_id: wr.wr_id,
        opcode,
        flags: pwr::SendFlags::from_bits_truncate(wr.flags.bits()),
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
        ud: None,
        remote_srqn: 0,
    })
}

/// `post_send` on a QP with an engine (state already checked: RTS or SQD).
pub(crate) fn post_send(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    wr: SendWr,
) -> Result<(), PostError> {
    let ewr = to_engine_wr(wr)?;
    let max = core.cap.max_send_wr;
    with_engine(core, inner, |rc, _| rc.post_send(ewr))
        .unwrap_or(Err(EnginePostError::BadState(QpState::Reset)))
        .map_err(|e| engine_post_error(e, "send", max))
}

/// `post_recv` on a QP with an engine.
pub(crate) fn post_recv(
    core: &Arc<QpCore>,
    inner: &mut QpInner,
    wr: RecvWr,
) -> Result<(), PostError> {
    let max = core.cap.max_recv_wr;
    with_engine(core, inner, |rc, _| rc.post_recv(wr))
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

/// The engine-driving API the I/O layer uses. Every method takes the QP's lock for the
/// duration of the call and drains completions and events before returning.
impl QpRef {
    /// Whether the QP has a transport engine (an RC QP between RTR and RESET).
    pub fn has_engine(&self) -> bool {
        self.lock().engine.is_some()
    }

    /// The IP address this QP's packets go to (from its address vector), if it has an
    /// engine.
    pub fn engine_peer(&self) -> Option<IpAddr> {
        self.lock().engine.as_ref().map(|e| e.peer)
    }

    /// Hands a received packet (addressed to this QP, ICRC already checked) to the
    /// engine. Returns how many work completions it delivered to the CQs, or `None` if
    /// the QP has no engine (the packet is dropped).
    pub fn engine_handle_packet(&self, now: Instant, pkt: &PacketRepr<'_>) -> Option<usize> {
        let core = self.core();
        let mut inner = self.lock();
        with_engine(core, &mut inner, |rc, env| rc.handle_packet(now, pkt, env))?;
        Some(inner.delivered)
    }

    /// Runs the engine's timers (call when `now` ≥ [`QpRef::engine_poll_timeout`]).
    pub fn engine_handle_timeout(&self, now: Instant) {
        let core = self.core();
        let mut inner = self.lock();
        with_engine(core, &mut inner, |rc, env| rc.handle_timeout(now, env));
    }

    /// The engine's next timer deadline.
    pub fn engine_poll_timeout(&self) -> Option<Instant> {
        self.lock()
            .engine
            .as_ref()
            .and_then(|e| e.rc.poll_timeout())
    }

    /// Emits up to `max_packets` packets back to back into `buf` (each BTH..ICRC with the
    /// ICRC zero, for the caller to seal), appending each packet's length to `lens`. A
    /// packet is only attempted while at least `max_packet_len` bytes of `buf` remain.
    pub fn engine_transmit(
        &self,
        now: Instant,
        buf: &mut [u8],
        max_packet_len: usize,
        max_packets: usize,
        lens: &mut Vec<usize>,
    ) -> Transmitted {
        let core = self.core();
        let mut inner = self.lock();
        with_engine(core, &mut inner, |rc, env| {
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
                match rc.poll_transmit(now, env, room) {
                    Some(n) => {
                        lens.push(n);
                        t.packets += 1;
                        t.bytes += n;
                    }
                    None => break,
                }
            }
            t
        })
        .unwrap_or_default()
    }

    /// The engine's counters, if the QP has an engine.
    pub fn engine_counters(&self) -> Option<RcCounters> {
        self.lock().engine.as_ref().map(|e| e.rc.counters().clone())
    }

    /// Whether the engine has nothing queued, in flight or waiting (true without one).
    pub fn engine_is_idle(&self) -> bool {
        self.lock().engine.as_ref().is_none_or(|e| e.rc.is_idle())
    }
}

impl WrOpcode {
    /// Whether the RC engine executes this opcode.
    pub const fn rc_engine_supports(self) -> bool {
        !matches!(
            self,
            WrOpcode::LocalInv
                | WrOpcode::BindMw
                | WrOpcode::Tso
                | WrOpcode::Driver1
                | WrOpcode::Flush
                | WrOpcode::AtomicWrite
        )
    }
}
