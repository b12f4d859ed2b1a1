//! Proves that `uroce_ffi::abi` has the layout of the installed `<infiniband/verbs.h>`, and
//! `uroce_ffi::rdmacm`'s C types that of `<rdma/rdma_cma.h>`: for each header a C program
//! generated from a table below prints `sizeof`/`_Alignof` of every type,
//! `offsetof`/`sizeof` of every field and the value of every constant, and each number is
//! compared with Rust's `size_of`/`align_of`/`offset_of!` for the same item.
//!
//! Adding a field to the check means adding one line to [`table`] (or [`rdmacm_table`]).
//! Needs a C compiler (`$CC`, else `cc`) and the headers (Debian packages `libibverbs-dev`,
//! `librdmacm-dev`); without them the
//! test is skipped, or fails under `UROCE_REQUIRE_TOOLS=1`.

use std::fmt::Write as _;

mod support;

use support::{compile_source, run_numbered};
use uroce_ffi::abi::*;
use uroce_testkit::{skip, TempFile};

/// What one table line checks; each yields one line of C output with two numbers.
enum Check {
    /// `sizeof(c_type)`, `_Alignof(c_type)` against Rust `size_of`, `align_of`.
    Type {
        c_type: &'static str,
        size: usize,
        align: usize,
    },
    /// `offsetof(c_type, c_path)`, `sizeof(member)` against Rust `offset_of!` and the size of
    /// the Rust field.
    Field {
        c_type: &'static str,
        c_path: String,
        offset: usize,
        size: usize,
    },
    /// The value of a C constant (printed through `long long`) against the Rust value.
    Const { name: &'static str, value: i64 },
}

/// The size of the field that `_f` points to, found by type inference only (never called).
fn field_size<T, F>(_f: fn(*const T) -> *const F) -> usize {
    core::mem::size_of::<F>()
}

/// `ty!(struct ibv_qp)`: size and alignment of a C-named type.
macro_rules! ty {
    ($kw:ident $t:ident) => {
        Check::Type {
            c_type: concat!(stringify!($kw), " ", stringify!($t)),
            size: core::mem::size_of::<$t>(),
            align: core::mem::align_of::<$t>(),
        }
    };
}

/// `field!(struct ibv_send_wr, wr.rdma.rkey)`: a member, with the same path in C and Rust;
/// `field!(struct ibv_mw, type_ => "type")` when the C path differs (anonymous unions,
/// Rust keywords).
macro_rules! field {
    ($kw:ident $t:ident, $($p:ident).+ => $c:expr) => {
        Check::Field {
            c_type: concat!(stringify!($kw), " ", stringify!($t)),
            c_path: String::from($c),
            offset: core::mem::offset_of!($t, $($p).+),
            // SAFETY: the closure is never called; it only names the field's type.
            size: field_size(|p: *const $t| unsafe { &raw const (*p).$($p).+ }),
        }
    };
    ($kw:ident $t:ident, $($p:ident).+) => {
        field!($kw $t, $($p).+ => stringify!($($p).+).replace(' ', ""))
    };
}

/// `fields! {struct ibv_pd; context, handle}`: several members with identical paths.
macro_rules! fields {
    ($kw:ident $t:ident; $($($p:ident).+),+ $(,)?) => {
        [$(field!($kw $t, $($p).+)),+]
    };
}

/// `consts! {IBV_WR_SEND, …}`: constants with the same name in C and Rust.
macro_rules! consts {
    ($($n:ident),+ $(,)?) => {
        [$(Check::Const { name: stringify!($n), value: $n as i64 }),+]
    };
}

/// Everything checked. One line per item; a type's fields follow the type.
fn table() -> Vec<Check> {
    let mut t = Vec::new();
    t.push(ty!(struct ibv_device));
    t.extend(fields! {struct ibv_device;
        _ops, _ops._dummy1, _ops._dummy2, node_type, transport_type, name, dev_name, dev_path,
        ibdev_path
    });

    t.push(ty!(struct ibv_context_ops));
    t.extend(fields! {struct ibv_context_ops;
        _compat_query_device, _compat_query_port, _compat_alloc_pd, _compat_dealloc_pd,
        _compat_reg_mr, _compat_rereg_mr, _compat_dereg_mr, alloc_mw, bind_mw, dealloc_mw,
        _compat_create_cq, poll_cq, req_notify_cq, _compat_cq_event, _compat_resize_cq,
        _compat_destroy_cq, _compat_create_srq, _compat_modify_srq, _compat_query_srq,
        _compat_destroy_srq, post_srq_recv, _compat_create_qp, _compat_query_qp,
        _compat_modify_qp, _compat_destroy_qp, post_send, post_recv, _compat_create_ah,
        _compat_destroy_ah, _compat_attach_mcast, _compat_detach_mcast, _compat_async_event
    });

    t.push(ty!(struct ibv_context));
    t.extend(fields! {struct ibv_context;
        device, ops, ops.poll_cq, ops.req_notify_cq, ops.post_srq_recv, ops.post_send,
        ops.post_recv, ops.alloc_mw, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat
    });

    t.push(ty!(struct verbs_context));
    t.extend(fields! {struct verbs_context;
        query_port, advise_mr, alloc_null_mr, read_counters, attach_counters_point_flow,
        create_counters, destroy_counters, reg_dm_mr, alloc_dm, free_dm,
        modify_flow_action_esp, destroy_flow_action, create_flow_action_esp,
        modify_qp_rate_limit, alloc_parent_domain, dealloc_td, alloc_td, modify_cq,
        post_srq_ops, destroy_rwq_ind_table, create_rwq_ind_table, destroy_wq, modify_wq,
        create_wq, query_rt_values, create_cq_ex, query_device_ex, ibv_destroy_flow,
        ABI_placeholder2, ibv_create_flow, ABI_placeholder1, open_qp, create_qp_ex,
        get_srq_num, create_srq_ex, open_xrcd, close_xrcd, _ABI_placeholder3, sz, context,
        context.ops.post_send, context.abi_compat
    });
    t.push(field!(struct verbs_context, priv_ => "priv"));

    t.push(ty!(struct ibv_device_attr));
    t.extend(fields! {struct ibv_device_attr;
        fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
        vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
        max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
        max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
        max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
        max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
        max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt
    });

    t.push(ty!(struct ibv_gid_entry));
    t.extend(fields! {struct ibv_gid_entry;
        gid, gid_index, port_num, gid_type, ndev_ifindex
    });
    t.extend(consts! {
        IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2
    });

    t.push(ty!(struct ibv_port_attr));
    t.extend(fields! {struct ibv_port_attr;
        state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
        qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
        init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
        port_cap_flags2
    });

    t.push(ty!(union ibv_gid));
    t.extend(fields! {union ibv_gid;
        raw, global, global.subnet_prefix, global.interface_id
    });

    t.push(ty!(struct ibv_global_route));
    t.extend(fields! {struct ibv_global_route;
        dgid, flow_label, sgid_index, hop_limit, traffic_class
    });

    t.push(ty!(struct ibv_ah_attr));
    t.extend(fields! {struct ibv_ah_attr;
        grh, grh.dgid.raw, dlid, sl, src_path_bits, static_rate, is_global, port_num
    });

    t.push(ty!(struct ibv_qp_cap));
    t.extend(fields! {struct ibv_qp_cap;
        max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data
    });

    t.push(ty!(struct ibv_qp_init_attr));
    t.extend(fields! {struct ibv_qp_init_attr;
        qp_context, send_cq, recv_cq, srq, cap, cap.max_inline_data, qp_type, sq_sig_all
    });

    t.push(ty!(struct ibv_rx_hash_conf));
    t.extend(fields! {struct ibv_rx_hash_conf;
        rx_hash_function, rx_hash_key_len, rx_hash_key, rx_hash_fields_mask
    });

    t.push(ty!(struct ibv_qp_init_attr_ex));
    t.extend(fields! {struct ibv_qp_init_attr_ex;
        qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
        create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags
    });

    t.push(ty!(struct ibv_qp_attr));
    t.extend(fields! {struct ibv_qp_attr;
        qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap, ah_attr, ah_attr.grh.sgid_index, ah_attr.is_global,
        ah_attr.port_num, alt_ah_attr, pkey_index, alt_pkey_index, en_sqd_async_notify,
        sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout,
        retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit
    });

    t.push(ty!(struct ibv_srq_attr));
    t.extend(fields! {struct ibv_srq_attr;
        max_wr, max_sge, srq_limit
    });
    t.push(ty!(struct ibv_srq_init_attr));
    t.extend(fields! {struct ibv_srq_init_attr;
        srq_context, attr, attr.srq_limit
    });
    t.push(ty!(struct ibv_tm_cap));
    t.extend(fields! {struct ibv_tm_cap;
        max_num_tags, max_ops
    });
    t.push(ty!(struct ibv_srq_init_attr_ex));
    t.extend(fields! {struct ibv_srq_init_attr_ex;
        srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap
    });
    t.push(ty!(struct ibv_xrcd_init_attr));
    t.extend(fields! {struct ibv_xrcd_init_attr;
        comp_mask, fd, oflags
    });

    t.push(ty!(struct ibv_pd));
    t.extend(fields! {struct ibv_pd;
        context, handle
    });
    t.push(ty!(struct ibv_mr));
    t.extend(fields! {struct ibv_mr;
        context, pd, addr, length, handle, lkey, rkey
    });
    t.push(ty!(struct ibv_mw));
    t.extend(fields! {struct ibv_mw;
        context, pd, rkey, handle
    });
    t.push(field!(struct ibv_mw, type_ => "type"));
    t.push(ty!(struct ibv_mw_bind_info));
    t.extend(fields! {struct ibv_mw_bind_info;
        mr, addr, length, mw_access_flags
    });
    t.push(ty!(struct ibv_mw_bind));
    t.extend(fields! {struct ibv_mw_bind;
        wr_id, send_flags, bind_info
    });
    t.push(ty!(struct ibv_comp_channel));
    t.extend(fields! {struct ibv_comp_channel;
        context, fd, refcnt
    });
    t.push(ty!(struct ibv_cq));
    t.extend(fields! {struct ibv_cq;
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed
    });
    t.push(ty!(struct ibv_cq_ex));
    t.extend(fields! {struct ibv_cq_ex;
        context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
        async_events_completed, comp_mask, status, wr_id, start_poll, next_poll, end_poll,
        read_opcode, read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp,
        read_wc_flags, read_slid, read_sl, read_dlid_path_bits, read_completion_ts, read_cvlan,
        read_flow_tag, read_tm_info, read_completion_wallclock_ns
    });
    t.push(ty!(struct ibv_cq_init_attr_ex));
    t.extend(fields! {struct ibv_cq_init_attr_ex;
        cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain
    });
    t.push(ty!(struct ibv_poll_cq_attr));
    t.push(ty!(struct ibv_wc_tm_info));
    t.push(ty!(struct ibv_srq));
    t.extend(fields! {struct ibv_srq;
        context, srq_context, pd, handle, mutex, cond, events_completed
    });
    t.push(ty!(struct ibv_qp));
    t.extend(fields! {struct ibv_qp;
        context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex,
        cond, events_completed
    });
    t.push(ty!(struct ibv_qp_ex));
    t.extend(fields! {struct ibv_qp_ex;
        qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
        wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
        wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
        wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start,
        wr_complete, wr_abort, wr_atomic_write
    });
    t.push(ty!(struct ibv_data_buf));
    t.extend(fields! {struct ibv_data_buf;
        addr, length
    });
    t.push(ty!(struct ibv_ah));
    t.extend(fields! {struct ibv_ah;
        context, pd, handle
    });
    t.push(ty!(struct ibv_xrcd));
    t.extend(fields! {struct ibv_xrcd;
        context
    });

    t.push(ty!(struct ibv_sge));
    t.extend(fields! {struct ibv_sge;
        addr, length, lkey
    });
    t.push(ty!(struct ibv_send_wr));
    t.extend(fields! {struct ibv_send_wr;
        wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, wr.rdma,
        wr.rdma.remote_addr, wr.rdma.rkey, wr.atomic, wr.atomic.remote_addr,
        wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey, wr.ud, wr.ud.ah,
        wr.ud.remote_qpn, wr.ud.remote_qkey, qp_type, qp_type.xrc, qp_type.xrc.remote_srqn
    });
    t.push(field!(struct ibv_send_wr, imm_data => "invalidate_rkey"));
    t.push(field!(struct ibv_send_wr, bind_mw_tso.bind_mw => "bind_mw"));
    t.push(field!(struct ibv_send_wr, bind_mw_tso.bind_mw.mw => "bind_mw.mw"));
    t.push(field!(struct ibv_send_wr, bind_mw_tso.bind_mw.rkey => "bind_mw.rkey"));
    t.push(field!(struct ibv_send_wr, bind_mw_tso.bind_mw.bind_info => "bind_mw.bind_info"));
    t.push(
        field!(struct ibv_send_wr, bind_mw_tso.bind_mw.bind_info.mw_access_flags
        => "bind_mw.bind_info.mw_access_flags"),
    );
    t.push(field!(struct ibv_send_wr, bind_mw_tso.tso => "tso"));
    t.push(field!(struct ibv_send_wr, bind_mw_tso.tso.hdr => "tso.hdr"));
    t.push(field!(struct ibv_send_wr, bind_mw_tso.tso.hdr_sz => "tso.hdr_sz"));
    t.push(field!(struct ibv_send_wr, bind_mw_tso.tso.mss => "tso.mss"));
    t.push(ty!(struct ibv_recv_wr));
    t.extend(fields! {struct ibv_recv_wr;
        wr_id, next, sg_list, num_sge
    });
    t.push(ty!(struct ibv_wc));
    t.extend(fields! {struct ibv_wc;
        wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp, wc_flags,
        pkey_index, slid, sl, dlid_path_bits
    });
    t.push(field!(struct ibv_wc, imm_data => "invalidated_rkey"));
    t.push(ty!(struct ibv_async_event));
    t.extend(fields! {struct ibv_async_event;
        element, element.cq, element.qp, element.srq, element.wq, element.port_num, event_type
    });

    t.extend(consts! {
        IBV_NODE_UNKNOWN, IBV_NODE_CA, IBV_NODE_SWITCH, IBV_NODE_ROUTER, IBV_NODE_RNIC,
        IBV_NODE_USNIC, IBV_NODE_USNIC_UDP, IBV_NODE_UNSPECIFIED, IBV_TRANSPORT_UNKNOWN,
        IBV_TRANSPORT_IB, IBV_TRANSPORT_IWARP, IBV_TRANSPORT_USNIC, IBV_TRANSPORT_USNIC_UDP,
        IBV_TRANSPORT_UNSPECIFIED, IBV_ATOMIC_NONE, IBV_ATOMIC_HCA, IBV_ATOMIC_GLOB
    });
    t.extend(consts! {
        IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096, IBV_PORT_NOP,
        IBV_PORT_DOWN, IBV_PORT_INIT, IBV_PORT_ARMED, IBV_PORT_ACTIVE, IBV_PORT_ACTIVE_DEFER,
        IBV_LINK_LAYER_UNSPECIFIED, IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_ETHERNET
    });
    t.extend(consts! {
        IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR,
        IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED, IBV_EVENT_PATH_MIG, IBV_EVENT_PATH_MIG_ERR,
        IBV_EVENT_DEVICE_FATAL, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR,
        IBV_EVENT_LID_CHANGE, IBV_EVENT_PKEY_CHANGE, IBV_EVENT_SM_CHANGE, IBV_EVENT_SRQ_ERR,
        IBV_EVENT_SRQ_LIMIT_REACHED, IBV_EVENT_QP_LAST_WQE_REACHED,
        IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_GID_CHANGE, IBV_EVENT_WQ_FATAL
    });
    t.extend(consts! {
        IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_QP_OP_ERR, IBV_WC_LOC_EEC_OP_ERR,
        IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_MW_BIND_ERR, IBV_WC_BAD_RESP_ERR,
        IBV_WC_LOC_ACCESS_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR,
        IBV_WC_REM_OP_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR,
        IBV_WC_LOC_RDD_VIOL_ERR, IBV_WC_REM_INV_RD_REQ_ERR, IBV_WC_REM_ABORT_ERR,
        IBV_WC_INV_EECN_ERR, IBV_WC_INV_EEC_STATE_ERR, IBV_WC_FATAL_ERR,
        IBV_WC_RESP_TIMEOUT_ERR, IBV_WC_GENERAL_ERR, IBV_WC_TM_ERR, IBV_WC_TM_RNDV_INCOMPLETE
    });
    t.extend(consts! {
        IBV_QP_EX_WITH_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_SEND,
        IBV_QP_EX_WITH_SEND_WITH_IMM, IBV_QP_EX_WITH_RDMA_READ,
        IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
        IBV_QP_EX_WITH_LOCAL_INV, IBV_QP_EX_WITH_BIND_MW, IBV_QP_EX_WITH_SEND_WITH_INV,
        IBV_QP_EX_WITH_TSO, IBV_QP_EX_WITH_ATOMIC_WRITE
    });
    t.extend(consts! {
        IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ, IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD,
        IBV_WC_BIND_MW, IBV_WC_LOCAL_INV, IBV_WC_TSO, IBV_WC_ATOMIC_WRITE, IBV_WC_RECV,
        IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_GRH, IBV_WC_WITH_IMM, IBV_WC_IP_CSUM_OK,
        IBV_WC_WITH_INV
    });
    t.extend(consts! {
        IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_MW_BIND, IBV_ACCESS_ZERO_BASED,
        IBV_ACCESS_ON_DEMAND, IBV_ACCESS_HUGETLB, IBV_ACCESS_RELAXED_ORDERING, IBV_MW_TYPE_1,
        IBV_MW_TYPE_2, IBV_SRQT_BASIC, IBV_SRQT_XRC, IBV_SRQT_TM, IBV_SRQ_MAX_WR,
        IBV_SRQ_LIMIT
    });
    t.extend(consts! {
        IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RAW_PACKET, IBV_QPT_XRC_SEND,
        IBV_QPT_XRC_RECV, IBV_QPT_DRIVER, IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_XRCD,
        IBV_QP_INIT_ATTR_CREATE_FLAGS, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
    });
    t.extend(consts! {
        IBV_QP_STATE, IBV_QP_CUR_STATE, IBV_QP_EN_SQD_ASYNC_NOTIFY, IBV_QP_ACCESS_FLAGS,
        IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY, IBV_QP_AV, IBV_QP_PATH_MTU,
        IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN,
        IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_ALT_PATH, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN,
        IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_PATH_MIG_STATE, IBV_QP_CAP, IBV_QP_DEST_QPN,
        IBV_QP_RATE_LIMIT
    });
    t.extend(consts! {
        IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE,
        IBV_QPS_ERR, IBV_QPS_UNKNOWN, IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_MIG_ARMED
    });
    t.extend(consts! {
        IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV, IBV_WR_TSO, IBV_WR_DRIVER1,
        IBV_WR_ATOMIC_WRITE, IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
        IBV_SEND_INLINE, IBV_SEND_IP_CSUM
    });
    t.extend(device_ex_table());
    t
}

/// The extended device attributes (`uroce_ffi::device_ex`).
fn device_ex_table() -> Vec<Check> {
    use uroce_ffi::device_ex::*;
    let mut t = vec![
        ty!(struct ibv_query_device_ex_input),
        ty!(struct ibv_odp_caps),
        ty!(struct ibv_tso_caps),
        ty!(struct ibv_rss_caps),
        ty!(struct ibv_packet_pacing_caps),
        ty!(struct ibv_tm_caps),
        ty!(struct ibv_cq_moderation_caps),
        ty!(struct ibv_pci_atomic_caps),
    ];
    t.extend(fields! {struct ibv_odp_caps;
        general_caps, per_transport_caps.rc_odp_caps, per_transport_caps.uc_odp_caps,
        per_transport_caps.ud_odp_caps
    });
    t.extend(fields! {struct ibv_rss_caps;
        supported_qpts, max_rwq_indirection_tables, max_rwq_indirection_table_size,
        rx_hash_fields_mask, rx_hash_function
    });
    t.push(ty!(struct ibv_device_attr_ex));
    t.extend(fields! {struct ibv_device_attr_ex;
        orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
        device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps,
        raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps,
        phys_port_cnt_ex
    });
    t.extend(
        consts! {IBV_DEVICE_SYS_IMAGE_GUID, IBV_DEVICE_RC_RNR_NAK_GEN,
        IBV_DEVICE_MEM_WINDOW, IBV_DEVICE_XRC, IBV_DEVICE_MEM_WINDOW_TYPE_2B},
    );
    {
        use uroce_ffi::parent_domain::*;
        t.push(ty!(struct ibv_td_init_attr));
        t.push(ty!(struct ibv_td));
        t.extend(fields! {struct ibv_td; context});
        t.push(ty!(struct ibv_parent_domain_init_attr));
        t.extend(fields! {struct ibv_parent_domain_init_attr;
            pd, td, comp_mask, alloc, free, pd_context
        });
        t.push(ty!(struct ibv_values_ex));
        t.extend(fields! {struct ibv_values_ex; comp_mask, raw_clock});
        t.extend(consts! {
            IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS, IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
            IBV_VALUES_MASK_RAW_CLOCK
        });
    }
    t
}

/// The C program: one `printf` of two numbers per table line, in table order.
/// The C types and constants of `<rdma/rdma_cma.h>` (rdma-core 44) that uroce's RDMA-CM
/// (`uroce_ffi::rdmacm`) mirrors.
fn rdmacm_table() -> Vec<Check> {
    use uroce_ffi::rdmacm::*;
    let mut t = Vec::new();
    t.push(ty!(struct rdma_event_channel));
    t.extend(fields! {struct rdma_event_channel; fd});
    t.push(ty!(struct rdma_ib_addr));
    t.extend(fields! {struct rdma_ib_addr; sgid, dgid, pkey});
    t.push(ty!(struct rdma_addr));
    t.push(field!(struct rdma_addr, src => "src_storage"));
    t.push(field!(struct rdma_addr, dst => "dst_storage"));
    t.push(field!(struct rdma_addr, ibaddr => "addr.ibaddr"));
    t.push(ty!(struct rdma_route));
    t.extend(fields! {struct rdma_route; addr, path_rec, num_paths});
    t.push(ty!(struct rdma_cm_id));
    t.extend(fields! {struct rdma_cm_id;
        verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
        recv_cq_channel, recv_cq, srq, pd, qp_type
    });
    t.push(ty!(struct rdma_conn_param));
    t.extend(fields! {struct rdma_conn_param;
        private_data, private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num
    });
    t.push(ty!(struct rdma_ud_param));
    t.extend(fields! {struct rdma_ud_param; private_data, private_data_len, ah_attr, qp_num, qkey});
    t.push(ty!(struct rdma_cm_event));
    t.extend(
        fields! {struct rdma_cm_event; id, listen_id, event, status, param, param.conn, param.ud},
    );
    t.push(ty!(struct rdma_addrinfo));
    t.extend(fields! {struct rdma_addrinfo;
        ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
        ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
        ai_connect_len, ai_connect, ai_next
    });
    t.push(ty!(struct rdma_cm_join_mc_attr_ex));
    t.extend(fields! {struct rdma_cm_join_mc_attr_ex; comp_mask, join_flags, addr});
    t.push(ty!(struct ibv_ece));
    t.extend(fields! {struct ibv_ece; vendor_id, options, comp_mask});
    t.extend(consts! {
        RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RAI_PASSIVE, RDMA_CM_JOIN_MC_ATTR_ADDRESS,
        RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS, RDMA_MC_JOIN_FLAG_FULLMEMBER,
        RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER
    });
    t
}

fn c_source(table: &[Check], header: &str) -> String {
    let mut s = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include <{header}>\nint main(void)\n{{\n"
    );
    for (i, c) in table.iter().enumerate() {
        // `writeln!` into a String cannot fail.
        let _ = match c {
            Check::Type { c_type, .. } => writeln!(
                s,
                "\tprintf(\"{i} %zu %zu\\n\", sizeof({c_type}), _Alignof({c_type}));"
            ),
            Check::Field { c_type, c_path, .. } => writeln!(
                s,
                "\tprintf(\"{i} %zu %zu\\n\", offsetof({c_type}, {c_path}), \
                 sizeof((({c_type} *)0)->{c_path}));"
            ),
            Check::Const { name, .. } => {
                writeln!(s, "\tprintf(\"{i} %lld 0\\n\", (long long)({name}));")
            }
        };
    }
    s.push_str("\treturn 0;\n}\n");
    s
}

#[test]
fn abi_layout_matches_installed_verbs_h() {
    check_layout(
        "abi_layout_matches_installed_verbs_h",
        "infiniband/verbs.h",
        "libibverbs-dev",
        &table(),
    );
}

#[test]
fn rdmacm_layout_matches_installed_rdma_cma_h() {
    check_layout(
        "rdmacm_layout_matches_installed_rdma_cma_h",
        "rdma/rdma_cma.h",
        "librdmacm-dev",
        &rdmacm_table(),
    );
}

/// Compiles the C program for `table` against `<header>`, runs it and compares every
/// number with Rust's; skips (fails under `UROCE_REQUIRE_TOOLS=1`) without a C compiler
/// or the header (Debian package `package`).
fn check_layout(test: &str, header: &str, package: &str, table: &[Check]) {
    let probe = TempFile::new("ffi-probe", "bin");
    if let Err(e) = compile_source(
        &format!("#include <{header}>\nint main(void) {{ return 0; }}\n"),
        &probe,
        &[],
    ) {
        skip(
            test,
            &format!(
                "cannot compile against <{header}> (install a C compiler and the Debian \
                 package {package}): {e}"
            ),
        );
        return;
    }

    let exe = TempFile::new("ffi-layout", "bin");
    if let Err(e) = compile_source(&c_source(table, header), &exe, &[]) {
        panic!("the generated layout program does not compile (a C name is wrong?): {e}");
    }
    let rows = run_numbered(&exe, table.len());
    let mut errors = Vec::new();
    for (check, &(a, b)) in table.iter().zip(&rows) {
        match check {
            Check::Type {
                c_type,
                size,
                align,
            } => {
                if (a, b) != (*size as i64, *align as i64) {
                    errors.push(format!(
                        "{c_type}: C size {a} align {b}, Rust size {size} align {align}"
                    ));
                }
            }
            Check::Field {
                c_type,
                c_path,
                offset,
                size,
            } => {
                if (a, b) != (*offset as i64, *size as i64) {
                    errors.push(format!(
                        "{c_type}.{c_path}: C offset {a} size {b}, Rust offset {offset} \
                         size {size}"
                    ));
                }
            }
            Check::Const { name, value } => {
                if a != *value {
                    errors.push(format!("{name}: C {a}, Rust {value}"));
                }
            }
        }
    }
    let (types, fields, consts) = table.iter().fold((0, 0, 0), |(t, f, c), x| match x {
        Check::Type { .. } => (t + 1, f, c),
        Check::Field { .. } => (t, f + 1, c),
        Check::Const { .. } => (t, f, c + 1),
    });
    assert!(
        errors.is_empty(),
        "{} of {} checks differ from <{header}>:\n{}",
        errors.len(),
        table.len(),
        errors.join("\n")
    );
    eprintln!("layout: {types} types, {fields} fields, {consts} constants match <{header}>");
}
