//! The clients people run on RDMA, unmodified, over uroce: UCX (Debian's `ucx-utils` 1.13:
//! `ucx_perftest`, and a UCP program of ours, `tests/c/ucp_check.c`, that checks every byte)
//! and libfabric's verbs provider (Debian's `libfabric-bin` 1.17: `fi_pingpong`), each as a
//! server and a client process under `uroce run`.
//!
//! * UCX over uroce's RC and UD QPs (`UCX_TLS=rc_verbs,ud_verbs,self`,
//!   `UCX_NET_DEVICES=uroce0:1`): `ucx_perftest` tag_lat, tag_bw, ucp_put_bw, ucp_get and
//!   ucp_am_lat run to their final line with every iteration, and `ucp_check` moves tagged
//!   messages (eager and rendezvous, up to 3 MiB), RMA PUT and GET and active messages with
//!   every byte checked; the endpoint's lanes name `rc_verbs/uroce0:1`.
//! * UCX the way users start it: `UCX_TLS` left at its default, only
//!   `UCX_NET_DEVICES=uroce0:1`: UCX picks shared memory (sysv, posix, cma) next to
//!   `rc_verbs/uroce0:1`; `ucp_check` passes, which needs the two programs in one user
//!   namespace (`uroce run`'s `userns`).
//! * libfabric's verbs MSG endpoints and `verbs;ofi_rxm` (what MPICH and Intel MPI use):
//!   `fi_pingpong -c` (data checked) between 10.77.0.1 and 10.77.0.2, the two ends of a
//!   veth pair in a network namespace the test creates; both must pass, with the result
//!   row of the 4 KiB size. (libfabric binds `localhost` for its passive endpoint, which
//!   the RDMA CM binds to the process's device as the kernel's does; it gives
//!   `rdma_getaddrinfo` the peer's address with its port as hints and asks for the
//!   maximum RDMA READ depth, `RDMA_MAX_RESP_RES`, and for CQs of 262144 entries.)
//!
//! Without the programs, the UCX headers, the C libraries next to `uroce`, unprivileged
//! user namespaces or a network namespace, a test is skipped (failing under
//! `UROCE_REQUIRE_TOOLS=1`). Each test uses addresses of its own, so they run in parallel.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use uroce_testkit::{run, skip, Output, TempFile};

mod support;
use support::libs_built;

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");
const LIMIT: Duration = Duration::from_secs(120);
const UCX_PERFTEST: &str = "/usr/bin/ucx_perftest";
const FI_PINGPONG: &str = "/usr/bin/fi_pingpong";
const UCP_HEADER: &str = "/usr/include/ucp/api/ucp.h";

fn have(test: &str, path: &str, package: &str) -> bool {
    if Path::new(path).exists() {
        return true;
    }
    skip(test, &format!("{path} is missing (install {package})"));
    false
}

/// A TCP port that was free a moment ago.
fn free_tcp_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an ephemeral port");
    l.local_addr().expect("local_addr").port()
}

/// Whether some socket listens on TCP `port`, from `/proc/net/tcp{,6}` (no probe
/// connection disturbs the server).
fn listening(port: u16) -> bool {
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

/// `uroce run -- program args…` on a device at `addr`, with `env` added.
fn uroce_run(addr: &str, env: &[(&str, &str)], program: &str, args: &[String]) -> Command {
    let mut c = Command::new(UROCE);
    c.arg("run")
        .arg("--")
        .arg(program)
        .args(args)
        .env("UROCE_ADDR", addr)
        .env_remove("UROCE_PRESENT")
        .env_remove("UROCE_NETNS")
        .env_remove("UROCE_FAULTS")
        .env_remove("UCX_TLS")
        .env_remove("UCX_NET_DEVICES");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// A started process whose output goes to files, killed when dropped.
struct Started {
    child: std::process::Child,
    out: TempFile,
    err: TempFile,
}

impl Started {
    fn spawn(mut cmd: Command) -> Started {
        let (out, err) = (
            TempFile::new("stdout", "txt"),
            TempFile::new("stderr", "txt"),
        );
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(out.path()).expect("stdout file"))
            .stderr(std::fs::File::create(err.path()).expect("stderr file"))
            .spawn()
            .expect("start the server");
        Started { child, out, err }
    }

    /// Waits until it ends, at most `limit` (then it is killed: status `None`).
    fn finish(mut self, limit: Duration) -> (Option<std::process::ExitStatus>, String, String) {
        let until = Instant::now() + limit;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        let read = |f: &TempFile| {
            String::from_utf8_lossy(&std::fs::read(f.path()).unwrap_or_default()).into_owned()
        };
        (status, read(&self.out), read(&self.err))
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `server` until it listens on TCP `port` (at most 30 s), then `client`, bounded by
/// [`LIMIT`]; the server then gets [`LIMIT`] to end, or 10 s if the client failed (then it
/// is killed). Returns `(server, client)`; a killed server reports failure.
fn pair(test: &str, server: Command, client: Command, port: u16) -> (Output, Output) {
    let mut srv = Started::spawn(server);
    let until = Instant::now() + Duration::from_secs(30);
    while !listening(port) && Instant::now() < until {
        if let Ok(Some(_)) = srv.child.try_wait() {
            let (s, o, e) = srv.finish(Duration::ZERO);
            panic!("{test}: the server ended ({s:?}) before it listened:\n{o}\n{e}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let cli = run(client, LIMIT).unwrap_or_else(|e| panic!("{test} client: {e}"));
    let grace = if cli.status.success() {
        LIMIT
    } else {
        Duration::from_secs(10)
    };
    let (status, stdout, stderr) = srv.finish(grace);
    let status = status.unwrap_or_else(|| {
        // What a shell reports for a program killed by SIGKILL.
        std::os::unix::process::ExitStatusExt::from_raw(9)
    });
    (
        Output {
            status,
            stdout,
            stderr,
        },
        cli,
    )
}

fn assert_ok(test: &str, srv: &Output, cli: &Output) {
    assert!(
        srv.status.success() && cli.status.success(),
        "{test}: server {:?}, client {:?}\n--- server stdout\n{}\n--- server stderr\n{}\n--- client stdout\n{}\n--- client stderr\n{}",
        srv.status,
        cli.status,
        srv.stdout,
        srv.stderr,
        cli.stdout,
        cli.stderr
    );
}

/// The clients run one test at a time: each pair is two busy-polling processes and two
/// progress threads, and several pairs at once on a 2-core runner stretched UCX's
/// latencies from microseconds to milliseconds.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether UCX and the presentation `uroce run` gives it are available here.
fn ucx_ready(test: &str) -> bool {
    if !libs_built(test) || !have(test, UCX_PERFTEST, "ucx-utils") {
        return false;
    }
    let o = run(uroce_run("127.0.46.250", &[], "true", &[]), LIMIT).expect("uroce run true");
    if let Some(l) = o
        .stderr
        .lines()
        .find(|l| l.starts_with("uroce run: running without"))
    {
        // UCX finds an InfiniBand device only through sysfs.
        skip(test, &format!("no presentation of the device here: {l}"));
        return false;
    }
    true
}

/// The numbers of `ucx_perftest`'s `Final:` line: iterations, then the latency,
/// bandwidth and message-rate columns.
fn final_line(out: &str) -> Option<Vec<f64>> {
    let l = out.lines().find(|l| l.trim_start().starts_with("Final:"))?;
    l.split_whitespace()
        .skip(1)
        .map(|w| w.parse().ok())
        .collect()
}

/// `ucx_perftest -t test -s size -n iters` between two processes with `env`; returns the
/// client's `Final:` numbers after checking both sides ended well.
fn perftest(
    name: &str,
    base: u8,
    env: &[(&str, &str)],
    t: &str,
    size: u64,
    iters: u64,
) -> Vec<f64> {
    let test = format!("{name}_{t}");
    let port = free_tcp_port();
    let p = port.to_string();
    let server = uroce_run(
        &format!("127.0.46.{base}"),
        env,
        UCX_PERFTEST,
        &["-p".into(), p.clone()],
    );
    let client_args: Vec<String> = ["127.0.0.1", "-p", &p, "-t", t, "-s"]
        .iter()
        .map(|s| s.to_string())
        .chain([size.to_string(), "-n".into(), iters.to_string()])
        .collect();
    let client = uroce_run(
        &format!("127.0.46.{}", base + 1),
        env,
        UCX_PERFTEST,
        &client_args,
    );
    let (srv, cli) = pair(&test, server, client, port);
    assert_ok(&test, &srv, &cli);
    let f = final_line(&cli.stdout)
        .unwrap_or_else(|| panic!("{test}: no Final line:\n{}\n{}", cli.stdout, cli.stderr));
    assert_eq!(f.first().copied(), Some(iters as f64), "{test}: {f:?}");
    // Latencies (typical, average, overall) and message rates; the MB/s columns are
    // printed with two decimals and read 0.00 for 8-byte messages at a millisecond.
    assert!(
        f.len() == 8 && [1, 2, 3, 6, 7].iter().all(|&i| f[i] > 0.0),
        "{test}: {f:?}"
    );
    eprintln!("{test}: {} B: {f:?}", size);
    f
}

const RC_UD: &[(&str, &str)] = &[
    ("UCX_TLS", "rc_verbs,ud_verbs,self"),
    ("UCX_NET_DEVICES", "uroce0:1"),
];

#[test]
fn ucx_perftest_over_rc_and_ud_verbs() {
    let _serial = serial();
    let test = "ucx_perftest_over_rc_and_ud_verbs";
    if !ucx_ready(test) {
        return;
    }
    perftest(test, 1, RC_UD, "tag_lat", 8, 2000);
    perftest(test, 3, RC_UD, "tag_bw", 1 << 20, 100);
    perftest(test, 5, RC_UD, "ucp_put_bw", 1 << 20, 100);
    perftest(test, 7, RC_UD, "ucp_get", 65536, 300);
    perftest(test, 9, RC_UD, "ucp_am_lat", 8, 2000);
}

/// Compiles `tests/c/ucp_check.c` against UCX.
fn ucp_check(test: &str) -> Option<TempFile> {
    if !have(test, UCP_HEADER, "libucx-dev") {
        return None;
    }
    let exe = TempFile::new("ucp_check", "");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/ucp_check.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=gnu11", "-O1", "-Wall", "-Werror", "-o"])
        .arg(exe.path())
        .arg(&src)
        .args(["-lucp", "-lucs"]);
    match run(cmd, LIMIT) {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("compiling {} failed:\n{}", src.display(), o.stderr),
        Err(e) => {
            skip(test, &format!("no C compiler ({cc}): {e}"));
            None
        }
    }
}

/// Runs `ucp_check` between two processes with `env`; returns the client's output.
fn run_ucp_check(test: &str, exe: &TempFile, base: u8, env: &[(&str, &str)]) -> Output {
    let port = free_tcp_port();
    let prog = exe.path().to_string_lossy().into_owned();
    let server = uroce_run(
        &format!("127.0.46.{base}"),
        env,
        &prog,
        &["server".into(), port.to_string()],
    );
    let client = uroce_run(
        &format!("127.0.46.{}", base + 1),
        env,
        &prog,
        &["client".into(), "127.0.0.1".into(), port.to_string()],
    );
    let (srv, cli) = pair(test, server, client, port);
    assert_ok(test, &srv, &cli);
    for (side, o) in [("server", &srv), ("client", &cli)] {
        assert!(
            o.stdout.contains(&format!("ucp_check {side}: ok")),
            "{test}: {side} did not finish:\n{}",
            o.stdout
        );
    }
    cli
}

#[test]
fn ucp_data_intact_over_rc_and_ud_verbs() {
    let _serial = serial();
    let test = "ucp_data_intact_over_rc_and_ud_verbs";
    if !ucx_ready(test) {
        return;
    }
    let Some(exe) = ucp_check(test) else {
        return;
    };
    let cli = run_ucp_check(test, &exe, 21, RC_UD);
    // The data went through uroce: the endpoint's only lane is rc_verbs on uroce0.
    assert!(
        cli.stdout.contains("rc_verbs/uroce0:1"),
        "{test}: lanes:\n{}",
        cli.stdout
    );
}

#[test]
fn ucx_with_its_default_transports_and_the_uroce_device() {
    let _serial = serial();
    let test = "ucx_with_its_default_transports_and_the_uroce_device";
    if !ucx_ready(test) {
        return;
    }
    let env = &[("UCX_NET_DEVICES", "uroce0:1")];
    perftest(test, 31, env, "tag_lat", 8, 2000);
    perftest(test, 33, env, "tag_bw", 1 << 20, 100);
    let Some(exe) = ucp_check(test) else {
        return;
    };
    let cli = run_ucp_check(test, &exe, 35, env);
    // Shared memory between the two processes (cma reads the peer's memory) beside uroce.
    for lane in ["rc_verbs/uroce0:1", "cma/memory"] {
        assert!(
            cli.stdout.contains(lane),
            "{test}: no {lane} lane:\n{}",
            cli.stdout
        );
    }
}

// libfabric's verbs provider over a veth pair in a namespace of the test's own.

/// Environment variable that makes the child test run (inside the new namespace).
const FI_CHILD_ENV: &str = "UROCE_CLIENTS_FI_CHILD";
/// The child test's name.
const FI_CHILD: &str = "libfabric_pairs_in_a_private_namespace";
#[test]
fn libfabric_verbs_msg_and_rxm_over_a_veth_pair() {
    let _serial = serial();
    let test = "libfabric_verbs_msg_and_rxm_over_a_veth_pair";
    if !libs_built(test) || !have(test, FI_PINGPONG, "libfabric-bin") {
        return;
    }
    let Some(out) = uroce_testkit::run_in_new_netns(test, FI_CHILD, FI_CHILD_ENV) else {
        return;
    };
    assert!(
        out.status.success(),
        "{test}: the child failed:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout.contains("test result: ok. 1 passed"),
        "{test}: the child did not run:\n{}",
        out.stdout
    );
}

fn ip(args: &[&str]) {
    let mut c = Command::new("ip");
    c.args(args);
    let o = run(c, Duration::from_secs(10)).expect("ip");
    assert!(o.status.success(), "ip {args:?}: {}", o.stderr);
}

/// Inside a new network namespace: `lo` up, a veth pair `fa`/`fb` with 10.77.0.1/24 and
/// 10.77.0.2/24, then `fi_pingpong -c` between a device on each address, over a verbs MSG
/// endpoint and over `verbs;ofi_rxm`.
#[test]
#[ignore = "runs inside the namespace made by libfabric_verbs_msg_and_rxm_over_a_veth_pair"]
fn libfabric_pairs_in_a_private_namespace() {
    if std::env::var_os(FI_CHILD_ENV).is_none() {
        return;
    }
    ip(&["link", "set", "lo", "up"]);
    ip(&["link", "add", "fa", "type", "veth", "peer", "name", "fb"]);
    ip(&["addr", "add", "10.77.0.1/24", "dev", "fa"]);
    ip(&["addr", "add", "10.77.0.2/24", "dev", "fb"]);
    ip(&["link", "set", "fa", "up"]);
    ip(&["link", "set", "fb", "up"]);
    for (provider, ep) in [("verbs", "msg"), ("verbs;ofi_rxm", "rdm")] {
        let test = format!("fi_pingpong -p {provider} -e {ep}");
        let port = free_tcp_port();
        let args = |peer: Option<&str>| -> Vec<String> {
            let mut a: Vec<String> = ["-p", provider, "-e", ep, "-I", "200", "-S", "4096", "-c"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            match peer {
                None => a.extend(["-B".into(), port.to_string()]),
                Some(p) => a.extend(["-P".into(), port.to_string(), p.to_owned()]),
            }
            a
        };
        let env = &[("FI_LOG_LEVEL", "warn")];
        let server = uroce_run("10.77.0.1", env, FI_PINGPONG, &args(None));
        let client = uroce_run("10.77.0.2", env, FI_PINGPONG, &args(Some("10.77.0.1")));
        let (srv, cli) = pair(&test, server, client, port);
        assert!(
            srv.status.success() && cli.status.success(),
            "{test}: server ({:?}):\n{}\n{}\nclient ({:?}):\n{}\n{}",
            srv.status,
            srv.stdout,
            srv.stderr,
            cli.status,
            cli.stdout,
            cli.stderr
        );
        // fi_pingpong's table: one row of results for the size.
        assert!(cli.stdout.contains("4k"), "{test}: {}", cli.stdout);
        eprintln!("{test}: passed\n{}", cli.stdout);
    }
}
