//! Work completions: what [`crate::CqRef::poll`] returns.
//!
//! The types live in the protocol layer, which produces them ([`uroce_proto::wc`]); the
//! verbs layer re-exports them so that applications need only this crate. The numeric
//! values are the verbs ABI's: `enum ibv_wc_status`, `enum ibv_wc_opcode` and the
//! `wc_flags` bits (`<infiniband/verbs.h>`).

pub use uroce_proto::wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
