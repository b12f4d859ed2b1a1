//! The context: an opened device. It owns the resource tables (QPN, SRQN, memory keys), the
//! asynchronous event queue and the counters, and creates the top-level objects (PDs, CQs,
//! completion channels, XRC domains).

use std::fmt;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::cq::{ChannelCore, CompChannel, Cq, CqCore};
use crate::device::{Device, DeviceAttr, Gid, PortAttr};
use crate::error::{AllocError, CreateCqError, DestroyError, DeviceError, ObjectKind, WaitError};
use crate::event::{AsyncEvent, EventQueue};
use crate::pd::{Pd, PdCore};
use crate::qp::{QpCore, QpRef};
use crate::region::{MrEntry, MrRef};
use crate::srq::{SrqCore, SrqRef};
use crate::sync::{Arc, AtomicU64, AtomicUsize, Ordering};
use crate::table::Table;
use crate::xrcd::{Xrcd, XrcdCore};

/// The first QPN the allocator hands out (0 = SMI and 1 = GSI are reserved, INTEROP-NOTES §8).
pub const FIRST_QPN: u32 = 16;
/// The largest 24-bit QP / SRQ number.
pub const MAX_QPN: u32 = 0x00ff_ffff;
/// The QPN of the GSI QP.
pub const GSI_QPN: u32 = 1;
/// The first SRQ number handed out (0 is never used, so it can mean "none").
pub const FIRST_SRQN: u32 = 1;

/// Default time `destroy` waits for references to go away before failing with "in use".
pub const DEFAULT_DESTROY_TIMEOUT: Duration = Duration::from_secs(5);

/// Counts of live objects of each kind (for diagnostics and leak checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LiveObjects {
    /// Protection domains.
    pub pds: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Completion channels.
    pub channels: usize,
    /// XRC domains.
    pub xrcds: usize,
    /// Queue pairs (including destroyed ones still referenced).
    pub qps: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Address handles.
    pub ahs: usize,
}

/// Per-context counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Packets for a QPN that names no QP (unknown, destroyed, or QPN 0), dropped.
    pub unknown_qpn_drops: u64,
    /// XRC packets for an SRQ number that names no SRQ, dropped.
    pub unknown_srqn_drops: u64,
    /// Memory keys that named no region.
    pub unknown_key_lookups: u64,
    /// Async events queued.
    pub events_raised: u64,
    /// Async events refused (object unpublished, queue shut down) or purged by a destroy.
    pub events_dropped: u64,
    /// CQ overruns.
    pub cq_overruns: u64,
}

#[derive(Default)]
pub(crate) struct LiveCounts {
    pub(crate) pds: AtomicUsize,
    pub(crate) cqs: AtomicUsize,
    pub(crate) channels: AtomicUsize,
    pub(crate) xrcds: AtomicUsize,
    pub(crate) qps: AtomicUsize,
    pub(crate) srqs: AtomicUsize,
    pub(crate) mrs: AtomicUsize,
    pub(crate) ahs: AtomicUsize,
    pub(crate) mws: AtomicUsize,
}

/// Increments `counter` unless it already reached `max`; `false` when the limit is hit.
pub(crate) fn try_inc(counter: &AtomicUsize, max: u32) -> bool {
    let max = max as usize;
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// Decrements a live/children counter (never below zero).
pub(crate) fn dec(counter: &AtomicUsize) {
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

pub(crate) fn get(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::Acquire)
}

/// The shared state of a context; every object holds an `Arc` to it.
pub(crate) struct ContextCore {
    pub(crate) device: Device,
    pub(crate) qps: Table<QpCore>,
    pub(crate) srqs: Table<SrqCore>,
    pub(crate) mrs: Table<MrEntry>,
    /// Memory windows, by the index their R_Keys carry (the top of the key space).
    pub(crate) mws: Table<crate::mw::MwEntry>,
    /// A plain `std` Arc: the device keeps a `Weak` to it for port events.
    pub(crate) events: std::sync::Arc<EventQueue>,
    pub(crate) live: LiveCounts,
    unknown_qpn: AtomicU64,
    unknown_srqn: AtomicU64,
    unknown_key: AtomicU64,
    pub(crate) cq_overruns: AtomicU64,
    /// The engine counters of the QPs released so far (added when a QP's state goes), so
    /// that totals count what destroyed QPs saw. Plain `std`: not part of the
    /// model-checked protocol.
    pub(crate) retired_engines: std::sync::Mutex<uroce_proto::engine::EngineCounters>,
    next_id: AtomicU64,
    destroy_timeout_us: AtomicU64,
    /// The I/O layer's hook, once installed.
    pub(crate) transport: crate::engine::TransportSlot,
    /// Multicast group membership (see [`crate::mcast`]).
    pub(crate) mcast: crate::mcast::McastTable,
}

impl ContextCore {
    /// A fresh object id (PDs, CQs, channels, XRC domains): unique within the context.
    pub(crate) fn next_id(&self) -> u32 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        u32::try_from(id & 0xffff_ffff).unwrap_or(u32::MAX)
    }

    pub(crate) fn destroy_timeout(&self) -> Duration {
        Duration::from_micros(self.destroy_timeout_us.load(Ordering::Relaxed))
    }

    pub(crate) fn attr(&self) -> &DeviceAttr {
        self.device.attr()
    }
}

/// An opened device (`ibv_context`). Unique owner handle: [`Context::close`] or drop.
///
/// Every object created from a context keeps the context's shared state alive, so dropping
/// the handle early never invalidates them; it does shut down the event queue (blocked
/// [`Context::get_async_event`] calls return [`WaitError::Shutdown`]) and discards its
/// undelivered events.
pub struct Context {
    core: Arc<ContextCore>,
}

impl Context {
    /// Opens `device` (`ibv_open_device`).
    pub fn open(device: &Device) -> Result<Context, AllocError> {
        let events = std::sync::Arc::new(EventQueue::new().map_err(AllocError::Eventfd)?);
        device.register(&events);
        let attr = device.attr();
        let core = ContextCore {
            device: device.clone(),
            qps: Table::new("QP", device.qpn_range(), attr.max_qp as usize + 1)
                .starting_at(device.qpn_start()),
            srqs: Table::new("SRQ", device.srqn_range(), attr.max_srq as usize),
            mrs: Table::new(
                "MR",
                0..=crate::mw::FIRST_MW_INDEX - 1,
                attr.max_mr as usize,
            ),
            mws: Table::new(
                "MW",
                crate::mw::FIRST_MW_INDEX..=crate::mr::MAX_KEY_INDEX,
                crate::mw::MAX_MW as usize,
            ),
            events,
            live: LiveCounts::default(),
            unknown_qpn: AtomicU64::new(0),
            unknown_srqn: AtomicU64::new(0),
            unknown_key: AtomicU64::new(0),
            cq_overruns: AtomicU64::new(0),
            retired_engines: std::sync::Mutex::new(Default::default()),
            next_id: AtomicU64::new(1),
            destroy_timeout_us: AtomicU64::new(
                u64::try_from(DEFAULT_DESTROY_TIMEOUT.as_micros()).unwrap_or(u64::MAX),
            ),
            transport: crate::engine::TransportSlot::new(),
            mcast: crate::mcast::McastTable::default(),
        };
        Ok(Context {
            core: Arc::new(core),
        })
    }

    /// The QPN its next QP creation tries first (the QPN allocator's cursor; see
    /// `crate::table`). A member of a host-wide device leaving cleanly records it, so the
    /// next member of its slot carries on there ([`DeviceConfig::qpn_start`]).
    ///
    /// [`DeviceConfig::qpn_start`]: crate::DeviceConfig::qpn_start
    pub fn next_qpn(&self) -> u32 {
        self.core.qps.cursor()
    }

    /// The device this context was opened on.
    pub fn device(&self) -> &Device {
        &self.core.device
    }

    /// Device capabilities (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        self.core.device.attr().clone()
    }

    /// Port attributes (`ibv_query_port`).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, DeviceError> {
        self.core.device.port_attr(port)
    }

    /// A GID table entry (`ibv_query_gid`).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid, DeviceError> {
        self.core.device.gid(port, index)
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<Pd, AllocError> {
        PdCore::alloc(&self.core)
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    pub fn create_comp_channel(&self) -> Result<CompChannel, AllocError> {
        ChannelCore::create(&self.core)
    }

    /// Creates a CQ of exactly `cqe` entries (`ibv_create_cq`), optionally bound to a
    /// completion channel.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&CompChannel>,
        comp_vector: u32,
    ) -> Result<Cq, CreateCqError> {
        CqCore::create(&self.core, cqe, channel, comp_vector)
    }

    /// Allocates an XRC domain (`ibv_open_xrcd` with no file: private to this context).
    pub fn alloc_xrcd(&self) -> Result<Xrcd, AllocError> {
        XrcdCore::alloc(&self.core)
    }

    /// The event queue's file descriptor: readable while async events are pending.
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.core.events.fd()
    }

    /// The next async event (`ibv_get_async_event`), waiting up to `timeout` (`None`: until
    /// one arrives or [`Context::shutdown`] is called).
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent, WaitError> {
        self.core.events.get(timeout)
    }

    /// The next async event if one is pending.
    pub fn try_get_async_event(&self) -> Option<AsyncEvent> {
        self.core.events.try_get()
    }

    /// Number of undelivered async events.
    pub fn pending_async_events(&self) -> usize {
        self.core.events.len()
    }

    /// Shuts the event queue down: blocked and future [`Context::get_async_event`] calls
    /// return [`WaitError::Shutdown`] once the queue is empty; no new events are queued.
    pub fn shutdown(&self) {
        self.core.events.shutdown();
    }

    /// Whether [`Context::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.core.events.is_shutdown()
    }

    /// Installs the I/O layer's [`Transport`](crate::engine::Transport): posting rings it,
    /// polling an empty CQ asks it for progress. Only one can be installed per context;
    /// a second call returns the transport it was given.
    pub fn set_transport(
        &self,
        transport: std::sync::Arc<dyn crate::engine::Transport>,
    ) -> Result<(), std::sync::Arc<dyn crate::engine::Transport>> {
        self.core.transport.set(transport)
    }

    /// Whether a transport is installed.
    pub fn has_transport(&self) -> bool {
        self.core.transport.get().is_some()
    }

    /// Network-facing lookup: the QP a packet for `qpn` goes to, as a counted reference.
    ///
    /// `None` for QPN 0 (no SMI on RoCE, IBA Annex A17), unknown and destroyed QPs; every `None`
    /// increments [`Counters::unknown_qpn_drops`]. The caller must not block while holding
    /// the reference (it delays destroys).
    pub fn qp_for_packet(&self, qpn: u32) -> Option<QpRef> {
        let found = if qpn == 0 {
            None
        } else {
            self.core.qps.get(qpn).map(QpRef::from_core)
        };
        if found.is_none() {
            self.core.unknown_qpn.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Network-facing lookup: the QPs attached to the multicast group `group` (an IP
    /// multicast address), in attach order (see [`crate::mcast`]).
    pub fn mcast_members(&self, group: std::net::IpAddr) -> Vec<u32> {
        self.core.mcast.members(group)
    }

    /// The multicast groups at least one QP of this context is attached to.
    pub fn mcast_groups(&self) -> Vec<std::net::IpAddr> {
        self.core.mcast.groups()
    }

    /// A QP by number without counting a miss (the I/O layer revisiting a QP it served
    /// before, which may have been destroyed meanwhile).
    pub fn lookup_qp(&self, qpn: u32) -> Option<QpRef> {
        self.core.qps.get(qpn).map(QpRef::from_core)
    }

    /// The numbers of the live QPs (for counters and diagnostics).
    pub fn qp_numbers(&self) -> Vec<u32> {
        self.core.qps.live_numbers()
    }

    /// Network-facing lookup of an SRQ by number (XRC packets name their SRQ). Misses count
    /// in [`Counters::unknown_srqn_drops`].
    pub fn srq_for_packet(&self, srqn: u32) -> Option<SrqRef> {
        let found = self.core.srqs.get(srqn).map(SrqRef::from_core);
        if found.is_none() {
            self.core.unknown_srqn.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Network-facing lookup of a memory region by L_Key or R_Key. Misses count in
    /// [`Counters::unknown_key_lookups`]. The caller still checks the access with
    /// [`crate::mr::MrCore::check_local`] / [`crate::mr::MrCore::check_remote`].
    pub fn mr_for_key(&self, key: u32) -> Option<MrRef> {
        let found = self
            .core
            .mrs
            .get(crate::mr::key_index(key))
            .filter(|e| e.mr.lkey() == key || e.mr.rkey() == key)
            .map(MrRef::from_entry);
        if found.is_none() {
            self.core.unknown_key.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// The transport engine counters of every QP of this context released so far, summed
    /// (a device's totals are these plus its live QPs').
    pub fn retired_engine_counters(&self) -> uroce_proto::engine::EngineCounters {
        self.core
            .retired_engines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        let (raised, dropped) = self.core.events.stats();
        Counters {
            unknown_qpn_drops: self.core.unknown_qpn.load(Ordering::Relaxed),
            unknown_srqn_drops: self.core.unknown_srqn.load(Ordering::Relaxed),
            unknown_key_lookups: self.core.unknown_key.load(Ordering::Relaxed),
            events_raised: raised,
            events_dropped: dropped,
            cq_overruns: self.core.cq_overruns.load(Ordering::Relaxed),
        }
    }

    /// Counts of live objects per kind. An object counts until it is released (its last
    /// reference dropped), so after every handle was destroyed all counts are zero.
    pub fn live_objects(&self) -> LiveObjects {
        let l = &self.core.live;
        LiveObjects {
            pds: get(&l.pds),
            cqs: get(&l.cqs),
            channels: get(&l.channels),
            xrcds: get(&l.xrcds),
            qps: get(&l.qps),
            srqs: get(&l.srqs),
            mrs: get(&l.mrs),
            ahs: get(&l.ahs),
        }
    }

    /// Numbers reserved in the (QP, SRQ, MR) tables: live plus unpublished-not-released.
    pub fn table_sizes(&self) -> (usize, usize, usize) {
        (
            self.core.qps.len(),
            self.core.srqs.len(),
            self.core.mrs.len(),
        )
    }

    /// How long destroys wait for outstanding references before failing with
    /// [`DestroyError::InUse`].
    pub fn destroy_timeout(&self) -> Duration {
        self.core.destroy_timeout()
    }

    /// Sets the destroy timeout (see [`Context::destroy_timeout`]).
    pub fn set_destroy_timeout(&self, timeout: Duration) {
        let us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
        self.core.destroy_timeout_us.store(us, Ordering::Relaxed);
    }

    /// Test hook: moves the QPN allocator's cursor (see [`Table::set_cursor`]).
    #[doc(hidden)]
    pub fn set_qpn_cursor(&self, qpn: u32) {
        self.core.qps.set_cursor(qpn);
    }

    /// Test hook: the strong reference count of the context's shared state.
    #[doc(hidden)]
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.core)
    }

    /// Closes the context (`ibv_close_device`). Fails with [`DestroyError::Busy`] while PDs,
    /// CQs, completion channels or XRC domains created from it are alive.
    pub fn close(self) -> Result<(), (Context, DestroyError)> {
        let l = &self.core.live;
        let children = crate::error::Children {
            pds: get(&l.pds),
            cqs: get(&l.cqs),
            channels: get(&l.channels),
            xrcds: get(&l.xrcds),
            ..Default::default()
        };
        if !children.is_empty() {
            return Err((
                self,
                DestroyError::Busy {
                    object: ObjectKind::Context,
                    children,
                },
            ));
        }
        drop(self);
        Ok(())
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.core.events.shutdown();
        self.core.events.purge(|_| true);
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.core.device.name())
            .field("live", &self.live_objects())
            .finish()
    }
}
