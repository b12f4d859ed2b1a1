//! Raw UDP floor of the machine: what plain kernel UDP sockets achieve on loopback, one process
//! per side, with nothing of uroce in the path. `scripts/bench` compares uroce against it.
//!
//! ```text
//! udp_pingpong server --addr 127.0.0.1:19000 [--mode busy|block] [--idle-timeout-s 10]
//! udp_pingpong client --addr 127.0.0.1:19000 [--bind 127.0.0.1:0] [--test pingpong|stream]
//!                     [--mode busy|block] [--size 64] [--iters 20000] [--warmup 1000]
//! ```
//!
//! * `pingpong`: the client sends one datagram of `--size` bytes, the server echoes it, the
//!   client waits for the echo; it prints the one-way latency (half the round trip) in
//!   microseconds: median, average, p99, min and max over `--iters` round trips that follow
//!   `--warmup` untimed ones.
//! * `stream`: the client sends `--iters` datagrams of `--size` bytes, one per `send` call,
//!   as fast as it can; the server counts what arrives and reports its receive rate (bytes
//!   received after the first datagram, divided by the time from the first to the last one).
//! * `--mode busy` polls a non-blocking socket (spinning on `WouldBlock`); `--mode block`
//!   sleeps in a blocking `recv`.
//!
//! The client prints one line that starts with `RESULT ` followed by `key=value` pairs, for
//! scripts. Only loopback addresses are accepted. Every loop is bounded: by the iteration
//! count, by an idle timeout on the server and by a per-datagram timeout on the client.
//!
//! Datagram layout: byte 0 is a tag (`P` ping, `S` stream data, `E` end of stream, `Q` quit);
//! bytes 1..5 carry a little-endian sequence number when the datagram is long enough.

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Tag of a ping-pong datagram: the server echoes it back unchanged.
const TAG_PING: u8 = b'P';
/// Tag of a stream datagram: the server counts it.
const TAG_STREAM: u8 = b'S';
/// Tag of the end-of-stream marker: the server answers with a report and resets its counters.
const TAG_END: u8 = b'E';
/// Tag of the quit request: the server exits.
const TAG_QUIT: u8 = b'Q';
/// Tag of the server's stream report (text `R <datagrams> <bytes> <nanoseconds>`).
const TAG_REPORT: u8 = b'R';

/// Largest UDP payload over IPv4.
const MAX_DATAGRAM: usize = 65_507;
/// Smallest datagram: tag plus a 32-bit sequence number.
const MIN_SIZE: usize = 5;
/// Upper bound on iterations, so that a typo cannot make a run endless.
const MAX_ITERS: u64 = 100_000_000;
/// How long the client waits for one echo or report before it gives up.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// Spins between two clock reads while busy polling.
const SPINS_PER_CLOCK_CHECK: u32 = 1024;

/// How a socket waits for the next datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Non-blocking socket, spin on `WouldBlock`.
    Busy,
    /// Blocking socket with a read timeout.
    Block,
}

/// What the client measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    /// Round-trip latency.
    PingPong,
    /// One-way datagram throughput.
    Stream,
}

/// Parsed command line.
#[derive(Debug, Clone)]
struct Args {
    role: String,
    addr: SocketAddr,
    bind: SocketAddr,
    mode: Mode,
    test: Test,
    size: usize,
    iters: u64,
    warmup: u64,
    idle_timeout: Duration,
}

/// Why a run failed.
#[derive(Debug)]
enum Error {
    /// The command line was wrong.
    Usage(String),
    /// A socket call failed.
    Io(&'static str, std::io::Error),
    /// Nothing arrived within the allowed time.
    Timeout(&'static str),
    /// A datagram did not look like what the protocol allows.
    Protocol(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Usage(m) => write!(f, "usage error: {m}"),
            Error::Io(what, e) => write!(f, "{what}: {e}"),
            Error::Timeout(what) => write!(f, "timed out waiting for {what}"),
            Error::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

const USAGE: &str = "usage: udp_pingpong server --addr IP:PORT [--mode busy|block] [--idle-timeout-s S]\n       udp_pingpong client --addr IP:PORT [--bind IP:PORT] [--test pingpong|stream] [--mode busy|block] [--size N] [--iters N] [--warmup N]";

fn parse_args(argv: &[String]) -> Result<Args, Error> {
    let role = argv
        .first()
        .cloned()
        .ok_or_else(|| Error::Usage("missing role (server or client)".into()))?;
    if role != "server" && role != "client" {
        return Err(Error::Usage(format!("unknown role {role:?}")));
    }
    let mut args = Args {
        role,
        addr: SocketAddr::from(([127, 0, 0, 1], 19000)),
        bind: SocketAddr::from(([127, 0, 0, 1], 0)),
        mode: Mode::Busy,
        test: Test::PingPong,
        size: 64,
        iters: 20_000,
        warmup: 1_000,
        idle_timeout: Duration::from_secs(10),
    };
    let mut rest = argv.iter().skip(1);
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| Error::Usage(format!("{flag} needs a value")))?;
        let bad = |what: &str| Error::Usage(format!("{flag}: {what}: {value:?}"));
        match flag.as_str() {
            "--addr" => args.addr = value.parse().map_err(|_| bad("not IP:PORT"))?,
            "--bind" => args.bind = value.parse().map_err(|_| bad("not IP:PORT"))?,
            "--mode" => {
                args.mode = match value.as_str() {
                    "busy" => Mode::Busy,
                    "block" => Mode::Block,
                    _ => return Err(bad("expected busy or block")),
                }
            }
            "--test" => {
                args.test = match value.as_str() {
                    "pingpong" => Test::PingPong,
                    "stream" => Test::Stream,
                    _ => return Err(bad("expected pingpong or stream")),
                }
            }
            "--size" => args.size = value.parse().map_err(|_| bad("not a number"))?,
            "--iters" => args.iters = value.parse().map_err(|_| bad("not a number"))?,
            "--warmup" => args.warmup = value.parse().map_err(|_| bad("not a number"))?,
            "--idle-timeout-s" => {
                let secs: u64 = value.parse().map_err(|_| bad("not a number"))?;
                args.idle_timeout = Duration::from_secs(secs.clamp(1, 3600));
            }
            _ => return Err(Error::Usage(format!("unknown option {flag}"))),
        }
    }
    if !args.addr.ip().is_loopback() || !args.bind.ip().is_loopback() {
        return Err(Error::Usage("only loopback addresses are allowed".into()));
    }
    if !(MIN_SIZE..=MAX_DATAGRAM).contains(&args.size) {
        return Err(Error::Usage(format!(
            "--size must be within {MIN_SIZE}..={MAX_DATAGRAM}"
        )));
    }
    if args.iters == 0 || args.iters > MAX_ITERS || args.warmup > MAX_ITERS {
        return Err(Error::Usage(format!(
            "--iters must be within 1..={MAX_ITERS}, --warmup at most {MAX_ITERS}"
        )));
    }
    Ok(args)
}

/// A socket that waits for datagrams the way `Mode` says.
struct Socket {
    sock: UdpSocket,
    mode: Mode,
}

impl Socket {
    fn bind(addr: SocketAddr, mode: Mode) -> Result<Socket, Error> {
        let sock = UdpSocket::bind(addr).map_err(|e| Error::Io("bind", e))?;
        sock.set_nonblocking(mode == Mode::Busy)
            .map_err(|e| Error::Io("set_nonblocking", e))?;
        Ok(Socket { sock, mode })
    }

    /// Receives one datagram, waiting at most `timeout`; `Ok(None)` when nothing came.
    fn recv_from(
        &self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> Result<Option<(usize, SocketAddr)>, Error> {
        match self.mode {
            Mode::Block => {
                self.sock
                    .set_read_timeout(Some(timeout))
                    .map_err(|e| Error::Io("set_read_timeout", e))?;
                match self.sock.recv_from(buf) {
                    Ok(got) => Ok(Some(got)),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        Ok(None)
                    }
                    Err(e) => Err(Error::Io("recv_from", e)),
                }
            }
            Mode::Busy => {
                let start = Instant::now();
                // Bounded: the clock is read every SPINS_PER_CLOCK_CHECK spins and the loop
                // ends once `timeout` has passed.
                loop {
                    for _ in 0..SPINS_PER_CLOCK_CHECK {
                        match self.sock.recv_from(buf) {
                            Ok(got) => return Ok(Some(got)),
                            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                            Err(e) if e.kind() == ErrorKind::Interrupted => {}
                            Err(e) => return Err(Error::Io("recv_from", e)),
                        }
                    }
                    if start.elapsed() >= timeout {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Sends one datagram; in busy mode a full send buffer is retried (bounded by the client
    /// timeout).
    fn send_to(&self, buf: &[u8], to: SocketAddr) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            match self.sock.send_to(buf, to) {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                    if start.elapsed() >= CLIENT_TIMEOUT {
                        return Err(Error::Timeout("send buffer space"));
                    }
                    std::hint::spin_loop();
                }
                Err(e) => return Err(Error::Io("send_to", e)),
            }
        }
    }
}

fn write_seq(buf: &mut [u8], tag: u8, seq: u32) {
    if let Some(first) = buf.first_mut() {
        *first = tag;
    }
    if let Some(slot) = buf.get_mut(1..5) {
        slot.copy_from_slice(&seq.to_le_bytes());
    }
}

fn read_seq(buf: &[u8]) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(1..5)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

/// Echo / count datagrams until a quit request or `idle_timeout` without traffic.
fn run_server(args: &Args) -> Result<(), Error> {
    let sock = Socket::bind(args.addr, args.mode)?;
    let mut buf = vec![0u8; MAX_DATAGRAM + 1];
    let mut stream_count: u64 = 0;
    let mut stream_bytes: u64 = 0;
    let mut stream_first: Option<Instant> = None;
    let mut stream_last = Instant::now();
    eprintln!("udp_pingpong server listening on {}", args.addr);
    // Bounded: every iteration consumes one datagram or ends the loop on idle timeout, and the
    // datagram count is capped.
    for _ in 0..(4 * MAX_ITERS) {
        let Some((n, from)) = sock.recv_from(&mut buf, args.idle_timeout)? else {
            return Err(Error::Timeout("the next datagram (server idle)"));
        };
        let datagram = buf.get(..n).unwrap_or(&[]);
        match datagram.first().copied() {
            Some(TAG_PING) => sock.send_to(datagram, from)?,
            Some(TAG_STREAM) => {
                let now = Instant::now();
                if stream_first.is_none() {
                    stream_first = Some(now);
                } else {
                    // The first datagram starts the clock; count what follows it.
                    stream_count += 1;
                    stream_bytes += n as u64;
                }
                stream_last = now;
            }
            Some(TAG_END) => {
                let nanos = stream_first
                    .map(|first| stream_last.duration_since(first).as_nanos())
                    .unwrap_or(0);
                let report = format!("R {stream_count} {stream_bytes} {nanos}");
                sock.send_to(report.as_bytes(), from)?;
                stream_count = 0;
                stream_bytes = 0;
                stream_first = None;
            }
            Some(TAG_QUIT) => return Ok(()),
            Some(other) => {
                eprintln!("udp_pingpong server: ignoring datagram with tag {other:#04x}")
            }
            None => eprintln!("udp_pingpong server: ignoring empty datagram"),
        }
    }
    Ok(())
}

/// Sends the quit request a few times (a lost one only makes the server idle out).
fn quit_server(sock: &Socket, to: SocketAddr) {
    for _ in 0..3 {
        if sock.send_to(&[TAG_QUIT], to).is_err() {
            break;
        }
    }
}

fn percentile(sorted: &[u64], pct: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((pct / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted.get(rank.min(sorted.len() - 1)).copied().unwrap_or(0)
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Busy => "busy",
        Mode::Block => "block",
    }
}

fn run_pingpong(args: &Args, sock: &Socket) -> Result<(), Error> {
    let mut out = vec![0u8; args.size];
    let mut inb = vec![0u8; MAX_DATAGRAM + 1];
    let mut rtts: Vec<u64> = Vec::with_capacity(usize::try_from(args.iters).unwrap_or(0));
    let total = args.warmup + args.iters;
    for i in 0..total {
        let seq = i as u32;
        write_seq(&mut out, TAG_PING, seq);
        let t0 = Instant::now();
        sock.send_to(&out, args.addr)?;
        // Bounded: a stale echo (from an earlier, timed-out round) is skipped at most a few
        // times, then the round fails.
        let mut matched = false;
        for _ in 0..16 {
            let Some((n, _)) = sock.recv_from(&mut inb, CLIENT_TIMEOUT)? else {
                return Err(Error::Timeout("the echo"));
            };
            let echo = inb.get(..n).unwrap_or(&[]);
            if n == args.size && echo.first() == Some(&TAG_PING) && read_seq(echo) == Some(seq) {
                matched = true;
                break;
            }
        }
        let rtt = t0.elapsed();
        if !matched {
            return Err(Error::Protocol(format!("no matching echo for round {i}")));
        }
        if i >= args.warmup {
            rtts.push(u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX));
        }
    }
    rtts.sort_unstable();
    let sum: u128 = rtts.iter().map(|&r| u128::from(r)).sum();
    let avg_ns = sum as f64 / rtts.len().max(1) as f64;
    // One-way latency is half the round trip, in microseconds.
    let one_way = |ns: f64| ns / 2.0 / 1000.0;
    let median = one_way(percentile(&rtts, 50.0) as f64);
    let p99 = one_way(percentile(&rtts, 99.0) as f64);
    let min = one_way(rtts.first().copied().unwrap_or(0) as f64);
    let max = one_way(rtts.last().copied().unwrap_or(0) as f64);
    let avg = one_way(avg_ns);
    println!(
        "udp ping-pong, {} recv, {} B, {} round trips: one-way latency (half round trip) \
         median {median:.3} us, avg {avg:.3} us, p99 {p99:.3} us, min {min:.3} us, max {max:.3} us",
        mode_name(args.mode),
        args.size,
        args.iters
    );
    println!(
        "RESULT test=pingpong mode={} size={} iters={} median_us={median:.3} avg_us={avg:.3} \
         p99_us={p99:.3} min_us={min:.3} max_us={max:.3}",
        mode_name(args.mode),
        args.size,
        args.iters
    );
    Ok(())
}

fn parse_report(text: &[u8]) -> Option<(u64, u64, u64)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut words = text.split(' ');
    if words.next()? != "R" {
        return None;
    }
    let count = words.next()?.parse().ok()?;
    let bytes = words.next()?.parse().ok()?;
    let nanos = words.next()?.parse().ok()?;
    Some((count, bytes, nanos))
}

fn run_stream(args: &Args, sock: &Socket) -> Result<(), Error> {
    let mut out = vec![0u8; args.size];
    let start = Instant::now();
    for i in 0..args.iters {
        write_seq(&mut out, TAG_STREAM, i as u32);
        sock.send_to(&out, args.addr)?;
    }
    let send_secs = start.elapsed().as_secs_f64();
    // Ask for the report; the end marker is repeated in case it was dropped behind a full
    // receive buffer. Bounded by the number of attempts.
    let mut inb = vec![0u8; MAX_DATAGRAM + 1];
    let mut report = None;
    for _ in 0..10 {
        sock.send_to(&[TAG_END], args.addr)?;
        if let Some((n, _)) = sock.recv_from(&mut inb, Duration::from_millis(200))? {
            let got = inb.get(..n).unwrap_or(&[]);
            if got.first() == Some(&TAG_REPORT) {
                report = parse_report(got);
                break;
            }
        }
    }
    let (count, bytes, nanos) = report.ok_or(Error::Timeout("the stream report"))?;
    let secs = nanos as f64 / 1e9;
    let (gbps, mdps) = if secs > 0.0 {
        (bytes as f64 / secs / 1e9, count as f64 / secs / 1e6)
    } else {
        (0.0, 0.0)
    };
    let send_gbps = (args.iters * args.size as u64) as f64 / send_secs.max(1e-9) / 1e9;
    // The first datagram starts the receiver's clock and is not counted.
    let received = count + u64::from(nanos > 0);
    let lost = args.iters.saturating_sub(received);
    println!(
        "udp stream, {} B per send, {} datagrams sent, {received} received ({lost} lost): \
         receiver {gbps:.3} GB/s = {mdps:.3} M datagrams/s; sender {send_gbps:.3} GB/s",
        args.size, args.iters
    );
    println!(
        "RESULT test=stream mode={} size={} iters={} received={received} lost={lost} \
         recv_gbps={gbps:.4} recv_mdps={mdps:.4} send_gbps={send_gbps:.4}",
        mode_name(args.mode),
        args.size,
        args.iters
    );
    Ok(())
}

fn run_client(args: &Args) -> Result<(), Error> {
    let sock = Socket::bind(args.bind, args.mode)?;
    let result = match args.test {
        Test::PingPong => run_pingpong(args, &sock),
        Test::Stream => run_stream(args, &sock),
    };
    quit_server(&sock, args.addr);
    result
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = parse_args(&argv).and_then(|args| {
        if args.role == "server" {
            run_server(&args)
        } else {
            run_client(&args)
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("udp_pingpong: {e}");
            if matches!(e, Error::Usage(_)) {
                eprintln!("{USAGE}");
            }
            ExitCode::FAILURE
        }
    }
}
