//! The GSI QP (QP1) of a network device: the carrier of management datagrams (MADs), which
//! the connection manager uses (IBA Vol 1 ch. 13 and ch. 12).
//!
//! # Ownership
//! Every [`NetDevice`](crate::NetDevice) creates its port's GSI QP when it opens, in its
//! own context, with its own protection domain, CQs and registered buffers, and destroys it
//! before the device goes. Applications never own QP1: the verbs layer gives QPN 1 to the
//! first GSI QP of a context, so an application's `create_qp(Gsi)` on the device's context
//! fails with `CreateQpError::GsiExists`. They reach QP1 through [`Gsi`]
//! ([`NetDevice::gsi`](crate::NetDevice::gsi)), which sends and receives whole 256-byte
//! MADs.
//!
//! # Resources
//! * A receive pool of [`GSI_RECV_DEPTH`] slots of 40 + 256 bytes (the GRH area and one
//!   MAD), all posted at open. A received slot always goes back to the receive queue once
//!   its MAD has been copied out (or found malformed), so the queue depth stays at
//!   [`GSI_RECV_DEPTH`] ([`Gsi::recv_queue_depth`]).
//! * A send pool of [`GSI_SEND_DEPTH`] 256-byte slots; a slot returns to the pool when its
//!   send completes (UD sends complete when their packet is written).
//! * The QP: type GSI, RESET→INIT (Q_Key 0x80010000, P_Key index 0)→RTR→RTS. The engine
//!   accepts only datagrams that carry the GSI Q_Key; others are dropped and counted in
//!   its `dropped_bad_qkey` ([`GsiCounters::engine`]).
//!
//! # Threading
//! [`Gsi`] is `Sync`: any thread may call [`Gsi::send_mad`] and [`Gsi::recv_mad`]. Packets
//! reach QP1 like any QP's, by whichever thread runs the device's progress step (the
//! progress thread, or an application thread polling a CQ); their completions wait in the
//! GSI receive CQ. Only callers of `recv_mad` poll that CQ: `recv_mad` takes one completion
//! if there is one, otherwise arms the CQ's completion channel and blocks on it, in slices
//! of at most [`WAIT_SLICE`] ([`WAIT_SLICE_NO_THREAD`] on a device without a progress
//! thread, where the CQ poll of each slice is what drives progress), until its timeout:
//! no unbounded loop and no busy polling. `send_mad` reaps the send CQ before taking a
//! slot; when all slots are in flight it waits for them in 100 µs sleeps, at most
//! [`SEND_SLOT_WAIT`]. MADs that arrive while nobody calls `recv_mad` wait in the receive
//! queue; beyond [`GSI_RECV_DEPTH`] of them the engine drops further ones and counts them
//! (`dropped_no_receive`), as a UD QP without receives does.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use uroce_verbs::{
    AccessFlags, AhAttr, AttrMask, CompChannel, Context, Cq, EngineCounters, MemBlock, Mr, Pd, Qp,
    QpAttr, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOpcode, SendWr, Sge, UdDest,
    WaitError, WcStatus, WorkCompletion,
};
use uroce_wire::grh_area::{GrhArea, GRH_AREA_LEN};
use uroce_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};

/// Receive slots posted on QP1.
pub const GSI_RECV_DEPTH: u32 = 64;
/// Send slots (MADs in flight at once).
pub const GSI_SEND_DEPTH: u32 = 16;
/// Bytes of one receive slot: the GRH area and one MAD.
pub const GSI_RECV_SLOT: usize = GRH_AREA_LEN + MAD_LEN;
/// Longest single wait of [`Gsi::recv_mad`] on its completion channel.
pub const WAIT_SLICE: Duration = Duration::from_millis(10);
/// The same on a device without a progress thread (each slice's CQ poll drives progress).
pub const WAIT_SLICE_NO_THREAD: Duration = Duration::from_millis(1);
/// How long [`Gsi::send_mad`] waits for a free send slot.
pub const SEND_SLOT_WAIT: Duration = Duration::from_secs(1);

/// Why a GSI operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GsiError {
    /// Creating or activating QP1 and its resources failed (at device open).
    #[error("cannot set up the GSI QP: {0}")]
    Setup(String),
    /// A MAD must be exactly 256 bytes.
    #[error("a MAD is {MAD_LEN} bytes, not {0}")]
    MadLength(usize),
    /// The destination's address family is not the device's.
    #[error("{dest} cannot be reached from the device's address {local}")]
    AddressFamily {
        /// The destination.
        dest: IpAddr,
        /// The device's address.
        local: IpAddr,
    },
    /// All send slots stayed in flight for [`SEND_SLOT_WAIT`].
    #[error("every GSI send slot is still in flight")]
    SendQueueFull,
    /// The address handle for the destination could not be created.
    #[error("address handle for {dest}: {why}")]
    AddressHandle {
        /// The destination.
        dest: IpAddr,
        /// The verbs error.
        why: String,
    },
    /// The QP refused the send.
    #[error("post_send on QP1: {0}")]
    Post(String),
    /// QP1 is in the error state or being destroyed: its queues were flushed.
    #[error("the GSI QP was flushed (device closing or QP in error)")]
    Flushed,
    /// The completion channel was shut down.
    #[error("the GSI completion channel was shut down")]
    Closed,
}

/// A MAD received on QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMad {
    /// The sender's IP address (from the datagram's GRH area).
    pub src: IpAddr,
    /// The sender's QP number (DETH SrcQP; 1 for another GSI QP).
    pub src_qpn: u32,
    /// The P_Key index the datagram matched.
    pub pkey_index: u16,
    /// The 256 bytes of the MAD.
    pub mad: Vec<u8>,
}

/// QP1's own counts ([`Gsi::counters`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GsiCounters {
    /// MADs handed to the QP by [`Gsi::send_mad`].
    pub mads_sent: u64,
    /// Send completions with an error status.
    pub send_errors: u64,
    /// MADs returned by [`Gsi::recv_mad`].
    pub mads_received: u64,
    /// Datagrams delivered to QP1 that were not one 256-byte MAD (wrong length, an
    /// unreadable GRH area, a receive error): their slots were reposted.
    pub dropped_not_mad: u64,
    /// Receive slots that could not be reposted.
    pub repost_failures: u64,
    /// QP1's transport engine (Q_Key violations: `dropped_bad_qkey`; datagrams with no
    /// receive slot free: `dropped_no_receive`; …).
    pub engine: EngineCounters,
}

#[derive(Default)]
struct Counts {
    mads_sent: AtomicU64,
    send_errors: AtomicU64,
    mads_received: AtomicU64,
    dropped_not_mad: AtomicU64,
    repost_failures: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The device's GSI QP with its buffers. See the module doc.
pub struct Gsi {
    // Declaration order is drop order: QP1 first, then what it uses.
    qp: Option<Qp>,
    send_mr: Mr,
    recv_mr: Mr,
    send_cq: Cq,
    recv_cq: Cq,
    channel: CompChannel,
    pd: Pd,
    local: IpAddr,
    slice: Duration,
    free_send: Mutex<Vec<u32>>,
    posted_recvs: AtomicU32,
    counts: Counts,
}

impl std::fmt::Debug for Gsi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gsi")
            .field("local", &self.local)
            .field("recv_queue_depth", &self.recv_queue_depth())
            .finish()
    }
}

fn setup<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> GsiError {
    move |e| GsiError::Setup(format!("{what}: {e}"))
}

impl Gsi {
    /// Creates QP1 and its resources in `ctx` (a network device's context, whose address
    /// is `local`), brings it to RTS and posts every receive slot.
    pub(crate) fn open(
        ctx: &Context,
        local: IpAddr,
        progress_thread: bool,
    ) -> Result<Gsi, GsiError> {
        let pd = ctx.alloc_pd().map_err(setup("PD"))?;
        let channel = ctx.create_comp_channel().map_err(setup("channel"))?;
        let send_cq = ctx
            .create_cq(2 * GSI_SEND_DEPTH, None, 0)
            .map_err(setup("send CQ"))?;
        let recv_cq = ctx
            .create_cq(2 * GSI_RECV_DEPTH, Some(&channel), 0)
            .map_err(setup("receive CQ"))?;
        let block = |len: usize| MemBlock::new(len).map_err(setup("buffer"));
        let send_mr = pd
            .reg_mr(
                block(GSI_SEND_DEPTH as usize * MAD_LEN)?,
                AccessFlags::empty(),
            )
            .map_err(setup("send MR"))?;
        let recv_mr = pd
            .reg_mr(
                block(GSI_RECV_DEPTH as usize * GSI_RECV_SLOT)?,
                AccessFlags::LOCAL_WRITE,
            )
            .map_err(setup("receive MR"))?;
        let cap = QpCap {
            max_send_wr: GSI_SEND_DEPTH,
            max_recv_wr: GSI_RECV_DEPTH,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd
            .create_qp(&QpInitAttr::new(QpType::Gsi, &send_cq, &recv_cq, cap))
            .map_err(setup("QP1"))?;
        if qp.qp_num() != GSI_QPN {
            return Err(GsiError::Setup(format!(
                "the GSI QP got QPN {}",
                qp.qp_num()
            )));
        }
        qp.activate_ud(GSI_QKEY).map_err(setup("RESET to RTS"))?;
        let gsi = Gsi {
            qp: Some(qp),
            send_mr,
            recv_mr,
            send_cq,
            recv_cq,
            channel,
            pd,
            local,
            slice: if progress_thread {
                WAIT_SLICE
            } else {
                WAIT_SLICE_NO_THREAD
            },
            free_send: Mutex::new((0..GSI_SEND_DEPTH).rev().collect()),
            posted_recvs: AtomicU32::new(0),
            counts: Counts::default(),
        };
        for slot in 0..GSI_RECV_DEPTH {
            if !gsi.repost(slot) {
                return Err(GsiError::Setup(format!("posting receive slot {slot}")));
            }
        }
        Ok(gsi)
    }

    fn qp(&self) -> Result<&Qp, GsiError> {
        self.qp.as_ref().ok_or(GsiError::Flushed)
    }

    /// QP1's number (always 1).
    pub fn qp_num(&self) -> u32 {
        GSI_QPN
    }

    /// QP1's state now (RTS while the device is open).
    pub fn state(&self) -> QpState {
        self.qp.as_ref().map_or(QpState::Reset, |q| q.state())
    }

    /// Receive slots posted now ([`GSI_RECV_DEPTH`] whenever no received MAD is being
    /// copied out).
    pub fn recv_queue_depth(&self) -> u32 {
        self.posted_recvs.load(Ordering::SeqCst)
    }

    /// Send slots free now, after reaping the send completions ([`GSI_SEND_DEPTH`] when no
    /// MAD is in flight).
    pub fn free_send_slots(&self) -> u32 {
        self.reap_sends();
        let n = self
            .free_send
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The counters now.
    pub fn counters(&self) -> GsiCounters {
        let c = &self.counts;
        GsiCounters {
            mads_sent: c.mads_sent.load(Ordering::Relaxed),
            send_errors: c.send_errors.load(Ordering::Relaxed),
            mads_received: c.mads_received.load(Ordering::Relaxed),
            dropped_not_mad: c.dropped_not_mad.load(Ordering::Relaxed),
            repost_failures: c.repost_failures.load(Ordering::Relaxed),
            engine: self
                .qp
                .as_ref()
                .and_then(|q| q.engine_counters())
                .unwrap_or_default(),
        }
    }

    /// Sends one 256-byte MAD to QP `remote_qpn` (1 for the peer's GSI QP) at `dest`, with
    /// the GSI Q_Key. Returns once the MAD is queued on QP1; the send slot returns to the
    /// pool when the send completes.
    ///
    /// # Errors
    /// [`GsiError::MadLength`], [`GsiError::AddressFamily`], [`GsiError::SendQueueFull`]
    /// after [`SEND_SLOT_WAIT`], [`GsiError::AddressHandle`], [`GsiError::Post`],
    /// [`GsiError::Flushed`] while the device closes.
    pub fn send_mad(&self, dest: IpAddr, remote_qpn: u32, mad: &[u8]) -> Result<(), GsiError> {
        if mad.len() != MAD_LEN {
            return Err(GsiError::MadLength(mad.len()));
        }
        if dest.is_ipv4() != self.local.is_ipv4() {
            return Err(GsiError::AddressFamily {
                dest,
                local: self.local,
            });
        }
        let qp = self.qp()?;
        let slot = self.take_send_slot()?;
        let off = slot as usize * MAD_LEN;
        let result = self
            .send_mr
            .block()
            .copy_in(off, mad)
            .map_err(|e| GsiError::Post(e.to_string()))
            .and_then(|()| {
                self.pd
                    .create_ah(&AhAttr::to_ip(dest))
                    .map_err(|e| GsiError::AddressHandle {
                        dest,
                        why: e.to_string(),
                    })
            })
            .and_then(|ah| {
                let wr = SendWr {
                    wr_id: u64::from(slot),
                    opcode: SendOpcode::Send,
                    flags: SendFlags::SIGNALED,
                    sg_list: vec![Sge {
                        addr: self.send_mr.iova() + off as u64,
                        length: MAD_LEN as u32,
                        lkey: self.send_mr.lkey(),
                    }]
                    .into(),
                    // The WR holds its own reference to the AH; ours goes at once.
                    ud: Some(UdDest {
                        ah: ah.reference(),
                        remote_qpn,
                        remote_qkey: GSI_QKEY,
                    }),
                    ..SendWr::default()
                };
                qp.post_send(wr).map_err(|e| GsiError::Post(e.to_string()))
            });
        match result {
            Ok(()) => {
                bump(&self.counts.mads_sent);
                Ok(())
            }
            Err(e) => {
                self.free_slot(slot);
                Err(e)
            }
        }
    }

    fn free_slot(&self, slot: u32) {
        self.free_send
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(slot);
    }

    /// Returns the slots of completed sends to the pool; a send error (QP1 then in SQE)
    /// is counted and QP1 moved back to RTS.
    fn reap_sends(&self) {
        let done = self.send_cq.poll(GSI_SEND_DEPTH as usize);
        let mut error = false;
        for wc in &done {
            if wc.status != WcStatus::Success {
                bump(&self.counts.send_errors);
                error = true;
            }
            if let Ok(slot) = u32::try_from(wc.wr_id) {
                if slot < GSI_SEND_DEPTH {
                    self.free_slot(slot);
                }
            }
        }
        if error {
            if let Some(qp) = self.qp.as_ref().filter(|q| q.state() == QpState::Sqe) {
                let attr = QpAttr {
                    qp_state: QpState::Rts,
                    ..QpAttr::default()
                };
                // SQE→RTS takes the state alone; a failure leaves QP1 in SQE and later
                // sends fail with a typed error.
                let _ = qp.modify(&attr, AttrMask::STATE);
            }
        }
    }

    fn take_send_slot(&self) -> Result<u32, GsiError> {
        let deadline = Instant::now() + SEND_SLOT_WAIT;
        // Bounded by the deadline; each round reaps completions first.
        loop {
            self.reap_sends();
            if let Some(slot) = self
                .free_send
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()
            {
                return Ok(slot);
            }
            if Instant::now() >= deadline {
                return Err(GsiError::SendQueueFull);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// The next MAD received on QP1, waiting up to `timeout` (`Ok(None)` when none came).
    /// The caller's thread polls the GSI receive CQ (see the module doc); the receive slot
    /// goes back to the receive queue before this returns.
    ///
    /// # Errors
    /// [`GsiError::Flushed`] when QP1's receives were flushed (the device is closing),
    /// [`GsiError::Closed`] when the completion channel was shut down.
    pub fn recv_mad(&self, timeout: Duration) -> Result<Option<ReceivedMad>, GsiError> {
        let deadline = Instant::now() + timeout;
        // Bounded by the deadline: every round either returns or ends with a check of it.
        loop {
            if let Some(wc) = self.recv_cq.poll(1).pop() {
                if let Some(mad) = self.take_recv(&wc)? {
                    return Ok(Some(mad));
                }
            } else {
                self.recv_cq
                    .req_notify(false)
                    .map_err(|_| GsiError::Closed)?;
                let now = Instant::now();
                if self.recv_cq.is_empty() && now < deadline {
                    match self
                        .channel
                        .get_cq_event(Some(deadline.duration_since(now).min(self.slice)))
                    {
                        Ok(ev) => ev.ack(),
                        Err(WaitError::Timeout) => {}
                        Err(WaitError::Shutdown) => return Err(GsiError::Closed),
                        // A failed poll(2) ends this slice early; the deadline bounds
                        // the loop.
                        Err(_) => {}
                    }
                }
            }
            if Instant::now() >= deadline && self.recv_cq.is_empty() {
                return Ok(None);
            }
        }
    }

    /// Copies a received MAD out of its slot and reposts the slot.
    fn take_recv(&self, wc: &WorkCompletion) -> Result<Option<ReceivedMad>, GsiError> {
        let Some(slot) = u32::try_from(wc.wr_id).ok().filter(|s| *s < GSI_RECV_DEPTH) else {
            bump(&self.counts.dropped_not_mad);
            return Ok(None);
        };
        self.posted_recvs.fetch_sub(1, Ordering::SeqCst);
        if wc.status == WcStatus::WrFlushErr {
            return Err(GsiError::Flushed);
        }
        let mut buf = [0u8; GSI_RECV_SLOT];
        let read = wc.status == WcStatus::Success
            && wc.byte_len as usize == GSI_RECV_SLOT
            && self
                .recv_mr
                .block()
                .copy_out(slot as usize * GSI_RECV_SLOT, &mut buf)
                .is_ok();
        let area = if read {
            GrhArea::parse_prefix(&buf).ok()
        } else {
            None
        };
        self.repost(slot);
        let Some(area) = area else {
            bump(&self.counts.dropped_not_mad);
            return Ok(None);
        };
        bump(&self.counts.mads_received);
        Ok(Some(ReceivedMad {
            src: area.src,
            src_qpn: wc.src_qp,
            pkey_index: wc.pkey_index,
            mad: buf[GRH_AREA_LEN..].to_vec(),
        }))
    }

    /// Posts receive slot `slot`; returns whether it was posted.
    fn repost(&self, slot: u32) -> bool {
        let Some(qp) = self.qp.as_ref() else {
            return false;
        };
        let sge = Sge {
            addr: self.recv_mr.iova() + (slot as usize * GSI_RECV_SLOT) as u64,
            length: GSI_RECV_SLOT as u32,
            lkey: self.recv_mr.lkey(),
        };
        // Counted before posting: the completion may be taken by another thread at once.
        self.posted_recvs.fetch_add(1, Ordering::SeqCst);
        if qp
            .post_recv(RecvWr::new(u64::from(slot), vec![sge]))
            .is_ok()
        {
            true
        } else {
            self.posted_recvs.fetch_sub(1, Ordering::SeqCst);
            bump(&self.counts.repost_failures);
            false
        }
    }

    /// The GSI receive CQ's completion channel (readable once a receive completes after
    /// an empty [`Gsi::recv_mad`] armed it): the CM thread polls it.
    pub(crate) fn channel_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.channel.fd()
    }

    /// Acknowledges the completion notifications pending on the receive channel.
    pub(crate) fn ack_notifications(&self) {
        // Bounded: at most one notification per arming, and the CQ is armed once per
        // empty poll.
        for _ in 0..GSI_RECV_DEPTH {
            match self.channel.try_get_cq_event() {
                Some(ev) => ev.ack(),
                None => break,
            }
        }
    }

    /// Destroys QP1 (waking blocked `recv_mad` callers), then its CQs, buffers and PD.
    pub(crate) fn close(mut self) {
        self.channel.shutdown();
        if let Some(qp) = self.qp.take() {
            // A QP still referenced after the context's destroy timeout is released by
            // drop instead.
            let _ = qp.destroy();
        }
        // Pending notifications must be acknowledged before the CQ goes.
        while let Some(ev) = self.channel.try_get_cq_event() {
            ev.ack();
        }
        // The rest is released in declaration order by drop.
    }
}
