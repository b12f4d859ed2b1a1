//! Helpers shared by the tests that run unmodified Debian binaries against the library.
#![allow(dead_code)] // each test binary uses a different subset

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use uroce_testkit::{run, skip, Output, TempFile};

/// How long one `readelf` may take.
const READELF_LIMIT: Duration = Duration::from_secs(30);

/// The cdylib cargo built for this test run: `<target>/<profile>/deps/liburoce_ffi.so`,
/// beside this executable (only `cargo build` copies it up to `<target>/<profile>/`, where
/// a stale one may lie).
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .expect("test executable lives in <target>/<profile>/deps")
        .join("liburoce_ffi.so")
}

/// A fresh directory holding the library as `libibverbs.so.1`, removed on drop.
pub struct LibDir(pub PathBuf);

/// Numbers the [`LibDir`]s of this process.
static LIB_DIRS: AtomicU64 = AtomicU64::new(0);

impl LibDir {
    /// A directory named after `tag`, this process and a number unique in it: tests of one
    /// binary run in parallel and several pass the same tag (e.g. the program name), and
    /// one of them must never remove (on drop) or rewrite (on creation) the library that
    /// another's programs are loading: the loader then falls back to the system's
    /// libibverbs.so.1, which finds no device.
    pub fn new(tag: &str) -> LibDir {
        let n = LIB_DIRS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("uroce-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let lib = built_library();
        assert!(lib.exists(), "cdylib not built at {}", lib.display());
        std::fs::copy(&lib, dir.join("libibverbs.so.1")).expect("copy library");
        LibDir(dir)
    }
}

impl Drop for LibDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `program` is installed (else the test is reported as skipped).
pub fn have_program(test: &str, program: &str) -> bool {
    if !Path::new(program).exists() {
        skip(
            test,
            &format!("{program} is missing (install the Debian package ibverbs-utils or perftest)"),
        );
        return false;
    }
    true
}

/// A TCP port that was free a moment ago.
pub fn free_tcp_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an ephemeral port");
    l.local_addr().expect("local_addr").port()
}

/// Whether some socket listens on TCP `port` (any address, IPv4 or IPv6), read from
/// `/proc/net/tcp{,6}` so that no probe connection disturbs the server.
pub fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                // Columns: sl local_address rem_address st …; st 0A = LISTEN.
                w.len() > 3 && w[1].ends_with(&want) && w[3] == "0A"
            })
        })
    })
}

/// `program` run against the library in `dir`, on a device with address `addr`.
pub fn debian_command(dir: &LibDir, program: &str, addr: Ipv4Addr, args: &[String]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", &dir.0)
        .env("UROCE_ADDR", addr.to_string())
        .env_remove("UROCE_FAULTS");
    cmd
}

/// The `IBVERBS_*` symbols `program` imports (as `name@@VERSION`, the form the library
/// defines them in) and those of them the library does not define. `None` (reported as
/// skipped) when `readelf` cannot run.
pub fn imports_and_missing(test: &str, program: &str) -> Option<(Vec<String>, Vec<String>)> {
    let mut cmd = Command::new("readelf");
    cmd.args(["--dyn-syms", "-W", program]);
    let imports = match run(cmd, READELF_LIMIT) {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!("readelf failed: {}", o.stderr),
        Err(e) => {
            skip(test, &format!("readelf (binutils) cannot run: {e}"));
            return None;
        }
    };
    // Imported names look like `ibv_alloc_pd@IBVERBS_1.1 (2)`.
    let wanted: Vec<String> = imports
        .lines()
        .filter(|l| l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7))
        .filter(|n| n.contains("@IBVERBS_"))
        .map(|n| n.replacen('@', "@@", 1))
        .collect();
    let mut cmd = Command::new("readelf");
    cmd.args(["--dyn-syms", "-W"]).arg(built_library());
    let ours = run(cmd, READELF_LIMIT)
        .expect("readelf on the library")
        .stdout;
    let defined: Vec<&str> = ours
        .lines()
        .filter(|l| l.contains(" FUNC ") && !l.contains(" UND "))
        .filter_map(|l| l.split_whitespace().nth(7))
        .collect();
    let missing = wanted
        .iter()
        .filter(|w| !defined.contains(&w.as_str()))
        .cloned()
        .collect();
    Some((wanted, missing))
}

/// Compiles `tests/c/<name>` against the installed `<infiniband/verbs.h>`, linking
/// rdma-core's library (the program runs against uroce's through `LD_LIBRARY_PATH`) and
/// `libs`. `None` (reported as skipped) without the header or a C compiler.
pub fn compile_c(test: &str, name: &str, libs: &[&str]) -> Option<TempFile> {
    compile_c_file(test, &format!("tests/c/{name}"), libs)
}

/// [`compile_c`] for a C file at `path` (relative to the crate's directory).
pub fn compile_c_file(test: &str, path: &str, libs: &[&str]) -> Option<TempFile> {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        skip(
            test,
            "<infiniband/verbs.h> is missing (install libibverbs-dev)",
        );
        return None;
    }
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    let stem = Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("c_program");
    let exe = TempFile::new(stem, "");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(exe.path())
        .arg(&src)
        .arg("-libverbs")
        .args(libs);
    match run(cmd, Duration::from_secs(120)) {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("compiling {} failed:\n{}", src.display(), o.stderr),
        Err(e) => {
            skip(test, &format!("no C compiler ({cc}): {e}"));
            None
        }
    }
}

/// How long the server may still run after its client failed: a server whose client
/// never connected (e.g. it could not load the library) would otherwise wait for it until
/// its whole limit and hide the client's error behind a timeout.
const AFTER_CLIENT_FAILED: Duration = Duration::from_secs(10);

/// `testkit::run` that also ends the program (killed) once `cancel` is set.
fn run_cancellable(
    mut cmd: Command,
    limit: Duration,
    cancel: &std::sync::atomic::AtomicBool,
) -> Result<Output, String> {
    let out_file = TempFile::new("stdout", "txt");
    let err_file = TempFile::new("stderr", "txt");
    let out = std::fs::File::create(out_file.path()).map_err(|e| e.to_string())?;
    let err = std::fs::File::create(err_file.path()).map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline || cancel.load(Ordering::SeqCst) => {
                let _ = child.kill();
                let _ = child.wait();
                let why = if Instant::now() >= deadline {
                    format!("ran longer than {limit:?}")
                } else {
                    format!("was still running {AFTER_CLIENT_FAILED:?} after its client failed")
                };
                let read = |p: &Path| {
                    String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned()
                };
                return Err(format!(
                    "{:?} {why} and was killed; stdout:\n{}\nstderr:\n{}",
                    cmd.get_program(),
                    read(out_file.path()),
                    read(err_file.path())
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
    };
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Ok(Output {
        status,
        stdout: read(out_file.path()),
        stderr: read(err_file.path()),
    })
}

/// Runs `server` (in a thread) until it listens on TCP `port`, then `client`, each
/// bounded by `limit`; returns `(server, client)` outputs once both have ended. Panics
/// (naming `test`) when the server never listens within 20 s or a program cannot run.
/// When the client fails, the server gets [`AFTER_CLIENT_FAILED`] more and is then killed,
/// and a server that did not end on its own is reported with the client's output.
pub fn run_server_client(
    test: &str,
    server: Command,
    client: Command,
    port: u16,
    limit: Duration,
) -> (Output, Output) {
    let start = Instant::now();
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server_cancel = std::sync::Arc::clone(&cancel);
    let server_thread = std::thread::spawn(move || run_cancellable(server, limit, &server_cancel));
    let wait_until = Instant::now() + Duration::from_secs(20);
    while !listening(port) {
        if server_thread.is_finished() {
            let why = match server_thread.join().expect("server thread") {
                Ok(o) => format!(
                    "{:?}\nstdout:\n{}\nstderr:\n{}",
                    o.status, o.stdout, o.stderr
                ),
                Err(e) => e,
            };
            panic!("{test}: the server exited before it listened on TCP port {port}: {why}");
        }
        if Instant::now() >= wait_until {
            cancel.store(true, Ordering::SeqCst);
            let _ = server_thread.join();
            panic!("{test}: the server never listened on TCP port {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let client_out = run(client, limit);
    let client_failed = !matches!(&client_out, Ok(o) if o.status.success());
    if client_failed {
        // Bounded: at most AFTER_CLIENT_FAILED in steps of 10 ms.
        let until = Instant::now() + AFTER_CLIENT_FAILED;
        while !server_thread.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        cancel.store(true, Ordering::SeqCst);
    }
    let server_out = server_thread.join().expect("server thread");
    let client_out = client_out.unwrap_or_else(|e| match &server_out {
        Ok(s) => panic!(
            "{test} client: {e}\nserver stdout:\n{}\nserver stderr:\n{}",
            s.stdout, s.stderr
        ),
        Err(s) => panic!("{test} client: {e}\nserver: {s}"),
    });
    let server_out = server_out.unwrap_or_else(|e| {
        panic!(
            "{test} server: {e}\nclient ({:?}) stdout:\n{}\nclient stderr:\n{}",
            client_out.status, client_out.stdout, client_out.stderr
        )
    });
    eprintln!("{test}: both finished in {:?}", start.elapsed());
    (server_out, client_out)
}

/// Compiles the C `source` (gnu11, `-Wall -Werror`, linked with `libs`) into `exe`.
/// `Err` carries the compiler's complaint, or why it could not run.
pub fn compile_source(source: &str, exe: &TempFile, libs: &[&str]) -> Result<(), String> {
    let src = TempFile::new("ffi-c-source", "c");
    std::fs::write(src.path(), source).map_err(|e| format!("writing C source: {e}"))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cmd = Command::new(&cc);
    cmd.args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(exe.path())
        .arg(src.path())
        .args(libs);
    let out = run(cmd, Duration::from_secs(120))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cc} failed:\n{}{}", out.stdout, out.stderr))
    }
}

/// Runs a generated checking program whose line `k` reads `k A B`, for `lines` lines;
/// returns the `(A, B)` pairs in order (panics on a failed run or a malformed line).
pub fn run_numbered(exe: &TempFile, lines: usize) -> Vec<(i64, i64)> {
    let out = run(Command::new(exe.path()), Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("running the generated program: {e}"));
    assert!(
        out.status.success(),
        "the generated program failed: {}",
        out.stderr
    );
    let rows: Vec<(i64, i64)> = out
        .stdout
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let nums: Vec<i64> = line
                .split_whitespace()
                .map(|w| w.parse().unwrap_or_else(|e| panic!("line {line:?}: {e}")))
                .collect();
            assert_eq!(nums.len(), 3, "malformed line {line:?}");
            assert_eq!(nums[0], i as i64, "line out of order: {line:?}");
            (nums[1], nums[2])
        })
        .collect();
    assert_eq!(rows.len(), lines, "one output line per check");
    rows
}

/// Asserts that both sides of a run exited 0, showing their output otherwise.
pub fn assert_both_succeeded(test: &str, server: &Output, client: &Output) {
    for (who, out) in [("server", server), ("client", client)] {
        assert!(
            out.status.success(),
            "{test} {who} failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
            out.status,
            out.stdout,
            out.stderr
        );
    }
}

/// Asserts that the library defines every `IBVERBS_*` symbol `program` imports, with its
/// version, after a sanity check of what was read: at least `min_imports` imports,
/// including each `name@@VERSION` prefix in `must_import`. Returns without asserting
/// (reported as skipped) when `readelf` cannot run.
pub fn assert_library_defines_imports(
    test: &str,
    program: &str,
    min_imports: usize,
    must_import: &[&str],
) {
    let Some((wanted, missing)) = imports_and_missing(test, program) else {
        return;
    };
    assert!(
        wanted.len() >= min_imports
            && must_import
                .iter()
                .all(|m| wanted.iter().any(|w| w.starts_with(m))),
        "unexpected imports read from {program}: {wanted:?}"
    );
    assert!(
        missing.is_empty(),
        "{program}: not defined by the library: {missing:?}"
    );
}

/// Runs an ibverbs-utils pingpong `program` (`-g 0 -p <port> -s size -n iters extra…`)
/// as server on `server` and client on `client`; asserts both exit 0 and returns their
/// standard outputs `(server, client)` (also printed, for failure reports).
pub fn run_pingpong(
    test: &str,
    program: &str,
    (server, client): (Ipv4Addr, Ipv4Addr),
    (size, iters): (u64, u64),
    extra: &[&str],
    limit: Duration,
) -> (String, String) {
    let dir = LibDir::new(test);
    let port = free_tcp_port();
    let mut args: Vec<String> = ["-g", "0", "-p"].iter().map(|s| s.to_string()).collect();
    args.extend([
        port.to_string(),
        "-s".into(),
        size.to_string(),
        "-n".into(),
        iters.to_string(),
    ]);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let server_cmd = debian_command(&dir, program, server, &args);
    let mut client_args = args.clone();
    client_args.push(server.to_string());
    let client_cmd = debian_command(&dir, program, client, &client_args);
    let (server_out, client_out) = run_server_client(test, server_cmd, client_cmd, port, limit);
    for (who, out) in [("server", &server_out), ("client", &client_out)] {
        eprintln!("{test} {who} stdout:\n{}", out.stdout);
    }
    assert_both_succeeded(test, &server_out, &client_out);
    (server_out.stdout, client_out.stdout)
}

/// Runs a single-process C program (`exe args…`) against the library on device address
/// `addr`; asserts it exits 0 and returns its output (stdout also printed).
pub fn run_c_program(
    test: &str,
    exe: &TempFile,
    addr: Ipv4Addr,
    args: &[&str],
    limit: Duration,
) -> Output {
    let dir = LibDir::new(test);
    let mut cmd = Command::new(exe.path());
    cmd.args(args)
        .env("LD_LIBRARY_PATH", &dir.0)
        .env("UROCE_ADDR", addr.to_string())
        .env_remove("UROCE_FAULTS");
    let start = Instant::now();
    let out = run(cmd, limit).unwrap_or_else(|e| panic!("{test}: running the program: {e}"));
    eprintln!("{test}: {:?}\n{}", start.elapsed(), out.stdout);
    assert!(
        out.status.success(),
        "{test}: exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    out
}

/// What the server of an ibverbs-utils pingpong prints (on stdout) for each page that
/// fails `-c` validation.
pub const INVALID_PAGE: &str = "invalid data in page";

/// `(QPN, PSN, GID)` of the pingpong output line starting with `prefix` ("local
/// address:" or "remote address:").
pub fn pingpong_address(out: &str, prefix: &str) -> (String, String, String) {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{out}"));
    let word_after = |key: &str| {
        line.split_whitespace()
            .skip_while(|w| *w != key)
            .nth(1)
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
            // ibv_ud_pingpong ends its local PSN with ':', the others with ','.
            .trim_end_matches([',', ':'])
            .to_owned()
    };
    (word_after("QPN"), word_after("PSN"), word_after("GID"))
}

/// Checks the standard outputs of a pingpong pair that exchanged `size` bytes `iters`
/// times: each prints its own address (GID `::ffff:<addr>`, RFC 4291 §2.5.5.2) and its
/// peer's, which must equal what the peer printed as its own; each counts
/// `2 * size * iters` bytes and `iters` iterations; no side reports a page that failed
/// `-c` validation.
pub fn check_pingpong(
    test: &str,
    (server, client): (Ipv4Addr, Ipv4Addr),
    (size, iters): (u64, u64),
    (s_out, c_out): (&str, &str),
) {
    let s_local = pingpong_address(s_out, "local address:");
    let s_remote = pingpong_address(s_out, "remote address:");
    let c_local = pingpong_address(c_out, "local address:");
    let c_remote = pingpong_address(c_out, "remote address:");
    assert_eq!(s_local.2, server.to_ipv6_mapped().to_string());
    assert_eq!(c_local.2, client.to_ipv6_mapped().to_string());
    assert_eq!(s_remote, c_local, "{test}: server's view of the client");
    assert_eq!(c_remote, s_local, "{test}: client's view of the server");

    let bytes = format!("{} bytes in ", 2 * size * iters);
    let iterations = format!("{iters} iters in ");
    for (who, out) in [("server", s_out), ("client", c_out)] {
        for want in [&bytes, &iterations] {
            assert!(
                out.lines().any(|l| l.starts_with(want.as_str())),
                "{test} {who}: no line starting with {want:?}:\n{out}"
            );
        }
        // Only the server validates (`-c`), but a report on either side is a failure.
        let invalid: Vec<&str> = out.lines().filter(|l| l.contains(INVALID_PAGE)).collect();
        assert!(
            invalid.is_empty(),
            "{test} {who}: received data failed validation: {invalid:?}"
        );
    }
}

/// Runs the pingpong `program` as server on `pair.0` and client on `pair.1`, exchanging
/// `size_iters.0` bytes `size_iters.1` times with `extra` arguments, and checks both
/// sides' output; reported as skipped when the program is not installed.
pub fn pingpong_pair(
    test: &str,
    program: &str,
    pair: (Ipv4Addr, Ipv4Addr),
    size_iters: (u64, u64),
    extra: &[&str],
    limit: Duration,
) {
    if !have_program(test, program) {
        return;
    }
    let (s_out, c_out) = run_pingpong(test, program, pair, size_iters, extra, limit);
    check_pingpong(test, pair, size_iters, (&s_out, &c_out));
}
