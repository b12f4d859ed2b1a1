//! uroce's C ABI: the layer that will let unmodified programs built against rdma-core 44's
//! `<infiniband/verbs.h>` (Debian 12: ibverbs-utils, perftest, rdmacm-utils) run on uroce,
//! as a drop-in `libibverbs.so.1` on top of uroce-net and uroce-verbs.
//!
//! For now this crate only defines the types ([`abi`]): `#[repr(C)]` mirrors of the
//! structs, unions and enum constants those programs use, with layouts proven identical to
//! the installed header on x86_64 by `tests/layout.rs` (which compiles a C program against
//! `<infiniband/verbs.h>` and compares every `sizeof`/`offsetof`). No symbol is exported yet.
//!
//! This is the one crate of uroce where `unsafe` is expected: the exported functions will
//! dereference pointers handed over by C callers. Every such block carries a `// SAFETY:`
//! comment; the crates below it stay safe Rust.

pub mod abi;
