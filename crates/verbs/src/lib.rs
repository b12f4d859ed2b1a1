//! # uroce-verbs: the verbs object layer
//!
//! The third layer of uroce (`wire` → `proto` → **`verbs`** → `net` → `ffi`/`cli`): what an
//! application holds — devices, contexts, protection domains, memory regions, completion
//! queues and channels, queue pairs, shared receive queues, XRC domains, address handles —
//! and what the transport engine acts on. It depends on `uroce-wire` (PMTU and PSN types)
//! and `uroce-proto` (the QP state table), never on anything above it, and does no
//! network I/O: the only system calls are `eventfd(2)`/`poll(2)` behind the pollable
//! queues. `unsafe` code exists only in [`mem`], where registered memory is touched by
//! address.
//!
//! ## Object model
//!
//! | object | created by | parents it keeps alive | named by |
//! |---|---|---|---|
//! | [`Device`] | [`Device::new`] | – | name (`uroce0`) |
//! | [`Context`] | [`Context::open`] | device | – |
//! | [`Pd`] | [`Context::alloc_pd`] | context | id |
//! | [`Mr`] | [`Pd::reg_mr`] | PD | L_Key / R_Key (MR table) |
//! | [`CompChannel`] | [`Context::create_comp_channel`] | context | id, fd |
//! | [`Cq`] | [`Context::create_cq`] | context, channel | id |
//! | [`Qp`] | [`Pd::create_qp`], [`Xrcd::create_qp`] | PD, CQs, SRQ, XRC domain | QPN (QP table) |
//! | [`Srq`] | [`Pd::create_srq`], [`Xrcd::create_srq`] | PD (+ XRC domain, CQ) | SRQN (SRQ table) |
//! | [`Xrcd`] | [`Context::alloc_xrcd`] | context | id |
//! | [`Ah`] | [`Pd::create_ah`] | PD | – |
//!
//! All QP types are representable ([`QpType`]: RC, UC, UD, GSI, XRC_SEND, XRC_RECV; SMI
//! and RAW_PACKET are refused at creation). The device has one Ethernet port, ACTIVE, whose
//! GID 0 is the RoCEv2 GID of its address (see [`device`]).
//!
//! ## Handles
//!
//! Every object has a **unique owner handle** (`Pd`, `Cq`, `Qp`, …, not `Clone`) and its
//! state lives in an `Arc`. Children hold `Arc`s to their parents, so memory is never freed
//! under a child, and parents count their live children.
//!
//! * `destroy(self) -> Result<(), (Self, DestroyError)>` is the verbs destroy: it fails with
//!   [`DestroyError::Busy`] while children exist (PD with MRs/QPs/SRQs/AHs, CQ with QPs or
//!   XRC SRQs, SRQ with QPs, XRC domain with XRC SRQs/QPs, channel with CQs, context with
//!   PDs/CQs/channels/domains), and hands the handle back unchanged.
//! * Dropping a handle releases too ("release by drop"); a parent dropped before its
//!   children lives on, invisible, until its last child is released.
//! * Objects that events or the transport name (QP, CQ, SRQ, MR) also have a **counted
//!   reference** type ([`QpRef`], [`CqRef`], [`SrqRef`], [`MrRef`]) that the handle
//!   dereferences to; it carries every operation but destroy.
//!
//! *Why unique handles rather than cloneable ones:* with clones, "destroy" would have to
//! either wait for every other clone (a thread holding a clone while destroying deadlocks)
//! or ignore them (then `Busy` means nothing). A unique owner, like the C pointer, makes
//! exactly one party able to destroy, while the `*Ref` types cover sharing. Applications that
//! need to share a handle wrap it in an `Arc` (all handles are `Send + Sync`).
//!
//! ## Lifetime rules: the reference / unpublish protocol
//!
//! Objects the network or events can name live in [`table::Table`]s (QPN, SRQN, memory-key
//! index). The rules, which [`table`] implements and `tests/loom_table.rs` model-checks:
//!
//! 1. **A lookup returns a counted reference taken under the table's lock**
//!    ([`Context::qp_for_packet`], [`Context::srq_for_packet`], [`Context::mr_for_key`]).
//!    A miss is dropped and counted ([`Counters::unknown_qpn_drops`]).
//! 2. **Destroy first unpublishes**: the object's published flag is cleared and its table
//!    entry retired, so no lookup can succeed and no event can be queued for it. The number
//!    stays reserved.
//! 3. **Queued events are purged**: undelivered events for the object are removed from the
//!    context's queue (and CQ notifications from the channel). Raisers check the published
//!    flag under the queue's lock, and the purge takes that lock after the flag was
//!    cleared, so a concurrent raise is either purged or refused.
//! 4. **Wait** until only the handle's own reference remains: in-flight users (packet
//!    processing, event dispatch) and delivered-but-unacknowledged events — as
//!    `ibv_destroy_qp` waits for `ibv_ack_async_event`. Internal users never block while
//!    holding a reference, so the wait is bounded by their work; it is also bounded by the
//!    context's destroy timeout ([`Context::set_destroy_timeout`], default 5 s), after which
//!    destroy fails with [`DestroyError::InUse`] and returns the (still unpublished)
//!    handle, so a reference the application forgets never hangs destroy.
//! 5. **Release**: the handle's reference is then the last one; dropping it runs the
//!    object's destructor on the destroying thread, exactly once, which frees the number and
//!    decrements the parents' child counts.
//!
//! Consequences: an event handler never runs on a destroyed object (an event holds a
//! reference), no event for an object is delivered after its destroy returned, and QP
//! numbers are allocated by a cursor that moves forward through `16..=0xFFFFFF`, wraps, and
//! skips numbers in use — a destroyed QP's number is not reused until the space wraps, so a
//! late packet or event for an old QP never reaches a new one.
//!
//! Memory regions deviate in one point: if references are still held at the timeout, the
//! region's memory is *retired* ([`mem::MemBlock::retire`]) so `destroy` can still succeed
//! and raw memory may be freed at once; see [`region`].
//!
//! ## Soundness of memory access
//!
//! Registered memory may be written by the network at any time, so uroce never hands out a
//! plain slice of it while remote access is possible; every access is a word-sized atomic
//! behind a ticket gate. The argument is in [`mem`]; [`mr`] adds the key, PD, bounds and
//! permission checks.
//!
//! ## Queues and events
//!
//! * [`Cq`]: fixed capacity; overflow stores nothing, marks the CQ in error and raises
//!   `CQ_ERR` once ([`cq`]). Polling never fails, so there is no poll error type.
//! * [`CompChannel`]: pollable fd; one-shot arming for next / solicited completions;
//!   [`CompChannel::shutdown`] cancels blocked waits.
//! * Async events ([`event`]): `QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`, `COMM_EST`,
//!   `SQ_DRAINED`, `QP_LAST_WQE_REACHED`, `SRQ_LIMIT_REACHED`, `SRQ_ERR`, `CQ_ERR`,
//!   `PORT_ACTIVE`, `PORT_ERR`, `DEVICE_FATAL`, … on the context's queue with a pollable
//!   fd ([`Context::async_fd`]), each acknowledged by the application.
//! * QPs ([`qp`]): the IBTA modify table from `uroce_proto::qp_state` plus device value
//!   checks, atomic application (unchanged on error, the error names the attribute),
//!   flush to `WR_FLUSH_ERR` on ERR, SQD drain with `SQ_DRAINED`; the queues themselves
//!   are the QP's protocol engine's (one path, see [`qp`]).
//!
//! ## Deviations and choices
//!
//! * `SQ_DRAINED` is raised whether or not `en_sqd_async_notify` was set (the Linux software
//!   driver does the same, docs/INTEROP-NOTES.md §7).
//! * `ALT_PATH` is refused: RoCE has no alternate paths.
//! * [`CqRef::req_notify`] on a CQ without channel is an error rather than a silent no-op.
//! * `IBV_SEND_INLINE` takes its payload from [`SendWr::inline_data`] (copied at post time),
//!   not from raw SGE addresses.
//! * XRC_RECV QPs are owned by their domain once their handle is dropped ([`xrcd`]);
//!   sharing domains across processes is later work.
//!
//! ## Checks (tests)
//!
//! `tests/qp_modify.rs` (modify on real QPs through the proto table, unchanged after
//! rejection, query returns what was set), `tests/mr_checks.rs`, `tests/regions.rs`,
//! `tests/flush.rs` (N ∈ {0, 1, 7, 64} WRs → exactly N `WR_FLUSH_ERR` in order, SRQ →
//! `LAST_WQE_REACHED`), `tests/cq.rs`, `tests/cq_resize.rs`, `tests/mr_rereg.rs`,
//! `tests/reset_cleans_cq.rs`, `tests/srq.rs`, `tests/events.rs`, `tests/objects.rs`,
//! `tests/stress.rs` (concurrent create / raise / destroy: no event after destroy, nothing
//! leaked), `tests/qpn_reuse.rs` (no QPN reuse before the wrap), and the loom model
//! `tests/loom_table.rs`:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p uroce-verbs --test loom_table
//! ```
//!
//! (exhaustive, about 25 s; `LOOM_MAX_PREEMPTIONS=3` bounds it to under a second).
#![deny(unsafe_code)]

pub mod ah;
pub mod binding;
pub mod connect;
pub mod context;
pub mod cq;
pub mod device;
pub mod engine;
pub mod error;
pub mod event;
#[cfg(feature = "loopback")]
pub mod loopback;
pub mod mcast;
// `unsafe` is allowed here only: registered memory is touched by address.
#[allow(unsafe_code)]
pub mod mem;
pub mod mr;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod region;
pub mod srq;
mod sync;
pub mod table;
pub mod wc;
pub mod xrcd;

pub use ah::{Ah, AhAttr, AhRef};
pub use binding::{BindError, BindingOwner};
pub use connect::{rc_init_attr, uc_init_attr, RcConnect, UcConnect, UdActivate};
pub use context::{Context, Counters, LiveObjects};
pub use cq::{Clocks, CompChannel, CompletionStamp, Cq, CqEvent, CqRef};
pub use device::{Device, DeviceAttr, DeviceConfig, Gid, PortAttr, PortState};
pub use engine::{
    engine_supported, Arrival, EngineCounters, Handled, QpMemory, Transmitted, Transport, TxPacket,
};
pub use error::*;
pub use event::{AsyncEvent, ElementKind, EventElement, EventType};
pub use mem::MemBlock;
pub use mr::AccessFlags;
pub use mw::{BindMwWr, Mw, MwBindInfo, MwType};
pub use pd::Pd;
pub use qp::{
    AtomicInfo, InlineData, PathMigState, Qp, QpAttr, QpCap, QpInitAttr, QpInitInfo, QpRef,
    RdmaInfo, RecvWr, SendFlags, SendOpcode, SendWr, SgList, Sge, UdDest,
};
pub use region::{Mr, MrRef, ReregMrError};
pub use srq::{Srq, SrqAttr, SrqAttrMask, SrqInitAttr, SrqRef};
pub use uroce_proto::engine::Reply;
pub use uroce_proto::qp_state::{AttrMask, QpState, QpType};
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use xrcd::Xrcd;
