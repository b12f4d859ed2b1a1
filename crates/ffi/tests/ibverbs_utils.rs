//! The unmodified Debian programs `ibv_devices` and `ibv_devinfo -v` (package
//! ibverbs-utils) run against uroce's cdylib presented as `libibverbs.so.1` through
//! `LD_LIBRARY_PATH`, and list the device, its port and GID 0. The library's symbol table
//! is checked with `readelf` (binutils).
//!
//! Expectations are derived from outside the library: the GID is the IPv4-mapped IPv6
//! form of the address (RFC 4291 §2.5.5.2, as RoCEv2 uses it), and the node GUID is the
//! modified EUI-64 of the pseudo-MAC `02:00:a:b:c:d` (the rule documented for uroce
//! devices), computed here by hand. Without `/usr/bin/ibv_devinfo` the test is skipped,
//! or fails under `UROCE_REQUIRE_TOOLS=1`.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

use support::{built_library, LibDir};
use uroce_testkit::{run, skip};

/// A loopback address no other test uses, so that the device's UDP port is free.
const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 6, 1);
const LIMIT: Duration = Duration::from_secs(30);

/// Runs a Debian binary against the library; returns stdout, panicking on failure.
fn run_tool(dir: &LibDir, program: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", &dir.0)
        .env("UROCE_ADDR", ADDR.to_string())
        .env_remove("UROCE_FAULTS");
    let start = Instant::now();
    let out = run(cmd, LIMIT).unwrap_or_else(|e| panic!("{program}: {e}"));
    eprintln!("{program} {args:?}: {:?}", start.elapsed());
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// The node GUID of the address, as `ibv_devinfo` prints it (`xxxx:xxxx:xxxx:xxxx`), and
/// as `ibv_devices` prints it (16 hex digits).
fn expected_guid(a: Ipv4Addr) -> (String, String) {
    let o = a.octets();
    // Pseudo-MAC 02:00:o0:o1:o2:o3; EUI-64 inserts ff:fe after the third byte and flips the
    // universal/local bit (0x02) of the first.
    let mac = [0x02u8, 0x00, o[0], o[1], o[2], o[3]];
    let eui = [
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    let hex: String = eui.iter().map(|b| format!("{b:02x}")).collect();
    let grouped = [&hex[0..4], &hex[4..8], &hex[8..12], &hex[12..16]].join(":");
    (grouped, hex)
}

/// The value after `key:` on the first line of `text` that has it (tabs and spaces
/// trimmed).
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.trim()
            .strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}

#[test]
fn debian_ibv_devices_and_devinfo_list_uroce0() {
    const TEST: &str = "debian_ibv_devices_and_devinfo_list_uroce0";
    for tool in ["/usr/bin/ibv_devices", "/usr/bin/ibv_devinfo"] {
        if !Path::new(tool).exists() {
            skip(
                TEST,
                &format!("{tool} is missing (install the Debian package ibverbs-utils)"),
            );
            return;
        }
    }
    let dir = LibDir::new("ibverbs");
    let (guid_grouped, guid_hex) = expected_guid(ADDR);
    let mapped = ADDR.to_ipv6_mapped().to_string();
    assert_eq!(
        mapped, "::ffff:127.0.6.1",
        "std formats IPv4-mapped addresses"
    );

    let devices = run_tool(&dir, "/usr/bin/ibv_devices", &[]);
    let row = devices
        .lines()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<_>>)
        .find(|w| w.first() == Some(&"uroce0"))
        .unwrap_or_else(|| panic!("ibv_devices does not list uroce0:\n{devices}"));
    assert_eq!(
        row,
        ["uroce0", guid_hex.as_str()],
        "ibv_devices:\n{devices}"
    );

    let info = run_tool(&dir, "/usr/bin/ibv_devinfo", &["-v"]);
    let ctx = format!("ibv_devinfo -v output:\n{info}");
    assert_eq!(field(&info, "hca_id"), Some("uroce0"), "{ctx}");
    assert_eq!(
        field(&info, "node_guid"),
        Some(guid_grouped.as_str()),
        "{ctx}"
    );
    assert_eq!(
        field(&info, "sys_image_guid"),
        Some(guid_grouped.as_str()),
        "{ctx}"
    );
    assert_eq!(field(&info, "phys_port_cnt"), Some("1"), "{ctx}");
    assert_eq!(field(&info, "port"), Some("1"), "{ctx}");
    assert_eq!(field(&info, "state"), Some("PORT_ACTIVE (4)"), "{ctx}");
    assert_eq!(field(&info, "link_layer"), Some("Ethernet"), "{ctx}");
    // The port MTU derives from the interface's: loopback's 65536 - 80 header bytes
    // leaves room for the largest IB MTU, 4096 (enum value 5).
    assert_eq!(field(&info, "active_mtu"), Some("4096 (5)"), "{ctx}");
    assert_eq!(field(&info, "max_mtu"), Some("4096 (5)"), "{ctx}");
    assert_eq!(field(&info, "phys_state"), Some("LINK_UP (5)"), "{ctx}");
    let gid0 = format!("{mapped}, RoCE v2");
    assert_eq!(field(&info, "GID[  0]"), Some(gid0.as_str()), "{ctx}");
    let gid_lines = info
        .lines()
        .filter(|l| l.trim().starts_with("GID["))
        .count();
    assert_eq!(gid_lines, 1, "only GID 0 is populated; {ctx}");
}

#[test]
fn library_exports_rdma_core_symbol_versions() {
    const TEST: &str = "library_exports_rdma_core_symbol_versions";
    let lib = built_library();
    let mut cmd = Command::new("readelf");
    cmd.args(["--dyn-syms", "-W", "-d"]).arg(&lib);
    let out = match run(cmd, LIMIT) {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!("readelf failed: {}", o.stderr),
        Err(e) => {
            skip(TEST, &format!("readelf (binutils) cannot run: {e}"));
            return;
        }
    };
    assert!(
        out.contains("Library soname: [libibverbs.so.1]"),
        "SONAME missing:\n{out}"
    );
    let defined: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(" FUNC ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    for want in [
        "ibv_get_device_list@@IBVERBS_1.1",
        "ibv_free_device_list@@IBVERBS_1.1",
        "ibv_get_device_name@@IBVERBS_1.1",
        "ibv_get_device_guid@@IBVERBS_1.1",
        "ibv_open_device@@IBVERBS_1.1",
        "ibv_close_device@@IBVERBS_1.1",
        "ibv_query_device@@IBVERBS_1.1",
        "ibv_query_port@@IBVERBS_1.1",
        "ibv_query_gid@@IBVERBS_1.1",
        "ibv_read_sysfs_file@@IBVERBS_1.0",
        "ibv_query_gid_type@@IBVERBS_PRIVATE_34",
        "_ibv_query_gid_ex@@IBVERBS_1.11",
        "ibv_get_device_index@@IBVERBS_1.9",
    ] {
        assert!(
            defined.contains(&want),
            "{want} not exported; defined functions: {defined:?}"
        );
    }
    // No public name may be exported without a version (a lazy build would do that).
    let public_unversioned: Vec<&&str> = defined
        .iter()
        .filter(|n| (n.starts_with("ibv_") || n.starts_with("_ibv_")) && !n.contains('@'))
        .collect();
    assert!(
        public_unversioned.is_empty(),
        "unversioned public names: {public_unversioned:?}"
    );

    // Every version node the Debian binaries may require is defined.
    let mut cmd = Command::new("readelf");
    cmd.args(["-V", "-W"]).arg(&lib);
    let vers = run(cmd, LIMIT).expect("readelf -V").stdout;
    for node in [
        "IBVERBS_1.0",
        "IBVERBS_1.1",
        "IBVERBS_1.5",
        "IBVERBS_1.6",
        "IBVERBS_1.7",
        "IBVERBS_1.8",
        "IBVERBS_1.9",
        "IBVERBS_1.10",
        "IBVERBS_1.11",
        "IBVERBS_1.12",
        "IBVERBS_1.13",
        "IBVERBS_1.14",
        "IBVERBS_PRIVATE_34",
    ] {
        let defined_node = vers
            .lines()
            .any(|l| l.contains("Name:") && l.split_whitespace().any(|w| w == node));
        assert!(defined_node, "version node {node} not defined:\n{vers}");
    }
}
