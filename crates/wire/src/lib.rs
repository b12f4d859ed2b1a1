//! # uroce-wire: the RoCEv2 packet layer
//!
//! The lowest layer of uroce. It knows how RoCEv2 packets look on the wire and nothing
//! else: no queue pairs, no sockets, no clocks, no threads, and no `unsafe`.
//!
//! Layering (see `docs/ARCHITECTURE.md`): `wire` → `proto` → `verbs` → `net` → `ffi`/`cli`.
//! This crate depends on no other uroce crate; every other uroce crate may depend on it.
//!
//! ## Two levels, after smoltcp
//! * **Views** (`bth::Header<T>`, `reth::Header<T>`, …): typed accessors over a byte buffer
//!   `T: AsRef<[u8]>` (setters where `T: AsMut<[u8]>`). `new_checked` validates the length
//!   once; after that no accessor panics. `new_unchecked` is for the emit path only.
//! * **Reprs** (`bth::Repr`, …, and [`packet::PacketRepr`]): validated high-level values with
//!   `parse`, `emit` and `buffer_len`. Anything that can be constructed can be emitted, and
//!   `parse(emit(x)) == x`.
//!
//! ## No panics on input
//! Every parse path returns a [`WireError`] saying what was wrong and where; arbitrary
//! byte strings never panic (property-tested, and fuzzed by the targets in `fuzz/`).
#![forbid(unsafe_code)]

pub mod error;
pub mod opcode;
pub mod pmtu;
pub mod psn;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod deth;
pub mod feth;
pub mod ieth;
pub mod immdt;
pub mod mad;
pub mod reth;
pub mod xrceth;

pub mod packet;

pub mod grh_area;
pub mod icrc;
pub mod icrc_ident;
pub mod ip;
pub mod pcap;

pub use error::{HeaderKind, WireError};
pub use opcode::{OpcodeInfo, Transport};
pub use packet::PacketRepr;
pub use pmtu::Pmtu;
pub use psn::Psn;

/// The UDP destination port of RoCEv2 (IANA "roce").
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Length of the invariant CRC that ends every RoCEv2 packet.
pub const ICRC_LEN: usize = 4;
