//! The function table of a context: the `ibv_context.ops` slots and the `verbs_context`
//! slots that `<infiniband/verbs.h>`'s inline functions call (`ibv_post_send`,
//! `ibv_poll_cq`, `ibv_create_qp_ex`, `ibv_query_device_ex`, …), each pointing at the
//! module of its object. `crate::device` fills them into every context it makes.

use crate::abi::*;

/// Points the slots of `vctx` at this library's implementations; the slots it does not
/// set stay NULL (the header inlines of the `verbs_context` ones then report the call
/// unsupported).
pub(crate) fn fill(vctx: &mut verbs_context) {
    vctx.query_port = Some(crate::context::vctx_query_port);
    vctx.query_device_ex = crate::device_ex::vctx_query_device_ex as *const std::ffi::c_void;
    vctx.create_cq_ex = crate::cq::ex::vctx_create_cq_ex as *const std::ffi::c_void;
    vctx.alloc_td = crate::parent_domain::vctx_alloc_td as *const std::ffi::c_void;
    vctx.dealloc_td = crate::parent_domain::vctx_dealloc_td as *const std::ffi::c_void;
    vctx.alloc_parent_domain =
        crate::parent_domain::vctx_alloc_parent_domain as *const std::ffi::c_void;
    vctx.query_rt_values = crate::parent_domain::vctx_query_rt_values as *const std::ffi::c_void;
    vctx.context.ops.poll_cq = Some(crate::cq::ops_poll_cq);
    vctx.context.ops.req_notify_cq = Some(crate::cq::ops_req_notify_cq);
    vctx.context.ops.post_send = Some(crate::qp::post::ops_post_send);
    vctx.context.ops.post_recv = Some(crate::qp::post::ops_post_recv);
    vctx.context.ops.post_srq_recv = Some(crate::qp::post::ops_post_srq_recv);
    vctx.context.ops.alloc_mw = Some(crate::mw::ops_alloc_mw);
    vctx.context.ops.bind_mw = Some(crate::mw::ops_bind_mw);
    vctx.context.ops.dealloc_mw = Some(crate::mw::ops_dealloc_mw);
    vctx.open_xrcd = Some(crate::xrc::vctx_open_xrcd);
    vctx.close_xrcd = Some(crate::xrc::vctx_close_xrcd);
    vctx.create_srq_ex = Some(crate::xrc::vctx_create_srq_ex);
    vctx.get_srq_num = Some(crate::xrc::vctx_get_srq_num);
    vctx.create_qp_ex = Some(crate::qp::vctx_create_qp_ex);
    // The slot is untyped in the struct; the header casts it back to
    // `struct ibv_qp *(*)(struct ibv_context *, struct ibv_qp_open_attr *)`.
    let open_qp: unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_open_attr) -> *mut ibv_qp =
        crate::xrc::vctx_open_qp;
    vctx.open_qp = open_qp as *const std::ffi::c_void;
}
