//! [`SimNet`]: a deterministic network of engines in one process.
//!
//! Nodes have an IP address (`127.0.0.x` from [`SimNet::add_node`], `fd00::x` from
//! [`SimNet::add_node_v6`]; nothing ever leaves the process), a [`TestMemory`] and a shared
//! receive queue ([`TestSrq`]). QPs (any `uroce_proto::engine::Engine`: the real engines,
//! `Box<dyn Engine>`, and the simulator's own test fakes) are registered per node by QPN, either connected to a
//! peer node ([`SimNet::add_qp`]: packets from any other address are dropped, as a
//! connected QP's checks would) or open to any sender ([`SimNet::add_datagram_qp`], for
//! UD and GSI). Every direction between two nodes is a link with its own [`LinkConfig`]
//! (loss, duplication, reordering, bit corruption, delay) and an optional packet filter
//! for scenario tests.
//!
//! Routing is per packet, as on a real network: each
//! [`Transmit`](uroce_proto::engine::Transmit) goes to the node whose address is its `dst`
//! (whatever the QP was registered with), and the receiving QP gets
//! an [`Arrival`] with the real source and destination addresses and the IP header's
//! traffic class, hop limit and flow label.
//!
//! # What one packet goes through
//! 1. The engine's `poll_transmit` writes BTH..ICRC (ICRC zero) and names the destination
//!    address. The sim checks that the packet parses (an engine that emits garbage is a
//!    [`SimError::InvalidTransmit`]) and finds the node with that address (none, or one of
//!    the other address family: dropped as [`DropReason::Unroutable`]).
//! 2. The IPv4/IPv6 and UDP headers are built with `uroce_wire::ip::roce_headers` (what a Linux
//!    UDP socket with `IP_PMTUDISC_DO` sends) and the ICRC sealed with `icrc::seal`.
//! 3. The link: the filter's [`Verdict`], then loss, duplication, reordering and a flip of
//!    one random bit anywhere in the IP datagram, each drawn from the seeded RNG.
//! 4. At delivery time the receiving node does what a host would: parse the IP/UDP
//!    headers, check the IPv4 header checksum and the (zero) UDP checksum, the port,
//!    the ICRC, then `PacketRepr::parse`, route by DestQP and call the QP's `handle_packet`
//!    with the [`Arrival`] (whether the source is a connected QP's peer is the engine's to
//!    check, as on a host). Every drop is counted in [`Stats`] by reason.
//!
//! A flipped bit is caught by one of these checks except in the fields the ICRC masks
//! *and* no other check covers: BTH byte 4 (FECN, BECN, reserved bits). Those packets are
//! delivered (as a switch's ECN marking would be) and counted in
//! [`Stats::corrupted_delivered`].
//!
//! # Time
//! Virtual: [`SimNet::step`] jumps to the earliest pending event (a delivery or an engine
//! deadline from `poll_timeout`) and processes it; nothing ever sleeps. Everything is
//! ordered by (time, sequence number), so a run is a pure function of the seed, the
//! configuration and what the test does.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use thiserror::Error;
use uroce_proto::engine::{Arrival, Engine};
use uroce_proto::rc::{CqKind, Env, QpEvent, XrcSrqError, XrcSrqs};
use uroce_proto::time::Instant;
use uroce_proto::wr::{RecvWr, WorkCompletion};
use uroce_wire::ip::{self, Datagram, Endpoints};
use uroce_wire::{icrc, PacketRepr, WireError};

use crate::memory::TestMemory;
use crate::trace::{DropReason, Micros, PacketSummary, Trace, TraceEntry, TraceEvent, NO_NODE};
pub use uroce_proto::testing::TestSrq;

mod run;
mod transmit;

/// Size of the buffer handed to `poll_transmit`: the engine contract's minimum,
/// 4096 + 64 bytes, so that an engine that needs more is caught.
pub const TRANSMIT_BUF_LEN: usize = 4096 + 64;

/// The engine environment over a node: its memory, its SRQ (an engine takes receive
/// WQEs from the SRQ only when it was configured to use one) and its XRC SRQs (used only
/// by XRC target QPs).
fn engine_env<'a>(node: &'a mut NodeEnv<'_>) -> Env<'a> {
    Env {
        mem: node.mem,
        srq: Some(&mut *node.srq),
        xrc: Some(&mut *node.xrc),
    }
}

/// A node's XRC SRQs (IBA Vol 1 Annex A14), each with the XRC domain it belongs to, and
/// the domain of the node's XRC target QPs. [`XrcSrqs::select`] refuses an unknown number
/// and an SRQ of another domain. (The simulator's memory has no protection domains, so
/// the PD of the selected SRQ is not modelled.)
#[derive(Debug, Clone, Default)]
pub struct SimXrc {
    /// The XRC domain the node's XRC target QPs belong to.
    pub target_domain: u32,
    srqs: BTreeMap<u32, (u32, TestSrq)>,
    current: Option<u32>,
    /// Successful selections, per SRQ number (tests check where packets were steered).
    pub selected: BTreeMap<u32, u64>,
}

impl SimXrc {
    /// Adds (or replaces) XRC SRQ `srqn` in `domain`.
    pub fn add_srq(&mut self, srqn: u32, domain: u32) {
        self.srqs.insert(srqn, (domain, TestSrq::default()));
    }

    /// Posts a receive WR on XRC SRQ `srqn`; `false` if there is no such SRQ.
    pub fn post(&mut self, srqn: u32, wr: RecvWr) -> bool {
        match self.srqs.get_mut(&srqn) {
            Some((_, q)) => {
                q.post(wr);
                true
            }
            None => false,
        }
    }

    /// Receive WRs waiting on `srqn` (0 if none exists).
    pub fn len(&self, srqn: u32) -> usize {
        self.srqs.get(&srqn).map_or(0, |(_, q)| q.len())
    }
}

impl XrcSrqs for SimXrc {
    fn select(&mut self, srqn: u32) -> Result<(), XrcSrqError> {
        self.current = None;
        match self.srqs.get(&srqn) {
            None => Err(XrcSrqError::Unknown(srqn)),
            Some((d, _)) if *d != self.target_domain => Err(XrcSrqError::OtherDomain(srqn)),
            Some(_) => {
                self.current = Some(srqn);
                *self.selected.entry(srqn).or_default() += 1;
                Ok(())
            }
        }
    }

    fn take(&mut self) -> Option<RecvWr> {
        let srqn = self.current?;
        self.srqs.get_mut(&srqn).and_then(|(_, q)| q.take())
    }
}

/// What an engine call may touch on its node besides the QP itself.
pub struct NodeEnv<'a> {
    /// The node's memory.
    pub mem: &'a TestMemory,
    /// The node's shared receive queue.
    pub srq: &'a mut TestSrq,
    /// The node's XRC SRQs.
    pub xrc: &'a mut SimXrc,
}

/// A QP's address in the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QpId {
    /// Node index.
    pub node: usize,
    /// QP number on that node.
    pub qpn: u32,
}

impl fmt::Display for QpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} qp {:#x}", self.node, self.qpn)
    }
}

/// The random behaviour of one direction of a link. All probabilities are per packet and
/// must lie in `0.0..=1.0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkConfig {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet is delivered twice (the copy takes its own delay).
    pub dup: f64,
    /// Probability that a copy is held back by up to `jitter` extra (later packets
    /// overtake it). The others keep their order.
    pub reorder: f64,
    /// Probability that one random bit of a copy (anywhere in the IP datagram) flips.
    pub corrupt: f64,
    /// Fixed one-way delay.
    pub delay: Duration,
    /// The largest extra delay of a reordered copy (uniform in `(0, jitter]`; when zero,
    /// `max(delay, 10 µs)` is used so that `reorder` always reorders).
    pub jitter: Duration,
}

impl LinkConfig {
    /// A lossless, in-order link with zero delay.
    pub const PERFECT: LinkConfig = LinkConfig {
        loss: 0.0,
        dup: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        delay: Duration::ZERO,
        jitter: Duration::ZERO,
    };

    /// A perfect link with a fixed `delay`.
    pub const fn with_delay(delay: Duration) -> LinkConfig {
        LinkConfig {
            delay,
            ..LinkConfig::PERFECT
        }
    }

    fn validate(&self) -> Result<(), SimError> {
        for (name, p) in [
            ("loss", self.loss),
            ("dup", self.dup),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(SimError::BadProbability { name, value: p });
            }
        }
        Ok(())
    }
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig::PERFECT
    }
}

/// What a link filter decides for one packet (before the random link model applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it on.
    Deliver,
    /// Drop it.
    Drop,
    /// Deliver it twice.
    Duplicate,
    /// Deliver it this much later than the link would.
    Delay(Duration),
}

/// A per-link packet filter: gets each packet and its 0-based index among the packets
/// sent on this link.
pub type Filter = Box<dyn FnMut(&PacketRepr<'_>, u64) -> Verdict>;

/// Counters of a [`SimNet`] (cumulative).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Steps processed.
    pub steps: u64,
    /// Virtual time reached, in nanoseconds.
    pub now_nanos: u64,
    /// Packets the engines emitted.
    pub transmitted: u64,
    /// Bytes (BTH..ICRC) the engines emitted.
    pub transmitted_bytes: u64,
    /// Packets the random link model lost.
    pub lost: u64,
    /// Packets a filter dropped.
    pub filtered: u64,
    /// Extra copies made (random duplication and filter `Duplicate`).
    pub duplicated: u64,
    /// Copies held back for reordering.
    pub reordered: u64,
    /// Copies with a flipped bit.
    pub corrupted: u64,
    /// Corrupted copies that were still delivered (the bit was in BTH byte 4, which the
    /// ICRC masks).
    pub corrupted_delivered: u64,
    /// Copies handed to an engine.
    pub delivered: u64,
    /// Drops because the IP/UDP headers did not parse.
    pub bad_ip: u64,
    /// Drops for a bad IPv4 header checksum.
    pub ip_checksum: u64,
    /// Drops for a non-zero UDP checksum.
    pub udp_checksum: u64,
    /// Drops for a port other than 4791.
    pub not_roce: u64,
    /// Drops for an ICRC mismatch.
    pub icrc: u64,
    /// Drops because `PacketRepr::parse` refused the packet.
    pub parse: u64,
    /// Drops for an unknown destination node or QP.
    pub unroutable: u64,
    /// `handle_timeout` calls.
    pub timeouts: u64,
    /// Packets injected by the test.
    pub injected: u64,
}

/// Why a simulation run stopped without reaching its condition.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum SimError {
    /// `max_steps` steps ran and the condition still did not hold.
    #[error("condition not reached after {steps} steps (virtual time {})", Micros(*now))]
    StepLimit {
        /// Steps run.
        steps: u64,
        /// Virtual time then.
        now: Instant,
    },
    /// The next event lies beyond the allowed virtual time.
    #[error("condition not reached by virtual time {} (next event at {})", Micros(*limit), Micros(*next))]
    TimeLimit {
        /// The time limit.
        limit: Instant,
        /// The next pending event.
        next: Instant,
    },
    /// Nothing is pending (no packet in flight, no engine deadline) and the condition does
    /// not hold: it never will.
    #[error("network idle at virtual time {} and the condition does not hold", Micros(*now))]
    Stalled {
        /// Virtual time.
        now: Instant,
    },
    /// An engine emitted a packet that does not parse.
    #[error("{qp} emitted an invalid packet ({len} bytes): {error}")]
    InvalidTransmit {
        /// The QP.
        qp: QpId,
        /// Length it reported.
        len: usize,
        /// Why it does not parse.
        error: WireError,
    },
    /// An engine reported a length beyond the buffer it was given.
    #[error("{qp} reported a {len}-byte packet in a {buf}-byte buffer")]
    TransmitOverflow {
        /// The QP.
        qp: QpId,
        /// Length reported.
        len: usize,
        /// Buffer length.
        buf: usize,
    },
    /// An engine kept transmitting without time advancing.
    #[error("{qp} emitted more than {limit} packets at one instant")]
    TransmitFlood {
        /// The QP.
        qp: QpId,
        /// The limit.
        limit: u64,
    },
    /// An engine's deadline stayed at or before `now` after `handle_timeout`, many times
    /// in a row.
    #[error("{qp}: deadline {} still due after {fires} handle_timeout calls", Micros(*at))]
    TimerStuck {
        /// The QP.
        qp: QpId,
        /// Its deadline.
        at: Instant,
        /// Calls made at that instant.
        fires: u64,
    },
    /// No such node.
    #[error("no node {0}")]
    UnknownNode(usize),
    /// No such QP.
    #[error("no {0}")]
    UnknownQp(QpId),
    /// A QP with this number exists already on the node.
    #[error("{0} exists already")]
    DuplicateQp(QpId),
    /// A link probability outside `0..=1`.
    #[error("link {name} probability {value} is not in 0..=1")]
    BadProbability {
        /// Which one.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// Building a datagram failed (a packet too long for IPv4).
    #[error("building a datagram failed: {0}")]
    Wire(WireError),
    /// More than 254 nodes (addresses are 127.0.0.x or fd00::x).
    #[error("at most 254 nodes")]
    TooManyNodes,
    /// A node with this address exists already.
    #[error("a node with address {0} exists already")]
    DuplicateAddr(IpAddr),
}

struct QpSlot<E: Engine> {
    ep: E,
    completions: Vec<(CqKind, WorkCompletion)>,
    events: Vec<QpEvent>,
}

struct Node<E: Engine> {
    addr: IpAddr,
    mem: TestMemory,
    srq: TestSrq,
    xrc: SimXrc,
    qps: BTreeMap<u32, QpSlot<E>>,
}

#[derive(Default)]
struct Link {
    cfg: LinkConfig,
    filter: Option<Filter>,
    sent: u64,
}

/// A copy of a datagram on its way.
struct InFlight {
    at: Instant,
    seq: u64,
    id: u64,
    copy: u8,
    src: usize,
    dst: usize,
    corrupted: bool,
    summary: PacketSummary,
    datagram: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    /// Reversed: the earliest (time, sequence) is the greatest, for the max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Limits that turn engine misbehaviour into errors instead of endless loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most packets one QP may emit in one flush (at one instant).
    pub max_burst: u64,
    /// Most `handle_timeout` calls for one QP at one instant.
    pub max_timer_fires: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_burst: 1 << 20,
            max_timer_fires: 1000,
        }
    }
}

/// The earliest pending event.
enum Next {
    Delivery(Instant),
    Timer(Instant, QpId),
}

/// A simulated network of engines of type `E`.
pub struct SimNet<E: Engine> {
    now: Instant,
    rng: ChaCha8Rng,
    seed: u64,
    nodes: Vec<Node<E>>,
    links: BTreeMap<(usize, usize), Link>,
    queue: BinaryHeap<InFlight>,
    seq: u64,
    next_id: u64,
    stats: Stats,
    trace: Trace,
    limits: Limits,
    buf: Vec<u8>,
    /// (QP, instant, count) of the last timer fired, to catch stuck deadlines.
    timer_streak: Option<(QpId, Instant, u64)>,
    strict: bool,
}

impl<E: Engine> fmt::Debug for SimNet<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimNet")
            .field("now", &self.now)
            .field("seed", &self.seed)
            .field("nodes", &self.nodes.len())
            .field("in_flight", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<E: Engine> SimNet<E> {
    /// An empty network at virtual time zero whose randomness comes from `seed`.
    pub fn new(seed: u64) -> SimNet<E> {
        SimNet {
            now: Instant::ZERO,
            rng: ChaCha8Rng::seed_from_u64(seed),
            seed,
            nodes: Vec::new(),
            links: BTreeMap::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            next_id: 0,
            stats: Stats::default(),
            trace: Trace::default(),
            limits: Limits::default(),
            buf: vec![0; TRANSMIT_BUF_LEN],
            timer_streak: None,
            strict: true,
        }
    }

    /// The seed the network was made with.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            now_nanos: self.now.as_nanos(),
            ..self.stats
        }
    }

    /// The packet trace.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Keeps at most `limit` trace entries (the soak keeps a tail only).
    pub fn set_trace_limit(&mut self, limit: usize) {
        self.trace.set_limit(limit);
    }

    /// Changes the misbehaviour limits.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// When `strict` (the default), an engine that emits an unparseable packet stops the
    /// run with [`SimError::InvalidTransmit`]; otherwise such packets are sent anyway
    /// (and dropped by the receiver's parser).
    pub fn set_strict(&mut self, strict: bool) {
        self.strict = strict;
    }

    /// Adds a node with address `127.0.0.<index + 1>`; returns its index.
    ///
    /// # Errors
    /// [`SimError::TooManyNodes`] beyond 254 nodes, [`SimError::DuplicateAddr`] if a node
    /// added with [`SimNet::add_node_at`] has that address.
    pub fn add_node(&mut self) -> Result<usize, SimError> {
        let host = self.next_host()?;
        self.add_node_at(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)))
    }

    /// Adds a node with the IPv6 address `fd00::<index + 1>` (a unique-local address;
    /// nothing leaves the process); returns its index. IPv6 nodes talk to IPv6 nodes
    /// only.
    ///
    /// # Errors
    /// As [`SimNet::add_node`].
    pub fn add_node_v6(&mut self) -> Result<usize, SimError> {
        let host = self.next_host()?;
        self.add_node_at(IpAddr::V6(Ipv6Addr::new(
            0xfd00,
            0,
            0,
            0,
            0,
            0,
            0,
            host.into(),
        )))
    }

    /// Adds a node with the given address; returns its index.
    ///
    /// # Errors
    /// [`SimError::TooManyNodes`] beyond 254 nodes, [`SimError::DuplicateAddr`].
    pub fn add_node_at(&mut self, addr: IpAddr) -> Result<usize, SimError> {
        let index = self.nodes.len();
        self.next_host()?;
        if self.node_by_addr(addr).is_some() {
            return Err(SimError::DuplicateAddr(addr));
        }
        // Distinct address bases per node make cross-node address mix-ups visible.
        let base = TestMemory::DEFAULT_BASE + (index as u64) * 0x1000_0000;
        self.nodes.push(Node {
            addr,
            mem: TestMemory::with_base(base),
            srq: TestSrq::default(),
            xrc: SimXrc::default(),
            qps: BTreeMap::new(),
        });
        Ok(index)
    }

    /// The host part of the next node's default address (index + 1, at most 254).
    fn next_host(&self) -> Result<u8, SimError> {
        u8::try_from(self.nodes.len() + 1)
            .ok()
            .filter(|h| *h < 255)
            .ok_or(SimError::TooManyNodes)
    }

    /// The node with address `addr`.
    pub fn node_by_addr(&self, addr: IpAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.addr == addr)
    }

    fn node(&self, node: usize) -> Result<&Node<E>, SimError> {
        self.nodes.get(node).ok_or(SimError::UnknownNode(node))
    }

    fn node_mut(&mut self, node: usize) -> Result<&mut Node<E>, SimError> {
        self.nodes.get_mut(node).ok_or(SimError::UnknownNode(node))
    }

    /// The IP address of a node.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`].
    pub fn addr(&self, node: usize) -> Result<IpAddr, SimError> {
        Ok(self.node(node)?.addr)
    }

    /// A node's memory.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`].
    pub fn memory(&self, node: usize) -> Result<&TestMemory, SimError> {
        Ok(&self.node(node)?.mem)
    }

    /// A node's shared receive queue.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`].
    pub fn srq_mut(&mut self, node: usize) -> Result<&mut TestSrq, SimError> {
        Ok(&mut self.node_mut(node)?.srq)
    }

    /// A node's XRC SRQs and target domain.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`].
    pub fn xrc_mut(&mut self, node: usize) -> Result<&mut SimXrc, SimError> {
        Ok(&mut self.node_mut(node)?.xrc)
    }

    /// Registers `ep` on `node`, connected to `peer` (which must exist). What it sends
    /// goes wherever each packet's [`Transmit::dst`](uroce_proto::engine::Transmit::dst) says (a connected engine names its
    /// peer's address); what it receives comes from anyone, and a connected engine drops
    /// what is not from its peer.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`] for either node, [`SimError::DuplicateQp`].
    pub fn add_qp(&mut self, node: usize, peer: usize, ep: E) -> Result<QpId, SimError> {
        self.node(peer)?;
        self.insert_qp(node, ep)
    }

    /// Registers `ep` on `node`, accepting packets from any node (a UD or GSI QP).
    ///
    /// # Errors
    /// [`SimError::UnknownNode`], [`SimError::DuplicateQp`].
    pub fn add_datagram_qp(&mut self, node: usize, ep: E) -> Result<QpId, SimError> {
        self.insert_qp(node, ep)
    }

    fn insert_qp(&mut self, node: usize, ep: E) -> Result<QpId, SimError> {
        let qpn = ep.qpn();
        let id = QpId { node, qpn };
        let n = self.node_mut(node)?;
        if n.qps.contains_key(&qpn) {
            return Err(SimError::DuplicateQp(id));
        }
        n.qps.insert(
            qpn,
            QpSlot {
                ep,
                completions: Vec::new(),
                events: Vec::new(),
            },
        );
        Ok(id)
    }

    fn slot(&self, qp: QpId) -> Result<&QpSlot<E>, SimError> {
        self.node(qp.node)?
            .qps
            .get(&qp.qpn)
            .ok_or(SimError::UnknownQp(qp))
    }

    fn slot_mut(&mut self, qp: QpId) -> Result<&mut QpSlot<E>, SimError> {
        self.node_mut(qp.node)?
            .qps
            .get_mut(&qp.qpn)
            .ok_or(SimError::UnknownQp(qp))
    }

    /// The engine of a QP.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn qp(&self, qp: QpId) -> Result<&E, SimError> {
        Ok(&self.slot(qp)?.ep)
    }

    /// The engine of a QP, mutably (to post work requests or change its state; what it
    /// wants to send goes out at the next step).
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn qp_mut(&mut self, qp: QpId) -> Result<&mut E, SimError> {
        Ok(&mut self.slot_mut(qp)?.ep)
    }

    /// Calls `f` with the engine, its node's environment and the current time (for engine
    /// methods that need memory outside packet handling).
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn with_qp<T>(
        &mut self,
        qp: QpId,
        f: impl FnOnce(&mut E, &mut NodeEnv<'_>, Instant) -> T,
    ) -> Result<T, SimError> {
        let now = self.now;
        let node = self
            .nodes
            .get_mut(qp.node)
            .ok_or(SimError::UnknownNode(qp.node))?;
        let Node {
            mem, srq, xrc, qps, ..
        } = node;
        let slot = qps.get_mut(&qp.qpn).ok_or(SimError::UnknownQp(qp))?;
        let mut env = NodeEnv { mem, srq, xrc };
        Ok(f(&mut slot.ep, &mut env, now))
    }

    /// Completions collected from a QP so far, in the order it reported them.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn completions(&self, qp: QpId) -> Result<&[(CqKind, WorkCompletion)], SimError> {
        Ok(&self.slot(qp)?.completions)
    }

    /// Takes the completions collected from a QP so far.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn take_completions(
        &mut self,
        qp: QpId,
    ) -> Result<Vec<(CqKind, WorkCompletion)>, SimError> {
        Ok(std::mem::take(&mut self.slot_mut(qp)?.completions))
    }

    /// The completions collected from a QP so far, to edit.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn completions_mut(
        &mut self,
        qp: QpId,
    ) -> Result<&mut Vec<(CqKind, WorkCompletion)>, SimError> {
        Ok(&mut self.slot_mut(qp)?.completions)
    }

    /// Asynchronous events collected from a QP so far.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn events(&self, qp: QpId) -> Result<&[QpEvent], SimError> {
        Ok(&self.slot(qp)?.events)
    }

    /// Takes the events collected from a QP so far.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn take_events(&mut self, qp: QpId) -> Result<Vec<QpEvent>, SimError> {
        Ok(std::mem::take(&mut self.slot_mut(qp)?.events))
    }

    /// Sets the random model of the link `src → dst`.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`], [`SimError::BadProbability`].
    pub fn set_link(&mut self, src: usize, dst: usize, cfg: LinkConfig) -> Result<(), SimError> {
        self.node(src)?;
        self.node(dst)?;
        cfg.validate()?;
        self.links.entry((src, dst)).or_default().cfg = cfg;
        Ok(())
    }

    /// Sets both directions between `a` and `b` to `cfg`.
    ///
    /// # Errors
    /// As [`SimNet::set_link`].
    pub fn set_links(&mut self, a: usize, b: usize, cfg: LinkConfig) -> Result<(), SimError> {
        self.set_link(a, b, cfg)?;
        self.set_link(b, a, cfg)
    }

    /// Installs (or with `None` removes) the packet filter of the link `src → dst`.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`].
    pub fn set_filter(
        &mut self,
        src: usize,
        dst: usize,
        filter: Option<Filter>,
    ) -> Result<(), SimError> {
        self.node(src)?;
        self.node(dst)?;
        self.links.entry((src, dst)).or_default().filter = filter;
        Ok(())
    }

    /// Packets sent so far on the link `src → dst` (the index the filter sees next).
    pub fn link_sent(&self, src: usize, dst: usize) -> u64 {
        self.links.get(&(src, dst)).map_or(0, |l| l.sent)
    }

    /// Packets (copies) still in flight.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// True when no packet is in flight and every engine reports idle.
    pub fn is_quiet(&self) -> bool {
        self.queue.is_empty()
            && self
                .nodes
                .iter()
                .all(|n| n.qps.values().all(|s| s.ep.is_idle()))
    }
}

/// What the receiving socket reports of a datagram: its addresses and the IP header's
/// traffic class, hop limit, flow label and (IPv4) Identification.
fn arrival_of(d: &Datagram<'_>) -> Arrival {
    let h = d.ip_header;
    let byte = |i: usize| h.get(i).copied().unwrap_or(0);
    let mut a = Arrival::new(d.src, d.dst);
    if d.src.is_ipv4() {
        a.traffic_class = byte(1);
        a.ipv4_id = u16::from_be_bytes([byte(4), byte(5)]);
        a.hop_limit = byte(8);
    } else {
        a.traffic_class = (byte(0) << 4) | (byte(1) >> 4);
        a.flow_label =
            (u32::from(byte(1) & 0x0f) << 16) | (u32::from(byte(2)) << 8) | u32::from(byte(3));
        a.hop_limit = byte(7);
    }
    a
}

/// The UDP source port of a QP: one fixed port per QP in `0xC000..=0xFFFF`.
pub fn source_port(qpn: u32) -> u16 {
    // invariant: the value is masked to 14 bits, so it fits a u16.
    0xC000 | (qpn & 0x3FFF) as u16
}

fn empty_bth() -> uroce_wire::bth::Repr {
    uroce_wire::bth::Repr {
        opcode: 0xFF,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp: 0,
        ack_req: false,
        psn: uroce_wire::Psn::ZERO,
    }
}

#[cfg(test)]
mod tests;
