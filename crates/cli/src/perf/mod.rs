//! `uroce perf`: perftest-style latency and bandwidth tests between two uroce devices.
//!
//! * `uroce perf --server [--addr IP]` waits for clients on TCP `IP:--oob-port`;
//! * `uroce perf --client SERVER_IP [--addr IP] …` runs the tests against it and prints
//!   the result table;
//! * `uroce perf` with neither runs a **local pair**: it starts this executable twice, as a
//!   server on 127.0.0.2 and a client on 127.0.0.1, and prints the client's table;
//! * `uroce perf --idle-qps N` measures the memory of N idle RC QPs in RTS.
//!
//! The two sides agree on every test over a TCP connection ([`oob`]); the tests
//! themselves are in [`engine`]. With `--counters` the client prints both sides' device
//! and QP counters after each test ([`counters`]).

pub mod counters;
pub mod engine;
// `unsafe` only to map the tool's buffers and register them as a raw range (`--memory raw`).
#[allow(unsafe_code)]
pub mod memory;
pub mod oob;
pub mod pattern;
pub mod plan;
pub mod progress;
pub mod report;
pub mod stats;

use std::fmt;
use std::io::{IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use uroce_net::{NetConfig, NetDevice};
use uroce_verbs::{AccessFlags, QpCap, QpInitAttr, QpType, RcConnect};
use uroce_wire::psn::Psn;

use counters::CounterReport;
use engine::{Resources, Role, Runner};
use memory::MemoryKind;
use oob::{Msg, Oob, OobError, VERSION};
use plan::{Mode, TestKind, TestSpec};
use progress::Progress;
use report::RunResult;

/// Default TCP port of the out-of-band exchange (perftest's).
pub const DEFAULT_OOB_PORT: u16 = 18515;
/// Default address of the local pair's server.
pub const LOCAL_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A comma-separated list of tests (`--test`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestList(pub Vec<TestKind>);

impl FromStr for TestList {
    type Err = String;
    fn from_str(s: &str) -> Result<TestList, String> {
        plan::parse_tests(s).map(TestList)
    }
}

impl fmt::Display for TestList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|t| t.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// A comma-separated list of message sizes (`--size`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeList(pub Vec<u32>);

impl FromStr for SizeList {
    type Err = String;
    fn from_str(s: &str) -> Result<SizeList, String> {
        let v = plan::parse_sizes(s)?;
        if v.is_empty() {
            return Err("empty size list".into());
        }
        Ok(SizeList(v))
    }
}

impl fmt::Display for SizeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v: Vec<String> = self.0.iter().map(u32::to_string).collect();
        f.write_str(&v.join(","))
    }
}

/// Options of `uroce perf`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Without --server or --client, runs a local pair: this program is started twice, as a server \
on 127.0.0.2 (--server-addr) and a client on 127.0.0.1 (--addr), and the client's table is \
printed. Opening a device binds UDP port 4791 on its address; the out-of-band exchange uses \
TCP --oob-port on the server's address.

Latency is one-way (half the round trip) for send_lat and write_lat, the full round trip \
for read_lat and atomic_lat. Bandwidth is in GB/s (10^9 bytes/s).

With --counters, the client prints after each test the counters of its own device and of \
the server's (fetched over the out-of-band connection): one `counters client dev:` / \
`counters server dev:` line with the device's counters, cumulative since it was opened, \
and one `counters SIDE qp 0xQPN:` line per QP of the test; only non-zero counters are \
shown.")]
pub struct PerfArgs {
    /// Run as the server: wait for clients on TCP --addr:--oob-port.
    #[arg(long, conflicts_with = "client")]
    pub server: bool,
    /// Run as a client of the server at PEER_IP.
    #[arg(long, visible_alias = "peer", value_name = "PEER_IP")]
    pub client: Option<IpAddr>,
    /// Local device address; opening the device binds UDP 4791 on it [default: $UROCE_ADDR
    /// or 127.0.0.1]. In a local pair: the client's address.
    #[arg(long, value_name = "IP")]
    pub addr: Option<IpAddr>,
    /// Local pair only: the server's address.
    #[arg(long, value_name = "IP", default_value_t = LOCAL_SERVER)]
    pub server_addr: IpAddr,
    /// TCP port of the out-of-band exchange.
    #[arg(long, default_value_t = DEFAULT_OOB_PORT)]
    pub oob_port: u16,
    /// Tests to run, comma-separated: send_lat, write_lat, read_lat, atomic_lat, send_bw,
    /// write_bw, read_bw, atomic_bw [default: all, plus a 64-byte write_bw row].
    #[arg(long, value_name = "LIST")]
    pub test: Option<TestList>,
    /// Message sizes, comma-separated (e.g. 8,4K,1M) [default: 8 B for latency, 1 MiB for
    /// bandwidth]; atomics are always 8 bytes.
    #[arg(long, value_name = "LIST")]
    pub size: Option<SizeList>,
    /// Iterations per test (messages per QP for bandwidth) [default: 1000 for latency,
    /// 64 MiB / size within 64..=5000 for bandwidth].
    #[arg(long)]
    pub iters: Option<u64>,
    /// QPs used in parallel.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub qps: u32,
    /// Busy polling or completion events.
    #[arg(long, value_enum, default_value_t = Mode::Busy)]
    pub mode: Mode,
    /// Fill every message with a pattern and check everything received, written, read
    /// or fetched; a mismatch fails the run.
    #[arg(long)]
    pub verify: bool,
    /// The memory of this side's regions: `raw`, the tool's own page-aligned mapping
    /// registered as an address range, as a C program registers its memory (uroce copies
    /// payload with plain copies), or `owned`, memory uroce allocates and Rust code may
    /// read concurrently (word-atomic copies). In a local pair: both sides'.
    #[arg(long, value_enum, default_value_t = MemoryKind::Raw)]
    pub memory: MemoryKind,
    /// Send WRs kept outstanding per QP in bandwidth tests.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub tx_depth: u32,
    /// Receives kept posted per QP in send_bw.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub rx_depth: u32,
    /// Also write the results as a JSON array to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write every packet this side's device sends and receives to FILE.pcap (in a local
    /// pair: the client's).
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<PathBuf>,
    /// Instead of tests: create N RC QPs in RTS (towards a dummy peer) and report the
    /// memory each takes.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub idle_qps: Option<u32>,
    /// Seconds any wait (for a completion, the peer, a message) may last without progress.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub timeout: u64,
    /// Server: keep serving clients instead of exiting after the first.
    #[arg(long, requires = "server")]
    pub persistent: bool,
    /// Server: give up if no client connects within this many seconds (0: wait forever).
    #[arg(long, default_value_t = 0)]
    pub accept_timeout: u64,
    /// Never show the progress display.
    #[arg(long)]
    pub no_progress: bool,
    /// After each test, print the device counters (cumulative since the device was
    /// opened) and the per-QP counters of both sides, non-zero ones only; the server's
    /// come over the out-of-band connection. A server prints its own as well.
    #[arg(long)]
    pub counters: bool,
    /// Server: damage READ sources and WRITE / atomic targets on purpose (to test that
    /// --verify catches it).
    #[arg(long, hide = true, requires = "server")]
    pub inject_corruption: bool,
}

impl PerfArgs {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }

    /// The local address: `--addr`, else `$UROCE_ADDR`, else 127.0.0.1.
    fn local_addr(&self) -> Result<IpAddr> {
        default_addr(self.addr)
    }

    /// The test specs of this run, in order.
    pub fn specs(&self) -> Result<Vec<TestSpec>> {
        let tests = self
            .test
            .as_ref()
            .map_or_else(|| plan::STANDARD.to_vec(), |t| t.0.clone());
        let rows = plan::rows(&tests, self.size.as_ref().map(|s| s.0.as_slice()));
        let mut out = Vec::with_capacity(rows.len());
        for (test, size) in rows {
            let iters = self
                .iters
                .unwrap_or_else(|| plan::default_iters(test, size));
            let spec = TestSpec {
                test,
                size,
                iters,
                warmup: plan::default_warmup(test, iters),
                qps: self.qps,
                tx_depth: self.tx_depth,
                rx_depth: self.rx_depth,
                verify: self.verify,
                mode: self.mode,
            };
            spec.validate().map_err(|e| anyhow!(e))?;
            out.push(spec);
        }
        Ok(out)
    }

    /// The command-line options a local pair's client child gets (besides role and
    /// addresses).
    fn plan_args(&self) -> Vec<String> {
        let mut v = vec![
            "--qps".to_string(),
            self.qps.to_string(),
            "--mode".into(),
            self.mode.name().into(),
            "--tx-depth".into(),
            self.tx_depth.to_string(),
            "--rx-depth".into(),
            self.rx_depth.to_string(),
            "--timeout".into(),
            self.timeout.to_string(),
            "--oob-port".into(),
            self.oob_port.to_string(),
            "--memory".into(),
            self.memory.name().into(),
        ];
        if let Some(t) = &self.test {
            v.extend(["--test".into(), t.to_string()]);
        }
        if let Some(s) = &self.size {
            v.extend(["--size".into(), s.to_string()]);
        }
        if let Some(i) = self.iters {
            v.extend(["--iters".into(), i.to_string()]);
        }
        if self.verify {
            v.push("--verify".into());
        }
        if self.no_progress {
            v.push("--no-progress".into());
        }
        if self.counters {
            v.push("--counters".into());
        }
        v
    }
}

/// `addr`, else `$UROCE_ADDR`, else 127.0.0.1.
pub fn default_addr(addr: Option<IpAddr>) -> Result<IpAddr> {
    if let Some(a) = addr {
        return Ok(a);
    }
    match std::env::var(uroce_net::ADDR_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .with_context(|| format!("{}={v:?} is not an IP address", uroce_net::ADDR_ENV)),
        _ => Ok(uroce_net::DEFAULT_ADDR),
    }
}

/// Opens the device on `addr` (binding UDP 4791 there), with an optional capture file; a
/// shared device (a member of the host-wide device on `addr`) unless the environment says
/// `UROCE_SHARED=0` (as `NetConfig::from_env` reads it), so that several perf pairs can
/// run on one address, as every program's device is. The rest of the environment's configuration (faults,
/// ICRC policy) is not applied.
pub fn open_device(addr: IpAddr, capture: Option<PathBuf>) -> Result<NetDevice> {
    let mut cfg = NetConfig::new(addr);
    cfg.capture = capture;
    cfg.shared = NetConfig::from_env().is_ok_and(|c| c.shared);
    NetDevice::open(cfg).with_context(|| {
        format!(
            "opening the device on {addr} (UDP port 4791; is the address local and the port free?)"
        )
    })
}

/// Runs `uroce perf`; returns the process exit status.
pub fn perf_cmd(args: &PerfArgs) -> Result<u8> {
    if let Some(n) = args.idle_qps {
        idle_qps(args, n)?;
        return Ok(0);
    }
    if args.server {
        run_server(args).context("perf server")?;
        return Ok(0);
    }
    if let Some(peer) = args.client {
        let results = run_client(args, peer)?;
        let mut out = std::io::stdout().lock();
        report::write_table(&mut out, &results)?;
        out.flush()?;
        if let Some(path) = &args.json {
            write_json(path, report::to_json(&results))?;
        }
        return Ok(0);
    }
    run_local_pair(args)
}

fn write_json(path: &std::path::Path, mut text: String) -> Result<()> {
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

// ----- client --------------------------------------------------------------------------

/// Runs every test against the server at `peer` and returns the results.
pub fn run_client(args: &PerfArgs, peer: IpAddr) -> Result<Vec<RunResult>> {
    let specs = args.specs()?;
    let addr = args.local_addr()?;
    let dev = open_device(addr, args.capture.clone())?;
    let server = SocketAddr::new(peer, args.oob_port);
    let stream = oob::connect(server, args.timeout())
        .with_context(|| format!("connecting to the perf server at {server}"))?;
    let mut oob = Oob::new(stream, args.timeout())?;
    oob.send(&Msg::Hello {
        version: VERSION,
        mode: args.mode,
    })?;
    match oob.recv()? {
        Msg::Hello { version, .. } if version == VERSION => {}
        Msg::Hello { version, .. } => {
            bail!("the server speaks version {version} of the exchange, this client {VERSION}")
        }
        m => return Err(unexpected("hello", &m)),
    }
    println!(
        "uroce perf: client {} -> server {} (tcp {}), {} mode, {} QP{}{}",
        dev.local_addr().ip(),
        peer,
        args.oob_port,
        args.mode.name(),
        args.qps,
        if args.qps == 1 { "" } else { "s" },
        if args.verify { ", verifying data" } else { "" },
    );
    let show = !args.no_progress && std::io::stderr().is_terminal();
    let mut results = Vec::with_capacity(specs.len());
    for spec in specs {
        let r = client_test(&dev, &mut oob, &spec, show, args.counters, args.memory);
        match r {
            Ok(r) => results.push(r),
            Err(e) => {
                if !is_peer_abort(&e) {
                    oob.abort(&format!("{e:#}"));
                }
                return Err(e.context(format!("{} ({} bytes)", spec.test, spec.size)));
            }
        }
    }
    oob.send(&Msg::Bye)?;
    drop(oob);
    dev.close().context("closing the device")?;
    Ok(results)
}

fn is_peer_abort(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<OobError>(),
            Some(OobError::PeerAborted(_) | OobError::Closed)
        )
    })
}

fn unexpected(expected: &'static str, got: &Msg) -> anyhow::Error {
    OobError::Unexpected {
        expected,
        got: got.name(),
    }
    .into()
}

fn client_test(
    dev: &NetDevice,
    oob: &mut Oob,
    spec: &TestSpec,
    show: bool,
    counters: bool,
    memory: MemoryKind,
) -> Result<RunResult> {
    let mut res = Resources::create(dev, spec, memory)?;
    oob.send(&Msg::Setup {
        spec: spec.clone(),
        qps: res.info(dev),
    })?;
    let peers = match oob.recv()? {
        Msg::Setup { qps, .. } => qps,
        m => return Err(unexpected("setup", &m)),
    };
    res.connect(dev, peers)?;
    let total = match spec.test.kind {
        plan::Kind::Lat => spec.total(),
        plan::Kind::Bw => spec.iters * u64::from(spec.qps),
    };
    let progress = Progress::new(show, spec.test.name().to_string(), total);
    let mut runner = Runner::new(&res, spec, Role::Client, oob, progress);
    runner.prepare()?;
    runner.oob().send(&Msg::Ready)?;
    match runner.oob().recv()? {
        Msg::Ready => {}
        m => return Err(unexpected("ready", &m)),
    }
    let outcome = runner.run()?;
    runner.oob().send(&Msg::Done { error: None })?;
    match runner.oob().recv()? {
        Msg::Done { error: None } => {}
        Msg::Done { error: Some(e) } => bail!("the server's checks failed: {e}"),
        m => return Err(unexpected("done", &m)),
    }
    drop(runner);
    if counters {
        // The test's traffic is over on both sides (the Done barrier); its QPs still exist.
        let mine = CounterReport::take(dev, res.qps.iter().map(|q| q.qp.qp_num()));
        oob.send(&Msg::GetCounters)?;
        let theirs = match oob.recv()? {
            Msg::Counters { report } => report,
            m => return Err(unexpected("counters", &m)),
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "counters after {} {} B:", spec.test, spec.size)?;
        mine.write(&mut out, "client")?;
        theirs.write(&mut out, "server")?;
        out.flush()?;
    }
    let measured = outcome
        .measured
        .ok_or_else(|| anyhow!("{}: nothing was measured", spec.test))?;
    Ok(RunResult {
        spec: spec.clone(),
        measured,
        verified: spec.verify && outcome.checked,
    })
}

// ----- server --------------------------------------------------------------------------

/// Serves clients on `--addr:--oob-port` (one, or many with `--persistent`).
pub fn run_server(args: &PerfArgs) -> Result<()> {
    let addr = args.local_addr()?;
    let dev = open_device(addr, args.capture.clone())?;
    let listen = SocketAddr::new(addr, args.oob_port);
    let listener =
        TcpListener::bind(listen).with_context(|| format!("listening on tcp {listen}"))?;
    listener.set_nonblocking(true)?;
    println!(
        "uroce perf server: device {} on {} (udp {}), waiting on tcp {listen}",
        dev.device().name(),
        dev.local_addr().ip(),
        dev.local_addr().port()
    );
    loop {
        let stream = accept(&listener, args.accept_timeout)?;
        stream.set_nonblocking(false)?;
        let served = serve(&dev, stream, args);
        if let Err(e) = served {
            if !args.persistent {
                return Err(e);
            }
            eprintln!("uroce perf server: client failed: {e:#}");
        }
        if !args.persistent {
            break;
        }
    }
    dev.close().context("closing the device")?;
    Ok(())
}

fn accept(listener: &TcpListener, limit_secs: u64) -> Result<std::net::TcpStream> {
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if limit_secs > 0 && start.elapsed() >= Duration::from_secs(limit_secs) {
                    bail!("no client connected within {limit_secs} s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e).context("accepting a client"),
        }
    }
}

/// One client connection: a sequence of tests until `Bye`.
fn serve(dev: &NetDevice, stream: std::net::TcpStream, args: &PerfArgs) -> Result<()> {
    let mut oob = Oob::new(stream, args.timeout())?;
    match oob.recv()? {
        Msg::Hello { version, mode } if version == VERSION => {
            oob.send(&Msg::Hello { version, mode })?;
        }
        Msg::Hello { version, .. } => {
            let e = format!("this server speaks version {VERSION} of the exchange, not {version}");
            oob.abort(&e);
            bail!(e);
        }
        m => return Err(unexpected("hello", &m)),
    }
    // The counters taken after the last test, for `GetCounters`.
    let mut last: Option<CounterReport> = None;
    loop {
        match oob.recv()? {
            Msg::Setup { spec, qps } => {
                let report = match server_test(
                    dev,
                    &mut oob,
                    &spec,
                    qps,
                    args.inject_corruption,
                    args.memory,
                ) {
                    Ok(r) => r,
                    Err(e) => {
                        if !is_peer_abort(&e) {
                            oob.abort(&format!("{e:#}"));
                        }
                        return Err(e.context(format!("{} ({} bytes)", spec.test, spec.size)));
                    }
                };
                println!(
                    "uroce perf server: {} {} B x{} ({} QP) done",
                    spec.test, spec.size, spec.iters, spec.qps
                );
                if args.counters {
                    let mut out = std::io::stdout().lock();
                    report.write(&mut out, "server")?;
                    out.flush()?;
                }
                last = Some(report);
            }
            Msg::GetCounters => {
                // Before any test: the device's counters now, no QPs.
                let report = last.clone().unwrap_or_else(|| CounterReport::take(dev, []));
                oob.send(&Msg::Counters { report })?;
            }
            Msg::Bye => return Ok(()),
            m => return Err(unexpected("setup, get_counters or bye", &m)),
        }
    }
}

/// Runs one test as the server; returns the counters taken once its traffic was over.
fn server_test(
    dev: &NetDevice,
    oob: &mut Oob,
    spec: &TestSpec,
    peers: Vec<oob::QpInfo>,
    corrupt: bool,
    memory: MemoryKind,
) -> Result<CounterReport> {
    spec.validate().map_err(|e| anyhow!(e))?;
    let mut res = Resources::create(dev, spec, memory)?;
    res.connect(dev, peers)?;
    let info = res.info(dev);
    let mut runner = Runner::new(&res, spec, Role::Server, oob, Progress::hidden());
    if corrupt {
        runner.inject_corruption();
    }
    runner.prepare()?;
    runner.oob().send(&Msg::Setup {
        spec: spec.clone(),
        qps: info,
    })?;
    match runner.oob().recv()? {
        Msg::Ready => {}
        m => return Err(unexpected("ready", &m)),
    }
    runner.oob().send(&Msg::Ready)?;
    runner.run()?;
    // Passive tests last until the client says so; network activity keeps the wait alive.
    let mut seen = 0u64;
    let msg = runner
        .oob()
        .recv_with(|| Runner::activity(dev, &mut seen))?;
    match msg {
        Msg::Done { error: None } => {}
        Msg::Done { error: Some(e) } => bail!("the client failed: {e}"),
        m => return Err(unexpected("done", &m)),
    }
    // The client's Done: the test's traffic is over; the QPs still exist.
    let report = CounterReport::take(dev, res.qps.iter().map(|q| q.qp.qp_num()));
    let checks = runner.final_checks();
    let error = checks.as_ref().err().map(|e| format!("{e:#}"));
    runner.oob().send(&Msg::Done { error })?;
    checks.map(|()| report)
}

// ----- local pair ----------------------------------------------------------------------

/// Runs this executable as server and client on two loopback addresses and returns the
/// exit status to use.
pub fn run_local_pair(args: &PerfArgs) -> Result<u8> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let client_addr = args.local_addr()?;
    let server_addr = args.server_addr;
    if client_addr == server_addr {
        bail!("the local pair needs two addresses (client --addr {client_addr}, --server-addr {server_addr})");
    }
    let timeout = args.timeout.to_string();
    let mut server_cmd = Command::new(&exe);
    server_cmd
        .args(["perf", "--server", "--addr", &server_addr.to_string()])
        .args(["--oob-port", &args.oob_port.to_string()])
        .args(["--timeout", &timeout, "--accept-timeout", &timeout])
        .args(["--memory", args.memory.name()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let mut client_cmd = Command::new(&exe);
    client_cmd
        .args(["perf", "--client", &server_addr.to_string()])
        .args(["--addr", &client_addr.to_string()])
        .args(args.plan_args())
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    if let Some(j) = &args.json {
        client_cmd.arg("--json").arg(j);
    }
    if let Some(c) = &args.capture {
        client_cmd.arg("--capture").arg(c);
    }
    let mut server = Guard(
        server_cmd
            .spawn()
            .with_context(|| format!("starting the server ({})", exe.display()))?,
    );
    let mut client = Guard(client_cmd.spawn().context("starting the client")?);
    // Wait for the client; stop early if the server fails first.
    let client_status: ExitStatus = loop {
        if let Some(s) = client.0.try_wait()? {
            break s;
        }
        if let Some(s) = server.0.try_wait()? {
            if !s.success() {
                // Give the client a moment to report the failure itself.
                let deadline = Instant::now() + Duration::from_secs(2);
                while Instant::now() < deadline && client.0.try_wait()?.is_none() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                bail!("the perf server failed ({s})");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let deadline = Instant::now() + args.timeout() + Duration::from_secs(5);
    let server_status = loop {
        if let Some(s) = server.0.try_wait()? {
            break Some(s);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !client_status.success() {
        return Ok(exit_code(client_status));
    }
    match server_status {
        Some(s) if s.success() => Ok(0),
        Some(s) => bail!("the perf server failed ({s})"),
        None => bail!("the perf server did not exit after the client finished"),
    }
}

fn exit_code(s: ExitStatus) -> u8 {
    s.code()
        .and_then(|c| u8::try_from(c).ok())
        .filter(|&c| c != 0)
        .unwrap_or(1)
}

/// Kills the child on drop if it is still running.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

// ----- idle QPs ------------------------------------------------------------------------

/// Resident memory of this process in bytes (`VmRSS` of `/proc/self/status`).
fn vm_rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| anyhow!("/proc/self/status has no VmRSS"))?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("cannot parse {line:?}"))?;
    Ok(kb * 1024)
}

/// `--idle-qps N`: N RC QPs in RTS towards a dummy peer QP; prints the memory per QP.
fn idle_qps(args: &PerfArgs, n: u32) -> Result<()> {
    let addr = args.local_addr()?;
    let dev = open_device(addr, None)?;
    let ctx = dev.context();
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64, None, 0)?;
    let cap = QpCap {
        max_send_wr: args.tx_depth,
        max_recv_wr: args.rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qps = Vec::with_capacity(n as usize);
    let before = vm_rss()?;
    for i in 0..n {
        let qp = pd.create_qp(&QpInitAttr::new(QpType::Rc, &cq, &cq, cap))?;
        let c = RcConnect {
            access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            path_mtu: dev.device().active_mtu(),
            rq_psn: Psn::new(i),
            sq_psn: Psn::new(i),
            ..RcConnect::new(addr, 0x00f0_0000 + i)
        };
        qp.connect_rc(&c)?;
        qps.push(qp);
    }
    let after = vm_rss()?;
    let grown = after.saturating_sub(before);
    let per_qp = grown / u64::from(n);
    println!(
        "idle_qp_memory: {n} RC QPs in RTS (send queue {}, receive queue {}): VmRSS {} KiB -> {} KiB, {per_qp} bytes per QP",
        args.tx_depth,
        args.rx_depth,
        before / 1024,
        after / 1024
    );
    if let Some(path) = &args.json {
        let v = serde_json::json!([{ "test": "idle_qp_memory", "qps": n, "bytes_per_qp": per_qp }]);
        write_json(path, serde_json::to_string_pretty(&v)?)?;
    }
    drop(qps);
    drop(cq);
    drop(pd);
    dev.close()?;
    Ok(())
}
