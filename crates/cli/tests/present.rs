//! `uroce run` presents the device outside the library: `/sys/class/infiniband/uroce0`,
//! `/sys/class/infiniband_verbs/uverbs0` and `/dev/infiniband/uverbs0`, read by unmodified
//! programs (`cat`, `ls`, `stat`, ibverbs-utils, a C program calling `ibv_get_sysfs_path`),
//! agreeing with what the library reports; and where the kernel refuses a user namespace,
//! the program still runs, after one line on stderr that says why.
//!
//! The presentation needs unprivileged user namespaces: where the kernel refuses them the
//! tests are skipped with that reason (failing under `UROCE_REQUIRE_TOOLS=1`), as they are
//! without the C libraries next to `uroce` or without ibverbs-utils / gcc. Each test uses
//! its own `UROCE_ADDR`, so they run in parallel with each other and with `run.rs`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use uroce_testkit::{run, skip, Output};

mod support;
use support::libs_built;

const UROCE: &str = env!("CARGO_BIN_EXE_uroce");
const LIMIT: Duration = Duration::from_secs(60);
const REFUSED: &str = "uroce run: running without /sys/class/infiniband";

fn uroce_run(addr: &str, args: &[&str]) -> Command {
    let mut c = Command::new(UROCE);
    c.arg("run")
        .arg("--")
        .args(args)
        .env("UROCE_ADDR", addr)
        .env_remove("UROCE_PRESENT")
        .env_remove("SYSFS_PATH")
        .env_remove("UROCE_FAULTS");
    c
}

fn sh(addr: &str, script: &str) -> Output {
    let o = run(uroce_run(addr, &["sh", "-c", script]), LIMIT).expect("uroce run sh");
    assert!(
        o.status.success(),
        "{script}: {:?}\n{}\n{}",
        o.status,
        o.stdout,
        o.stderr
    );
    o
}

/// Whether the kernel lets `uroce run` present the tree here (else the test is skipped).
fn presentable(test: &str) -> bool {
    if !libs_built(test) {
        return false;
    }
    let o = sh("127.0.42.1", "true");
    if let Some(line) = o.stderr.lines().find(|l| l.starts_with(REFUSED)) {
        skip(
            test,
            &format!("no unprivileged user namespaces here: {line}"),
        );
        return false;
    }
    true
}

fn have(test: &str, program: &str) -> bool {
    if Path::new(program).exists() {
        return true;
    }
    skip(test, &format!("{program} is missing"));
    false
}

/// The `field:` value of `ibv_devinfo -v` output.
fn devinfo_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

#[test]
fn the_tree_is_there_and_agrees_with_the_library() {
    let test = "the_tree_is_there_and_agrees_with_the_library";
    if !presentable(test) || !have(test, "/usr/bin/ibv_devinfo") {
        return;
    }
    let addr = "127.0.42.2";
    let d = "/sys/class/infiniband/uroce0";
    let o = sh(
        addr,
        &format!(
            "ls /sys/class/infiniband; ls {d}/device/net; cat {d}/node_type {d}/node_guid \
             {d}/ports/1/state {d}/ports/1/link_layer {d}/ports/1/gid_attrs/types/0 \
             {d}/ports/1/gid_attrs/ndevs/0 {d}/ports/1/gids/0 \
             /sys/class/infiniband_verbs/uverbs0/ibdev; stat -c %F /dev/infiniband/uverbs0; \
             ls /sys/class/net >/dev/null && echo net-class-kept"
        ),
    );
    let lines: Vec<&str> = o.stdout.lines().collect();
    let guid = lines.get(3).copied().unwrap_or_default();
    assert!(
        guid.len() == 19 && guid.split(':').all(|g| g.len() == 4),
        "node_guid {guid:?}"
    );
    assert_eq!(
        lines,
        [
            "uroce0",
            "lo",
            "1: CA",
            lines[3],
            "4: ACTIVE",
            "Ethernet",
            "RoCE v2",
            "lo",
            "0000:0000:0000:0000:0000:ffff:7f00:2a02",
            "uroce0",
            "character special file",
            "net-class-kept",
        ],
        "{}",
        o.stderr
    );

    // The library agrees: ibv_devinfo reads the node GUID and GID through the verbs and
    // the board id through ibv_read_sysfs_file(ibdev_path, "board_id").
    let o = run(uroce_run(addr, &["ibv_devinfo", "-v"]), LIMIT).expect("ibv_devinfo");
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    assert_eq!(devinfo_field(&o.stdout, "node_guid"), Some(guid));
    assert_eq!(devinfo_field(&o.stdout, "board_id"), Some("uroce"));
    assert!(
        o.stdout.contains("GID[  0]:\t\t::ffff:127.0.42.2"),
        "{}",
        o.stdout
    );
    let o = run(uroce_run(addr, &["ibv_devices"]), LIMIT).expect("ibv_devices");
    assert!(
        o.stdout.contains("uroce0") && o.stdout.contains(&guid.replace(':', "")),
        "{}",
        o.stdout
    );
}

#[test]
fn the_gid_file_follows_the_address_the_device_took() {
    let test = "the_gid_file_follows_the_address_the_device_took";
    if !presentable(test) || !have(test, "/usr/bin/ibv_devinfo") {
        return;
    }
    // The runner writes the address it expects; the library rewrites it at open. Here the
    // runner's guess is made wrong on purpose by editing the file before the device opens.
    let g = "/sys/class/infiniband/uroce0/ports/1/gids/0";
    let o = sh(
        "127.0.42.3",
        &format!(
            "echo 0000:0000:0000:0000:0000:0000:0000:0000 > {g}; ibv_devinfo >/dev/null; cat {g}"
        ),
    );
    assert_eq!(
        o.stdout.trim(),
        "0000:0000:0000:0000:0000:ffff:7f00:2a03",
        "{}",
        o.stderr
    );
}

#[test]
fn a_c_program_finds_its_device_under_ibv_get_sysfs_path() {
    let test = "a_c_program_finds_its_device_under_ibv_get_sysfs_path";
    if !presentable(test) || !have(test, "/usr/bin/gcc") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("uroce-present-c-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("sysfs.c");
    let exe = dir.join("sysfs");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <unistd.h>
#include <infiniband/verbs.h>
/* Exported by libibverbs.so.1 (IBVERBS_1.0); declared in rdma-core's driver header. */
extern const char *ibv_get_sysfs_path(void);
int main(void) {
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    printf("sysfs=%s\n", ibv_get_sysfs_path());
    for (int i = 0; l && i < n; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/node_guid", l[i]->ibdev_path);
        printf("%s %s %s %s %s\n", l[i]->name, l[i]->dev_name, l[i]->ibdev_path,
               access(p, R_OK) == 0 ? "readable" : "missing",
               access(l[i]->dev_path, F_OK) == 0 ? "uverbs" : "no-uverbs");
    }
    if (l) ibv_free_device_list(l);
    return 0;
}
"#,
    )
    .expect("write C source");
    let mut cc = Command::new("gcc");
    cc.arg("-o").arg(&exe).arg(&src).arg("-libverbs");
    let o = run(cc, LIMIT).expect("gcc");
    if !o.status.success() {
        skip(
            test,
            &format!(
                "cannot build against <infiniband/verbs.h> (libibverbs-dev): {}",
                o.stderr
            ),
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let exe = exe.to_string_lossy().into_owned();
    let o = run(uroce_run("127.0.42.4", &[&exe]), LIMIT).expect("C program");
    assert_eq!(
        o.stdout, "sysfs=/sys\nuroce0 uverbs0 /sys/class/infiniband/uroce0 readable uverbs\n",
        "{}",
        o.stderr
    );
    // SYSFS_PATH is honoured with its trailing slashes removed; the device's paths follow.
    let mut c = uroce_run("127.0.42.4", &[&exe]);
    c.env("SYSFS_PATH", "/sys///");
    let o = run(c, LIMIT).expect("C program");
    assert!(o.stdout.starts_with("sysfs=/sys\n"), "{}", o.stdout);
    let mut c = uroce_run("127.0.42.4", &[&exe]);
    c.env("SYSFS_PATH", "/nonexistent/");
    let o = run(c, LIMIT).expect("C program");
    assert_eq!(
        o.stdout,
        "sysfs=/nonexistent\nuroce0 uverbs0 /nonexistent/class/infiniband/uroce0 missing \
         no-uverbs\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_user_namespaces_the_program_runs_and_one_line_says_why() {
    let test = "without_user_namespaces_the_program_runs_and_one_line_says_why";
    if !presentable(test) || !have(test, "/usr/bin/unshare") {
        return;
    }
    // A user namespace of our own in which no further user namespace may be made (the
    // limit is per namespace): the runner inside it must fall back.
    let mut c = Command::new("unshare");
    c.args(["-Ur", "sh", "-c"])
        .arg(format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && exec {UROCE} run -- sh -c \
             'test -e /sys/class/infiniband/uroce0 && echo presented; echo ran'"
        ))
        .env("UROCE_ADDR", "127.0.42.5")
        .env_remove("UROCE_PRESENT");
    let o = run(c, LIMIT).expect("unshare");
    assert!(
        o.status.success(),
        "{:?}\n{}\n{}",
        o.status,
        o.stdout,
        o.stderr
    );
    assert_eq!(o.stdout, "ran\n", "{}", o.stderr);
    let lines: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.starts_with("uroce"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", o.stderr);
    assert!(
        lines[0].starts_with(REFUSED) && lines[0].contains("user.max_user_namespaces=0"),
        "{}",
        lines[0]
    );

    // UROCE_PRESENT=0: no presentation and no message.
    let mut c = uroce_run("127.0.42.5", &["sh", "-c", "echo ${UROCE_PRESENTED:-off}"]);
    c.env("UROCE_PRESENT", "0");
    let o = run(c, LIMIT).expect("uroce run");
    assert_eq!(o.stdout, "off\n");
    assert!(!o.stderr.contains(REFUSED), "{}", o.stderr);
}

#[test]
fn an_unprivileged_user_gets_the_tree_too() {
    let test = "an_unprivileged_user_gets_the_tree_too";
    if !presentable(test) || !have(test, "/usr/bin/setpriv") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // The other tests already ran unprivileged.
        return;
    }
    // nobody may not reach the build directory (a clone under root's home or `mktemp -d`
    // is closed to other users): stage `uroce` and the two libraries beside it in a
    // directory everyone can read, as an installation would be.
    let staged = Path::new("/tmp").join(format!("uroce-nobody-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged).expect("staging directory");
    let built = Path::new(UROCE).parent().expect("uroce's directory");
    for f in ["uroce", "liburoce_ffi.so", "liburoce_ffi_rdmacm.so"] {
        std::fs::copy(built.join(f), staged.join(f)).expect("staging copy");
    }
    use std::os::unix::fs::PermissionsExt as _;
    for p in [staged.clone(), staged.join("uroce")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let staged_uroce = staged.join("uroce");
    // From root, drop to nobody (65534) with no capabilities, as a user on the host runs.
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&staged_uroce)
        .args(["run", "--"])
        .args([
            "sh",
            "-c",
            "id -u; ls /sys/class/infiniband/uroce0/device/net; test -c /dev/infiniband/uverbs0 && echo dev",
        ])
        .env("UROCE_ADDR", "127.0.42.6")
        .env("TMPDIR", "/tmp")
        .env_remove("UROCE_PRESENT");
    let o = run(c, LIMIT).expect("setpriv");
    let _ = std::fs::remove_dir_all(&staged);
    if o.stderr.contains("Permission denied") && !o.status.success() {
        skip(
            test,
            &format!("nobody cannot run {}: {}", staged_uroce.display(), o.stderr),
        );
        return;
    }
    assert_eq!(o.stdout, "65534\nlo\ndev\n", "{:?}\n{}", o.status, o.stderr);
}

#[test]
fn uroce_netns_gives_a_network_namespace_with_lo_up() {
    let test = "uroce_netns_gives_a_network_namespace_with_lo_up";
    if !presentable(test) {
        return;
    }
    // /proc/net/dev lists the interfaces of the caller's network namespace.
    let script = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; \
                  cat /sys/class/infiniband/uroce0/ports/1/gid_attrs/ndevs/0";
    let mut c = uroce_run("127.0.0.1", &["sh", "-c", script]);
    c.env("UROCE_NETNS", "1");
    let o = run(c, LIMIT).expect("uroce run");
    assert!(o.status.success(), "{}", o.stderr);
    assert_eq!(o.stdout, "lo\nlo\n", "{}", o.stderr);
    // A device opens at 127.0.0.1 there, whatever the host's 127.0.0.1 holds: the address
    // exists only once lo is up.
    if Path::new("/usr/bin/ibv_devinfo").exists() {
        let mut c = uroce_run("127.0.0.1", &["ibv_devinfo"]);
        c.env("UROCE_NETNS", "1");
        let o = run(c, LIMIT).expect("ibv_devinfo");
        assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    }
}

#[test]
fn concurrent_first_runs_all_get_the_tree() {
    let test = "concurrent_first_runs_all_get_the_tree";
    if !presentable(test) {
        return;
    }
    // Runs that start together where no run has yet made the directory of library links
    // (a fresh TMPDIR each round) must all present the tree: none may remove the directory
    // another has just made and is staging its presentation in.
    const ROUNDS: usize = 8;
    const RUNS: u8 = 8;
    let base = std::env::temp_dir().join(format!("uroce-present-race-{}", std::process::id()));
    let mut refused = Vec::new();
    for round in 0..ROUNDS {
        let tmp = base.join(round.to_string());
        std::fs::create_dir_all(&tmp).expect("temp dir");
        let runs: Vec<_> = (0..RUNS)
            .map(|i| {
                let mut c = uroce_run(&format!("127.0.43.{}", i + 1), &["true"]);
                c.env("TMPDIR", &tmp);
                std::thread::spawn(move || run(c, LIMIT).expect("uroce run true"))
            })
            .collect();
        for r in runs {
            let o = r.join().expect("runner thread");
            assert!(o.status.success(), "{:?}\n{}", o.status, o.stderr);
            refused.extend(
                o.stderr
                    .lines()
                    .filter(|l| l.starts_with(REFUSED))
                    .map(|l| format!("round {round}: {l}")),
            );
        }
    }
    let _ = std::fs::remove_dir_all(&base);
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}

#[test]
fn programs_of_one_user_share_a_user_namespace_and_can_read_each_other() {
    let test = "programs_of_one_user_share_a_user_namespace_and_can_read_each_other";
    if !presentable(test) {
        return;
    }
    use std::io::{BufRead as _, BufReader};
    use std::process::Stdio;
    // Program A prints its pid and user namespace, then waits. Program B, started by
    // another `uroce run`, reads A's environment through /proc: the kernel allows that (as
    // it allows `process_vm_readv`, which UCX's shared-memory transport uses between two
    // processes of one host) only from the same user namespace.
    let mut a = uroce_run(
        "127.0.42.7",
        &[
            "sh",
            "-c",
            "echo $$; readlink /proc/self/ns/user; exec sleep 20",
        ],
    );
    a.env("UROCE_SHARED_NS_MARK", "a-was-here")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut a = a.spawn().expect("uroce run A");
    let mut lines = BufReader::new(a.stdout.take().expect("A's stdout")).lines();
    let pid = lines.next().and_then(Result::ok).unwrap_or_default();
    let a_ns = lines.next().and_then(Result::ok).unwrap_or_default();
    let script = format!(
        "readlink /proc/self/ns/user; tr '\\0' '\\n' < /proc/{pid}/environ | grep '^UROCE_SHARED_NS_MARK='"
    );
    let b = run(uroce_run("127.0.42.8", &["sh", "-c", &script]), LIMIT).expect("uroce run B");
    let _ = a.kill();
    let _ = a.wait();
    assert!(a_ns.starts_with("user:["), "A printed {pid:?} {a_ns:?}");
    assert_eq!(
        b.stdout,
        format!("{a_ns}\nUROCE_SHARED_NS_MARK=a-was-here\n"),
        "{:?}\n{}",
        b.status,
        b.stderr
    );
}
