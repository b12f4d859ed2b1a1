//! Ids (`rdma_cm_id`), their QP binding, and the dispatch of CM events to them.

use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use uroce_proto::cm::{
    AcceptParams, CmEvent, ConnId, ConnectParams, SidrAnswer, SidrParams, StartPsns,
};
use uroce_verbs::binding::{BindError, BindingOwner};
use uroce_verbs::{
    AccessFlags, AttrMask, Pd, Qp, QpAttr, QpInitAttr, QpRef, QpState, QpType, RcConnect,
};
use uroce_wire::cm::rdma_cm::{self, CmaHeader, PortSpace, HEADER_LEN};

use crate::alias;
use uroce_wire::cm::{private_data_len as pdl, rej_reason, PathRepr, RepRepr, ReqRepr};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

use crate::channel::{ChannelInner, Event, EventKind};
use crate::{lock, CmError, DevState, EventChannel, Inner, RdmaCm, DESTROY_TIMEOUT, UDP_QKEY};

mod conn;
use conn::{active_connect, passive_connect, qp_error, to_rts};
mod events;
mod qp;

pub(crate) use events::dispatch;

/// `ETIMEDOUT`, reported negated in the status of [`EventKind::Unreachable`].
const ETIMEDOUT: i32 = 110;

/// Connection parameters (`rdma_conn_param`): what [`CmIdRef::connect`] and
/// [`CmIdRef::accept`] ask for, and what a connection request / response event carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (REQ: at most 56 bytes after the RDMA-CM header; REP 196; REJ 148).
    pub private_data: Vec<u8>,
    /// RDMA reads / atomics the peer may have outstanding towards us.
    pub responder_resources: u8,
    /// RDMA reads / atomics we issue at once.
    pub initiator_depth: u8,
    /// End-to-end flow control (reported only).
    pub flow_control: bool,
    /// Transport retry count (0..=7).
    pub retry_count: u8,
    /// RNR retry count (7: unlimited).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ.
    pub srq: bool,
    /// The QP number when the id has no QP (the caller moves its QP itself); in events,
    /// the peer's QPN.
    pub qp_num: u32,
}

impl ConnParam {
    /// 1 read/atomic each way, 7 retries, unlimited RNR retries, no private data.
    pub fn new() -> ConnParam {
        ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }
    }
}

/// UD parameters (`rdma_ud_param`) of an established UD id: where its datagrams go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// The remote address (for the address handle).
    pub ah_ip: IpAddr,
    /// The remote QPN.
    pub qp_num: u32,
    /// The remote Q_Key.
    pub qkey: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    Connecting,
    ReqReceived,
    Connected,
    Disconnected,
    Aborted,
    Destroyed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Bound => "bound",
            Phase::AddrResolved => "address resolved",
            Phase::RouteResolved => "route resolved",
            Phase::Listening => "listening",
            Phase::Connecting => "connecting",
            Phase::ReqReceived => "connect request received",
            Phase::Connected => "connected",
            Phase::Disconnected => "disconnected",
            Phase::Aborted => "aborted (QP destroyed)",
            Phase::Destroyed => "destroyed",
        }
    }
}

struct IdState {
    phase: Phase,
    dev: Option<Arc<DevState>>,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    port_reserved: Option<u16>,
    /// The port was picked by the id's bind (port 0 asked): a listen may move it to
    /// another when another process of the host listens on it.
    ephemeral: bool,
    conn: Option<ConnId>,
    qp: Option<QpRef>,
    owned_qp: Option<Qp>,
    /// The REQ received (passive).
    req: Option<ReqRepr>,
    /// The REP received (active).
    rep: Option<RepRepr>,
    /// Our receive PSN, announced in the REQ (active) or REP (passive): see
    /// [`uroce_proto::cm::StartPsns`].
    rq_psn: u32,
    /// What we asked for.
    param: ConnParam,
    /// What the peer's REP said (active side), for the Established event.
    peer_param: Option<ConnParam>,
    disconnect_reported: bool,
    /// The caller sent the RTU itself ([`CmIdRef::establish`]): as in the Linux RDMA CM,
    /// no Established event follows (the caller knows).
    rtu_by_caller: bool,
    cm_response_timeout: u8,
    max_cm_retries: u8,
    local_ack_timeout: u8,
    /// `local_ack_timeout` was set by `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: it
    /// is the QP's timeout on the passive side too (else the REQ's path gives it).
    ack_timeout_set: bool,
    /// The loopback address the id was bound to when its device has another one.
    alias: Option<IpAddr>,
    /// A listener's announcement of its aliased address (see `alias`).
    announcement: Option<alias::Announcement>,
    /// The multicast groups joined ([`CmIdRef::join_multicast`]), each with whether the
    /// id's QP was attached to it.
    mcast: Vec<(IpAddr, bool)>,
}

pub(crate) struct IdInner {
    token: u64,
    cm: Arc<Inner>,
    /// The channel the id reports to (`rdma_migrate_id` changes it).
    channel: Mutex<Arc<ChannelInner>>,
    ps: PortSpace,
    st: Mutex<IdState>,
    /// Events not acknowledged plus callbacks in flight.
    refs: Mutex<usize>,
    refs_cv: Condvar,
}

impl IdInner {
    fn new(cm: &Arc<Inner>, channel: &Arc<ChannelInner>, ps: PortSpace) -> Arc<IdInner> {
        cm.live_ids.fetch_add(1, Ordering::SeqCst);
        Arc::new(IdInner {
            token: cm.token(),
            cm: cm.clone(),
            channel: Mutex::new(channel.clone()),
            ps,
            st: Mutex::new(IdState {
                phase: Phase::Idle,
                dev: None,
                src: None,
                dst: None,
                port_reserved: None,
                ephemeral: false,
                conn: None,
                qp: None,
                owned_qp: None,
                req: None,
                rep: None,
                rq_psn: 0,
                param: ConnParam::new(),
                peer_param: None,
                disconnect_reported: false,
                rtu_by_caller: false,
                // As the Linux RDMA CM: 4.096 µs × 2^20 ≈ 4.3 s per try, 15 tries.
                cm_response_timeout: 20,
                max_cm_retries: 15,
                local_ack_timeout: 14,
                ack_timeout_set: false,
                alias: None,
                announcement: None,
                mcast: Vec::new(),
            }),
            refs: Mutex::new(0),
            refs_cv: Condvar::new(),
        })
    }

    fn channel(&self) -> Arc<ChannelInner> {
        lock(&self.channel).clone()
    }

    fn enter(&self) {
        *lock(&self.refs) += 1;
    }

    fn exit(&self) {
        let mut r = lock(&self.refs);
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.refs_cv.notify_all();
        }
    }
}

impl BindingOwner for IdInner {
    fn qp_destroyed(&self, qpn: u32) {
        let mut st = lock(&self.st);
        if st.qp.as_ref().map(QpRef::qp_num) != Some(qpn) {
            return;
        }
        st.qp = None;
        match st.phase {
            Phase::Connecting | Phase::ReqReceived | Phase::Connected => {
                // Abort: the peer hears a REJ (setup) or a DREQ (connected); this id
                // forgets the connection and reports nothing more for it.
                if let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn.take()) {
                    dev.cm.with_agent(|a, now| {
                        if a.reject(now, conn, rej_reason::NO_QP, &[]).is_err() {
                            let _ = a.disconnect(now, conn, &[]);
                        }
                    });
                    lock(&dev.ids).remove(&conn.0);
                }
                st.phase = Phase::Aborted;
                let stale = self.channel().purge(self.token);
                drop(st);
                drop(stale);
            }
            _ => {}
        }
    }
}

/// A counted reference to an id: what events carry; every operation but destroy.
#[derive(Clone)]
pub struct CmIdRef {
    inner: Arc<IdInner>,
}

/// An id (`rdma_cm_id`): the owner handle. Dropping it destroys it
/// ([`CmId::destroy`], errors ignored).
pub struct CmId {
    r: CmIdRef,
    destroyed: bool,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("token", &self.token())
            .finish()
    }
}

impl Deref for CmId {
    type Target = CmIdRef;
    fn deref(&self) -> &CmIdRef {
        &self.r
    }
}

fn invalid(call: &'static str, p: Phase) -> CmError {
    CmError::InvalidState {
        call,
        state: p.name(),
    }
}

fn verbs<E: std::fmt::Display>(e: E) -> CmError {
    CmError::Verbs(e.to_string())
}

fn cm_err<E: std::fmt::Display>(e: E) -> CmError {
    CmError::Cm(e.to_string())
}

/// The RNR NAK timer code `rdma_init_qp_attr` gives an application's QP: 0 (655.36 ms,
/// IBA Vol 1 §9.7), what the kernel's CM puts in its RTR attributes. A peer that
/// sends before the receive is posted waits, rather than exhausting its RNR retries.
const EXTERNAL_QP_MIN_RNR_TIMER: u8 = 0;

/// How long a call that queued a CM message waits for the device's CM thread to put it
/// on the wire ([`wait_transmitted`]).
const TRANSMIT_WAIT: Duration = Duration::from_millis(250);

/// Waits, at most [`TRANSMIT_WAIT`], until the device's CM has sent every MAD it queued.
/// The CM thread sends them; a process that exits right after `rdma_disconnect` or
/// `rdma_destroy_id` (perftest does) would otherwise take its DREQ, DREP or REJ with it,
/// and the peer would wait out its retries (about a minute) for an answer. Called without
/// the id's lock.
fn wait_transmitted(dev: &DevState) {
    let deadline = Instant::now() + TRANSMIT_WAIT;
    // Bounded by the deadline.
    loop {
        let c = dev.cm.counters();
        if c.mads_sent + c.send_failures >= c.agent.sent || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A 24-bit starting PSN that differs per connection.
fn fresh_psn(token: u64) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let x = (token.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as u32 ^ t;
    x & 0x00FF_FFFF
}

/// The active MTU of the id's device: what a REQ offers and the most a QP is given
/// (the REQ's Path Packet Payload MTU, IBA 12.6.5; 1024 before the id has a device).
fn own_mtu(st: &IdState) -> Pmtu {
    st.dev
        .as_ref()
        .map_or(Pmtu::Mtu1024, |d| d.dev.device().active_mtu())
}

fn pmtu_of(v: u8) -> Pmtu {
    Pmtu::ALL
        .into_iter()
        .find(|m| m.enum_value() == v)
        .unwrap_or(Pmtu::Mtu1024)
}

impl CmId {
    pub(crate) fn new(cm: &RdmaCm, ch: &EventChannel, ps: PortSpace) -> Result<CmId, CmError> {
        if !matches!(ps, PortSpace::Tcp | PortSpace::Udp | PortSpace::Ib) {
            return Err(CmError::Invalid("port space must be TCP, UDP or IB"));
        }
        Ok(CmId {
            r: CmIdRef {
                inner: IdInner::new(&cm.inner, &ch.inner, ps),
            },
            destroyed: false,
        })
    }

    /// Destroys the id (`rdma_destroy_id`): a connection is disconnected (connected),
    /// rejected (request not accepted) or given up (connecting), a listener stops, the QP
    /// the id created is destroyed and one it was given is unbound; then waits for the id's
    /// undelivered events to go and its delivered ones to be acknowledged, and for
    /// callbacks in flight, at most [`DESTROY_TIMEOUT`].
    ///
    /// # Errors
    /// [`CmError::InUse`] (the handle comes back; acknowledge the events and retry).
    pub fn destroy(mut self) -> Result<(), (CmId, CmError)> {
        match self.r.retire() {
            Ok(()) => {
                self.destroyed = true;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if !self.destroyed {
            let _ = self.r.retire();
            self.destroyed = true;
        }
    }
}

impl CmIdRef {
    /// A number that identifies the id in this process (never reused).
    pub fn token(&self) -> u64 {
        self.inner.token
    }

    pub(crate) fn event_out(&self) {
        self.inner.enter();
    }

    pub(crate) fn event_acked(&self) {
        self.inner.exit();
    }

    fn push(&self, ev: Event) {
        self.inner.channel().push(ev);
    }

    /// Whether `other` is the same id.
    pub fn same_id(&self, other: &CmIdRef) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// The local address (after bind / resolve).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).src
    }

    /// The peer's address (after resolve, or from a connection request).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.st).dst
    }

    /// The device the id is bound to.
    pub fn device(&self) -> Option<Arc<uroce_net::NetDevice>> {
        lock(&self.inner.st).dev.as_ref().map(|d| d.dev.clone())
    }

    /// The bound QP's number.
    pub fn qp_num(&self) -> Option<u32> {
        lock(&self.inner.st).qp.as_ref().map(QpRef::qp_num)
    }

    /// The bound QP.
    pub fn qp(&self) -> Option<QpRef> {
        lock(&self.inner.st).qp.clone()
    }

    /// Sets the QP's local ACK timeout exponent (`rdma_set_option` with
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`): used for the id's QP on either side of a connection
    /// established afterwards (values above 31 are clamped).
    pub fn set_ack_timeout(&self, timeout: u8) {
        let mut st = lock(&self.inner.st);
        st.local_ack_timeout = timeout.min(31);
        st.ack_timeout_set = true;
    }

    /// Sets the CM timeouts of later connects: each try waits 4.096 µs ×
    /// 2^`response_timeout` (plus packet lifetimes), `max_retries` resends (4 bits); and
    /// the QP's local ACK timeout exponent put in the REQ's path.
    pub fn set_cm_timeouts(&self, response_timeout: u8, max_retries: u8, local_ack_timeout: u8) {
        let mut st = lock(&self.inner.st);
        st.cm_response_timeout = response_timeout.min(31);
        st.max_cm_retries = max_retries.min(15);
        st.local_ack_timeout = local_ack_timeout.min(31);
    }

    fn bind_locked(
        &self,
        st: &mut IdState,
        dev: Arc<DevState>,
        port_asked: u16,
    ) -> Result<(), CmError> {
        let port = dev.reserve_port(self.inner.ps, port_asked, self.inner.token)?;
        st.src = Some(SocketAddr::new(dev.ip(), port));
        st.port_reserved = Some(port);
        st.ephemeral = port_asked == 0;
        st.dev = Some(dev);
        st.phase = Phase::Bound;
        Ok(())
    }

    /// Binds the id to a local address (`rdma_bind_addr`): the device with that address;
    /// port 0 picks an ephemeral port.
    ///
    /// # Errors
    /// [`CmError::NoDevice`], [`CmError::AddrInUse`], [`CmError::InvalidState`].
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::Idle {
            return Err(invalid("bind_addr", st.phase));
        }
        let dev = self.inner.cm.device_or_loopback(addr.ip())?;
        let aliased = (dev.ip() != addr.ip()).then_some(addr.ip());
        self.bind_locked(&mut st, dev, addr.port())?;
        st.alias = aliased;
        Ok(())
    }

    /// Resolves `dst` to a device (`rdma_resolve_addr`): the one owning `src` when given,
    /// else the one that reaches `dst`. Reports [`EventKind::AddrResolved`].
    ///
    /// # Errors
    /// [`CmError::NoDevice`], [`CmError::AddrInUse`], [`CmError::InvalidState`].
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        _timeout: Duration,
    ) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        match st.phase {
            Phase::Idle => {
                let (dev, port) = match src {
                    Some(s) if !s.ip().is_unspecified() => {
                        (self.inner.cm.device_or_loopback(s.ip())?, s.port())
                    }
                    Some(s) => (self.inner.cm.device_reaching(dst.ip())?, s.port()),
                    None => (self.inner.cm.device_reaching(dst.ip())?, 0),
                };
                self.bind_locked(&mut st, dev, port)?;
            }
            Phase::Bound => {}
            p => return Err(invalid("resolve_addr", p)),
        }
        if st.src.map(|s| s.is_ipv4()) != Some(dst.is_ipv4()) {
            return Err(CmError::NoDevice(dst.ip()));
        }
        st.dst = Some(dst);
        st.phase = Phase::AddrResolved;
        self.push(Event::new(EventKind::AddrResolved, self.clone()));
        Ok(())
    }

    /// Joins the multicast group `group` (`rdma_join_multicast`). On RoCE there is no
    /// subnet administrator to ask: as the Linux RDMA CM does for RoCE, the MGID is the
    /// group's address as a GID (IPv4-mapped for IPv4, IBA vol 1 Annex A17), the join
    /// succeeds locally, and the id's QP (if it has one) is attached to the MGID, so the
    /// device joins the IP group. Reports [`EventKind::MulticastJoin`] with the UD
    /// parameters to send to the group: the group's address, QPN `0xFFFFFF` and the port
    /// space's Q_Key ([`UDP_QKEY`]). A send-only member (`send_only`, librdmacm's
    /// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`) does not attach its QP.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] before the address is bound or resolved;
    /// [`CmError::Invalid`] for a non-multicast address, a family other than the id's, a
    /// port space other than UDP or IB, or a group already joined; [`CmError::Verbs`] when
    /// the QP cannot be attached.
    pub fn join_multicast(&self, group: IpAddr, send_only: bool) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if !matches!(
            st.phase,
            Phase::Bound | Phase::AddrResolved | Phase::RouteResolved
        ) {
            return Err(invalid("join_multicast", st.phase));
        }
        if !group.is_multicast() {
            return Err(CmError::Invalid("not a multicast address"));
        }
        if st.src.map(|s| s.is_ipv4()) != Some(group.is_ipv4()) {
            return Err(CmError::Invalid(
                "the group's family is not the id's address family",
            ));
        }
        if !matches!(self.inner.ps, PortSpace::Udp | PortSpace::Ib) {
            return Err(CmError::Invalid("multicast needs the UDP or IB port space"));
        }
        if st.mcast.iter().any(|(g, _)| *g == group) {
            return Err(CmError::Invalid("the group is already joined"));
        }
        let attach = st.qp.as_ref().filter(|_| !send_only);
        if let Some(qp) = attach {
            qp.attach_mcast(uroce_verbs::Gid::from_ip(group), 0)
                .map_err(|e| CmError::Verbs(e.to_string()))?;
        }
        let attached = attach.is_some();
        st.mcast.push((group, attached));
        let mut ev = Event::new(EventKind::MulticastJoin, self.clone());
        ev.ud = Some(UdParam {
            ah_ip: group,
            qp_num: uroce_verbs::mcast::MULTICAST_QPN,
            qkey: UDP_QKEY,
        });
        self.push(ev);
        Ok(())
    }

    /// Leaves the multicast group `group` (`rdma_leave_multicast`): the id's QP is
    /// detached from it. No event.
    ///
    /// # Errors
    /// [`CmError::NotJoined`] when the id has not joined `group`.
    pub fn leave_multicast(&self, group: IpAddr) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        let i = st
            .mcast
            .iter()
            .position(|(g, _)| *g == group)
            .ok_or(CmError::NotJoined(group))?;
        let (_, attached) = st.mcast.remove(i);
        if let Some(qp) = st.qp.as_ref().filter(|_| attached) {
            // A QP detached meanwhile (`ibv_detach_mcast` by the program) is not an error.
            let _ = qp.detach_mcast(uroce_verbs::Gid::from_ip(group), 0);
        }
        Ok(())
    }

    /// The multicast groups the id has joined.
    pub fn multicast_groups(&self) -> Vec<IpAddr> {
        lock(&self.inner.st).mcast.iter().map(|(g, _)| *g).collect()
    }

    /// Resolves the route (`rdma_resolve_route`; on RoCE the address is the route).
    /// Reports [`EventKind::RouteResolved`].
    ///
    /// # Errors
    /// [`CmError::InvalidState`].
    pub fn resolve_route(&self, _timeout: Duration) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::AddrResolved {
            return Err(invalid("resolve_route", st.phase));
        }
        st.phase = Phase::RouteResolved;
        self.push(Event::new(EventKind::RouteResolved, self.clone()));
        Ok(())
    }
}
