//! A network device: a verbs device and context bound to one [`RoceSocket`], with the
//! progress engine that moves packets between the socket and the QPs' transport engines.
//!
//! # Progress
//!
//! All network work happens in one *progress step* ([`NetDevice::progress`]), run under the
//! device's progress lock by whichever thread gets it:
//!
//! 1. receive: up to a few `recvmmsg` batches; every accepted packet (parsed once, by the
//!    socket's check) goes to the QP its BTH names (a counted reference from the context's
//!    QP table; unknown QPNs and QPs without an engine are dropped and counted) through
//!    [`QpRef::engine_handle_packet`], with an [`Arrival`] holding the sender's address
//!    (from the socket) and the device's own;
//! 2. timers: QPs whose retransmit or RNR deadline has passed get
//!    [`QpRef::engine_handle_timeout`];
//! 3. transmit: every QP touched above or rung by `post_send` emits its packets into the
//!    device's transmit buffer ([`QpRef::engine_transmit`]), each with its own destination
//!    address (a connected QP's peer, or a datagram QP's address handle); they are sealed
//!    (ICRC for the IP header the kernel emits for that destination) and leave in
//!    `sendmmsg` batches, consecutive equal-length packets to one destination as GSO
//!    trains; each QP's next deadline is recorded.
//!
//! Three kinds of threads run the step:
//! * the **progress thread** (one per device, unless disabled) blocks in `poll(2)` on the
//!   socket, a doorbell eventfd and the earliest timer, so programs that only wait on
//!   completion channels, or do not call into the library at all, still make progress;
//! * **application threads polling a CQ**: an empty poll runs one step if the lock is free
//!   (busy polling, the low-latency path). While an application busy polls (two polls less than
//!   50 µs apart), the progress thread stops watching the socket (it would only compete
//!   for the lock and the CPU) and keeps watching the doorbell and the timers; it watches
//!   the socket again once the application has not busy polled for [`BUSY_POLL_GRACE`]
//!   (when nothing is in flight it wakes at that moment: the application may have stopped
//!   polling to wait on memory).
//!   Output that a polling thread's step caused and that the engine marked as able to
//!   wait (the ACK of a SEND or WRITE: [`uroce_verbs::Reply::Deferrable`]; the device
//!   inspects no opcode) is deferred to the ready list and sent by the next step or with
//!   the application's next post;
//! * **posting threads**: `post_send` rings the device; if the lock is free, the poster
//!   transmits that QP's packets itself, otherwise the QP is put on the ready list and the
//!   progress thread woken through the doorbell (only when it sleeps).
//!
//! Lock order: progress lock → QP lock → CQ / SRQ / event-queue locks. Application calls
//! never hold a verbs lock while they ring or poll the device.
//!
//! # Shared devices
//!
//! With [`NetConfig::shared`] the device is one member of the host-wide device on its
//! address (`member.rs`): its socket is one `SO_REUSEPORT` member of the group of
//! `address:port`, its QPNs are those of the slot the per-host registry gave it, the
//! kernel steers each datagram to the member of its destination QP's slot, and the last
//! phase of a step keeps the group's steering program current. A datagram for another
//! member's slot (a stale program), or a CM MAD of another member's communication ID, is
//! dropped and counted (`dropped_foreign_slot`). Its CM ([`NetDevice::cm`]) allots
//! communication IDs from the slot and records its listeners in the registry, so the
//! kernel steers the CM's MADs to it too (see [`crate::cm`]).
//!
//! Files: this one holds the device (open, close, counters, its shared core); `progress`
//! the step and the progress thread's loop; `send` how a transmit buffer leaves (trains,
//! batches); `transport` the hook the verbs context calls (ring, poll, flush, groups);
//! `member` a shared device's membership of the host-wide device.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{eventfd, EventfdFlags, PollFd, PollFlags, Timespec};
use uroce_proto::time::Instant;
use uroce_verbs::device::ROCE_HEADER_RESERVE;
use uroce_verbs::mcast::MULTICAST_QPN;
use uroce_verbs::{
    Arrival, Context, Device, DeviceConfig, EngineCounters, Gid, QpRef, Reply, Transport, TxPacket,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::ROCEV2_UDP_PORT;

use crate::capture::Capture;
use crate::cm::CmService;
use crate::error::NetError;
use crate::faults::FaultConfig;
use crate::gsi::Gsi;
use crate::socket::{IcrcPolicy, OutPacket, RecvBatch, RoceSocket, SocketConfig};
use crate::stats::{DeviceStat, Publisher, QpStat};
use crate::CounterSnapshot;
use uroce_socket::fork::DupFd;
use uroce_socket::SocketError;

mod member;
mod progress;
mod send;
mod transport;

use member::HostMember;
pub use member::{HOST_CHECK_EVERY, HOST_REAP_EVERY, HOST_RECHECK_MIN};

use progress::progress_thread;
use transport::DeviceTransport;

/// The environment variable that chooses a device's address for programs that cannot be
/// changed ([`NetConfig::from_env`]).
pub const ADDR_ENV: &str = "UROCE_ADDR";
/// The environment variable that turns the shared device of [`NetConfig::from_env`] off
/// (`0`, `no`, `false` or `off`: a device of this process alone, which binds
/// `address:4791` exclusively); unset or any other value, the device is shared
/// ([`NetConfig::shared`]).
pub const SHARED_ENV: &str = "UROCE_SHARED";

/// The environment variable that gives a shared device SRQ numbers of its slot
/// ([`NetConfig::xrc_srq_slots`]) when `1`, `yes`, `true` or `on`.
pub const XRC_SRQ_SLOTS_ENV: &str = "UROCE_XRC_SRQ_SLOTS";
/// The address used when neither the API nor [`ADDR_ENV`] names one.
pub const DEFAULT_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// After an application's last CQ poll, the progress thread leaves the socket to the
/// application for this long.
pub const BUSY_POLL_GRACE: Duration = Duration::from_micros(500);
/// How long a polling application's steps leave output deferred by an earlier step
/// before sending it themselves (it usually leaves with the application's next post).
const ACK_DEFER_NANOS: u64 = 20_000;
/// A post less than this after the previous one is part of a burst (see `DeviceTransport::ring`).
const BURST_GAP_NANOS: u64 = 5_000;
/// How long after an application's busy polling expires the progress thread looks again
/// (a margin against waking a little too early and sleeping another round).
const BUSY_EXPIRY_SLACK: Duration = Duration::from_micros(20);
/// How long the progress thread sleeps at most while an application busy polls.
pub const BUSY_SLEEP: Duration = Duration::from_millis(5);
/// Two CQ polls this close together mark the application as busy polling.
const REPOLL_WINDOW_NANOS: u64 = 50_000;
/// The progress thread keeps stepping without sleeping for this long after its last
/// useful step (unless an application thread is busy polling).
pub const SPIN_AFTER_WORK: Duration = Duration::from_micros(50);
/// The longest the progress thread sleeps without looking at its stop flag.
const MAX_SLEEP: Duration = Duration::from_millis(100);
/// Largest packet an engine emits: BTH + RETH/AtomicETH + ImmDt + 4096 payload + ICRC,
/// rounded up.
const MAX_PACKET: usize = 4096 + 128;
/// Packets per transmit batch (one or a few `sendmmsg` calls).
const TX_BATCH: usize = 128;
/// Receive batches per progress step at most (fairness towards transmit and timers).
const RX_ROUNDS: usize = 4;
/// Receive batches a step takes at most when a timer is due (the socket drained first).
const RX_ROUNDS_BEFORE_TIMERS: usize = 64;
/// Transmit batches per QP per progress step at most.
const TX_ROUNDS: usize = 16;

/// How a [`NetDevice`] is opened.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// The local address; GID 0 is this address as a RoCEv2 GID.
    pub addr: IpAddr,
    /// UDP port (RoCEv2: 4791).
    pub port: u16,
    /// Device name.
    pub name: String,
    /// Faults injected into outgoing packets.
    pub faults: Option<FaultConfig>,
    /// Write every packet sent and received to this pcap file.
    pub capture: Option<PathBuf>,
    /// Run a background progress thread (default). Without it, progress happens only
    /// when the application polls CQs or calls [`NetDevice::progress`].
    pub progress_thread: bool,
    /// Which received packets to accept by their ICRC (default
    /// [`IcrcPolicy::AnyIdentification`], or `UROCE_ICRC`).
    pub icrc: IcrcPolicy,
    /// Send trains of equal-size packets with UDP GSO when the kernel supports it (and
    /// neither faults nor a capture need individual packets); default true.
    pub gso: bool,
    /// Publish the device's counters for `uroce stat` (see [`crate::stats`]); default
    /// true.
    pub publish_stats: bool,
    /// A presented sysfs `hw_counters` directory to keep current (`uroce run` sets it
    /// through the C library); default none.
    pub hw_counters: Option<PathBuf>,
    /// Open a *shared* device: one member of the host-wide device on `addr:port`, next
    /// to the other processes' (and this process's other shared devices) on the same
    /// address (see the module docs). False in [`NetConfig::new`] (a program that builds
    /// its configuration says what it wants); true in [`NetConfig::from_env`] unless
    /// `UROCE_SHARED=0`.
    pub shared: bool,
    /// The directory of the host registry of a shared device; default (`None`):
    /// `uroce_socket::host::host_dir` (`UROCE_HOST_DIR`, …).
    pub host_dir: Option<PathBuf>,
    /// The link MTU the port's active MTU derives from (the largest IB MTU 80 header
    /// bytes below it); default (`None`): the MTU of the interface that owns `addr`
    /// (`ifaddr::link_mtu`; 65536 on loopback, so a 4096-byte port MTU), or 1500 when
    /// none is found or it is too small for any IB MTU.
    pub link_mtu: Option<u32>,
    /// A shared device: allot SRQ numbers from the member's slot, so that the kernel
    /// steers XRC requests to the process of the XRC SRQ they name
    /// (`uroce_socket::steer`, *XRC requests*). Off by default (also in
    /// [`NetConfig::from_env`] unless `UROCE_XRC_SRQ_SLOTS=1`): SRQ numbers then start at
    /// 1 in slot 0, as a lone process's, and XRC requests go by their target QP, which
    /// keeps programs whose processes of one domain expect each other's SRQs behind their
    /// own target QPs (`ibv_xsrq_pingpong` with two clients) working as before, until
    /// target QPs are shared between processes (docs/ARCHITECTURE.md, "XRC domains").
    pub xrc_srq_slots: bool,
}

impl NetConfig {
    /// A device on `addr`, port 4791, named `uroce0`, with faults from `UROCE_FAULTS` and
    /// the ICRC policy from `UROCE_ICRC` (each if it is set and parses; see
    /// [`NetConfig::from_env`] for the checked form).
    pub fn new(addr: IpAddr) -> NetConfig {
        NetConfig {
            addr,
            port: ROCEV2_UDP_PORT,
            name: "uroce0".to_owned(),
            faults: FaultConfig::from_env().ok().flatten(),
            capture: None,
            progress_thread: true,
            icrc: IcrcPolicy::from_env().ok().flatten().unwrap_or_default(),
            gso: true,
            publish_stats: true,
            hw_counters: None,
            shared: false,
            host_dir: None,
            link_mtu: None,
            xrc_srq_slots: false,
        }
    }

    /// A device on the address in `UROCE_ADDR` (default 127.0.0.1), with faults from
    /// `UROCE_FAULTS`, the ICRC policy from `UROCE_ICRC`, and shared with the host's other
    /// processes unless `UROCE_SHARED` is `0`, `no`, `false` or `off`: what unmodified
    /// programs get, through the C libraries and `uroce run`.
    ///
    /// # Errors
    /// [`NetError::BadAddr`] if `UROCE_ADDR` is not an IP address, [`SocketError::Faults`] if
    /// `UROCE_FAULTS` does not parse, [`SocketError::BadIcrcPolicy`] if `UROCE_ICRC` does
    /// not.
    pub fn from_env() -> Result<NetConfig, NetError> {
        let addr = match std::env::var(ADDR_ENV) {
            Ok(v) if !v.trim().is_empty() => {
                v.trim().parse::<IpAddr>().map_err(|_| NetError::BadAddr {
                    var: ADDR_ENV,
                    value: v.clone(),
                })?
            }
            _ => DEFAULT_ADDR,
        };
        let mut cfg = NetConfig::new(addr);
        cfg.faults = FaultConfig::from_env()?;
        cfg.icrc = IcrcPolicy::from_env()?.unwrap_or_default();
        cfg.shared = !std::env::var(SHARED_ENV).is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "0" | "no" | "false" | "off"
            )
        });
        cfg.xrc_srq_slots = std::env::var(XRC_SRQ_SLOTS_ENV).is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "yes" | "true" | "on"
            )
        });
        Ok(cfg)
    }
}

/// Per-device counters: the socket's, the context's lookups, and the sum of the transport
/// counters of the QPs alive now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Socket-level counters (packets, bytes, bad ICRC, parse errors, injected faults …).
    pub socket: CounterSnapshot,
    /// Packets for a QPN with no QP.
    pub unknown_qpn: u64,
    /// Packets for a QP that has no transport engine (not RC, or not yet in RTR).
    pub no_engine: u64,
    /// Datagrams received on a multicast group's socket that no QP took (not for DestQP
    /// 0xFFFFFF, or no QP attached any more).
    pub mcast_dropped: u64,
    /// A shared device: datagrams for a QPN of a member slot not its own (another
    /// member's, delivered here by a stale steering program, or a slot nobody holds, which
    /// the program sends to the designated member: a QP of a member that is gone), and,
    /// on a member not designated, CM MADs to QP1 of a connection whose communication ID
    /// is not of its slot (a stale program), dropped (each makes the device reap and steer
    /// again).
    pub dropped_foreign_slot: u64,
    /// A shared device: times the host's registry refused a service ID its CM listens on
    /// (another member of the host listens on it, or the host has as many listeners as a
    /// steering program holds); REQs for it are not steered here.
    pub listen_refused: u64,
    /// A shared device: steering probes it sent to find its index in its group after
    /// several members died at once (see `member.rs`).
    pub probes_sent: u64,
    /// Transport counters summed over the live QPs.
    pub transport: EngineCounters,
}

impl DeviceCounters {
    /// Every counter as `(name, value)`, for printing.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = self.socket.fields().collect();
        v.push(("unknown_qpn", self.unknown_qpn));
        v.push(("no_engine", self.no_engine));
        v.push(("mcast_dropped", self.mcast_dropped));
        v.push(("dropped_foreign_slot", self.dropped_foreign_slot));
        v.push(("listen_refused", self.listen_refused));
        v.push(("probes_sent", self.probes_sent));
        v.extend(self.transport.fields());
        v
    }
}

/// One QP's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// The QP number.
    pub qpn: u32,
    /// Its transport engine's counters.
    pub transport: EngineCounters,
}

impl QpCounters {
    /// Every counter as `(name, value)`, for printing.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        self.transport.fields()
    }
}

/// What the progress lock protects.
struct ProgressState {
    /// The device's socket; `None` once a shared device left the host-wide device (it
    /// closes).
    sock: Option<RoceSocket>,
    rx: RecvBatch,
    tx: Vec<u8>,
    /// Length and destination of each packet in `tx`.
    lens: Vec<TxPacket>,
    /// QPs with a pending deadline.
    timers: HashMap<u32, Instant>,
    /// QPs to visit for transmit in this step.
    touched: Vec<u32>,
    /// QPs whose engine said, for a packet received in this step, that its answer may
    /// wait ([`Reply::Deferrable`]: the ACK of a SEND or WRITE).
    completed: Vec<u32>,
    /// Scratch for the QPs a post takes off the ready list (kept for its capacity).
    parked: Vec<u32>,
    /// Scratch for the QPs whose timer is due in a step (kept for its capacity).
    due: Vec<u32>,
    /// The IP multicast groups joined, each with its receiving socket (see
    /// [`crate::mcast`]).
    groups: Vec<GroupSock>,
}

/// A joined IP multicast group and the socket that receives it.
struct GroupSock {
    group: IpAddr,
    sock: RoceSocket,
}

struct DeviceCore {
    ctx: Context,
    port: u16,
    epoch: std::time::Instant,
    io: Mutex<ProgressState>,
    ready: Mutex<Vec<u32>>,
    has_ready: AtomicBool,
    doorbell: OwnedFd,
    /// A duplicate of the socket's descriptor, for the progress thread's `poll` (`None`
    /// once a shared device left: its socket must close).
    sock_fd: Mutex<Option<Arc<DupFd>>>,
    /// A shared device's membership of the host-wide device.
    host: Option<HostMember>,
    /// SRQ numbers from the member's slot ([`NetConfig::xrc_srq_slots`]).
    xrc_srq_slots: bool,
    sleeping: AtomicBool,
    stop: AtomicBool,
    /// Nanoseconds since `epoch` of the last application CQ poll (0: never).
    last_app_poll: AtomicU64,
    /// Nanoseconds since `epoch` of the last CQ poll that followed another one closely
    /// (busy polling); 0: never.
    busy_since: AtomicU64,
    /// Nanoseconds since `epoch` when a polling step first deferred output that is still
    /// waiting (0: none).
    deferred_since: AtomicU64,
    /// Nanoseconds since `epoch` until which the progress thread sleeps (when it does).
    sleep_until: AtomicU64,
    /// A busy-polling application posted since its last step.
    rung: AtomicBool,
    /// Nanoseconds since `epoch` of the last post.
    last_post: AtomicU64,
    no_engine: AtomicU64,
    /// Duplicates of the group sockets' descriptors, for the progress thread's `poll`.
    group_fds: Mutex<Vec<(IpAddr, Arc<OwnedFd>)>>,
    /// The ICRC policy group sockets are opened with (the device socket's).
    icrc: IcrcPolicy,
    /// Multicast datagrams dropped: not for DestQP 0xFFFFFF, or no QP attached.
    mcast_dropped: AtomicU64,
    /// The socket's counters (read without the progress lock).
    sock_counters: Arc<crate::Counters>,
    /// The device's CM, once started (its counters are published with the device's).
    cm: Mutex<Weak<CmService>>,
    /// Publishes the counters (see [`crate::stats`]); `None`: not published.
    publisher: Mutex<Option<Publisher>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DeviceCore {
    fn counters(&self) -> DeviceCounters {
        let mut transport = self.ctx.retired_engine_counters();
        for qpn in self.ctx.qp_numbers() {
            if let Some(c) = self.ctx.lookup_qp(qpn).and_then(|q| q.engine_counters()) {
                transport.add(&c);
            }
        }
        DeviceCounters {
            socket: self.sock_counters.snapshot(),
            unknown_qpn: self.ctx.counters().unknown_qpn_drops,
            no_engine: self.no_engine.load(Ordering::Relaxed),
            mcast_dropped: self.mcast_dropped.load(Ordering::Relaxed),
            dropped_foreign_slot: self
                .host
                .as_ref()
                .map_or(0, |h| h.dropped_foreign.load(Ordering::Relaxed)),
            listen_refused: self
                .host
                .as_ref()
                .map_or(0, |h| h.listen_refused.load(Ordering::Relaxed)),
            probes_sent: self
                .host
                .as_ref()
                .map_or(0, |h| h.probes_sent.load(Ordering::Relaxed)),
            transport,
        }
    }

    /// What the device publishes (see [`crate::stats`]).
    fn stat(&self) -> DeviceStat {
        let own = |v: Vec<(&'static str, u64)>| -> Vec<(String, u64)> {
            v.into_iter().map(|(n, v)| (n.to_owned(), v)).collect()
        };
        let mut counters = own(self.counters().fields());
        if let Some(cm) = lock(&self.cm).upgrade() {
            counters.extend(own(cm.counters().fields()));
        }
        let mut qps = Vec::new();
        for qpn in self.ctx.qp_numbers() {
            let Some(q) = self.ctx.lookup_qp(qpn) else {
                continue;
            };
            let Some(c) = q.engine_counters() else {
                continue;
            };
            qps.push(QpStat {
                qpn,
                qp_type: q.qp_type().name().to_owned(),
                state: q.state().name().to_owned(),
                counters: own(c.fields()),
            });
        }
        DeviceStat {
            pid: std::process::id(),
            name: self.ctx.device().name().to_owned(),
            addr: self.ctx.device().addr(),
            counters,
            qps,
        }
    }

    /// Publishes the counters when due (or `now`, with `force`).
    fn publish(&self, now: Instant, force: bool) {
        let mut p = lock(&self.publisher);
        if let Some(p) = p.as_mut().filter(|p| force || p.due(now)) {
            let stat = self.stat();
            p.publish(&stat, now);
        }
    }

    /// The last publication (the `hw_counters` keep it), and the published file removed:
    /// the device closes. Only the first call does anything.
    fn unpublish(&self) {
        let taken = lock(&self.publisher).take();
        if let Some(mut p) = taken {
            p.publish(&self.stat(), self.now());
            p.remove();
        }
    }

    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Whether an application thread busy polls (two polls less than 50 µs apart, the
    /// last within [`BUSY_POLL_GRACE`]).
    fn app_busy(&self, now: Instant) -> bool {
        let last = self.busy_since.load(Ordering::Relaxed);
        last != 0 && Duration::from_nanos(now.as_nanos().saturating_sub(last)) < BUSY_POLL_GRACE
    }

    fn wake(&self) {
        // A full counter (EAGAIN) already means "wake up"; nothing else can fail here.
        let _ = rustix::io::write(&self.doorbell, &1u64.to_ne_bytes());
    }

    /// Puts QPs on the ready list (their output leaves with a later step or post); the
    /// one place the list grows.
    fn park(&self, qpns: &[u32]) {
        {
            let mut r = lock(&self.ready);
            for &qpn in qpns {
                if !r.contains(&qpn) {
                    r.push(qpn);
                }
            }
        }
        self.has_ready.store(true, Ordering::SeqCst);
    }

    /// [`DeviceCore::park`], and the progress thread woken if it sleeps.
    fn mark_ready(&self, qpn: u32) {
        self.park(&[qpn]);
        if self.sleeping.load(Ordering::SeqCst) {
            self.wake();
        }
    }

    /// A shared device leaves the host-wide device: its socket closes (see
    /// `member.rs`), and the registry notes where its QPNs and communication IDs
    /// (`next_comm_id`: its CM's, if it ran one) got to, so the slot's next member carries
    /// on from there. The caller holds the progress lock (`io`); the progress thread has
    /// stopped.
    fn leave_host(&self, io: &mut ProgressState, next_comm_id: Option<u32>) {
        if let Some(h) = &self.host {
            let resume = h.resume(self.ctx.next_qpn(), next_comm_id);
            h.leave(&mut io.sock, &self.sock_fd, Some(resume));
        }
    }

    fn next_deadline(&self, io: &ProgressState) -> Option<Instant> {
        io.timers.values().min().copied()
    }
}

/// A verbs device bound to a UDP socket, with its opened context and progress engine
/// (see the module docs).
pub struct NetDevice {
    /// QP1 and its resources; `None` only while the device closes. Shared with the CM
    /// thread, which the device stops before it closes QP1.
    gsi: Option<Arc<Gsi>>,
    /// The connection manager, started by the first [`NetDevice::cm`] call.
    cm: std::sync::OnceLock<Arc<CmService>>,
    cm_thread: Mutex<Option<JoinHandle<()>>>,
    progress_thread: bool,
    shared: Arc<DeviceCore>,
    thread: Option<JoinHandle<()>>,
    local: SocketAddr,
}

impl std::fmt::Debug for NetDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetDevice")
            .field("name", &self.shared.ctx.device().name())
            .field("local", &self.local)
            .finish()
    }
}

impl NetDevice {
    /// The fallible steps of [`NetDevice::open`] between binding the socket and building
    /// the device: the capture file, the verbs device (a shared device's QPNs in its
    /// slot) and context, the doorbell, the duplicate of the socket's descriptor.
    fn prepare(
        cfg: &NetConfig,
        host: Option<&HostMember>,
        sock: &mut RoceSocket,
    ) -> Result<(Context, OwnedFd, DupFd), NetError> {
        if let Some(path) = &cfg.capture {
            sock.set_capture(Some(Capture::create(path)?));
        }
        // Sending to a multicast group leaves by the device's own interface (best effort:
        // without it, multicast sends follow the routing table).
        let _ = crate::mcast::set_sending_interface(sock.as_fd(), sock.local_addr().ip());
        let sock_fd = sock.duplicate_fd().map_err(NetError::Io)?;
        let mut dev_cfg = DeviceConfig::new(cfg.name.clone(), cfg.addr);
        // The port MTU derives from the MTU of the interface that owns the address, as
        // rxe's from its netdev's (INTEROP-NOTES §4): 4096 on loopback, 1024 on a
        // 1500-byte Ethernet link. An interface too small for any IB MTU, or none found,
        // leaves the Ethernet default; a configured link MTU is taken as it is.
        if let Some(mtu) = cfg.link_mtu.or_else(|| {
            crate::ifaddr::link_mtu(cfg.addr)
                .filter(|&m| Pmtu::largest_fitting(m, ROCE_HEADER_RESERVE).is_some())
        }) {
            dev_cfg.link_mtu = mtu;
        }
        if let Some(h) = host {
            dev_cfg.qpn_range = h.qpn_range();
            dev_cfg.qpn_start = h.qpn_start();
            // XRC requests are steered by the slot of their XRC SRQ number, or by their
            // target QP when it is slot 0 (see `NetConfig::xrc_srq_slots`).
            dev_cfg.srqn_range = if cfg.xrc_srq_slots {
                h.qpn_range()
            } else {
                h.slot0_srqn_range()
            };
        }
        let device = Device::new(dev_cfg).map_err(|e| NetError::Device(e.to_string()))?;
        let ctx = Context::open(&device).map_err(|e| NetError::Device(e.to_string()))?;
        let doorbell = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| NetError::Io(std::io::Error::from(e)))?;
        Ok((ctx, doorbell, sock_fd))
    }

    /// Binds the socket, creates the device and its context, installs the transport and
    /// starts the progress thread.
    ///
    /// # Errors
    /// Socket errors (e.g. the address is not local or the port is taken), capture file
    /// errors, device creation errors.
    pub fn open(cfg: NetConfig) -> Result<NetDevice, NetError> {
        let sock_cfg = SocketConfig {
            icrc_policy: cfg.icrc,
            faults: cfg.faults,
            gso: cfg.gso,
            ..SocketConfig::default()
        };
        let bind_at = SocketAddr::new(cfg.addr, cfg.port);
        let (host, mut sock) = if cfg.shared {
            let (h, s) = HostMember::join(cfg.host_dir.clone(), bind_at, sock_cfg)?;
            (Some(h), s)
        } else {
            (None, RoceSocket::bind_with(bind_at, sock_cfg)?)
        };
        let (ctx, doorbell, sock_fd) = match Self::prepare(&cfg, host.as_ref(), &mut sock) {
            Ok(p) => p,
            Err(e) => {
                // A member leaves the host-wide device again (its socket closes under
                // the registry's lock).
                if let Some(h) = &host {
                    h.leave(&mut Some(sock), &Mutex::new(None), None);
                }
                return Err(e);
            }
        };
        let local = sock.local_addr();
        let sock_counters = sock.counters_handle();
        let publisher = cfg
            .publish_stats
            .then(|| Publisher::new(&cfg.name, local.ip(), cfg.hw_counters.clone()));
        let shared = Arc::new(DeviceCore {
            ctx,
            port: cfg.port,
            epoch: std::time::Instant::now(),
            io: Mutex::new(ProgressState {
                sock: Some(sock),
                rx: RecvBatch::default(),
                tx: vec![0; MAX_PACKET * TX_BATCH],
                lens: Vec::with_capacity(TX_BATCH),
                timers: HashMap::new(),
                touched: Vec::new(),
                completed: Vec::new(),
                parked: Vec::with_capacity(TX_BATCH),
                due: Vec::with_capacity(TX_BATCH),
                groups: Vec::new(),
            }),
            // Room for the QPs of a burst: parking must not allocate on the data path.
            ready: Mutex::new(Vec::with_capacity(TX_BATCH)),
            has_ready: AtomicBool::new(false),
            doorbell,
            sock_fd: Mutex::new(Some(Arc::new(sock_fd))),
            host,
            xrc_srq_slots: cfg.xrc_srq_slots && cfg.shared,
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            last_app_poll: AtomicU64::new(0),
            busy_since: AtomicU64::new(0),
            deferred_since: AtomicU64::new(0),
            sleep_until: AtomicU64::new(0),
            rung: AtomicBool::new(false),
            last_post: AtomicU64::new(0),
            no_engine: AtomicU64::new(0),
            group_fds: Mutex::new(Vec::new()),
            icrc: cfg.icrc,
            mcast_dropped: AtomicU64::new(0),
            sock_counters,
            cm: Mutex::new(Weak::new()),
            publisher: Mutex::new(publisher),
        });
        let transport: Arc<dyn Transport> = Arc::new(DeviceTransport(Arc::downgrade(&shared)));
        if shared.ctx.set_transport(transport).is_err() {
            return Err(NetError::Device(
                "the context already has a transport".to_owned(),
            ));
        }
        let thread = if cfg.progress_thread {
            let sh = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name(format!("uroce-progress-{}", cfg.name))
                    .spawn(move || progress_thread(&sh))
                    .map_err(NetError::Io)?,
            )
        } else {
            None
        };
        let mut dev = NetDevice {
            gsi: None,
            cm: std::sync::OnceLock::new(),
            cm_thread: Mutex::new(None),
            progress_thread: cfg.progress_thread,
            shared,
            thread,
            local,
        };
        // QP1 belongs to the device (see `crate::gsi`). On failure `dev` drops: the
        // progress thread stops and what was created is released.
        let gsi = Gsi::open(&dev.shared.ctx, local.ip(), cfg.progress_thread)?;
        dev.gsi = Some(Arc::new(gsi));
        Ok(dev)
    }

    /// The device's connection manager (see [`crate::cm`]). The first call starts the CM
    /// thread, which from then on owns QP1's receives.
    ///
    /// # Errors
    /// The doorbell eventfd or the thread could not be created.
    pub fn cm(&self) -> Result<&Arc<CmService>, NetError> {
        if let Some(c) = self.cm.get() {
            return Ok(c);
        }
        let mut slot = lock(&self.cm_thread);
        if let Some(c) = self.cm.get() {
            return Ok(c);
        }
        let gsi = match &self.gsi {
            Some(g) => g.clone(),
            None => return Err(NetError::Device("the device is closing".to_owned())),
        };
        // A shared device's CM allots communication IDs from its slot's range and records
        // its listeners in the host's registry (see `crate::cm` and `member.rs`).
        let id_range = self.shared.host.as_ref().and_then(HostMember::comm_ids);
        let resume_at = self
            .shared
            .host
            .as_ref()
            .and_then(HostMember::comm_id_start);
        let listen_hook: Option<crate::cm::ListenHook> = self.shared.host.as_ref().map(|_| {
            let core = Arc::downgrade(&self.shared);
            Box::new(
                move |services: &std::collections::BTreeSet<u64>| match core.upgrade() {
                    Some(c) => match &c.host {
                        Some(h) => h.record_listeners(services, &c.sock_fd),
                        None => Some(std::collections::BTreeSet::new()),
                    },
                    None => Some(std::collections::BTreeSet::new()),
                },
            ) as crate::cm::ListenHook
        });
        let svc = Arc::new(
            CmService::new(
                self.local.ip(),
                Arc::downgrade(&gsi),
                id_range,
                resume_at,
                listen_hook,
            )
            .map_err(NetError::Io)?,
        );
        let progress: Option<Box<dyn Fn() + Send + Sync>> = if self.progress_thread {
            None
        } else {
            let sh = self.shared.clone();
            Some(Box::new(move || {
                let mut io = lock(&sh.io);
                sh.step(&mut io, false);
            }))
        };
        let s = svc.clone();
        let handle = std::thread::Builder::new()
            .name(format!("uroce-cm-{}", self.shared.ctx.device().name()))
            .spawn(move || crate::cm::cm_thread(&s, &gsi, progress.as_deref()))
            .map_err(NetError::Io)?;
        *slot = Some(handle);
        *lock(&self.shared.cm) = Arc::downgrade(&svc);
        Ok(self.cm.get_or_init(|| svc))
    }
    /// The device's GSI QP (QP1): sends and receives MADs (see [`crate::gsi`]).
    pub fn gsi(&self) -> &Gsi {
        match &self.gsi {
            Some(g) => g,
            // invariant: `gsi` is set by `open` before the device is returned and taken
            // only by `close`/`drop`, which consume the device.
            None => unreachable!("the GSI QP lives as long as its device"),
        }
    }

    /// The verbs context: create PDs, CQs, QPs and MRs from it.
    pub fn context(&self) -> &Context {
        &self.shared.ctx
    }

    /// The verbs device (name, attributes, GID table).
    pub fn device(&self) -> &Device {
        self.shared.ctx.device()
    }

    /// The socket's local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// A shared device's member slot (the top bits of its QPNs, see
    /// `uroce_socket::steer`); `None` for a device of its own.
    pub fn host_slot(&self) -> Option<u16> {
        self.shared.host.as_ref().map(HostMember::slot)
    }

    /// Whether this shared device allots its SRQ numbers from its slot
    /// ([`NetConfig::xrc_srq_slots`]; always `false` for an exclusive device).
    pub fn xrc_srq_slots(&self) -> bool {
        self.shared.xrc_srq_slots
    }

    /// The XRC domains file of this shared device (beside the registry, one per network
    /// namespace and address; see [`crate::xrc`]).
    pub fn xrc_domains(&self) -> Option<uroce_socket::xrcd::Domains> {
        self.shared.host.as_ref().map(HostMember::xrc_domains)
    }

    /// GID 0: the local address as a RoCEv2 GID.
    pub fn gid(&self) -> Gid {
        Gid::from_ip(self.local.ip())
    }

    /// Drives progress once from the caller's thread (waits for the progress lock).
    /// Returns whether anything was done.
    pub fn progress(&self) -> bool {
        let mut io = lock(&self.shared.io);
        self.shared.step(&mut io, false)
    }

    /// The device's counters now (the transport counters summed over the QPs alive and
    /// those already destroyed).
    pub fn counters(&self) -> DeviceCounters {
        self.shared.counters()
    }

    /// Publishes the device's counters now (see [`crate::stats`]); the progress thread
    /// does so on its own at most every [`crate::stats::PUBLISH_EVERY`].
    pub fn publish_stats(&self) {
        self.shared.publish(self.shared.now(), true);
    }

    /// One QP's counters, if it exists and has a transport engine.
    pub fn qp_counters(&self, qpn: u32) -> Option<QpCounters> {
        let transport = self.shared.ctx.lookup_qp(qpn)?.engine_counters()?;
        Some(QpCounters { qpn, transport })
    }

    /// Stops the progress thread and flushes the capture file.
    ///
    /// # Errors
    /// Writing the capture file failed.
    pub fn close(mut self) -> Result<(), NetError> {
        self.close_gsi();
        self.stop_thread();
        self.shared.unpublish();
        let mut io = lock(&self.shared.io);
        let flushed = match io.sock.as_mut() {
            Some(sock) => {
                let _ = sock.flush_held();
                match sock.capture_mut() {
                    Some(c) => c.flush().map_err(NetError::from),
                    None => Ok(()),
                }
            }
            None => Ok(()),
        };
        self.shared
            .leave_host(&mut io, self.cm.get().map(|c| c.next_id()));
        flushed
    }

    /// Destroys QP1 (its sends leave first: destroying a QP flushes it to the network)
    /// and its resources, before the rest of the device goes.
    fn close_gsi(&mut self) {
        // The CM thread goes first: it shares QP1.
        if let Some(svc) = self.cm.get() {
            svc.stop.store(true, Ordering::SeqCst);
            svc.wake();
        }
        if let Some(t) = lock(&self.cm_thread).take() {
            // The last reference to the device may go on the CM thread itself (an event
            // sink that held it): that thread cannot join itself (EDEADLK, a panic in
            // `join`); it stops after this step, as `stop` is set.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        // What the agent still has to say goes onto QP1 now, while the progress thread
        // runs: on the CM thread itself (the last reference went in an event sink) the
        // thread's own final flush would come after the progress thread stopped, and a DREQ
        // queued by an id destroyed just before would never leave (see `crate::cm`).
        // After a join this finds nothing left.
        if let (Some(svc), Some(g)) = (self.cm.get(), self.gsi.as_deref()) {
            svc.flush_transmits(g);
        }
        if let Some(g) = self.gsi.take() {
            match Arc::try_unwrap(g) {
                Ok(g) => g.close(),
                // The CM thread still holds QP1 only when this runs on it (see above);
                // its reference then goes with it.
                Err(g) => drop(g),
            }
        }
    }

    fn stop_thread(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            // Never join from the thread itself (see `close_gsi`).
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        // A last step sends what is still waiting: ACKs deferred for the application's
        // next post, posts left for its next poll. A program that exits right after its
        // last completion (a ping-pong) would otherwise leave its peer without the final
        // ACK, retrying until RETRY_EXC_ERR.
        if let Ok(mut io) = self.shared.io.lock() {
            self.shared.step(&mut io, false);
            if let Some(sock) = io.sock.as_mut() {
                let _ = sock.flush_held();
            }
        }
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        self.close_gsi();
        self.stop_thread();
        self.shared.unpublish();
        let mut io = lock(&self.shared.io);
        if let Some(c) = io.sock.as_mut().and_then(RoceSocket::capture_mut) {
            let _ = c.flush();
        }
        self.shared
            .leave_host(&mut io, self.cm.get().map(|c| c.next_id()));
    }
}
