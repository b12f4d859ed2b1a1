//! The process-wide device registry behind the exported device and context functions.
//!
//! uroce shows one device, `uroce0`, bound to the address of [`NetConfig::from_env`]
//! (`UROCE_ADDR`, default 127.0.0.1) and shared with the host's other processes on that
//! address (unless `UROCE_SHARED=0`). Its [`ibv_device`] is allocated once, on the first
//! `ibv_get_device_list`, and never freed (`ibv_free_device_list` frees only the array;
//! device pointers stay valid for the life of the process, as with the real library).
//!
//! Every `ibv_open_device` returns the `context` member of a fresh heap [`verbs_context`]
//! (`sz` = 648, `abi_compat` = [`VERBS_ABI_IS_EXTENDED`], `query_port` set); all contexts of
//! the process share one [`NetDevice`] (one UDP socket and progress thread: this process's
//! member of the host-wide device), which is
//! opened with the first context and closed with the last. The registry records every live
//! context by address, so that a pointer the application hands back is only dereferenced
//! when uroce handed it out and it was not closed yet.
//!
//! Device files: each `ibv_open_device` also opens a *device file*, uroce's stand-in for
//! the kernel's uverbs file, whose `cmd_fd` is a sealed memfd naming it (see
//! [`crate::import`]). `ibv_import_device` on a descriptor of that memfd opens another
//! context of the same device file; the PDs and MRs of a device file can be imported by
//! handle through any of its contexts.
//!
//! Everything here is safe Rust except `new_context`, [`Registry::import`] and
//! [`Registry::close`], which create and free the context allocations and take over an
//! imported `cmd_fd`.

use std::collections::HashMap;
use std::ffi::c_char;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};

use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::device::{node_guid_for, LinkLayer, PortState, PORT_NUM};
use uroce_verbs::Gid;

use crate::abi::*;
use crate::error::FfiError;

/// The one device of the process.
struct Dev {
    /// The leaked `ibv_device` handed to applications (never freed).
    ptr: AtomicPtr<ibv_device>,
    /// The configuration the device list was built from; contexts open with it.
    cfg: NetConfig,
    /// Node GUID (host order).
    guid: u64,
}

/// One open context.
struct Ctx {
    /// The heap `verbs_context` (from `Box::into_raw`), freed by [`Registry::close`].
    raw: AtomicPtr<verbs_context>,
    /// The shared network device this context uses.
    net: Arc<NetDevice>,
    /// The device file the context belongs to (see [`crate::import`]): the one its
    /// `ibv_open_device` opened, or the one of the descriptor it was imported from.
    file: u64,
    /// `cmd_fd`, owned by the context (closed with it, as rdma-core closes its `cmd_fd`).
    cmd: OwnedFd,
}

/// The next device file id: process-wide, never reused (a child made by `fork` continues
/// the parent's sequence, so its files never take the ids of the parent's it inherited).
static NEXT_FILE: AtomicU64 = AtomicU64::new(1);

/// All state of the exported functions.
#[derive(Default)]
struct State {
    dev: Option<Dev>,
    /// The shared network device while any context is open.
    net: Weak<NetDevice>,
    /// The process that opened `net`: a child made by `fork` inherits the memory but not
    /// the device's threads, so it opens a device of its own.
    net_pid: u32,
    /// Live contexts by the address of their `ibv_context`.
    contexts: HashMap<usize, Ctx>,
    /// The thread that moves the network device's events to the contexts' queues (see
    /// [`crate::async_events`]), while any context is open.
    pump: Option<crate::async_events::Pump>,
}

/// The registry (a namespace for the operations on the global state).
pub struct Registry;

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::default()));

fn state() -> MutexGuard<'static, State> {
    // A panic while the lock was held (caught at the C boundary) leaves the state
    // consistent: every mutation below is a single insert/remove/assignment.
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Copies `s` into a fixed C string field, truncating so that a NUL always fits.
fn put_str(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

/// How many loopback addresses `open_net` tries when no address is configured.
pub const AUTO_ADDRS: u8 = 64;

/// Opens the network device of `cfg`. By default the device is the host's shared one
/// (`NetConfig::from_env`): every process of the user opens it on the same address
/// (`UROCE_ADDR`, else 127.0.0.1) and the kernel steers each datagram to the process
/// that owns its QP, as on a host with a RoCE NIC. With `UROCE_SHARED=0` the device
/// binds its address alone; then, when `UROCE_ADDR` is not set either, it takes
/// 127.0.0.1 if its UDP port 4791 is free, else the next 127.0.0.x whose port is free
/// (x ≤ [`AUTO_ADDRS`]).
fn open_net(cfg: NetConfig) -> Result<NetDevice, FfiError> {
    let auto = !cfg.shared && std::env::var_os(uroce_net::ADDR_ENV).is_none_or(|v| v.is_empty());
    let first = cfg.addr;
    let mut cfg = cfg;
    cfg.hw_counters = crate::sysfs::hw_counters_dir(&cfg.name);
    let mut last = None;
    for x in 1..=AUTO_ADDRS {
        match NetDevice::open(cfg.clone()) {
            Ok(n) => return Ok(n),
            Err(uroce_net::NetError::Socket(uroce_net::SocketError::Bind { addr, source }))
                if auto && source.kind() == std::io::ErrorKind::AddrInUse =>
            {
                last = Some(format!(
                    "UDP port {} is taken on 127.0.0.1 … {} (by other processes)",
                    addr.port(),
                    addr.ip()
                ));
                cfg.addr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, x + 1));
            }
            Err(uroce_net::NetError::Socket(uroce_net::SocketError::Bind { addr, source })) => {
                let why = match source.kind() {
                    std::io::ErrorKind::AddrInUse if cfg.shared => format!(
                        "UDP port {} on {} is held by a socket this process cannot share \
                         (a uroce process started with {}=0, another user's uroce process, \
                         or the kernel's RoCE); set {} to another local address",
                        addr.port(),
                        addr.ip(),
                        uroce_net::SHARED_ENV,
                        uroce_net::ADDR_ENV
                    ),
                    std::io::ErrorKind::AddrInUse => format!(
                        "UDP port {} on {} is taken by another process (another uroce \
                         device or the kernel's RoCE); set {} to a free local address",
                        addr.port(),
                        addr.ip(),
                        uroce_net::ADDR_ENV
                    ),
                    std::io::ErrorKind::AddrNotAvailable => format!(
                        "address {} is not an address of this host ({}={})",
                        addr.ip(),
                        uroce_net::ADDR_ENV,
                        first
                    ),
                    _ => format!("cannot bind UDP {addr}: {source}"),
                };
                return Err(FfiError::Open(why));
            }
            Err(e) => return Err(FfiError::Open(e.to_string())),
        }
    }
    Err(FfiError::Open(
        last.unwrap_or_else(|| "no free address".into()),
    ))
}

/// Builds the `ibv_device` for a configuration.
fn make_device(cfg: &NetConfig) -> ibv_device {
    let mut d = ibv_device {
        _ops: _ibv_device_ops {
            _dummy1: None,
            _dummy2: None,
        },
        node_type: IBV_NODE_CA,
        transport_type: IBV_TRANSPORT_IB,
        name: [0; 64],
        dev_name: [0; 64],
        dev_path: [0; 256],
        ibdev_path: [0; 256],
    };
    put_str(&mut d.name, &cfg.name);
    put_str(&mut d.dev_name, crate::sysfs::UVERBS_NAME);
    put_str(&mut d.dev_path, &crate::sysfs::dev_path());
    put_str(&mut d.ibdev_path, &crate::sysfs::ibdev_path(&cfg.name));
    d
}

/// Makes and registers a context of device file `file` on `net`, whose `cmd_fd` is `cmd`;
/// on failure `cmd` is handed back with the error.
fn new_context(
    st: &mut State,
    dev: *mut ibv_device,
    net: Arc<NetDevice>,
    file: u64,
    cmd: OwnedFd,
) -> Result<*mut ibv_context, (FfiError, OwnedFd)> {
    // SAFETY: verbs_context consists of integers, raw pointers, `Option<extern fn>`
    // (NULL is `None`) and an `ibv_context` of the same kinds plus a glibc
    // `pthread_mutex_t`, whose all-zero bytes are `PTHREAD_MUTEX_INITIALIZER`; every
    // field is therefore valid when zeroed.
    let mut vctx: Box<verbs_context> = unsafe { Box::new(std::mem::zeroed()) };
    crate::table::fill(&mut vctx);
    vctx.sz = std::mem::size_of::<verbs_context>();
    vctx.context.device = dev;
    // `cmd_fd` names the device file (see `crate::import`): a program duplicates it to
    // import the context's device (`ibv_import_device`). `async_fd` is this context's own
    // event queue (see `async_events`), set below.
    vctx.context.cmd_fd = cmd.as_raw_fd();
    vctx.context.async_fd = -1;
    vctx.context.num_comp_vectors = NUM_COMP_VECTORS;
    vctx.context.mutex = libc::PTHREAD_MUTEX_INITIALIZER;
    vctx.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    if st.pump.is_none() {
        match crate::async_events::Pump::start(Arc::downgrade(&net)) {
            Ok(p) => st.pump = Some(p),
            Err(e) => return Err((e, cmd)),
        }
    }
    let raw = Box::into_raw(vctx);
    // SAFETY: `raw` is the live allocation just made; taking a field address does not
    // read anything.
    let ctx = unsafe { &raw mut (*raw).context };
    match crate::async_events::open_context(ctx) {
        // SAFETY: `raw` is the live allocation just made, not shared yet.
        Ok(fd) => unsafe { (*raw).context.async_fd = fd },
        Err(e) => {
            // SAFETY: `raw` came from `Box::into_raw` above and was never shared.
            drop(unsafe { Box::from_raw(raw) });
            if st.contexts.is_empty() {
                if let Some(p) = st.pump.take() {
                    p.stop();
                }
            }
            return Err((e, cmd));
        }
    }
    st.contexts.insert(
        ctx as usize,
        Ctx {
            raw: AtomicPtr::new(raw),
            net,
            file,
            cmd,
        },
    );
    Ok(ctx)
}

impl Registry {
    /// The device pointer, creating the device from the environment on first use.
    ///
    /// # Errors
    /// [`FfiError::Config`] when the environment does not parse (nothing is cached then).
    pub fn device() -> Result<*mut ibv_device, FfiError> {
        let mut st = state();
        if let Some(d) = &st.dev {
            return Ok(d.ptr.load(Ordering::Acquire));
        }
        let cfg = NetConfig::from_env().map_err(|e| FfiError::Config(e.to_string()))?;
        let guid = node_guid_for(cfg.addr);
        let ptr = Box::into_raw(Box::new(make_device(&cfg)));
        st.dev = Some(Dev {
            ptr: AtomicPtr::new(ptr),
            cfg,
            guid,
        });
        Ok(ptr)
    }

    /// The node GUID of `dev` if it is the uroce device.
    pub fn guid(dev: *mut ibv_device) -> Result<u64, FfiError> {
        let st = state();
        match &st.dev {
            Some(d) if !dev.is_null() && d.ptr.load(Ordering::Acquire) == dev => Ok(d.guid),
            _ => Err(FfiError::BadHandle { what: "device" }),
        }
    }

    /// Checks that `dev` is the uroce device.
    pub fn check_device(dev: *mut ibv_device) -> Result<(), FfiError> {
        Self::guid(dev).map(|_| ())
    }

    /// Opens a context on `dev`, with a device file of its own: returns the `ibv_context`
    /// handed to the application.
    ///
    /// # Errors
    /// [`FfiError::BadHandle`] for a foreign device, [`FfiError::Open`] when the network
    /// device cannot be opened or the device file not made.
    pub fn open(dev: *mut ibv_device) -> Result<*mut ibv_context, FfiError> {
        let mut st = state();
        let cfg = match &st.dev {
            Some(d) if !dev.is_null() && d.ptr.load(Ordering::Acquire) == dev => d.cfg.clone(),
            _ => return Err(FfiError::BadHandle { what: "device" }),
        };
        let cfg_name = cfg.name.clone();
        let pid = std::process::id();
        let net = match st.net.upgrade().filter(|_| st.net_pid == pid) {
            Some(n) => n,
            None => {
                let n = Arc::new(open_net(cfg).inspect_err(|e| {
                    // Always, in one line: programs print only "Failed to open device".
                    let _ = std::io::Write::write_all(
                        &mut std::io::stderr(),
                        format!("uroce: {e}\n").as_bytes(),
                    );
                })?);
                st.net = Arc::downgrade(&n);
                st.net_pid = pid;
                crate::sysfs::publish_gid(&cfg_name, n.local_addr().ip());
                n
            }
        };
        let file = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let cmd = crate::import::device_file(file)?;
        // On failure the new memfd is closed (dropped with the error).
        new_context(&mut st, dev, net, file, cmd).map_err(|(e, _)| e)
    }

    /// `ibv_import_device(cmd_fd)`: a new context of the device file `cmd_fd` names,
    /// owning `cmd_fd` from then on (closed with the context). On failure `cmd_fd` stays
    /// the caller's. A `cmd_fd` that is the very descriptor another context owns (not a
    /// duplicate of it, as the verbs documentation asks) is duplicated first, so that
    /// each context closes a descriptor of its own.
    ///
    /// # Errors
    /// [`FfiError::Invalid`] for a descriptor that is not a uroce device file, or whose
    /// device file has no open context left in this process; [`FfiError::Unsupported`]
    /// for a device file of another process (the objects it names are in that process).
    pub fn import(cmd_fd: std::os::fd::RawFd) -> Result<*mut ibv_context, FfiError> {
        let file = crate::import::read_device_file(cmd_fd)?;
        let mut st = state();
        let Some((dev, net)) = st.contexts.values().find(|c| c.file == file).map(|c| {
            // SAFETY: a registered context's allocation is live while the registry lock
            // is held; reading one field.
            let dev = unsafe { (*c.raw.load(Ordering::Acquire)).context.device };
            (dev, c.net.clone())
        }) else {
            return Err(FfiError::Invalid(
                "ibv_import_device: no context of that device file is open any more",
            ));
        };
        let shared = st.contexts.values().any(|c| c.cmd.as_raw_fd() == cmd_fd);
        let cmd = if shared {
            crate::import::dup_fd(cmd_fd)?
        } else {
            // SAFETY: the caller hands `cmd_fd` over (the contract of ibv_import_device:
            // the new context owns it); it is an open descriptor (read above) that no
            // other context owns (checked just now).
            unsafe { std::os::fd::FromRawFd::from_raw_fd(cmd_fd) }
        };
        new_context(&mut st, dev, net, file, cmd).map_err(|(e, cmd)| {
            if !shared {
                // The caller's descriptor goes back to the caller, open.
                let _ = std::os::fd::IntoRawFd::into_raw_fd(cmd);
            }
            e
        })
    }

    /// Closes a context from [`Registry::open`] or [`Registry::import`] and its `cmd_fd`;
    /// the last one closes the network device. The objects of its device file stay (other
    /// contexts of the file may import and use them; see [`crate::import`]).
    ///
    /// # Errors
    /// [`FfiError::BadHandle`] when `ctx` is not a live uroce context.
    pub fn close(ctx: *mut ibv_context) -> Result<(), FfiError> {
        let mut st = state();
        let entry = st
            .contexts
            .remove(&(ctx as usize))
            .ok_or(FfiError::BadHandle { what: "context" })?;
        crate::async_events::close_context(ctx);
        if st.contexts.is_empty() {
            // The pump holds the network device while it waits: stopped before the device
            // is dropped below.
            if let Some(p) = st.pump.take() {
                p.stop();
            }
        }
        let raw = entry.raw.load(Ordering::Acquire);
        // SAFETY: `raw` came from `Box::into_raw` in `new_context` and was registered exactly once;
        // it has just been removed from the registry, so no other call can reach it and it
        // is freed exactly once.
        drop(unsafe { Box::from_raw(raw) });
        // Dropping the last Arc (here, under the lock) closes the socket and joins the
        // progress thread before another open could bind the same address.
        drop(entry.net);
        Ok(())
    }

    /// The device file of a live context (see [`crate::import`]).
    ///
    /// # Errors
    /// [`FfiError::BadHandle`] when `ctx` is not a live uroce context.
    pub fn file(ctx: *const ibv_context) -> Result<u64, FfiError> {
        state()
            .contexts
            .get(&(ctx as usize))
            .map(|c| c.file)
            .ok_or(FfiError::BadHandle { what: "context" })
    }

    /// The network device behind a live context.
    ///
    /// # Errors
    /// [`FfiError::BadHandle`] when `ctx` is not a live uroce context.
    pub fn net(ctx: *const ibv_context) -> Result<Arc<NetDevice>, FfiError> {
        state()
            .contexts
            .get(&(ctx as usize))
            .map(|c| c.net.clone())
            .ok_or(FfiError::BadHandle { what: "context" })
    }
}

/// `ibv_context.num_comp_vectors`: one completion vector (the device's progress thread);
/// `ibv_create_cq` refuses a `comp_vector` at or above it with `EINVAL`, as the kernel's
/// uverbs does.
pub const NUM_COMP_VECTORS: i32 = 1;

/// Firmware version string reported by `ibv_query_device`.
pub const FW_VER: &str = concat!("uroce ", env!("CARGO_PKG_VERSION"));

/// `ibv_query_device` for the device behind `net`.
pub fn device_attr(net: &NetDevice) -> ibv_device_attr {
    let a = net.device().attr();
    let sat = |v: u32| c_int_from(v);
    let mut out = ibv_device_attr {
        fw_ver: [0; 64],
        node_guid: a.node_guid.to_be(),
        sys_image_guid: a.sys_image_guid.to_be(),
        max_mr_size: u64::MAX,
        page_size_cap: 0xffff_f000,
        vendor_id: 0xff_ffff,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: sat(a.max_qp),
        max_qp_wr: sat(a.max_qp_wr),
        device_cap_flags: crate::device_ex::DEVICE_CAP_FLAGS,
        max_sge: sat(a.max_sge),
        max_sge_rd: sat(a.max_sge_rd),
        max_cq: sat(a.max_cq),
        max_cqe: sat(a.max_cqe),
        max_mr: sat(a.max_mr),
        max_pd: sat(a.max_pd),
        max_qp_rd_atom: sat(a.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: sat(a.max_qp_rd_atom.saturating_mul(a.max_qp)),
        max_qp_init_rd_atom: sat(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: a.atomic_cap as ibv_atomic_cap,
        max_ee: 0,
        max_rdd: 0,
        max_mw: sat(uroce_verbs::mw::MAX_MW),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: sat(uroce_verbs::mcast::MAX_MCAST_GRP),
        max_mcast_qp_attach: sat(uroce_verbs::mcast::MAX_MCAST_QP_ATTACH),
        max_total_mcast_qp_attach: sat(uroce_verbs::mcast::MAX_TOTAL_MCAST_QP_ATTACH),
        max_ah: sat(a.max_ah),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: sat(a.max_srq),
        max_srq_wr: sat(a.max_srq_wr),
        max_srq_sge: sat(a.max_srq_sge),
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: a.local_ca_ack_delay,
        phys_port_cnt: a.phys_port_cnt,
    };
    put_str(&mut out.fw_ver, FW_VER);
    out
}

/// `u32` → `c_int`, saturating.
fn c_int_from(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// `ibv_query_port` for the device behind `net` (the full 52-byte structure).
///
/// # Errors
/// [`FfiError::BadPort`] for a port other than 1.
pub fn port_attr(net: &NetDevice, port: u8) -> Result<ibv_port_attr, FfiError> {
    let p = net
        .device()
        .port_attr(port)
        .map_err(|_| FfiError::BadPort { port: port.into() })?;
    let active = p.state == PortState::Active;
    Ok(ibv_port_attr {
        state: p.state as ibv_port_state,
        max_mtu: p.max_mtu as ibv_mtu,
        active_mtu: p.active_mtu as ibv_mtu,
        gid_tbl_len: c_int_from(p.gid_tbl_len),
        port_cap_flags: 0,
        max_msg_sz: u32::try_from(p.max_msg_sz).unwrap_or(u32::MAX),
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: p.pkey_tbl_len,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: p.active_width,
        active_speed: p.active_speed,
        // IB PortPhysicalState: 5 = LinkUp, 3 = Disabled.
        phys_state: if active { 5 } else { 3 },
        link_layer: match p.link_layer {
            LinkLayer::Ethernet => IBV_LINK_LAYER_ETHERNET,
            LinkLayer::InfiniBand => IBV_LINK_LAYER_INFINIBAND,
        },
        flags: 0,
        port_cap_flags2: 0,
    })
}

/// One GID table entry: `Ok(None)` for an empty (all-zero) in-range entry.
///
/// # Errors
/// [`FfiError::BadPort`] / [`FfiError::BadGidIndex`].
pub fn gid(net: &NetDevice, port: u32, index: u64) -> Result<Option<Gid>, FfiError> {
    let port8 = u8::try_from(port)
        .ok()
        .filter(|p| *p == PORT_NUM)
        .ok_or(FfiError::BadPort { port })?;
    let len = net
        .device()
        .port_attr(port8)
        .map_err(|_| FfiError::BadPort { port })?
        .gid_tbl_len;
    let idx = u32::try_from(index)
        .ok()
        .filter(|i| *i < len)
        .ok_or(FfiError::BadGidIndex { index, len })?;
    let g = net
        .device()
        .gid(port8, idx)
        .map_err(|_| FfiError::BadGidIndex { index, len })?;
    Ok((!g.is_zero()).then_some(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_str_truncates_and_terminates() {
        let mut buf = [1 as c_char; 4];
        put_str(&mut buf, "abcdef");
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        let mut buf = [1 as c_char; 8];
        put_str(&mut buf, "ab");
        assert_eq!(&buf[..3], &[b'a' as c_char, b'b' as c_char, 0]);
    }

    #[test]
    fn errors_map_to_errno() {
        assert_eq!(FfiError::BadPort { port: 2 }.errno(), libc::EINVAL);
        assert_eq!(FfiError::Open("x".into()).errno(), libc::ENODEV);
    }
}
