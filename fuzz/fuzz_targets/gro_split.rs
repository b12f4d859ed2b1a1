//! `cargo fuzz run gro_split`: see `uroce_fuzzing::gro_split` for what it drives and the invariants
//! it asserts, and docs/FUZZING.md for how to run it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uroce_fuzzing::gro_split(data));
