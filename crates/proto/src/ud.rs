//! # The UD transport engine (and the GSI QP's): one datagram QP as a sans-IO state machine
//!
//! [`UdQp`] implements the IBA unreliable-datagram service (IBA vol 1 ch. 9.8.3) for one
//! QP of type UD or GSI (QP1, the general services interface that carries CM MADs). It
//! implements [`crate::engine::Engine`] and, like the RC engine, owns no socket, clock or
//! thread.
//!
//! ## Sending
//! * Only SEND and SEND_WITH_IMM (IBA 11.4.1.1); every other transport opcode is refused at
//!   post time with [`WrError::OpcodeNotSupported`] (LOCAL_INV / BIND_MW with
//!   [`WrError::LocalOperation`]: memory windows are bound and invalidated through RC
//!   and UC send queues only).
//! * Every work request names its destination (`wr.ud`: the address handle's IP address,
//!   the remote QPN and Q_Key); none → [`WrError::MissingDestination`]. One QP sends to any
//!   number of destinations: each packet's [`Transmit::dst`] is its WR's `UdDest::ip`.
//! * A message is one packet (SEND_ONLY / SEND_ONLY_WITH_IMMEDIATE with a DETH); a message
//!   larger than the path MTU is refused at post time ([`WrError::LargerThanMtu`];
//!   IBA 9.8.3.1: UD messages are single-packet).
//! * BTH: DestQP = the WR's remote QPN, P_Key = the QP's, PSN = `sq_psn` plus one per
//!   packet sent (the receiver ignores it), SE from `IBV_SEND_SOLICITED`, AckReq clear
//!   (UD has no acknowledgements; the GSI QP sets it, as Linux rxe does on QP1).
//! * DETH: SrcQP = our QPN; Q_Key = the WR's, unless its high-order bit is set, then the
//!   QP's own (IBA 10.2.5, C10-15). The GSI QP always sends the GSI Q_Key
//!   [`GSI_QKEY`] (its own).
//! * A send completes as soon as its packet has been written by `poll_transmit` (there is
//!   nothing to wait for). Signalling as on RC (`sq_sig_all` or `IBV_SEND_SIGNALED`;
//!   errors always).
//! * A WR whose SGEs cannot be read completes with `LOC_PROT_ERR` and moves the QP to SQE
//!   (send queue error, IBA 10.3.1: the unreliable services' send-side error state): the
//!   rest of the send queue is flushed, receives go on. RTS again (modify_qp) resumes.
//!
//! ## Receiving
//! Packets are accepted in RTR, RTS, SQD and SQE. In order, a packet is dropped and
//! counted ([`crate::counters::EngineCounters`]) when: its DestQP is not ours
//! (`dropped_wrong_state`, as RC); its P_Key does not match ours (`dropped_bad_pkey`); its opcode is not a UD opcode or its headers
//! are not the opcode's (`dropped_bad_opcode`); the QP state does not receive
//! (`dropped_wrong_state`); its DETH Q_Key is not the QP's Q_Key (`dropped_bad_qkey`; IBA
//! 10.2.5: the Q_Key check is what authorises a datagram); its payload is larger than the
//! path MTU (`dropped_too_long`); no receive WQE is posted (`dropped_no_receive`: UD has no
//! RNR NAK, the datagram is lost). None of these produces a completion.
//!
//! ## Multicast
//! A UD QP (not the GSI QP) also accepts DestQP `0xFFFFFF` ([`MULTICAST_QPN`]): the I/O
//! layer hands a multicast datagram to every QP attached to its group (IBA 10.5; RoCEv2,
//! Annex A17: the group is the IP destination), and each QP applies the checks above,
//! the Q_Key check included, on its own. The [`Arrival`]'s local address is then the
//! group address, so the GRH area's destination is the multicast GID. Sending to a
//! group is an ordinary send whose WR names QPN `0xFFFFFF` and the group's IP address.
//!
//! A delivered datagram fills the receive WQE with a 40-byte GRH area followed by the
//! payload; `byte_len` = 40 + payload. The completion's `sl` carries the RoCE packet type
//! as RoCE HCAs report it ([`roce_packet_type`]: `0xA` for IPv4, `0x9` for IPv6), which
//! tells the program where the destination address lies in the GRH area. The GRH area is what Linux rxe writes (it copies the
//! received IP header): for IPv6 the 40-byte IPv6 header as received (version 6, traffic
//! class, flow label, payload length = the UDP length, next header 17, hop limit, source,
//! destination); for IPv4 20 zero bytes then the 20-byte IPv4 header as received (0x45,
//! TOS, total length of the IP datagram, Identification, DF, TTL, protocol 17, header
//! checksum, source, destination). The engine does not see the IP header, so it rebuilds
//! it from the [`Arrival`] and the packet length with the header checksum recomputed; the
//! flags are written as DF (what Linux UDP sockets with path-MTU discovery and rxe send),
//! so an IPv4 datagram received without DF reads as DF here. An `Arrival` whose two
//! addresses are of different families (no socket reports that) is written as an IPv6
//! header with IPv4-mapped addresses.
//!
//! The completion: opcode RECV, `src_qp` = DETH SrcQP, `wc_flags` = GRH (| WITH_IMM with
//! `imm_data`), `pkey_index` = the QP's, `slid` = 0 and `sl` = 0 (RoCE has no LIDs and
//! the SL is not carried; rxe reports 0 for both), `solicited` = the BTH SE bit.
//!
//! A receive WQE smaller than 40 + payload completes with `LOC_LEN_ERR` (the verbs
//! definition of a local length error) and the datagram is dropped (counted in
//! `dropped_recv_too_small`); the QP stays in its state: a datagram from anyone must not
//! be able to move the QP to ERR. A receive WQE whose buffers cannot be written completes
//! with `LOC_PROT_ERR` and moves the QP to ERR (the application's own buffers are bad).
//!
//! ## GSI (QP1)
//! The same engine with `qp_type` GSI. Its Q_Key is the well-known GSI Q_Key
//! `0x8001_0000` (IBA ch. 13, management datagrams) whatever the configuration says; it
//! sends and accepts only that Q_Key. It matches P_Keys like a UD QP against its one
//! configured P_Key (uroce ports have a one-entry P_Key table, so this is rxe's search of
//! the port table) and reports the configured `pkey_index`.
//!
//! ## Where we deviate from Linux rxe
//! * rxe copies the WR's Q_Key verbatim; we apply IBA C10-15 (high-order bit → the QP's).
//! * A receive buffer too small for the datagram: rxe drops the datagram and keeps the WQE
//!   (with SRQ: completes it `REM_INV_REQ_ERR`); we complete the WQE `LOC_LEN_ERR`.
//! * rxe reports `pkey_index` 0 on every receive; we report the QP's configured index (0
//!   by default, so the same unless configured otherwise).
//!
//! ## States
//! No timers ([`Engine::poll_timeout`] is always `None`). ERR flushes the send queue in
//! posting order, then the receive queue, with `WR_FLUSH_ERR` (an SRQ-attached QP raises
//! `LastWqeReached` instead of flushing the SRQ); WRs posted in ERR are flushed at once.
//! SQE flushes the send queue only. RESET discards both queues without completions. SQD
//! starts no send (a UD send is never half-done, so `SqDrained` is raised at once).
//!
//! Nothing here panics on packet contents.

use std::collections::VecDeque;
use std::net::IpAddr;

use uroce_wire::ip::{roce_headers_with, Endpoints, IpFields, IPV4_HEADER_LEN};
use uroce_wire::opcode::{self, Operation, Transport};
use uroce_wire::{bth, deth, immdt, PacketRepr, Pmtu, Psn, ICRC_LEN, ROCEV2_UDP_PORT};

use crate::build::{build, fill_payload, pkey_match, BuildError};
use crate::engine::{Arrival, Engine, EngineCounters, LiveAttrs, Transmit};
use crate::engine::{CqKind, Env, Outbox, PostError, QpEvent, Reply, RtsAttrs};
use crate::memory::{scatter, sg_total};
use crate::qp_state::{QpState, QpType};
use crate::time::Instant;
use crate::wr::{
    RecvWr, SendFlags, SendOpcode, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrError,
};

#[cfg(test)]
mod tests;

/// The well-known Q_Key of the GSI QP (QP1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The GRH area at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;
/// The QP number of the GSI QP.
pub const GSI_QPN: u32 = 1;
/// DestQP of a multicast datagram (IBA 9.8.3, 10.5: the multicast QPN).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// The attributes of a UD or GSI QP the engine uses.
#[derive(Debug, Clone)]
pub struct UdConfig {
    /// Our QP number (24 bits): DETH SrcQP of what we send, DestQP of what we accept.
    pub qpn: u32,
    /// UD or GSI.
    pub qp_type: QpType,
    /// The QP's Q_Key: what incoming datagrams must carry, and what we send when a WR's
    /// Q_Key has its high-order bit set. Forced to [`GSI_QKEY`] on a GSI QP.
    pub qkey: u32,
    /// Path MTU: the largest message.
    pub pmtu: Pmtu,
    /// First PSN we send.
    pub sq_psn: Psn,
    /// Every send WR generates a completion (else only `SIGNALED` ones and errors).
    pub sq_sig_all: bool,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Receive WQEs come from [`Env::srq`] instead of the QP's own receive queue.
    pub use_srq: bool,
    /// P_Key sent and matched.
    pub pkey: u16,
    /// The P_Key's index in the port table (reported in receive completions).
    pub pkey_index: u16,
    /// Our device's IP address.
    pub local: IpAddr,
}

impl UdConfig {
    /// A UD QP with defaults: PMTU 1024, PSN 0, selective signalling, 1024 WRs per queue,
    /// no SRQ, P_Key 0xFFFF at index 0.
    pub fn new(qpn: u32, qkey: u32, local: IpAddr) -> UdConfig {
        UdConfig {
            qpn,
            qp_type: QpType::Ud,
            qkey,
            pmtu: Pmtu::Mtu1024,
            sq_psn: Psn::ZERO,
            sq_sig_all: false,
            max_send_wr: 1024,
            max_recv_wr: 1024,
            use_srq: false,
            pkey: 0xffff,
            pkey_index: 0,
            local,
        }
    }

    /// The GSI QP (QP1, Q_Key [`GSI_QKEY`]) with the defaults of [`UdConfig::new`].
    pub fn gsi(local: IpAddr) -> UdConfig {
        UdConfig {
            qp_type: QpType::Gsi,
            ..UdConfig::new(GSI_QPN, GSI_QKEY, local)
        }
    }
}

/// One queued send: the WR and its message length.
#[derive(Debug)]
struct UdSend {
    wr: SendWr,
    len: u64,
}

/// One UD or GSI queue pair. See the module doc.
#[derive(Debug)]
pub struct UdQp {
    cfg: UdConfig,
    state: QpState,
    next_psn: Psn,
    sq: VecDeque<UdSend>,
    rq: VecDeque<RecvWr>,
    outbox: Outbox,
    counters: EngineCounters,
}

impl UdQp {
    /// A QP in RTR with `cfg`: it receives; it sends nothing until [`Engine::enter_rts`].
    /// The QPN is cut to 24 bits; a GSI QP gets the GSI Q_Key; a type other than GSI is
    /// treated as UD.
    pub fn new_rtr(mut cfg: UdConfig) -> UdQp {
        cfg.qpn &= 0x00ff_ffff;
        if cfg.qp_type == QpType::Gsi {
            cfg.qkey = GSI_QKEY;
        } else {
            cfg.qp_type = QpType::Ud;
        }
        UdQp {
            next_psn: cfg.sq_psn,
            cfg,
            state: QpState::Rtr,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            outbox: Outbox::default(),
            counters: EngineCounters::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &UdConfig {
        &self.cfg
    }

    fn is_gsi(&self) -> bool {
        self.cfg.qp_type == QpType::Gsi
    }

    /// The Q_Key the DETH of a packet for `wr_qkey` carries (IBA 10.2.5, C10-15).
    fn send_qkey(&self, wr_qkey: u32) -> u32 {
        if self.is_gsi() || wr_qkey & 0x8000_0000 != 0 {
            self.cfg.qkey
        } else {
            wr_qkey
        }
    }

    fn drop_packet(&mut self, cause: fn(&mut EngineCounters) -> &mut u64) {
        self.counters.dropped_packets += 1;
        *cause(&mut self.counters) += 1;
    }

    /// Completes a send WR: always on error, on success when signalled.
    fn complete_send(&mut self, s: &UdSend, status: WcStatus) {
        let qpn = self.cfg.qpn;
        if let Some(wc) =
            crate::build::send_completion(self.cfg.sq_sig_all, qpn, &s.wr, s.len, status)
        {
            self.outbox.push_completion(CqKind::Send, wc);
        }
    }

    fn complete_recv_error(&mut self, wr_id: u64, status: WcStatus) {
        let wc = WorkCompletion::new(wr_id, status, WcOpcode::Recv, self.cfg.qpn);
        self.outbox.push_completion(CqKind::Recv, wc);
    }

    fn flush_send_queue(&mut self) {
        while let Some(s) = self.sq.pop_front() {
            self.complete_send(&s, WcStatus::WrFlushErr);
        }
    }

    /// ERR: flush the send queue, then the receive queue.
    fn enter_err(&mut self) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        self.flush_send_queue();
        while let Some(wr) = self.rq.pop_front() {
            self.complete_recv_error(wr.wr_id, WcStatus::WrFlushErr);
        }
        if self.cfg.use_srq {
            self.outbox.push_event(QpEvent::LastWqeReached);
        }
    }

    /// SQE: flush the send queue; receives go on.
    fn enter_sqe(&mut self) {
        if matches!(self.state, QpState::Err | QpState::Sqe) {
            return;
        }
        self.state = QpState::Sqe;
        self.flush_send_queue();
    }

    fn take_recv(&mut self, env: &mut Env<'_>) -> Option<RecvWr> {
        if self.cfg.use_srq {
            env.srq.as_deref_mut().and_then(|s| s.take())
        } else {
            self.rq.pop_front()
        }
    }

    /// Validates a send WR; returns its message length.
    fn validate_send(&self, wr: &SendWr) -> Result<u64, WrError> {
        match wr.opcode {
            SendOpcode::Send | SendOpcode::SendWithImm => {}
            op @ (SendOpcode::LocalInv | SendOpcode::BindMw) => {
                return Err(WrError::LocalOperation(op))
            }
            op => {
                return Err(WrError::OpcodeNotSupported {
                    opcode: op,
                    qp_type: self.cfg.qp_type,
                })
            }
        }
        if wr.ud.is_none() {
            return Err(WrError::MissingDestination);
        }
        let len = wr.payload.len();
        let mtu = self.cfg.pmtu.bytes();
        if len > u64::from(mtu) {
            return Err(WrError::LargerThanMtu { len, mtu });
        }
        Ok(len)
    }

    /// The 40-byte GRH area of a datagram received as `from` whose UDP payload
    /// (BTH..ICRC) is `roce_len` bytes. `None` only if the lengths cannot be written
    /// (not for a packet that fits a UDP datagram).
    fn grh_area(from: &Arrival, roce_len: usize) -> Option<[u8; GRH_LEN]> {
        let (src, dst) = match (from.src, from.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (IpAddr::V4(s), IpAddr::V4(d)),
            (s, d) => (IpAddr::V6(v6(s)), IpAddr::V6(v6(d))),
        };
        let ep = Endpoints {
            src,
            dst,
            src_port: 0,
            dst_port: ROCEV2_UDP_PORT,
        };
        let fields = IpFields {
            hop_limit: from.hop_limit,
            traffic_class: from.traffic_class,
            identification: from.ipv4_id,
            dont_fragment: true,
            flow_label: from.flow_label,
        };
        // IP header + 8 bytes of UDP header.
        let mut scratch = [0u8; GRH_LEN + 8];
        let mut area = [0u8; GRH_LEN];
        let (ip_len, _) = roce_headers_with(&ep, &fields, roce_len, &mut scratch).ok()?;
        let at = if ip_len == IPV4_HEADER_LEN {
            GRH_LEN - IPV4_HEADER_LEN
        } else {
            0
        };
        area.get_mut(at..at + ip_len)?
            .copy_from_slice(scratch.get(..ip_len)?);
        Some(area)
    }
}

/// The RoCE packet type a RoCE HCA reports in a UD receive completion's `sl` (the
/// completion's "flag that indicates if the received frame is an IPv4, IPv6 or RoCE packet",
/// IBA Annex A17.4.5.1; RoCE has no service level on the wire): bit 3 set for a RoCEv2
/// (UDP) frame, bits 2:0 the L3 header, 1 = IPv6, 2 = IPv4. Programs read it to find
/// where the destination address lies in the 40-byte GRH area (UCX's UD transport, for
/// one, drops every datagram whose GRH destination is not one of its GIDs, and takes the
/// address family from these bits).
pub const fn roce_packet_type(from: &Arrival) -> u8 {
    match (from.src, from.dst) {
        (IpAddr::V4(_), IpAddr::V4(_)) => ROCE_V2_IPV4,
        _ => ROCE_V2_IPV6,
    }
}

/// [`roce_packet_type`] of a RoCEv2 datagram over IPv4.
pub const ROCE_V2_IPV4: u8 = 0b1010;
/// [`roce_packet_type`] of a RoCEv2 datagram over IPv6.
pub const ROCE_V2_IPV6: u8 = 0b1001;

fn v6(a: IpAddr) -> std::net::Ipv6Addr {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

impl UdQp {
    /// Checks and delivers one received datagram (see [`Engine::handle_packet`]).
    fn receive(&mut self, from: &Arrival, pkt: &PacketRepr<'_>, env: &mut Env<'_>) {
        self.counters.packets_received += 1;
        // A multicast datagram (DestQP 0xFFFFFF) reaches only the UD QPs attached to its
        // group: the caller decides which (see the module doc).
        let multicast = pkt.bth.dest_qp == MULTICAST_QPN && !self.is_gsi();
        if pkt.bth.dest_qp != self.cfg.qpn && !multicast {
            self.drop_packet(|c| &mut c.dropped_wrong_state);
            return;
        }
        if !pkey_match(pkt.bth.pkey, self.cfg.pkey) {
            self.drop_packet(|c| &mut c.dropped_bad_pkey);
            return;
        }
        let info = opcode::info(pkt.bth.opcode).filter(|i| {
            i.transport == Transport::Ud
                && i.operation == Operation::Send
                && pkt.present_headers() == i.headers
        });
        let (Some(_), Some(d)) = (info, pkt.deth) else {
            self.drop_packet(|c| &mut c.dropped_bad_opcode);
            return;
        };
        if !self.state.responder_active() {
            self.drop_packet(|c| &mut c.dropped_wrong_state);
            return;
        }
        if d.qkey != self.cfg.qkey {
            self.drop_packet(|c| &mut c.dropped_bad_qkey);
            return;
        }
        let len = pkt.payload.len();
        if len > self.cfg.pmtu.bytes() as usize {
            self.drop_packet(|c| &mut c.dropped_too_long);
            return;
        }
        let roce_len = pkt.header_len() + len + usize::from(pkt.bth.pad_cnt & 3) + ICRC_LEN;
        let Some(grh) = Self::grh_area(from, roce_len) else {
            self.drop_packet(|c| &mut c.dropped_too_long);
            return;
        };
        let Some(wr) = self.take_recv(env) else {
            self.drop_packet(|c| &mut c.dropped_no_receive);
            return;
        };
        let total = (GRH_LEN + len) as u64;
        if sg_total(&wr.sg_list) < total {
            self.drop_packet(|c| &mut c.dropped_recv_too_small);
            self.complete_recv_error(wr.wr_id, WcStatus::LocLenErr);
            return;
        }
        if scatter(env.mem, &wr.sg_list, 0, &grh).is_err()
            || scatter(env.mem, &wr.sg_list, GRH_LEN as u64, pkt.payload).is_err()
        {
            self.complete_recv_error(wr.wr_id, WcStatus::LocProtErr);
            self.enter_err();
            return;
        }
        let mut wc = WorkCompletion::new(wr.wr_id, WcStatus::Success, WcOpcode::Recv, self.cfg.qpn);
        // invariant: total ≤ 40 + PMTU.
        wc.byte_len = u32::try_from(total).unwrap_or(u32::MAX);
        wc.src_qp = d.src_qp & 0x00ff_ffff;
        wc.wc_flags = WcFlags::GRH;
        if let Some(imm) = pkt.immdt {
            wc.wc_flags |= WcFlags::WITH_IMM;
            wc.imm_data = imm.imm;
        }
        wc.pkey_index = self.cfg.pkey_index;
        wc.solicited = pkt.bth.solicited;
        wc.sl = roce_packet_type(from);
        self.outbox.push_completion(CqKind::Recv, wc);
    }
}

impl Engine for UdQp {
    fn qpn(&self) -> u32 {
        self.cfg.qpn
    }

    fn qp_type(&self) -> QpType {
        self.cfg.qp_type
    }

    fn state(&self) -> QpState {
        self.state
    }

    fn counters(&self) -> EngineCounters {
        self.counters.clone()
    }

    /// True when the send queue is empty (a UD QP has nothing in flight).
    fn is_idle(&self) -> bool {
        self.sq.is_empty()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn handle_packet(
        &mut self,
        _now: Instant,
        from: &Arrival,
        pkt: &PacketRepr<'_>,
        env: &mut Env<'_>,
    ) -> Reply {
        // A datagram is never answered: nothing to defer.
        self.receive(from, pkt, env);
        Reply::Now
    }

    fn handle_timeout(&mut self, _now: Instant, _env: &mut Env<'_>) {}

    /// Queues a send WR (RTS; SQD: it waits for RTS). In SQE and ERR it is accepted and
    /// completed at once with `WR_FLUSH_ERR`.
    ///
    /// Errors: `BadState` in RESET, INIT, RTR; `QueueFull` when `max_send_wr` WRs are
    /// queued or completed but not yet polled; `InvalidWr` as in the module doc.
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if self.state.send_post().is_none() {
            return Err(PostError::BadState(self.state));
        }
        let len = self.validate_send(&wr).map_err(PostError::InvalidWr)?;
        if self.sq.len() + self.outbox.send_cqes() >= self.cfg.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        let s = UdSend { wr, len };
        if matches!(self.state, QpState::Sqe | QpState::Err) {
            self.complete_send(&s, WcStatus::WrFlushErr);
        } else {
            self.sq.push_back(s);
        }
        Ok(())
    }

    /// Queues a receive WR. In ERR it is accepted and completed at once with
    /// `WR_FLUSH_ERR`.
    ///
    /// Errors: `BadState` in RESET; `QueueFull` at `max_recv_wr` (counting completions not
    /// yet polled); `InvalidWr` on a QP that takes its receive WQEs from an SRQ.
    fn check_send_list(&self, wrs: &[SendWr]) -> Result<(), (usize, PostError)> {
        if self.state.send_post().is_none() {
            return Err((0, PostError::BadState(self.state)));
        }
        for (i, wr) in wrs.iter().enumerate() {
            self.validate_send(wr)
                .map_err(|e| (i, PostError::InvalidWr(e)))?;
        }
        let used = self.sq.len() + self.outbox.send_cqes();
        let room = (self.cfg.max_send_wr as usize).saturating_sub(used);
        if wrs.len() > room {
            return Err((room, PostError::QueueFull));
        }
        Ok(())
    }

    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.cfg.use_srq {
            return Err(PostError::InvalidWr(WrError::UsesSrq));
        }
        if self.state == QpState::Reset {
            return Err(PostError::BadState(self.state));
        }
        if self.rq.len() + self.outbox.recv_cqes() >= self.cfg.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if self.state == QpState::Err {
            self.complete_recv_error(wr.wr_id, WcStatus::WrFlushErr);
        } else {
            self.rq.push_back(wr);
        }
        Ok(())
    }

    /// RTR→RTS: sending starts at `rts.sq_psn` (the other attributes are RC's). SQD or
    /// SQE→RTS resumes sending with the PSNs already in use. Other states: nothing.
    fn enter_rts(&mut self, rts: RtsAttrs) {
        match self.state {
            QpState::Rtr => {
                self.cfg.sq_psn = rts.sq_psn;
                self.next_psn = rts.sq_psn;
                self.state = QpState::Rts;
            }
            QpState::Rts | QpState::Sqd | QpState::Sqe => self.state = QpState::Rts,
            _ => {}
        }
    }

    /// Application-driven state change: ERR flushes both queues, SQE the send queue,
    /// RESET discards both and restarts the PSN at `sq_psn`, SQD raises `SqDrained` at
    /// once. From ERR only RESET leaves.
    fn set_state(&mut self, to: QpState) {
        match to {
            QpState::Err => self.enter_err(),
            QpState::Reset => {
                self.sq.clear();
                self.rq.clear();
                self.next_psn = self.cfg.sq_psn;
                self.state = QpState::Reset;
            }
            _ if self.state == QpState::Err => {}
            QpState::Sqe => self.enter_sqe(),
            QpState::Sqd => {
                if self.state != QpState::Sqd {
                    self.state = QpState::Sqd;
                    self.outbox.push_event(QpEvent::SqDrained);
                }
            }
            other => self.state = other,
        }
    }

    fn reconfigure(&mut self, attrs: &LiveAttrs) {
        // The GSI QP's Q_Key is fixed (IBA 13.5.3, 0x80010000).
        if !self.is_gsi() {
            self.cfg.qkey = attrs.qkey;
        }
        self.cfg.pkey = attrs.pkey;
        self.cfg.pkey_index = attrs.pkey_index;
    }

    fn poll_transmit(
        &mut self,
        _now: Instant,
        env: &mut Env<'_>,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if self.state != QpState::Rts {
            return None;
        }
        let s = self.sq.front()?;
        // invariant: post_send refuses WRs without a destination.
        let dest = s.wr.ud?;
        let with_imm = s.wr.opcode == SendOpcode::SendWithImm;
        let bth = bth::Repr {
            opcode: if with_imm {
                opcode::op::UD_SEND_ONLY_WITH_IMM
            } else {
                opcode::op::UD_SEND_ONLY
            },
            solicited: s.wr.flags.contains(SendFlags::SOLICITED),
            mig_req: false,
            pad_cnt: 0,
            pkey: self.cfg.pkey,
            fecn: false,
            becn: false,
            dest_qp: dest.remote_qpn & 0x00ff_ffff,
            ack_req: self.is_gsi(),
            psn: self.next_psn,
        };
        let mut hdr = PacketRepr::new(bth, &[]);
        hdr.deth = Some(deth::Repr {
            qkey: self.send_qkey(dest.remote_qkey),
            src_qp: self.cfg.qpn,
        });
        if with_imm {
            hdr.immdt = Some(immdt::Repr { imm: s.wr.imm_data });
        }
        // invariant: len ≤ PMTU ≤ 4096 (post-time check).
        let len = usize::try_from(s.len).unwrap_or(usize::MAX);
        let built = build(buf, &hdr, len, |dst| {
            fill_payload(env.mem, &s.wr.payload, 0, dst)
        });
        match built {
            Ok(n) => {
                let s = self.sq.pop_front()?;
                self.next_psn = self.next_psn.wrapping_add(1);
                self.counters.packets_sent += 1;
                self.complete_send(&s, WcStatus::Success);
                Some(Transmit {
                    len: n,
                    dst: dest.ip,
                })
            }
            Err(BuildError::Buffer) => None,
            Err(BuildError::Fill(_)) => {
                // Our own SGEs cannot be read: LOC_PROT_ERR, send queue error.
                if let Some(s) = self.sq.pop_front() {
                    self.complete_send(&s, WcStatus::LocProtErr);
                }
                self.enter_sqe();
                None
            }
        }
    }

    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        self.outbox.pop_completion()
    }

    fn poll_event(&mut self) -> Option<QpEvent> {
        self.outbox.pop_event()
    }
}
