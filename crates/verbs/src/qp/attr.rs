//! QP attributes: creation (`ibv_qp_init_attr`, `ibv_qp_cap`) and `modify_qp` /
//! `query_qp` (`ibv_qp_attr`).

use uroce_proto::qp_state::{AttrMask, QpState, QpType};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

use crate::ah::AhAttr;
use crate::cq::Cq;
use crate::mr::AccessFlags;
use crate::srq::Srq;

/// Queue sizes (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// Maximum outstanding send WRs.
    pub max_send_wr: u32,
    /// Maximum outstanding receive WRs.
    pub max_recv_wr: u32,
    /// Maximum SGEs per send WR.
    pub max_send_sge: u32,
    /// Maximum SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Maximum inline payload per send WR.
    pub max_inline_data: u32,
}

/// QP creation attributes (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Transport type.
    pub qp_type: QpType,
    /// CQ for send completions (required).
    pub send_cq: Option<&'a Cq>,
    /// CQ for receive completions (required unless XRC_SEND).
    pub recv_cq: Option<&'a Cq>,
    /// Shared receive queue to receive from.
    pub srq: Option<&'a Srq>,
    /// Queue sizes; the created QP reports the actual ones in [`QpInitInfo::cap`].
    pub cap: QpCap,
    /// Generate a completion for every send WR, signaled or not.
    pub sq_sig_all: bool,
}

impl<'a> QpInitAttr<'a> {
    /// Attributes with both CQs given, no SRQ, `sq_sig_all` off.
    pub fn new(qp_type: QpType, send_cq: &'a Cq, recv_cq: &'a Cq, cap: QpCap) -> QpInitAttr<'a> {
        QpInitAttr {
            qp_type,
            send_cq: Some(send_cq),
            recv_cq: Some(recv_cq),
            srq: None,
            cap,
            sq_sig_all: false,
        }
    }
}

/// What a QP was created with (the `ibv_qp_init_attr` that `query_qp` returns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitInfo {
    /// Transport type.
    pub qp_type: QpType,
    /// Actual queue sizes.
    pub cap: QpCap,
    /// Whether every send WR is signaled.
    pub sq_sig_all: bool,
    /// Id of the send CQ.
    pub send_cq: Option<u32>,
    /// Id of the receive CQ.
    pub recv_cq: Option<u32>,
    /// Number of the SRQ.
    pub srq_num: Option<u32>,
    /// Id of the XRC domain (XRC_RECV).
    pub xrcd: Option<u32>,
}

/// Path migration state (`enum ibv_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum PathMigState {
    /// `IBV_MIG_MIGRATED` = 0.
    #[default]
    Migrated = 0,
    /// `IBV_MIG_REARM` = 1.
    Rearm = 1,
    /// `IBV_MIG_ARMED` = 2.
    Armed = 2,
}

/// QP attributes (`struct ibv_qp_attr`): the input of `modify_qp` (fields selected by an
/// [`AttrMask`]) and the output of `query_qp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state (`STATE`) / current state (query).
    pub qp_state: QpState,
    /// The state the caller believes the QP is in (`CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU (`PATH_MTU`).
    pub path_mtu: Pmtu,
    /// Path migration state (`PATH_MIG_STATE`).
    pub path_mig_state: PathMigState,
    /// Q_Key (`QKEY`).
    pub qkey: u32,
    /// Responder's expected PSN (`RQ_PSN`).
    pub rq_psn: Psn,
    /// Requester's first PSN (`SQ_PSN`).
    pub sq_psn: Psn,
    /// Remote QPN (`DEST_QPN`).
    pub dest_qp_num: u32,
    /// Remote access rights (`ACCESS_FLAGS`).
    pub qp_access_flags: AccessFlags,
    /// Queue sizes (query only; `CAP` is not modifiable).
    pub cap: QpCap,
    /// Primary address vector (`AV`).
    pub ah_attr: AhAttr,
    /// Alternate address vector (`ALT_PATH`; refused on RoCE).
    pub alt_ah_attr: AhAttr,
    /// P_Key index (`PKEY_INDEX`).
    pub pkey_index: u16,
    /// Alternate P_Key index (`ALT_PATH`).
    pub alt_pkey_index: u16,
    /// Request `SQ_DRAINED` (`EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: bool,
    /// Whether the send queue is draining (query only).
    pub sq_draining: bool,
    /// Outstanding READ/atomic as initiator (`MAX_QP_RD_ATOMIC`).
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic as responder (`MAX_DEST_RD_ATOMIC`).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (`MIN_RNR_TIMER`).
    pub min_rnr_timer: u8,
    /// Port (`PORT`).
    pub port_num: u8,
    /// Local ACK timeout exponent (`TIMEOUT`).
    pub timeout: u8,
    /// Retry count (`RETRY_CNT`).
    pub retry_cnt: u8,
    /// RNR retry count (`RNR_RETRY`).
    pub rnr_retry: u8,
    /// Alternate port (`ALT_PATH`).
    pub alt_port_num: u8,
    /// Alternate timeout (`ALT_PATH`).
    pub alt_timeout: u8,
    /// Rate limit in kbps (`RATE_LIMIT`, raw packet QPs).
    pub rate_limit: u32,
}

impl Default for QpAttr {
    /// The attributes of a QP in RESET: path MTU 256 (what rxe starts with, §1.6), port 1,
    /// everything else zero.
    fn default() -> QpAttr {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Pmtu::Mtu256,
            path_mig_state: PathMigState::Migrated,
            qkey: 0,
            rq_psn: Psn::ZERO,
            sq_psn: Psn::ZERO,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: crate::device::PORT_NUM,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

impl QpAttr {
    /// Copies the fields selected by `mask` from `src`.
    pub(super) fn apply(&mut self, src: &QpAttr, mask: AttrMask) {
        if mask.contains(AttrMask::EN_SQD_ASYNC_NOTIFY) {
            self.en_sqd_async_notify = src.en_sqd_async_notify;
        }
        if mask.contains(AttrMask::ACCESS_FLAGS) {
            self.qp_access_flags = src.qp_access_flags;
        }
        if mask.contains(AttrMask::PKEY_INDEX) {
            self.pkey_index = src.pkey_index;
        }
        if mask.contains(AttrMask::PORT) {
            self.port_num = src.port_num;
        }
        if mask.contains(AttrMask::QKEY) {
            self.qkey = src.qkey;
        }
        if mask.contains(AttrMask::AV) {
            self.ah_attr = src.ah_attr;
        }
        if mask.contains(AttrMask::PATH_MTU) {
            self.path_mtu = src.path_mtu;
        }
        if mask.contains(AttrMask::TIMEOUT) {
            self.timeout = src.timeout;
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            self.retry_cnt = src.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            self.rnr_retry = src.rnr_retry;
        }
        if mask.contains(AttrMask::RQ_PSN) {
            self.rq_psn = src.rq_psn;
        }
        if mask.contains(AttrMask::MAX_QP_RD_ATOMIC) {
            self.max_rd_atomic = src.max_rd_atomic;
        }
        if mask.contains(AttrMask::ALT_PATH) {
            self.alt_ah_attr = src.alt_ah_attr;
            self.alt_pkey_index = src.alt_pkey_index;
            self.alt_port_num = src.alt_port_num;
            self.alt_timeout = src.alt_timeout;
        }
        if mask.contains(AttrMask::MIN_RNR_TIMER) {
            self.min_rnr_timer = src.min_rnr_timer;
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.sq_psn = src.sq_psn;
        }
        if mask.contains(AttrMask::MAX_DEST_RD_ATOMIC) {
            self.max_dest_rd_atomic = src.max_dest_rd_atomic;
        }
        if mask.contains(AttrMask::PATH_MIG_STATE) {
            self.path_mig_state = src.path_mig_state;
        }
        if mask.contains(AttrMask::DEST_QPN) {
            self.dest_qp_num = src.dest_qp_num;
        }
        if mask.contains(AttrMask::RATE_LIMIT) {
            self.rate_limit = src.rate_limit;
        }
    }
}
