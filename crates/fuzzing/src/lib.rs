//! The fuzz targets of uroce as plain functions of the input bytes, with their invariants
//! asserted inside (a failed invariant panics, which a fuzzer reports as a crash).
//!
//! `fuzz/fuzz_targets/<name>.rs` hands libFuzzer's input to the function of that name
//! (`cargo fuzz run <name>`, see `docs/FUZZING.md`); `tests/smoke.rs` runs every target over
//! the seed corpus in `fuzz/seeds/<name>/` and a time-bounded stream of mutated inputs, in
//! the test command. The targets:
//!
//! | target | what it drives | invariants beyond "no panic" |
//! |---|---|---|
//! | [`packet_parser`] | `PacketRepr::parse`, emit, re-parse | what parses emits to bytes that parse to the same packet |
//! | [`rc_engine`], [`uc_engine`], [`ud_engine`], [`gsi_engine`], [`xrc_send_engine`], [`xrc_recv_engine`] | one QP of that transport ([`engines`]) | see below |
//! | [`cm_mad`] | `CmMad::parse`, emit | what parses re-emits to bytes that parse to the same MAD |
//! | [`cm_agent`] | a CM agent with a listener, fed MADs, timers and commands | every MAD it sends parses; its connections stay within its limit |
//! | [`rdma_cm_private_data`] | the RDMA-CM address header of REQ private data | what parses re-emits identically |
//! | [`icrc_ident`] | the ICRC Identification solver | an Identification it finds makes the ICRC check pass |
//! | [`gro_split`] | how a received (GRO-coalesced, possibly cut) datagram is split into packets | pieces contiguous, within the datagram, all segments but the last of the segment size |
//!
//! The engine targets ([`engines::drive`]) read a small command language: hand a packet
//! (arbitrary bytes, optionally patched with the QP's number, an expected PSN, the Q_Key)
//! to the engine from its peer or from a stranger, let time pass, drain transmissions,
//! post send and receive WRs, change state. After every command: each packet the engine
//! writes parses, is at most the buffer and goes to the peer; each completion names a WR
//! that was posted to that queue and completes it once; counters are consistent
//! (`dropped_packets <= packets_received`). At the end a region the QP may not write
//! (registered for remote READ only) is unchanged: memory is touched only inside
//! registered regions with the rights the access needs (the test memory refuses any other
//! access itself).

#![forbid(unsafe_code)]

pub mod cm;
pub mod engines;
pub mod input;
pub mod parsers;

pub use cm::{cm_agent, cm_mad, rdma_cm_private_data};
pub use engines::{gsi_engine, rc_engine, uc_engine, ud_engine, xrc_recv_engine, xrc_send_engine};
pub use parsers::{gro_split, icrc_ident, packet_parser};

/// A fuzz target: a function of the input bytes.
pub type Target = fn(&[u8]);

/// Every target, by name: what the smoke test and the seed generator iterate over.
pub const TARGETS: &[(&str, Target)] = &[
    ("packet_parser", packet_parser),
    ("rc_engine", rc_engine),
    ("uc_engine", uc_engine),
    ("ud_engine", ud_engine),
    ("gsi_engine", gsi_engine),
    ("xrc_send_engine", xrc_send_engine),
    ("xrc_recv_engine", xrc_recv_engine),
    ("cm_mad", cm_mad),
    ("cm_agent", cm_agent),
    ("rdma_cm_private_data", rdma_cm_private_data),
    ("icrc_ident", icrc_ident),
    ("gro_split", gro_split),
];
