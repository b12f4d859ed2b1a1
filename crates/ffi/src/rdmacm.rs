//! The RDMA-CM API (`librdmacm`), implemented in this library so that it shares the verbs
//! objects with `libibverbs.so.1`: `id->verbs` is a context of this library, `id->qp` a QP
//! of its registry. The functions are exported as `uroce_rdmacm_<name>` in the private
//! version node `UROCE_RDMACM_PRIVATE_1` (`libibverbs.map`); uroce's `librdmacm.so.1`
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
    owned_pd: bool,
    owned_cqs: bool,
    /// `rdma_create_ep`'s QP attributes of a listening endpoint, for `rdma_get_request`.
    ep_qp_attr: Option<QpAttrs>,
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
                owned_pd: false,
                owned_cqs: false,
                ep_qp_attr: None,
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
        let (lchan, lctx, lsync, lverbs) = {
            let l = reg.ids.get(&listen)?;
            let r = l.raw.ptr();
            // SAFETY: a live id of the registry (lock held).
            unsafe { ((*r).channel, (*r).context, l.sync, (*r).verbs) }
        };
        let p = reg.add_id(new, lchan, lctx, lsync, lverbs);
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
        let e = r.events.remove(&(p as usize));
        drop(r);
        drop(e);
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
                _ => {
                    return Err(FfiError::Unsupported(
                        "port space (only RDMA_PS_TCP and RDMA_PS_UDP)",
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
        owned_pd,
        owned_cqs,
        ep_qp_attr,
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
                owned_pd,
                owned_cqs,
                ep_qp_attr,
            },
        );
        return Err(cm_error("rdma_destroy_id", &err));
    }
    // SAFETY: `raw` is the id just removed from the registry, still allocated (`craw`).
    let c = unsafe { &mut *raw };
    if owned_cqs {
        // SAFETY: CQs and channels this library created on the id's context.
        unsafe {
            crate::verbs_api::uroce_ibv_destroy_cq(c.send_cq);
            if c.recv_cq != c.send_cq {
                crate::verbs_api::uroce_ibv_destroy_cq(c.recv_cq);
            }
            crate::verbs_api::uroce_ibv_destroy_comp_channel(c.send_cq_channel);
            if c.recv_cq_channel != c.send_cq_channel {
                crate::verbs_api::uroce_ibv_destroy_comp_channel(c.recv_cq_channel);
            }
        }
    }
    if owned_pd {
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
                ack(ev)?;
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
                ack(ev)?;
            }
            Ok(())
        })())
    })
}

/// Creates the id's QP through this library's `ibv_create_qp` (CQs, channels and a PD
/// when the caller gives none) and binds it to the id.
fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), FfiError> {
    if attr.is_null() {
        return Err(FfiError::Invalid("qp_init_attr is NULL"));
    }
    let (rid, _) = id_ref(id)?;
    let (verbs, mut pd) = {
        let r = reg();
        let e = r.id(id)?;
        let c = e.raw.ptr();
        // SAFETY: live id (lock held).
        unsafe { ((*c).verbs, if pd.is_null() { (*c).pd } else { pd }) }
    };
    let mut owned_pd = false;
    if pd.is_null() {
        // SAFETY: `verbs` is this library's context.
        pd = unsafe { crate::verbs_api::uroce_ibv_alloc_pd(verbs) };
        if pd.is_null() {
            return Err(FfiError::Invalid("cannot allocate a PD for the id"));
        }
        owned_pd = true;
    }
    // SAFETY: caller guarantee: readable and writable attributes (checked non-NULL).
    let mut a = unsafe { attr.read() };
    let mut owned_cqs = false;
    let mut chans = (std::ptr::null_mut(), std::ptr::null_mut());
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        // SAFETY: the id's context; the CQ sizes are the QP's queue depths.
        unsafe {
            let rch = crate::verbs_api::uroce_ibv_create_comp_channel(verbs);
            let sch = crate::verbs_api::uroce_ibv_create_comp_channel(verbs);
            let rcq = crate::verbs_api::uroce_ibv_create_cq(
                verbs,
                c_int::try_from(a.cap.max_recv_wr.max(1)).unwrap_or(1),
                id.cast(),
                rch,
                0,
            );
            let scq = crate::verbs_api::uroce_ibv_create_cq(
                verbs,
                c_int::try_from(a.cap.max_send_wr.max(1)).unwrap_or(1),
                id.cast(),
                sch,
                0,
            );
            if rcq.is_null() || scq.is_null() {
                return Err(FfiError::Invalid("cannot create the id's CQs"));
            }
            a.recv_cq = rcq;
            a.send_cq = scq;
            chans = (sch, rch);
        }
        owned_cqs = true;
    }
    a.qp_type = {
        let r = reg();
        // SAFETY: live id (lock held).
        unsafe { (*r.id(id)?.raw.ptr()).qp_type }
    };
    // SAFETY: `a` is a valid init attr on this library's PD.
    let qp = unsafe { crate::verbs_api::uroce_ibv_create_qp(pd, &mut a) };
    if qp.is_null() {
        return Err(FfiError::Refused {
            op: "rdma_create_qp",
            errno: std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL),
            reason: "ibv_create_qp failed".into(),
        });
    }
    let (qref, _) = qp_ref(qp)?;
    if let Err(e) = rid.bind_qp(&qref) {
        // SAFETY: the QP just created.
        unsafe { crate::verbs_api::uroce_ibv_destroy_qp(qp) };
        return Err(cm_error("rdma_create_qp", &e));
    }
    // SAFETY: caller guarantee: writable.
    unsafe { attr.write(a) };
    let mut r = reg();
    let e = r
        .ids
        .get_mut(&(id as usize))
        .ok_or(FfiError::BadHandle { what: "rdma_cm_id" })?;
    e.owned_pd |= owned_pd;
    e.owned_cqs |= owned_cqs;
    let c = e.raw.ptr();
    // SAFETY: live id (lock held).
    unsafe {
        (*c).qp = qp;
        (*c).pd = pd;
        if owned_cqs {
            (*c).send_cq = a.send_cq;
            (*c).recv_cq = a.recv_cq;
            (*c).send_cq_channel = chans.0;
            (*c).recv_cq_channel = chans.1;
        }
    }
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
        let ev = sync_wait(id, EventKind::Established)?;
        ack(ev)?;
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

/// `rdma_init_qp_attr(id, qp_attr, qp_attr_mask)`: the attributes that move an
/// application's own QP (an "external" QP, connected with `conn_param.qp_num`) to
/// `qp_attr->qp_state` for this id's connection, as the kernel's CM computes them: INIT
/// (P_Key index 0, port 1, remote READ/WRITE/atomic access), RTR (the peer's GID 0 as the
/// address vector, its QPN and PSN, path MTU, responder resources, RNR timer) and RTS (the
/// send PSN that the REQ/REP carries, ACK timeout, retry counts, initiator depth); RTR and
/// RTS need the connection request (passive) or the reply (active, after
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`). `EINVAL` for another state or when neither is at hand.
///
/// # Safety
/// `qp_attr` and `qp_attr_mask` are NULL or valid for reading and writing.
#[no_mangle]
pub unsafe extern "C" fn uroce_rdmacm_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        trace("rdma_init_qp_attr", id as usize);
        minus_one((|| {
            if qp_attr.is_null() || qp_attr_mask.is_null() {
                return Err(FfiError::Invalid(
                    "rdma_init_qp_attr: qp_attr or qp_attr_mask is NULL",
                ));
            }
            let (r, _) = id_ref(id)?;
            // SAFETY: non-NULL and readable/writable (caller contract).
            let a = unsafe { &mut *qp_attr };
            let mask = match a.qp_state {
                IBV_QPS_INIT => {
                    a.pkey_index = 0;
                    a.port_num = 1;
                    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE
                        | IBV_ACCESS_REMOTE_READ
                        | IBV_ACCESS_REMOTE_WRITE
                        | IBV_ACCESS_REMOTE_ATOMIC;
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
                }
                IBV_QPS_RTR => {
                    let c = r
                        .connect_attrs()
                        .map_err(|e| cm_error("rdma_init_qp_attr", &e))?;
                    a.path_mtu = c.path_mtu.enum_value().into();
                    a.dest_qp_num = c.dest_qpn;
                    a.rq_psn = c.rq_psn.value();
                    a.max_dest_rd_atomic = c.max_dest_rd_atomic;
                    a.min_rnr_timer = c.min_rnr_timer;
                    // SAFETY: all-zero bytes are a valid ibv_ah_attr (integers).
                    a.ah_attr = unsafe { zeroed() };
                    a.ah_attr.is_global = 1;
                    a.ah_attr.port_num = 1;
                    a.ah_attr.grh.dgid = ibv_gid {
                        raw: uroce_verbs::Gid::from_ip(c.dest_ip).0,
                    };
                    a.ah_attr.grh.hop_limit = 64;
                    IBV_QP_STATE
                        | IBV_QP_AV
                        | IBV_QP_PATH_MTU
                        | IBV_QP_DEST_QPN
                        | IBV_QP_RQ_PSN
                        | IBV_QP_MAX_DEST_RD_ATOMIC
                        | IBV_QP_MIN_RNR_TIMER
                }
                IBV_QPS_RTS => {
                    let c = r
                        .connect_attrs()
                        .map_err(|e| cm_error("rdma_init_qp_attr", &e))?;
                    a.sq_psn = c.sq_psn.value();
                    a.timeout = c.timeout;
                    a.retry_cnt = c.retry_cnt;
                    a.rnr_retry = c.rnr_retry;
                    a.max_rd_atomic = c.max_rd_atomic;
                    IBV_QP_STATE
                        | IBV_QP_SQ_PSN
                        | IBV_QP_TIMEOUT
                        | IBV_QP_RETRY_CNT
                        | IBV_QP_RNR_RETRY
                        | IBV_QP_MAX_QP_RD_ATOMIC
                }
                _ => {
                    return Err(FfiError::Invalid(
                        "rdma_init_qp_attr: qp_state must be INIT, RTR or RTS",
                    ))
                }
            };
            // SAFETY: non-NULL and writable (caller contract).
            unsafe { qp_attr_mask.write(c_int::try_from(mask).unwrap_or(c_int::MAX)) };
            Ok(())
        })())
    })
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
            } else {
                let ip = ip
                    .or(hint_dst.map(|d| d.ip()))
                    .ok_or(FfiError::Invalid("no node for an active rdma_getaddrinfo"))?;
                (hint_src, Some(SocketAddr::new(ip, port)))
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
            if !pd.is_null() {
                // SAFETY: live id just made.
                unsafe { (*p).pd = pd };
            }
            if ai.ai_flags & RAI_PASSIVE != 0 {
                // SAFETY: the addrinfo's source address.
                if unsafe { uroce_rdmacm_rdma_bind_addr(p, ai.ai_src_addr) } != 0 {
                    return Err(fail(FfiError::Invalid("rdma_bind_addr failed")));
                }
                if !attr.is_null() {
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
        unsafe { uroce_rdmacm_rdma_destroy_qp(id) };
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
            // The event stays as `new->event` until the id goes (rdma-core acknowledges
            // it at destroy); acknowledged here, the id keeps its own reference.
            ack(ev)
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
