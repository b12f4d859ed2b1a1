//! `cargo fuzz run rdma_cm_private_data`: see `uroce_fuzzing::rdma_cm_private_data` for what it drives and the invariants
//! it asserts, and docs/FUZZING.md for how to run it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uroce_fuzzing::rdma_cm_private_data(data));
