//! uroce's C ABI: the layer that lets unmodified programs built against rdma-core 44's
//! `<infiniband/verbs.h>` (Debian 12: ibverbs-utils, perftest, rdmacm-utils) run on uroce,
//! as a drop-in `libibverbs.so.1` on top of uroce-net and uroce-verbs.
//!
//! * [`abi`]: `#[repr(C)]` mirrors of the structs, unions and enum constants those programs
//!   use, with layouts proven identical to the installed header on x86_64 by
//!   `tests/layout.rs` (which compiles a C program against `<infiniband/verbs.h>` and
//!   compares every `sizeof`/`offsetof`).
//! * [`exports`], [`verbs_api`], [`async_events`], [`utility`]: the exported functions
//!   uroce implements. The cdylib (`liburoce_ffi.so`, SONAME `libibverbs.so.1`, rdma-core
//!   44's symbol versions) is loaded by unmodified programs in place of the real library
//!   (`LD_LIBRARY_PATH`): devices and queries; PDs, MRs, completion channels, CQs, SRQs, RC
//!   QPs and the data-path slots of `ibv_context.ops`; asynchronous events; helpers that
//!   need no object. Enough for ibverbs-utils' `ibv_devices`, `ibv_devinfo`,
//!   `ibv_rc_pingpong`, `ibv_srq_pingpong` and perftest's RC tests.
//! * [`qp_ex`]: the extended QP's `ibv_wr_*` work-request API (`ibv_qp_to_qp_ex` and the
//!   function pointers of `struct ibv_qp_ex`, the C part of every QP's handle container;
//!   each call recovers its QP from the pointer without a lock).
//! * [`xrc`]: XRC domains, XRC SRQs, `ibv_create_qp_ex` and `ibv_open_qp` through the
//!   `verbs_context` slots the header inlines call.
//! * [`unsupported`]: every other function rdma-core 44 exports, failing cleanly, so that
//!   every program linked against rdma-core loads.
//! * [`marshall`]: the kernel-ABI marshalling helpers (`ibv_copy_*_from_kern`,
//!   `ibv_copy_path_rec_to_kern`) that librdmacm binds, with `#[repr(C)]` mirrors of the
//!   kernel structs they convert (layouts checked by `tests/marshall.rs`).
//! * [`rdmacm`]: librdmacm's API over `uroce-rdmacm`, exported as `uroce_rdmacm_<name>`
//!   for uroce's `librdmacm.so.1` (`crates/ffi-rdmacm`), which forwards to it.
//! * [`cq_ex`]: extended CQs (`ibv_create_cq_ex`, `ibv_start_poll` and the
//!   `ibv_wc_read_*` accessors).
//! * [`parent_domain`]: thread and parent domains (`ibv_alloc_td`,
//!   `ibv_alloc_parent_domain`) and `ibv_query_rt_values_ex`.
//! * `handle`: the `#[repr(C)]` containers of QPs, CQs, SRQs and AHs, recovered from the
//!   pointer on the data path without a lock (see `docs/ARCHITECTURE.md`, "The C object
//!   model").
//! * [`device`]: the process-wide registry of the device and open contexts.
//! * [`import`]: shared contexts (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`
//!   and their `ibv_unimport_*`) within the process, by the context's device file.
//! * [`sysfs`]: `ibv_get_sysfs_path`, the device's sysfs paths and net device, as `uroce
//!   run` presents them.
//! * [`objects`]: the registry of the objects handed out, and the conversions between the
//!   C work requests/completions/attributes and uroce-verbs' types.
//!
//! This is the one crate of uroce where `unsafe` is expected: the exported functions
//! dereference pointers handed over by C callers. Every such block carries a `// SAFETY:`
//! comment; the crates below it stay safe Rust.

pub mod abi;
pub mod ah_wc;
pub mod async_events;
pub mod cq_ex;
pub mod cq_resize;
pub mod device;
pub mod device_ex;
mod entry;
pub mod exports;
pub(crate) mod handle;
pub mod import;
pub mod marshall;
pub mod mcast;
pub mod mr_rereg;
pub mod mw;
pub mod objects;
pub mod parent_domain;
pub mod qp_ex;
pub mod rdmacm;
pub mod sysfs;
pub mod unsupported;
pub mod utility;
pub mod verbs_api;
pub mod xrc;
