//! # uroce-rdmacm: the RDMA connection manager API over uroce devices
//!
//! The layer above `uroce-net` (`wire` → `proto` → `verbs` → `net` → **`rdmacm`**; see
//! `docs/ARCHITECTURE.md`). It is the Rust form of the `rdma_cm` API, shaped so that a C
//! `librdmacm.so.1` can be a thin layer over it:
//!
//! | `librdmacm` | here |
//! |---|---|
//! | `rdma_event_channel` (its `fd`) | [`EventChannel`] ([`EventChannel::fd`]) |
//! | `rdma_cm_id` | [`CmId`] (owner handle; [`CmIdRef`] in events) |
//! | `rdma_cm_event` (+ `rdma_ack_cm_event`) | [`Event`] (dropping it acknowledges) |
//! | `rdma_conn_param` / `rdma_ud_param` | [`ConnParam`] / [`UdParam`] |
//! | `rdma_create_id`, `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route` | [`RdmaCm::create_id`], [`CmId::bind_addr`](CmIdRef::bind_addr), [`CmId::resolve_addr`](CmIdRef::resolve_addr), [`CmId::resolve_route`](CmIdRef::resolve_route) |
//! | `rdma_create_qp` / `rdma_destroy_qp` | [`CmId::create_qp`](CmIdRef::create_qp) / [`CmId::destroy_qp`](CmIdRef::destroy_qp) ([`CmId::bind_qp`](CmIdRef::bind_qp) for a QP the caller owns) |
//! | `rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`, `rdma_establish` | [`CmId::listen`](CmIdRef::listen), [`CmId::connect`](CmIdRef::connect), [`CmId::accept`](CmIdRef::accept), [`CmId::reject`](CmIdRef::reject), [`CmId::disconnect`](CmIdRef::disconnect), [`CmId::establish`](CmIdRef::establish) |
//! | `rdma_create_ep` | [`RdmaCm::create_ep`] |
//!
//! ## Devices
//! An [`RdmaCm`] holds the network devices a process opened ([`RdmaCm::add_device`]); it
//! starts each device's CM ([`uroce_net::NetDevice::cm`]) and installs itself as the CM's
//! event sink. An id binds to the device whose address is its source address; without a
//! source, [`CmId::resolve_addr`](CmIdRef::resolve_addr) picks the device whose address is the destination or else
//! a device of the destination's family that is loopback exactly when the destination is
//! (a non-loopback device sends through the host's routing).
//!
//! ## On the wire
//! Service IDs are the IP-based ones (`(port_space << 16) | port`, IBA Annex A11), and the
//! REQ / SIDR_REQ private data starts with the 36-byte RDMA-CM address header, as the Linux
//! kernel writes them (`uroce_wire::cm::rdma_cm`); the caller's private data follows it
//! (at most 56 bytes in a REQ, 180 in a SIDR_REQ).
//!
//! ## QP transitions
//! As librdmacm does: [`CmId::create_qp`](CmIdRef::create_qp) moves the QP to INIT (RC: remote read/write/atomic
//! allowed; UD: RTS with the port space's Q_Key at once). The passive side moves it to RTR
//! and RTS from the REQ when it accepts (before the REP leaves); the active side from the REP
//! when it arrives (then the RTU leaves and [`EventKind::Established`] is reported). The
//! path MTU, both PSNs, responder resources / initiator depth (each side's bounded by the
//! other's), retry and RNR retry counts and the local ACK timeout come from the REQ / REP.
//! A disconnect (either side) moves the QP to ERR.
//!
//! ## Endpoints and QPs
//! A QP is bound to at most one id, with the protocol of `uroce_verbs::binding`: the id
//! takes its QP reference under its own lock before the binding is published; a second
//! bind fails with [`CmError::QpBound`]; destroying the QP while its connection is being set
//! up aborts the setup (the connection is rejected or disconnected and forgotten, and no
//! further event is reported for it); [`CmId::destroy`] waits for the id's events not yet
//! acknowledged and for callbacks in flight (bounded by [`DESTROY_TIMEOUT`]).
//!
//! ## Threading
//! Events are produced on the device's CM thread (`uroce_net::cm`); the QP transitions of
//! a connection run there too. Application calls take the id's lock, then (never the other
//! way round) the CM agent's lock. Blocking calls ([`EventChannel::get_event`]) wait on a
//! condition variable with a timeout.
#![forbid(unsafe_code)]

mod alias;
mod channel;
mod id;

pub use channel::{Event, EventChannel, EventKind};
pub use id::{CmId, CmIdRef, ConnParam, UdParam};

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use uroce_net::{CmEventSink, CmService, NetDevice};
use uroce_proto::cm::CmEvent;
pub use uroce_wire::cm::rdma_cm::PortSpace;

/// How long [`CmId::destroy`] waits for unacknowledged events and callbacks in flight.
pub const DESTROY_TIMEOUT: Duration = Duration::from_secs(5);
/// The Q_Key of UD ids in the UDP port space (as the Linux RDMA CM uses).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// Ephemeral ports are taken from here upwards.
pub const EPHEMERAL_PORTS: std::ops::RangeInclusive<u16> = 32768..=60999;

/// Why an RDMA-CM call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// No open device has this address (or can reach it).
    #[error("no uroce device for address {0}")]
    NoDevice(IpAddr),
    /// The port is taken in this port space on this device.
    #[error("port {0} is in use")]
    AddrInUse(u16),
    /// The id's state does not allow the call.
    #[error("{call} is not allowed in state {state}")]
    InvalidState {
        /// The call.
        call: &'static str,
        /// The id's state.
        state: &'static str,
    },
    /// The QP is bound to another id (or this id already has a QP).
    #[error("the QP is already bound to a connection endpoint")]
    QpBound,
    /// The QP is being destroyed.
    #[error("the QP was destroyed")]
    QpDestroyed,
    /// The id has no QP (and the parameters name none).
    #[error("the id has no QP")]
    NoQp,
    /// Too much private data.
    #[error("{len} bytes of private data, at most {max}")]
    PrivateDataTooLong {
        /// Given.
        len: usize,
        /// Allowed.
        max: usize,
    },
    /// The CM agent refused the command.
    #[error("CM: {0}")]
    Cm(String),
    /// A verbs call (QP creation or transition) failed.
    #[error("verbs: {0}")]
    Verbs(String),
    /// The device's network layer failed.
    #[error("device: {0}")]
    Net(String),
    /// Events or callbacks still reference the id after [`DESTROY_TIMEOUT`].
    #[error("the id is still referenced by {0} unacknowledged events or callbacks")]
    InUse(usize),
    /// Nothing arrived in time.
    #[error("timed out")]
    Timeout,
    /// An id of another `RdmaCm` or channel was given.
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// `leave_multicast` of a group the id has not joined.
    #[error("the id has not joined multicast group {0}")]
    NotJoined(IpAddr),
    /// The connection is established already.
    #[error("the connection is established already")]
    AlreadyConnected,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a process starts looking for ephemeral ports: somewhere that depends on the
/// process and the time, so that processes sharing the host's device (each its own
/// member, each its own port table) seldom pick the same port; a listen on a port
/// another process of the host listens on is refused, and an id bound to an ephemeral
/// port then takes another (`CmIdRef::listen`).
fn ephemeral_start() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u16
}

/// One device as the RDMA CM sees it: the device, its CM, and the ids its CM connections
/// belong to (by communication ID).
pub(crate) struct DevState {
    pub(crate) dev: Arc<NetDevice>,
    pub(crate) cm: Arc<CmService>,
    pub(crate) ids: Mutex<HashMap<u32, Weak<id::IdInner>>>,
    /// Bound ports per port space value.
    pub(crate) ports: Mutex<HashMap<(u16, u16), u64>>,
    next_port: AtomicU16,
}

impl DevState {
    pub(crate) fn ip(&self) -> IpAddr {
        self.dev.local_addr().ip()
    }

    /// Reserves `port` (0: an ephemeral one) in `ps` for id `token`.
    pub(crate) fn reserve_port(
        &self,
        ps: PortSpace,
        port: u16,
        token: u64,
    ) -> Result<u16, CmError> {
        let mut ports = lock(&self.ports);
        if port != 0 {
            return match ports.get(&(ps.value(), port)) {
                Some(&t) if t != token => Err(CmError::AddrInUse(port)),
                _ => {
                    ports.insert((ps.value(), port), token);
                    Ok(port)
                }
            };
        }
        let span = u32::from(EPHEMERAL_PORTS.end() - EPHEMERAL_PORTS.start()) + 1;
        for _ in 0..span {
            let off = self.next_port.fetch_add(1, Ordering::Relaxed) as u32 % span;
            let p = EPHEMERAL_PORTS.start() + off as u16;
            if let std::collections::hash_map::Entry::Vacant(e) = ports.entry((ps.value(), p)) {
                e.insert(token);
                return Ok(p);
            }
        }
        Err(CmError::AddrInUse(0))
    }

    pub(crate) fn release_port(&self, ps: PortSpace, port: u16, token: u64) {
        let mut ports = lock(&self.ports);
        if ports.get(&(ps.value(), port)) == Some(&token) {
            ports.remove(&(ps.value(), port));
        }
    }
}

/// The CM sink of one device: routes each agent event to its id.
struct Sink(Weak<DevState>);

impl CmEventSink for Sink {
    fn cm_event(&self, _service: &CmService, event: CmEvent) {
        let Some(dev) = self.0.upgrade() else { return };
        id::dispatch(&dev, event);
    }
}

pub(crate) struct Inner {
    pub(crate) devices: Mutex<Vec<Arc<DevState>>>,
    next_token: AtomicU64,
    pub(crate) live_ids: AtomicUsize,
}

impl Inner {
    pub(crate) fn token(&self) -> u64 {
        self.next_token.fetch_add(1, Ordering::Relaxed)
    }

    /// The device whose address is `ip`.
    pub(crate) fn device_for(&self, ip: IpAddr) -> Result<Arc<DevState>, CmError> {
        lock(&self.devices)
            .iter()
            .find(|d| d.ip() == ip)
            .cloned()
            .ok_or(CmError::NoDevice(ip))
    }

    /// The device with address `ip`, else, for a loopback `ip`, a loopback device of its
    /// family (every loopback address is on the one loopback interface; see `alias`), else
    /// any device of its family, else any device: as the Linux RDMA CM binds a loopback
    /// address to the first active device when no device has it, so that a program that
    /// binds `localhost` (libfabric's verbs provider does, for a passive endpoint without
    /// a node) gets a device on a host whose RDMA device is on another interface. The id
    /// uses that device's own address on the wire.
    pub(crate) fn device_or_loopback(&self, ip: IpAddr) -> Result<Arc<DevState>, CmError> {
        self.device_for(ip).or_else(|e| {
            if !ip.is_loopback() {
                return Err(e);
            }
            let devs = lock(&self.devices);
            let family = |d: &&Arc<DevState>| d.ip().is_ipv4() == ip.is_ipv4();
            devs.iter()
                .filter(family)
                .find(|d| d.ip().is_loopback())
                .or_else(|| devs.iter().find(family))
                .or_else(|| devs.first())
                .cloned()
                .ok_or(e)
        })
    }

    /// The device that reaches `dst`: the one that has it, else a device of its family that
    /// is loopback exactly when `dst` is.
    pub(crate) fn device_reaching(&self, dst: IpAddr) -> Result<Arc<DevState>, CmError> {
        let devs = lock(&self.devices);
        if let Some(d) = devs.iter().find(|d| d.ip() == dst) {
            return Ok(d.clone());
        }
        // Otherwise a device of the destination's family on the same side of loopback: its
        // socket sends through the host's routing, as the kernel's CM would pick the
        // device of the route's outgoing interface. A multicast group is reached from any
        // device of its family: the device joins it on its own interface.
        devs.iter()
            .find(|d| {
                d.ip().is_ipv4() == dst.is_ipv4()
                    && (dst.is_multicast() || d.ip().is_loopback() == dst.is_loopback())
            })
            .cloned()
            .ok_or(CmError::NoDevice(dst))
    }
}

/// The RDMA connection manager of a process: its devices (see the crate documentation).
#[derive(Clone)]
pub struct RdmaCm {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for RdmaCm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaCm")
            .field("devices", &lock(&self.inner.devices).len())
            .finish()
    }
}

impl Default for RdmaCm {
    fn default() -> Self {
        RdmaCm::new()
    }
}

impl RdmaCm {
    /// A connection manager with no devices.
    pub fn new() -> RdmaCm {
        RdmaCm {
            inner: Arc::new(Inner {
                devices: Mutex::new(Vec::new()),
                next_token: AtomicU64::new(1),
                live_ids: AtomicUsize::new(0),
            }),
        }
    }

    /// Adds a device: starts its CM and takes its events.
    ///
    /// # Errors
    /// [`CmError::Net`] when the CM cannot start, [`CmError::Invalid`] when the device's
    /// CM already reports to another `RdmaCm`.
    pub fn add_device(&self, dev: Arc<NetDevice>) -> Result<(), CmError> {
        let cm = dev.cm().map_err(|e| CmError::Net(e.to_string()))?.clone();
        let state = Arc::new(DevState {
            dev,
            cm: cm.clone(),
            ids: Mutex::new(HashMap::new()),
            ports: Mutex::new(HashMap::new()),
            next_port: AtomicU16::new(ephemeral_start()),
        });
        if let Some(prev) = cm.set_sink(Some(Arc::new(Sink(Arc::downgrade(&state))))) {
            cm.set_sink(Some(prev));
            return Err(CmError::Invalid("the device already belongs to an RdmaCm"));
        }
        lock(&self.inner.devices).push(state);
        Ok(())
    }

    /// The devices' addresses.
    pub fn device_addrs(&self) -> Vec<IpAddr> {
        lock(&self.inner.devices).iter().map(|d| d.ip()).collect()
    }

    /// The device with address `ip`.
    pub fn device(&self, ip: IpAddr) -> Option<Arc<NetDevice>> {
        self.inner.device_for(ip).ok().map(|d| d.dev.clone())
    }

    /// Ids not destroyed yet (a leak check for tests).
    pub fn live_ids(&self) -> usize {
        self.inner.live_ids.load(Ordering::SeqCst)
    }

    /// A new event channel (`rdma_create_event_channel`).
    ///
    /// # Errors
    /// The eventfd could not be created.
    pub fn create_event_channel(&self) -> Result<EventChannel, CmError> {
        EventChannel::new()
    }

    /// A new id reporting to `channel` (`rdma_create_id`): port space TCP (RC), UDP (UD)
    /// or IB (RC, XRC_SEND or XRC_RECV).
    ///
    /// # Errors
    /// [`CmError::Invalid`] for the IPoIB port space.
    pub fn create_id(&self, channel: &EventChannel, ps: PortSpace) -> Result<CmId, CmError> {
        CmId::new(self, channel, ps)
    }

    /// `rdma_create_ep`: an id on its own channel, with its source bound (when given), its
    /// address and route to `dst` resolved (waiting up to `timeout`), ready for
    /// [`CmId::create_qp`](CmIdRef::create_qp) and [`CmId::connect`](CmIdRef::connect); with `dst` `None`, bound to `src` for
    /// [`CmId::listen`](CmIdRef::listen).
    ///
    /// # Errors
    /// What the steps report; [`CmError::Timeout`].
    pub fn create_ep(
        &self,
        src: Option<SocketAddr>,
        dst: Option<SocketAddr>,
        ps: PortSpace,
        timeout: Duration,
    ) -> Result<(CmId, EventChannel), CmError> {
        let ch = self.create_event_channel()?;
        let id = self.create_id(&ch, ps)?;
        match dst {
            None => {
                let src = src.ok_or(CmError::Invalid(
                    "create_ep needs a source or a destination",
                ))?;
                id.bind_addr(src)?;
            }
            Some(dst) => {
                id.resolve_addr(src, dst, timeout)?;
                ch.expect(EventKind::AddrResolved, timeout)?;
                id.resolve_route(timeout)?;
                ch.expect(EventKind::RouteResolved, timeout)?;
            }
        }
        Ok((id, ch))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for d in lock(&self.devices).iter() {
            d.cm.set_sink(None);
        }
    }
}
