//! A message endpoint: one RC QP, its receive buffers, credit flow control and
//! fragmentation.
//!
//! # Wire protocol
//!
//! Every message is a SEND with immediate data: bits 31..24 the kind (1 a whole
//! message; 2, 3, 4 the first, a middle and the last fragment of a longer one, which RC
//! delivers in order on the one QP), bits 23..0 the sender's *grant*: the cumulative number of
//! receives it has posted (mod 2^24).
//!
//! # Credits
//!
//! A sender may have at most `grant - sent` messages outstanding against the peer's
//! posted receives, so it never meets an RNR NAK (connections run with `rnr_retry = 0` by
//! default: an RNR NAK would fail them). The grant travels in the immediate data of every
//! message and, when the receiver reposted buffers it has not advertised, as a *credit
//! update*: an 8-byte inline RDMA WRITE of the cumulative grant (little-endian u64) into
//! the peer's mailbox, a one-word region registered for remote write. An update consumes
//! no receive, so it needs no credit itself, can never cause an RNR NAK, and two
//! endpoints whose applications both hold every buffer cannot deadlock or ping-pong on
//! updates. One update is in flight at a time (the next one carries everything reposted
//! meanwhile). A sender reads its mailbox whenever it looks for credit; a blocked sender
//! rechecks it at least every 500 µs.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::IpAddr;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::task::{Context as TaskContext, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use uroce_verbs::mem::ExclusiveGuard;
use uroce_verbs::{
    AccessFlags, AttrMask, CompChannel, Context, Cq, MemBlock, Mr, Pd, Qp, QpAttr, QpCap,
    QpInitAttr, QpState, QpType, RcConnect, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, Sge,
    WcFlags, WcOpcode, WcStatus,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

use crate::error::{MsgError, SendError};
use crate::pool::{lock, PoolUser, SendBuf, SendPool, SendSlot, GATE_TIMEOUT};
use crate::stats;

const MASK: u32 = 0x00FF_FFFF;
const HALF: u32 = 0x0080_0000;
const TAG_SEND: u64 = 1 << 62;
const TAG_CTRL: u64 = 1 << 61;
/// How often a blocked caller rechecks its mailbox for a credit update.
const CREDIT_RECHECK: Duration = Duration::from_micros(500);
/// How long reposted receives may wait to be advertised when no threshold is reached.
const UPDATE_DELAY: Duration = Duration::from_micros(200);

/// The kind of a message, in the top byte of its immediate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Only = 1,
    First = 2,
    Middle = 3,
    Last = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Only,
            2 => Kind::First,
            3 => Kind::Middle,
            4 => Kind::Last,
            _ => return None,
        })
    }
}

fn imm(kind: Kind, grant: u32) -> u32 {
    (u32::from(kind as u8) << 24) | (grant & MASK)
}

/// The cumulative value whose low 24 bits are `low`, nearest above or at `cur` (a grant
/// never goes back).
fn extend(cur: u64, low: u32) -> u64 {
    let delta = u64::from(low.wrapping_sub(cur as u32) & MASK);
    if delta < u64::from(HALF) {
        cur + delta
    } else {
        cur
    }
}

/// How an endpoint is built.
#[derive(Debug, Clone)]
pub struct MsgConfig {
    /// Receive buffers (the credit window the peer gets); at least 1.
    pub recv_bufs: u32,
    /// Size of every receive buffer; at least the sending pool's buffer size.
    pub recv_buf_size: usize,
    /// Path MTU of the connection.
    pub path_mtu: Pmtu,
    /// Local ACK timeout code (IBA: 4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Transport retries before the connection fails.
    pub retry_cnt: u8,
    /// RNR retries (7 = unlimited). Credits make RNR NAKs impossible; 0 turns one into a
    /// connection failure.
    pub rnr_retry: u8,
}

impl Default for MsgConfig {
    fn default() -> MsgConfig {
        MsgConfig {
            recv_bufs: 64,
            recv_buf_size: 4096,
            path_mtu: Pmtu::Mtu4096,
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 0,
        }
    }
}

/// What the peer needs to connect to an endpoint (exchanged out of band).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    /// The QP number.
    pub qpn: u32,
    /// Receives posted before connecting: the peer's initial credit.
    pub recv_window: u32,
    /// Address of the credit mailbox (8 bytes, remote write).
    pub mailbox_addr: u64,
    /// R_Key of the credit mailbox.
    pub mailbox_rkey: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Init,
    Up,
    Failed(WcStatus),
    Closed,
}

struct Inner {
    qp: Option<Qp>,
    link: Link,
    /// Cumulative grant of the peer (receives it posted), sends we made against it.
    peer_granted: u64,
    sent: u64,
    /// Cumulative receives we posted, and the value the peer was last told.
    posted: u64,
    advertised: u64,
    /// Messages received.
    received: u64,
    /// Since when reposted receives wait to be advertised.
    pending_since: Option<Instant>,
    /// A credit update is in flight.
    update_inflight: bool,
    /// The peer's mailbox.
    peer_mailbox: (u64, u32),
    /// Posted sends by pool slot index.
    inflight: HashMap<u32, SendSlot>,
    recv_posted: u32,
    /// Receive slots not posted and not held by the application (after a failure).
    recv_idle: Vec<u32>,
    /// Completed receives not yet handed out: slot, length, kind.
    arrived: VecDeque<(u32, u32, Kind)>,
    rnr_naks: u64,
}

struct Shared {
    inner: Mutex<Inner>,
    cond: Condvar,
    wakers: Mutex<Vec<Waker>>,
    shutdown: AtomicBool,
    /// Blocked calls and pool allocations waiting on this endpoint.
    waiters: AtomicUsize,
    pool: SendPool,
    recv_slots: Vec<Mr>,
    mailbox: Mr,
    recv_buf_size: usize,
    window: u32,
    cq: Cq,
    ch: CompChannel,
}

/// Receive-side buffer accounting of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvStats {
    /// Receive buffers of the endpoint.
    pub total: usize,
    /// Posted on the QP.
    pub posted: usize,
    /// Completed, waiting for the application's receive call.
    pub arrived: usize,
    /// Neither posted nor held (the connection failed or closed).
    pub idle: usize,
    /// Held by the application (`total - posted - arrived - idle`).
    pub held: usize,
}

/// An endpoint created and holding its receives, not yet connected.
pub struct PendingEndpoint {
    shared: Arc<Shared>,
}

/// A connected message endpoint over one RC QP. `Send + Sync`: share it in an `Arc` to
/// send and receive from different threads.
pub struct Endpoint {
    shared: Arc<Shared>,
    notifier: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("recv", &self.recv_stats())
            .finish()
    }
}

impl std::fmt::Debug for PendingEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingEndpoint").finish()
    }
}

impl PendingEndpoint {
    /// Creates the QP (moved to INIT), its CQ and completion channel, and registers and
    /// posts `cfg.recv_bufs` receive buffers, so the peer may send as soon as both sides
    /// are connected. Sends post buffers of `pool`, which must be on `pd`.
    ///
    /// # Errors
    /// [`MsgError::Verbs`] for a failed verbs call or a bad configuration.
    pub fn new(
        ctx: &Context,
        pd: &Pd,
        pool: &SendPool,
        cfg: &MsgConfig,
    ) -> Result<PendingEndpoint, MsgError> {
        if cfg.recv_bufs < 1 || cfg.recv_bufs >= HALF {
            return Err(MsgError::Verbs("recv_bufs must be in 1..2^23".into()));
        }
        if pool.shared.pd_id != pd.id() {
            return Err(MsgError::ForeignBuffer);
        }
        let ch = ctx.create_comp_channel().map_err(MsgError::verbs)?;
        let send_wr = pool.capacity() as u32 + 4;
        let cqe = send_wr + cfg.recv_bufs + 16;
        let cq = ctx.create_cq(cqe, Some(&ch), 0).map_err(MsgError::verbs)?;
        let cap = QpCap {
            max_send_wr: send_wr,
            max_recv_wr: cfg.recv_bufs,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 8,
        };
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
            .map_err(MsgError::verbs)?;
        let proto = RcConnect::new(IpAddr::from([127, 0, 0, 1]), 0);
        let (attr, mask) = proto.init_attr();
        qp.modify(&attr, mask).map_err(MsgError::verbs)?;
        let mut recv_slots = Vec::with_capacity(cfg.recv_bufs as usize);
        for _ in 0..cfg.recv_bufs {
            let block = MemBlock::new(cfg.recv_buf_size).map_err(MsgError::verbs)?;
            // Local write only: the responder writes an incoming SEND through the L_Key;
            // no peer can address the buffer by R_Key.
            let mr = pd
                .reg_mr(block, AccessFlags::LOCAL_WRITE)
                .map_err(MsgError::verbs)?;
            recv_slots.push(mr);
        }
        let mailbox = pd
            .reg_mr(
                MemBlock::new(8).map_err(MsgError::verbs)?,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .map_err(MsgError::verbs)?;
        for (i, mr) in recv_slots.iter().enumerate() {
            qp.post_recv(RecvWr::new(i as u64, vec![recv_sge(mr)]))
                .map_err(MsgError::verbs)?;
        }
        let inner = Inner {
            qp: Some(qp),
            link: Link::Init,
            peer_granted: 0,
            sent: 0,
            posted: u64::from(cfg.recv_bufs),
            advertised: u64::from(cfg.recv_bufs),
            received: 0,
            pending_since: None,
            update_inflight: false,
            peer_mailbox: (0, 0),
            inflight: HashMap::new(),
            recv_posted: cfg.recv_bufs,
            recv_idle: Vec::new(),
            arrived: VecDeque::new(),
            rnr_naks: 0,
        };
        let shared = Arc::new(Shared {
            inner: Mutex::new(inner),
            cond: Condvar::new(),
            wakers: Mutex::new(Vec::new()),
            shutdown: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
            pool: pool.clone(),
            recv_slots,
            mailbox,
            recv_buf_size: cfg.recv_buf_size,
            window: cfg.recv_bufs,
            cq,
            ch,
        });
        let weak: Weak<dyn PoolUser> = Arc::downgrade(&shared) as Weak<dyn PoolUser>;
        pool.register_user(weak);
        Ok(PendingEndpoint { shared })
    }

    /// What the peer needs to connect.
    pub fn info(&self) -> PeerInfo {
        let inner = lock(&self.shared.inner);
        PeerInfo {
            qpn: inner.qp.as_ref().map_or(0, |q| q.qp_num()),
            recv_window: self.shared.window,
            mailbox_addr: self.shared.mailbox.iova(),
            mailbox_rkey: self.shared.mailbox.rkey(),
        }
    }

    /// Connects to the peer's endpoint at `peer_ip` (INIT→RTR→RTS) and starts the
    /// endpoint's notifier thread (it turns completion-channel events into wake-ups for
    /// blocking calls and futures).
    ///
    /// # Errors
    /// [`MsgError::Verbs`] if the QP cannot be connected.
    pub fn connect(
        self,
        peer_ip: IpAddr,
        peer: PeerInfo,
        cfg: &MsgConfig,
    ) -> Result<Endpoint, MsgError> {
        {
            let mut inner = lock(&self.shared.inner);
            let c = RcConnect {
                path_mtu: cfg.path_mtu,
                rq_psn: Psn::ZERO,
                sq_psn: Psn::ZERO,
                timeout: cfg.timeout,
                retry_cnt: cfg.retry_cnt,
                rnr_retry: cfg.rnr_retry,
                ..RcConnect::new(peer_ip, peer.qpn)
            };
            let qp = inner.qp.as_ref().ok_or(MsgError::Closed)?;
            qp.connect_rc_from_init(&c).map_err(MsgError::verbs)?;
            inner.peer_granted = u64::from(peer.recv_window);
            inner.peer_mailbox = (peer.mailbox_addr, peer.mailbox_rkey);
            inner.link = Link::Up;
        }
        let shared = self.shared.clone();
        let notifier = std::thread::Builder::new()
            .name("uroce-msg".into())
            .spawn(move || notifier(&shared))
            .map_err(MsgError::verbs)?;
        Ok(Endpoint {
            shared: self.shared,
            notifier: Some(notifier),
        })
    }
}

fn recv_sge(mr: &Mr) -> Sge {
    Sge {
        addr: mr.iova(),
        length: mr.len() as u32,
        lkey: mr.lkey(),
    }
}

/// Waits on the completion channel and processes completions, so that blocked callers
/// and futures are woken without anyone polling.
fn notifier(shared: &Arc<Shared>) {
    while !shared.shutdown.load(Ordering::Acquire) {
        // The CQ raises events only while someone waits (a blocked call, a future, a
        // pool allocation): an event per completion would cost a thread wake-up per
        // message to busy-polling applications. Arm first, then poll: a completion
        // between the two raises an event.
        let waiting =
            shared.waiters.load(Ordering::Acquire) > 0 || !lock(&shared.wakers).is_empty();
        if waiting {
            let _ = shared.cq.req_notify(false);
        }
        shared.process();
        // Waiters for credit recheck the mailbox (a credit update raises no completion
        // here) every CREDIT_RECHECK.
        let timeout = if waiting {
            CREDIT_RECHECK
        } else {
            Duration::from_millis(100)
        };
        match shared.ch.get_cq_event(Some(timeout)) {
            Ok(ev) => ev.ack(),
            Err(uroce_verbs::WaitError::Shutdown) => break,
            Err(_) => {}
        }
        if waiting {
            shared.wake();
        }
    }
}

impl PoolUser for Shared {
    fn reclaim(&self) {
        self.process();
    }

    fn watch(&self, on: bool) {
        if on {
            self.waiters.fetch_add(1, Ordering::AcqRel);
            let _ = self.cq.req_notify(false);
        } else {
            self.waiters.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Shared {
    /// Polls the CQ and applies every completion; wakes waiters if anything changed.
    fn process(&self) {
        let changed = {
            let mut inner = lock(&self.inner);
            self.process_locked(&mut inner)
        };
        if changed {
            self.wake();
        }
    }

    fn wake(&self) {
        self.cond.notify_all();
        let wakers = std::mem::take(&mut *lock(&self.wakers));
        for w in wakers {
            w.wake();
        }
    }

    fn process_locked(&self, inner: &mut Inner) -> bool {
        let mut changed = false;
        loop {
            let wcs = self.cq.poll(32);
            if wcs.is_empty() {
                break;
            }
            let more = wcs.len() == 32;
            changed = true;
            for wc in wcs {
                if wc.wr_id & TAG_CTRL != 0 {
                    inner.update_inflight = false;
                    self.note_status(inner, wc.status);
                } else if wc.wr_id & TAG_SEND != 0 {
                    let index = (wc.wr_id & u64::from(u32::MAX)) as u32;
                    if let Some(slot) = inner.inflight.remove(&index) {
                        self.pool.unmark_in_flight();
                        self.pool.put(slot);
                    }
                    self.note_status(inner, wc.status);
                } else {
                    let index = wc.wr_id as u32;
                    inner.recv_posted = inner.recv_posted.saturating_sub(1);
                    if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                        inner.recv_idle.push(index);
                        self.note_status(inner, wc.status);
                        continue;
                    }
                    let kind = if wc.wc_flags.contains(WcFlags::WITH_IMM) {
                        Kind::from_u8((wc.imm_data >> 24) as u8)
                    } else {
                        None
                    };
                    let Some(kind) = kind else {
                        inner.recv_idle.push(index);
                        self.fail(inner, WcStatus::RemInvReqErr);
                        continue;
                    };
                    inner.peer_granted = extend(inner.peer_granted, wc.imm_data & MASK);
                    inner.received += 1;
                    inner.arrived.push_back((index, wc.byte_len, kind));
                }
            }
            // An empty poll costs a progress step: poll again only after a full batch.
            if !more {
                break;
            }
        }
        self.maybe_credit_update(inner);
        changed
    }

    fn note_status(&self, inner: &mut Inner, status: WcStatus) {
        if status != WcStatus::Success {
            if status == WcStatus::RnrRetryExcErr {
                inner.rnr_naks += 1;
            }
            self.fail(inner, status);
        }
    }

    fn fail(&self, inner: &mut Inner, status: WcStatus) {
        if inner.link == Link::Up || inner.link == Link::Init {
            inner.link = Link::Failed(status);
            // Flush everything posted: the buffers come back through their completions.
            if let Some(qp) = &inner.qp {
                let attr = QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                };
                let _ = qp.modify(&attr, AttrMask::STATE);
            }
        }
    }

    /// Posts receive slot `index` again (or parks it when the connection is down).
    fn repost_locked(&self, inner: &mut Inner, index: u32) {
        let Some(mr) = self.recv_slots.get(index as usize) else {
            return;
        };
        let ok = match (&inner.qp, inner.link) {
            (Some(qp), Link::Up) => qp
                .post_recv(RecvWr::new(u64::from(index), vec![recv_sge(mr)]))
                .is_ok(),
            _ => false,
        };
        if ok {
            inner.recv_posted += 1;
            inner.posted += 1;
            inner.pending_since.get_or_insert_with(Instant::now);
        } else {
            inner.recv_idle.push(index);
        }
    }

    /// Sends a credit update (an inline RDMA WRITE of the grant into the peer's mailbox)
    /// when receives were reposted unadvertised, no update is in flight, and either a
    /// quarter of the window waits to be advertised, or the peer may hold less than half
    /// of the window, or a repost has waited [`UPDATE_DELAY`] (the peer may need more
    /// than it holds for a fragmented message; the notifier thread looks at least every
    /// 100 ms).
    fn maybe_credit_update(&self, inner: &mut Inner) {
        if inner.link != Link::Up || inner.update_inflight || inner.posted == inner.advertised {
            return;
        }
        let pending = inner.posted - inner.advertised;
        let peer_has = inner.advertised.saturating_sub(inner.received);
        let window = u64::from(self.window);
        let old = inner
            .pending_since
            .is_some_and(|t| t.elapsed() >= UPDATE_DELAY);
        if pending < (window / 4).max(1) && peer_has * 2 >= window && !old {
            return;
        }
        let (remote_addr, rkey) = inner.peer_mailbox;
        let wr = SendWr {
            wr_id: TAG_CTRL,
            opcode: SendOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            inline_data: inner.posted.to_le_bytes()[..].into(),
            rdma: RdmaInfo { remote_addr, rkey },
            ..SendWr::default()
        };
        let Some(qp) = &inner.qp else { return };
        if qp.post_send(wr).is_ok() {
            inner.update_inflight = true;
            inner.advertised = inner.posted;
            inner.pending_since = None;
        }
    }

    /// Takes in a credit update the peer wrote into the mailbox.
    fn read_mailbox(&self, inner: &mut Inner) {
        if let Ok(v) = self.mailbox.block().atomic_load(0) {
            let g = u64::from_le(v);
            if g > inner.peer_granted {
                inner.peer_granted = g;
            }
        }
    }

    fn credit(&self, inner: &mut Inner) -> u64 {
        self.read_mailbox(inner);
        inner.peer_granted.saturating_sub(inner.sent)
    }

    fn check_link(inner: &Inner) -> Result<(), MsgError> {
        match inner.link {
            Link::Up => Ok(()),
            Link::Init => Err(MsgError::Closed),
            Link::Failed(s) => Err(MsgError::Failed(s)),
            Link::Closed => Err(MsgError::Closed),
        }
    }

    /// Posts `bufs` as one message (fragments in order) if credits allow; all or nothing.
    fn post_locked(
        &self,
        inner: &mut Inner,
        bufs: Vec<SendBuf>,
    ) -> Result<(), (MsgError, Vec<SendBuf>)> {
        if let Err(e) = Self::check_link(inner) {
            return Err((e, bufs));
        }
        if bufs.iter().any(|b| b.pool_id() != self.pool.shared.id) {
            return Err((MsgError::ForeignBuffer, bufs));
        }
        if self.credit(inner) < bufs.len() as u64 {
            return Err((MsgError::WouldBlock, bufs));
        }
        let Some(qp) = &inner.qp else {
            return Err((MsgError::Closed, bufs));
        };
        let last = bufs.len().saturating_sub(1);
        for (i, buf) in bufs.into_iter().enumerate() {
            let kind = match (i, last) {
                (_, 0) => Kind::Only,
                (0, _) => Kind::First,
                (i, l) if i == l => Kind::Last,
                _ => Kind::Middle,
            };
            let Some((slot, len, pool)) = buf.take_slot() else {
                continue;
            };
            let wr = SendWr {
                wr_id: TAG_SEND | u64::from(slot.index),
                opcode: SendOpcode::SendWithImm,
                flags: SendFlags::SIGNALED,
                sg_list: vec![Sge {
                    addr: slot.mr.iova(),
                    length: len as u32,
                    lkey: slot.mr.lkey(),
                }]
                .into(),
                imm_data: imm(kind, inner.posted as u32),
                ..SendWr::default()
            };
            match qp.post_send(wr) {
                Ok(()) => {
                    pool.mark_in_flight(1);
                    inner.inflight.insert(slot.index, slot);
                    inner.sent += 1;
                    inner.advertised = inner.posted;
                    inner.pending_since = None;
                }
                Err(e) => {
                    // The QP refused (it went to ERR): the buffer goes home, the rest of
                    // the message is dropped with it.
                    pool.put(slot);
                    self.fail(inner, WcStatus::LocQpOpErr);
                    return Err((MsgError::verbs(e), Vec::new()));
                }
            }
        }
        Ok(())
    }

    fn try_recv_locked(self: &Arc<Self>, inner: &mut Inner) -> Result<Message, MsgError> {
        let Some(&(_, _, kind)) = inner.arrived.front() else {
            Self::check_link(inner)?;
            return Err(MsgError::WouldBlock);
        };
        let count = match kind {
            Kind::Only => 1,
            Kind::First => match inner.arrived.iter().position(|a| a.2 == Kind::Last) {
                Some(p) => p + 1,
                None => {
                    // The rest of the message will not come once the connection is down.
                    Self::check_link(inner)?;
                    return Err(MsgError::WouldBlock);
                }
            },
            _ => {
                // A fragment without its FIRST: a protocol violation.
                self.fail(inner, WcStatus::RemInvReqErr);
                return Err(MsgError::Protocol("fragment without a first fragment"));
            }
        };
        let frags = inner
            .arrived
            .drain(..count)
            .map(|(index, len, _)| RecvBuf {
                shared: Some(self.clone()),
                index,
                len: len as usize,
            })
            .collect();
        Ok(Message { frags })
    }
}

impl Endpoint {
    /// The send pool this endpoint posts from.
    pub fn pool(&self) -> &SendPool {
        &self.shared.pool
    }

    /// The largest message [`Endpoint::send_bytes`] carries.
    pub fn max_message(&self) -> usize {
        let frags = (self.shared.window as usize).min(self.shared.pool.capacity());
        frags * self.shared.pool.buf_size().min(self.shared.recv_buf_size)
    }

    /// Sends `buf` without waiting, or hands it back: [`MsgError::WouldBlock`] when the
    /// peer has no receive free for it (no credit).
    ///
    /// # Errors
    /// The buffer comes back inside [`SendError`] with [`MsgError::WouldBlock`],
    /// [`MsgError::Failed`], [`MsgError::Closed`], [`MsgError::TooLong`] or
    /// [`MsgError::ForeignBuffer`]; only when the QP refused the post itself (it had just
    /// failed) has the buffer already gone back to the pool (`buf` is `None`).
    pub fn try_send(&self, buf: SendBuf) -> Result<(), SendError> {
        if buf.len() > self.shared.recv_buf_size {
            let max = self.shared.recv_buf_size;
            return Err(SendError {
                error: MsgError::TooLong {
                    len: buf.len(),
                    max,
                },
                buf: Some(buf),
            });
        }
        let mut inner = lock(&self.shared.inner);
        // Completions matter here only when there is no credit (a failure shows up then
        // too); the mailbox and the receive path bring credit otherwise.
        if self.shared.credit(&mut inner) == 0 {
            self.shared.process_locked(&mut inner);
        }
        self.shared
            .post_locked(&mut inner, vec![buf])
            .map_err(|(error, mut bufs)| SendError {
                error,
                buf: bufs.pop(),
            })
    }

    /// Sends `buf`, waiting up to `timeout` (`None`: without limit) for a credit.
    ///
    /// # Errors
    /// As [`Endpoint::try_send`], with [`MsgError::Timeout`] instead of `WouldBlock`.
    pub fn send(&self, buf: SendBuf, timeout: Option<Duration>) -> Result<(), SendError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut buf = buf;
        loop {
            match self.try_send(buf) {
                Err(SendError {
                    error: MsgError::WouldBlock,
                    buf: Some(b),
                }) => buf = b,
                other => return other,
            }
            if let Err(error) = self.wait(deadline) {
                return Err(SendError {
                    error,
                    buf: Some(buf),
                });
            }
        }
    }

    /// A future that sends `buf` when a credit is there.
    pub fn send_async(&self, buf: SendBuf) -> SendFuture<'_> {
        SendFuture {
            ep: self,
            buf: Some(buf),
        }
    }

    /// Sends `data` of any length up to [`Endpoint::max_message`], copying it into pool
    /// buffers (counted as one payload copy per fragment) and fragmenting it. Waits up to
    /// `timeout` until enough buffers and credits for the whole message are there; a
    /// message is posted whole or not at all.
    ///
    /// # Errors
    /// [`MsgError::TooLong`], [`MsgError::Timeout`], [`MsgError::Failed`],
    /// [`MsgError::Closed`].
    pub fn send_bytes(&self, data: &[u8], timeout: Option<Duration>) -> Result<(), MsgError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let frag = self
            .shared
            .pool
            .buf_size()
            .min(self.shared.recv_buf_size)
            .max(1);
        let max = self.max_message();
        if data.len() > max {
            return Err(MsgError::TooLong {
                len: data.len(),
                max,
            });
        }
        let n = data.len().div_ceil(frag).max(1);
        loop {
            {
                let mut inner = lock(&self.shared.inner);
                self.shared.process_locked(&mut inner);
                Shared::check_link(&inner)?;
                let credit_ok = self.shared.credit(&mut inner) >= n as u64;
                if credit_ok {
                    if let Some(mut bufs) = self.shared.pool.try_alloc_n(n) {
                        for (b, chunk) in bufs.iter_mut().zip(data.chunks(frag)) {
                            b.copy_from(chunk)?;
                        }
                        return self
                            .shared
                            .post_locked(&mut inner, bufs)
                            .map_err(|(e, _)| e);
                    }
                }
            }
            self.wait(deadline)?;
        }
    }

    /// The next message if one has arrived whole.
    ///
    /// # Errors
    /// [`MsgError::WouldBlock`] if none has; [`MsgError::Failed`] / [`MsgError::Closed`]
    /// once the connection is down and every message that arrived was handed out.
    pub fn try_recv(&self) -> Result<Message, MsgError> {
        let mut inner = lock(&self.shared.inner);
        self.shared.process_locked(&mut inner);
        self.shared.try_recv_locked(&mut inner)
    }

    /// The next message, waiting up to `timeout` (`None`: without limit).
    ///
    /// # Errors
    /// As [`Endpoint::try_recv`], with [`MsgError::Timeout`] instead of `WouldBlock`.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Message, MsgError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            match self.try_recv() {
                Err(MsgError::WouldBlock) => {}
                other => return other,
            }
            self.wait(deadline)?;
        }
    }

    /// A future that resolves to the next message.
    pub fn recv_async(&self) -> RecvFuture<'_> {
        RecvFuture { ep: self }
    }

    /// Hands a received message's buffers back to the receive queue (dropping the
    /// message does the same).
    pub fn release(&self, msg: Message) {
        drop(msg);
    }

    /// Waits for the next completion (or 20 ms), bounded by `deadline`.
    fn wait(&self, deadline: Option<Instant>) -> Result<(), MsgError> {
        let slice = CREDIT_RECHECK;
        let wait = match deadline {
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(MsgError::Timeout);
                }
                (d - now).min(slice)
            }
            None => slice,
        };
        // Busy poll briefly first: a completion is often microseconds away.
        let spin_until = Instant::now() + Duration::from_micros(50).min(wait);
        while Instant::now() < spin_until {
            let mut inner = lock(&self.shared.inner);
            if self.shared.process_locked(&mut inner) {
                drop(inner);
                self.shared.wake();
                return Ok(());
            }
            drop(inner);
            std::hint::spin_loop();
        }
        self.shared.waiters.fetch_add(1, Ordering::AcqRel);
        let _ = self.shared.cq.req_notify(false);
        let mut inner = lock(&self.shared.inner);
        if !self.shared.process_locked(&mut inner) {
            inner = self
                .shared
                .cond
                .wait_timeout(inner, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(inner);
        self.shared.waiters.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }

    /// Processes the completions that are there now (busy polling: send buffers go back
    /// to the pool, received messages become available); true if there were any. The
    /// endpoint's notifier thread does the same when nobody polls.
    pub fn poll_completions(&self) -> bool {
        let changed = {
            let mut inner = lock(&self.shared.inner);
            self.shared.process_locked(&mut inner)
        };
        if changed {
            self.shared.wake();
        }
        changed
    }

    /// Buffer accounting on the receive side.
    pub fn recv_stats(&self) -> RecvStats {
        let inner = lock(&self.shared.inner);
        let total = self.shared.recv_slots.len();
        let posted = inner.recv_posted as usize;
        let arrived = inner.arrived.len();
        let idle = inner.recv_idle.len();
        RecvStats {
            total,
            posted,
            arrived,
            idle,
            held: total.saturating_sub(posted + arrived + idle),
        }
    }

    /// The credits this endpoint holds against the peer now.
    pub fn credits(&self) -> u64 {
        let mut inner = lock(&self.shared.inner);
        self.shared.process_locked(&mut inner);
        self.shared.credit(&mut inner)
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        lock(&self.shared.inner)
            .qp
            .as_ref()
            .map_or(0, |q| q.qp_num())
    }

    /// True while the connection works.
    pub fn is_up(&self) -> bool {
        let mut inner = lock(&self.shared.inner);
        self.shared.process_locked(&mut inner);
        inner.link == Link::Up
    }

    /// The completion channel's descriptor, readable when a completion event is pending
    /// (for an event loop; the endpoint's own thread also consumes these events).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.shared.ch.fd()
    }

    /// Closes the endpoint: moves the QP to ERR, waits (bounded) for every posted send
    /// and receive to come back as a flushed completion (send buffers go to the pool),
    /// then destroys the QP. Messages the application still holds stay readable;
    /// dropping them releases their registered memory. Dropping the endpoint does the
    /// same.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(notifier) = self.notifier.take() else {
            return;
        };
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.ch.shutdown();
        let _ = notifier.join();
        let mut inner = lock(&self.shared.inner);
        if let Some(qp) = &inner.qp {
            let attr = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = qp.modify(&attr, AttrMask::STATE);
        }
        inner.link = match inner.link {
            Link::Failed(s) => Link::Failed(s),
            _ => Link::Closed,
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while (!inner.inflight.is_empty() || inner.recv_posted > 0 || inner.update_inflight)
            && Instant::now() < deadline
        {
            if !self.shared.process_locked(&mut inner) {
                drop(inner);
                std::thread::sleep(Duration::from_micros(200));
                inner = lock(&self.shared.inner);
            }
        }
        inner.link = Link::Closed;
        if let Some(qp) = inner.qp.take() {
            let _ = qp.destroy();
        }
        // With the QP gone nothing can touch a buffer still marked in flight.
        let stuck: Vec<SendSlot> = inner.inflight.drain().map(|(_, s)| s).collect();
        for slot in stuck {
            self.shared.pool.unmark_in_flight();
            self.shared.pool.put(slot);
        }
        drop(inner);
        self.shared.wake();
    }

    /// Test hook: RNR retry exhaustions seen (credits make this 0).
    #[doc(hidden)]
    pub fn rnr_failures(&self) -> u64 {
        lock(&self.shared.inner).rnr_naks
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A received buffer: read it in place ([`RecvBuf::bytes`]). A different type from
/// [`SendBuf`], with no conversion between them. Dropping it posts it again on its
/// endpoint's receive queue (a new credit for the peer).
pub struct RecvBuf {
    shared: Option<Arc<Shared>>,
    index: u32,
    len: usize,
}

impl std::fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBuf")
            .field("index", &self.index)
            .field("len", &self.len)
            .finish()
    }
}

impl RecvBuf {
    /// The number of bytes received.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The received bytes in place, as an ordinary `&[u8]` (no copy).
    ///
    /// # Errors
    /// [`MsgError::Verbs`] if the region's gate cannot be taken (cannot happen for a
    /// buffer the application holds).
    pub fn bytes(&mut self) -> Result<RecvBytes<'_>, MsgError> {
        let shared = self.shared.as_ref().ok_or(MsgError::Closed)?;
        let mr = shared
            .recv_slots
            .get(self.index as usize)
            .ok_or(MsgError::Closed)?;
        let guard = mr
            .block()
            .exclusive(GATE_TIMEOUT)
            .map_err(MsgError::verbs)?;
        Ok(RecvBytes {
            guard,
            len: self.len,
        })
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            {
                let mut inner = lock(&shared.inner);
                shared.repost_locked(&mut inner, self.index);
                shared.maybe_credit_update(&mut inner);
            }
        }
    }
}

/// In-place read access to a [`RecvBuf`].
pub struct RecvBytes<'a> {
    guard: ExclusiveGuard<'a>,
    len: usize,
}

impl std::fmt::Debug for RecvBytes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBytes").field("len", &self.len).finish()
    }
}

impl Deref for RecvBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.guard.get(..self.len).unwrap_or(&[])
    }
}

/// A received message: one buffer, or the fragments of a longer one in order. Dropping
/// it reposts every buffer.
#[derive(Debug)]
pub struct Message {
    frags: Vec<RecvBuf>,
}

impl Message {
    /// The message length (all fragments).
    pub fn len(&self) -> usize {
        self.frags.iter().map(RecvBuf::len).sum()
    }

    /// True for an empty message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The fragments, in order; read each in place with [`RecvBuf::bytes`].
    pub fn fragments_mut(&mut self) -> &mut [RecvBuf] {
        &mut self.frags
    }

    /// The number of fragments.
    pub fn fragment_count(&self) -> usize {
        self.frags.len()
    }

    /// Runs `f` on the bytes of a single-buffer message in place (no copy); `None` for a
    /// fragmented message.
    ///
    /// # Errors
    /// As [`RecvBuf::bytes`].
    pub fn with_bytes<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, MsgError> {
        match self.frags.as_mut_slice() {
            [one] => Ok(Some(f(&one.bytes()?))),
            _ => Ok(None),
        }
    }

    /// The whole message copied into a `Vec` (one payload copy per fragment, counted).
    ///
    /// # Errors
    /// As [`RecvBuf::bytes`].
    pub fn to_vec(&mut self) -> Result<Vec<u8>, MsgError> {
        let mut out = Vec::with_capacity(self.len());
        for f in &mut self.frags {
            let b = f.bytes()?;
            out.extend_from_slice(&b);
            stats::count_copy(b.len());
        }
        Ok(out)
    }
}

/// The future of [`Endpoint::send_async`].
#[derive(Debug)]
pub struct SendFuture<'a> {
    ep: &'a Endpoint,
    buf: Option<SendBuf>,
}

impl Future for SendFuture<'_> {
    type Output = Result<(), SendError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let Some(buf) = self.buf.take() else {
            return Poll::Ready(Ok(()));
        };
        let buf = match self.ep.try_send(buf) {
            Err(SendError {
                error: MsgError::WouldBlock,
                buf: Some(buf),
            }) => buf,
            other => return Poll::Ready(other),
        };
        lock(&self.ep.shared.wakers).push(cx.waker().clone());
        let _ = self.ep.shared.cq.req_notify(false);
        // A credit that arrived between the attempt and the registration.
        match self.ep.try_send(buf) {
            Err(SendError {
                error: MsgError::WouldBlock,
                buf: Some(buf),
            }) => {
                self.buf = Some(buf);
                Poll::Pending
            }
            other => Poll::Ready(other),
        }
    }
}

/// The future of [`Endpoint::recv_async`].
#[derive(Debug)]
pub struct RecvFuture<'a> {
    ep: &'a Endpoint,
}

impl Future for RecvFuture<'_> {
    type Output = Result<Message, MsgError>;
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match self.ep.try_recv() {
            Err(MsgError::WouldBlock) => {}
            other => return Poll::Ready(other),
        }
        lock(&self.ep.shared.wakers).push(cx.waker().clone());
        let _ = self.ep.shared.cq.req_notify(false);
        match self.ep.try_recv() {
            Err(MsgError::WouldBlock) => Poll::Pending,
            other => Poll::Ready(other),
        }
    }
}
