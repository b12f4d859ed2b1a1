//! `cargo fuzz run ud_engine`: see `uroce_fuzzing::ud_engine` for what it drives and the invariants
//! it asserts, and docs/FUZZING.md for how to run it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uroce_fuzzing::ud_engine(data));
