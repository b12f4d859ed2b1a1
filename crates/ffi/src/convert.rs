//! The conversions between the C work-request / completion / attribute structures of
//! `<infiniband/verbs.h>` and uroce-verbs' types (every refusal an [`FfiError`], never a
//! panic: the values come from the application).

use std::io::Write as _;

use uroce_verbs::{
    AccessFlags, AhAttr, AtomicInfo, Gid, PathMigState, QpAttr, QpCap, QpState, RdmaInfo, RecvWr,
    SendFlags, SendOpcode, SendWr, Sge, WorkCompletion,
};
use uroce_verbs::{AttrMask, WcFlags};
use uroce_verbs::{InlineData, SgList, UdDest};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

use crate::abi::*;
use crate::error::FfiError;
use crate::handle::Handle;
use crate::objects::*;

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a device may ignore (relaxed ordering, …).
pub const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// MR access flags from C (optional bits dropped; unknown required bits refused).
pub(crate) fn mr_access(access: i32) -> Result<AccessFlags, FfiError> {
    let bits = (access as u32) & !ACCESS_OPTIONAL_RANGE;
    AccessFlags::from_bits(bits).ok_or(FfiError::Invalid("unknown access flag bits"))
}

/// The 20 bits of a GRH flow label (IBA Vol 1 §8.3.1; the IPv6 flow label of RoCEv2).
pub const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// `ibv_ah_attr` → [`AhAttr`]. A flow label with bits above the 20 is masked, not
/// refused (programs written for other NICs set all ones; only 20 bits reach the wire);
/// `UROCE_DEBUG` says so.
pub(crate) fn ah_from_c(a: &ibv_ah_attr) -> AhAttr {
    // SAFETY: every bit pattern of the 16-byte GID union is a valid `[u8; 16]`.
    let dgid = unsafe { a.grh.dgid.raw };
    let flow_label = a.grh.flow_label & FLOW_LABEL_MASK;
    if flow_label != a.grh.flow_label && crate::entry::debug_enabled() {
        // A failed write to stderr is ignored: diagnostics must not fail the call.
        let _ = writeln!(
            std::io::stderr(),
            "uroce: GRH flow label {:#x} masked to its 20 bits ({flow_label:#x})",
            a.grh.flow_label
        );
    }
    AhAttr {
        dgid: Gid(dgid),
        flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        sl: a.sl,
        static_rate: a.static_rate,
        port_num: a.port_num,
        is_global: a.is_global != 0,
    }
}

/// [`AhAttr`] → `ibv_ah_attr`.
pub(crate) fn ah_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.dgid.0 },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: 0,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

/// `ibv_qp_cap` → [`QpCap`].
pub(crate) fn cap_from_c(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// [`QpCap`] → `ibv_qp_cap`.
pub(crate) fn cap_to_c(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn state_from_c(v: u32) -> Result<QpState, FfiError> {
    QpState::from_u32(v).ok_or(FfiError::Invalid("unknown QP state"))
}

/// The attributes `mask` selects from a C `ibv_qp_attr` (unselected fields keep their
/// defaults and are not validated).
pub(crate) fn qp_attr_from_c(a: &ibv_qp_attr, mask: u32) -> Result<(QpAttr, AttrMask), FfiError> {
    let mask = AttrMask::from_bits(mask).ok_or(FfiError::Invalid("unknown attr_mask bits"))?;
    let mut q = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        q.qp_state = state_from_c(a.qp_state)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        q.cur_qp_state = state_from_c(a.cur_qp_state)?;
    }
    if mask.contains(AttrMask::PATH_MTU) {
        q.path_mtu = u8::try_from(a.path_mtu)
            .ok()
            .and_then(Pmtu::from_enum)
            .ok_or(FfiError::Invalid("path_mtu"))?;
    }
    if mask.contains(AttrMask::PATH_MIG_STATE) {
        q.path_mig_state = match a.path_mig_state {
            IBV_MIG_MIGRATED => PathMigState::Migrated,
            IBV_MIG_REARM => PathMigState::Rearm,
            IBV_MIG_ARMED => PathMigState::Armed,
            _ => return Err(FfiError::Invalid("path_mig_state")),
        };
    }
    q.qkey = a.qkey;
    q.rq_psn = Psn::new(a.rq_psn);
    q.sq_psn = Psn::new(a.sq_psn);
    q.dest_qp_num = a.dest_qp_num;
    // Access bits the engine does not know (relaxed ordering, …) are ignored, as devices do.
    q.qp_access_flags = AccessFlags::from_bits_truncate(a.qp_access_flags);
    q.cap = cap_from_c(&a.cap);
    if mask.contains(AttrMask::AV) {
        q.ah_attr = ah_from_c(&a.ah_attr);
    }
    if mask.contains(AttrMask::ALT_PATH) {
        q.alt_ah_attr = ah_from_c(&a.alt_ah_attr);
    }
    q.pkey_index = a.pkey_index;
    q.alt_pkey_index = a.alt_pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    if mask.contains(AttrMask::PORT) {
        q.port_num = a.port_num;
    }
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    q.alt_port_num = a.alt_port_num;
    q.alt_timeout = a.alt_timeout;
    q.rate_limit = a.rate_limit;
    Ok((q, mask))
}

/// [`QpAttr`] → `ibv_qp_attr`.
pub(crate) fn qp_attr_to_c(q: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: q.qp_state.as_u32(),
        cur_qp_state: q.cur_qp_state.as_u32(),
        path_mtu: q.path_mtu.enum_value().into(),
        path_mig_state: q.path_mig_state as u32,
        qkey: q.qkey,
        rq_psn: q.rq_psn.value(),
        sq_psn: q.sq_psn.value(),
        dest_qp_num: q.dest_qp_num,
        qp_access_flags: q.qp_access_flags.bits(),
        cap: cap_to_c(&q.cap),
        ah_attr: ah_to_c(&q.ah_attr),
        alt_ah_attr: ah_to_c(&q.alt_ah_attr),
        pkey_index: q.pkey_index,
        alt_pkey_index: q.alt_pkey_index,
        en_sqd_async_notify: u8::from(q.en_sqd_async_notify),
        sq_draining: u8::from(q.sq_draining),
        max_rd_atomic: q.max_rd_atomic,
        max_dest_rd_atomic: q.max_dest_rd_atomic,
        min_rnr_timer: q.min_rnr_timer,
        port_num: q.port_num,
        timeout: q.timeout,
        retry_cnt: q.retry_cnt,
        rnr_retry: q.rnr_retry,
        alt_port_num: q.alt_port_num,
        alt_timeout: q.alt_timeout,
        rate_limit: q.rate_limit,
    }
}

/// The C SGE list of a work request.
///
/// # Safety
/// `sg_list` is valid for reading `num_sge` entries when `num_sge > 0`.
unsafe fn sges_from_c(sg_list: *const ibv_sge, num_sge: i32) -> Result<SgList, FfiError> {
    let n = usize::try_from(num_sge).map_err(|_| FfiError::Invalid("negative num_sge"))?;
    if n == 0 {
        return Ok(SgList::new());
    }
    if sg_list.is_null() {
        return Err(FfiError::Invalid("sg_list is NULL"));
    }
    // SAFETY: caller guarantee: `sg_list` holds `num_sge` readable entries (non-NULL).
    let list = unsafe { std::slice::from_raw_parts(sg_list, n) };
    Ok(list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

/// Most SGEs uroce accepts in one C work request before even looking at the QP's limit
/// (bounds the copy of an absurd `num_sge`).
const MAX_C_SGE: i32 = 1 << 16;

/// Converts one C send WR (not following `next`). With `IBV_SEND_INLINE` the payload is
/// copied from the SGE addresses now, as the verbs contract allows the application to
/// reuse the buffers as soon as the post returns.
///
/// # Safety
/// `wr.sg_list` is valid for `wr.num_sge` entries; with `IBV_SEND_INLINE` every SGE
/// describes readable memory.
pub(crate) unsafe fn send_wr_from_c(wr: &ibv_send_wr, max_inline: u32) -> Result<SendWr, FfiError> {
    if wr.num_sge > MAX_C_SGE {
        return Err(FfiError::Invalid("num_sge too large"));
    }
    let opcode = SendOpcode::from_u32(wr.opcode).ok_or(FfiError::Invalid("unknown opcode"))?;
    let flags =
        SendFlags::from_bits(wr.send_flags).ok_or(FfiError::Invalid("unknown send_flags"))?;
    // SAFETY: forwarded caller guarantee on sg_list/num_sge.
    let sges = unsafe { sges_from_c(wr.sg_list, wr.num_sge)? };
    let mut out = SendWr {
        wr_id: wr.wr_id,
        opcode,
        flags,
        ..SendWr::default()
    };
    if flags.contains(SendFlags::INLINE) {
        let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        // ATOMIC WRITE's 8 bytes are an operand, not inline data: `max_inline_data` does
        // not limit them (its length is checked when the WR is posted).
        if total > u64::from(max_inline) && opcode != SendOpcode::AtomicWrite {
            return Err(FfiError::Invalid("inline data longer than max_inline_data"));
        }
        let mut data = InlineData::with_capacity(usize::try_from(total).unwrap_or(0));
        for s in &sges {
            let len = usize::try_from(s.length).unwrap_or(usize::MAX);
            if len == 0 {
                continue;
            }
            let p = usize::try_from(s.addr).map_err(|_| FfiError::Invalid("inline address"))?
                as *const u8;
            if p.is_null() {
                return Err(FfiError::Invalid("inline SGE address is NULL"));
            }
            // SAFETY: caller guarantee: an inline SGE describes `length` readable bytes at
            // `addr` (non-NULL, checked); they are copied, never referenced afterwards.
            data.extend_from_slice(unsafe { std::slice::from_raw_parts(p, len) });
        }
        out.inline_data = data;
    } else {
        out.sg_list = sges;
    }
    match opcode {
        SendOpcode::SendWithInv | SendOpcode::LocalInv => out.invalidate_rkey = wr.imm_data,
        _ => out.imm_data = u32::from_be(wr.imm_data),
    }
    match opcode {
        // IBA 1.5 ATOMIC WRITE: the target in `wr.rdma`, the 8 bytes from the SGE list
        // (or inline), as rdma-core's `IBV_WR_ATOMIC_WRITE` documents it.
        SendOpcode::RdmaWrite
        | SendOpcode::RdmaWriteWithImm
        | SendOpcode::RdmaRead
        | SendOpcode::AtomicWrite => {
            // SAFETY: the union's rdma member is plain integers; any bits are valid.
            let r = unsafe { wr.wr.rdma };
            out.rdma = RdmaInfo {
                remote_addr: r.remote_addr,
                rkey: r.rkey,
            };
        }
        SendOpcode::AtomicCmpAndSwp | SendOpcode::AtomicFetchAndAdd => {
            // SAFETY: the union's atomic member is plain integers; any bits are valid.
            let a = unsafe { wr.wr.atomic };
            out.atomic = AtomicInfo {
                remote_addr: a.remote_addr,
                compare_add: a.compare_add,
                swap: a.swap,
                rkey: a.rkey,
            };
        }
        SendOpcode::BindMw => {
            // SAFETY: the union's bind_mw member is a pointer and plain integers; any bits
            // are valid (the pointers are only looked up in the registries).
            let b = unsafe { wr.bind_mw_tso.bind_mw };
            out.bind_mw = Some(crate::mw::bind_mw_wr_from_c(&b)?);
        }
        _ => {}
    }
    // SAFETY: the qp_type union's xrc member is one u32; any bits are valid.
    out.xrc_remote_srqn = unsafe { wr.qp_type.xrc.remote_srqn };
    Ok(out)
}

/// The destination of a send WR on a UD QP (`wr.ud`: the address handle, which must be a
/// live one handed out by this library — recovered from the pointer without a lock, see
/// [`crate::handle`] —, the remote QPN and Q_Key). The verbs layer checks that the AH
/// belongs to the QP's PD.
pub(crate) fn ud_dest_from_c(wr: &ibv_send_wr) -> Result<UdDest, FfiError> {
    // SAFETY: the union's ud member is a pointer and two integers; any bits are valid
    // (the pointer is only checked as a handle, see `Handle::enter`).
    let ud = unsafe { wr.wr.ud };
    let bad = FfiError::BadHandle {
        what: "ah (wr.ud.ah)",
    };
    let g = Handle::<AhKind>::enter(ud.ah).ok_or(bad.clone())?;
    let ah = g.body().ok_or(bad)?.reference();
    Ok(UdDest {
        ah,
        remote_qpn: ud.remote_qpn & 0x00ff_ffff,
        remote_qkey: ud.remote_qkey,
    })
}

/// Converts one C receive WR (not following `next`).
///
/// # Safety
/// `wr.sg_list` is valid for `wr.num_sge` entries.
pub(crate) unsafe fn recv_wr_from_c(wr: &ibv_recv_wr) -> Result<RecvWr, FfiError> {
    if wr.num_sge > MAX_C_SGE {
        return Err(FfiError::Invalid("num_sge too large"));
    }
    // SAFETY: forwarded caller guarantee.
    let sges = unsafe { sges_from_c(wr.sg_list, wr.num_sge)? };
    Ok(RecvWr::new(wr.wr_id, sges))
}

/// [`WorkCompletion`] → `ibv_wc`.
pub(crate) fn wc_to_c(wc: &WorkCompletion) -> ibv_wc {
    let imm = if wc.wc_flags.contains(WcFlags::WITH_INV) {
        wc.invalidated_rkey
    } else {
        wc.imm_data.to_be()
    };
    ibv_wc {
        wr_id: wc.wr_id,
        status: wc.status.as_u32(),
        opcode: wc.opcode.as_u32(),
        vendor_err: wc.vendor_err,
        byte_len: wc.byte_len,
        imm_data: imm,
        qp_num: wc.qp_num,
        src_qp: wc.src_qp,
        wc_flags: wc.wc_flags.bits(),
        pkey_index: wc.pkey_index,
        slid: wc.slid,
        sl: wc.sl,
        dlid_path_bits: wc.dlid_path_bits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_attr_round_trips_selected_fields() {
        // SAFETY: ibv_qp_attr is integers and arrays of integers.
        let mut a: ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = 3; // IBV_MTU_1024 (verbs.h enum ibv_mtu)
        a.dest_qp_num = 0x12;
        a.rq_psn = 0x1ab_cdef; // beyond 24 bits: the top bits are dropped
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid { raw: [7; 16] };
        a.ah_attr.port_num = 1;
        let mask = IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_AV;
        let (q, m) = qp_attr_from_c(&a, mask).expect("valid");
        assert_eq!(m.bits(), mask);
        assert_eq!(q.qp_state, QpState::Rtr);
        assert_eq!(q.path_mtu, Pmtu::Mtu1024);
        assert_eq!(q.rq_psn.value(), 0xab_cdef);
        assert_eq!(q.ah_attr.dgid, Gid([7; 16]));
        let back = qp_attr_to_c(&q);
        assert_eq!(back.qp_state, IBV_QPS_RTR);
        assert_eq!(back.path_mtu, 3);
        assert_eq!(back.dest_qp_num, 0x12);
        // SAFETY: reading the byte view of a GID union.
        assert_eq!(unsafe { back.ah_attr.grh.dgid.raw }, [7; 16]);
    }

    #[test]
    fn qp_attr_rejects_bad_values() {
        // SAFETY: ibv_qp_attr is integers and arrays of integers.
        let mut a: ibv_qp_attr = unsafe { zeroed() };
        a.qp_state = 9;
        assert!(qp_attr_from_c(&a, IBV_QP_STATE).is_err());
        a.qp_state = IBV_QPS_INIT;
        a.path_mtu = 0;
        assert!(qp_attr_from_c(&a, IBV_QP_STATE | IBV_QP_PATH_MTU).is_err());
        // path_mtu is not validated when not selected.
        assert!(qp_attr_from_c(&a, IBV_QP_STATE).is_ok());
        assert!(qp_attr_from_c(&a, 1 << 30).is_err());
    }

    #[test]
    fn inline_send_copies_payload_and_imm_is_host_order() {
        let payload = *b"hello, inline";
        let mut sge = ibv_sge {
            addr: payload.as_ptr() as u64,
            length: payload.len() as u32,
            lkey: 0,
        };
        // SAFETY: ibv_send_wr is integers, raw pointers and unions of those.
        let mut wr: ibv_send_wr = unsafe { zeroed() };
        wr.wr_id = 5;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
        wr.imm_data = 0x0102_0304u32.to_be();
        // SAFETY: sg_list points to one live SGE over `payload`.
        let s = unsafe { send_wr_from_c(&wr, 64) }.expect("valid");
        assert_eq!(s.inline_data[..], payload[..]);
        assert!(s.sg_list.is_empty());
        assert_eq!(s.imm_data, 0x0102_0304);
        assert_eq!(s.opcode, SendOpcode::SendWithImm);
        // SAFETY: as above.
        assert!(unsafe { send_wr_from_c(&wr, 4) }.is_err(), "inline limit");
        wr.num_sge = -1;
        // SAFETY: a negative count is rejected before sg_list is read.
        assert!(unsafe { send_wr_from_c(&wr, 64) }.is_err());
    }

    #[test]
    fn mr_access_masks_optional_bits_only() {
        let relaxed_ordering = 1 << 20;
        assert_eq!(
            mr_access(IBV_ACCESS_LOCAL_WRITE as i32 | relaxed_ordering).unwrap(),
            AccessFlags::LOCAL_WRITE
        );
        assert!(mr_access(1 << 12).is_err());
    }
}
