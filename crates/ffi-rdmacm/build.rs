//! Links the cdylib as `librdmacm.so.1`: SONAME and the symbol version nodes of rdma-core
//! 44's librdmacm (`librdmacm.map`; the versioned names are attached with `.symver` in
//! `src/lib.rs`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_owned());
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rerun-if-changed=librdmacm.map");
    println!("cargo:rerun-if-changed=build.rs");
}
