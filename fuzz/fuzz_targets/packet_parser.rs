//! `cargo fuzz run packet_parser`: see `uroce_fuzzing::packet_parser` for what it drives and the invariants
//! it asserts, and docs/FUZZING.md for how to run it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uroce_fuzzing::packet_parser(data));
