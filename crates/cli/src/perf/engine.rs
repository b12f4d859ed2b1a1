//! The verbs side of `uroce perf`: per-test resources (PD, CQ, QPs, memory regions), QP
//! bring-up from the peer's out-of-band data, and the test loops of both roles.
//!
//! # Buffers
//! Each QP has one memory region split into `local_slots` message slots (what this side
//! sends from or reads/fetches into) followed by `target_slots` slots (what the peer
//! writes, reads or updates; receive buffers of SEND tests). Slots are `size` bytes
//! rounded up to 64. Without `--verify` one slot of each suffices (perftest reuses one
//! buffer too); with it every message in flight has its own slot, so no buffer is
//! rewritten before the operation that uses it completed, and the number of outstanding
//! WRs is limited to the slots (at most [`VERIFY_MEM`] bytes of slots per side). The
//! region's memory is of the `--memory` kind ([`super::memory`]).
//!
//! # Completions
//! One CQ per test takes the send and receive completions of all its QPs; `wr_id` is
//! `index << 8 | qp`. Busy mode polls it in a loop (an empty poll drives the network);
//! event mode arms it, sleeps on the completion channel, acknowledges and polls — only
//! when the CQ holds completions, so that the device's progress thread, not this one,
//! keeps moving the packets. `write_lat` learns of the peer's WRITE by polling the counter
//! word of its buffer in both modes (an RDMA WRITE makes no completion at the target). Every
//! wait gives up after the run's timeout without a completion, and looks for an `Abort`
//! from the peer every few milliseconds.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use uroce_net::NetDevice;
use uroce_verbs::{
    rc_init_attr, AccessFlags, AtomicInfo, CompChannel, Cq, Gid, Pd, Qp, QpCap, QpInitAttr, QpType,
    RcConnect, RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, Sge, WaitError, WcStatus,
    WorkCompletion,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

use super::memory::{MemoryKind, Region};
use super::oob::{Oob, QpInfo};
use super::pattern::{self, Dir};
use super::plan::{Kind, Mode, Op, TestSpec};
use super::progress::Progress;
use super::stats::{LatStats, Measured};

/// Receive buffers kept posted per QP in `send_lat`.
pub const LAT_RECV_SLOTS: usize = 4;
/// Most bytes of message slots per QP and side when verifying.
pub const VERIFY_MEM: usize = 16 << 20;
/// Slot alignment.
const SLOT_ALIGN: usize = 64;
/// Outstanding RDMA READ / atomic operations per QP, each direction.
const RD_ATOMIC: u8 = 16;
/// RNR NAK timer code: 0.01 ms.
const MIN_RNR_TIMER: u8 = 1;
/// Local ACK timeout code: 4.096 µs × 2^14 ≈ 67 ms.
const ACK_TIMEOUT: u8 = 14;
/// Empty polls between looks at the clock and the peer.
const SPIN_CHECK: u32 = 256;

/// Which end of the exchange this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Initiates every test and measures.
    Client,
    /// Answers.
    Server,
}

impl Role {
    /// The direction of the data this side produces.
    fn dir(self) -> Dir {
        match self {
            Role::Client => Dir::ToServer,
            Role::Server => Dir::ToClient,
        }
    }

    /// The direction of the data the peer produces.
    fn peer_dir(self) -> Dir {
        match self {
            Role::Client => Dir::ToClient,
            Role::Server => Dir::ToServer,
        }
    }
}

/// How one QP's memory region is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Message size.
    pub size: usize,
    /// Distance between slots.
    pub stride: usize,
    /// Slots this side sends from / receives results into.
    pub local_slots: usize,
    /// Slots the peer accesses (or receive buffers).
    pub target_slots: usize,
    /// Most WRs outstanding per QP in a bandwidth test.
    pub window: usize,
    /// Receives kept posted per QP (SEND tests).
    pub recv_window: usize,
}

impl Layout {
    /// The layout both sides use for `spec`.
    pub fn for_spec(spec: &TestSpec) -> Layout {
        let size = spec.size as usize;
        let stride = size.max(8).next_multiple_of(SLOT_ALIGN);
        let fit = (VERIFY_MEM / stride).max(1);
        let tx = spec.tx_depth as usize;
        let rx = spec.rx_depth as usize;
        let iters = usize::try_from(spec.iters).unwrap_or(usize::MAX);
        let v = spec.verify;
        let recv_window = match spec.test.kind {
            Kind::Lat => LAT_RECV_SLOTS,
            Kind::Bw if v => rx.min(fit),
            Kind::Bw => rx,
        };
        let (local_slots, target_slots, window) = match (spec.test.kind, spec.test.op) {
            (Kind::Lat, Op::Send) => (1, LAT_RECV_SLOTS, 1),
            (Kind::Lat, _) => (1, 1, 1),
            (Kind::Bw, Op::Atomic) => (tx, 1, tx),
            (Kind::Bw, Op::Send) if v => {
                let s = tx.min(fit);
                (s, rx.min(fit), s)
            }
            (Kind::Bw, _) if v => {
                let s = tx.min(fit);
                (s, iters.min(fit), s)
            }
            (Kind::Bw, _) => (1, 1, tx),
        };
        Layout {
            size,
            stride,
            local_slots,
            target_slots,
            window,
            recv_window,
        }
    }

    /// Offset of local slot `i`.
    pub fn local_off(&self, i: usize) -> usize {
        (i % self.local_slots) * self.stride
    }

    /// Offset of target slot `i`.
    pub fn target_off(&self, i: usize) -> usize {
        (self.local_slots + i % self.target_slots) * self.stride
    }

    /// Length of the region.
    pub fn len(&self) -> usize {
        (self.local_slots + self.target_slots) * self.stride
    }

    /// Offset of the iteration counter inside a `write_lat` message: the last 8-aligned
    /// word that lies wholly inside it. The counter is stored big-endian, so its first
    /// bytes are zero: packet dissectors that guess at payloads (an EtherType in the first
    /// two bytes) leave it alone.
    pub fn counter_off(&self) -> usize {
        (self.size - 8) & !7
    }
}

/// `wr_id` of message `index` on QP `qp`.
fn wr_id(qp: usize, index: u64) -> u64 {
    (index << 8) | qp as u64
}

/// The (QP, index) of a `wr_id`.
fn split_wr_id(id: u64) -> (usize, u64) {
    ((id & 0xff) as usize, id >> 8)
}

/// One QP with its memory region.
pub struct QpRes {
    /// The QP (dropped before its region).
    pub qp: Qp,
    /// Its buffer (memory of the run's `--memory` kind).
    pub mr: Region,
    /// Its first PSN.
    pub psn: u32,
}

/// Everything one test uses on one side.
pub struct Resources {
    /// The QPs (first, so they are released first).
    pub qps: Vec<QpRes>,
    /// The CQ of all send and receive completions.
    pub cq: Cq,
    /// Completion channel (event mode).
    pub channel: Option<CompChannel>,
    /// The protection domain (held for the QPs and regions).
    pub _pd: Pd,
    /// How each region is divided.
    pub layout: Layout,
    /// The peer's QPs, once connected.
    pub peers: Vec<QpInfo>,
}

/// A PSN from the clock and the process id (24 bits).
fn random_psn(i: usize) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (pattern::mix(nanos ^ (u64::from(std::process::id()) << 32) ^ i as u64) & 0xff_ffff) as u32
}

impl Resources {
    /// Creates the CQ, PD, QPs and regions (of `memory`) of `spec` on `dev` and moves the
    /// QPs to INIT.
    pub fn create(dev: &NetDevice, spec: &TestSpec, memory: MemoryKind) -> Result<Resources> {
        let ctx = dev.context();
        let layout = Layout::for_spec(spec);
        let qps = spec.qps as usize;
        let channel = match spec.mode {
            Mode::Event => Some(
                ctx.create_comp_channel()
                    .context("creating a completion channel")?,
            ),
            Mode::Busy => None,
        };
        let max_cqe = ctx.query_device().max_cqe;
        let per_qp = spec.tx_depth as usize + spec.rx_depth as usize + LAT_RECV_SLOTS + 8;
        let cqe = u32::try_from(per_qp * qps).unwrap_or(u32::MAX).min(max_cqe);
        let cq = ctx
            .create_cq(cqe, channel.as_ref(), 0)
            .with_context(|| format!("creating a CQ of {cqe} entries"))?;
        let pd = ctx.alloc_pd().context("allocating a PD")?;
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let cap = QpCap {
            max_send_wr: spec.tx_depth.max(LAT_RECV_SLOTS as u32) + 1,
            max_recv_wr: spec.rx_depth.max(LAT_RECV_SLOTS as u32) + 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut list = Vec::with_capacity(qps);
        for i in 0..qps {
            let mr = Region::new(&pd, memory, layout.len(), access)?;
            let qp = pd
                .create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))
                .context("creating an RC QP")?;
            let (init, mask) = rc_init_attr(
                AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
            );
            qp.modify(&init, mask).context("moving the QP to INIT")?;
            list.push(QpRes {
                qp,
                mr,
                psn: random_psn(i),
            });
        }
        Ok(Resources {
            qps: list,
            cq,
            channel,
            _pd: pd,
            layout,
            peers: Vec::new(),
        })
    }

    /// What the peer needs to know about our QPs.
    pub fn info(&self, dev: &NetDevice) -> Vec<QpInfo> {
        let gid = std::net::Ipv6Addr::from(dev.gid().0).to_string();
        let mtu = dev.device().active_mtu().bytes();
        self.qps
            .iter()
            .map(|q| QpInfo {
                qpn: q.qp.qp_num(),
                psn: q.psn,
                rkey: q.mr.rkey(),
                addr: q.mr.iova() + self.layout.target_off(0) as u64,
                len: (self.layout.target_slots * self.layout.stride) as u64,
                gid: gid.clone(),
                mtu,
            })
            .collect()
    }

    /// Moves every QP through RTR to RTS towards the peer's QP of the same index.
    pub fn connect(&mut self, dev: &NetDevice, peers: Vec<QpInfo>) -> Result<()> {
        if peers.len() != self.qps.len() {
            bail!(
                "the peer announced {} QPs, {} expected",
                peers.len(),
                self.qps.len()
            );
        }
        let want = (self.layout.target_slots * self.layout.stride) as u64;
        let local_mtu = dev.device().active_mtu();
        for (q, p) in self.qps.iter().zip(&peers) {
            let ip: std::net::Ipv6Addr = p
                .gid
                .parse()
                .map_err(|_| anyhow!("the peer's GID {:?} is not an IPv6 address", p.gid))?;
            if p.len < want {
                bail!("the peer's buffer is {} bytes, {want} expected", p.len);
            }
            let peer_mtu = Pmtu::from_bytes(p.mtu)
                .ok_or_else(|| anyhow!("the peer's MTU {} is not an IB MTU", p.mtu))?;
            let mtu = if peer_mtu.bytes() < local_mtu.bytes() {
                peer_mtu
            } else {
                local_mtu
            };
            let c = RcConnect {
                path_mtu: mtu,
                rq_psn: Psn::new(p.psn & 0xff_ffff),
                sq_psn: Psn::new(q.psn),
                max_dest_rd_atomic: RD_ATOMIC,
                max_rd_atomic: RD_ATOMIC,
                min_rnr_timer: MIN_RNR_TIMER,
                timeout: ACK_TIMEOUT,
                ..RcConnect::new(Gid(ip.octets()).to_ip(), p.qpn)
            };
            q.qp.connect_rc_from_init(&c)
                .context("moving the QP to RTR and RTS")?;
        }
        self.peers = peers;
        Ok(())
    }
}

/// What a test produced on one side.
pub struct Outcome {
    /// The measurement (client only).
    pub measured: Option<Measured>,
    /// Whether this side ran data checks (and they passed: a failure is an error).
    pub checked: bool,
}

/// A test being run by one side.
pub struct Runner<'a> {
    res: &'a Resources,
    spec: &'a TestSpec,
    role: Role,
    oob: &'a mut Oob,
    progress: Progress,
    timeout: Duration,
    wcs: Vec<WorkCompletion>,
    scratch: Vec<u8>,
    expect: Vec<u8>,
    /// Send WRs posted and not yet known complete, per QP (latency tests).
    send_out: Vec<u64>,
    /// Receive completions seen, per QP.
    recvd: Vec<u64>,
    /// Receive WRs posted, per QP.
    recv_posted: Vec<u64>,
    /// Damage data on purpose (tests of the checks).
    corrupt: bool,
}

impl<'a> Runner<'a> {
    /// A runner for one test.
    pub fn new(
        res: &'a Resources,
        spec: &'a TestSpec,
        role: Role,
        oob: &'a mut Oob,
        progress: Progress,
    ) -> Runner<'a> {
        let q = res.qps.len();
        let timeout = oob.timeout();
        Runner {
            res,
            spec,
            role,
            oob,
            progress,
            timeout,
            wcs: vec![WorkCompletion::default(); 64],
            scratch: vec![0; spec.size as usize],
            expect: vec![0; spec.size as usize],
            send_out: vec![0; q],
            recvd: vec![0; q],
            recv_posted: vec![0; q],
            corrupt: false,
        }
    }

    /// Makes this (server) side damage data on purpose: one byte of every READ source
    /// after it is filled, and one byte or the value of every WRITE / atomic target
    /// before the final checks. Exists to test that the checks catch it.
    pub fn inject_corruption(&mut self) {
        self.corrupt = true;
    }

    /// Flips the bits of byte `off` of QP `i`'s region.
    fn damage(&self, i: usize, off: usize) -> Result<()> {
        let block = self.res.qps[i].mr.block();
        let mut b = [0u8; 1];
        block.copy_out(off, &mut b)?;
        block.copy_in(off, &[!b[0]])?;
        Ok(())
    }

    fn peer(&self, i: usize) -> &QpInfo {
        &self.res.peers[i]
    }

    fn sge(&self, i: usize, off: usize, len: usize) -> Sge {
        let mr = &self.res.qps[i].mr;
        Sge {
            addr: mr.iova() + off as u64,
            length: len as u32,
            lkey: mr.lkey(),
        }
    }

    fn layout(&self) -> Layout {
        self.res.layout
    }

    fn qps(&self) -> usize {
        self.res.qps.len()
    }

    /// Things to do before the "ready" barrier: post receives, fill READ sources, set
    /// atomic targets.
    pub fn prepare(&mut self) -> Result<()> {
        let l = self.layout();
        let t = self.spec.test;
        for i in 0..self.qps() {
            match (t.op, t.kind, self.role) {
                (Op::Send, Kind::Lat, _) => {
                    for _ in 0..LAT_RECV_SLOTS {
                        self.post_recv(i)?;
                    }
                }
                (Op::Send, Kind::Bw, Role::Server) => {
                    let n = (l.recv_window as u64).min(self.spec.iters);
                    for _ in 0..n {
                        self.post_recv(i)?;
                    }
                }
                (Op::Read, _, Role::Server) => {
                    for s in 0..l.target_slots {
                        let mut buf = vec![0u8; l.size];
                        pattern::fill(&mut buf, Dir::ToClient, s as u64, i as u32);
                        self.res.qps[i].mr.block().copy_in(l.target_off(s), &buf)?;
                    }
                    if self.corrupt {
                        self.damage(i, l.target_off(0) + l.size / 2)?;
                    }
                }
                (Op::Atomic, _, Role::Server) => {
                    self.res.qps[i]
                        .mr
                        .block()
                        .atomic_store(l.target_off(0), pattern::atomic_base(i as u32))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Posts the next receive of QP `i` into target slot (count mod slots).
    fn post_recv(&mut self, i: usize) -> Result<()> {
        let l = self.layout();
        let k = self.recv_posted[i];
        let sge = self.sge(i, l.target_off(k as usize), l.size);
        self.res.qps[i]
            .qp
            .post_recv(RecvWr::new(wr_id(i, k), vec![sge]))
            .with_context(|| format!("posting a receive on QP {i}"))?;
        self.recv_posted[i] += 1;
        Ok(())
    }

    /// Posts a send WR and counts it outstanding.
    fn post(&mut self, i: usize, wr: SendWr) -> Result<()> {
        let op = wr.opcode;
        self.res.qps[i]
            .qp
            .post_send(wr)
            .with_context(|| format!("posting {op:?} on QP {i}"))?;
        self.send_out[i] += 1;
        Ok(())
    }

    /// Fails if the peer sent `Abort`.
    fn check_peer(&mut self) -> Result<()> {
        self.oob.check_abort().map_err(anyhow::Error::from)
    }

    /// Polls without waiting (an empty poll still drives the network); returns how many
    /// completions are in `self.wcs`.
    fn try_poll(&mut self) -> Result<usize> {
        // In event mode the progress thread moves the packets. An empty poll would drive
        // the network from this thread and tell the progress thread that the application
        // busy-polls, which makes it ignore the socket for a while: so look first.
        if self.spec.mode == Mode::Event && self.res.cq.is_empty() {
            return Ok(0);
        }
        let n = self.res.cq.poll_into(&mut self.wcs);
        self.check_status(n)?;
        Ok(n)
    }

    fn check_status(&self, n: usize) -> Result<()> {
        for wc in &self.wcs[..n] {
            if wc.status != WcStatus::Success {
                let (i, idx) = split_wr_id(wc.wr_id);
                bail!(
                    "{}: QP {} (#{i}) work request {idx} ({:?}) completed with status {} ({})",
                    self.spec.test,
                    wc.qp_num,
                    wc.opcode,
                    wc.status.as_str(),
                    wc.status.as_u32()
                );
            }
        }
        Ok(())
    }

    /// Waits for at least one completion (busy or event mode), at most the timeout.
    fn wait(&mut self) -> Result<usize> {
        let mut deadline = Instant::now() + self.timeout;
        let mut spins = 0u32;
        let mut last_peer_check = Instant::now();
        loop {
            let n = self.try_poll()?;
            if n > 0 {
                return Ok(n);
            }
            match (&self.res.channel, self.spec.mode) {
                (Some(ch), Mode::Event) => {
                    self.res.cq.req_notify(false).context("arming the CQ")?;
                    let n = self.try_poll()?;
                    if n > 0 {
                        return Ok(n);
                    }
                    match ch.get_cq_event(Some(Duration::from_millis(10))) {
                        Ok(ev) => {
                            ev.ack();
                            deadline = Instant::now() + self.timeout;
                        }
                        Err(WaitError::Timeout) => {}
                        Err(e) => return Err(anyhow!("waiting for a CQ event: {e}")),
                    }
                }
                _ => {
                    spins += 1;
                    if spins % SPIN_CHECK != 0 {
                        continue;
                    }
                    // Give the CPU away now and then: on a small machine the peer and
                    // the progress thread need it too.
                    std::thread::yield_now();
                }
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    "{}: no completion for {:?} (the peer or the network stalled)",
                    self.spec.test,
                    self.timeout
                );
            }
            if now.duration_since(last_peer_check) >= Duration::from_millis(5) {
                last_peer_check = now;
                self.check_peer()?;
            }
        }
    }

    /// Accounts for completions in `self.wcs[..n]`: sends finish, receives are checked
    /// (SEND tests) and reposted.
    fn absorb(&mut self, n: usize) -> Result<()> {
        for k in 0..n {
            let wc = self.wcs[k];
            let (i, _) = split_wr_id(wc.wr_id);
            if i >= self.qps() {
                bail!("completion for unknown QP index {i}");
            }
            if wc.opcode.is_recv() {
                self.on_recv(i, wc.byte_len)?;
            } else {
                self.send_out[i] = self.send_out[i].saturating_sub(1);
            }
        }
        Ok(())
    }

    /// A receive completed on QP `i`.
    fn on_recv(&mut self, i: usize, byte_len: u32) -> Result<()> {
        let l = self.layout();
        let k = self.recvd[i];
        if self.spec.verify {
            if byte_len as usize != l.size {
                bail!(
                    "{}: QP #{i} message {k}: received {byte_len} bytes, {} sent",
                    self.spec.test,
                    l.size
                );
            }
            self.res.qps[i]
                .mr
                .block()
                .copy_out(l.target_off(k as usize), &mut self.scratch)?;
            pattern::check(&self.scratch, self.role.peer_dir(), k, i as u32).map_err(|m| {
                anyhow!("data mismatch: {} QP #{i} message {k}: {m}", self.spec.test)
            })?;
        }
        self.recvd[i] += 1;
        let more = match self.spec.test.kind {
            Kind::Lat => self.recv_posted[i] < self.spec.total(),
            Kind::Bw => self.recv_posted[i] < self.spec.iters,
        };
        if more {
            self.post_recv(i)?;
        }
        Ok(())
    }

    /// Waits until no send WR of QP `i` is outstanding.
    fn drain_sends(&mut self, i: usize) -> Result<()> {
        while self.send_out[i] > 0 {
            let n = self.wait()?;
            self.absorb(n)?;
        }
        Ok(())
    }

    /// Runs the test; the client measures.
    pub fn run(&mut self) -> Result<Outcome> {
        let t = self.spec.test;
        let measured = match (t.kind, t.op, self.role) {
            (Kind::Lat, Op::Send, _) => self.send_lat()?,
            (Kind::Lat, Op::Write, _) => self.write_lat()?,
            (Kind::Lat, _, Role::Client) => Some(self.rt_lat()?),
            (Kind::Bw, Op::Send, Role::Server) => {
                self.recv_bw()?;
                None
            }
            (Kind::Bw, _, Role::Client) => Some(self.bw()?),
            // Passive: the progress engine answers READs, WRITEs and atomics.
            _ => None,
        };
        self.progress.finish();
        Ok(Outcome {
            measured,
            checked: self.spec.verify,
        })
    }

    /// Checks after the client's "done": final atomic values and written slots.
    pub fn final_checks(&mut self) -> Result<()> {
        if !self.spec.verify || self.role != Role::Server {
            return Ok(());
        }
        let l = self.layout();
        let t = self.spec.test;
        for i in 0..self.qps() {
            if self.corrupt && matches!(t.op, Op::Atomic | Op::Write) {
                self.damage(i, l.target_off(0))?;
            }
            match t.op {
                Op::Atomic => {
                    let got = self.res.qps[i].mr.block().atomic_load(l.target_off(0))?;
                    let n = match t.kind {
                        Kind::Lat => self.spec.total(),
                        Kind::Bw => self.spec.iters,
                    };
                    let want = pattern::atomic_base(i as u32).wrapping_add(n);
                    if got != want {
                        bail!("data mismatch: {t} QP #{i}: the target word is {got:#x} after {n} fetch-adds of 1, expected {want:#x}");
                    }
                }
                Op::Write if t.kind == Kind::Bw => {
                    // Slot j holds the last message m < iters with m ≡ j (mod slots).
                    let slots = l.target_slots as u64;
                    let iters = self.spec.iters;
                    for j in 0..slots.min(iters) {
                        let m = j + ((iters - 1 - j) / slots) * slots;
                        self.res.qps[i]
                            .mr
                            .block()
                            .copy_out(l.target_off(j as usize), &mut self.scratch)?;
                        pattern::check(&self.scratch, Dir::ToServer, m, i as u32).map_err(|e| {
                            anyhow!("data mismatch: {t} QP #{i} message {m} (slot {j}): {e}")
                        })?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    // ----- latency -------------------------------------------------------------------

    /// `send_lat`: ping-pong of SENDs; the client measures the round trip.
    fn send_lat(&mut self) -> Result<Option<Measured>> {
        let total = self.spec.total();
        let mut rtts = Vec::with_capacity(self.spec.iters as usize);
        for n in 0..total {
            let t0 = Instant::now();
            if self.role == Role::Client {
                self.send_round(n)?;
                self.recv_round(n)?;
            } else {
                self.recv_round(n)?;
                self.send_round(n)?;
            }
            if n >= self.spec.warmup {
                rtts.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            self.progress.set(n + 1);
        }
        for i in 0..self.qps() {
            self.drain_sends(i)?;
        }
        Ok(self.lat_result(&rtts, 0.5))
    }

    /// Posts SEND `n` on every QP.
    fn send_round(&mut self, n: u64) -> Result<()> {
        let l = self.layout();
        for i in 0..self.qps() {
            self.drain_sends(i)?;
            if self.spec.verify {
                pattern::fill(&mut self.scratch, self.role.dir(), n, i as u32);
                self.res.qps[i]
                    .mr
                    .block()
                    .copy_in(l.local_off(0), &self.scratch)?;
            }
            let wr = SendWr::send(wr_id(i, n), vec![self.sge(i, l.local_off(0), l.size)]);
            self.post(i, wr)?;
        }
        Ok(())
    }

    /// Waits until message `n` arrived on every QP.
    fn recv_round(&mut self, n: u64) -> Result<()> {
        while (0..self.qps()).any(|i| self.recvd[i] <= n) {
            let k = self.wait()?;
            self.absorb(k)?;
        }
        Ok(())
    }

    /// `write_lat`: ping-pong of RDMA WRITEs; each side polls the counter word of its own
    /// buffer for the iteration number.
    fn write_lat(&mut self) -> Result<Option<Measured>> {
        let total = self.spec.total();
        let mut rtts = Vec::with_capacity(self.spec.iters as usize);
        for n in 0..total {
            let t0 = Instant::now();
            if self.role == Role::Client {
                self.write_round(n)?;
                self.await_writes(n)?;
            } else {
                self.await_writes(n)?;
                self.write_round(n)?;
            }
            if n >= self.spec.warmup {
                rtts.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            self.progress.set(n + 1);
        }
        for i in 0..self.qps() {
            self.drain_sends(i)?;
        }
        Ok(self.lat_result(&rtts, 0.5))
    }

    /// The message of iteration `n` in `dir` for QP `i` into `self.expect`: the pattern
    /// with the counter `n + 1` in the counter word.
    fn write_lat_message(&mut self, dir: Dir, n: u64, i: usize) {
        let c = self.layout().counter_off();
        if self.spec.verify {
            pattern::fill(&mut self.expect, dir, n, i as u32);
        }
        self.expect[c..c + 8].copy_from_slice(&(n + 1).to_be_bytes());
    }

    fn write_round(&mut self, n: u64) -> Result<()> {
        let l = self.layout();
        for i in 0..self.qps() {
            self.drain_sends(i)?;
            self.write_lat_message(self.role.dir(), n, i);
            self.res.qps[i]
                .mr
                .block()
                .copy_in(l.local_off(0), &self.expect)?;
            let peer = self.peer(i);
            let wr = SendWr {
                wr_id: wr_id(i, n),
                opcode: SendOpcode::RdmaWrite,
                flags: SendFlags::SIGNALED,
                sg_list: vec![self.sge(i, l.local_off(0), l.size)].into(),
                rdma: RdmaInfo {
                    remote_addr: peer.addr,
                    rkey: peer.rkey,
                },
                ..SendWr::default()
            };
            self.post(i, wr)?;
        }
        Ok(())
    }

    /// Polls each QP's counter word until the peer's write `n` arrived, then checks it.
    fn await_writes(&mut self, n: u64) -> Result<()> {
        let l = self.layout();
        let at = l.target_off(0) + l.counter_off();
        for i in 0..self.qps() {
            let mut deadline = Instant::now() + self.timeout;
            let mut spins = 0u32;
            loop {
                // The counter is big-endian in memory (see `counter_off`).
                let v = u64::from_be(self.res.qps[i].mr.block().atomic_load(at)?);
                if v == n + 1 {
                    break;
                }
                if v > n + 1 {
                    bail!(
                        "write_lat: QP #{i} counter jumped to {v} while waiting for {}",
                        n + 1
                    );
                }
                // Polling the CQ drives the network and collects our WRITE completions.
                let k = self.try_poll()?;
                if k > 0 {
                    self.absorb(k)?;
                    deadline = Instant::now() + self.timeout;
                }
                spins += 1;
                if self.spec.mode == Mode::Event || spins % SPIN_CHECK == 0 {
                    std::thread::yield_now();
                }
                if spins % SPIN_CHECK == 0 {
                    if Instant::now() >= deadline {
                        bail!(
                            "write_lat: QP #{i}: write {} did not arrive within {:?}",
                            n + 1,
                            self.timeout
                        );
                    }
                    if spins % (SPIN_CHECK * 64) == 0 {
                        self.check_peer()?;
                    }
                }
            }
            if self.spec.verify {
                self.res.qps[i]
                    .mr
                    .block()
                    .copy_out(l.target_off(0), &mut self.scratch)?;
                self.write_lat_message(self.role.peer_dir(), n, i);
                if let Some(off) = self
                    .scratch
                    .iter()
                    .zip(&self.expect)
                    .position(|(a, b)| a != b)
                {
                    bail!(
                        "data mismatch: write_lat QP #{i} message {n}: byte {off} is {:#04x}, expected {:#04x}",
                        self.scratch[off],
                        self.expect[off]
                    );
                }
            }
        }
        Ok(())
    }

    /// `read_lat` / `atomic_lat`: the client's round trip for one READ or fetch-add.
    fn rt_lat(&mut self) -> Result<Measured> {
        let l = self.layout();
        let total = self.spec.total();
        let atomic = self.spec.test.op == Op::Atomic;
        let mut rtts = Vec::with_capacity(self.spec.iters as usize);
        for n in 0..total {
            let t0 = Instant::now();
            for i in 0..self.qps() {
                if self.spec.verify {
                    self.res.qps[i].mr.block().fill(l.local_off(0), l.size, 0)?;
                }
                let wr = self.rd_atomic_wr(i, n, 0, atomic);
                self.post(i, wr)?;
            }
            for i in 0..self.qps() {
                self.drain_sends(i)?;
            }
            if n >= self.spec.warmup {
                rtts.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            if self.spec.verify {
                for i in 0..self.qps() {
                    self.check_result(i, n)?;
                }
            }
            self.progress.set(n + 1);
        }
        self.lat_result(&rtts, 1.0)
            .ok_or_else(|| anyhow!("no latency samples"))
    }

    fn lat_result(&self, rtts: &[f64], scale: f64) -> Option<Measured> {
        if self.role != Role::Client {
            return None;
        }
        LatStats::from_samples(rtts).map(|s| Measured::Lat(s.scaled(scale)))
    }

    /// A READ of remote slot `remote` or a fetch-add of 1 into local slot `m`.
    fn rd_atomic_wr(&self, i: usize, m: u64, remote: u64, atomic: bool) -> SendWr {
        let l = self.layout();
        let peer = self.peer(i);
        let local = self.sge(i, l.local_off(m as usize), if atomic { 8 } else { l.size });
        let signaled = SendFlags::SIGNALED;
        if atomic {
            SendWr {
                wr_id: wr_id(i, m),
                opcode: SendOpcode::AtomicFetchAndAdd,
                flags: signaled,
                sg_list: vec![local].into(),
                atomic: AtomicInfo {
                    remote_addr: peer.addr,
                    compare_add: 1,
                    swap: 0,
                    rkey: peer.rkey,
                },
                ..SendWr::default()
            }
        } else {
            SendWr {
                wr_id: wr_id(i, m),
                opcode: SendOpcode::RdmaRead,
                flags: signaled,
                sg_list: vec![local].into(),
                rdma: RdmaInfo {
                    remote_addr: peer.addr + (remote % l.target_slots as u64) * l.stride as u64,
                    rkey: peer.rkey,
                },
                ..SendWr::default()
            }
        }
    }

    /// Checks the result of READ / fetch-add `m` of QP `i` in its local slot.
    fn check_result(&mut self, i: usize, m: u64) -> Result<()> {
        let l = self.layout();
        let t = self.spec.test;
        let block = self.res.qps[i].mr.block();
        if t.op == Op::Atomic {
            let got = block.atomic_load(l.local_off(m as usize))?;
            let want = pattern::atomic_base(i as u32).wrapping_add(m);
            if got != want {
                bail!("data mismatch: {t} QP #{i} operation {m}: fetched {got:#x}, expected {want:#x}");
            }
        } else {
            block.copy_out(l.local_off(m as usize), &mut self.scratch)?;
            let slot = match t.kind {
                Kind::Lat => 0,
                Kind::Bw => m % l.target_slots as u64,
            };
            pattern::check(&self.scratch, Dir::ToClient, slot, i as u32)
                .map_err(|e| anyhow!("data mismatch: {t} QP #{i} read {m}: {e}"))?;
        }
        Ok(())
    }

    // ----- bandwidth -----------------------------------------------------------------

    /// The client's bandwidth loop: keeps `window` WRs outstanding per QP, signals every
    /// few, and checks READ / atomic results as they complete.
    fn bw(&mut self) -> Result<Measured> {
        let l = self.layout();
        let op = self.spec.test.op;
        let iters = self.spec.iters;
        let q = self.qps();
        let window = l.window as u64;
        let signal_every = (window / 4).clamp(1, 32);
        let mut posted = vec![0u64; q];
        let mut done = vec![0u64; q];
        let start = Instant::now();
        loop {
            for i in 0..q {
                while posted[i] < iters && posted[i] - done[i] < window {
                    let m = posted[i];
                    let signaled = (m + 1) % signal_every == 0 || m + 1 == iters;
                    let mut wr = self.bw_wr(i, m)?;
                    if !signaled {
                        wr.flags.remove(SendFlags::SIGNALED);
                    }
                    self.res.qps[i]
                        .qp
                        .post_send(wr)
                        .with_context(|| format!("posting {op:?} {m} on QP #{i}"))?;
                    posted[i] += 1;
                }
            }
            if done.iter().all(|&d| d >= iters) {
                break;
            }
            let n = self.wait()?;
            for k in 0..n {
                let wc = self.wcs[k];
                let (i, m) = split_wr_id(wc.wr_id);
                if i >= q || m >= iters || m < done[i] {
                    bail!(
                        "unexpected completion {:?} (QP #{i}, message {m})",
                        wc.opcode
                    );
                }
                if self.spec.verify && matches!(op, Op::Read | Op::Atomic) {
                    for j in done[i]..=m {
                        self.check_result(i, j)?;
                    }
                }
                done[i] = m + 1;
            }
            self.progress.set(done.iter().sum());
        }
        let secs = start.elapsed().as_secs_f64();
        let msgs = iters * q as u64;
        Ok(Measured::Bw {
            bytes: msgs * l.size as u64,
            msgs,
            secs,
        })
    }

    /// Bandwidth WR `m` of QP `i` (signaled; the caller clears the flag).
    fn bw_wr(&mut self, i: usize, m: u64) -> Result<SendWr> {
        let l = self.layout();
        let op = self.spec.test.op;
        let local = l.local_off(m as usize);
        if self.spec.verify {
            match op {
                Op::Send | Op::Write => {
                    pattern::fill(&mut self.scratch, Dir::ToServer, m, i as u32);
                    self.res.qps[i].mr.block().copy_in(local, &self.scratch)?;
                }
                Op::Read => self.res.qps[i].mr.block().fill(local, l.size, 0)?,
                Op::Atomic => self.res.qps[i].mr.block().atomic_store(local, 0)?,
            }
        }
        Ok(match op {
            Op::Send => SendWr::send(wr_id(i, m), vec![self.sge(i, local, l.size)]),
            Op::Write => {
                let peer = self.peer(i);
                SendWr {
                    wr_id: wr_id(i, m),
                    opcode: SendOpcode::RdmaWrite,
                    flags: SendFlags::SIGNALED,
                    sg_list: vec![self.sge(i, local, l.size)].into(),
                    rdma: RdmaInfo {
                        remote_addr: peer.addr + (m % l.target_slots as u64) * l.stride as u64,
                        rkey: peer.rkey,
                    },
                    ..SendWr::default()
                }
            }
            Op::Read => self.rd_atomic_wr(i, m, m, false),
            Op::Atomic => self.rd_atomic_wr(i, m, 0, true),
        })
    }

    /// The server side of `send_bw`: receive (and check) every message, keeping receives
    /// posted.
    fn recv_bw(&mut self) -> Result<()> {
        let iters = self.spec.iters;
        while self.recvd.iter().any(|&r| r < iters) {
            let n = self.wait()?;
            self.absorb(n)?;
        }
        Ok(())
    }

    /// Network activity since the last call (restarts timeouts of passive waits).
    pub fn activity(dev: &NetDevice, last: &mut u64) -> bool {
        let now = dev.counters().socket.rx_packets;
        let changed = now != *last;
        *last = now;
        changed
    }

    /// The out-of-band connection.
    pub fn oob(&mut self) -> &mut Oob {
        self.oob
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::plan::TestKind;

    fn spec(test: &str, size: u32, verify: bool) -> TestSpec {
        TestSpec {
            test: test.parse::<TestKind>().unwrap(),
            size,
            iters: 100,
            warmup: 0,
            qps: 1,
            tx_depth: 128,
            rx_depth: 512,
            verify,
            mode: Mode::Busy,
        }
    }

    #[test]
    fn layouts() {
        let l = Layout::for_spec(&spec("send_lat", 8, false));
        assert_eq!(
            (l.stride, l.local_slots, l.target_slots),
            (64, 1, LAT_RECV_SLOTS)
        );
        let l = Layout::for_spec(&spec("write_bw", 1 << 20, false));
        assert_eq!((l.local_slots, l.target_slots, l.window), (1, 1, 128));
        // Verifying: one slot per message in flight, bounded by VERIFY_MEM.
        let l = Layout::for_spec(&spec("write_bw", 1 << 20, true));
        assert_eq!((l.local_slots, l.target_slots, l.window), (16, 16, 16));
        let l = Layout::for_spec(&spec("read_bw", 4096, true));
        assert_eq!((l.local_slots, l.target_slots, l.window), (128, 100, 128));
        let l = Layout::for_spec(&spec("atomic_bw", 8, false));
        assert_eq!((l.local_slots, l.window), (128, 128));
        assert_eq!(l.target_off(0) % 8, 0);
        // The write_lat counter word is 8-aligned and inside the message.
        for size in [8u32, 9, 12, 15, 16, 100] {
            let l = Layout::for_spec(&spec("write_lat", size, true));
            let c = l.counter_off();
            assert_eq!((l.target_off(0) + c) % 8, 0);
            assert!(c + 8 <= size as usize);
        }
    }

    #[test]
    fn wr_ids_round_trip() {
        assert_eq!(split_wr_id(wr_id(63, 1 << 40)), (63, 1 << 40));
    }
}
