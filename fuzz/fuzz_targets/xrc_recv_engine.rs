//! `cargo fuzz run xrc_recv_engine`: see `uroce_fuzzing::xrc_recv_engine` for what it drives and the invariants
//! it asserts, and docs/FUZZING.md for how to run it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uroce_fuzzing::xrc_recv_engine(data));
