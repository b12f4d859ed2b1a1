//! Test kit shared by proto's own unit tests and by `uroce-sim`: memories that implement
//! [`Memory`](crate::memory::Memory) without a verbs layer, and a shared receive queue.
//!
//! Compiled for proto's tests (`cfg(test)`) and, for other crates' tests, behind the
//! `testing` cargo feature, which only test infrastructure enables (`uroce-sim`); the
//! libraries that ship (`uroce-verbs`, `uroce-net`, the C libraries) never turn it on.
//! One crate owns these types so that the engines under test and the memory they run on
//! come from the same copy of proto: a dev-dependency of proto on `uroce-sim` would build a
//! second copy whose `Memory` is another trait.
//!
//! * [`TestMemory`]: regions over byte vectors with every check the trait documents
//!   (key, state, permission, bounds, alignment), memory-window binding, and counts of
//!   remote operations.
//! * [`PatternMemory`]: a memory without storage for multi-gigabyte transfers.
//! * [`TestSrq`]: a shared receive queue over a deque.

mod memory;
mod pattern;
mod srq;

pub use memory::{Access, MemoryStats, RegionHandle, TestMemory, TestMemoryError, PAGE};
pub use pattern::{pattern_byte, PatternMemory};
pub use srq::TestSrq;
