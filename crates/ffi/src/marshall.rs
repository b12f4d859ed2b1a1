//! The kernel-ABI marshalling helpers of libibverbs (`<infiniband/marshall.h>` in
//! rdma-core): conversions between the structs the kernel's uverbs and user-SA interfaces
//! exchange (`<rdma/ib_user_verbs.h>`, `<rdma/ib_user_sa.h>`) and their user-side
//! counterparts (`<infiniband/verbs.h>`, `<infiniband/sa.h>`).
//!
//! uroce has no kernel side; these functions exist because librdmacm, which
//! unmodified programs load beside `libibverbs.so.1`, binds them. They are pure field
//! copies:
//!
//! * [`uroce_ibv_copy_qp_attr_from_kern`]: `ib_uverbs_qp_attr` → `ibv_qp_attr`;
//! * [`uroce_ibv_copy_ah_attr_from_kern`]: `ib_uverbs_ah_attr` → `ibv_ah_attr`;
//! * [`uroce_ibv_copy_path_rec_from_kern`]: `ib_user_path_rec` → `ibv_sa_path_rec`;
//! * [`uroce_ibv_copy_path_rec_to_kern`]: `ibv_sa_path_rec` → `ib_user_path_rec`.
//!
//! Byte order: every field of the uverbs structs is host order, as are the matching
//! fields of `ibv_qp_attr`/`ibv_ah_attr`, so values are copied as numbers. In the path
//! records `dlid`, `slid`, `flow_label` and `pkey` are `__be16`/`__be32` on *both* sides:
//! they are copied bit for bit, never swapped. GIDs are byte arrays (network order) on
//! both sides. Fields whose integer widths differ (`mtu`: `__u32` in the kernel record,
//! `uint8_t` in the user record; `raw_traffic`, `reversible`: `__u32` vs `int`) are
//! converted with C's assignment semantics (truncation to the narrower unsigned type,
//! two's-complement reinterpretation between `__u32` and `int`).
//!
//! Fields that have no counterpart are left alone: `qp_attr_mask` and the `reserved` bytes
//! of the kernel structs are not read, and `ibv_qp_attr::rate_limit` (which the kernel
//! struct does not carry) keeps whatever the caller stored there. `ibv_qp_attr::qp_state`
//! is not written either, as in rdma-core 44: the struct is the RDMA CM's answer to "which
//! attributes move this QP to state S", where S is the caller's own `qp_state`, which the
//! kernel merely echoes. Only named fields of the destination are written, so its padding
//! bytes are untouched too.
//!
//! Every function is a no-op when either pointer is NULL and never lets a panic unwind
//! into C. Like rdma-core's, they return nothing and do not touch `errno` on success.
//!
//! Public names:
//! `ibv_copy_qp_attr_from_kern@@IBVERBS_1.0`, `ibv_copy_ah_attr_from_kern@@IBVERBS_1.1`,
//! `ibv_copy_path_rec_from_kern@@IBVERBS_1.0`, `ibv_copy_path_rec_to_kern@@IBVERBS_1.0`.

#![allow(non_camel_case_types)] // C names, kept verbatim

use core::ffi::c_int;

use crate::abi::{__be32, ibv_ah_attr, ibv_gid, ibv_qp_attr};
use crate::entry::{guard, symver};

/// A big-endian 16-bit value (`__be16`): stored in network byte order.
pub type __be16 = u16;

/// `struct ib_uverbs_global_route` (`<rdma/ib_user_verbs.h>`): the GRH fields of a
/// kernel address vector, all in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ib_uverbs_global_route {
    /// Destination GID (16 bytes, network order).
    pub dgid: [u8; 16],
    /// Flow label (20 bits used).
    pub flow_label: u32,
    /// Source GID table index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Reserved (not read).
    pub reserved: u8,
}

/// `struct ib_uverbs_ah_attr` (`<rdma/ib_user_verbs.h>`): a kernel address vector, host
/// order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ib_uverbs_ah_attr {
    /// Global route (valid when `is_global`).
    pub grh: ib_uverbs_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Non-zero when `grh` is valid.
    pub is_global: u8,
    /// Port number.
    pub port_num: u8,
    /// Reserved (not read).
    pub reserved: u8,
}

/// `struct ib_uverbs_qp_attr` (`<rdma/ib_user_verbs.h>`): QP attributes as the kernel
/// reports them (e.g. the RDMA CM's "init QP attributes" answer), host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ib_uverbs_qp_attr {
    /// Which attributes are valid (`IB_QP_*`); not copied: `ibv_qp_attr` has no mask.
    pub qp_attr_mask: u32,
    /// QP state (`enum ibv_qp_state` values).
    pub qp_state: u32,
    /// Current QP state.
    pub cur_qp_state: u32,
    /// Path MTU (`enum ibv_mtu` values).
    pub path_mtu: u32,
    /// Path migration state (`enum ibv_mig_state` values).
    pub path_mig_state: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Receive queue PSN.
    pub rq_psn: u32,
    /// Send queue PSN.
    pub sq_psn: u32,
    /// Destination QP number.
    pub dest_qp_num: u32,
    /// Remote access flags.
    pub qp_access_flags: u32,
    /// Primary path.
    pub ah_attr: ib_uverbs_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ib_uverbs_ah_attr,
    /// Max outstanding send WRs (`ib_qp_cap`).
    pub max_send_wr: u32,
    /// Max outstanding receive WRs.
    pub max_recv_wr: u32,
    /// Max SGEs per send WR.
    pub max_send_sge: u32,
    /// Max SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Max inline data bytes.
    pub max_inline_data: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// Enable SQD affiliated event.
    pub en_sqd_async_notify: u8,
    /// SQ draining.
    pub sq_draining: u8,
    /// Max outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Max outstanding RDMA reads/atomics as target.
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Port number.
    pub port_num: u8,
    /// Local ACK timeout code.
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Alternate port number.
    pub alt_port_num: u8,
    /// Alternate local ACK timeout.
    pub alt_timeout: u8,
    /// Reserved (not read).
    pub reserved: [u8; 5],
}

/// `struct ib_user_path_rec` (`<rdma/ib_user_sa.h>`): a path record as the kernel's
/// user-SA / RDMA CM interfaces exchange it. 64 bytes, no padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ib_user_path_rec {
    /// Destination GID (network order).
    pub dgid: [u8; 16],
    /// Source GID (network order).
    pub sgid: [u8; 16],
    /// Destination LID (`__be16`).
    pub dlid: __be16,
    /// Source LID (`__be16`).
    pub slid: __be16,
    /// Raw traffic (boolean, host order).
    pub raw_traffic: u32,
    /// Flow label (`__be32`).
    pub flow_label: __be32,
    /// Reversible path (boolean, host order).
    pub reversible: u32,
    /// Path MTU (`enum ibv_mtu` values, host order).
    pub mtu: u32,
    /// P_Key (`__be16`).
    pub pkey: __be16,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Number of paths.
    pub numb_path: u8,
    /// Service level.
    pub sl: u8,
    /// MTU selector (greater than / less than / exactly / largest).
    pub mtu_selector: u8,
    /// Rate selector.
    pub rate_selector: u8,
    /// Static rate.
    pub rate: u8,
    /// Packet lifetime selector.
    pub packet_life_time_selector: u8,
    /// Packet lifetime (encoded).
    pub packet_life_time: u8,
    /// Preference among the paths returned.
    pub preference: u8,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`): the user-side path record (SA
/// PathRecord attribute fields). 64 bytes, 8-aligned (through [`ibv_gid`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination LID (`__be16`).
    pub dlid: __be16,
    /// Source LID (`__be16`).
    pub slid: __be16,
    /// Raw traffic (boolean).
    pub raw_traffic: c_int,
    /// Flow label (`__be32`).
    pub flow_label: __be32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Reversible path (boolean).
    pub reversible: c_int,
    /// Number of paths.
    pub numb_path: u8,
    /// P_Key (`__be16`).
    pub pkey: __be16,
    /// Service level.
    pub sl: u8,
    /// MTU selector.
    pub mtu_selector: u8,
    /// Path MTU (`enum ibv_mtu` values).
    pub mtu: u8,
    /// Rate selector.
    pub rate_selector: u8,
    /// Static rate.
    pub rate: u8,
    /// Packet lifetime selector.
    pub packet_life_time_selector: u8,
    /// Packet lifetime (encoded).
    pub packet_life_time: u8,
    /// Preference among the paths returned.
    pub preference: u8,
}

symver!(
    "uroce_ibv_copy_qp_attr_from_kern",
    "ibv_copy_qp_attr_from_kern@@IBVERBS_1.0"
);
symver!(
    "uroce_ibv_copy_ah_attr_from_kern",
    "ibv_copy_ah_attr_from_kern@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_copy_path_rec_from_kern",
    "ibv_copy_path_rec_from_kern@@IBVERBS_1.0"
);
symver!(
    "uroce_ibv_copy_path_rec_to_kern",
    "ibv_copy_path_rec_to_kern@@IBVERBS_1.0"
);

/// Writes the fields of `src` into the address vector at `dst`, field by field.
///
/// # Safety
/// `dst` must be properly aligned and valid for writes of an `ibv_ah_attr` (it may be a
/// field of a larger struct).
unsafe fn write_ah_attr(dst: *mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    // SAFETY: the caller guarantees `dst` is valid and aligned for writes; each
    // assignment writes one named field in place (no reference to `*dst` is formed, and
    // no padding byte is written). The GID is written through its `raw` member, which
    // covers the whole union.
    unsafe {
        (*dst).grh.dgid.raw = src.grh.dgid;
        (*dst).grh.flow_label = src.grh.flow_label;
        (*dst).grh.sgid_index = src.grh.sgid_index;
        (*dst).grh.hop_limit = src.grh.hop_limit;
        (*dst).grh.traffic_class = src.grh.traffic_class;
        (*dst).dlid = src.dlid;
        (*dst).sl = src.sl;
        (*dst).src_path_bits = src.src_path_bits;
        (*dst).static_rate = src.static_rate;
        (*dst).is_global = src.is_global;
        (*dst).port_num = src.port_num;
    }
}

/// `void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src)`
/// (public name `ibv_copy_ah_attr_from_kern@@IBVERBS_1.1`): copies a kernel address vector
/// into a user one. All fields are host order on both sides and copied as values; the
/// kernel's `reserved` bytes are ignored. NULL `dst` or `src`: nothing happens.
///
/// # Safety
/// Non-NULL `dst` must point to a writable `struct ibv_ah_attr`, non-NULL `src` to a
/// readable `struct ib_uverbs_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const ib_uverbs_ah_attr,
) {
    guard((), || {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: `src` is non-NULL and, by the caller's contract, points to a readable
        // struct; it is copied out first so that nothing is read after `dst` is written.
        let k = unsafe { src.read() };
        // SAFETY: `dst` is non-NULL and writable by the caller's contract.
        unsafe { write_ah_attr(dst, &k) };
    });
}

/// `void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)`
/// (public name `ibv_copy_qp_attr_from_kern@@IBVERBS_1.0`): copies kernel QP attributes
/// into user ones. Every field is host order and copied as a value; the five
/// `ib_qp_cap` members land in `dst->cap`, both address vectors are converted like
/// [`uroce_ibv_copy_ah_attr_from_kern`]. `qp_attr_mask` and `reserved` are not read;
/// `dst->rate_limit`, absent from the kernel struct, is left unchanged, and so is
/// `dst->qp_state` (the target state the caller asked the RDMA CM about, which the kernel
/// echoes; rdma-core 44 leaves it alone too, and callers rely on it staying theirs).
/// NULL `dst` or `src`: nothing happens.
///
/// # Safety
/// Non-NULL `dst` must point to a writable `struct ibv_qp_attr`, non-NULL `src` to a
/// readable `struct ib_uverbs_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *const ib_uverbs_qp_attr,
) {
    guard((), || {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: `src` is non-NULL and readable by the caller's contract; copied out
        // before `dst` is written.
        let k = unsafe { src.read() };
        // SAFETY: `dst` is non-NULL, aligned and writable by the caller's contract; each
        // assignment writes one named field in place, and the address vectors are
        // fields of `*dst`, so their addresses are valid for `write_ah_attr`.
        unsafe {
            (*dst).cur_qp_state = k.cur_qp_state;
            (*dst).path_mtu = k.path_mtu;
            (*dst).path_mig_state = k.path_mig_state;
            (*dst).qkey = k.qkey;
            (*dst).rq_psn = k.rq_psn;
            (*dst).sq_psn = k.sq_psn;
            (*dst).dest_qp_num = k.dest_qp_num;
            (*dst).qp_access_flags = k.qp_access_flags;
            (*dst).cap.max_send_wr = k.max_send_wr;
            (*dst).cap.max_recv_wr = k.max_recv_wr;
            (*dst).cap.max_send_sge = k.max_send_sge;
            (*dst).cap.max_recv_sge = k.max_recv_sge;
            (*dst).cap.max_inline_data = k.max_inline_data;
            write_ah_attr(&raw mut (*dst).ah_attr, &k.ah_attr);
            write_ah_attr(&raw mut (*dst).alt_ah_attr, &k.alt_ah_attr);
            (*dst).pkey_index = k.pkey_index;
            (*dst).alt_pkey_index = k.alt_pkey_index;
            (*dst).en_sqd_async_notify = k.en_sqd_async_notify;
            (*dst).sq_draining = k.sq_draining;
            (*dst).max_rd_atomic = k.max_rd_atomic;
            (*dst).max_dest_rd_atomic = k.max_dest_rd_atomic;
            (*dst).min_rnr_timer = k.min_rnr_timer;
            (*dst).port_num = k.port_num;
            (*dst).timeout = k.timeout;
            (*dst).retry_cnt = k.retry_cnt;
            (*dst).rnr_retry = k.rnr_retry;
            (*dst).alt_port_num = k.alt_port_num;
            (*dst).alt_timeout = k.alt_timeout;
        }
    });
}

/// `void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src)`
/// (public name `ibv_copy_path_rec_from_kern@@IBVERBS_1.0`): copies a kernel path record
/// into a user one. GIDs and the big-endian `dlid`, `slid`, `flow_label`, `pkey` are copied
/// bit for bit; `raw_traffic` and `reversible` (`__u32` → `int`) are reinterpreted, `mtu`
/// (`__u32` → `uint8_t`) keeps its low byte (every `enum ibv_mtu` value fits); the other
/// one-byte fields (`hop_limit`, `traffic_class`, `numb_path`, `sl`, the selectors,
/// `rate`, `packet_life_time`, `preference`) are copied as they are. NULL `dst` or `src`:
/// nothing happens.
///
/// # Safety
/// Non-NULL `dst` must point to a writable `struct ibv_sa_path_rec`, non-NULL `src` to a
/// readable `struct ib_user_path_rec`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    guard((), || {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: `src` is non-NULL and readable by the caller's contract; copied out
        // before `dst` is written.
        let k = unsafe { src.read() };
        // SAFETY: `dst` is non-NULL, aligned and writable by the caller's contract; each
        // assignment writes one named field in place (GIDs through their `raw` member,
        // which covers the whole union), leaving padding alone.
        unsafe {
            (*dst).dgid.raw = k.dgid;
            (*dst).sgid.raw = k.sgid;
            (*dst).dlid = k.dlid;
            (*dst).slid = k.slid;
            (*dst).raw_traffic = k.raw_traffic as c_int;
            (*dst).flow_label = k.flow_label;
            (*dst).hop_limit = k.hop_limit;
            (*dst).traffic_class = k.traffic_class;
            (*dst).reversible = k.reversible as c_int;
            (*dst).numb_path = k.numb_path;
            (*dst).pkey = k.pkey;
            (*dst).sl = k.sl;
            (*dst).mtu_selector = k.mtu_selector;
            (*dst).mtu = k.mtu as u8;
            (*dst).rate_selector = k.rate_selector;
            (*dst).rate = k.rate;
            (*dst).packet_life_time_selector = k.packet_life_time_selector;
            (*dst).packet_life_time = k.packet_life_time;
            (*dst).preference = k.preference;
        }
    });
}

/// `void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src)`
/// (public name `ibv_copy_path_rec_to_kern@@IBVERBS_1.0`): the inverse of
/// [`uroce_ibv_copy_path_rec_from_kern`]. Every field of the (padding-free) kernel record
/// is written: GIDs and the big-endian fields bit for bit, `raw_traffic`/`reversible`
/// (`int` → `__u32`) reinterpreted, `mtu` widened, the one-byte fields as they are. NULL
/// `dst` or `src`: nothing happens.
///
/// # Safety
/// Non-NULL `dst` must point to a writable `struct ib_user_path_rec`, non-NULL `src` to a
/// readable `struct ibv_sa_path_rec`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    guard((), || {
        if dst.is_null() || src.is_null() {
            return;
        }
        // SAFETY: `src` is non-NULL and readable by the caller's contract; copied out
        // before `dst` is written. Padding bytes of the copy are never read.
        let u = unsafe { src.read() };
        // SAFETY: reading the `raw` member of a GID union: every bit pattern is a valid
        // `[u8; 16]`, and the member covers the whole union.
        let (dgid, sgid) = unsafe { (u.dgid.raw, u.sgid.raw) };
        let k = ib_user_path_rec {
            dgid,
            sgid,
            dlid: u.dlid,
            slid: u.slid,
            raw_traffic: u.raw_traffic as u32,
            flow_label: u.flow_label,
            reversible: u.reversible as u32,
            mtu: u32::from(u.mtu),
            pkey: u.pkey,
            hop_limit: u.hop_limit,
            traffic_class: u.traffic_class,
            numb_path: u.numb_path,
            sl: u.sl,
            mtu_selector: u.mtu_selector,
            rate_selector: u.rate_selector,
            rate: u.rate,
            packet_life_time_selector: u.packet_life_time_selector,
            packet_life_time: u.packet_life_time,
            preference: u.preference,
        };
        // SAFETY: `dst` is non-NULL, aligned and writable by the caller's contract; the
        // kernel record has no padding, so writing it whole writes exactly its fields.
        unsafe { dst.write(k) };
    });
}
