//! `#[repr(C)]` mirrors of the `<rdma/rdma_cma.h>` (rdma-core 44) types and constants that
//! uroce's RDMA-CM (`crate::rdmacm`) hands to C, checked by `tests/layout.rs`
//! (`rdmacm_layout_matches_installed_rdma_cma_h`).

use core::ffi::{c_char, c_int, c_void};

use super::verbs::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_qp_type,
    ibv_srq,
};

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    /// The descriptor to poll.
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key (network order).
    pub pkey: u16,
}

/// `struct rdma_addr`: source and destination socket addresses, the GIDs.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// Source (`sockaddr_storage`).
    pub src: libc::sockaddr_storage,
    /// Destination.
    pub dst: libc::sockaddr_storage,
    /// GIDs.
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// Addresses.
    pub addr: rdma_addr,
    /// Path records (uroce: NULL).
    pub path_rec: *mut c_void,
    /// Their number (0).
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    /// The verbs context (of this library).
    pub verbs: *mut ibv_context,
    /// The event channel.
    pub channel: *mut rdma_event_channel,
    /// The application's context.
    pub context: *mut c_void,
    /// The QP (from `rdma_create_qp`).
    pub qp: *mut ibv_qp,
    /// Addresses.
    pub route: rdma_route,
    /// Port space.
    pub ps: c_int,
    /// Port number (1 once bound).
    pub port_num: u8,
    /// The last event of a synchronous id.
    pub event: *mut rdma_cm_event,
    /// CQs and channels `rdma_create_qp` made when none were given.
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive channel.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ (uroce: NULL).
    pub srq: *mut ibv_srq,
    /// The PD of the QP.
    pub pd: *mut ibv_pd,
    /// QP type of the port space.
    pub qp_type: ibv_qp_type,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Flow control.
    pub flow_control: u8,
    /// Retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: u8,
    /// QPN (id without QP; events: the peer's).
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// Address vector to the peer.
    pub ah_attr: ibv_ah_attr,
    /// Remote QPN.
    pub qp_num: u32,
    /// Remote Q_Key.
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected port spaces.
    pub conn: rdma_conn_param,
    /// UD.
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    /// The id.
    pub id: *mut rdma_cm_id,
    /// The listening id of a connection request.
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// Status.
    pub status: c_int,
    /// Parameters.
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    /// `RAI_*`.
    pub ai_flags: c_int,
    /// `AF_INET` / `AF_INET6`.
    pub ai_family: c_int,
    /// `IBV_QPT_*`.
    pub ai_qp_type: c_int,
    /// `RDMA_PS_*`.
    pub ai_port_space: c_int,
    /// Source length.
    pub ai_src_len: libc::socklen_t,
    /// Destination length.
    pub ai_dst_len: libc::socklen_t,
    /// Source.
    pub ai_src_addr: *mut libc::sockaddr,
    /// Destination.
    pub ai_dst_addr: *mut libc::sockaddr,
    /// Source name (NULL).
    pub ai_src_canonname: *mut c_char,
    /// Destination name (NULL).
    pub ai_dst_canonname: *mut c_char,
    /// Route length (0).
    pub ai_route_len: usize,
    /// Route (NULL).
    pub ai_route: *mut c_void,
    /// Connect data length (0).
    pub ai_connect_len: usize,
    /// Connect data (NULL).
    pub ai_connect: *mut c_void,
    /// Next (NULL: one entry).
    pub ai_next: *mut rdma_addrinfo,
}

/// `RDMA_PS_TCP`.
pub const RDMA_PS_TCP: c_int = 0x0106;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: c_int = 0x0111;
/// `RDMA_PS_IB` (any QP type; librdmacm's port space for XRC).
pub const RDMA_PS_IB: c_int = 0x013F;
/// `RAI_PASSIVE`.
pub const RAI_PASSIVE: c_int = 1;

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_*`.
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub join_flags: u32,
    /// The group's address.
    pub addr: *mut libc::sockaddr,
}

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`.
pub const RDMA_CM_JOIN_MC_ATTR_ADDRESS: u32 = 1;
/// `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
pub const RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS: u32 = 2;
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`.
pub const RDMA_MC_JOIN_FLAG_FULLMEMBER: u32 = 0;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
pub const RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: u32 = 1;
