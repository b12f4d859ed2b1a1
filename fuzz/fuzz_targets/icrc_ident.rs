//! `cargo fuzz run icrc_ident`: see `uroce_fuzzing::icrc_ident` for what it drives and the invariants
//! it asserts, and docs/FUZZING.md for how to run it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uroce_fuzzing::icrc_ident(data));
