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

    fn bind_locked(&self, st: &mut IdState, dev: Arc<DevState>, port: u16) -> Result<(), CmError> {
        let port = dev.reserve_port(self.inner.ps, port, self.inner.token)?;
        st.src = Some(SocketAddr::new(dev.ip(), port));
        st.port_reserved = Some(port);
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

    /// Whether the id's port space takes a QP of type `t`: UDP a UD QP, TCP an RC QP, IB
    /// an RC QP or either XRC half (`RDMA_PS_IB` is how librdmacm connects XRC).
    fn accepts(&self, t: QpType) -> bool {
        match self.inner.ps {
            PortSpace::Udp => t == QpType::Ud,
            PortSpace::Tcp => t == QpType::Rc,
            PortSpace::Ib => matches!(t, QpType::Rc | QpType::XrcSend | QpType::XrcRecv),
            PortSpace::IpoIb => false,
        }
    }

    /// The binding protocol's step 1 (see `uroce_verbs::binding`): the reference is
    /// stored under the id's lock before the binding is published.
    fn bind_qp_locked(&self, st: &mut IdState, qp: QpRef) -> Result<(), CmError> {
        if st.qp.is_some() {
            return Err(CmError::QpBound);
        }
        st.qp = Some(qp.clone());
        let owner: Arc<dyn BindingOwner> = self.inner.clone();
        match qp.bind_endpoint(self.inner.token, owner) {
            Ok(()) => Ok(()),
            Err(e) => {
                st.qp = None;
                Err(match e {
                    BindError::AlreadyBound => CmError::QpBound,
                    BindError::Destroyed => CmError::QpDestroyed,
                })
            }
        }
    }

    fn init_qp(&self, qp: &QpRef) -> Result<(), CmError> {
        if !self.accepts(qp.qp_type()) {
            return Err(CmError::Invalid("QP type does not match the port space"));
        }
        match (self.inner.ps, qp.state()) {
            (PortSpace::Udp, QpState::Reset) => qp.activate_ud(UDP_QKEY).map_err(verbs),
            (PortSpace::Udp, QpState::Rts) => Ok(()),
            (_, QpState::Reset) => {
                let (attr, mask) = uroce_verbs::rc_init_attr(
                    AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_ATOMIC,
                );
                qp.modify(&attr, mask).map_err(verbs)
            }
            (PortSpace::Tcp | PortSpace::Ib, QpState::Init) => Ok(()),
            _ => Err(CmError::Invalid("the QP must be in RESET or INIT")),
        }
    }

    /// Creates the id's QP on `pd` (`rdma_create_qp`; RC for TCP ids, UD for UDP ones),
    /// moves it to INIT (UD: to RTS with [`UDP_QKEY`]) and binds it; the id owns it.
    ///
    /// # Errors
    /// Verbs errors; [`CmError::QpBound`] when the id has a QP.
    pub fn create_qp(&self, pd: &Pd, attr: &QpInitAttr<'_>) -> Result<QpRef, CmError> {
        if !self.accepts(attr.qp_type) {
            return Err(CmError::Invalid("QP type does not match the port space"));
        }
        if lock(&self.inner.st).qp.is_some() {
            return Err(CmError::QpBound);
        }
        let qp = pd.create_qp(attr).map_err(verbs)?;
        self.init_qp(&qp)?;
        let r: QpRef = (*qp).clone();
        let mut st = lock(&self.inner.st);
        self.bind_qp_locked(&mut st, r.clone())?;
        st.owned_qp = Some(qp);
        Ok(r)
    }

    /// Binds a QP the caller owns (moved to INIT if in RESET; UD: to RTS).
    ///
    /// # Errors
    /// [`CmError::QpBound`] (this id has a QP, or the QP has an id),
    /// [`CmError::QpDestroyed`], verbs errors.
    pub fn bind_qp(&self, qp: &QpRef) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if matches!(st.phase, Phase::Destroyed | Phase::Aborted) {
            return Err(invalid("bind_qp", st.phase));
        }
        if st.qp.is_some() {
            return Err(CmError::QpBound);
        }
        // Bind first (the QP cannot be taken by another id meanwhile), then INIT.
        self.bind_qp_locked(&mut st, qp.clone())?;
        drop(st);
        if let Err(e) = self.init_qp(qp) {
            let mut st = lock(&self.inner.st);
            if st.qp.as_ref().is_some_and(|q| q.same_qp(qp)) {
                st.qp = None;
                qp.unbind_endpoint(self.inner.token);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Unbinds and destroys the QP the id created (`rdma_destroy_qp`), or unbinds one it
    /// was given.
    ///
    /// # Errors
    /// [`CmError::NoQp`]; verbs errors from the destroy.
    pub fn destroy_qp(&self) -> Result<(), CmError> {
        let (qp, owned) = {
            let mut st = lock(&self.inner.st);
            (st.qp.take(), st.owned_qp.take())
        };
        let qp = qp.ok_or(CmError::NoQp)?;
        qp.unbind_endpoint(self.inner.token);
        drop(qp);
        if let Some(q) = owned {
            q.destroy().map_err(|(_, e)| verbs(e))?;
        }
        Ok(())
    }

    /// Listens (`rdma_listen`) on the bound address's port. A UDP id with a QP answers SIDR
    /// requests with it; one without reports each request as [`EventKind::ConnectRequest`]
    /// whose new id answers with its own QP when accepted.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (not bound), CM errors.
    pub fn listen(&self, _backlog: u32) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::Bound {
            return Err(invalid("listen", st.phase));
        }
        let (Some(dev), Some(src)) = (st.dev.clone(), st.src) else {
            return Err(invalid("listen", st.phase));
        };
        // A UDP listener with a QP answers SIDR requests from it; one without reports each
        // request as a connection request whose new id answers when accepted.
        let (sidr, deferred) = match (self.inner.ps, st.qp.as_ref()) {
            (PortSpace::Udp, Some(q)) => (
                Some(SidrAnswer {
                    qpn: q.qp_num(),
                    qkey: UDP_QKEY,
                }),
                false,
            ),
            (PortSpace::Udp, None) => (None, true),
            _ => (None, false),
        };
        let sid = self.inner.ps.service_id(src.port());
        let weak = Arc::downgrade(&self.inner);
        let conn = dev
            .cm
            .with_agent(|a, _| {
                let c = if deferred {
                    a.listen_sidr_deferred(sid)?
                } else {
                    a.listen(sid, sidr)?
                };
                lock(&dev.ids).insert(c.0, weak);
                Ok(c)
            })
            .map_err(cm_err::<uroce_proto::cm::CmError>)?;
        st.conn = Some(conn);
        st.phase = Phase::Listening;
        if let Some(a) = st.alias {
            // Without the announcement only processes that connect to the device's own
            // address reach this listener; the listen itself stands.
            st.announcement = alias::announce(
                self.inner.ps.value(),
                SocketAddr::new(a, src.port()),
                dev.ip(),
            )
            .ok();
        }
        Ok(())
    }

    fn private_with_header(
        &self,
        st: &IdState,
        user: &[u8],
        max: usize,
    ) -> Result<Vec<u8>, CmError> {
        if user.len() + HEADER_LEN > max {
            return Err(CmError::PrivateDataTooLong {
                len: user.len(),
                max: max - HEADER_LEN,
            });
        }
        let (Some(src), Some(dst)) = (st.src, st.dst) else {
            return Err(invalid("connect", st.phase));
        };
        let hdr = CmaHeader {
            version: 0,
            src_port: src.port(),
            src_ip: src.ip(),
            dst_ip: dst.ip(),
        };
        let mut out = vec![0u8; HEADER_LEN + user.len()];
        hdr.emit(&mut out[..HEADER_LEN]).map_err(cm_err)?;
        out[HEADER_LEN..].copy_from_slice(user);
        Ok(out)
    }

    /// Connects (`rdma_connect`): a REQ (TCP) or a SIDR_REQ (UDP) to the resolved
    /// destination. Reports [`EventKind::Established`] (after moving the id's QP to RTS and
    /// sending the RTU; UDP: with the remote QPN and Q_Key), [`EventKind::ConnectResponse`]
    /// (an id without QP), [`EventKind::Rejected`] or [`EventKind::Unreachable`].
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (route not resolved), [`CmError::NoQp`],
    /// [`CmError::PrivateDataTooLong`], CM errors.
    pub fn connect(&self, param: &ConnParam) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::RouteResolved {
            return Err(invalid("connect", st.phase));
        }
        let (Some(dev), Some(src), Some(mut dst)) = (st.dev.clone(), st.src, st.dst) else {
            return Err(invalid("connect", st.phase));
        };
        // A listener on a loopback address that another process's device owns announces
        // the device it is on (see `alias`).
        if dst.ip().is_loopback() {
            if let Some(real) = alias::find(self.inner.ps.value(), dst) {
                dst = SocketAddr::new(real, dst.port());
                st.dst = Some(dst);
            }
        }
        let weak = Arc::downgrade(&self.inner);
        let sid = self.inner.ps.service_id(dst.port());
        let conn = if self.inner.ps == PortSpace::Udp {
            let p = SidrParams {
                remote: dst.ip(),
                service_id: sid,
                pkey: 0xFFFF,
                timeout: st.cm_response_timeout,
                max_retries: st.max_cm_retries,
                private_data: self.private_with_header(&st, &param.private_data, pdl::SIDR_REQ)?,
            };
            dev.cm.with_agent(|a, now| {
                let c = a.sidr_request(now, &p)?;
                lock(&dev.ids).insert(c.0, weak);
                Ok(c)
            })
        } else {
            let local_qpn = match (&st.qp, param.qp_num) {
                (Some(q), _) => q.qp_num(),
                (None, n) if n != 0 => n,
                _ => return Err(CmError::NoQp),
            };
            let (transport_service_type, extended_transport_type) =
                req_transport(st.qp.as_ref().map(|q| q.qp_type()));
            let psn = fresh_psn(self.inner.token);
            let path = PathRepr {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: rdma_cm::gid_of(src.ip()),
                remote_gid: rdma_cm::gid_of(dst.ip()),
                hop_limit: 64,
                local_ack_timeout: st.local_ack_timeout,
                ..PathRepr::default()
            };
            let p = ConnectParams {
                remote: dst.ip(),
                service_id: sid,
                local_qpn,
                starting_psn: psn,
                qkey: 0,
                responder_resources: param.responder_resources,
                initiator_depth: param.initiator_depth,
                transport_service_type,
                extended_transport_type,
                path,
                pkey: 0xFFFF,
                path_mtu: own_mtu(&st).enum_value(),
                retry_count: param.retry_count.min(7),
                rnr_retry_count: param.rnr_retry_count.min(7),
                cm_response_timeout: st.cm_response_timeout,
                packet_life_time: 0,
                max_cm_retries: st.max_cm_retries,
                srq: param.srq,
                private_data: self.private_with_header(&st, &param.private_data, pdl::REQ)?,
            };
            st.rq_psn = psn;
            dev.cm.with_agent(|a, now| {
                let c = a.connect(now, &p)?;
                lock(&dev.ids).insert(c.0, weak);
                Ok(c)
            })
        }
        .map_err(cm_err::<uroce_proto::cm::CmError>)?;
        st.param = param.clone();
        st.conn = Some(conn);
        st.phase = Phase::Connecting;
        Ok(())
    }

    /// Accepts a connection request (`rdma_accept`): moves the id's QP to RTR and RTS from
    /// the REQ, then sends the REP. [`EventKind::Established`] follows the RTU.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (not a request), [`CmError::NoQp`], verbs and CM errors.
    pub fn accept(&self, param: &ConnParam) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::ReqReceived {
            return Err(invalid("accept", st.phase));
        }
        if self.inner.ps == PortSpace::Udp {
            // A SIDR request: the SIDR_REP names the id's QP (already in RTS).
            let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
                return Err(invalid("accept", st.phase));
            };
            let qpn = match (&st.qp, param.qp_num) {
                (Some(q), _) => q.qp_num(),
                (None, n) if n != 0 => n,
                _ => return Err(CmError::NoQp),
            };
            dev.cm
                .with_agent(|a, now| {
                    a.sidr_answer(
                        now,
                        conn,
                        SidrAnswer {
                            qpn,
                            qkey: UDP_QKEY,
                        },
                    )
                })
                .map_err(cm_err)?;
            self.forget(&dev, &mut st);
            st.phase = Phase::Connected;
            st.param = param.clone();
            return Ok(());
        }
        let (Some(dev), Some(conn), Some(req), Some(dst)) =
            (st.dev.clone(), st.conn, st.req, st.dst)
        else {
            return Err(invalid("accept", st.phase));
        };
        // Fixed when the request came (`qp_attr` reports it before the accept): the
        // PSN the REP announces, which we expect to receive.
        let psn = st.rq_psn;
        let responder = param.responder_resources.min(req.initiator_depth);
        let initiator = param.initiator_depth.min(req.responder_resources);
        let local_qpn = match (&st.qp, param.qp_num) {
            (Some(q), _) => {
                let c = passive_connect(&st, param, dst.ip())
                    .ok_or_else(|| invalid("accept", st.phase))?;
                to_rts(q, &c)?;
                q.qp_num()
            }
            (None, n) if n != 0 => n,
            _ => return Err(CmError::NoQp),
        };
        let p = AcceptParams {
            local_qpn,
            starting_psn: psn,
            qkey: 0,
            responder_resources: responder,
            initiator_depth: initiator,
            target_ack_delay: 0,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: param.srq,
            private_data: param.private_data.clone(),
        };
        if p.private_data.len() > pdl::REP {
            return Err(CmError::PrivateDataTooLong {
                len: p.private_data.len(),
                max: pdl::REP,
            });
        }
        dev.cm
            .with_agent(|a, now| a.accept(now, conn, &p))
            .map_err(cm_err)?;
        st.param = param.clone();
        Ok(())
    }

    /// Rejects a connection request (`rdma_reject`) with a consumer-defined REJ carrying
    /// `private_data` (at most 148 bytes).
    ///
    /// # Errors
    /// [`CmError::InvalidState`], [`CmError::PrivateDataTooLong`], CM errors.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::ReqReceived {
            return Err(invalid("reject", st.phase));
        }
        if private_data.len() > pdl::REJ {
            return Err(CmError::PrivateDataTooLong {
                len: private_data.len(),
                max: pdl::REJ,
            });
        }
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn.take()) else {
            return Err(invalid("reject", st.phase));
        };
        dev.cm
            .with_agent(|a, now| a.reject(now, conn, rej_reason::CONSUMER_DEFINED, private_data))
            .map_err(cm_err)?;
        lock(&dev.ids).remove(&conn.0);
        st.phase = Phase::Disconnected;
        drop(st);
        wait_transmitted(&dev);
        Ok(())
    }

    /// For an id without QP after [`EventKind::ConnectResponse`]: sends the RTU
    /// (`rdma_establish`). The id is connected; no [`EventKind::Established`] follows (as
    /// with the Linux RDMA CM, where the active side learns of nothing more).
    ///
    /// # Errors
    /// [`CmError::InvalidState`], CM errors.
    pub fn establish(&self) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
            return Err(invalid("establish", st.phase));
        };
        dev.cm
            .with_agent(|a, now| a.establish(now, conn))
            .map_err(cm_err)?;
        st.rtu_by_caller = st.phase == Phase::Connecting;
        Ok(())
    }

    /// Data arrived on the QP of an accepted connection before the RTU (`rdma_notify`
    /// with `IBV_EVENT_COMM_EST`): the connection is established now
    /// ([`EventKind::Established`] follows), as the RTU would (IBA Vol 1, 12.9.8.1: a
    /// communication-established event stands in for a lost RTU).
    ///
    /// # Errors
    /// [`CmError::AlreadyConnected`] when it is established; [`CmError::InvalidState`]
    /// unless the id accepted a request (or connected) and waits for the RTU; CM errors.
    pub fn notify_established(&self) -> Result<(), CmError> {
        let st = lock(&self.inner.st);
        match st.phase {
            Phase::Connected => return Err(CmError::AlreadyConnected),
            Phase::ReqReceived | Phase::Connecting => {}
            p => return Err(invalid("notify", p)),
        }
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
            return Err(invalid("notify", st.phase));
        };
        dev.cm
            .with_agent(|a, now| a.establish(now, conn))
            .map_err(cm_err)
    }

    /// Moves the id to another event channel (`rdma_migrate_id`): its later events, and
    /// those not retrieved yet (in order), go to `channel`.
    pub fn migrate(&self, channel: &EventChannel) {
        let _st = lock(&self.inner.st);
        let mut ch = lock(&self.inner.channel);
        if Arc::ptr_eq(&ch, &channel.inner) {
            return;
        }
        let pending = ch.purge(self.inner.token);
        *ch = channel.inner.clone();
        for ev in pending {
            ch.push(ev);
        }
    }

    /// The attributes and mask that move a QP of type `qp_type` to `state` for this id's
    /// connection (`rdma_init_qp_attr`), for a QP the caller moves itself: INIT any time
    /// after the address is bound; RTR and RTS (RC, XRC) once the peer is known (the REQ on
    /// the passive side, the REP on the active side). UD: INIT with the RDMA CM's Q_Key,
    /// RTR, RTS.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (too early), [`CmError::Invalid`] (another state).
    pub fn qp_attr(&self, qp_type: QpType, state: QpState) -> Result<(QpAttr, AttrMask), CmError> {
        let st = lock(&self.inner.st);
        if matches!(st.phase, Phase::Idle | Phase::Destroyed) {
            return Err(invalid("init_qp_attr", st.phase));
        }
        if qp_type == QpType::Ud {
            let mut a = QpAttr {
                qp_state: state,
                ..QpAttr::default()
            };
            let mask = match state {
                QpState::Init => {
                    a.pkey_index = 0;
                    a.port_num = uroce_verbs::device::PORT_NUM;
                    a.qkey = UDP_QKEY;
                    AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
                }
                QpState::Rtr => AttrMask::STATE,
                QpState::Rts => AttrMask::STATE | AttrMask::SQ_PSN,
                _ => return Err(CmError::Invalid("init_qp_attr: INIT, RTR or RTS")),
            };
            return Ok((a, mask));
        }
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC;
        if state == QpState::Init {
            return Ok(uroce_verbs::rc_init_attr(access));
        }
        if !matches!(state, QpState::Rtr | QpState::Rts) {
            return Err(CmError::Invalid("init_qp_attr: INIT, RTR or RTS"));
        }
        let dst = st.dst.ok_or_else(|| invalid("init_qp_attr", st.phase))?;
        let c = if let Some(req) = st.req.as_ref() {
            // Before the accept, as the kernel's CM: the responder resources are what the
            // REQ's initiator depth asks for, the initiator depth what its responder
            // resources allow.
            let param = ConnParam {
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                ..st.param.clone()
            };
            passive_connect(&st, &param, dst.ip())
        } else {
            active_connect(&st, dst.ip())
        }
        .ok_or_else(|| invalid("init_qp_attr", st.phase))?;
        let c = RcConnect {
            min_rnr_timer: EXTERNAL_QP_MIN_RNR_TIMER,
            ..c
        };
        Ok(if state == QpState::Rtr {
            c.rtr_attr_for(qp_type)
        } else {
            c.rts_attr_for(qp_type)
        })
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR and a DREQ leaves (or, while
    /// connecting, the REQ is given up). [`EventKind::Disconnected`] follows the DREP (or
    /// its timeout).
    ///
    /// # Errors
    /// [`CmError::InvalidState`], CM errors.
    pub fn disconnect(&self) -> Result<(), CmError> {
        let st = lock(&self.inner.st);
        if st.phase == Phase::Disconnected {
            // The peer disconnected first: as the kernel's CM, a late disconnect succeeds
            // (the QP is already in the error state and the DREP was sent).
            if let Some(q) = &st.qp {
                qp_error(q);
            }
            return Ok(());
        }
        if !matches!(st.phase, Phase::Connected | Phase::Connecting) {
            return Err(invalid("disconnect", st.phase));
        }
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
            return Err(invalid("disconnect", st.phase));
        };
        if let Some(q) = &st.qp {
            qp_error(q);
        }
        dev.cm
            .with_agent(|a, now| a.disconnect(now, conn, &[]))
            .map_err(cm_err)?;
        drop(st);
        wait_transmitted(&dev);
        Ok(())
    }

    /// Destroy's work (see [`CmId::destroy`]).
    fn retire(&self) -> Result<(), CmError> {
        let inner = &self.inner;
        let (qp, owned, dev) = {
            let mut st = lock(&inner.st);
            let prev = st.phase;
            if prev != Phase::Destroyed {
                st.phase = Phase::Destroyed;
                // Withdrawn now, not when the last reference to the id goes.
                st.announcement = None;
                if let Some(dev) = st.dev.clone() {
                    if let Some(conn) = st.conn.take() {
                        // Unpublished first: no callback starts for it after this.
                        lock(&dev.ids).remove(&conn.0);
                        dev.cm.with_agent(|a, now| match prev {
                            Phase::Listening => {
                                let _ = a.stop_listening(conn);
                            }
                            Phase::ReqReceived => {
                                if a.reject(now, conn, rej_reason::CONSUMER_DEFINED, &[])
                                    .is_err()
                                {
                                    let _ = a.disconnect(now, conn, &[]);
                                }
                            }
                            _ => {
                                let _ = a.disconnect(now, conn, &[]);
                            }
                        });
                    }
                    if let Some(p) = st.port_reserved.take() {
                        dev.release_port(inner.ps, p, inner.token);
                    }
                }
                inner.cm.live_ids.fetch_sub(1, Ordering::SeqCst);
            }
            (st.qp.take(), st.owned_qp.take(), st.dev.clone())
        };
        if let Some(dev) = dev {
            wait_transmitted(&dev);
        }
        if let Some(q) = qp {
            q.unbind_endpoint(inner.token);
        }
        if let Some(q) = owned {
            // Unbound above: the destroy calls no one back.
            let _ = q.destroy();
        }
        drop(inner.channel().purge(inner.token));
        // Bounded wait for acknowledgements and callbacks in flight.
        let deadline = Instant::now() + DESTROY_TIMEOUT;
        let mut r = lock(&inner.refs);
        while *r > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(CmError::InUse(*r));
            }
            r = inner
                .refs_cv
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }
}

fn to_rts(q: &QpRef, c: &RcConnect) -> Result<(), CmError> {
    if q.state() == QpState::Reset {
        let (a, m) = c.init_attr();
        q.modify(&a, m).map_err(verbs)?;
    }
    // The XRC halves leave out the attributes their side does not have (IBA Annex A14).
    let (a, m) = c.rtr_attr_for(q.qp_type());
    q.modify(&a, m).map_err(verbs)?;
    let (a, m) = c.rts_attr_for(q.qp_type());
    q.modify(&a, m).map_err(verbs)
}

/// The REQ's Transport Service Type and Extended Transport Type for a QP of `qp_type`
/// (IBA 12.6.5, and Annex A14 for XRC: type 3 with extended type 1, as the Linux CM
/// writes it); RC when the id has no QP of its own.
fn req_transport(qp_type: Option<QpType>) -> (u8, u8) {
    match qp_type {
        Some(QpType::Uc) => (1, 0),
        Some(QpType::XrcSend) => (3, 1),
        _ => (0, 0),
    }
}

/// The active side's QP attributes after the REP (`None` before it).
fn active_connect(st: &IdState, dest_ip: IpAddr) -> Option<RcConnect> {
    let rep = st.rep.as_ref()?;
    let psns = StartPsns::active(st.rq_psn, rep.starting_psn);
    Some(RcConnect {
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        dest_ip,
        dest_qpn: rep.local_qpn,
        path_mtu: own_mtu(st),
        rq_psn: Psn::new(psns.rq_psn),
        max_dest_rd_atomic: st.param.responder_resources.min(rep.initiator_depth),
        min_rnr_timer: 12,
        sq_psn: Psn::new(psns.sq_psn),
        timeout: st.local_ack_timeout,
        retry_cnt: st.param.retry_count.min(7),
        rnr_retry: rep.rnr_retry_count,
        max_rd_atomic: st.param.initiator_depth.min(rep.responder_resources),
    })
}

/// The passive side's QP attributes from the REQ (`param`: what it accepts with).
fn passive_connect(st: &IdState, param: &ConnParam, dest_ip: IpAddr) -> Option<RcConnect> {
    let req = st.req.as_ref()?;
    let psns = StartPsns::passive(req.starting_psn, st.rq_psn);
    Some(RcConnect {
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        dest_ip,
        dest_qpn: req.local_qpn,
        path_mtu: pmtu_of(req.path_mtu).min(own_mtu(st)),
        rq_psn: Psn::new(psns.rq_psn),
        max_dest_rd_atomic: param.responder_resources.min(req.initiator_depth),
        min_rnr_timer: 12,
        sq_psn: Psn::new(psns.sq_psn),
        timeout: if st.ack_timeout_set {
            st.local_ack_timeout
        } else {
            req.primary_path.local_ack_timeout
        },
        retry_cnt: req.retry_count,
        rnr_retry: req.rnr_retry_count,
        max_rd_atomic: param.initiator_depth.min(req.responder_resources),
    })
}

fn qp_error(q: &QpRef) {
    if !matches!(q.state(), QpState::Err | QpState::Reset) {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = q.modify(&attr, AttrMask::STATE);
    }
}

/// Routes one CM event to its id (on the CM thread).
pub(crate) fn dispatch(dev: &Arc<DevState>, event: CmEvent) {
    let key = match &event {
        CmEvent::ReqReceived { listener, .. } => *listener,
        CmEvent::RepReceived { id, .. }
        | CmEvent::Established { id }
        | CmEvent::Rejected { id, .. }
        | CmEvent::DisconnectRequested { id }
        | CmEvent::Disconnected { id }
        | CmEvent::TimewaitExit { id }
        | CmEvent::Unreachable { id }
        | CmEvent::DisconnectTimeout { id }
        | CmEvent::SidrReply { id, .. } => *id,
        // The agent answered from the listener's QP; nothing to report.
        CmEvent::SidrReqReceived { listener, .. } => *listener,
    };
    let target = {
        let ids = lock(&dev.ids);
        let t = ids.get(&key.0).and_then(Weak::upgrade);
        if let Some(t) = &t {
            t.enter();
        }
        t
    };
    let Some(target) = target else {
        // Nobody wants it: a request for a destroyed listener is refused.
        if let CmEvent::ReqReceived { id, .. } = event {
            dev.cm.with_agent(|a, now| {
                let _ = a.reject(now, id, rej_reason::NO_RESOURCES, &[]);
            });
        }
        return;
    };
    let r = CmIdRef {
        inner: target.clone(),
    };
    r.on_event(dev, event);
    target.exit();
}

impl CmIdRef {
    fn report(&self, kind: EventKind, status: i32, param: ConnParam, ud: Option<UdParam>) {
        let mut ev = Event::new(kind, self.clone());
        ev.status = status;
        ev.param = param;
        ev.ud = ud;
        self.push(ev);
    }

    fn forget(&self, dev: &DevState, st: &mut IdState) {
        if let Some(c) = st.conn.take() {
            lock(&dev.ids).remove(&c.0);
        }
    }

    fn on_event(&self, dev: &Arc<DevState>, event: CmEvent) {
        if let CmEvent::ReqReceived { id, from, req, .. } = &event {
            self.on_request(dev, *id, *from, req);
            return;
        }
        if let CmEvent::SidrReqReceived { id, from, req, .. } = &event {
            self.on_sidr_request(dev, *id, *from, req);
            return;
        }
        let mut st = lock(&self.inner.st);
        if matches!(st.phase, Phase::Destroyed | Phase::Aborted) {
            return;
        }
        match event {
            CmEvent::RepReceived { rep, .. } => {
                if st.phase != Phase::Connecting {
                    return;
                }
                let mut param = ConnParam {
                    private_data: rep.private_data.to_vec(),
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    flow_control: rep.e2e_flow_control,
                    retry_count: st.param.retry_count,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq,
                    qp_num: rep.local_qpn,
                };
                let Some(conn) = st.conn else { return };
                let Some(dst) = st.dst else { return };
                st.rep = Some(*rep);
                match (st.qp.clone(), active_connect(&st, dst.ip())) {
                    (Some(q), Some(c)) => {
                        match to_rts(&q, &c) {
                            Ok(()) => {
                                st.peer_param = Some(param);
                                // The RTU leaves; Established follows from the agent.
                                let _ = dev.cm.with_agent(|a, now| a.establish(now, conn));
                            }
                            Err(_) => {
                                dev.cm.with_agent(|a, now| {
                                    let _ = a.reject(now, conn, rej_reason::NO_QP, &[]);
                                });
                                self.forget(dev, &mut st);
                                st.phase = Phase::Disconnected;
                                param.private_data.clear();
                                self.report(EventKind::ConnectError, -22, param, None);
                            }
                        }
                    }
                    _ => self.report(EventKind::ConnectResponse, 0, param, None),
                }
            }
            CmEvent::Established { .. } => {
                if matches!(st.phase, Phase::Connecting | Phase::ReqReceived) {
                    st.phase = Phase::Connected;
                    if st.rtu_by_caller {
                        return;
                    }
                    let param = st.peer_param.clone().unwrap_or_else(|| st.param.clone());
                    self.report(EventKind::Established, 0, param, None);
                }
            }
            CmEvent::Rejected {
                reason,
                private_data,
                ..
            } => {
                self.forget(dev, &mut st);
                st.phase = Phase::Disconnected;
                let param = ConnParam {
                    private_data,
                    ..ConnParam::default()
                };
                self.report(EventKind::Rejected, i32::from(reason), param, None);
            }
            CmEvent::Unreachable { .. } => {
                self.forget(dev, &mut st);
                st.phase = Phase::Disconnected;
                self.report(
                    EventKind::Unreachable,
                    -ETIMEDOUT,
                    ConnParam::default(),
                    None,
                );
            }
            CmEvent::DisconnectRequested { id } => {
                if let Some(q) = &st.qp {
                    qp_error(q);
                }
                // The DREP leaves at once (the connection is over for us either way).
                dev.cm.with_agent(|a, now| {
                    let _ = a.disconnect(now, id, &[]);
                });
                self.disconnected(&mut st);
            }
            CmEvent::Disconnected { .. } | CmEvent::DisconnectTimeout { .. } => {
                if let Some(q) = &st.qp {
                    qp_error(q);
                }
                self.disconnected(&mut st);
            }
            CmEvent::TimewaitExit { .. } => {
                self.forget(dev, &mut st);
                self.report(EventKind::TimewaitExit, 0, ConnParam::default(), None);
            }
            CmEvent::SidrReply {
                status, qpn, qkey, ..
            } => {
                self.forget(dev, &mut st);
                if st.phase != Phase::Connecting {
                    return;
                }
                if status == 0 {
                    st.phase = Phase::Connected;
                    let ud = st.dst.map(|d| UdParam {
                        ah_ip: d.ip(),
                        qp_num: qpn,
                        qkey,
                    });
                    let param = ConnParam {
                        qp_num: qpn,
                        ..ConnParam::default()
                    };
                    self.report(EventKind::Established, 0, param, ud);
                } else {
                    st.phase = Phase::Disconnected;
                    self.report(
                        EventKind::Rejected,
                        i32::from(status),
                        ConnParam::default(),
                        None,
                    );
                }
            }
            CmEvent::ReqReceived { .. } | CmEvent::SidrReqReceived { .. } => {}
        }
    }

    fn disconnected(&self, st: &mut IdState) {
        st.phase = Phase::Disconnected;
        if !st.disconnect_reported {
            st.disconnect_reported = true;
            self.report(EventKind::Disconnected, 0, ConnParam::default(), None);
        }
    }

    /// A REQ for this listener: a new id for the connection, reported on the listener's
    /// channel.
    /// A SIDR request to a listener without QP: a new UD id in `ReqReceived`, reported as
    /// a connection request; accepting it answers with its QP.
    fn on_sidr_request(
        &self,
        dev: &Arc<DevState>,
        conn: ConnId,
        from: IpAddr,
        req: &uroce_wire::cm::SidrReqRepr,
    ) {
        let st = lock(&self.inner.st);
        if st.phase != Phase::Listening {
            return;
        }
        let Some(hdr) = CmaHeader::parse(&req.private_data)
            .ok()
            .filter(|h| h.src_ip == from)
        else {
            return;
        };
        let child = IdInner::new(&self.inner.cm, &self.inner.channel(), self.inner.ps);
        {
            let mut cs = lock(&child.st);
            cs.phase = Phase::ReqReceived;
            cs.dev = Some(dev.clone());
            cs.src = st.src.map(|s| SocketAddr::new(hdr.dst_ip, s.port()));
            cs.dst = Some(SocketAddr::new(hdr.src_ip, hdr.src_port));
            cs.conn = Some(conn);
        }
        lock(&dev.ids).insert(conn.0, Arc::downgrade(&child));
        let new_ref = CmIdRef {
            inner: child.clone(),
        };
        let owner = CmId {
            r: new_ref.clone(),
            destroyed: false,
        };
        let mut ev = Event::new(EventKind::ConnectRequest, new_ref);
        self.event_out();
        ev.listen_id = Some(self.clone());
        ev.param = ConnParam {
            private_data: req.private_data[HEADER_LEN..].to_vec(),
            ..ConnParam::default()
        };
        ev.ud = Some(UdParam {
            ah_ip: from,
            qp_num: 0,
            qkey: 0,
        });
        let ev = ev.with_new_id(owner);
        drop(st);
        self.push(ev);
    }

    fn on_request(&self, dev: &Arc<DevState>, conn: ConnId, from: IpAddr, req: &ReqRepr) {
        let st = lock(&self.inner.st);
        let refuse = |reason| {
            dev.cm.with_agent(|a, now| {
                let _ = a.reject(now, conn, reason, &[]);
            });
        };
        if st.phase != Phase::Listening {
            refuse(rej_reason::NO_RESOURCES);
            return;
        }
        let hdr = CmaHeader::parse(&req.private_data).ok();
        let Some(hdr) = hdr.filter(|h| h.src_ip == from) else {
            // Not an RDMA-CM request for this address.
            refuse(rej_reason::CONSUMER_DEFINED);
            return;
        };
        let child = IdInner::new(&self.inner.cm, &self.inner.channel(), self.inner.ps);
        {
            let mut cs = lock(&child.st);
            cs.phase = Phase::ReqReceived;
            cs.dev = Some(dev.clone());
            cs.src = st.src.map(|s| SocketAddr::new(hdr.dst_ip, s.port()));
            cs.dst = Some(SocketAddr::new(hdr.src_ip, hdr.src_port));
            cs.conn = Some(conn);
            cs.req = Some(*req);
            cs.rq_psn = fresh_psn(child.token);
            cs.param = ConnParam {
                responder_resources: req.responder_resources,
                initiator_depth: req.initiator_depth,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                qp_num: req.local_qpn,
                ..ConnParam::new()
            };
        }
        lock(&dev.ids).insert(conn.0, Arc::downgrade(&child));
        let new_ref = CmIdRef {
            inner: child.clone(),
        };
        let owner = CmId {
            r: new_ref.clone(),
            destroyed: false,
        };
        let mut ev = Event::new(EventKind::ConnectRequest, new_ref);
        self.event_out();
        ev.listen_id = Some(self.clone());
        ev.param = ConnParam {
            private_data: req.private_data[HEADER_LEN..].to_vec(),
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            flow_control: req.e2e_flow_control,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            qp_num: req.local_qpn,
        };
        let ev = ev.with_new_id(owner);
        drop(st);
        self.push(ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn req_names_the_transport_of_the_qp() {
        assert_eq!(req_transport(Some(QpType::Rc)), (0, 0));
        assert_eq!(req_transport(None), (0, 0));
        assert_eq!(req_transport(Some(QpType::Uc)), (1, 0));
        assert_eq!(req_transport(Some(QpType::XrcSend)), (3, 1));
    }
}
