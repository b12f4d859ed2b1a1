//! `uroce devinfo`: the device on a given address, its port, GID 0 and counters.

mod support;

use std::net::Ipv4Addr;
use std::time::Duration;

use support::run_uroce;

/// The node GUID the verbs layer documents for an IPv4 address: MAC 02:00:a:b:c:d, as a
/// modified EUI-64 (ff:fe in the middle, universal/local bit flipped).
fn expected_guid(ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    let mac = [0x02u8, 0x00, a, b, c, d];
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
    eui.chunks(2)
        .map(|p| format!("{:02x}{:02x}", p[0], p[1]))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn devinfo_shows_port_gid_and_counters() {
    let out = run_uroce(&["devinfo", "--addr", "127.0.0.3"], Duration::from_secs(30));
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let text = out.stdout;
    let field = |name: &str| -> String {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
            .split_once(':')
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("hca_id"), "uroce0");
    assert_eq!(field("state"), "PORT_ACTIVE (4)");
    assert_eq!(field("link_layer"), "Ethernet");
    // The port MTU derives from the interface's: loopback's 65536 minus 80 header bytes
    // leaves room for the largest IB MTU, 4096.
    assert_eq!(field("active_mtu"), "4096 (5)");
    assert_eq!(
        field("node_guid"),
        expected_guid(Ipv4Addr::new(127, 0, 0, 3))
    );
    let gid = text
        .lines()
        .find(|l| l.contains("GID[  0]"))
        .unwrap_or_else(|| panic!("no GID 0 in:\n{text}"));
    assert!(gid.contains("::ffff:127.0.0.3"), "{gid}");
    assert!(
        gid.contains("0000:0000:0000:0000:0000:ffff:7f00:0003"),
        "{gid}"
    );
    assert!(gid.contains("RoCE v2"), "{gid}");
    assert_eq!(field("rx_packets"), "0");
    assert_eq!(field("tx_packets"), "0");
    // The output says why the counters are zero and where to see them after traffic.
    let note = field("counters");
    assert!(
        note.contains("just opened") && note.contains("uroce perf --counters"),
        "{note}"
    );
    assert!(!text.contains("max_qp:"), "attributes only with -v");
}

#[test]
fn devinfo_verbose_lists_the_attributes() {
    let out = run_uroce(
        &["devinfo", "--addr", "127.0.1.40", "-v"],
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    for key in [
        "max_qp:",
        "max_cqe:",
        "max_qp_rd_atom:",
        "atomic_cap:",
        "gid_tbl_len:",
        "P_Key[  0]:",
    ] {
        assert!(out.stdout.contains(key), "{key} missing:\n{}", out.stdout);
    }
    assert!(out.stdout.contains("::ffff:127.0.1.40"));
}

#[test]
fn devinfo_on_a_foreign_address_fails_cleanly() {
    // 192.0.2.1 (TEST-NET-1) is not an address of this machine: binding must fail with a
    // message, not a panic.
    let out = run_uroce(&["devinfo", "--addr", "192.0.2.1"], Duration::from_secs(30));
    assert!(!out.status.success());
    assert!(out.stderr.contains("192.0.2.1"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}
