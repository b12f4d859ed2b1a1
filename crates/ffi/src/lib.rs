//! uroce's C ABI: the layer that lets unmodified programs built against rdma-core 44's
//! `<infiniband/verbs.h>` (Debian 12: ibverbs-utils, perftest, rdmacm-utils) run on uroce,
//! as a drop-in `libibverbs.so.1` on top of uroce-net and uroce-verbs.
//!
//! The library is laid out by object. Each
//! exported function is a thin `extern "C"` wrapper (panic guard, C return convention,
//! `errno`) around an internal function that the other modules, `rdmacm` among them, call
//! instead of the exported symbol.
//!
//! * [`abi`]: `#[repr(C)]` mirrors of the structs, unions and enum constants of
//!   `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`, with layouts proven identical to the
//!   installed headers on x86_64 by `tests/layout.rs` (which compiles a C program against
//!   them and compares every `sizeof`/`offsetof`).
//! * `entry` (what every exported function shares: `errno`, the panic guard, the return
//!   conventions, `.symver`) and [`error`] ([`error::FfiError`], one `errno` value each).
//! * Devices and contexts: [`device`] (the registry of the device and the open contexts,
//!   device and port attributes), [`context`] (the device list, `ibv_open_device`,
//!   `ibv_close_device`, the queries), [`device_ex`] (`ibv_query_device_ex`), [`sysfs`]
//!   (`ibv_get_sysfs_path` and the device's sysfs paths), [`import`] (shared contexts:
//!   `ibv_import_device`, `ibv_import_pd`, `ibv_import_mr`), [`async_events`]
//!   (`ibv_get_async_event`, routed to the context that made the object).
//! * `table`: the function table of a context (the `ibv_context.ops` and `verbs_context`
//!   slots the header inlines call), pointing into the object modules below.
//! * [`objects`]: the control-path registry of the verbs objects handed out; [`convert`]:
//!   the conversions between the C work requests/completions/attributes and uroce-verbs'
//!   types; `handle`: the `#[repr(C)]` containers of QPs, CQs, SRQs and AHs, recovered
//!   from the pointer on the data path without a lock (see `docs/ARCHITECTURE.md`, "The C
//!   object model").
//! * One module per object: [`pd`] (protection domains), [`parent_domain`] (thread and
//!   parent domains, `ibv_query_rt_values_ex`), [`mr`] (`ibv_reg_mr`, `ibv_dereg_mr`;
//!   [`mr::rereg`]: `ibv_rereg_mr` and the other registrations), [`mw`] (memory
//!   windows), [`cq`] (completion channels, CQs, CQ events, `poll_cq`; [`cq::ex`]:
//!   extended CQs; [`cq::resize`]), [`srq`] (shared receive queues), [`qp`] (create,
//!   modify, query, destroy, `ibv_create_qp_ex`; [`qp::post`]: the posting slots; [`qp::ex`]: the `ibv_wr_*`
//!   API of `struct ibv_qp_ex`; [`qp::mcast`]: multicast attach/detach), [`ah`] (address
//!   handles; [`ah::wc`]: `ibv_init_ah_from_wc`), [`xrc`] (XRC domains, XRC SRQs,
//!   XRC target QPs, `ibv_open_qp`).
//! * [`utility`]: helpers that need no object (strings, rates, provider registration
//!   no-ops); [`marshall`]: the kernel-ABI marshalling helpers (`ibv_copy_*_from_kern`,
//!   `ibv_copy_path_rec_to_kern`) that librdmacm binds, layouts checked by
//!   `tests/marshall.rs`; [`unsupported`]: every other function rdma-core 44 exports,
//!   failing cleanly, so that every program linked against rdma-core loads.
//! * [`rdmacm`]: librdmacm's API over `uroce-rdmacm`, exported as `uroce_rdmacm_<name>`
//!   for uroce's `librdmacm.so.1` (`crates/ffi-rdmacm`), which forwards to it.
//!
//! The cdylib (`liburoce_ffi.so`, SONAME `libibverbs.so.1`, rdma-core 44's symbol
//! versions) is loaded by unmodified programs in place of the real library
//! (`LD_LIBRARY_PATH`): enough for ibverbs-utils, perftest, rdmacm-utils and pyverbs.
//!
//! This is the one crate of uroce where `unsafe` is expected: the exported functions
//! dereference pointers handed over by C callers. Every such block carries a `// SAFETY:`
//! comment; the crates below it stay safe Rust.

pub mod abi;
pub mod ah;
pub mod async_events;
pub mod context;
pub mod convert;
pub mod cq;
pub mod device;
pub mod device_ex;
mod entry;
pub mod error;
pub(crate) mod handle;
pub mod import;
pub mod marshall;
pub mod mr;
pub mod mw;
pub mod objects;
pub mod parent_domain;
pub mod pd;
pub mod qp;
pub mod rdmacm;
pub mod srq;
pub mod sysfs;
mod table;
pub mod unsupported;
pub mod utility;
pub mod xrc;
