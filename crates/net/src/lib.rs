//! # uroce-net: the network device
//!
//! The device runtime of uroce: a [`NetDevice`] binds the verbs objects of one context to a
//! RoCEv2 socket of `uroce-socket` and drives the QPs' transport engines through the verbs
//! layer: it delivers each received packet to the QP its BTH names with the packet's
//! source address, runs the engines' timers, sends each transmitted packet to the
//! destination the engine gave it, serves QP1 ([`gsi`]) and the connection manager
//! ([`cm`]), joins multicast groups and publishes its counters ([`stats`]).
//!
//! ## Layering
//! `wire` → `proto` → `verbs` → `socket` → **`net`** → `ffi` / `cli` (see
//! `docs/ARCHITECTURE.md`). The socket layer's modules and types are re-exported here
//! (`uroce_net::socket`, `uroce_net::RoceSocket`, …) for the crates above. `[M3 3/5]`
//! rebuilds this crate (one device per host); the socket layer stays.
//!
//! No `unsafe` here: the system calls are the socket layer's.
#![forbid(unsafe_code)]

pub mod cm;
pub mod device;
mod error;
pub mod gsi;
pub mod stats;
pub mod xrc;

pub use cm::{CmCounters, CmEventSink, CmService};
pub use device::{
    DeviceCounters, NetConfig, NetDevice, QpCounters, ADDR_ENV, DEFAULT_ADDR, SHARED_ENV,
    XRC_SRQ_SLOTS_ENV,
};
pub use error::NetError;
pub use gsi::{Gsi, GsiCounters, GsiError, ReceivedMad};
// The socket layer, under the paths the crates above have always used.
pub use uroce_socket::{
    capture, counters, faults, ifaddr, mcast, seal_for, socket, verify_icrc, verify_icrc_with,
    BufferSizes, Capture, CounterSnapshot, Counters, FaultConfig, FaultInjector, FaultParseError,
    IcrcCheck, IcrcPolicy, Ipv4Ident, OutPacket, Received, RecvBatch, RecvDatagram, RecvStatus,
    RoceSocket, SocketConfig, SocketError, BATCH_MAX, DEFAULT_BUFFER_BYTES, ICRC_ENV,
};
