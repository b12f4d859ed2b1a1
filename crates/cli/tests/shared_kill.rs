//! A member of a shared device killed with SIGKILL mid-traffic ([M3 3/5]), with unmodified
//! programs: `ibv_rc_pingpong` pairs under `uroce run` (the shared device, the default), one
//! `UROCE_ADDR` (127.0.93.1) for all, a registry (`UROCE_HOST_DIR`) and published counters
//! (`UROCE_STAT_DIR`) of the test's own.
//!
//! Pair A runs a long exchange, pair B one longer than the test; D's server waits idle for
//! its client until the end (a member that outlives the kills: a killed member is reaped
//! by a live one, which pair A may no longer be). The member order of the address's
//! reuseport group is made D server, A server, B server, B client, A client (each process
//! joins when it opens the device), so that killing B's server makes the kernel move A's
//! client into the killed socket's index: A's datagrams go astray until the program is
//! attached again. Then:
//! * B's server is killed mid-traffic (pair A running, asserted): its slot is freed (no
//!   longer a member, in the registry's freed slots, out of the group's order), and the
//!   group's program is attached again, made from the registry after the reap and counted
//!   (`attached` in the registry file, `HostState::attached`);
//! * B's client is killed (if it already failed on its own, retries exhausted, it is a
//!   zombie and the kill changes nothing): the same, once more. Whichever of B's processes
//!   is reaped first, the order after both is the same, so even one reap of both leaves
//!   the group's order certain;
//! * a new pair C completes on the same address, and no QPN it prints is one the killed
//!   processes held (read from their published counters before the kill), nor of their
//!   slots (the QPN's top byte): the registry hands out never-used slots first and keeps
//!   freed ones in quarantine (a registry that handed out the lowest free slot would give
//!   C's server B's server's slot, and its first QPN);
//! * pair A completes with its byte and iteration counts and both GIDs the one address,
//!   and so does pair D.
//!
//! Every wait is bounded. Without the C libraries next to `uroce` or `ibv_rc_pingpong`,
//! the test is skipped (failing under `UROCE_REQUIRE_TOOLS=1`).

use std::collections::BTreeSet;
use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uroce_socket::host::{Attached, HostState, Registry};
use uroce_socket::steer::QpnLayout;
use uroce_testkit::{Output, TempFile};

mod support;
use support::libs_built;
use support::shared::{
    check_pingpong, free_tcp_port, have, listening, shared_run, strings, TestDir,
};

/// How long any one program may run.
const LIMIT: Duration = Duration::from_secs(120);
/// How long the test waits for any one thing to happen.
const WAIT: Duration = Duration::from_secs(30);
/// Pair A's iterations: one or two seconds on an idle machine (far more than the first
/// kill takes, while pair B still shares the cores), half a minute under a loaded test run.
const SURVIVOR_ITERS: u32 = 30_000;
/// Pair B's: more than it can do before the test kills it.
const VICTIM_ITERS: u32 = 100_000_000;
/// Pairs C's and D's.
const NEW_ITERS: u32 = 500;

/// A program under `uroce run` (which executes it in place: same pid), its output in
/// temporary files; killed with SIGKILL if still running when dropped.
struct Proc {
    child: Option<Child>,
    out: TempFile,
    err: TempFile,
    what: String,
}

impl Proc {
    fn start(what: &str, mut cmd: Command) -> Proc {
        let out = TempFile::new("stdout", "txt");
        let err = TempFile::new("stderr", "txt");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(out.path()).expect("stdout file"))
            .stderr(File::create(err.path()).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        Proc {
            child: Some(child),
            out,
            err,
            what: what.to_owned(),
        }
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("a running child")
    }

    fn pid(&mut self) -> u32 {
        self.child().id()
    }

    fn running(&mut self) -> bool {
        matches!(self.child().try_wait(), Ok(None))
    }

    /// SIGKILL (a no-op on a process that has exited but is not waited for yet), then
    /// waits for it.
    fn kill(&mut self) {
        let c = self.child();
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Whether it runs, or how it ended, and its standard error so far.
    fn describe(&mut self) -> String {
        let state = match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => "running".to_owned(),
            Some(Ok(Some(s))) => format!("ended: {s}"),
            Some(Err(e)) => format!("unknown: {e}"),
            None => "waited for".to_owned(),
        };
        format!(
            "{} ({state}): {}",
            self.what,
            read(self.err.path()).trim_end()
        )
    }

    /// Waits (at most `limit`) for the process to end; panics if it does not.
    fn finish(mut self, limit: Duration) -> Output {
        let mut child = self.child.take().expect("a running child");
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} ran longer than {limit:?} and was killed:\n{}",
                    self.what,
                    read(self.out.path())
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            status,
            stdout: read(self.out.path()),
            stderr: read(self.err.path()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn read(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// Polls `f` every 20 ms until it gives a value; `None` after [`WAIT`].
fn poll<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let until = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`poll`], panicking with `what` after [`WAIT`].
fn wait_for<T>(test: &str, what: &str, f: impl FnMut() -> Option<T>) -> T {
    poll(f).unwrap_or_else(|| panic!("{test}: {what}: not within {WAIT:?}"))
}

/// What a process published in `UROCE_STAT_DIR` (`<pid>-<device>-<address>.stat`): its
/// device's `tx_packets` and its QPNs but QP1's (`[qp 0x… TYPE STATE]` sections).
fn published(dir: &Path, pid: u32) -> Option<(u64, Vec<u32>)> {
    let prefix = format!("{pid}-");
    let file = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && n.ends_with(".stat")
        })?;
    let text = std::fs::read_to_string(file.path()).ok()?;
    let tx = text
        .lines()
        .find_map(|l| l.strip_prefix("tx_packets "))
        .and_then(|v| v.parse().ok())?;
    let qpns = text
        .lines()
        .filter_map(|l| l.strip_prefix("[qp 0x"))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|q| u32::from_str_radix(q, 16).ok())
        .filter(|&q| q != 1)
        .collect();
    Some((tx, qpns))
}

/// The QPNs `ibv_rc_pingpong` printed as its own ("local address: … QPN 0x…,").
fn local_qpns(o: &Output) -> Vec<u32> {
    o.stdout
        .lines()
        .filter(|l| l.contains("local address:"))
        .filter_map(|l| l.split("QPN 0x").nth(1))
        .filter_map(|r| r.split(',').next())
        .filter_map(|q| u32::from_str_radix(q.trim(), 16).ok())
        .collect()
}

fn slot_of(state: &HostState, pid: u32) -> Option<u16> {
    state
        .members
        .values()
        .find(|m| m.pid == pid)
        .map(|m| m.slot)
}

struct Test<'a> {
    name: &'static str,
    addr: Ipv4Addr,
    host: &'a TestDir,
    stats: &'a TestDir,
    registry: Registry,
}

impl Test<'_> {
    fn group(&self) -> SocketAddr {
        SocketAddr::from((self.addr, 4791))
    }

    fn state(&self) -> HostState {
        self.registry
            .read()
            .unwrap_or_else(|e| panic!("{}: the registry: {e}", self.name))
    }

    fn attached(&self, state: &HostState) -> Attached {
        state
            .attached
            .get(&self.group())
            .copied()
            .unwrap_or_default()
    }

    /// `ibv_rc_pingpong -g 0 -n iters -p port [addr]` under `uroce run` on the test's
    /// shared device.
    fn pingpong(&self, what: &str, port: u16, iters: u32, client: bool) -> Proc {
        let mut args = strings(&[
            "ibv_rc_pingpong",
            "-g",
            "0",
            "-n",
            &iters.to_string(),
            "-p",
            &port.to_string(),
        ]);
        if client {
            args.push(self.addr.to_string());
        }
        let mut cmd = shared_run(self.addr, self.host, &args);
        cmd.env("UROCE_STAT_DIR", self.stats.path());
        Proc::start(&format!("{} {what}", self.name), cmd)
    }

    /// Starts a server and waits until it is a member and listens on its TCP port.
    fn server(&self, what: &str, port: u16, iters: u32) -> Proc {
        let mut p = self.pingpong(what, port, iters, false);
        let pid = p.pid();
        wait_for(self.name, &format!("{what} listening"), || {
            assert!(p.running(), "{}: {what} ended early", self.name);
            (listening(port) && slot_of(&self.state(), pid).is_some()).then_some(())
        });
        p
    }

    /// Starts a client and waits until it is a member.
    fn client(&self, what: &str, port: u16, iters: u32) -> Proc {
        let mut p = self.pingpong(what, port, iters, true);
        let pid = p.pid();
        wait_for(self.name, &format!("{what} joined"), || {
            assert!(p.running(), "{}: {what} ended early", self.name);
            slot_of(&self.state(), pid).map(|_| ())
        });
        p
    }

    /// Kills `victim` (slot `slot`) and waits until its slot is freed and the group has a
    /// program made from the registry as it was after that (or later), counted (unless
    /// the slot was freed already in `since`, the registry before the kill: a process that
    /// ended on its own, reaped with an earlier one); returns the registry then.
    fn kill_and_reattach(
        &self,
        what: &str,
        victim: &mut Proc,
        slot: u16,
        since: &HostState,
        others: &mut [&mut Proc],
    ) -> HostState {
        let counted = !since.members.contains_key(&slot);
        let before = self.attached(since);
        victim.kill();
        let mut stuck = |why: String| -> ! {
            let others: Vec<String> = others.iter_mut().map(|p| p.describe()).collect();
            panic!(
                "{}: {why}: not within {WAIT:?}\nregistry: {:?}\n{}",
                self.name,
                self.state(),
                others.join("\n")
            )
        };
        let freed = poll(|| {
            let s = self.state();
            (!s.members.contains_key(&slot) && s.freed.contains_key(&slot)).then_some(s)
        })
        .unwrap_or_else(|| stuck(format!("{what}'s slot {slot} freed")));
        poll(|| {
            let s = self.state();
            let a = self.attached(&s);
            (a.generation >= freed.generation && (counted || a.count > before.count)).then_some(s)
        })
        .unwrap_or_else(|| {
            stuck(format!(
                "a program of generation {} or later attached after {what} was killed",
                freed.generation
            ))
        })
    }
}

#[test]
fn killed_member_frees_its_qpns_and_spares_the_others_traffic() {
    let name = "killed_member_frees_its_qpns_and_spares_the_others_traffic";
    if !libs_built(name) || !have(name, "/usr/bin/ibv_rc_pingpong", "ibverbs-utils") {
        return;
    }
    let host = TestDir::new("hostdir");
    let stats = TestDir::new("statdir");
    let t = Test {
        name,
        addr: Ipv4Addr::new(127, 0, 93, 1),
        host: &host,
        stats: &stats,
        registry: Registry::open(host.path(), QpnLayout::default()).expect("the registry"),
    };
    let layout = QpnLayout::default();
    let start = Instant::now();

    // Join order: D server (idle until the end: a member that outlives the kills and
    // reaps, whenever pair A ends), A server, B server, B client, A client.
    let (port_a, port_b, port_d) = (free_tcp_port(), free_tcp_port(), free_tcp_port());
    let d_server = t.server("D server", port_d, NEW_ITERS);
    let mut a_server = t.server("A server", port_a, SURVIVOR_ITERS);
    let mut b_server = t.server("B server", port_b, VICTIM_ITERS);
    let mut b_client = t.client("B client", port_b, VICTIM_ITERS);
    let mut a_client = t.client("A client", port_a, SURVIVOR_ITERS);
    let mut d_server = d_server;
    let pids = [
        d_server.pid(),
        a_server.pid(),
        b_server.pid(),
        b_client.pid(),
        a_client.pid(),
    ];

    // Mid-traffic: pairs A and B have published packets sent and their RC QPs.
    let mut held = BTreeSet::new();
    for (i, &pid) in pids.iter().enumerate().skip(1) {
        let qpns = wait_for(name, &format!("traffic of process {pid}"), || {
            published(stats.path(), pid)
                .and_then(|(tx, qpns)| (tx >= 100 && !qpns.is_empty()).then_some(qpns))
        });
        if i == 2 || i == 3 {
            held.extend(qpns);
        }
    }
    let before = t.state();
    let slots: Vec<u16> = pids
        .iter()
        .map(|&pid| {
            slot_of(&before, pid)
                .unwrap_or_else(|| panic!("{name}: process {pid} is no member:\n{before:?}"))
        })
        .collect();
    assert_eq!(
        before.groups[&t.group()].order.slots(),
        slots.as_slice(),
        "{name}: the group's order is not the join order"
    );
    let killed_slots = [slots[2], slots[3]];
    for &q in &held {
        assert!(
            killed_slots.contains(&layout.slot_of(q)),
            "{name}: QPN {q:#x} of pair B is not of its slots {killed_slots:?}"
        );
    }
    // The kernel has the program of the latest generation (the last join's).
    let a0 = t.attached(&before);
    assert_eq!(a0.generation, before.generation, "{name}: {before:?}");
    assert!(
        a_server.running() && a_client.running(),
        "{name}: pair A finished before the kill (raise SURVIVOR_ITERS)"
    );

    let after_server = t.kill_and_reattach(
        "B server",
        &mut b_server,
        slots[2],
        &before,
        &mut [&mut d_server, &mut a_server, &mut a_client, &mut b_client],
    );
    let a1 = t.attached(&after_server);
    eprintln!(
        "{name}: {:.2} s: B server killed, pair A running: {}; attached {a0:?} -> {a1:?}",
        start.elapsed().as_secs_f64(),
        a_server.running() && a_client.running()
    );
    let after_client = t.kill_and_reattach(
        "B client",
        &mut b_client,
        slots[3],
        &after_server,
        &mut [&mut d_server, &mut a_server, &mut a_client],
    );
    eprintln!(
        "{name}: {:.2} s: B client killed, pair A running: {}; attached -> {:?}",
        start.elapsed().as_secs_f64(),
        a_server.running() && a_client.running(),
        t.attached(&after_client)
    );
    for (s, killed) in [
        (&after_server, &killed_slots[..1]),
        (&after_client, &killed_slots[..]),
    ] {
        let order = s.groups[&t.group()].order.slots();
        assert!(
            !order.iter().any(|o| killed.contains(o)),
            "{name}: a killed slot ({killed:?}) is still in the group: {s:?}"
        );
    }

    // A new pair on the same address, while A may still run.
    let port_c = free_tcp_port();
    let c_server = t.server("C server", port_c, NEW_ITERS);
    let c_client = t.client("C client", port_c, NEW_ITERS);
    let c_client = c_client.finish(LIMIT);
    let c_server = c_server.finish(LIMIT);
    check_pingpong(name, "C server", &c_server, t.addr, NEW_ITERS);
    check_pingpong(name, "C client", &c_client, t.addr, NEW_ITERS);
    for (who, o) in [("C server", &c_server), ("C client", &c_client)] {
        let qpns = local_qpns(o);
        assert_eq!(qpns.len(), 1, "{name} {who}: no local QPN:\n{}", o.stdout);
        for q in qpns {
            assert!(
                !held.contains(&q) && !killed_slots.contains(&layout.slot_of(q)),
                "{name} {who}: QPN {q:#x} was the killed processes' (QPNs {held:x?}, slots \
                 {killed_slots:?})"
            );
        }
    }

    // Pair A completes, unaffected; D's server, idle through it all, gets its client.
    let a_client = a_client.finish(LIMIT);
    let a_server = a_server.finish(LIMIT);
    check_pingpong(name, "A server", &a_server, t.addr, SURVIVOR_ITERS);
    check_pingpong(name, "A client", &a_client, t.addr, SURVIVOR_ITERS);
    let d_client = t.client("D client", port_d, NEW_ITERS).finish(LIMIT);
    let d_server = d_server.finish(LIMIT);
    check_pingpong(name, "D server", &d_server, t.addr, NEW_ITERS);
    check_pingpong(name, "D client", &d_client, t.addr, NEW_ITERS);
    eprintln!("{name}: {:.2} s: done", start.elapsed().as_secs_f64());
}
