//! Every forwarder has its target's ABI: a `forward!(unwind …)` here exactly where
//! uroce-ffi defines `uroce_rdmacm_<name>` as `extern "C-unwind"`, `extern "C"` elsewhere
//! (a forwarder calls its target through a function pointer of its own ABI; calling an
//! `extern "C"` function as `"C-unwind"` is undefined behaviour).

use std::collections::BTreeSet;

fn read(path: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn forwarders_and_targets_agree_on_unwinding() {
    // The targets: every file of uroce-ffi's rdmacm module tree.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ffi/src/rdmacm");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    assert!(
        files.len() > 1,
        "no rdmacm module files in {}",
        dir.display()
    );
    let targets: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())))
        .collect::<Vec<_>>()
        .join("\n");
    let mut target_abi = std::collections::BTreeMap::new();
    for line in targets.lines() {
        let Some(at) = line.find("fn uroce_rdmacm_") else {
            continue;
        };
        let name: String = line[at + "fn uroce_rdmacm_".len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        target_abi.insert(name, line.contains("extern \"C-unwind\""));
    }
    let forwarders = read("src/lib.rs");
    let (mut unwind, mut plain) = (BTreeSet::new(), BTreeSet::new());
    for line in forwarders.lines().map(str::trim) {
        let Some(rest) = line
            .strip_prefix("forward!(")
            .filter(|r| !r.starts_with("@abi"))
        else {
            continue;
        };
        let (set, rest) = match rest.strip_prefix("unwind ") {
            Some(r) => (&mut unwind, r),
            None => (&mut plain, rest),
        };
        set.insert(rest.split(',').next().unwrap_or_default().to_owned());
    }
    assert!(!plain.is_empty() && !unwind.is_empty());
    for name in plain.iter().chain(&unwind) {
        let is_unwind = *target_abi
            .get(name)
            .unwrap_or_else(|| panic!("no uroce_rdmacm_{name} in uroce-ffi"));
        assert_eq!(
            is_unwind,
            unwind.contains(name),
            "{name}: the target is {} but its forwarder is not marked so",
            if is_unwind { "C-unwind" } else { "C" }
        );
    }
}
