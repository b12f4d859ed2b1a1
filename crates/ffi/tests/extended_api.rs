//! The extended-API entry points and the argument checks rdma-core's own test suite
//! exercises (see `pyverbs.rs`), called directly the way C callers and the header inlines
//! do: `ibv_query_device_ex` through the `verbs_context.query_device_ex` slot (the port
//! count, the claimed capability flags, short and long `attr_size`, a non-zero input
//! `comp_mask`), `ibv_create_cq` with an out-of-range `cqe` or `comp_vector`,
//! `ibv_resize_cq`, `ibv_rereg_mr`, `ibv_query_gid_table` with too small an array, `ibv_query_gid_ex` on an empty entry,
//! and a GRH flow label with bits above its 20 (masked, not refused).
//!
//! Expectations come from the verbs ABI (`verbs.h` values, rdma-core 44's sizes, the
//! errors rdma-core reports over the kernel's uverbs), not from uroce. Everything runs in
//! one test function: the library's registry is process-wide and configured from
//! `UROCE_ADDR` once.

use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::net::Ipv4Addr;
use std::ptr::{null, null_mut};

use uroce_ffi::abi::*;
use uroce_ffi::ah::*;
use uroce_ffi::context::*;
use uroce_ffi::cq::resize::uroce_ibv_resize_cq;
use uroce_ffi::cq::*;
use uroce_ffi::device_ex::*;
use uroce_ffi::mr::rereg::*;
use uroce_ffi::mr::*;
use uroce_ffi::pd::*;
use uroce_ffi::qp::*;
use uroce_ffi::utility::uroce__ibv_query_gid_table;

/// A loopback address no other test uses.
const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 52, 2);

/// `IBV_DEVICE_RC_RNR_NAK_GEN` and `IBV_DEVICE_SYS_IMAGE_GUID` (verbs.h).
const RNR_NAK_GEN: u32 = 1 << 12;
const SYS_IMAGE_GUID: u32 = 1 << 11;
/// `IBV_DEVICE_MEM_WINDOW`, `IBV_DEVICE_XRC`, `IBV_DEVICE_MEM_WINDOW_TYPE_2B` (verbs.h).
const MW_XRC_MW2B: u32 = (1 << 17) | (1 << 20) | (1 << 24);
/// Flags uroce must not claim: resize max WR, automatic path migration, memory management
/// extensions, memory windows of type 2A (verbs.h).
const NOT_IMPLEMENTED: u32 = 1 | (1 << 4) | (1 << 21) | (1 << 23);

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The `verbs_context` around `ctx` (the header's `verbs_get_ctx`).
fn vctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // SAFETY: uroce contexts are the `context` member of a verbs_context; stepping back
    // by its offset stays inside that allocation.
    unsafe {
        ctx.cast::<u8>()
            .sub(offset_of!(verbs_context, context))
            .cast()
    }
}

type QueryDeviceEx = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;

#[test]
fn extended_api_and_argument_checks_behave_like_rdma_core() {
    // Set before the library reads the environment (the only test in the binary).
    std::env::set_var("UROCE_ADDR", ADDR.to_string());
    std::env::remove_var("UROCE_FAULTS");

    // SAFETY: every call below follows the C contract of the function (live or NULL
    // handles, writable outputs of the sizes passed).
    unsafe {
        let list = uroce_ibv_get_device_list(null_mut());
        assert!(!list.is_null(), "errno {}", errno());
        let ctx = uroce_ibv_open_device(*list);
        uroce_ibv_free_device_list(list);
        assert!(!ctx.is_null(), "errno {}", errno());

        // --- ibv_query_device_ex through the slot the header inline calls.
        let v = vctx(ctx);
        assert!((*v).sz >= size_of::<verbs_context>());
        let slot = (*v).query_device_ex;
        assert!(!slot.is_null(), "query_device_ex slot is set");
        let query: QueryDeviceEx = std::mem::transmute::<*const c_void, QueryDeviceEx>(slot);

        let mut legacy: ibv_device_attr = std::mem::zeroed();
        assert_eq!(uroce_ibv_query_device(ctx, &mut legacy), 0);

        // 0xAA everywhere first: every byte must be written.
        let mut ex = [0xAAu8; 512];
        let p = ex.as_mut_ptr().cast::<ibv_device_attr_ex>();
        let full = size_of::<ibv_device_attr_ex>();
        assert_eq!(full, 400, "rdma-core 44's struct ibv_device_attr_ex");
        assert_eq!(query(ctx, null(), p, full), 0);
        let a = p.read_unaligned();
        assert_eq!(a.phys_port_cnt_ex, 1);
        assert_eq!(a.orig_attr.phys_port_cnt, 1);
        assert_eq!(a.orig_attr.node_guid, legacy.node_guid);
        assert_eq!(a.orig_attr.max_cqe, legacy.max_cqe);
        assert_eq!(a.orig_attr.device_cap_flags, legacy.device_cap_flags);
        let flags = legacy.device_cap_flags;
        assert_eq!(flags & RNR_NAK_GEN, RNR_NAK_GEN, "RC RNR NAK generation");
        assert_eq!(flags & SYS_IMAGE_GUID, SYS_IMAGE_GUID);
        assert_eq!(flags & MW_XRC_MW2B, MW_XRC_MW2B, "memory windows, XRC");
        assert_eq!(flags & NOT_IMPLEMENTED, 0, "claims {flags:#x}");
        // Bit 40: IB_UVERBS_DEVICE_ATOMIC_WRITE (Linux uAPI 6.2+), and nothing else beyond
        // the legacy flags (no FLUSH: bits 38, 39).
        assert_eq!(a.device_cap_flags_ex, u64::from(flags) | (1 << 40));
        assert_eq!(a.odp_caps.general_caps, 0, "no on-demand paging");
        assert_eq!((a.tso_caps.max_tso, a.max_dm_size), (0, 0));
        // The completion clock: 1 GHz (cycles are CLOCK_MONOTONIC ns), a 64-bit counter.
        assert_eq!(
            (a.hca_core_clock, a.completion_timestamp_mask),
            (1_000_000, u64::MAX)
        );
        assert!(
            ex[full..].iter().all(|b| *b == 0xAA),
            "nothing past attr_size"
        );

        // A newer caller's longer structure: the tail is zeroed.
        let mut ex = [0xAAu8; 512];
        let p = ex.as_mut_ptr().cast::<ibv_device_attr_ex>();
        assert_eq!(query(ctx, null(), p, 480), 0);
        assert!(ex[full..480].iter().all(|b| *b == 0), "tail zeroed");
        assert!(ex[480..].iter().all(|b| *b == 0xAA));
        // An older caller's shorter one: truncated, nothing written past it.
        let mut ex = [0xAAu8; 512];
        let p = ex.as_mut_ptr().cast::<ibv_device_attr_ex>();
        let short = offset_of!(ibv_device_attr_ex, comp_mask);
        assert_eq!(query(ctx, null(), p, short), 0);
        assert!(ex[short..].iter().all(|b| *b == 0xAA));
        // Smaller than struct ibv_device_attr, a NULL attr, a non-zero comp_mask: EINVAL.
        assert_eq!(query(ctx, null(), p, short - 1), libc::EINVAL);
        assert_eq!(query(ctx, null(), null_mut(), full), libc::EINVAL);
        let input = ibv_query_device_ex_input { comp_mask: 1 };
        assert_eq!(query(ctx, &input, p, full), libc::EINVAL);
        let input = ibv_query_device_ex_input { comp_mask: 0 };
        assert_eq!(query(ctx, &input, p, full), 0);

        // --- ibv_create_cq: cqe in 1..=max_cqe, comp_vector below num_comp_vectors.
        let max_cqe = legacy.max_cqe;
        let nvec = (*ctx).num_comp_vectors;
        assert_eq!(nvec, 1);
        for (cqe, vector) in [(max_cqe + 1, 0), (0, 0), (-1, 0), (16, nvec), (16, -1)] {
            let cq = uroce_ibv_create_cq(ctx, cqe, null_mut(), null_mut(), vector);
            assert!(cq.is_null(), "cqe {cqe} vector {vector} accepted");
            assert_eq!(errno(), libc::EINVAL, "cqe {cqe} vector {vector}");
        }
        let cq = uroce_ibv_create_cq(ctx, max_cqe, null_mut(), null_mut(), nvec - 1);
        assert!(!cq.is_null(), "errno {}", errno());
        assert_eq!(uroce_ibv_destroy_cq(cq), 0);

        // --- ibv_resize_cq: cq->cqe follows; out-of-range sizes and stale CQs: EINVAL.
        let cq = uroce_ibv_create_cq(ctx, 4, null_mut(), null_mut(), 0);
        assert!(!cq.is_null(), "errno {}", errno());
        assert_eq!(uroce_ibv_resize_cq(cq, 64), 0);
        assert!((*cq).cqe >= 64);
        assert_eq!(uroce_ibv_resize_cq(cq, 1), 0);
        assert!((*cq).cqe >= 1);
        for bad in [0, -1, max_cqe + 1] {
            assert_eq!(uroce_ibv_resize_cq(cq, bad), libc::EINVAL, "cqe {bad}");
        }
        assert!((*cq).cqe >= 1 && (*cq).cqe < 64, "unchanged by refusals");
        assert_eq!(uroce_ibv_resize_cq(null_mut(), 8), libc::EINVAL);
        assert_eq!(uroce_ibv_destroy_cq(cq), 0);
        assert_eq!(uroce_ibv_resize_cq(cq, 8), libc::EINVAL, "stale CQ");

        // --- ibv_query_gid_table: one populated entry (GID 0); 0 entries is too small.
        let mut entries: [ibv_gid_entry; 4] = std::mem::zeroed();
        let e = entries.as_mut_ptr();
        let esz = size_of::<ibv_gid_entry>();
        assert_eq!(
            uroce__ibv_query_gid_table(ctx, e, 0, 0, esz),
            -(libc::EINVAL as isize)
        );
        assert_eq!(uroce__ibv_query_gid_table(ctx, e, 4, 0, esz), 1);
        assert_eq!(entries[0].gid.raw, ADDR.to_ipv6_mapped().octets());
        assert_eq!((entries[0].gid_index, entries[0].port_num), (0, 1));
        assert_eq!(uroce__ibv_query_gid_table(ctx, e, 1, 0, esz), 1);
        assert_eq!(
            uroce__ibv_query_gid_table(ctx, e, 4, 1, esz),
            -(libc::EINVAL as isize)
        );
        // --- ibv_query_gid_ex: ENODATA for an empty in-range entry.
        let mut one: ibv_gid_entry = std::mem::zeroed();
        assert_eq!(
            uroce__ibv_query_gid_ex(ctx, 1, 1, &mut one, 0, esz),
            libc::ENODATA
        );
        assert_eq!(uroce__ibv_query_gid_ex(ctx, 1, 0, &mut one, 0, esz), 0);
        assert_eq!(
            uroce__ibv_query_gid_ex(ctx, 1, 0, &mut one, 0, esz - 1),
            libc::EINVAL
        );

        // --- A GRH flow label with all 32 bits set is masked to 20, not refused.
        let pd = uroce_ibv_alloc_pd(ctx);
        assert!(!pd.is_null(), "errno {}", errno());
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.is_global = 1;
        ah_attr.port_num = 1;
        ah_attr.grh.hop_limit = 64;
        ah_attr.grh.flow_label = u32::MAX;
        ah_attr.grh.dgid.raw = Ipv4Addr::new(127, 0, 52, 3).to_ipv6_mapped().octets();
        let ah = uroce_ibv_create_ah(pd, &mut ah_attr);
        assert!(
            !ah.is_null(),
            "all-ones flow label refused: errno {}",
            errno()
        );
        assert_eq!(uroce_ibv_destroy_ah(ah), 0);

        let cq = uroce_ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        assert!(!cq.is_null(), "errno {}", errno());
        let mut ia: ibv_qp_init_attr = std::mem::zeroed();
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.qp_type = IBV_QPT_RC;
        ia.cap.max_send_wr = 4;
        ia.cap.max_recv_wr = 4;
        ia.cap.max_send_sge = 1;
        ia.cap.max_recv_sge = 1;
        let qp = uroce_ibv_create_qp(pd, &mut ia);
        assert!(!qp.is_null(), "errno {}", errno());
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
        assert_eq!(uroce_ibv_modify_qp(qp, &mut a, m as c_int), 0);
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = 3;
        a.dest_qp_num = (*qp).qp_num;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr = ah_attr;
        a.ah_attr.grh.flow_label = 0xfff1_2345;
        let m = IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER;
        assert_eq!(
            uroce_ibv_modify_qp(qp, &mut a, m as c_int),
            0,
            "errno {}",
            errno()
        );
        let mut got: ibv_qp_attr = std::mem::zeroed();
        let mut init: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(
            uroce_ibv_query_qp(qp, &mut got, IBV_QP_AV as c_int, &mut init),
            0
        );
        assert_eq!(got.ah_attr.grh.flow_label, 0x1_2345, "the low 20 bits");

        assert_eq!(uroce_ibv_destroy_qp(qp), 0);
        assert_eq!(uroce_ibv_destroy_cq(cq), 0);

        // --- ibv_rereg_mr: access, translation and PD changed in place, keys kept;
        // refused arguments (IBV_REREG_MR_ERR_INPUT = -1, EINVAL) leave the MR usable.
        let (mut buf1, mut buf2) = (vec![0u8; 256], vec![0u8; 512]);
        let lw = IBV_ACCESS_LOCAL_WRITE as c_int;
        let rw = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) as c_int;
        let mr = uroce_ibv_reg_mr(pd, buf1.as_mut_ptr().cast(), 256, lw);
        assert!(!mr.is_null(), "errno {}", errno());
        let (lkey, rkey) = ((*mr).lkey, (*mr).rkey);
        let pd2 = uroce_ibv_alloc_pd(ctx);
        assert!(!pd2.is_null());
        let none = null_mut::<c_void>();
        for (flags, p, addr, len, access, why) in [
            (0, null_mut(), none, 0, 0, "no flags"),
            (8, null_mut(), none, 0, 0, "KEEP_VALID"),
            (16, null_mut(), none, 0, 0, "unknown flag"),
            (
                IBV_REREG_MR_CHANGE_TRANSLATION,
                null_mut(),
                none,
                64,
                0,
                "NULL address",
            ),
            (IBV_REREG_MR_CHANGE_PD, null_mut(), none, 0, 0, "NULL PD"),
            (
                IBV_REREG_MR_CHANGE_ACCESS,
                null_mut(),
                none,
                0,
                IBV_ACCESS_REMOTE_WRITE as c_int,
                "REMOTE_WRITE alone",
            ),
        ] {
            assert_eq!(
                uroce_ibv_rereg_mr(mr, flags, p, addr, len, access),
                -1,
                "{why}"
            );
            assert_eq!(errno(), libc::EINVAL, "{why}");
        }
        assert_eq!(
            uroce_ibv_rereg_mr(null_mut(), 4, null_mut(), none, 0, lw),
            -1
        );
        assert_eq!(
            ((*mr).lkey, (*mr).rkey, (*mr).pd),
            (lkey, rkey, pd),
            "unchanged"
        );

        assert_eq!(
            uroce_ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, null_mut(), none, 0, rw),
            0
        );
        let p2 = buf2.as_mut_ptr().cast::<c_void>();
        let both = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD;
        assert_eq!(
            uroce_ibv_rereg_mr(mr, both, pd2, p2, 512, 0),
            0,
            "errno {}",
            errno()
        );
        assert_eq!(((*mr).addr, (*mr).length, (*mr).pd), (p2, 512, pd2));
        assert_eq!(((*mr).lkey, (*mr).rkey), (lkey, rkey), "keys kept");
        assert_eq!(uroce_ibv_dealloc_pd(pd), 0, "the MR left the first PD");
        assert_eq!(
            uroce_ibv_dealloc_pd(pd2),
            libc::EBUSY,
            "and is in the second"
        );
        assert_eq!(uroce_ibv_dereg_mr(mr), 0);
        assert_eq!(uroce_ibv_dealloc_pd(pd2), 0);
        drop((buf1, buf2));
        assert_eq!(uroce_ibv_close_device(ctx), 0);
    }
}
