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
use crate::device::Registry;
use crate::entry::*;
use crate::error::FfiError;
use crate::objects::{qp_ref, zeroed, CBox};

/// How long a synchronous id waits for the event of a call.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

mod conn;
mod ep;
mod id;
mod mcast;
mod options;
mod qp;

pub use crate::abi::rdmacm::*;
pub use conn::*;
pub use ep::*;
pub use id::*;
pub use mcast::*;
pub use options::*;
pub use qp::*;

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
        // `ctx` is the live context just opened. A failure leaves `id->pd` NULL, and
        // `rdma_create_qp` then allocates one per id, as before.
        let pd = crate::pd::alloc_pd(ctx);
        self.default_pd = pd.as_ref().map_or(0, |p| *p as usize);
        crate::entry::ignore(pd);
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
