//! The connection manager running on a network device: one sans-IO
//! [`uroce_proto::cm::CmAgent`] per device, carried by the device's GSI QP (QP1).
//!
//! # What runs where
//! [`NetDevice::cm`](crate::NetDevice::cm) starts the device's **CM thread** on its first
//! call (a device nobody asks for a CM keeps QP1 to [`Gsi::recv_mad`] callers, as before;
//! from the first call on, QP1's receives belong to the CM). The CM thread is the only
//! thread that
//! * takes MADs off QP1 and hands them to the agent ([`CmAgent::handle_mad`]; the agent
//!   drops and counts what is not a CM MAD),
//! * runs the agent's timers ([`CmAgent::handle_timeout`] at [`CmAgent::poll_timeout`]),
//! * sends what the agent wants sent after a received MAD or a timer
//!   ([`CmAgent::poll_transmit`] → [`Gsi::send_mad`] to the peer's QP1), and
//! * hands the agent's events, in the agent's order, to the one [`CmEventSink`] installed
//!   ([`CmService::set_sink`]; the RDMA-CM layer above installs one per device). No lock of
//!   this module is held while the sink runs, so a sink may issue commands.
//!
//! Application threads issue commands through [`CmService::with_agent`]: the closure runs
//! under the agent's lock, the MADs it produced are handed to QP1 from the calling thread
//! (still under that lock, so MADs leave in the agent's order whoever sends them), then the
//! CM thread is woken through an eventfd (the *doorbell*) to report the command's events
//! and rearm its timers. So every event goes through one thread, in order, nothing the sink
//! does re-enters the agent's lock, and a command's MAD has left when the call returns —
//! a program that disconnects and exits at once does not take its DREQ with it.
//!
//! The CM thread sleeps in `poll(2)` on the GSI receive CQ's completion channel and the
//! doorbell, until the agent's next deadline and at most [`CM_MAX_SLEEP`]; on a device
//! without a progress thread it sleeps at most [`CM_SLEEP_NO_THREAD`] and runs a progress
//! step each round (it is then what moves CM MADs through the socket). Every loop is
//! bounded: one round receives at most [`CM_RECV_BATCH`] MADs, and the thread ends when the
//! device closes (stop flag + doorbell) or QP1 is flushed.
//!
//! # A member of a host-wide device
//! On a shared device (`NetConfig::shared`) the agent allots communication IDs from the
//! member's slot's range only (`uroce_socket::steer::QpnLayout::comm_ids`), so that the
//! kernel steers the MADs answering its connections to this member, and the service IDs
//! it listens on are recorded in the host's registry, so that REQs and SIDR_REQs for them
//! are steered here too. The record is made by [`CmService::with_agent`] after the command
//! that changed the listeners, outside the agent's lock, and before the call returns: a
//! `listen` that returned is steered (see `device/member.rs` for the locks it takes). A
//! service another process of the host already listens on is not recorded: REQs for it
//! keep going there, and [`CmService::refused`] says so, so that the caller can undo its
//! listen and fail (`uroce-rdmacm`'s listen answers `EADDRINUSE`, as the kernel's CM does
//! for a port bound on the host).
//!
//! # Closing
//! What the agent still has queued when the device closes (a DREQ from an id destroyed
//! just before the device) is handed to QP1 while the device's progress thread still runs,
//! so that it leaves: by the CM thread as it ends, when the closing thread joins it, or by
//! the closing thread itself when that *is* the CM thread — the last reference to the
//! device can go inside an event sink (the application dropped its last handle while an
//! event was being delivered), and the CM thread's own final flush would then come after
//! the progress thread stopped. That race lost the DREQ in about one run of three of the
//! RDMA-CM tests run in parallel.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use rustix::event::{eventfd, EventfdFlags, PollFd, PollFlags, Timespec};
use uroce_proto::cm::{AgentConfig, CmAgent, CmEvent, CmStats, IdRange};
use uroce_proto::time::Instant;
use uroce_wire::mad::GSI_QPN;

use crate::gsi::{Gsi, GsiError};

/// The longest the CM thread sleeps when no CM timer is armed.
pub const CM_MAX_SLEEP: Duration = Duration::from_millis(200);
/// The longest it sleeps on a device without a progress thread.
pub const CM_SLEEP_NO_THREAD: Duration = Duration::from_millis(1);
/// The most MADs one round of the CM thread takes off QP1.
pub const CM_RECV_BATCH: usize = 64;

/// Where the CM thread reports the agent's events.
pub trait CmEventSink: Send + Sync {
    /// One event, on the CM thread, with no lock of the CM service held.
    fn cm_event(&self, service: &CmService, event: CmEvent);
}

/// Counts of the CM service itself ([`CmService::counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// The agent's own counts (malformed / unmatched / ignored MADs, MADs produced).
    pub agent: CmStats,
    /// MADs taken off QP1.
    pub mads_received: u64,
    /// MADs handed to QP1.
    pub mads_sent: u64,
    /// MADs QP1 refused to send (queue full, bad address): the agent's retry covers them.
    pub send_failures: u64,
    /// Events reported while no sink was installed (dropped).
    pub events_unclaimed: u64,
}

impl CmCounters {
    /// Every counter as `(name, value)`, named `cm_…`, for printing and publishing.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let a = &self.agent;
        vec![
            ("cm_mads_received", self.mads_received),
            ("cm_mads_sent", self.mads_sent),
            ("cm_send_failures", self.send_failures),
            ("cm_events_unclaimed", self.events_unclaimed),
            ("cm_malformed", a.malformed),
            ("cm_unmatched", a.unmatched),
            ("cm_ignored", a.ignored),
            ("cm_req_over_limit", a.req_over_limit),
            ("cm_req_expired", a.req_expired),
        ]
    }
}

/// Records the service IDs the agent listens on where the device needs them (a shared
/// device: the host's registry); the services refused there (another process of the host
/// listens on them), or `None` when the record failed (it is tried again after the next
/// command).
pub(crate) type ListenHook = Box<dyn Fn(&BTreeSet<u64>) -> Option<BTreeSet<u64>> + Send + Sync>;

/// The CM of one device (see the module documentation).
pub struct CmService {
    agent: Mutex<CmAgent>,
    /// QP1, for commands that send from the calling thread (see [`CmService::with_agent`]).
    gsi: Weak<Gsi>,
    sink: Mutex<Option<Arc<dyn CmEventSink>>>,
    doorbell: OwnedFd,
    epoch: std::time::Instant,
    local: IpAddr,
    pub(crate) stop: AtomicBool,
    mads_received: AtomicU64,
    mads_sent: AtomicU64,
    send_failures: AtomicU64,
    events_unclaimed: AtomicU64,
    /// A shared device's record of the listeners (see the module documentation).
    listen_hook: Option<ListenHook>,
    /// The service IDs last recorded through `listen_hook`; its lock orders the records
    /// (taken before the agent's).
    recorded: Mutex<BTreeSet<u64>>,
    /// Of those, the ones the record refused (another process listens on them).
    refused: Mutex<BTreeSet<u64>>,
}

impl std::fmt::Debug for CmService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmService")
            .field("local", &self.local)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A CA GUID for a device at `ip`: an EUI-64 built from the address (RoCE has no
/// hardware GUID to report; the CM only echoes it).
fn ca_guid(ip: IpAddr) -> u64 {
    match ip {
        IpAddr::V4(a) => 0x0200_00ff_fe00_0000 ^ u64::from(u32::from(a)),
        IpAddr::V6(a) => {
            let b = a.octets();
            u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]])
        }
    }
}

impl CmService {
    /// A CM for the device at `local` whose QP1 is `gsi`; `id_range`: the communication
    /// IDs it allots (`None`: all), `resume_at`: the first it tries (a shared device
    /// carrying on where its slot's last member stopped; `None`: somewhere depending on
    /// the time), `listen_hook`: see [`ListenHook`].
    pub(crate) fn new(
        local: IpAddr,
        gsi: Weak<Gsi>,
        id_range: Option<IdRange>,
        resume_at: Option<u32>,
        listen_hook: Option<ListenHook>,
    ) -> Result<CmService, std::io::Error> {
        let doorbell = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(std::io::Error::from)?;
        // Communication IDs and transaction IDs start somewhere that depends on the time,
        // so that a restarted process does not reuse the IDs its predecessor's peers may
        // still hold in TIMEWAIT (they would answer a stale connection).
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        let first_id = match (id_range, resume_at) {
            (Some(r), Some(at)) if r.contains(at) => at,
            // Somewhere in the range (none of its IDs is 0).
            (Some(r), _) => r.first().saturating_add(((seed >> 8) % r.count()) as u32),
            (None, _) => (seed as u32 & 0x7fff_ffff) | 1,
        };
        let config = AgentConfig {
            local_ca_guid: ca_guid(local),
            tid_high: (seed >> 16) as u32 | 1,
            first_id,
            id_range: id_range.unwrap_or_default(),
            ..AgentConfig::default()
        };
        Ok(CmService {
            agent: Mutex::new(CmAgent::new(config)),
            gsi,
            sink: Mutex::new(None),
            doorbell,
            epoch: std::time::Instant::now(),
            local,
            stop: AtomicBool::new(false),
            mads_received: AtomicU64::new(0),
            mads_sent: AtomicU64::new(0),
            send_failures: AtomicU64::new(0),
            events_unclaimed: AtomicU64::new(0),
            listen_hook,
            recorded: Mutex::new(BTreeSet::new()),
            refused: Mutex::new(BTreeSet::new()),
        })
    }

    /// The communication ID the agent tries next (see `CmAgent::next_id`).
    pub(crate) fn next_id(&self) -> u32 {
        lock(&self.agent).next_id()
    }

    /// The device's IP address.
    pub fn local_ip(&self) -> IpAddr {
        self.local
    }

    /// The CM's clock (what the agent's deadlines are measured on).
    pub fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Runs `f` on the agent (a command: `listen`, `connect`, `accept`, …) with the current
    /// time, sends the MADs it produced from this thread, then wakes the CM thread to
    /// report its events and rearm the timers. A command's MAD is on QP1 (and, unless the
    /// progress thread holds the socket just then, on the wire) when this returns: a
    /// program that disconnects and exits at once (`rping`'s client) would otherwise take
    /// its DREQ with it before the CM thread ran.
    pub fn with_agent<R>(&self, f: impl FnOnce(&mut CmAgent, Instant) -> R) -> R {
        let r = {
            let mut a = lock(&self.agent);
            let now = self.now();
            let r = f(&mut a, now);
            if let Some(gsi) = self.gsi.upgrade() {
                // A closing device (QP1 flushed) keeps them for its final flush.
                let _ = self.send_queued(&mut a, &gsi);
            }
            r
        };
        self.record_listeners();
        self.wake();
        r
    }

    /// A shared device: records the agent's listeners through the hook when they changed
    /// since the last record (see the module documentation).
    fn record_listeners(&self) {
        let Some(hook) = &self.listen_hook else {
            return;
        };
        let mut recorded = lock(&self.recorded);
        let now: BTreeSet<u64> = lock(&self.agent).listening().collect();
        if now != *recorded {
            if let Some(refused) = hook(&now) {
                *recorded = now;
                *lock(&self.refused) = refused;
            }
        }
    }

    /// Whether the agent listens on `service` but the host's registry refused to steer
    /// its REQs here: another process of the host listens on it (a shared device only;
    /// see the module documentation).
    pub fn refused(&self, service: u64) -> bool {
        lock(&self.refused).contains(&service)
    }

    /// Installs (or with `None` removes) the event sink; returns the previous one.
    pub fn set_sink(&self, sink: Option<Arc<dyn CmEventSink>>) -> Option<Arc<dyn CmEventSink>> {
        std::mem::replace(&mut *lock(&self.sink), sink)
    }

    /// The counters now.
    pub fn counters(&self) -> CmCounters {
        CmCounters {
            agent: lock(&self.agent).stats(),
            mads_received: self.mads_received.load(Ordering::Relaxed),
            mads_sent: self.mads_sent.load(Ordering::Relaxed),
            send_failures: self.send_failures.load(Ordering::Relaxed),
            events_unclaimed: self.events_unclaimed.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn wake(&self) {
        let _ = rustix::io::write(&self.doorbell, &1u64.to_ne_bytes());
    }

    /// Sends the MADs the agent has queued (nothing else: no receive, timer or event). The
    /// device calls it when it closes, after the CM thread stopped or on the CM thread.
    pub(crate) fn flush_transmits(&self, gsi: &Gsi) {
        let mut a = lock(&self.agent);
        let _ = self.send_queued(&mut a, gsi);
    }

    /// Hands what the agent has queued to QP1, under the agent's lock (`a`), so that MADs
    /// leave in the agent's order whichever thread sends them. `Err(Flushed)` when QP1 was
    /// flushed (the device is closing): the MADs not yet sent stay queued.
    fn send_queued(&self, a: &mut CmAgent, gsi: &Gsi) -> Result<(), GsiError> {
        while let Some((dst, mad)) = a.poll_transmit() {
            match gsi.send_mad(dst, GSI_QPN, &mad) {
                Ok(()) => self.mads_sent.fetch_add(1, Ordering::Relaxed),
                Err(GsiError::Flushed) => return Err(GsiError::Flushed),
                Err(_) => self.send_failures.fetch_add(1, Ordering::Relaxed),
            };
        }
        Ok(())
    }

    /// One round: receive, timers, transmit, events. Returns the agent's next deadline.
    fn round(&self, gsi: &Gsi) -> Result<Option<Instant>, GsiError> {
        let mut received = Vec::new();
        for _ in 0..CM_RECV_BATCH {
            match gsi.recv_mad(Duration::ZERO)? {
                Some(m) => received.push(m),
                None => break,
            }
        }
        let (sent, events, deadline) = {
            let mut a = lock(&self.agent);
            let now = self.now();
            for m in &received {
                a.handle_mad(now, m.src, &m.mad);
            }
            if a.poll_timeout().is_some_and(|t| t <= now) {
                a.handle_timeout(now);
            }
            let sent = self.send_queued(&mut a, gsi);
            let events: Vec<_> = std::iter::from_fn(|| a.poll_event()).collect();
            (sent, events, a.poll_timeout())
        };
        self.mads_received
            .fetch_add(received.len() as u64, Ordering::Relaxed);
        sent?;
        if !events.is_empty() {
            let sink = lock(&self.sink).clone();
            for ev in events {
                match &sink {
                    Some(s) => s.cm_event(self, ev),
                    None => {
                        self.events_unclaimed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        Ok(deadline)
    }
}

/// The CM thread (see the module documentation). `progress` runs one progress step on a
/// device without a progress thread.
pub(crate) fn cm_thread(svc: &CmService, gsi: &Gsi, progress: Option<&(dyn Fn() + Send + Sync)>) {
    let mut buf = [0u8; 8];
    while !svc.stop.load(Ordering::SeqCst) {
        if let Some(p) = progress {
            p();
        }
        let Ok(deadline) = svc.round(gsi) else {
            return;
        };
        let max = if progress.is_some() {
            CM_SLEEP_NO_THREAD
        } else {
            CM_MAX_SLEEP
        };
        let now = svc.now();
        let sleep = deadline
            .map_or(max, |d| d.saturating_duration_since(now))
            .min(max);
        if sleep.is_zero() {
            continue;
        }
        let ts = Timespec {
            tv_sec: i64::try_from(sleep.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(sleep.subsec_nanos()),
        };
        // `round` left the GSI receive CQ armed and empty (recv_mad with a zero timeout
        // arms it before it reports nothing), so a MAD arriving now signals the channel.
        let channel = gsi.channel_fd();
        let mut fds = [
            PollFd::new(&svc.doorbell, PollFlags::IN),
            PollFd::new(&channel, PollFlags::IN),
        ];
        // EINTR and the like just end this sleep early.
        let _ = rustix::event::poll(&mut fds, Some(&ts));
        let _ = rustix::io::read(&svc.doorbell, &mut buf);
        gsi.ack_notifications();
    }
    // The device is closing: what the agent still has to say leaves before QP1 goes — a
    // DREQ from an id destroyed just before the device, without which the peer would
    // never learn that the connection is gone.
    svc.flush_transmits(gsi);
}
