//! `UROCE_ADDR` chooses the device address for programs that do not name one.

use std::process::Command;

fn devinfo_with_env(value: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uroce"))
        .arg("devinfo")
        .env("UROCE_ADDR", value)
        .env_remove("UROCE_FAULTS")
        .output()
        .expect("run uroce devinfo")
}

#[test]
fn uroce_addr_sets_the_device_address_and_gid() {
    let out = devinfo_with_env("127.0.0.7");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // GID 0 is the address as an IPv4-mapped IPv6 address (RoCEv2 GID).
    assert!(stdout.contains("::ffff:127.0.0.7"), "{stdout}");
    assert!(!stdout.contains("::ffff:127.0.0.1"), "{stdout}");
}

#[test]
fn a_bad_uroce_addr_is_an_error_not_a_default() {
    let out = devinfo_with_env("not-an-address");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("UROCE_ADDR"), "{stderr}");
}
