//! The test memory: `uroce_proto::testing`'s [`TestMemory`] and its helper types,
//! re-exported so that the simulator's users import everything from one crate.
//!
//! It lives in proto (behind proto's `testing` feature, which this crate enables) so that
//! proto's own unit tests run on the same memory as the simulator.

pub use uroce_proto::testing::{
    Access, MemoryStats, RegionHandle, TestMemory, TestMemoryError, PAGE,
};
