//! The C structs, enums and constants uroce mirrors, one file per header: `verbs`
//! (`<infiniband/verbs.h>`, re-exported here as `crate::abi::*`) and `rdmacm`
//! (`<rdma/rdma_cma.h>`, re-exported by `crate::rdmacm`). `tests/layout.rs` checks both
//! against the installed headers.

pub mod rdmacm;
mod verbs;

pub use verbs::*;
