//! # uroce-sim: a deterministic simulated network for uroce's engines
//!
//! Test infrastructure, after smoltcp's `netsim` test and quinn's `Pair`: engines run in
//! one process, packets travel as real sealed RoCEv2 IP datagrams through a link model
//! driven by a seeded RNG, and time is virtual (nothing sleeps; a 67 ms retransmission
//! timeout costs nothing). A run is a pure function of its seed, so a failing seed can be
//! replayed exactly.
//!
//! * [`memory`]: [`memory::TestMemory`], a `uroce_proto::memory::Memory` over
//!   registered regions, with key/bounds/permission checks (proto's test memory,
//!   `uroce_proto::testing`, re-exported).
//! * [`net`]: [`net::SimNet`], nodes (IPv4 or IPv6), QPs (any
//!   `uroce_proto::engine::Engine`, routed per packet by its destination address), links
//!   with loss / duplication / reordering / bit corruption / delay, packet filters, virtual
//!   time.
//! * [`trace`]: the packet trace printed when a test fails.
//! * [`rc`]: [`rc::Pair`], two connected RC QPs (`uroce_proto::rc::RcQp`) with
//!   helpers to post work and wait for completions.
#![forbid(unsafe_code)]

pub mod memory;
pub mod net;
pub mod rc;
pub mod trace;

#[cfg(test)]
mod fake;

pub use memory::{Access, RegionHandle, TestMemory};
pub use net::{LinkConfig, NodeEnv, QpId, SimError, SimNet, SimXrc, Stats, Verdict};
