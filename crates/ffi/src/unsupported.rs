//! The rest of rdma-core 44's exported functions: the ones uroce does not implement. Each
//! exists so that programs and libraries bound to it load (every binary is linked with
//! `BIND_NOW`; libmlx5 and libefa, which perftest links, bind the whole provider
//! interface), and each fails cleanly when called: a NULL pointer or an error value, with
//! `errno` set: `EOPNOTSUPP` for current functions uroce may implement later, `ENOSYS` for
//! the IBVERBS_1.0 compatibility versions whose pre-2006 structures uroce will not
//! support. Functions that return nothing do nothing: the objects they would release can
//! never have been created by uroce. With `UROCE_DEBUG` set, every call is reported on
//! stderr.
//!
//! The stubs ignore their arguments. On x86_64 the caller passes and cleans up arguments,
//! so a definition without parameters is a valid callee for any C prototype, including
//! variadic ones (`__verbs_log`).

use std::ffi::{c_int, c_uint, c_void};
use std::io::Write as _;

use crate::entry::set_errno;

/// Records a call to an unsupported function: sets `errno`, reports it under
/// `UROCE_DEBUG`.
fn unsupported(name: &str, errno: c_int) {
    if crate::entry::debug_enabled() {
        // A failed write to stderr is ignored: diagnostics must not fail the call.
        let _ = writeln!(std::io::stderr(), "uroce: {name} is not supported");
    }
    set_errno(errno);
}

/// `kind internal => "public@VERSION";` defines `internal`, exported as the public name.
/// Kinds: `ptr` (returns NULL), `int` (returns the errno value), `neg` (returns -1), `u32`
/// (returns 0), `void`, all with `EOPNOTSUPP`; the `compat_` kinds do the same with
/// `ENOSYS`, and `compat_u64` returns 0.
macro_rules! unsupported {
    ($($kind:ident $f:ident => $public:literal;)*) => {$(
        #[cfg(not(test))]
        std::arch::global_asm!(concat!(".symver ", stringify!($f), ", ", $public));
        unsupported!(@fn $kind $f $public);
    )*};
    (@fn ptr $f:ident $p:literal) => { unsupported!(@def $f $p, *mut c_void, libc::EOPNOTSUPP, std::ptr::null_mut()); };
    (@fn int $f:ident $p:literal) => { unsupported!(@def $f $p, c_int, libc::EOPNOTSUPP, libc::EOPNOTSUPP); };
    (@fn neg $f:ident $p:literal) => { unsupported!(@def $f $p, c_int, libc::EOPNOTSUPP, -1); };
    (@fn u32 $f:ident $p:literal) => { unsupported!(@def $f $p, c_uint, libc::EOPNOTSUPP, 0); };
    (@fn void $f:ident $p:literal) => { unsupported!(@def $f $p, (), libc::EOPNOTSUPP, ()); };
    (@fn compat_ptr $f:ident $p:literal) => { unsupported!(@def $f $p, *mut c_void, libc::ENOSYS, std::ptr::null_mut()); };
    (@fn compat_int $f:ident $p:literal) => { unsupported!(@def $f $p, c_int, libc::ENOSYS, libc::ENOSYS); };
    (@fn compat_neg $f:ident $p:literal) => { unsupported!(@def $f $p, c_int, libc::ENOSYS, -1); };
    (@fn compat_u64 $f:ident $p:literal) => { unsupported!(@def $f $p, u64, libc::ENOSYS, 0); };
    (@fn compat_void $f:ident $p:literal) => { unsupported!(@def $f $p, (), libc::ENOSYS, ()); };
    (@def $f:ident $p:literal, $ret:ty, $errno:expr, $value:expr) => {
        #[doc = concat!("`", $p, "`: not supported; fails with `errno` set (see the module text).")]
        ///
        /// # Safety
        /// None: the arguments are not read.
        #[no_mangle]
        pub unsafe extern "C" fn $f() -> $ret {
            unsupported($p, $errno);
            $value
        }
    };
}

unsupported! {
    // Default versions: what programs linked against rdma-core 44 bind.
    int uroce_ibv_resolve_eth_l2_from_gid => "ibv_resolve_eth_l2_from_gid@@IBVERBS_1.1";
    int uroce_ibv_query_ece => "ibv_query_ece@@IBVERBS_1.10";
    int uroce_ibv_set_ece => "ibv_set_ece@@IBVERBS_1.10";
    ptr uroce_ibv_reg_dmabuf_mr => "ibv_reg_dmabuf_mr@@IBVERBS_1.12";
    ptr uroce_ibv_import_dm => "ibv_import_dm@@IBVERBS_1.13";
    void uroce_ibv_unimport_dm => "ibv_unimport_dm@@IBVERBS_1.13";
    // The provider interface (IBVERBS_PRIVATE_34): providers are never loaded, so
    // nothing calls these unless a provider is used outside uroce's device list.
    u32 uroce_ioctl_final_num_attrs => "__ioctl_final_num_attrs@@IBVERBS_PRIVATE_34";
    void uroce_verbs_log => "__verbs_log@@IBVERBS_PRIVATE_34";
    ptr uroce__verbs_init_and_alloc_context => "_verbs_init_and_alloc_context@@IBVERBS_PRIVATE_34";
    int uroce_execute_ioctl => "execute_ioctl@@IBVERBS_PRIVATE_34";
    neg uroce_ibv_read_ibdev_sysfs_file => "ibv_read_ibdev_sysfs_file@@IBVERBS_PRIVATE_34";
    void uroce_verbs_init_cq => "verbs_init_cq@@IBVERBS_PRIVATE_34";
    ptr uroce_verbs_open_device => "verbs_open_device@@IBVERBS_PRIVATE_34";
    void uroce_verbs_set_ops => "verbs_set_ops@@IBVERBS_PRIVATE_34";
    void uroce_verbs_uninit_context => "verbs_uninit_context@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_advise_mr => "ibv_cmd_advise_mr@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_alloc_dm => "ibv_cmd_alloc_dm@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_alloc_mw => "ibv_cmd_alloc_mw@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_alloc_pd => "ibv_cmd_alloc_pd@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_attach_mcast => "ibv_cmd_attach_mcast@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_close_xrcd => "ibv_cmd_close_xrcd@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_ah => "ibv_cmd_create_ah@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_counters => "ibv_cmd_create_counters@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_cq => "ibv_cmd_create_cq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_cq_ex => "ibv_cmd_create_cq_ex@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_flow => "ibv_cmd_create_flow@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_flow_action_esp => "ibv_cmd_create_flow_action_esp@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_qp => "ibv_cmd_create_qp@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_qp_ex2 => "ibv_cmd_create_qp_ex2@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_qp_ex => "ibv_cmd_create_qp_ex@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_rwq_ind_table => "ibv_cmd_create_rwq_ind_table@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_srq => "ibv_cmd_create_srq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_srq_ex => "ibv_cmd_create_srq_ex@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_create_wq => "ibv_cmd_create_wq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_dealloc_mw => "ibv_cmd_dealloc_mw@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_dealloc_pd => "ibv_cmd_dealloc_pd@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_dereg_mr => "ibv_cmd_dereg_mr@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_ah => "ibv_cmd_destroy_ah@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_counters => "ibv_cmd_destroy_counters@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_cq => "ibv_cmd_destroy_cq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_flow => "ibv_cmd_destroy_flow@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_flow_action => "ibv_cmd_destroy_flow_action@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_qp => "ibv_cmd_destroy_qp@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_rwq_ind_table => "ibv_cmd_destroy_rwq_ind_table@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_srq => "ibv_cmd_destroy_srq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_destroy_wq => "ibv_cmd_destroy_wq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_detach_mcast => "ibv_cmd_detach_mcast@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_free_dm => "ibv_cmd_free_dm@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_get_context => "ibv_cmd_get_context@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_modify_cq => "ibv_cmd_modify_cq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_modify_flow_action_esp => "ibv_cmd_modify_flow_action_esp@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_modify_qp => "ibv_cmd_modify_qp@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_modify_qp_ex => "ibv_cmd_modify_qp_ex@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_modify_srq => "ibv_cmd_modify_srq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_modify_wq => "ibv_cmd_modify_wq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_open_qp => "ibv_cmd_open_qp@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_open_xrcd => "ibv_cmd_open_xrcd@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_poll_cq => "ibv_cmd_poll_cq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_post_recv => "ibv_cmd_post_recv@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_post_send => "ibv_cmd_post_send@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_post_srq_recv => "ibv_cmd_post_srq_recv@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_query_context => "ibv_cmd_query_context@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_query_device_any => "ibv_cmd_query_device_any@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_query_mr => "ibv_cmd_query_mr@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_query_port => "ibv_cmd_query_port@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_query_qp => "ibv_cmd_query_qp@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_query_srq => "ibv_cmd_query_srq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_read_counters => "ibv_cmd_read_counters@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_reg_dm_mr => "ibv_cmd_reg_dm_mr@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_reg_dmabuf_mr => "ibv_cmd_reg_dmabuf_mr@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_reg_mr => "ibv_cmd_reg_mr@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_req_notify_cq => "ibv_cmd_req_notify_cq@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_rereg_mr => "ibv_cmd_rereg_mr@@IBVERBS_PRIVATE_34";
    int uroce_ibv_cmd_resize_cq => "ibv_cmd_resize_cq@@IBVERBS_PRIVATE_34";
    // Compatibility versions for programs linked against libibverbs 1.0 (before
    // 2006), whose structures differ: never implemented.
    compat_void uroce_compat_ibv_ack_async_event_1_0 => "ibv_ack_async_event@IBVERBS_1.0";
    compat_void uroce_compat_ibv_ack_cq_events_1_0 => "ibv_ack_cq_events@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_alloc_pd_1_0 => "ibv_alloc_pd@IBVERBS_1.0";
    compat_int uroce_compat_ibv_attach_mcast_1_0 => "ibv_attach_mcast@IBVERBS_1.0";
    compat_int uroce_compat_ibv_close_device_1_0 => "ibv_close_device@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_create_ah_1_0 => "ibv_create_ah@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_create_cq_1_0 => "ibv_create_cq@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_create_qp_1_0 => "ibv_create_qp@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_create_srq_1_0 => "ibv_create_srq@IBVERBS_1.0";
    compat_int uroce_compat_ibv_dealloc_pd_1_0 => "ibv_dealloc_pd@IBVERBS_1.0";
    compat_int uroce_compat_ibv_dereg_mr_1_0 => "ibv_dereg_mr@IBVERBS_1.0";
    compat_int uroce_compat_ibv_destroy_ah_1_0 => "ibv_destroy_ah@IBVERBS_1.0";
    compat_int uroce_compat_ibv_destroy_cq_1_0 => "ibv_destroy_cq@IBVERBS_1.0";
    compat_int uroce_compat_ibv_destroy_qp_1_0 => "ibv_destroy_qp@IBVERBS_1.0";
    compat_int uroce_compat_ibv_destroy_srq_1_0 => "ibv_destroy_srq@IBVERBS_1.0";
    compat_int uroce_compat_ibv_detach_mcast_1_0 => "ibv_detach_mcast@IBVERBS_1.0";
    compat_void uroce_compat_ibv_free_device_list_1_0 => "ibv_free_device_list@IBVERBS_1.0";
    compat_neg uroce_compat_ibv_get_async_event_1_0 => "ibv_get_async_event@IBVERBS_1.0";
    compat_neg uroce_compat_ibv_get_cq_event_1_0 => "ibv_get_cq_event@IBVERBS_1.0";
    compat_u64 uroce_compat_ibv_get_device_guid_1_0 => "ibv_get_device_guid@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_get_device_list_1_0 => "ibv_get_device_list@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_get_device_name_1_0 => "ibv_get_device_name@IBVERBS_1.0";
    compat_int uroce_compat_ibv_modify_qp_1_0 => "ibv_modify_qp@IBVERBS_1.0";
    compat_int uroce_compat_ibv_modify_srq_1_0 => "ibv_modify_srq@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_open_device_1_0 => "ibv_open_device@IBVERBS_1.0";
    compat_int uroce_compat_ibv_query_device_1_0 => "ibv_query_device@IBVERBS_1.0";
    compat_int uroce_compat_ibv_query_gid_1_0 => "ibv_query_gid@IBVERBS_1.0";
    compat_int uroce_compat_ibv_query_pkey_1_0 => "ibv_query_pkey@IBVERBS_1.0";
    compat_int uroce_compat_ibv_query_port_1_0 => "ibv_query_port@IBVERBS_1.0";
    compat_int uroce_compat_ibv_query_qp_1_0 => "ibv_query_qp@IBVERBS_1.0";
    compat_int uroce_compat_ibv_query_srq_1_0 => "ibv_query_srq@IBVERBS_1.0";
    compat_ptr uroce_compat_ibv_reg_mr_1_0 => "ibv_reg_mr@IBVERBS_1.0";
    compat_int uroce_compat_ibv_resize_cq_1_0 => "ibv_resize_cq@IBVERBS_1.0";
}
