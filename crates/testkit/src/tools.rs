//! Finding and running external tools (with the `UROCE_REQUIRE_TOOLS` policy), time-limited
//! process runs, paths inside the workspace and unique temporary files.

use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// True when missing tools must fail the test (`UROCE_REQUIRE_TOOLS=1`).
pub fn tools_required() -> bool {
    std::env::var("UROCE_REQUIRE_TOOLS").is_ok_and(|v| v == "1")
}

/// Reports that a test cannot run: panics when tools are required, else prints a note.
/// Returns normally only in the second case (the caller then returns early).
pub fn skip(test: &str, why: &str) {
    if tools_required() {
        panic!("{test}: {why} (UROCE_REQUIRE_TOOLS=1 makes this a failure)");
    }
    eprintln!("SKIP {test}: {why} (set UROCE_REQUIRE_TOOLS=1 to make this a failure)");
}

/// What a finished external process produced.
#[derive(Debug)]
pub struct Output {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

/// Runs `cmd` to completion, killing it after `limit`, or when the thread that called
/// this ends first (the test process exiting with the command still running). Output
/// goes through temporary files (no pipe can fill up). `Err` if it cannot start or runs
/// past the limit.
pub fn run(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let out_file = TempFile::new("stdout", "txt");
    let err_file = TempFile::new("stderr", "txt");
    let out = File::create(out_file.path()).map_err(|e| e.to_string())?;
    let err = File::create(err_file.path()).map_err(|e| e.to_string())?;
    // The program dies with the thread that started it: a test that fails (panics) while
    // a server of it still runs must not leave the server behind, holding an address (a
    // member of a shared device on it) and disturbing later tests.
    // SAFETY: runs in the forked child before exec; prctl is async-signal-safe and touches
    // no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{:?} ran longer than {limit:?} and was killed",
                    cmd.get_program()
                ));
            }
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
    };
    Ok(Output {
        status,
        stdout: read_lossy(out_file.path()),
        stderr: read_lossy(err_file.path()),
    })
}

/// The contents of `path` as text (lossily decoded); empty if it cannot be read.
pub(crate) fn read_lossy(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Checks that `program args…` runs and exits 0 within 60 s; `Err` says why not.
pub fn probe(program: &str, args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    match run(cmd, Duration::from_secs(60)) {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            o.stderr.trim()
        )),
        Err(e) => Err(e),
    }
}

/// The tshark binary: `$UROCE_TSHARK`, else `tshark` from `PATH`.
pub fn tshark() -> String {
    std::env::var("UROCE_TSHARK").unwrap_or_else(|_| "tshark".to_string())
}

/// The Python interpreter: `$UROCE_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("UROCE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Checks that tshark can run; on failure reports a skip (or panics) and returns false.
pub fn have_tshark(test: &str) -> bool {
    match probe(&tshark(), &["-v"]) {
        Ok(()) => true,
        Err(e) => {
            skip(
                test,
                &format!("tshark is not usable ({e}); scripts/test installs it"),
            );
            false
        }
    }
}

/// Checks that python3 with scapy's RoCE module is there; else skip (or panic).
pub fn have_scapy(test: &str) -> bool {
    match probe(&python(), &["-c", "import scapy.contrib.roce"]) {
        Ok(()) => true,
        Err(e) => {
            skip(
                test,
                &format!("python3 with scapy is not usable ({e}); scripts/test installs it"),
            );
            false
        }
    }
}

/// The workspace root (two levels above this crate's manifest).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The path of the helper script `name` in this crate's `scripts/` directory (run it with
/// [`python`]).
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// A file name in the temp directory, unique per process and call, removed on drop.
pub struct TempFile(pub(crate) PathBuf);

impl TempFile {
    /// A new unique path `uroce-<tag>-<pid>-<nanos>-<n>.<ext>` (the file is not created).
    pub fn new(tag: &str, ext: &str) -> TempFile {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!("uroce-{tag}-{}-{nanos}-{n}.{ext}", std::process::id());
        TempFile(std::env::temp_dir().join(name))
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Re-runs the ignored test `child_test` of the current test binary inside a new network
/// namespace (`unshare --net`), with the environment variable `child_env` set to `1`, so
/// that it may reconfigure its own `lo` without disturbing the host. Returns the child's
/// output, or `None` after reporting a skip for `test` (see [`skip`]) when no namespace
/// can be created.
pub fn run_in_new_netns(test: &str, child_test: &str, child_env: &str) -> Option<Output> {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            skip(test, &format!("cannot find the test executable: {e}"));
            return None;
        }
    };
    let mut cmd = Command::new("unshare");
    cmd.arg("--net")
        .arg("--")
        .arg(&exe)
        .args([
            "--exact",
            child_test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(child_env, "1");
    let out = match run(cmd, Duration::from_secs(240)) {
        Ok(out) => out,
        Err(e) => {
            skip(test, &format!("cannot run in a new network namespace: {e}"));
            return None;
        }
    };
    eprintln!("{}", out.stderr.trim_end());
    if out.stderr.contains("unshare failed") || out.stderr.contains("unshare:") {
        skip(test, "no permission to create a network namespace");
        return None;
    }
    Some(out)
}
