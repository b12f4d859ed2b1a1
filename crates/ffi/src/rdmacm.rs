//! The RDMA-CM API (`librdmacm`), implemented in this library so that it shares the verbs
//! objects with `libibverbs.so.1`: `id->verbs` is a context of this library, `id->qp` a QP
//! of its registry. The functions are exported as unversioned `uroce_rdmacm_<name>`
//! symbols, outside rdma-core's version nodes (the export check compares the versioned
//! names only; a private version node for them is not done yet); uroce's `librdmacm.so.1`
//! (`crates/ffi-rdmacm`) carries rdma-core 44's public names and versions and forwards each
//! call here (docs/ARCHITECTURE.md, "librdmacm", says why).
//!
//! Over [`uroce_rdmacm`]: one [`RdmaCm`] per process, over the process's one device (opened
//! with the first call, as a context that stays open). C objects (event channels, ids,
//! events, address lists) are heap structs in a registry keyed by address, each with the
//! Rust object behind it. An id created without a channel (`rdma_create_id(NULL, …)`,
//! `rdma_create_ep`) is *synchronous*: the calls that would report an event wait for it
//! (bounded by [`SYNC_TIMEOUT`]).

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd as _;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use uroce_rdmacm::{
    CmError, CmId, CmIdRef, ConnParam, Event, EventChannel, EventKind, PortSpace, RdmaCm,
};

use crate::abi::*;
use crate::device::{FfiError, Registry};
use crate::entry::*;
use crate::objects::{qp_ref, zeroed, CBox};

/// How long a synchronous id waits for the event of a call.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// The C types of <rdma/rdma_cma.h> (rdma-core 44), checked by tests/rdmacm_layout.rs.
// ---------------------------------------------------------------------------------------

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    /// The descriptor to poll.
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key (network order).
    pub pkey: u16,
}

/// `struct rdma_addr`: source and destination socket addresses, the GIDs.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// Source (`sockaddr_storage`).
    pub src: libc::sockaddr_storage,
    /// Destination.
    pub dst: libc::sockaddr_storage,
    /// GIDs.
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// Addresses.
    pub addr: rdma_addr,
    /// Path records (uroce: NULL).
    pub path_rec: *mut c_void,
    /// Their number (0).
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    /// The verbs context (of this library).
    pub verbs: *mut ibv_context,
    /// The event channel.
    pub channel: *mut rdma_event_channel,
    /// The application's context.
    pub context: *mut c_void,
    /// The QP (from `rdma_create_qp`).
    pub qp: *mut ibv_qp,
    /// Addresses.
    pub route: rdma_route,
    /// Port space.
    pub ps: c_int,
    /// Port number (1 once bound).
    pub port_num: u8,
    /// The last event of a synchronous id.
    pub event: *mut rdma_cm_event,
    /// CQs and channels `rdma_create_qp` made when none were given.
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive channel.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (uroce: NULL).
    pub srq: *mut ibv_srq,
    /// The PD of the QP.
    pub pd: *mut ibv_pd,
    /// QP type of the port space.
    pub qp_type: ibv_qp_type,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Flow control.
    pub flow_control: u8,
    /// Retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: u8,
    /// QPN (id without QP; events: the peer's).
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Address vector to the peer.
    pub ah_attr: ibv_ah_attr,
    /// Remote QPN.
    pub qp_num: u32,
    /// Remote Q_Key.
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected port spaces.
    pub conn: rdma_conn_param,
    /// UD.
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    /// The id.
    pub id: *mut rdma_cm_id,
    /// The listening id of a connection request.
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// Status.
    pub status: c_int,
    /// Parameters.
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    /// `RAI_*`.
    pub ai_flags: c_int,
    /// `AF_INET` / `AF_INET6`.
    pub ai_family: c_int,
    /// `IBV_QPT_*`.
    pub ai_qp_type: c_int,
    /// `RDMA_PS_*`.
    pub ai_port_space: c_int,
    /// Source length.
    pub ai_src_len: libc::socklen_t,
    /// Destination length.
    pub ai_dst_len: libc::socklen_t,
    /// Source.
    pub ai_src_addr: *mut libc::sockaddr,
    /// Destination.
    pub ai_dst_addr: *mut libc::sockaddr,
    /// Source name (NULL).
    pub ai_src_canonname: *mut c_char,
    /// Destination name (NULL).
    pub ai_dst_canonname: *mut c_char,
    /// Route length (0).
    pub ai_route_len: usize,
    /// Route (NULL).
    pub ai_route: *mut c_void,
    /// Connect data length (0).
    pub ai_connect_len: usize,
    /// Connect data (NULL).
    pub ai_connect: *mut c_void,
    /// Next (NULL: one entry).
    pub ai_next: *mut rdma_addrinfo,
}

/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: c_int = 0x0106;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: c_int = 0x0111;
/// `RDMA_PS_IB` (any QP type; librdmacm's port space for XRC).
pub const RDMA_PS_IB: c_int = 0x013F;
/// `RAI_PASSIVE`.
pub const RAI_PASSIVE: c_int = 1;

// ---------------------------------------------------------------------------------------
// The registry.
// ---------------------------------------------------------------------------------------

struct ChanEntry {
    _raw: CBox<rdma_event_channel>,
    ch: EventChannel,
    /// Events a synchronous wait took off the channel for another id.
    stash: VecDeque<Event>,
}

struct IdEntry {
    raw: CBox<rdma_cm_id>,
    id: CmId,
    /// The C channel (a private one for a synchronous id).
    chan: usize,
    sync: bool,
    /// `chan` was made for this id (`rdma_create_id` without a channel) and goes with it.
    own_chan: bool,
    /// PD, CQs and channels this library made for the id (freed with it).
    owned: Owned,
    /// `rdma_create_ep`'s QP attributes of a listening endpoint, for `rdma_get_request`.
    ep_qp_attr: Option<QpAttrs>,
    /// A synchronous id's last event (`id->event`), a copy that stays until the next
    /// synchronous call or the id's destruction, as rdma-core keeps it.
    held: Option<HeldEvent>,
    /// The `context` of each multicast group joined, reported as the MULTICAST_JOIN
    /// event's `param.ud.private_data` (as librdmacm does).
    mcast_ctx: HashMap<IpAddr, usize>,
}

/// What this library made for an id.
#[derive(Clone, Copy, Default)]
struct Owned {
    pd: bool,
    /// `send_cq` and `send_cq_channel`.
    send_cq: bool,
    /// `recv_cq` and `recv_cq_channel`.
    recv_cq: bool,
}

/// A copy of a delivered event, with its own private data.
struct HeldEvent {
    _raw: CBox<rdma_cm_event>,
    _private: Vec<u8>,
}

/// QP attributes kept for `rdma_get_request`.
#[derive(Clone, Copy)]
struct QpAttrs(ibv_qp_init_attr);

// SAFETY: the attributes' pointers (CQs, SRQ, context) are handles the application owns;
// they are only copied, never dereferenced here.
unsafe impl Send for QpAttrs {}

struct EvEntry {
    _raw: CBox<rdma_cm_event>,
    _ev: Event,
    _private: Vec<u8>,
}

struct AddrInfoEntry {
    _raw: CBox<rdma_addrinfo>,
    _src: Option<Box<libc::sockaddr_storage>>,
    _dst: Option<Box<libc::sockaddr_storage>>,
}

#[derive(Default)]
struct Reg {
    cm: Option<(RdmaCm, usize)>,
    /// The context's default PD (`id->pd` of every id, as librdmacm's per-device PD):
    /// allocated with the context, kept as long as it.
    default_pd: usize,
    /// The process that started `cm`.
    cm_pid: u32,
    chans: HashMap<usize, ChanEntry>,
    ids: HashMap<usize, IdEntry>,
    by_token: HashMap<u64, usize>,
    events: HashMap<usize, EvEntry>,
    addrinfos: HashMap<usize, AddrInfoEntry>,
    /// The XRC domain of the process's ids (`ibv_xrcd`), opened on first need.
    xrcd: usize,
}

static REG: LazyLock<Mutex<Reg>> = LazyLock::new(|| Mutex::new(Reg::default()));

fn reg() -> MutexGuard<'static, Reg> {
    // Every mutation is a single insert/remove: a caught panic leaves it consistent.
    REG.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Reg {
    /// The process's RDMA CM and its context, opened on first use.
    fn cm(&mut self) -> Result<(RdmaCm, *mut ibv_context), FfiError> {
        let pid = std::process::id();
        if self.cm_pid != pid {
            // A child made by `fork`: the parent's CM has no threads here; it is left
            // alone (never dropped: its teardown would wait for them) and a new one starts.
            std::mem::forget(self.cm.take());
            self.default_pd = 0;
        }
        if let Some((cm, ctx)) = &self.cm {
            return Ok((cm.clone(), *ctx as *mut ibv_context));
        }
        let dev = Registry::device()?;
        let ctx = Registry::open(dev)?;
        let net = Registry::net(ctx)?;
        let cm = RdmaCm::new();
        if let Err(e) = cm.add_device(net) {
            let _ = Registry::close(ctx);
            return Err(cm_error("starting the CM", &e));
        }
        // SAFETY: `ctx` is the live context just opened. A NULL result leaves `id->pd`
        // NULL, and `rdma_create_qp` then allocates one per id, as before.
        self.default_pd = unsafe { crate::verbs_api::uroce_ibv_alloc_pd(ctx) } as usize;
        self.cm = Some((cm.clone(), ctx as usize));
        self.cm_pid = pid;
        Ok((cm, ctx))
    }

    fn id(&self, id: *mut rdma_cm_id) -> Result<&IdEntry, FfiError> {
        self.ids
            .get(&(id as usize))
            .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })
    }

    fn id_mut(&mut self, id: *mut rdma_cm_id) -> Result<&mut IdEntry, FfiError> {
        self.ids
            .get_mut(&(id as usize))
            .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })
    }

    fn new_channel(&mut self, cm: &RdmaCm) -> Result<*mut rdma_event_channel, FfiError> {
        let ch = cm
            .create_event_channel()
            .map_err(|e| cm_error("rdma_create_event_channel", &e))?;
        let raw = CBox::new(rdma_event_channel {
            fd: ch.fd().as_raw_fd(),
        });
        let p = raw.ptr();
        self.chans.insert(
            p as usize,
            ChanEntry {
                _raw: raw,
                ch,
                stash: VecDeque::new(),
            },
        );
        Ok(p)
    }

    /// Registers a new C id for `id`.
    fn add_id(
        &mut self,
        id: CmId,
        chan: *mut rdma_event_channel,
        context: *mut c_void,
        sync: bool,
        ctx: *mut ibv_context,
    ) -> *mut rdma_cm_id {
        // SAFETY: rdma_cm_id holds integers, raw pointers and sockaddr storage: all valid
        // zeroed.
        let mut c: rdma_cm_id = unsafe { zeroed() };
        c.channel = chan;
        c.context = context;
        c.verbs = ctx;
        c.pd = self.default_pd as *mut ibv_pd;
        c.port_num = 1;
        let (ps, qpt) = match id.port_space() {
            PortSpace::Udp => (RDMA_PS_UDP, IBV_QPT_UD),
            PortSpace::Ib => (RDMA_PS_IB, IBV_QPT_RC),
            _ => (RDMA_PS_TCP, IBV_QPT_RC),
        };
        c.ps = ps;
        c.qp_type = qpt;
        let raw = CBox::new(c);
        let p = raw.ptr();
        self.by_token.insert(id.token(), p as usize);
        self.ids.insert(
            p as usize,
            IdEntry {
                raw,
                id,
                chan: chan as usize,
                sync,
                own_chan: false,
                owned: Owned::default(),
                ep_qp_attr: None,
                held: None,
                mcast_ctx: HashMap::new(),
            },
        );
        sync_addrs(self.ids.get(&(p as usize)));
        p
    }
}

/// Copies the id's addresses into its C struct.
fn sync_addrs(e: Option<&IdEntry>) {
    let Some(e) = e else { return };
    let raw = e.raw.ptr();
    // SAFETY: `raw` is a live id of the registry (the caller holds its lock); only fields
    // the application reads are written.
    unsafe {
        if let Some(a) = e.id.local_addr() {
            (*raw).route.addr.src = to_storage(a);
            (*raw).route.addr.ibaddr.sgid = gid_of(a.ip());
        }
        if let Some(a) = e.id.peer_addr() {
            (*raw).route.addr.dst = to_storage(a);
            (*raw).route.addr.ibaddr.dgid = gid_of(a.ip());
        }
        (*raw).route.addr.ibaddr.pkey = 0xffff;
    }
}

fn gid_of(ip: IpAddr) -> ibv_gid {
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    ibv_gid { raw: v6.octets() }
}

fn to_storage(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain integers.
    let mut s: libc::sockaddr_storage = unsafe { zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage, which is aligned for it.
            unsafe { std::ptr::write((&raw mut s).cast::<libc::sockaddr_in>(), sin) };
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&raw mut s).cast::<libc::sockaddr_in6>(), sin6) };
        }
    }
    s
}

/// Reads a C socket address (NULL: `None`).
///
/// # Safety
/// `sa` is NULL or points to a `sockaddr` whose family's struct is readable.
unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Result<Option<SocketAddr>, FfiError> {
    if sa.is_null() {
        return Ok(None);
    }
    // SAFETY: caller guarantee.
    let family = c_int::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in (caller guarantee).
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Ok(Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            ))))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6 (caller guarantee).
            let s6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            let ip = Ipv6Addr::from(s6.sin6_addr.s6_addr);
            if let Some(v4) = ip.to_ipv4_mapped() {
                return Ok(Some(SocketAddr::V4(SocketAddrV4::new(
                    v4,
                    u16::from_be(s6.sin6_port),
                ))));
            }
            Ok(Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(s6.sin6_port),
                s6.sin6_flowinfo,
                s6.sin6_scope_id,
            ))))
        }
        _ => Err(FfiError::Unsupported(
            "address family (only AF_INET and AF_INET6)",
        )),
    }
}

/// An RDMA-CM error as the C library reports it.
fn cm_error(op: &'static str, e: &CmError) -> FfiError {
    let errno = match e {
        CmError::NoDevice(_) => libc::EADDRNOTAVAIL,
        CmError::AddrInUse(_) => libc::EADDRINUSE,
        CmError::InvalidState { .. } | CmError::Invalid(_) => libc::EINVAL,
        CmError::QpBound => libc::EBUSY,
        CmError::QpDestroyed | CmError::NoQp => libc::EINVAL,
        CmError::PrivateDataTooLong { .. } => libc::EINVAL,
        CmError::InUse(_) => libc::EBUSY,
        CmError::Timeout => libc::ETIMEDOUT,
        CmError::AlreadyConnected => libc::EISCONN,
        CmError::NotJoined(_) => libc::EADDRNOTAVAIL,
        _ => libc::EIO,
    };
    FfiError::Refused {
        op,
        errno,
        reason: e.to_string(),
    }
}

fn conn_param_from_c(p: *const rdma_conn_param) -> ConnParam {
    let mut out = ConnParam::new();
    if p.is_null() {
        return out;
    }
    // SAFETY: caller guarantee of the entry points: NULL or a readable rdma_conn_param.
    let c = unsafe { p.read() };
    if !c.private_data.is_null() && c.private_data_len > 0 {
        // SAFETY: the C contract: private_data_len readable bytes.
        out.private_data = unsafe {
            std::slice::from_raw_parts(c.private_data.cast::<u8>(), usize::from(c.private_data_len))
        }
        .to_vec();
    }
    out.responder_resources = c.responder_resources;
    out.initiator_depth = c.initiator_depth;
    out.flow_control = c.flow_control != 0;
    out.retry_count = c.retry_count.min(7);
    out.rnr_retry_count = c.rnr_retry_count.min(7);
    out.srq = c.srq != 0;
    out.qp_num = c.qp_num;
    out
}

/// Turns a Rust event into a registered C event; `None` when its id is gone.
fn deliver(reg: &mut Reg, mut ev: Event) -> Option<*mut rdma_cm_event> {
    // SAFETY: rdma_cm_event is integers, pointers and a union of such: valid zeroed.
    let mut c: rdma_cm_event = unsafe { zeroed() };
    c.event = ev.kind as u32;
    c.status = ev.status;
    if ev.kind == EventKind::ConnectRequest {
        let listen = ev
            .listen_id
            .as_ref()
            .and_then(|l| reg.by_token.get(&l.token()).copied())?;
        let new = ev.take_id()?;
        let (lchan, lctx, lsync, lverbs, lqpt) = {
            let l = reg.ids.get(&listen)?;
            let r = l.raw.ptr();
            // SAFETY: a live id of the registry (lock held).
            unsafe { ((*r).channel, (*r).context, l.sync, (*r).verbs, (*r).qp_type) }
        };
        let p = reg.add_id(new, lchan, lctx, lsync, lverbs);
        // The new id takes the listener's QP type (as librdmacm's): an XRC_RECV listener's
        // requests get XRC_RECV QPs.
        // SAFETY: the id just registered (lock held).
        unsafe { (*p).qp_type = lqpt };
        c.id = p;
        c.listen_id = listen as *mut rdma_cm_id;
    } else {
        c.id = *reg.by_token.get(&ev.id.token())? as *mut rdma_cm_id;
        sync_addrs(reg.ids.get(&(c.id as usize)));
    }
    let private = ev.private_data().to_vec();
    let pd_ptr = if private.is_empty() {
        std::ptr::null()
    } else {
        private.as_ptr().cast::<c_void>()
    };
    let pd_len = u8::try_from(private.len()).unwrap_or(u8::MAX);
    if let Some(ud) = &ev.ud {
        // A join reports the caller's context instead (length 0), as librdmacm does.
        let (pd_ptr, pd_len) = match ev.kind {
            EventKind::MulticastJoin | EventKind::MulticastError => (
                reg.ids
                    .get(&(c.id as usize))
                    .and_then(|e| e.mcast_ctx.get(&ud.ah_ip))
                    .map_or(std::ptr::null(), |&ctx| ctx as *const c_void),
                0,
            ),
            _ => (pd_ptr, pd_len),
        };
        // SAFETY: ibv_ah_attr is integers: valid zeroed.
        let mut ah: ibv_ah_attr = unsafe { zeroed() };
        ah.is_global = 1;
        ah.port_num = 1;
        ah.grh.dgid = gid_of(ud.ah_ip);
        ah.grh.hop_limit = 64;
        c.param.ud = rdma_ud_param {
            private_data: pd_ptr,
            private_data_len: pd_len,
            ah_attr: ah,
            qp_num: ud.qp_num,
            qkey: ud.qkey,
        };
    } else {
        let p = &ev.param;
        c.param.conn = rdma_conn_param {
            private_data: pd_ptr,
            private_data_len: pd_len,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: u8::from(p.flow_control),
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: u8::from(p.srq),
            qp_num: p.qp_num,
        };
    }
    trace(
        &format!("event {:?} status {}", ev.kind, ev.status),
        c.id as usize,
    );
    let raw = CBox::new(c);
    let ptr = raw.ptr();
    // SAFETY: the id is live in the registry (lock held).
    unsafe { (*(*ptr).id).event = ptr };
    reg.events.insert(
        ptr as usize,
        EvEntry {
            _raw: raw,
            _ev: ev,
            _private: private,
        },
    );
    Some(ptr)
}

/// The next event on `chan` (stashed ones first), delivered; `Ok(None)` when none.
fn next_event(reg: &mut Reg, chan: usize) -> Result<Option<*mut rdma_cm_event>, FfiError> {
    // Bounded: each round removes one event from the channel.
    loop {
        let c = reg.chans.get_mut(&chan).ok_or(FfiError::BadHandle {
            what: "rdma_event_channel",
        })?;
        let ev = match c.stash.pop_front() {
            Some(e) => e,
            None => match c.ch.try_get_event() {
                Some(e) => e,
                None => return Ok(None),
            },
        };
        if let Some(p) = deliver(reg, ev) {
            return Ok(Some(p));
        }
    }
}

/// Waits, for a synchronous id, for its next event, which must be `want`. Events of other
/// ids are stashed for them. A failure event is acknowledged and reported as an error.
fn sync_wait(id: *mut rdma_cm_id, want: EventKind) -> Result<*mut rdma_cm_event, FfiError> {
    let deadline = Instant::now() + SYNC_TIMEOUT;
    let (chan, token) = {
        let r = reg();
        let e = r.id(id)?;
        (e.chan, e.id.token())
    };
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(FfiError::Refused {
                op: "rdma-cm synchronous call",
                errno: libc::ETIMEDOUT,
                reason: format!("no {want:?} event within {SYNC_TIMEOUT:?}"),
            });
        }
        let ch = {
            let r = reg();
            r.chans
                .get(&chan)
                .ok_or(FfiError::BadHandle {
                    what: "rdma_event_channel",
                })?
                .ch
                .clone()
        };
        let ev = match ch.get_event(deadline - now) {
            Ok(ev) => ev,
            Err(_) => continue,
        };
        let mut r = reg();
        let mine =
            ev.id.token() == token || ev.listen_id.as_ref().is_some_and(|l| l.token() == token);
        if !mine {
            if let Some(c) = r.chans.get_mut(&chan) {
                c.stash.push_back(ev);
            }
            continue;
        }
        let kind = ev.kind;
        let status = ev.status;
        let Some(p) = deliver(&mut r, ev) else {
            continue;
        };
        if kind == want {
            return Ok(p);
        }
        drop(r);
        // The failure event stays as `id->event` (its status and private data).
        hold(id, p)?;
        let errno = match kind {
            EventKind::Rejected => libc::ECONNREFUSED,
            EventKind::Unreachable => libc::ETIMEDOUT,
            EventKind::AddrError | EventKind::RouteError => libc::EHOSTUNREACH,
            _ => libc::ECONNABORTED,
        };
        return Err(FfiError::Refused {
            op: "rdma-cm synchronous call",
            errno,
            reason: format!("expected {want:?}, got {kind:?} (status {status})"),
        });
    }
}

/// Under `UROCE_DEBUG=cm`: one stderr line per RDMA-CM call (and event delivered).
fn trace(what: &str, id: usize) {
    static ON: LazyLock<bool> =
        LazyLock::new(|| std::env::var_os("UROCE_DEBUG").is_some_and(|v| v == "cm"));
    if *ON {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("uroce cm: {what} id {id:#x}\n").as_bytes(),
        );
    }
}

/// Acknowledges a delivered event.
fn ack(ev: *mut rdma_cm_event) -> Result<(), FfiError> {
    let e = reg()
        .events
        .remove(&(ev as usize))
        .ok_or(FfiError::BadHandle {
            what: "rdma_cm_event",
        })?;
    // Dropped outside the lock (acknowledging may wake a destroy).
    drop(e);
    Ok(())
}

/// Keeps a copy of delivered event `ev` as synchronous id `id`'s `id->event` (replacing
/// the one before) and acknowledges `ev`.
fn hold(id: *mut rdma_cm_id, ev: *mut rdma_cm_event) -> Result<(), FfiError> {
    let old = {
        let mut r = reg();
        if !r.events.contains_key(&(ev as usize)) {
            return Err(FfiError::BadHandle {
                what: "rdma_cm_event",
            });
        }
        // SAFETY: a live event of the registry (lock held): plain data, copied bitwise.
        let mut copy = unsafe { std::ptr::read(ev) };
        // SAFETY: both union members start with the private data pointer and length,
        // which `deliver` set from a buffer the event owns.
        let private = unsafe {
            let (p, n) = (
                copy.param.conn.private_data,
                copy.param.conn.private_data_len,
            );
            if p.is_null() || n == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(p.cast::<u8>(), usize::from(n)).to_vec()
            }
        };
        // The copy points at its own buffer (both union members alias the pointer).
        copy.param.conn.private_data = if private.is_empty() {
            std::ptr::null()
        } else {
            private.as_ptr().cast()
        };
        let held = HeldEvent {
            _raw: CBox::new(copy),
            _private: private,
        };
        let e = r
            .ids
            .get_mut(&(id as usize))
            .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
        // SAFETY: live id (lock held).
        unsafe { (*e.raw.ptr()).event = held._raw.ptr() };
        e.held.replace(held)
    };
    drop(old);
    ack(ev)
}

/// A reference to the id behind `id`, whether it is synchronous.
fn id_ref(id: *mut rdma_cm_id) -> Result<(CmIdRef, bool), FfiError> {
    let r = reg();
    let e = r.id(id)?;
    Ok(((*e.id).clone(), e.sync))
}

fn after_call(id: *mut rdma_cm_id) {
    let r = reg();
    sync_addrs(r.ids.get(&(id as usize)));
}

// ---------------------------------------------------------------------------------------
// Exported functions (called by uroce's librdmacm.so.1).
// ---------------------------------------------------------------------------------------

/// `rdma_create_event_channel()`.
#[no_mangle]
pub extern "C" fn uroce_rdmacm_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            let mut r = reg();
            let (cm, _) = r.cm()?;
            r.new_channel(&cm)
        })())
    })
}

/// `rdma_destroy_event_channel(channel)`.
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        let e = reg().chans.remove(&(channel as usize));
        drop(e);
    });
}

/// `rdma_create_id(channel, &id, context, ps)`.
///
/// # Safety
/// `id` is a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(-1, || {
        let r = (|| {
            if id.is_null() {
                return Err(FfiError::Invalid("id is NULL"));
            }
            let space = match ps {
                RDMA_PS_TCP => PortSpace::Tcp,
                RDMA_PS_UDP => PortSpace::Udp,
                RDMA_PS_IB => PortSpace::Ib,
                _ => {
                    return Err(FfiError::Unsupported(
                        "port space (only RDMA_PS_TCP, RDMA_PS_UDP and RDMA_PS_IB)",
                    ))
                }
            };
            let mut r = reg();
            let (cm, ctx) = r.cm()?;
            let (chan, sync) = if channel.is_null() {
                (r.new_channel(&cm)?, true)
            } else {
                (channel, false)
            };
            let ch = r
                .chans
                .get(&(chan as usize))
                .ok_or(FfiError::BadHandle {
                    what: "rdma_event_channel",
                })?
                .ch
                .clone();
            let new = cm
                .create_id(&ch, space)
                .map_err(|e| cm_error("rdma_create_id", &e))?;
            let p = r.add_id(new, chan, context, sync, ctx);
            if let Some(e) = r.ids.get_mut(&(p as usize)) {
                e.own_chan = sync;
            }
            // SAFETY: caller guarantee: writable (checked non-NULL).
            unsafe { *id = p };
            Ok(())
        })();
        minus_one(r)
    })
}

/// Frees what the library made for the id (QP, CQs, channels, PD) and the id.
fn destroy_id(id: *mut rdma_cm_id) -> Result<(), FfiError> {
    let e = {
        let mut r = reg();
        let e = r
            .ids
            .remove(&(id as usize))
            .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
        r.by_token.remove(&e.id.token());
        e
    };
    let raw = e.raw.ptr();
    let IdEntry {
        raw: craw,
        id: rid,
        chan,
        sync,
        own_chan,
        owned,
        ep_qp_attr,
        held,
        mcast_ctx,
    } = e;
    if let Err((back, err)) = rid.destroy() {
        // Put it back: the application must acknowledge its events first.
        let mut r = reg();
        r.by_token.insert(back.token(), raw as usize);
        r.ids.insert(
            raw as usize,
            IdEntry {
                raw: craw,
                id: back,
                chan,
                sync,
                own_chan,
                owned,
                ep_qp_attr,
                held,
                mcast_ctx,
            },
        );
        return Err(cm_error("rdma_destroy_id", &err));
    }
    // SAFETY: `raw` is the id just removed from the registry, still allocated (`craw`).
    let c = unsafe { &mut *raw };
    drop(held);
    // SAFETY: CQs and channels this library created on the id's context.
    unsafe {
        if owned.send_cq {
            destroy_cq_pair(c.send_cq, c.send_cq_channel);
        }
        if owned.recv_cq {
            destroy_cq_pair(c.recv_cq, c.recv_cq_channel);
        }
    }
    if owned.pd {
        // SAFETY: a PD this library allocated.
        unsafe { crate::verbs_api::uroce_ibv_dealloc_pd(c.pd) };
    }
    if own_chan {
        let ch = reg().chans.remove(&chan);
        drop(ch);
    }
    drop(craw);
    Ok(())
}

/// `rdma_destroy_id(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        trace("rdma_destroy_id", id as usize);
        minus_one(destroy_id(id))
    })
}

/// `rdma_bind_addr(id, addr)`: the unspecified address means the device's.
///
/// # Safety
/// `addr` points to a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        trace("rdma_bind_addr", id as usize);
        minus_one((|| {
            // SAFETY: caller guarantee.
            let a = unsafe { from_sockaddr(addr) }?.ok_or(FfiError::Invalid("addr is NULL"))?;
            let (cm, _) = reg().cm()?;
            let a = if a.ip().is_unspecified() {
                let ip = cm
                    .device_addrs()
                    .into_iter()
                    .find(|d| d.is_ipv4() == a.is_ipv4())
                    .ok_or(FfiError::Unsupported("no device of that address family"))?;
                SocketAddr::new(ip, a.port())
            } else {
                a
            };
            let (r, _) = id_ref(id)?;
            r.bind_addr(a).map_err(|e| cm_error("rdma_bind_addr", &e))?;
            after_call(id);
            Ok(())
        })())
    })
}

/// `rdma_resolve_addr(id, src, dst, timeout_ms)`.
///
/// # Safety
/// `src` is NULL or a socket address, `dst` a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        trace("rdma_resolve_addr", id as usize);
        minus_one((|| {
            // SAFETY: caller guarantee.
            let s = unsafe { from_sockaddr(src) }?;
            // SAFETY: caller guarantee.
            let d = unsafe { from_sockaddr(dst) }?.ok_or(FfiError::Invalid("dst is NULL"))?;
            let (r, sync) = id_ref(id)?;
            let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(2000));
            r.resolve_addr(s, d, t)
                .map_err(|e| cm_error("rdma_resolve_addr", &e))?;
            after_call(id);
            if sync {
                let ev = sync_wait(id, EventKind::AddrResolved)?;
                hold(id, ev)?;
            }
            Ok(())
        })())
    })
}

/// `rdma_resolve_route(id, timeout_ms)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_resolve_route(
    id: *mut rdma_cm_id,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            let (r, sync) = id_ref(id)?;
            let t = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(2000));
            r.resolve_route(t)
                .map_err(|e| cm_error("rdma_resolve_route", &e))?;
            if sync {
                let ev = sync_wait(id, EventKind::RouteResolved)?;
                hold(id, ev)?;
            }
            Ok(())
        })())
    })
}

/// Destroys a CQ and its completion channel this library made (either may be NULL).
///
/// # Safety
/// Both are NULL or objects of this library that nothing else uses any more.
unsafe fn destroy_cq_pair(cq: *mut ibv_cq, ch: *mut ibv_comp_channel) {
    // SAFETY: caller guarantee.
    unsafe {
        if !cq.is_null() {
            crate::verbs_api::uroce_ibv_destroy_cq(cq);
        }
        if !ch.is_null() {
            crate::verbs_api::uroce_ibv_destroy_comp_channel(ch);
        }
    }
}

/// A CQ of `size` entries with its own completion channel, its context the id (as
/// librdmacm makes them when the caller gives none).
fn make_cq(
    verbs: *mut ibv_context,
    size: u32,
    id: *mut rdma_cm_id,
) -> Result<(*mut ibv_cq, *mut ibv_comp_channel), FfiError> {
    // SAFETY: `verbs` is this library's context.
    let ch = unsafe { crate::verbs_api::uroce_ibv_create_comp_channel(verbs) };
    if ch.is_null() {
        return Err(FfiError::Invalid(
            "cannot create a completion channel for the id",
        ));
    }
    // SAFETY: as above; `ch` was just made on it.
    let cq = unsafe {
        crate::verbs_api::uroce_ibv_create_cq(
            verbs,
            c_int::try_from(size.max(1)).unwrap_or(1),
            id.cast(),
            ch,
            0,
        )
    };
    if cq.is_null() {
        // SAFETY: the channel just made, unused.
        unsafe { destroy_cq_pair(std::ptr::null_mut(), ch) };
        return Err(FfiError::Invalid("cannot create a CQ for the id"));
    }
    Ok((cq, ch))
}

/// The process's XRC domain for ids (librdmacm opens one per device: `fd` -1,
/// `O_CREAT`), opened on first need and kept.
fn ids_xrcd(verbs: *mut ibv_context) -> Result<*mut ibv_xrcd, FfiError> {
    let mut r = reg();
    if r.xrcd != 0 {
        return Ok(r.xrcd as *mut ibv_xrcd);
    }
    let mut a = ibv_xrcd_init_attr {
        comp_mask: IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
        fd: -1,
        oflags: libc::O_CREAT,
    };
    // SAFETY: `verbs` is this library's context; `a` a readable attribute struct.
    let x = unsafe { crate::xrc::vctx_open_xrcd(verbs, &mut a) };
    if x.is_null() {
        return Err(FfiError::Refused {
            op: "opening the ids' XRC domain",
            errno: last_errno(),
            reason: "ibv_open_xrcd failed".into(),
        });
    }
    r.xrcd = x as usize;
    Ok(x)
}

fn last_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|e| *e != 0)
        .unwrap_or(libc::EINVAL)
}

fn einval(op: &'static str, reason: &str) -> FfiError {
    FfiError::Refused {
        op,
        errno: libc::EINVAL,
        reason: reason.into(),
    }
}

/// The id's C struct (live while the application does not destroy the id).
fn id_raw(id: *mut rdma_cm_id) -> Result<*mut rdma_cm_id, FfiError> {
    Ok(reg().id(id)?.raw.ptr())
}

/// `rdma_create_qp_ex`'s work: the id's QP through this library's `ibv_create_qp_ex`
/// (XRC_RECV: in the process's XRC domain), with CQs and channels for what the caller
/// and the id give none of, and a PD when neither has one; bound to the id. On a
/// `RDMA_PS_IB` id the attributes' QP type (RC, XRC_SEND, XRC_RECV) becomes the id's;
/// on TCP / UDP ids the port space's type is used.
fn create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> Result<(), FfiError> {
    const OP: &str = "rdma_create_qp_ex";
    if attr.is_null() {
        return Err(FfiError::Invalid("qp_init_attr is NULL"));
    }
    let (rid, _) = id_ref(id)?;
    let c = id_raw(id)?;
    // SAFETY: live id of the registry.
    let cur = unsafe { &*c };
    if !cur.qp.is_null() {
        return Err(einval(OP, "the id has a QP"));
    }
    // SAFETY: caller guarantee: readable (checked non-NULL).
    let mut a = unsafe { attr.read() };
    if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 && !a.pd.is_null() {
        // SAFETY: a PD of the application (this library's).
        if unsafe { (*a.pd).context } != cur.verbs {
            return Err(einval(OP, "the PD is not of the id's context"));
        }
    } else {
        a.pd = cur.pd;
    }
    if (!cur.recv_cq.is_null() && !a.recv_cq.is_null() && cur.recv_cq != a.recv_cq)
        || (!cur.send_cq.is_null() && !a.send_cq.is_null() && cur.send_cq != a.send_cq)
    {
        return Err(einval(OP, "CQs other than the id's"));
    }
    if cur.ps == RDMA_PS_IB {
        if !matches!(a.qp_type, IBV_QPT_RC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV) {
            return Err(einval(
                OP,
                "RDMA_PS_IB ids take RC, XRC_SEND or XRC_RECV QPs",
            ));
        }
    } else {
        a.qp_type = cur.qp_type;
    }
    let qpt = a.qp_type;
    if qpt == IBV_QPT_XRC_RECV && (a.comp_mask & IBV_QP_INIT_ATTR_XRCD == 0 || a.xrcd.is_null()) {
        a.xrcd = ids_xrcd(cur.verbs)?;
        a.comp_mask |= IBV_QP_INIT_ATTR_XRCD;
    }
    // What this call makes, undone on failure.
    let mut made = Owned::default();
    let mut pd = a.pd;
    let (mut scq, mut sch) = (cur.send_cq, cur.send_cq_channel);
    let (mut rcq, mut rch) = (cur.recv_cq, cur.recv_cq_channel);
    let undo = |made: Owned,
                pd,
                s: (*mut ibv_cq, *mut ibv_comp_channel),
                r: (*mut ibv_cq, *mut ibv_comp_channel)| {
        // SAFETY: objects this call made, not handed out.
        unsafe {
            if made.send_cq {
                destroy_cq_pair(s.0, s.1);
            }
            if made.recv_cq {
                destroy_cq_pair(r.0, r.1);
            }
            if made.pd {
                crate::verbs_api::uroce_ibv_dealloc_pd(pd);
            }
        }
    };
    let r = (|| {
        if pd.is_null() {
            // SAFETY: the id's context.
            pd = unsafe { crate::verbs_api::uroce_ibv_alloc_pd(cur.verbs) };
            if pd.is_null() {
                return Err(FfiError::Invalid("cannot allocate a PD for the id"));
            }
            made.pd = true;
        }
        if qpt != IBV_QPT_XRC_RECV {
            if a.send_cq.is_null() && scq.is_null() {
                (scq, sch) = make_cq(cur.verbs, a.cap.max_send_wr, id)?;
                made.send_cq = true;
            }
            // An XRC initiator has no receive side.
            if qpt != IBV_QPT_XRC_SEND && a.recv_cq.is_null() && rcq.is_null() {
                (rcq, rch) = make_cq(cur.verbs, a.cap.max_recv_wr, id)?;
                made.recv_cq = true;
            }
        }
        if a.send_cq.is_null() {
            a.send_cq = scq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = rcq;
        }
        if a.srq.is_null() {
            a.srq = cur.srq;
        }
        a.pd = pd;
        a.comp_mask |= IBV_QP_INIT_ATTR_PD;
        // Inline data at least as large as the send SGEs (16 bytes each, up to 64 bytes, far
        // below the device's limit), what the kernel's Soft-RoCE grants for such a request:
        // rdma_xclient sends 16 bytes inline on a QP that asked for one SGE and no inline
        // data.
        if qpt != IBV_QPT_XRC_RECV {
            a.cap.max_inline_data = a
                .cap
                .max_inline_data
                .max(a.cap.max_send_sge.saturating_mul(16).min(64));
        }
        // SAFETY: `a` is a valid, writable init attr on this library's objects.
        let qp = unsafe { crate::xrc::vctx_create_qp_ex(cur.verbs, &mut a) };
        if qp.is_null() {
            return Err(FfiError::Refused {
                op: OP,
                errno: last_errno(),
                reason: "ibv_create_qp_ex failed".into(),
            });
        }
        let bound = qp_ref(qp).and_then(|(q, _)| rid.bind_qp(&q).map_err(|e| cm_error(OP, &e)));
        if let Err(e) = bound {
            // SAFETY: the QP just created.
            unsafe { crate::verbs_api::uroce_ibv_destroy_qp(qp) };
            return Err(e);
        }
        Ok(qp)
    })();
    let qp = match r {
        Ok(qp) => qp,
        Err(e) => {
            undo(made, pd, (scq, sch), (rcq, rch));
            return Err(e);
        }
    };
    // SAFETY: caller guarantee: writable.
    unsafe { attr.write(a) };
    let mut g = reg();
    let e = g
        .ids
        .get_mut(&(id as usize))
        .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
    e.owned.pd |= made.pd;
    e.owned.send_cq |= made.send_cq;
    e.owned.recv_cq |= made.recv_cq;
    // SAFETY: live id (lock held).
    unsafe {
        (*c).qp = qp;
        (*c).pd = pd;
        (*c).qp_type = qpt;
        (*c).send_cq = scq;
        (*c).send_cq_channel = sch;
        (*c).recv_cq = rcq;
        (*c).recv_cq_channel = rch;
    }
    Ok(())
}

/// `rdma_create_qp`'s work: [`create_qp_ex`] on the same attributes with `pd` (or the
/// id's PD); the granted attributes are written back.
fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), FfiError> {
    if attr.is_null() {
        return Err(FfiError::Invalid("qp_init_attr is NULL"));
    }
    // SAFETY: caller guarantee: readable (checked non-NULL).
    let a = unsafe { attr.read() };
    // SAFETY: ibv_qp_init_attr_ex is pointers and integers: valid zeroed.
    let mut x: ibv_qp_init_attr_ex = unsafe { zeroed() };
    x.qp_context = a.qp_context;
    x.send_cq = a.send_cq;
    x.recv_cq = a.recv_cq;
    x.srq = a.srq;
    x.cap = a.cap;
    x.qp_type = a.qp_type;
    x.sq_sig_all = a.sq_sig_all;
    x.comp_mask = IBV_QP_INIT_ATTR_PD;
    x.pd = pd;
    create_qp_ex(id, &mut x)?;
    // SAFETY: caller guarantee: writable.
    unsafe {
        attr.write(ibv_qp_init_attr {
            qp_context: x.qp_context,
            send_cq: x.send_cq,
            recv_cq: x.recv_cq,
            srq: x.srq,
            cap: x.cap,
            qp_type: x.qp_type,
            sq_sig_all: x.sq_sig_all,
        })
    };
    Ok(())
}

/// `rdma_create_qp(id, pd, qp_init_attr)`.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || minus_one(create_qp(id, pd, attr)))
}

/// `rdma_create_qp_ex(id, qp_init_attr_ex)`: see `create_qp_ex`.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard(-1, || minus_one(create_qp_ex(id, attr)))
}

/// `rdma_create_srq_ex`'s work (librdmacm's rules): the id's PD when none is given; an
/// XRC SRQ in the process's XRC domain completing into the id's receive CQ (made when the
/// id has none); the SRQ becomes `id->srq`.
fn create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> Result<(), FfiError> {
    const OP: &str = "rdma_create_srq_ex";
    if attr.is_null() {
        return Err(FfiError::Invalid("srq_init_attr is NULL"));
    }
    let c = id_raw(id)?;
    // SAFETY: live id of the registry.
    let cur = unsafe { &*c };
    // SAFETY: caller guarantee: readable (checked non-NULL).
    let mut a = unsafe { attr.read() };
    if a.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 {
        return Err(einval(OP, "no SRQ type"));
    }
    let mut made = Owned::default();
    if a.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = cur.pd;
        a.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if a.pd.is_null() {
        // SAFETY: the id's context.
        a.pd = unsafe { crate::verbs_api::uroce_ibv_alloc_pd(cur.verbs) };
        if a.pd.is_null() {
            return Err(FfiError::Invalid("cannot allocate a PD for the id"));
        }
        made.pd = true;
    }
    let (mut rcq, mut rch) = (cur.recv_cq, cur.recv_cq_channel);
    let r = (|| {
        if a.srq_type == IBV_SRQT_XRC {
            if a.comp_mask & IBV_SRQ_INIT_ATTR_XRCD == 0 || a.xrcd.is_null() {
                a.xrcd = ids_xrcd(cur.verbs)?;
            }
            if a.comp_mask & IBV_SRQ_INIT_ATTR_CQ == 0 || a.cq.is_null() {
                if rcq.is_null() {
                    (rcq, rch) = make_cq(cur.verbs, a.attr.max_wr, id)?;
                    made.recv_cq = true;
                }
                a.cq = rcq;
            }
            a.comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
        }
        // SAFETY: `a` is a valid, writable init attr on this library's objects.
        let srq = unsafe { crate::xrc::vctx_create_srq_ex(cur.verbs, &mut a) };
        if srq.is_null() {
            return Err(FfiError::Refused {
                op: OP,
                errno: last_errno(),
                reason: "ibv_create_srq_ex failed".into(),
            });
        }
        Ok(srq)
    })();
    let srq = match r {
        Ok(s) => s,
        Err(e) => {
            // SAFETY: objects this call made, not handed out.
            unsafe {
                if made.recv_cq {
                    destroy_cq_pair(rcq, rch);
                }
                if made.pd {
                    crate::verbs_api::uroce_ibv_dealloc_pd(a.pd);
                }
            }
            return Err(e);
        }
    };
    // SAFETY: caller guarantee: writable.
    unsafe { attr.write(a) };
    let mut g = reg();
    let e = g
        .ids
        .get_mut(&(id as usize))
        .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
    e.owned.pd |= made.pd;
    e.owned.recv_cq |= made.recv_cq;
    // SAFETY: live id (lock held).
    unsafe {
        if (*c).pd.is_null() {
            (*c).pd = a.pd;
        }
        (*c).srq = srq;
        (*c).recv_cq = rcq;
        (*c).recv_cq_channel = rch;
    }
    Ok(())
}

/// `rdma_create_srq_ex(id, attr)`: see `create_srq_ex`.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    guard(-1, || minus_one(create_srq_ex(id, attr)))
}

/// `rdma_create_srq(id, pd, attr)`: an XRC SRQ on an XRC_RECV id, a basic one otherwise.
///
/// # Safety
/// `attr` is readable and writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if attr.is_null() {
                return Err(FfiError::Invalid("srq_init_attr is NULL"));
            }
            let c = id_raw(id)?;
            // SAFETY: caller guarantee: readable (checked non-NULL).
            let a = unsafe { attr.read() };
            // SAFETY: ibv_srq_init_attr_ex is pointers and integers: valid zeroed.
            let mut x: ibv_srq_init_attr_ex = unsafe { zeroed() };
            x.srq_context = a.srq_context;
            x.attr = a.attr;
            x.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
            // SAFETY: live id.
            x.srq_type = if unsafe { (*c).qp_type } == IBV_QPT_XRC_RECV {
                IBV_SRQT_XRC
            } else {
                IBV_SRQT_BASIC
            };
            x.pd = pd;
            create_srq_ex(id, &mut x)?;
            // SAFETY: caller guarantee: writable.
            unsafe {
                attr.write(ibv_srq_init_attr {
                    srq_context: x.srq_context,
                    attr: x.attr,
                })
            };
            Ok(())
        })())
    })
}

/// `rdma_destroy_srq(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok(c) = id_raw(id) else { return };
        // SAFETY: live id; its SRQ, made by this library.
        unsafe {
            let srq = std::mem::replace(&mut (*c).srq, std::ptr::null_mut());
            if !srq.is_null() {
                crate::verbs_api::uroce_ibv_destroy_srq(srq);
            }
        }
    });
}

/// `rdma_destroy_qp(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok((r, _)) = id_ref(id) else { return };
        let _ = r.destroy_qp();
        let qp = {
            let g = reg();
            let Ok(e) = g.id(id) else { return };
            let c = e.raw.ptr();
            // SAFETY: live id (lock held).
            unsafe { std::mem::replace(&mut (*c).qp, std::ptr::null_mut()) }
        };
        if !qp.is_null() {
            // SAFETY: the id's QP, created by this library.
            unsafe { crate::verbs_api::uroce_ibv_destroy_qp(qp) };
        }
    });
}

/// `rdma_listen(id, backlog)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    guard(-1, || {
        trace("rdma_listen", id as usize);
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            r.listen(u32::try_from(backlog).unwrap_or(0))
                .map_err(|e| cm_error("rdma_listen", &e))
        })())
    })
}

/// `rdma_connect` / `rdma_accept`: the step `start` on the id, then, for an id without an
/// event channel (synchronous), the wait for ESTABLISHED and its acknowledgement.
fn establishing(
    id: *mut rdma_cm_id,
    name: &'static str,
    start: impl FnOnce(&CmIdRef) -> Result<(), CmError>,
) -> Result<(), FfiError> {
    trace(name, id as usize);
    let (r, sync) = id_ref(id)?;
    start(&r).map_err(|e| cm_error(name, &e))?;
    if sync {
        // `id->event` stays: rdma_xclient reads the accept's private data from it.
        let ev = sync_wait(id, EventKind::Established)?;
        hold(id, ev)?;
    }
    Ok(())
}

/// `rdma_connect(id, conn_param)`.
///
/// # Safety
/// `param` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_connect(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        minus_one(establishing(id, "rdma_connect", |r| {
            r.connect(&conn_param_from_c(param))
        }))
    })
}

/// `rdma_accept(id, conn_param)`.
///
/// # Safety
/// `param` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_accept(
    id: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        minus_one(establishing(id, "rdma_accept", |r| {
            r.accept(&conn_param_from_c(param))
        }))
    })
}

/// `rdma_reject(id, private_data, len)`.
///
/// # Safety
/// `data` is NULL or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_reject(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
) -> c_int {
    guard(-1, || {
        trace("rdma_reject", id as usize);
        minus_one((|| {
            let pd = if data.is_null() || len == 0 {
                Vec::new()
            } else {
                // SAFETY: caller guarantee.
                unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
            };
            let (r, _) = id_ref(id)?;
            r.reject(&pd).map_err(|e| cm_error("rdma_reject", &e))
        })())
    })
}

/// `rdma_disconnect(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        trace("rdma_disconnect", id as usize);
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            r.disconnect().map_err(|e| cm_error("rdma_disconnect", &e))
        })())
    })
}

/// `rdma_establish(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            r.establish().map_err(|e| cm_error("rdma_establish", &e))
        })())
    })
}

/// `rdma_get_cm_event(channel, &event)`: blocks unless the descriptor is `O_NONBLOCK`
/// (then `EAGAIN`); a cancellation point.
///
/// # Safety
/// `event` is writable.
#[no_mangle]
pub unsafe extern "C-unwind" fn uroce_rdmacm_rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    blocking_call(-1, || {
        let mut r = reg();
        if event.is_null() {
            return Attempt::Done(minus_one(Err(FfiError::Invalid("event is NULL"))));
        }
        match next_event(&mut r, channel as usize) {
            Ok(Some(p)) => {
                // SAFETY: caller guarantee (checked non-NULL).
                unsafe { *event = p };
                Attempt::Done(0)
            }
            Ok(None) => {
                let c = &r.chans[&(channel as usize)];
                Attempt::Wait {
                    fd: c.ch.fd().as_raw_fd(),
                    keep: Box::new(c.ch.clone()),
                }
            }
            Err(e) => Attempt::Done(minus_one(Err(e))),
        }
    })
}

/// `rdma_ack_cm_event(event)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || minus_one(ack(event)))
}

/// `rdma_event_str(event)`.
#[no_mangle]
pub extern "C" fn uroce_rdmacm_rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static CStr = match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

/// `struct ibv_ece` (`<infiniband/verbs.h>`): enhanced connection establishment options.
#[repr(C)]
pub struct ibv_ece {
    /// The provider's IEEE OUI; 0: no ECE.
    pub vendor_id: u32,
    /// Vendor-specific options.
    pub options: u32,
    /// Reserved (0).
    pub comp_mask: u32,
}

/// The checks rdma-core's ECE calls make: an id of this library without a QP of its own
/// (ECE is for external QPs) and a non-NULL `ece`.
fn ece_id(id: *mut rdma_cm_id, ece: *mut ibv_ece, op: &'static str) -> Result<(), FfiError> {
    if ece.is_null() {
        return Err(FfiError::Invalid(op));
    }
    let r = reg();
    let e = r.id(id)?;
    // SAFETY: live id (lock held).
    if !unsafe { (*e.raw.ptr()).qp }.is_null() {
        return Err(FfiError::Invalid(op));
    }
    Ok(())
}

/// `rdma_set_local_ece(id, ece)`: accepted for an id without QP; uroce's CM carries no ECE
/// in its REQ/REP, so the options are not sent (the peer reads none).
///
/// # Safety
/// `ece` is NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_set_local_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard(-1, || {
        minus_one(ece_id(
            id,
            ece,
            "rdma_set_local_ece: ece is NULL or the id has a QP",
        ))
    })
}

/// `rdma_get_remote_ece(id, ece)`: the peer's ECE, which uroce's CM does not carry: vendor
/// 0, no options (what rdma-core reports for a peer without ECE).
///
/// # Safety
/// `ece` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_remote_ece(
    id: *mut rdma_cm_id,
    ece: *mut ibv_ece,
) -> c_int {
    guard(-1, || {
        minus_one(
            ece_id(
                id,
                ece,
                "rdma_get_remote_ece: ece is NULL or the id has a QP",
            )
            .map(|()| {
                // SAFETY: non-NULL (checked), writable per the caller's contract.
                unsafe {
                    ece.write(ibv_ece {
                        vendor_id: 0,
                        options: 0,
                        comp_mask: 0,
                    })
                };
            }),
        )
    })
}

/// `rdma_set_option(id, level, optname, optval, optlen)`: `RDMA_OPTION_ID_ACK_TIMEOUT`
/// sets the local ACK timeout of the id's QP (on either side, as the kernel's CM); the
/// other options (type of service, reuse address, IPv6 only, IB paths) are accepted and
/// ignored.
///
/// # Safety
/// `optval` is NULL or readable for `optlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    /// `RDMA_OPTION_ID` / `RDMA_OPTION_ID_ACK_TIMEOUT` (`<rdma/rdma_cma.h>`).
    const RDMA_OPTION_ID: c_int = 0;
    const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;
    guard(-1, || {
        if level != RDMA_OPTION_ID || optname != RDMA_OPTION_ID_ACK_TIMEOUT {
            return 0;
        }
        minus_one((|| {
            if optval.is_null() || optlen != 1 {
                return Err(FfiError::Invalid(
                    "rdma_set_option(ACK_TIMEOUT): optval must be one uint8_t",
                ));
            }
            let (r, _) = id_ref(id)?;
            // SAFETY: `optval` is non-NULL and points to `optlen` = 1 readable byte
            // (caller contract).
            let timeout = unsafe { optval.cast::<u8>().read() };
            r.set_ack_timeout(timeout);
            Ok(())
        })())
    })
}

/// Reads the text `s` (NULL: `None`).
///
/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn opt_str<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        None
    } else {
        // SAFETY: caller guarantee.
        unsafe { CStr::from_ptr(s) }.to_str().ok()
    }
}

/// `rdma_getaddrinfo(node, service, hints, &res)`: IP literals and names the system
/// resolver knows; one entry.
///
/// # Safety
/// `node`, `service` NULL or strings; `hints` NULL or readable; `res` writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if res.is_null() {
                return Err(FfiError::Invalid("res is NULL"));
            }
            // SAFETY: caller guarantee.
            let (node, service) = unsafe { (opt_str(node), opt_str(service)) };
            let port: u16 = match service {
                None => 0,
                Some(s) => s
                    .parse()
                    .map_err(|_| FfiError::Invalid("service must be a port number"))?,
            };
            let (flags, ps, qpt, hint_src, hint_dst) = if hints.is_null() {
                (0, RDMA_PS_TCP, IBV_QPT_RC as c_int, None, None)
            } else {
                // SAFETY: caller guarantee: readable hints.
                let h = unsafe { &*hints };
                // SAFETY: the hints' addresses are NULL or socket addresses.
                let (s, d) =
                    unsafe { (from_sockaddr(h.ai_src_addr)?, from_sockaddr(h.ai_dst_addr)?) };
                let ps = if h.ai_port_space != 0 {
                    h.ai_port_space
                } else if h.ai_qp_type == IBV_QPT_UD as c_int {
                    RDMA_PS_UDP
                } else {
                    RDMA_PS_TCP
                };
                let qpt = if h.ai_qp_type != 0 {
                    h.ai_qp_type
                } else if ps == RDMA_PS_UDP {
                    IBV_QPT_UD as c_int
                } else {
                    IBV_QPT_RC as c_int
                };
                (h.ai_flags, ps, qpt, s, d)
            };
            let ip = match node {
                None => None,
                Some(n) => Some(match n.parse::<IpAddr>() {
                    Ok(ip) => ip,
                    Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(n, port))
                        .ok()
                        .and_then(|mut a| a.next())
                        .map(|a| a.ip())
                        .ok_or(FfiError::Refused {
                            op: "rdma_getaddrinfo",
                            errno: libc::ENODEV,
                            reason: format!("cannot resolve {n}"),
                        })?,
                }),
            };
            let (src, dst) = if flags & RAI_PASSIVE != 0 {
                let ip = ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
                (Some(SocketAddr::new(ip, port)), None)
            } else if let Some(ip) = ip.or(hint_dst.map(|d| d.ip())) {
                (hint_src, Some(SocketAddr::new(ip, port)))
            } else if hint_src.is_some() {
                // No node and no destination: the source of the hints alone, as
                // librdmacm's (pyverbs' `AddrInfo(src=…)` names a multicast group so).
                (hint_src, None)
            } else {
                return Err(FfiError::Invalid("no node for an active rdma_getaddrinfo"));
            };
            let family = match src.or(dst) {
                Some(SocketAddr::V6(_)) => libc::AF_INET6,
                _ => libc::AF_INET,
            };
            let len_of = |a: &SocketAddr| -> libc::socklen_t {
                let n = if a.is_ipv4() {
                    std::mem::size_of::<libc::sockaddr_in>()
                } else {
                    std::mem::size_of::<libc::sockaddr_in6>()
                };
                libc::socklen_t::try_from(n).unwrap_or(0)
            };
            let mut src_box = src.map(|a| Box::new(to_storage(a)));
            let mut dst_box = dst.map(|a| Box::new(to_storage(a)));
            let ai = rdma_addrinfo {
                ai_flags: flags,
                ai_family: family,
                ai_qp_type: qpt,
                ai_port_space: ps,
                ai_src_len: src.as_ref().map_or(0, len_of),
                ai_dst_len: dst.as_ref().map_or(0, len_of),
                ai_src_addr: src_box.as_deref_mut().map_or(std::ptr::null_mut(), |s| {
                    (s as *mut libc::sockaddr_storage).cast()
                }),
                ai_dst_addr: dst_box.as_deref_mut().map_or(std::ptr::null_mut(), |s| {
                    (s as *mut libc::sockaddr_storage).cast()
                }),
                ai_src_canonname: std::ptr::null_mut(),
                ai_dst_canonname: std::ptr::null_mut(),
                ai_route_len: 0,
                ai_route: std::ptr::null_mut(),
                ai_connect_len: 0,
                ai_connect: std::ptr::null_mut(),
                ai_next: std::ptr::null_mut(),
            };
            let raw = CBox::new(ai);
            let p = raw.ptr();
            reg().addrinfos.insert(
                p as usize,
                AddrInfoEntry {
                    _raw: raw,
                    _src: src_box,
                    _dst: dst_box,
                },
            );
            // SAFETY: caller guarantee (checked non-NULL).
            unsafe { *res = p };
            Ok(())
        })())
    })
}

/// `rdma_freeaddrinfo(res)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let e = reg().addrinfos.remove(&(res as usize));
        drop(e);
    });
}

/// `rdma_create_ep(&id, res, pd, qp_init_attr)`: a synchronous id, bound (passive) or
/// resolved (active), with a QP when attributes are given (a listener keeps them for
/// `rdma_get_request`).
///
/// # Safety
/// `id` writable; `res` a readable `rdma_addrinfo`; `attr` NULL or readable/writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if id.is_null() || res.is_null() {
                return Err(FfiError::Invalid("id or res is NULL"));
            }
            // SAFETY: caller guarantee: readable addrinfo.
            let ai = unsafe { &*res };
            let mut p = std::ptr::null_mut();
            // SAFETY: `p` is writable.
            let rc = unsafe {
                uroce_rdmacm_rdma_create_id(
                    std::ptr::null_mut(),
                    &mut p,
                    std::ptr::null_mut(),
                    ai.ai_port_space,
                )
            };
            if rc != 0 {
                return Err(FfiError::Invalid("rdma_create_id failed"));
            }
            let made = p;
            let fail = move |e: FfiError| {
                let _ = destroy_id(made);
                e
            };
            let qpt = match ai.ai_qp_type {
                0 => None,
                t => Some(
                    u32::try_from(t)
                        .ok()
                        .filter(|t| {
                            matches!(
                                *t,
                                IBV_QPT_RC | IBV_QPT_UD | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV
                            )
                        })
                        .ok_or_else(|| fail(einval("rdma_create_ep", "QP type")))?,
                ),
            };
            // SAFETY: live id just made.
            unsafe {
                if !pd.is_null() {
                    (*p).pd = pd;
                }
                if let Some(t) = qpt {
                    (*p).qp_type = t;
                }
            }
            // librdmacm creates the endpoint's QP with the addrinfo's type.
            let attr_typed = |attr: *mut ibv_qp_init_attr| {
                if let Some(t) = qpt {
                    // SAFETY: caller guarantee: writable (checked non-NULL by the caller).
                    unsafe { (*attr).qp_type = t };
                }
            };
            if ai.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the addrinfo's source address.
                if unsafe { uroce_rdmacm_rdma_bind_addr(p, ai.ai_src_addr) } != 0 {
                    return Err(fail(FfiError::Invalid("rdma_bind_addr failed")));
                }
                if !attr.is_null() {
                    attr_typed(attr);
                    // SAFETY: caller guarantee: readable.
                    let a = unsafe { attr.read() };
                    if let Some(e) = reg().ids.get_mut(&(p as usize)) {
                        e.ep_qp_attr = Some(QpAttrs(a));
                    }
                }
            } else {
                // SAFETY: the addrinfo's addresses.
                if unsafe {
                    uroce_rdmacm_rdma_resolve_addr(p, ai.ai_src_addr, ai.ai_dst_addr, 2000)
                } != 0
                {
                    return Err(fail(FfiError::Invalid("rdma_resolve_addr failed")));
                }
                // SAFETY: live id.
                if unsafe { uroce_rdmacm_rdma_resolve_route(p, 2000) } != 0 {
                    return Err(fail(FfiError::Invalid("rdma_resolve_route failed")));
                }
                if !attr.is_null() {
                    attr_typed(attr);
                    create_qp(p, pd, attr).map_err(fail)?;
                }
            }
            // SAFETY: caller guarantee (checked non-NULL).
            unsafe { *id = p };
            Ok(())
        })())
    })
}

/// `rdma_destroy_ep(id)`.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: forwarded.
        unsafe {
            uroce_rdmacm_rdma_destroy_qp(id);
            uroce_rdmacm_rdma_destroy_srq(id);
        }
        let _ = destroy_id(id);
    });
}

/// `rdma_get_request(listen, &id)`: the next connection request of a synchronous
/// listener, with a QP when the listener was made with QP attributes.
///
/// # Safety
/// `id` writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if id.is_null() {
                return Err(FfiError::Invalid("id is NULL"));
            }
            let (attr, pd) = {
                let r = reg();
                let e = r.id(listen)?;
                if !e.sync {
                    return Err(FfiError::Invalid(
                        "rdma_get_request needs a synchronous listener",
                    ));
                }
                // SAFETY: live id (lock held).
                (e.ep_qp_attr, unsafe { (*e.raw.ptr()).pd })
            };
            let ev = sync_wait(listen, EventKind::ConnectRequest)?;
            // SAFETY: a live event of the registry.
            let new = unsafe { (*ev).id };
            // Its events arrive on the listener's channel (where the Rust id reports);
            // synchronous waits stash what is not theirs.
            if let Some(QpAttrs(mut a)) = attr {
                if let Err(e) = create_qp(new, pd, &mut a) {
                    let _ = ack(ev);
                    return Err(e);
                }
            }
            // SAFETY: caller guarantee (checked non-NULL).
            unsafe { *id = new };
            // The request stays as `new->event` until the next synchronous call or the
            // id's destruction, as in rdma-core.
            hold(new, ev)
        })())
    })
}

/// `rdma_get_src_port(id)` (network order).
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        id_ref(id)
            .ok()
            .and_then(|(r, _)| r.local_addr())
            .map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_dst_port(id)` (network order).
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        id_ref(id)
            .ok()
            .and_then(|(r, _)| r.peer_addr())
            .map_or(0, |a| a.port().to_be())
    })
}

/// `rdma_get_devices(&num)`: the one context.
///
/// # Safety
/// `num` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        ptr_or_null((|| {
            let (_, ctx) = reg().cm()?;
            let list = Box::leak(Box::new([ctx, std::ptr::null_mut()]));
            if !num.is_null() {
                // SAFETY: caller guarantee.
                unsafe { *num = 1 };
            }
            Ok(list.as_mut_ptr())
        })())
    })
}

/// `rdma_free_devices(list)`.
///
/// # Safety
/// `list` from [`uroce_rdmacm_rdma_get_devices`].
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_free_devices(list: *mut *mut ibv_context) {
    if !list.is_null() {
        // SAFETY: the two-element array leaked by rdma_get_devices.
        drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_context; 2]>()) });
    }
}

/// `rdma_migrate_id(id, channel)`: the id's later events, and those not retrieved yet,
/// go to `channel`; NULL makes the id synchronous (a private channel, as librdmacm).
///
/// # Safety
/// None beyond the C contract: unknown pointers are rejected.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    guard(-1, || {
        trace("rdma_migrate_id", id as usize);
        minus_one((|| {
            let old = {
                let mut r = reg();
                let (cm, _) = r.cm()?;
                let e = r.id(id)?;
                let (old_chan, old_own, token) = (e.chan, e.own_chan, e.id.token());
                let (new_chan, sync) = if channel.is_null() {
                    (r.new_channel(&cm)?, true)
                } else {
                    if !r.chans.contains_key(&(channel as usize)) {
                        return Err(FfiError::BadHandle {
                            what: "rdma_event_channel",
                        });
                    }
                    (channel, false)
                };
                if new_chan as usize == old_chan {
                    return Ok(());
                }
                // Events a synchronous wait took off the old channel for this id move too.
                let moved: Vec<Event> = match r.chans.get_mut(&old_chan) {
                    Some(c) => {
                        let (mine, rest): (VecDeque<Event>, VecDeque<Event>) =
                            c.stash.drain(..).partition(|ev| ev.id.token() == token);
                        c.stash = rest;
                        mine.into()
                    }
                    None => Vec::new(),
                };
                let nc = r
                    .chans
                    .get_mut(&(new_chan as usize))
                    .ok_or(FfiError::BadHandle {
                        what: "rdma_event_channel",
                    })?;
                nc.stash.extend(moved);
                let ch = nc.ch.clone();
                let e = r
                    .ids
                    .get_mut(&(id as usize))
                    .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
                e.id.migrate(&ch);
                e.chan = new_chan as usize;
                e.sync = sync;
                e.own_chan = sync;
                // SAFETY: live id (lock held).
                unsafe { (*e.raw.ptr()).channel = new_chan };
                // The old private channel goes unless ids of the listener's requests still
                // report to it (then it stays, unowned, until the process ends).
                if old_own && !r.ids.values().any(|e| e.chan == old_chan) {
                    r.chans.remove(&old_chan)
                } else {
                    None
                }
            };
            drop(old);
            Ok(())
        })())
    })
}

/// `rdma_notify(id, event)`: `IBV_EVENT_COMM_EST` (data arrived on the QP of an accepted
/// connection before the RTU) establishes the connection; `EISCONN` when it is
/// established, `EINVAL` for other ids and other events.
///
/// # Safety
/// None beyond the C contract.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int {
    guard(-1, || {
        trace("rdma_notify", id as usize);
        minus_one((|| {
            let (r, _) = id_ref(id)?;
            if u32::try_from(event).ok() != Some(IBV_EVENT_COMM_EST) {
                return Err(einval(
                    "rdma_notify",
                    "only IBV_EVENT_COMM_EST (no alternate paths)",
                ));
            }
            r.notify_established()
                .map_err(|e| cm_error("rdma_notify", &e))
        })())
    })
}

/// `rdma_init_qp_attr(id, qp_attr, qp_attr_mask)`: for `qp_attr->qp_state` INIT, RTR or
/// RTS, the attributes (all of `*qp_attr`) and mask that move a QP of the id's type to
/// it for the id's connection (see `CmIdRef::qp_attr`), for programs that move the QP
/// themselves (`conn_param.qp_num` without `rdma_create_qp`).
///
/// # Safety
/// `qp_attr` readable and writable; `mask` writable.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if qp_attr.is_null() || mask.is_null() {
                return Err(FfiError::Invalid("qp_attr or qp_attr_mask is NULL"));
            }
            let (r, _) = id_ref(id)?;
            let c = id_raw(id)?;
            // SAFETY: caller guarantee: readable (checked non-NULL).
            let want = unsafe { (*qp_attr).qp_state };
            let state = uroce_verbs::QpState::from_u32(want)
                .ok_or_else(|| einval("rdma_init_qp_attr", "unknown QP state"))?;
            // SAFETY: live id.
            let t = unsafe { (*c).qp_type };
            let qpt = uroce_verbs::QpType::from_u32(t)
                .ok_or_else(|| einval("rdma_init_qp_attr", "unknown QP type"))?;
            let (a, m) = r
                .qp_attr(qpt, state)
                .map_err(|e| cm_error("rdma_init_qp_attr", &e))?;
            // SAFETY: caller guarantee: writable (checked non-NULL).
            unsafe {
                qp_attr.write(crate::objects::qp_attr_to_c(&a));
                mask.write(c_int::try_from(m.bits()).unwrap_or(0));
            }
            Ok(())
        })())
    })
}

// ---------------------------------------------------------------------------------------
// Multicast (`rdma_join_multicast`, `rdma_join_multicast_ex`, `rdma_leave_multicast`).
// ---------------------------------------------------------------------------------------

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_*`.
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub join_flags: u32,
    /// The group's address.
    pub addr: *mut libc::sockaddr,
}

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
/// `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;

/// Joins `addr` for `id`; a synchronous id waits for the MULTICAST_JOIN event (kept as
/// `id->event`, as librdmacm's).
///
/// # Safety
/// `addr` is NULL or a socket address.
unsafe fn join(
    op: &'static str,
    id: *mut rdma_cm_id,
    addr: *const libc::sockaddr,
    send_only: bool,
    context: *mut c_void,
) -> Result<(), FfiError> {
    trace(op, id as usize);
    // SAFETY: caller guarantee.
    let a = unsafe { from_sockaddr(addr) }?.ok_or(FfiError::Invalid("addr is NULL"))?;
    let (r, sync) = id_ref(id)?;
    // Recorded before the join queues its event (delivered under the registry lock); a
    // second join of the group is refused below and leaves the first one's context.
    let earlier = reg().id_mut(id)?.mcast_ctx.insert(a.ip(), context as usize);
    if let Err(e) = r.join_multicast(a.ip(), send_only) {
        if let Ok(e) = reg().id_mut(id) {
            match earlier {
                Some(ctx) => e.mcast_ctx.insert(a.ip(), ctx),
                None => e.mcast_ctx.remove(&a.ip()),
            };
        }
        return Err(cm_error(op, &e));
    }
    if sync {
        let ev = sync_wait(id, EventKind::MulticastJoin)?;
        hold(id, ev)?;
    }
    Ok(())
}

/// `rdma_join_multicast(id, addr, context)`: joins the multicast group `addr` (an IPv4 or
/// IPv6 multicast address) as a full member. On RoCE the MGID is the address as a GID
/// (IPv4-mapped for IPv4), the id's QP, if it has one, is attached to it, and
/// `RDMA_CM_EVENT_MULTICAST_JOIN` reports `param.ud`: an AH attribute to the MGID, QPN
/// 0xFFFFFF and the port space's Q_Key, with `context` as `param.ud.private_data` (length
/// 0), as librdmacm reports it.
///
/// # Safety
/// `addr` is NULL or a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        minus_one(unsafe { join("rdma_join_multicast", id, addr, false, context) })
    })
}

/// `rdma_join_multicast_ex(id, mc_join_attr, context)`: as `rdma_join_multicast`, with
/// join flags (`comp_mask` must have the address and the flags, as librdmacm's):
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`, or `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER` (the QP is
/// not attached: it only sends). Other flags, `EINVAL`.
///
/// # Safety
/// `mc_join_attr` is NULL or points to a `struct rdma_cm_join_mc_attr_ex` whose `addr` is
/// NULL or a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard(-1, || {
        minus_one((|| {
            if mc_join_attr.is_null() {
                return Err(FfiError::Invalid("mc_join_attr is NULL"));
            }
            // SAFETY: caller guarantee (checked non-NULL).
            let (mask, flags, addr) = unsafe {
                (
                    (*mc_join_attr).comp_mask,
                    (*mc_join_attr).join_flags,
                    (*mc_join_attr).addr,
                )
            };
            let need = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
            if mask & need != need || mask & !need != 0 {
                return Err(FfiError::Invalid("comp_mask needs ADDRESS and JOIN_FLAGS"));
            }
            let send_only = match flags {
                RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
                RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
                _ => return Err(FfiError::Invalid("unknown join flags")),
            };
            // SAFETY: caller guarantee.
            unsafe { join("rdma_join_multicast_ex", id, addr, send_only, context) }
        })())
    })
}

/// `rdma_leave_multicast(id, addr)`: leaves a group the id joined (its QP is detached);
/// `EADDRNOTAVAIL` for a group it has not joined.
///
/// # Safety
/// `addr` is NULL or a socket address.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard(-1, || {
        trace("rdma_leave_multicast", id as usize);
        minus_one((|| {
            // SAFETY: caller guarantee.
            let a = unsafe { from_sockaddr(addr) }?.ok_or(FfiError::Invalid("addr is NULL"))?;
            let (r, _) = id_ref(id)?;
            r.leave_multicast(a.ip())
                .map_err(|e| cm_error("rdma_leave_multicast", &e))?;
            if let Ok(e) = reg().id_mut(id) {
                e.mcast_ctx.remove(&a.ip());
            }
            Ok(())
        })())
    })
}
