//! Bringing a QP from RESET to RTS: the three `modify_qp` calls every program makes, with
//! the attributes of each transition in one place, for each transport.
//!
//! * RC: programs that exchange QP numbers and PSNs out of band move the QP to INIT first
//!   ([`rc_init_attr`]), exchange, then to RTR and RTS ([`RcConnect::rtr_attr`],
//!   [`RcConnect::rts_attr`]); programs that know everything up front call
//!   [`QpRef::connect_rc`].
//! * UC: the same with [`UcConnect`] ([`uc_init_attr`], [`QpRef::connect_uc`],
//!   [`QpRef::connect_uc_from_init`]); UC has no retries, timeouts or READ/atomic
//!   resources.
//! * UD: no peer at all: [`QpRef::activate_ud`] with the QP's Q_Key (the destination of
//!   each send is in its work request), or [`UdActivate`] for the individual steps.

use std::net::IpAddr;

use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

use crate::ah::AhAttr;
use crate::device::PORT_NUM;
use crate::error::ModifyQpError;
use crate::mr::AccessFlags;
use crate::qp::{QpAttr, QpRef};
use crate::{AttrMask, QpState, QpType};

/// RESET→INIT for an RC QP: port 1, P_Key index 0, and what remote peers may do
/// (`access`, e.g. REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC).
pub fn rc_init_attr(access: AccessFlags) -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: PORT_NUM,
        qp_access_flags: access,
        ..QpAttr::default()
    };
    (
        attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
}

/// The attributes of an RC connection to one remote QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcConnect {
    /// What remote peers may do on this QP (INIT).
    pub access: AccessFlags,
    /// The peer's address (its GID 0): where the QP's packets go (RTR).
    pub dest_ip: IpAddr,
    /// The peer's QP number (RTR).
    pub dest_qpn: u32,
    /// Path MTU (RTR).
    pub path_mtu: Pmtu,
    /// First PSN expected from the peer: the peer's `sq_psn` (RTR).
    pub rq_psn: Psn,
    /// Incoming READ/atomic requests outstanding at once (RTR).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code sent to a peer that finds no receive posted (RTR).
    pub min_rnr_timer: u8,
    /// First PSN this QP sends (RTS).
    pub sq_psn: Psn,
    /// Local ACK timeout code: 4.096 µs × 2^timeout (RTS).
    pub timeout: u8,
    /// Retries after a timeout or sequence NAK, 0..=7 (RTS).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK, 7 = unlimited (RTS).
    pub rnr_retry: u8,
    /// Outgoing READ/atomic requests outstanding at once (RTS).
    pub max_rd_atomic: u8,
}

impl RcConnect {
    /// A connection to QP `dest_qpn` at `dest_ip`: every remote access allowed, path MTU
    /// 1024, PSNs 0, 16 READ/atomics each way, RNR timer code 12 (0.64 ms), local ACK
    /// timeout 14 (67 ms), 7 retries, unlimited RNR retries.
    pub fn new(dest_ip: IpAddr, dest_qpn: u32) -> RcConnect {
        RcConnect {
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            dest_ip,
            dest_qpn,
            path_mtu: Pmtu::Mtu1024,
            rq_psn: Psn::ZERO,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            sq_psn: Psn::ZERO,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }
    }

    /// RESET→INIT ([`rc_init_attr`] with this connection's access flags).
    pub fn init_attr(&self) -> (QpAttr, AttrMask) {
        rc_init_attr(self.access)
    }

    /// INIT→RTR: the peer's address and QP, path MTU, expected PSN, responder resources,
    /// RNR timer.
    pub fn rtr_attr(&self) -> (QpAttr, AttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: AhAttr::to_ip(self.dest_ip),
            path_mtu: self.path_mtu,
            dest_qp_num: self.dest_qpn,
            rq_psn: self.rq_psn,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            ..QpAttr::default()
        };
        (
            attr,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN
                | AttrMask::MAX_DEST_RD_ATOMIC
                | AttrMask::MIN_RNR_TIMER,
        )
    }

    /// INIT→RTR for a QP of type `t`: [`RcConnect::rtr_attr`], without the responder
    /// attributes (`max_dest_rd_atomic`, `min_rnr_timer`) for an XRC initiator, which has
    /// no responder (IBA Vol 1 Annex A14; the modify table's XRC_INI row).
    pub fn rtr_attr_for(&self, t: QpType) -> (QpAttr, AttrMask) {
        let (attr, mask) = self.rtr_attr();
        if t == QpType::XrcSend {
            (
                attr,
                mask - (AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER),
            )
        } else {
            (attr, mask)
        }
    }

    /// RTR→RTS for a QP of type `t`: [`RcConnect::rts_attr`]; an XRC target, which sends
    /// only responses, takes just `sq_psn` and `timeout` (the modify table's XRC_TGT row).
    pub fn rts_attr_for(&self, t: QpType) -> (QpAttr, AttrMask) {
        let (attr, mask) = self.rts_attr();
        if t == QpType::XrcRecv {
            (attr, AttrMask::STATE | AttrMask::SQ_PSN | AttrMask::TIMEOUT)
        } else {
            (attr, mask)
        }
    }

    /// RTR→RTS: first PSN, ACK timeout, retry counts, initiator depth.
    pub fn rts_attr(&self) -> (QpAttr, AttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.sq_psn,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
            ..QpAttr::default()
        };
        (
            attr,
            AttrMask::STATE
                | AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC,
        )
    }
}

/// RESET→INIT for a UC QP: port 1, P_Key index 0, and what remote peers may do
/// (UC allows at most REMOTE_WRITE).
pub fn uc_init_attr(access: AccessFlags) -> (QpAttr, AttrMask) {
    rc_init_attr(access)
}

/// The attributes of a UC connection to one remote QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UcConnect {
    /// What remote peers may do on this QP (INIT; UC: REMOTE_WRITE or nothing).
    pub access: AccessFlags,
    /// The peer's address (its GID 0): where the QP's packets go (RTR).
    pub dest_ip: IpAddr,
    /// The peer's QP number (RTR).
    pub dest_qpn: u32,
    /// Path MTU (RTR).
    pub path_mtu: Pmtu,
    /// First PSN expected from the peer: the peer's `sq_psn` (RTR).
    pub rq_psn: Psn,
    /// First PSN this QP sends (RTS).
    pub sq_psn: Psn,
}

impl UcConnect {
    /// A connection to QP `dest_qpn` at `dest_ip`: remote writes allowed, path MTU 1024,
    /// PSNs 0.
    pub fn new(dest_ip: IpAddr, dest_qpn: u32) -> UcConnect {
        UcConnect {
            access: AccessFlags::REMOTE_WRITE,
            dest_ip,
            dest_qpn,
            path_mtu: Pmtu::Mtu1024,
            rq_psn: Psn::ZERO,
            sq_psn: Psn::ZERO,
        }
    }

    /// RESET→INIT ([`uc_init_attr`] with this connection's access flags).
    pub fn init_attr(&self) -> (QpAttr, AttrMask) {
        uc_init_attr(self.access)
    }

    /// INIT→RTR: the peer's address and QP, path MTU, expected PSN.
    pub fn rtr_attr(&self) -> (QpAttr, AttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: AhAttr::to_ip(self.dest_ip),
            path_mtu: self.path_mtu,
            dest_qp_num: self.dest_qpn,
            rq_psn: self.rq_psn,
            ..QpAttr::default()
        };
        (
            attr,
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN,
        )
    }

    /// RTR→RTS: the first PSN.
    pub fn rts_attr(&self) -> (QpAttr, AttrMask) {
        rts_psn_attr(self.sq_psn)
    }
}

/// RTR→RTS with only the first PSN (UC, UD, GSI).
fn rts_psn_attr(sq_psn: Psn) -> (QpAttr, AttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        ..QpAttr::default()
    };
    (attr, AttrMask::STATE | AttrMask::SQ_PSN)
}

/// The attributes that make a UD (or GSI) QP ready to send and receive. A datagram QP has
/// no peer: every send names its destination (an address handle, the remote QPN and
/// Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdActivate {
    /// The QP's Q_Key: what incoming datagrams must carry (INIT). A GSI QP always uses
    /// 0x80010000 (IBA ch. 13).
    pub qkey: u32,
    /// P_Key index (INIT).
    pub pkey_index: u16,
    /// First PSN this QP sends (RTS).
    pub sq_psn: Psn,
}

impl UdActivate {
    /// Q_Key `qkey`, P_Key index 0, PSN 0.
    pub fn new(qkey: u32) -> UdActivate {
        UdActivate {
            qkey,
            pkey_index: 0,
            sq_psn: Psn::ZERO,
        }
    }

    /// RESET→INIT for a QP of type `qp_type`: Q_Key and P_Key index; the port too on UD
    /// (the state table does not take it on GSI).
    pub fn init_attr(&self, qp_type: QpType) -> (QpAttr, AttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: self.pkey_index,
            port_num: PORT_NUM,
            qkey: self.qkey,
            ..QpAttr::default()
        };
        let mut mask = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::QKEY;
        if qp_type != QpType::Gsi {
            mask |= AttrMask::PORT;
        }
        (attr, mask)
    }

    /// INIT→RTR: nothing but the state.
    pub fn rtr_attr(&self) -> (QpAttr, AttrMask) {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        (attr, AttrMask::STATE)
    }

    /// RTR→RTS: the first PSN.
    pub fn rts_attr(&self) -> (QpAttr, AttrMask) {
        rts_psn_attr(self.sq_psn)
    }
}

impl QpRef {
    /// RESET→INIT→RTR→RTS for a UC QP with `c` (stops at the first error, leaving the QP
    /// in the state reached).
    pub fn connect_uc(&self, c: &UcConnect) -> Result<(), ModifyQpError> {
        for (attr, mask) in [c.init_attr(), c.rtr_attr(), c.rts_attr()] {
            self.modify(&attr, mask)?;
        }
        Ok(())
    }

    /// INIT→RTR→RTS for a UC QP already in INIT (e.g. moved there with [`uc_init_attr`]
    /// before the out-of-band exchange).
    pub fn connect_uc_from_init(&self, c: &UcConnect) -> Result<(), ModifyQpError> {
        for (attr, mask) in [c.rtr_attr(), c.rts_attr()] {
            self.modify(&attr, mask)?;
        }
        Ok(())
    }

    /// RESET→INIT→RTR→RTS for a UD or GSI QP with Q_Key `qkey`, P_Key index 0 and PSN 0:
    /// the QP then receives datagrams that carry `qkey` and sends to any destination.
    pub fn activate_ud(&self, qkey: u32) -> Result<(), ModifyQpError> {
        self.activate_ud_with(&UdActivate::new(qkey))
    }

    /// RESET→INIT→RTR→RTS for a UD or GSI QP with `a`.
    pub fn activate_ud_with(&self, a: &UdActivate) -> Result<(), ModifyQpError> {
        for (attr, mask) in [a.init_attr(self.qp_type()), a.rtr_attr(), a.rts_attr()] {
            self.modify(&attr, mask)?;
        }
        Ok(())
    }
}

impl QpRef {
    /// RESET→INIT→RTR→RTS with `c` (three `modify` calls; stops at the first error, which
    /// names the attribute and leaves the QP in the state reached).
    pub fn connect_rc(&self, c: &RcConnect) -> Result<(), ModifyQpError> {
        let t = self.qp_type();
        for (attr, mask) in [c.init_attr(), c.rtr_attr_for(t), c.rts_attr_for(t)] {
            self.modify(&attr, mask)?;
        }
        Ok(())
    }

    /// INIT→RTR→RTS with `c`, for a QP already moved to INIT (e.g. with [`rc_init_attr`]
    /// before the out-of-band exchange).
    pub fn connect_rc_from_init(&self, c: &RcConnect) -> Result<(), ModifyQpError> {
        let t = self.qp_type();
        for (attr, mask) in [c.rtr_attr_for(t), c.rts_attr_for(t)] {
            self.modify(&attr, mask)?;
        }
        Ok(())
    }
}
