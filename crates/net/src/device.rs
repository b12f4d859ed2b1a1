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
use uroce_verbs::mcast::MULTICAST_QPN;
use uroce_verbs::{
    Arrival, Context, Device, DeviceConfig, EngineCounters, Gid, QpRef, Reply, Transport, TxPacket,
};
use uroce_wire::ROCEV2_UDP_PORT;

use crate::capture::Capture;
use crate::cm::CmService;
use crate::error::NetError;
use crate::faults::FaultConfig;
use crate::gsi::Gsi;
use crate::socket::{IcrcPolicy, OutPacket, RecvBatch, RoceSocket, SocketConfig};
use crate::stats::{DeviceStat, Publisher, QpStat};
use crate::CounterSnapshot;
use uroce_socket::SocketError;

/// The environment variable that chooses a device's address for programs that cannot be
/// changed ([`NetConfig::from_env`]).
pub const ADDR_ENV: &str = "UROCE_ADDR";
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
        }
    }

    /// A device on the address in `UROCE_ADDR` (default 127.0.0.1), with faults from
    /// `UROCE_FAULTS` and the ICRC policy from `UROCE_ICRC`.
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
    sock: RoceSocket,
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
    /// A duplicate of the socket's descriptor, for the progress thread's `poll`.
    sock_fd: OwnedFd,
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

    /// One progress step; returns whether anything was received, timed out or sent.
    ///
    /// With `defer_rx_output` (an application thread polling a CQ), what the received
    /// packets make the QPs send is not sent in this step when their engine said it may
    /// wait ([`Reply::Deferrable`]: the ACK of a SEND or WRITE): the QPs go on the
    /// ready list, so the application sees its completions one system call sooner, and
    /// the ACK leaves with the next step or together with the application's next post
    /// (in a ping-pong, in the same batch as the reply, after it: the RC engine lets the
    /// reply go first, and a one-packet reply and its ACK leave as one GSO datagram).
    fn step(&self, io: &mut ProgressState, defer_rx_output: bool) -> bool {
        self.step_at(io, defer_rx_output, self.now())
    }

    /// [`DeviceCore::step`] with the clock already read (`now`, this instant).
    fn step_at(&self, io: &mut ProgressState, defer_rx_output: bool, now: Instant) -> bool {
        let mut work = false;
        io.touched.clear();
        // 0. A polling application's own posts (rung since its last step) leave first,
        // together with any ACKs deferred for them.
        if defer_rx_output && self.rung.swap(false, Ordering::SeqCst) {
            let qpns: Vec<u32> = {
                let mut r = lock(&self.ready);
                self.has_ready.store(false, Ordering::SeqCst);
                r.drain(..).collect()
            };
            self.deferred_since.store(0, Ordering::Relaxed);
            work |= self.transmit_all(io, &qpns, now);
        }
        // 1. Receive. When a timer is due, everything already received goes first (an
        // ACK waiting in the socket after this process was not scheduled must count before
        // the deadline is judged), up to RX_ROUNDS_BEFORE_TIMERS batches.
        let local_ip = io.sock.local_addr().ip();
        let rounds = if io.timers.values().any(|d| *d <= now) {
            RX_ROUNDS_BEFORE_TIMERS
        } else {
            RX_ROUNDS
        };
        for _ in 0..rounds {
            let n = match io.sock.recv_batch(&mut io.rx) {
                Ok(n) => n,
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            work = true;
            // Packets of a batch mostly go to one QP: keep the last reference (it is
            // dropped at the end of the batch, before anything could wait for it).
            let mut last: Option<QpRef> = None;
            for r in io.rx.iter() {
                let qpn = r.packet.bth.dest_qp;
                let qp = match last.take() {
                    Some(q) if q.qp_num() == qpn => q,
                    _ => match self.ctx.qp_for_packet(qpn) {
                        Some(q) => q,
                        None => continue,
                    },
                };
                let qp = last.insert(qp);
                // The socket reports the source address, and the ICRC check the IPv4
                // Identification the sender's kernel gave the packet; the IP header's
                // traffic class and hop limit are not asked for (Arrival's defaults).
                let mut from = Arrival::new(r.src.ip(), local_ip);
                if let Some(id) = r.ident {
                    from.ipv4_id = id.identification;
                }
                // The completions the packet produced are already on their CQs (the
                // verbs layer pushed them); only a QP without engine matters here.
                let Some(handled) = qp.engine_handle_packet(now, &from, &r.packet) else {
                    self.no_engine.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if !io.touched.contains(&qpn) {
                    io.touched.push(qpn);
                }
                // The engine says its answer may wait for the application's next post
                // (an ACK of a SEND or WRITE; see below and `Reply::Deferrable`).
                if handled.reply == Reply::Deferrable && !io.completed.contains(&qpn) {
                    io.completed.push(qpn);
                }
            }
            if io.rx.datagrams() < io.rx.capacity() {
                break;
            }
        }
        // 1b. The multicast groups joined.
        if !io.groups.is_empty() {
            work |= self.receive_groups(io, now);
        }
        if defer_rx_output && !io.completed.is_empty() {
            // The application is about to see what these requests brought (a receive
            // completion, data in its memory) and most likely posts next: the ACKs wait
            // on the ready list and leave with that post, or with a step at most
            // ACK_DEFER_NANOS later.
            let _ = self.deferred_since.compare_exchange(
                0,
                now.as_nanos().max(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            self.park(&io.completed);
            let completed = std::mem::take(&mut io.completed);
            io.touched.retain(|q| !completed.contains(q));
            io.completed = completed;
        }
        io.completed.clear();
        // 2. QPs rung by posters (and output deferred by an earlier step). A polling
        // application leaves deferred output alone for a moment (see above).
        let since = self.deferred_since.load(Ordering::Relaxed);
        let fresh =
            defer_rx_output && since != 0 && now.as_nanos().saturating_sub(since) < ACK_DEFER_NANOS;
        if !fresh && self.has_ready.swap(false, Ordering::SeqCst) {
            self.deferred_since.store(0, Ordering::Relaxed);
            let mut r = lock(&self.ready);
            for qpn in r.drain(..) {
                if !io.touched.contains(&qpn) {
                    io.touched.push(qpn);
                }
            }
        }
        // 3. Timers (the receive phase may have taken a while: what it brought counts
        // before a deadline is judged, and the deadline against the clock now). A step
        // that did nothing so far took no time worth a second clock read.
        let now = if work { self.now().max(now) } else { now };
        let due: Vec<u32> = io
            .timers
            .iter()
            .filter(|(_, d)| **d <= now)
            .map(|(q, _)| *q)
            .collect();
        for qpn in due {
            io.timers.remove(&qpn);
            if let Some(qp) = self.ctx.lookup_qp(qpn) {
                qp.engine_handle_timeout(now);
                work = true;
                if !io.touched.contains(&qpn) {
                    io.touched.push(qpn);
                }
            }
        }
        // 4. Transmit.
        let touched = std::mem::take(&mut io.touched);
        work |= self.transmit_all(io, &touched, now);
        io.touched = touched;
        work
    }

    /// Receives from every joined multicast group's socket and hands each datagram for
    /// DestQP 0xFFFFFF to every QP attached to the group (IBA 10.5; see [`crate::mcast`]),
    /// the group's address as the arrival's local address. Returns whether anything was
    /// received.
    fn receive_groups(&self, io: &mut ProgressState, now: Instant) -> bool {
        let mut work = false;
        let ProgressState {
            groups,
            rx,
            touched,
            ..
        } = io;
        for g in groups.iter_mut() {
            for _ in 0..RX_ROUNDS {
                let n = match g.sock.recv_batch(rx) {
                    Ok(n) => n,
                    Err(_) => break,
                };
                if n == 0 {
                    break;
                }
                work = true;
                let members = self.ctx.mcast_members(g.group);
                for r in rx.iter() {
                    if r.packet.bth.dest_qp != MULTICAST_QPN || members.is_empty() {
                        self.mcast_dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let mut from = Arrival::new(r.src.ip(), g.group);
                    if let Some(id) = r.ident {
                        from.ipv4_id = id.identification;
                    }
                    for &qpn in &members {
                        let Some(qp) = self.ctx.lookup_qp(qpn) else {
                            continue;
                        };
                        if qp.engine_handle_packet(now, &from, &r.packet).is_none() {
                            self.no_engine.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        if !touched.contains(&qpn) {
                            touched.push(qpn);
                        }
                    }
                }
                if rx.datagrams() < rx.capacity() {
                    break;
                }
            }
        }
        work
    }

    /// Transmits for each QP in `qpns` and records its next deadline.
    fn transmit_all(&self, io: &mut ProgressState, qpns: &[u32], now: Instant) -> bool {
        let mut work = false;
        for &qpn in qpns {
            if let Some(qp) = self.ctx.lookup_qp(qpn) {
                work |= self.transmit(io, &qp, now);
                match qp.engine_poll_timeout() {
                    Some(d) => {
                        io.timers.insert(qpn, d);
                    }
                    None => {
                        io.timers.remove(&qpn);
                    }
                }
            } else {
                io.timers.remove(&qpn);
            }
        }
        work
    }

    /// Sends what `qp` has to send (bounded); returns whether anything was sent.
    ///
    /// `now` (when the caller's step began) is not what the engines see: the retransmit
    /// timer a request packet arms runs from its emission (IBA Vol 1 chapter 9, Local ACK
    /// Timeout), and the receive phase of a step, or a thread preempted on a loaded host,
    /// can put tens of milliseconds between the two. Each batch reads the clock afresh,
    /// just before the packets are built and sent, so that a timer is never armed earlier
    /// than its packet leaves (which would shorten the Local ACK Timeout and use up
    /// `retry_cnt` early).
    /// Transmits QP `qpn`'s output now (the caller holds the I/O lock) and arms its
    /// timer, waking the progress thread only if it would sleep past the new deadline.
    fn transmit_now(&self, io: &mut ProgressState, qpn: u32, now: Instant) {
        if let Some(qp) = self.ctx.lookup_qp(qpn) {
            self.transmit(io, &qp, now);
            if let Some(d) = qp.engine_poll_timeout() {
                io.timers.insert(qpn, d);
                if self.sleeping.load(Ordering::SeqCst)
                    && d.as_nanos() < self.sleep_until.load(Ordering::SeqCst)
                {
                    self.wake();
                }
            }
        }
    }

    fn transmit(&self, io: &mut ProgressState, qp: &QpRef, now: Instant) -> bool {
        let mut sent = false;
        for round in 0..TX_ROUNDS {
            io.lens.clear();
            let now = self.now().max(now);
            let t = qp.engine_transmit(now, &mut io.tx, MAX_PACKET, TX_BATCH, &mut io.lens);
            if t.packets == 0 {
                break;
            }
            sent = true;
            let ProgressState { sock, tx, lens, .. } = io;
            send_runs(sock, self.port, tx, lens);
            if !t.limited {
                break;
            }
            if round + 1 == TX_ROUNDS {
                // More to send: come back in the next step.
                self.mark_ready(qp.qp_num());
            }
        }
        sent
    }

    fn next_deadline(&self, io: &ProgressState) -> Option<Instant> {
        io.timers.values().min().copied()
    }
}

/// Sends the packets laid back to back in `tx` (length and destination of each in `pkts`)
/// in order, each to its own destination (UDP port `port`). Runs of at least two
/// equal-length packets to one destination (the last of a run may be shorter) go out as
/// trains, with UDP GSO where the socket can (one system call for up to 64 datagrams of
/// many packets each); other packets (ACKs, single-packet messages, datagrams to several
/// destinations) are batched into one `sendmmsg`. Every packet's ICRC is sealed for the
/// header the kernel gives it. A full socket buffer is retried briefly; packets that
/// still do not fit are left to the engines' retransmission.
fn send_runs(sock: &mut RoceSocket, port: u16, tx: &mut [u8], pkts: &[TxPacket]) {
    let mut singles: Vec<(usize, usize, SocketAddr)> = Vec::new();
    for piece in plan_runs(pkts) {
        match piece {
            Piece::Train {
                start,
                end,
                seg_len,
                dst,
            } => {
                send_singles(sock, tx, &mut singles);
                if let Some(run) = tx.get_mut(start..end) {
                    send_train_all(sock, SocketAddr::new(dst, port), run, seg_len);
                }
            }
            Piece::Single { start, len, dst } => {
                singles.push((start, len, SocketAddr::new(dst, port)));
            }
        }
    }
    send_singles(sock, tx, &mut singles);
}

/// One part of a transmit batch as [`send_runs`] sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// At least two packets to `dst` at `start..end` of the buffer, all `seg_len` bytes
    /// but the last, which may be shorter: one GSO train.
    Train {
        start: usize,
        end: usize,
        seg_len: usize,
        dst: IpAddr,
    },
    /// One packet (batched with the other singles into a `sendmmsg`).
    Single {
        start: usize,
        len: usize,
        dst: IpAddr,
    },
}

/// Splits the packets of a transmit batch (back to back, in order) into trains and
/// single packets: a train is a maximal run of equal-length packets to one destination,
/// optionally ended by one shorter packet to the same destination.
fn plan_runs(pkts: &[TxPacket]) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut off = 0;
    let mut i = 0;
    // Bounded: every pass consumes at least one packet.
    while let Some(first) = pkts.get(i) {
        let len = first.len;
        let mut j = i + 1;
        let mut end = off + len;
        while let Some(next) = pkts.get(j) {
            if next.len > len || next.dst != first.dst {
                break;
            }
            end += next.len;
            j += 1;
            if next.len < len {
                break;
            }
        }
        if j - i >= 2 {
            out.push(Piece::Train {
                start: off,
                end,
                seg_len: len,
                dst: first.dst,
            });
            off = end;
            i = j;
        } else {
            out.push(Piece::Single {
                start: off,
                len,
                dst: first.dst,
            });
            off += len;
            i += 1;
        }
    }
    out
}

/// Seals and sends the packets at `(offset, length, destination)` of `tx` in one batch.
fn send_singles(
    sock: &mut RoceSocket,
    tx: &mut [u8],
    singles: &mut Vec<(usize, usize, SocketAddr)>,
) {
    if singles.is_empty() {
        return;
    }
    for &(off, len, dst) in singles.iter() {
        if let Some(p) = tx.get_mut(off..off + len) {
            // A packet that cannot be sealed (impossible addresses) is not worth sending;
            // the engine retransmits it.
            let _ = sock.seal(dst, p);
        }
    }
    let pkts: Vec<OutPacket<'_>> = singles
        .iter()
        .filter_map(|&(off, len, dst)| tx.get(off..off + len).map(|roce| OutPacket { dst, roce }))
        .collect();
    let mut done = 0;
    for _attempt in 0..8 {
        let Some(rest) = pkts.get(done..).filter(|r| !r.is_empty()) else {
            break;
        };
        match sock.send_batch(rest) {
            Ok(0) => {
                let _ = sock.wait_writable(Some(Duration::from_millis(1)));
            }
            Ok(n) => done += n,
            Err(_) => break,
        }
    }
    singles.clear();
}

/// `send_train` until everything is sent, the buffer stays full, or the socket fails.
fn send_train_all(sock: &mut RoceSocket, dst: SocketAddr, run: &mut [u8], seg_len: usize) {
    let mut done = 0;
    for _attempt in 0..8 {
        let Some(rest) = run.get_mut(done * seg_len..) else {
            return;
        };
        if rest.is_empty() {
            return;
        }
        match sock.send_train(dst, rest, seg_len) {
            Ok(n) => {
                done += n;
                if n == 0 {
                    let _ = sock.wait_writable(Some(Duration::from_millis(1)));
                }
            }
            Err(_) => return,
        }
    }
}

/// The transport hook installed on the context; weak, so the context does not keep the
/// device alive.
struct DeviceTransport(Weak<DeviceCore>);

impl Transport for DeviceTransport {
    fn ring(&self, qpn: u32) {
        let Some(sh) = self.0.upgrade() else {
            return;
        };
        let now = sh.now();
        let prev_post = sh.last_post.swap(now.as_nanos(), Ordering::Relaxed);
        let in_burst = now.as_nanos().saturating_sub(prev_post) < BURST_GAP_NANOS;
        if in_burst && sh.app_busy(now) {
            // Posts in quick succession from a busy-polling application wait for its next
            // poll (typically right after the burst), which sends them first thing, all
            // together: a burst leaves as one batch (GSO trains). An isolated post (a
            // ping-pong) goes out at once below.
            sh.park(&[qpn]);
            sh.rung.store(true, Ordering::SeqCst);
            return;
        }
        let guard = sh.io.try_lock();
        match guard {
            Ok(mut io) => {
                sh.transmit_now(&mut io, qpn, now);
                // Output parked for this post leaves with it: the ACKs a poll deferred
                // (above all an XRC target QP's, which is never the posting QP: its ACK
                // would otherwise wait for a later step, up to the progress thread's
                // sleep), and QPs rung during a burst.
                if sh.has_ready.swap(false, Ordering::SeqCst) {
                    sh.deferred_since.store(0, Ordering::Relaxed);
                    let parked: Vec<u32> = lock(&sh.ready).drain(..).collect();
                    for q in parked.into_iter().filter(|&q| q != qpn) {
                        sh.transmit_now(&mut io, q, now);
                    }
                }
            }
            Err(_) => sh.mark_ready(qpn),
        }
    }

    fn flush(&self, qpn: u32) {
        let Some(sh) = self.0.upgrade() else {
            return;
        };
        let mut io = lock(&sh.io);
        let now = sh.now();
        sh.transmit_all(&mut io, &[qpn], now);
    }

    fn join_group(&self, group: IpAddr) -> std::io::Result<()> {
        let Some(sh) = self.0.upgrade() else {
            return Err(std::io::Error::from_raw_os_error(
                rustix::io::Errno::NODEV.raw_os_error(),
            ));
        };
        let local = SocketAddr::new(sh.ctx.device().addr(), sh.port);
        let cfg = SocketConfig {
            icrc_policy: sh.icrc,
            ..SocketConfig::default()
        };
        let sock =
            RoceSocket::bind_group(group, local.ip(), sh.port, cfg).map_err(|e| match e {
                SocketError::Bind { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            })?;
        let fd = Arc::new(sock.as_fd().try_clone_to_owned()?);
        lock(&sh.io).groups.push(GroupSock { group, sock });
        lock(&sh.group_fds).push((group, fd));
        // The progress thread watches the new socket from its next sleep on.
        sh.wake();
        Ok(())
    }

    fn leave_group(&self, group: IpAddr) {
        let Some(sh) = self.0.upgrade() else {
            return;
        };
        lock(&sh.group_fds).retain(|(g, _)| *g != group);
        // Closing the socket leaves the group.
        lock(&sh.io).groups.retain(|g| g.group != group);
        sh.wake();
    }

    fn poll_progress(&self) -> bool {
        let Some(sh) = self.0.upgrade() else {
            return false;
        };
        let at = sh.now();
        let now = at.as_nanos().max(1);
        let prev = sh.last_app_poll.swap(now, Ordering::Relaxed);
        // Only repeated polls mean busy polling: one empty poll before blocking on a
        // completion channel must not take the socket away from the progress thread.
        if prev != 0 && now.saturating_sub(prev) < REPOLL_WINDOW_NANOS {
            sh.busy_since.store(now, Ordering::Relaxed);
        }
        let guard = sh.io.try_lock();
        match guard {
            Ok(mut io) => sh.step_at(&mut io, true, at),
            Err(_) => false,
        }
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
        let mut sock = RoceSocket::bind_with(SocketAddr::new(cfg.addr, cfg.port), sock_cfg)?;
        if let Some(path) = &cfg.capture {
            sock.set_capture(Some(Capture::create(path)?));
        }
        let local = sock.local_addr();
        // Sending to a multicast group leaves by the device's own interface (best effort:
        // without it, multicast sends follow the routing table).
        let _ = crate::mcast::set_sending_interface(sock.as_fd(), local.ip());
        let sock_fd = sock.as_fd().try_clone_to_owned().map_err(NetError::Io)?;
        let sock_counters = sock.counters_handle();
        let publisher = cfg
            .publish_stats
            .then(|| Publisher::new(&cfg.name, local.ip(), cfg.hw_counters.clone()));
        let device = Device::new(DeviceConfig::new(cfg.name.clone(), cfg.addr))
            .map_err(|e| NetError::Device(e.to_string()))?;
        let ctx = Context::open(&device).map_err(|e| NetError::Device(e.to_string()))?;
        let doorbell = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| NetError::Io(std::io::Error::from(e)))?;
        let shared = Arc::new(DeviceCore {
            ctx,
            port: cfg.port,
            epoch: std::time::Instant::now(),
            io: Mutex::new(ProgressState {
                sock,
                rx: RecvBatch::default(),
                tx: vec![0; MAX_PACKET * TX_BATCH],
                lens: Vec::with_capacity(TX_BATCH),
                timers: HashMap::new(),
                touched: Vec::new(),
                completed: Vec::new(),
                groups: Vec::new(),
            }),
            ready: Mutex::new(Vec::new()),
            has_ready: AtomicBool::new(false),
            doorbell,
            sock_fd,
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
        let svc =
            Arc::new(CmService::new(self.local.ip(), Arc::downgrade(&gsi)).map_err(NetError::Io)?);
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
        let _ = io.sock.flush_held();
        match io.sock.capture_mut() {
            Some(c) => c.flush().map_err(NetError::from),
            None => Ok(()),
        }
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
            let _ = io.sock.flush_held();
        }
    }
}

impl Drop for NetDevice {
    fn drop(&mut self) {
        self.close_gsi();
        self.stop_thread();
        self.shared.unpublish();
        if let Ok(mut io) = self.shared.io.lock() {
            if let Some(c) = io.sock.capture_mut() {
                let _ = c.flush();
            }
        }
    }
}

fn progress_thread(sh: &DeviceCore) {
    let mut buf = [0u8; 8];
    let mut last_work = sh.now();
    // The last known timer deadline, and whether the last wake-up was only to see whether
    // an application's busy polling had expired (no doorbell, no timer due).
    let mut known_deadline: Option<Instant> = None;
    let mut expiry_check = false;
    while !sh.stop.load(Ordering::SeqCst) {
        let busy = |now: Instant| sh.app_busy(now);
        // While an application busy polls it does the work; never wait for the lock then
        // (a blocked lock is a context switch on both sides). A wake-up that only found the
        // application still polling does nothing at all: it would only compete with it.
        let (deadline, worked) = if expiry_check && busy(sh.now()) {
            (known_deadline, false)
        } else if busy(sh.now()) {
            match sh.io.try_lock() {
                Ok(mut io) => {
                    let worked = sh.step(&mut io, false);
                    (sh.next_deadline(&io), worked)
                }
                Err(_) => (None, false),
            }
        } else {
            let mut io = lock(&sh.io);
            let worked = sh.step(&mut io, false);
            (sh.next_deadline(&io), worked)
        };
        let now = sh.now();
        let app_busy = busy(now);
        if worked {
            last_work = now;
        }
        sh.publish(now, false);
        // While traffic flows and no application thread polls, keep stepping for a
        // moment instead of paying a sleep and a wake-up per packet batch.
        if !app_busy && now.saturating_duration_since(last_work) < SPIN_AFTER_WORK {
            // Yield rather than spin: a thread we just woke (an application blocked on a
            // completion channel) gets the core at once on a small machine.
            std::thread::yield_now();
            continue;
        }
        let mut sleep = deadline.map_or(MAX_SLEEP, |d| d.saturating_duration_since(now));
        if app_busy {
            // Wake rarely: every wake-up steals a core from a spinning application on a
            // small machine. But wake when the application's busy polling would expire
            // (no poll for BUSY_POLL_GRACE), to watch the socket again at once: a program
            // may stop polling its CQ to block on a channel or to spin on memory for its
            // peer's next RDMA WRITE (ib_write_lat), and then only this thread serves it.
            // Only when no timer is armed, though: with operations in flight the
            // application is waiting for their completions and keeps polling (a bandwidth
            // test), and extra wake-ups measurably cost it throughput on 2 cores.
            sleep = sleep.min(BUSY_SLEEP);
            if deadline.is_none() {
                let last = sh.busy_since.load(Ordering::Relaxed);
                let expiry = Instant::from_nanos(last)
                    .saturating_add(BUSY_POLL_GRACE)
                    .saturating_duration_since(now);
                sleep = sleep.min(expiry.saturating_add(BUSY_EXPIRY_SLACK));
            }
        }
        sleep = sleep.min(MAX_SLEEP);
        sh.sleeping.store(true, Ordering::SeqCst);
        // Work on the ready list is ours unless an application busy polls (it sends what
        // its own steps deferred, with its next poll or post).
        let ready = !app_busy && sh.has_ready.load(Ordering::SeqCst);
        if ready || sh.stop.load(Ordering::SeqCst) {
            sh.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        if !sleep.is_zero() {
            sh.sleep_until
                .store(now.saturating_add(sleep).as_nanos(), Ordering::SeqCst);
            let ts = Timespec {
                tv_sec: i64::try_from(sleep.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(sleep.subsec_nanos()),
            };
            let group_fds: Vec<Arc<OwnedFd>> =
                lock(&sh.group_fds).iter().map(|(_, f)| f.clone()).collect();
            let mut fds = vec![
                PollFd::new(&sh.doorbell, PollFlags::IN),
                PollFd::new(&sh.sock_fd, PollFlags::IN),
            ];
            fds.extend(group_fds.iter().map(|f| PollFd::new(&**f, PollFlags::IN)));
            // While the application busy-polls, only the doorbell and the timers wake us.
            let n = if app_busy { 1 } else { fds.len() };
            // EINTR and the like just end this sleep early.
            let _ = rustix::event::poll(&mut fds[..n], Some(&ts));
        }
        sh.sleeping.store(false, Ordering::SeqCst);
        let rang = rustix::io::read(&sh.doorbell, &mut buf).is_ok();
        let woke = sh.now();
        known_deadline = deadline;
        expiry_check = app_busy && !rang && deadline.is_none_or(|d| woke < d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(len: usize, dst: &str) -> TxPacket {
        TxPacket {
            len,
            dst: dst.parse().unwrap(),
        }
    }

    /// Trains never mix destinations; packets to several destinations in a row are
    /// singles; a shorter last packet ends a train to its own destination only.
    #[test]
    fn runs_are_split_by_destination_and_length() {
        let (a, b) = ("127.0.0.2", "::1");
        let pkts = [
            p(100, a),
            p(100, a),
            p(60, a),
            p(100, b),
            p(100, b),
            p(100, a),
            p(30, b),
            p(100, b),
            p(40, a),
        ];
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert_eq!(
            plan_runs(&pkts),
            vec![
                Piece::Train {
                    start: 0,
                    end: 260,
                    seg_len: 100,
                    dst: ip(a)
                },
                Piece::Train {
                    start: 260,
                    end: 460,
                    seg_len: 100,
                    dst: ip(b)
                },
                Piece::Single {
                    start: 460,
                    len: 100,
                    dst: ip(a)
                },
                Piece::Single {
                    start: 560,
                    len: 30,
                    dst: ip(b)
                },
                Piece::Single {
                    start: 590,
                    len: 100,
                    dst: ip(b)
                },
                Piece::Single {
                    start: 690,
                    len: 40,
                    dst: ip(a)
                },
            ]
        );
        assert!(plan_runs(&[]).is_empty());
    }
}
