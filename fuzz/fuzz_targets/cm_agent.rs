//! `cargo fuzz run cm_agent`: see `uroce_fuzzing::cm_agent` for what it drives and the invariants
//! it asserts, and docs/FUZZING.md for how to run it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uroce_fuzzing::cm_agent(data));
