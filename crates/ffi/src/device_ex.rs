//! `ibv_query_device_ex`: the extended device attributes, reached through the
//! `verbs_context.query_device_ex` slot that the header's `ibv_query_device_ex` inline
//! calls (a NULL slot makes the inline fall back to `ibv_query_device` and leave every
//! extended field zero, which reads as "0 ports" in `phys_port_cnt_ex`).
//!
//! The answer is the legacy [`ibv_device_attr`] of [`device::device_attr`] plus the extended
//! fields, each either what uroce really does or zero: no on-demand paging, timestamps,
//! TSO, RSS, work queues, packet pacing, raw packet, tag matching, CQ moderation, device
//! memory or PCI atomics; `phys_port_cnt_ex` = the port count (1);
//! `device_cap_flags_ex` = the legacy `device_cap_flags` ([`DEVICE_CAP_FLAGS`]) plus
//! [`IB_UVERBS_DEVICE_ATOMIC_WRITE`].
//!
//! The structures mirror rdma-core 44's `<infiniband/verbs.h>`; `tests/layout.rs` checks
//! them against the installed header.

use std::ffi::c_int;

use crate::abi::{ibv_context, ibv_device_attr};
use crate::device::{self, Registry};
use crate::entry::{errno_value, guard};
use crate::error::FfiError;

/// `IBV_DEVICE_SYS_IMAGE_GUID`: `sys_image_guid` is meaningful.
pub const IBV_DEVICE_SYS_IMAGE_GUID: u32 = 1 << 11;
/// `IBV_DEVICE_RC_RNR_NAK_GEN`: an RC responder without a receive WQE answers with an RNR
/// NAK (IBA Vol 1 §9.7.5.2.8) instead of a fatal error.
pub const IBV_DEVICE_RC_RNR_NAK_GEN: u32 = 1 << 12;

/// `IBV_DEVICE_MEM_WINDOW`: memory windows (`ibv_alloc_mw`, type 1 bound by `ibv_bind_mw`).
pub const IBV_DEVICE_MEM_WINDOW: u32 = 1 << 17;
/// `IBV_DEVICE_XRC`: XRC domains, XRC SRQs and XRC_SEND / XRC_RECV QPs.
pub const IBV_DEVICE_XRC: u32 = 1 << 20;
/// `IBV_DEVICE_MEM_WINDOW_TYPE_2B`: type 2 windows bound through the send queue, each
/// bound to the QP that bound it (and so to that QP's PD, which must be the window's):
/// a remote access or SEND with Invalidate through it is accepted only on that QP
/// (IBA Vol 1 §10.6.7; rxe claims 2B, not 2A, likewise).
pub const IBV_DEVICE_MEM_WINDOW_TYPE_2B: u32 = 1 << 24;

/// The `device_cap_flags` uroce claims, and only those it implements: the system image
/// GUID, RNR NAK generation, memory windows of type 1 and 2B, XRC. Not claimed (not
/// implemented): resizing QP/SRQ work requests (`IBV_DEVICE_RESIZE_MAX_WR`), P_Key/Q_Key
/// violation counters, automatic path migration, port-change and current-state QP
/// modifiers, port active events, N-notify CQs, memory management extensions (fast
/// registration), checksum offloads, flow steering.
pub const DEVICE_CAP_FLAGS: u32 = IBV_DEVICE_SYS_IMAGE_GUID
    | IBV_DEVICE_RC_RNR_NAK_GEN
    | IBV_DEVICE_MEM_WINDOW
    | IBV_DEVICE_XRC
    | IBV_DEVICE_MEM_WINDOW_TYPE_2B;

/// `IB_UVERBS_DEVICE_ATOMIC_WRITE` (bit 40 of `device_cap_flags_ex`, Linux uAPI
/// `rdma/ib_user_verbs.h` since 6.2; rdma-core 44's headers do not name it, newer ones
/// do, and `ibv_query_device_ex` passes the kernel's 64 bits through): the device executes
/// IBA 1.5 ATOMIC WRITE (RC, `ibv_wr_atomic_write`), as rxe claims it. FLUSH is not
/// implemented, so `IB_UVERBS_DEVICE_FLUSH_GLOBAL` / `_PERSISTENT` (bits 38, 39) stay
/// clear.
pub const IB_UVERBS_DEVICE_ATOMIC_WRITE: u64 = 1 << 40;

/// `hca_core_clock` (kHz): the device clock that stamps completions
/// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`) and `ibv_query_rt_values_ex` reads is
/// `CLOCK_MONOTONIC` in ns, a 1 GHz clock, so cycles are nanoseconds.
pub const HCA_CORE_CLOCK_KHZ: u64 = 1_000_000;
/// `completion_timestamp_mask`: the completion timestamp is a full 64-bit counter.
pub const COMPLETION_TIMESTAMP_MASK: u64 = u64::MAX;

/// `struct ibv_query_device_ex_input`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_query_device_ex_input {
    /// Must be 0 (checked by the header inline).
    pub comp_mask: u32,
}

/// `struct ibv_odp_caps` (per-transport part).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_caps_per_transport {
    /// RC on-demand-paging capabilities.
    pub rc_odp_caps: u32,
    /// UC on-demand-paging capabilities.
    pub uc_odp_caps: u32,
    /// UD on-demand-paging capabilities.
    pub ud_odp_caps: u32,
}

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_odp_caps {
    /// `IBV_ODP_SUPPORT*` bits.
    pub general_caps: u64,
    /// Per-transport bits.
    pub per_transport_caps: ibv_odp_caps_per_transport,
}

/// `struct ibv_tso_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tso_caps {
    /// Largest TSO payload.
    pub max_tso: u32,
    /// QP types (bit per type).
    pub supported_qpts: u32,
}

/// `struct ibv_rss_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_rss_caps {
    /// QP types (bit per type).
    pub supported_qpts: u32,
    /// Indirection tables.
    pub max_rwq_indirection_tables: u32,
    /// Indirection table size.
    pub max_rwq_indirection_table_size: u32,
    /// `enum ibv_rx_hash_fields`.
    pub rx_hash_fields_mask: u64,
    /// `enum ibv_rx_hash_function_flags`.
    pub rx_hash_function: u8,
}

/// `struct ibv_packet_pacing_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_packet_pacing_caps {
    /// Lowest rate limit (kbps).
    pub qp_rate_limit_min: u32,
    /// Highest rate limit (kbps).
    pub qp_rate_limit_max: u32,
    /// QP types (bit per type).
    pub supported_qpts: u32,
}

/// `struct ibv_tm_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_tm_caps {
    /// Largest rendezvous header.
    pub max_rndv_hdr_size: u32,
    /// Tags per TM-SRQ.
    pub max_num_tags: u32,
    /// `enum ibv_tm_cap_flags`.
    pub flags: u32,
    /// Outstanding list operations.
    pub max_ops: u32,
    /// SGEs per tagged buffer.
    pub max_sge: u32,
}

/// `struct ibv_cq_moderation_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_cq_moderation_caps {
    /// Largest completion count.
    pub max_cq_count: u16,
    /// Largest period (µs).
    pub max_cq_period: u16,
}

/// `struct ibv_pci_atomic_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_pci_atomic_caps {
    /// Fetch-and-add operand sizes.
    pub fetch_add: u16,
    /// Swap operand sizes.
    pub swap: u16,
    /// Compare-and-swap operand sizes.
    pub compare_swap: u16,
}

/// `struct ibv_device_attr_ex` (400 bytes in rdma-core 44).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    /// What `ibv_query_device` reports.
    pub orig_attr: ibv_device_attr,
    /// Valid optional fields (none).
    pub comp_mask: u32,
    /// On-demand paging.
    pub odp_caps: ibv_odp_caps,
    /// Completion timestamp bits.
    pub completion_timestamp_mask: u64,
    /// Core clock (kHz).
    pub hca_core_clock: u64,
    /// 64-bit device capability flags (low 32 = `orig_attr.device_cap_flags`).
    pub device_cap_flags_ex: u64,
    /// TCP segmentation offload.
    pub tso_caps: ibv_tso_caps,
    /// Receive-side scaling.
    pub rss_caps: ibv_rss_caps,
    /// Work queues of type RQ.
    pub max_wq_type_rq: u32,
    /// Packet pacing.
    pub packet_pacing_caps: ibv_packet_pacing_caps,
    /// `enum ibv_raw_packet_caps`.
    pub raw_packet_caps: u32,
    /// Tag matching.
    pub tm_caps: ibv_tm_caps,
    /// CQ moderation.
    pub cq_mod_caps: ibv_cq_moderation_caps,
    /// Device memory.
    pub max_dm_size: u64,
    /// PCI atomics.
    pub pci_atomic_caps: ibv_pci_atomic_caps,
    /// XRC on-demand paging.
    pub xrc_odp_caps: u32,
    /// Port count without the 8-bit limit of `orig_attr.phys_port_cnt`.
    pub phys_port_cnt_ex: u32,
}

/// The extended attributes of the device behind `net`.
pub fn device_attr_ex(net: &uroce_net::NetDevice) -> ibv_device_attr_ex {
    let orig_attr = device::device_attr(net);
    ibv_device_attr_ex {
        orig_attr,
        comp_mask: 0,
        odp_caps: ibv_odp_caps::default(),
        completion_timestamp_mask: COMPLETION_TIMESTAMP_MASK,
        hca_core_clock: HCA_CORE_CLOCK_KHZ,
        device_cap_flags_ex: u64::from(orig_attr.device_cap_flags) | IB_UVERBS_DEVICE_ATOMIC_WRITE,
        tso_caps: ibv_tso_caps::default(),
        rss_caps: ibv_rss_caps::default(),
        max_wq_type_rq: 0,
        packet_pacing_caps: ibv_packet_pacing_caps::default(),
        raw_packet_caps: 0,
        tm_caps: ibv_tm_caps::default(),
        cq_mod_caps: ibv_cq_moderation_caps::default(),
        max_dm_size: 0,
        pci_atomic_caps: ibv_pci_atomic_caps::default(),
        xrc_odp_caps: 0,
        phys_port_cnt_ex: orig_attr.phys_port_cnt.into(),
    }
}

/// Fills `attr_size` bytes at `attr`: the extended attributes, truncated to `attr_size`
/// (an older caller's shorter structure) or followed by zeros (a newer caller's longer
/// one).
///
/// # Safety
/// `attr` is NULL or valid for writing `attr_size` bytes.
unsafe fn query_into(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut u8,
    attr_size: usize,
) -> Result<(), FfiError> {
    if attr.is_null() {
        return Err(FfiError::Invalid("ibv_query_device_ex: attr is NULL"));
    }
    if attr_size < size_of::<ibv_device_attr>() {
        return Err(FfiError::Invalid(
            "ibv_query_device_ex: attr_size is smaller than struct ibv_device_attr",
        ));
    }
    // SAFETY: a non-NULL `input` points to a readable ibv_query_device_ex_input (caller
    // contract).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return Err(FfiError::Invalid(
            "ibv_query_device_ex: input comp_mask is not 0",
        ));
    }
    let net = Registry::net(context)?;
    let a = device_attr_ex(&net);
    let n = attr_size.min(size_of::<ibv_device_attr_ex>());
    // SAFETY: `attr` is valid for `attr_size >= n` bytes (caller contract); `a` is a local
    // of at least `n` bytes and cannot overlap it; the bytes past `n` up to `attr_size`
    // belong to the caller's structure too.
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), attr, n);
        std::ptr::write_bytes(attr.add(n), 0, attr_size - n);
    }
    Ok(())
}

/// `verbs_context.query_device_ex`: what the header's `ibv_query_device_ex` inline calls
/// with `sizeof(struct ibv_device_attr_ex)`; 0 or the errno value (`EINVAL`).
///
/// # Safety
/// `input` is NULL or readable; `attr` is NULL or valid for writing `attr_size` bytes.
pub unsafe extern "C" fn vctx_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: forwarded caller guarantees on `input`, `attr` and `attr_size`.
        errno_value(unsafe { query_into(context, input, attr.cast(), attr_size) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_rdma_core_44() {
        // The compiled-C comparison is in tests/layout.rs; these are the header's numbers.
        assert_eq!(size_of::<ibv_device_attr_ex>(), 400);
        assert_eq!(std::mem::offset_of!(ibv_device_attr_ex, comp_mask), 232);
        assert_eq!(
            std::mem::offset_of!(ibv_device_attr_ex, device_cap_flags_ex),
            280
        );
        assert_eq!(
            std::mem::offset_of!(ibv_device_attr_ex, phys_port_cnt_ex),
            396
        );
    }
}
