//! Helpers of the tests that run unmodified programs on one shared device
//! (the default, `UROCE_SHARED` unset; one `UROCE_ADDR` for all): `same_address.rs`, `shared_kill.rs`.

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::Command;

use uroce_testkit::{Output, TempFile};

/// A directory of one test (its host registry, its published counters), removed with its
/// contents on drop.
pub struct TestDir(TempFile);

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        let f = TempFile::new(tag, "d");
        std::fs::create_dir(f.path()).expect("create the test's directory");
        TestDir(f)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.path());
    }
}

/// A TCP port that was free a moment ago.
pub fn free_tcp_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an ephemeral port");
    l.local_addr().expect("local_addr").port()
}

/// Whether some socket listens on TCP `port`, from `/proc/net/tcp{,6}`.
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[1].ends_with(&want) && w[3] == "0A"
            })
        })
    })
}

/// Whether UDP `addr`:4791 is bound on this host.
pub fn bound(addr: Ipv4Addr) -> bool {
    let want = format!("{:08X}:12B7", u32::from_le_bytes(addr.octets()));
    std::fs::read_to_string("/proc/net/udp").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(&want))
    })
}

/// `uroce run -- args…` with a shared device at `addr`, registry in `host`.
pub fn shared_run(addr: Ipv4Addr, host: &TestDir, args: &[String]) -> Command {
    let mut c = super::uroce();
    c.arg("run")
        .arg("--")
        .args(args)
        .env("UROCE_ADDR", addr.to_string())
        .env_remove("UROCE_SHARED")
        .env("UROCE_HOST_DIR", host.path())
        .env_remove("UROCE_FAULTS")
        .env_remove("UROCE_NETNS");
    c
}

pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Whether `program` is installed; reports a skip for `test` when it is not.
pub fn have(test: &str, program: &str, package: &str) -> bool {
    if Path::new(program).exists() {
        return true;
    }
    uroce_testkit::skip(test, &format!("{program} is missing (install {package})"));
    false
}

pub fn check_ok(test: &str, who: &str, o: &Output) {
    assert!(
        o.status.success(),
        "{test} {who} ({:?}):\n{}\n{}",
        o.status,
        o.stdout,
        o.stderr
    );
}

/// `ibv_rc_pingpong` prints "<2·size·iters> bytes in …" and "<iters> iters in …" (default
/// size 4096) and the GIDs of both ends, here both `addr`.
pub fn check_pingpong(test: &str, who: &str, o: &Output, addr: Ipv4Addr, iters: u32) {
    check_ok(test, who, o);
    let bytes = format!("{} bytes in ", 2 * 4096 * u64::from(iters));
    let its = format!("{iters} iters in ");
    assert!(
        o.stdout.contains(&bytes) && o.stdout.contains(&its),
        "{test} {who}: no `{bytes}` / `{its}`:\n{}",
        o.stdout
    );
    let gid = format!("GID ::ffff:{addr}");
    assert_eq!(
        o.stdout.matches(&gid).count(),
        2,
        "{test} {who}: local and remote GID are not both {addr}:\n{}",
        o.stdout
    );
}
