//! # uroce-proto: sans-IO protocol state machines
//!
//! The second layer of uroce (`wire` → **`proto`** → `verbs` → `net` → `ffi`/`cli`).
//! Everything here is a pure state machine: inputs (attributes, packets, the current time)
//! go in as values and decisions come out as values. No sockets, no clocks, no threads,
//! no `unsafe`. It may depend on `uroce-wire` and on nothing higher.
//!
//! It holds the IBTA queue-pair state machine ([`qp_state`]) as declarative data and the
//! RC transport engine ([`rc`]: requester, completer and responder of one reliable-connected
//! QP as a sans-IO state machine) and the UD engine ([`ud`]: one UD or GSI QP), both behind
//! the transport-engine interface [`engine::Engine`]. The communication manager
//! ([`cm`]: the CM state table and a sans-IO CM agent per port) lives here too.
//!
//! With the `testing` feature (test infrastructure only), `testing` holds the memories the
//! engines' tests run on, shared by proto's own tests and `uroce-sim`.
#![forbid(unsafe_code)]

mod build;
pub mod cm;
pub mod counters;
pub mod engine;
pub mod memory;
pub mod qp_state;
pub mod rc;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod time;
pub mod uc;
pub mod ud;
pub mod wc;
pub mod wr;
