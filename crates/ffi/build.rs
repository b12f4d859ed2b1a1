//! Links the cdylib as `libibverbs.so.1`: SONAME and the symbol version nodes of
//! rdma-core 44 (`libibverbs.map`; the versioned names themselves are attached with
//! `.symver` next to each exported function, by the `symver!` macro of `src/entry.rs`;
//! docs/ARCHITECTURE.md, "ffi", says why).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!("cargo:rerun-if-changed=build.rs");
}
