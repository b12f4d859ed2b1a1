//! The out-of-band exchange between `uroce perf` server and client: one JSON object per
//! line over a TCP connection.
//!
//! Per connection:
//! ```text
//! client → Hello { version, mode }         server opens its device
//! server → Hello { version, mode }
//! for each test:
//!   client → Setup { spec, qps }           the client's QPs (number, PSN, buffer, GID)
//!   server → Setup { spec, qps }           the server's QPs, already in RTS
//!   client → Ready                         the client's QPs are in RTS   (barrier before)
//!   server → Ready                         receives are posted, buffers filled
//!   … the test …
//!   client → Done { error }                (barrier after)
//!   server → Done { error }                the server's checks
//!   with --counters only (an optional extension; servers older than it reject it):
//!   client → GetCounters
//!   server → Counters { report }           the server's counters after the test
//! client → Bye
//! ```
//! Either side may send `Abort { error }` at any point; the other gives up the test.
//! Every read is bounded: [`Oob::recv`] fails after its timeout without a message. Lines
//! are limited to [`MAX_LINE`] bytes.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::counters::CounterReport;
use super::plan::{Mode, TestSpec};

/// Version of the exchange; both sides must agree.
pub const VERSION: u32 = 1;
/// Longest line accepted.
pub const MAX_LINE: usize = 1 << 20;

/// One side's view of a QP: what the peer needs to connect to it and reach its buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    /// QP number.
    pub qpn: u32,
    /// First PSN this QP sends with.
    pub psn: u32,
    /// R_Key of the buffer the peer may access.
    pub rkey: u32,
    /// Virtual address of that buffer.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The device's GID 0 in IPv6 notation.
    pub gid: String,
    /// The port's active MTU in bytes.
    pub mtu: u32,
}

/// A message of the exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Msg {
    /// Opening greeting (both directions).
    Hello {
        /// [`VERSION`].
        version: u32,
        /// How both sides wait for completions.
        mode: Mode,
    },
    /// The test to run and one side's QPs.
    Setup {
        /// The test.
        spec: TestSpec,
        /// One entry per QP.
        qps: Vec<QpInfo>,
    },
    /// Barrier before a test.
    Ready,
    /// Barrier after a test, with the sender's verdict (`None`: all its checks passed).
    Done {
        /// What went wrong, if anything.
        error: Option<String>,
    },
    /// The sender gives up.
    Abort {
        /// Why.
        error: String,
    },
    /// The client has no more tests.
    Bye,
    /// Client → server after a test's `Done` barrier: asks for [`Msg::Counters`].
    GetCounters,
    /// Server → client: the server's counters after the last test (its device's, and
    /// those of the test's QPs).
    Counters {
        /// The counters.
        report: CounterReport,
    },
}

impl Msg {
    /// The message's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Msg::Hello { .. } => "hello",
            Msg::Setup { .. } => "setup",
            Msg::Ready => "ready",
            Msg::Done { .. } => "done",
            Msg::Abort { .. } => "abort",
            Msg::Bye => "bye",
            Msg::GetCounters => "get_counters",
            Msg::Counters { .. } => "counters",
        }
    }
}

/// Errors of the exchange.
#[derive(Debug, thiserror::Error)]
pub enum OobError {
    /// A socket operation failed.
    #[error("out-of-band connection: {0}")]
    Io(#[from] std::io::Error),
    /// No complete message arrived in time.
    #[error("out-of-band connection: no message from the peer within {0:?}")]
    Timeout(Duration),
    /// The peer closed the connection.
    #[error("out-of-band connection closed by the peer")]
    Closed,
    /// A line longer than [`MAX_LINE`].
    #[error("out-of-band message longer than {MAX_LINE} bytes")]
    TooLong,
    /// A line that is not a message.
    #[error("bad out-of-band message: {0}")]
    Bad(#[from] serde_json::Error),
    /// The peer gave up.
    #[error("the peer aborted: {0}")]
    PeerAborted(String),
    /// A message other than the one expected.
    #[error("out-of-band protocol: expected {expected}, got {got}")]
    Unexpected {
        /// What this side waited for.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
}

/// One end of the exchange. The stream is non-blocking; reads are assembled into lines.
pub struct Oob {
    stream: TcpStream,
    buf: Vec<u8>,
    timeout: Duration,
}

impl Oob {
    /// Wraps a connected stream; `timeout` bounds every wait.
    pub fn new(stream: TcpStream, timeout: Duration) -> Result<Oob, OobError> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Oob {
            stream,
            buf: Vec::new(),
            timeout,
        })
    }

    /// The timeout of every wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends one message.
    pub fn send(&mut self, msg: &Msg) -> Result<(), OobError> {
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        let deadline = Instant::now() + self.timeout;
        let mut done = 0;
        while done < line.len() {
            match self.stream.write(&line[done..]) {
                Ok(0) => return Err(OobError::Closed),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(OobError::Timeout(self.timeout));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// A complete message if one has arrived, without waiting. `Abort` is returned as
    /// [`OobError::PeerAborted`].
    pub fn try_recv(&mut self) -> Result<Option<Msg>, OobError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let msg: Msg = serde_json::from_slice(&line)?;
                return match msg {
                    Msg::Abort { error } => Err(OobError::PeerAborted(error)),
                    m => Ok(Some(m)),
                };
            }
            if self.buf.len() > MAX_LINE {
                return Err(OobError::TooLong);
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(OobError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads what has arrived without waiting and fails if the peer aborted or closed the
    /// connection; other messages stay queued for [`Oob::recv`].
    pub fn check_abort(&mut self) -> Result<(), OobError> {
        loop {
            if self.buf.len() > MAX_LINE {
                return Err(OobError::TooLong);
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(OobError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            if let Ok(Msg::Abort { error }) = serde_json::from_slice::<Msg>(&self.buf[..pos]) {
                self.buf.drain(..=pos);
                return Err(OobError::PeerAborted(error));
            }
        }
        Ok(())
    }

    /// Waits for the next message, at most the timeout; `alive` is called between polls
    /// and returns true when the caller saw other activity (which restarts the timeout).
    pub fn recv_with(&mut self, mut alive: impl FnMut() -> bool) -> Result<Msg, OobError> {
        let mut deadline = Instant::now() + self.timeout;
        loop {
            if let Some(m) = self.try_recv()? {
                return Ok(m);
            }
            if alive() {
                deadline = Instant::now() + self.timeout;
            }
            if Instant::now() >= deadline {
                return Err(OobError::Timeout(self.timeout));
            }
            // The stream is non-blocking: wait for it with a short read timeout.
            self.wait_readable(Duration::from_millis(1))?;
        }
    }

    /// Waits for the next message, at most the timeout.
    pub fn recv(&mut self) -> Result<Msg, OobError> {
        self.recv_with(|| false)
    }

    /// Blocks until the stream is readable or `max` passed.
    fn wait_readable(&mut self, max: Duration) -> Result<(), OobError> {
        self.stream.set_nonblocking(false)?;
        self.stream.set_read_timeout(Some(max))?;
        let mut probe = [0u8; 1];
        let r = self.stream.peek(&mut probe);
        self.stream.set_nonblocking(true)?;
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sends `Abort` (best effort) with `error`.
    pub fn abort(&mut self, error: &str) {
        let _ = self.send(&Msg::Abort {
            error: error.to_string(),
        });
    }
}

/// Connects to `addr`, retrying refused connections until `timeout` (the server may not
/// be listening yet).
pub fn connect(addr: std::net::SocketAddr, timeout: Duration) -> Result<TcpStream, OobError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(10))) {
            Ok(s) => return Ok(s),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(match e.kind() {
                        ErrorKind::TimedOut | ErrorKind::WouldBlock => OobError::Timeout(timeout),
                        _ => OobError::Io(std::io::Error::new(
                            e.kind(),
                            format!("connecting to the perf server at {addr}: {e}"),
                        )),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::plan::TestKind;
    use std::net::TcpListener;

    fn pair(timeout: Duration) -> (Oob, Oob) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let c = connect(addr, Duration::from_secs(5)).unwrap();
        let (s, _) = l.accept().unwrap();
        (Oob::new(c, timeout).unwrap(), Oob::new(s, timeout).unwrap())
    }

    #[test]
    fn messages_cross_in_order() {
        let (mut a, mut b) = pair(Duration::from_secs(5));
        let spec = TestSpec {
            test: "send_lat".parse::<TestKind>().unwrap(),
            size: 8,
            iters: 5,
            warmup: 1,
            qps: 1,
            tx_depth: 4,
            rx_depth: 4,
            verify: false,
            mode: Mode::Busy,
        };
        let setup = Msg::Setup {
            spec,
            qps: vec![QpInfo {
                qpn: 17,
                psn: 0x123456,
                rkey: 0xabc,
                addr: 1 << 40,
                len: 64,
                gid: "::ffff:127.0.0.1".into(),
                mtu: 1024,
            }],
        };
        a.send(&Msg::Ready).unwrap();
        a.send(&setup).unwrap();
        a.send(&Msg::Done { error: None }).unwrap();
        assert_eq!(b.recv().unwrap(), Msg::Ready);
        assert_eq!(b.recv().unwrap(), setup);
        assert_eq!(b.recv().unwrap(), Msg::Done { error: None });
        a.send(&Msg::Bye).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        // A queued message other than Abort is left for recv.
        b.check_abort().unwrap();
        assert_eq!(b.recv().unwrap(), Msg::Bye);
        a.abort("boom");
        std::thread::sleep(Duration::from_millis(50));
        assert!(matches!(b.check_abort(), Err(OobError::PeerAborted(_))));
        a.abort("boom");
        match b.recv() {
            Err(OobError::PeerAborted(e)) => assert_eq!(e, "boom"),
            other => panic!("{other:?}"),
        }
        drop(a);
        assert!(matches!(b.recv(), Err(OobError::Closed)));
    }

    #[test]
    fn counters_cross() {
        let (mut a, mut b) = pair(Duration::from_secs(5));
        let report = CounterReport {
            device: vec![("tx_packets".into(), 7), ("bad_icrc".into(), 0)],
            qps: vec![crate::perf::counters::QpCounterReport {
                qpn: 0x12,
                fields: vec![("packets_received".into(), u64::MAX)],
            }],
        };
        a.send(&Msg::GetCounters).unwrap();
        assert_eq!(b.recv().unwrap(), Msg::GetCounters);
        let msg = Msg::Counters { report };
        b.send(&msg).unwrap();
        assert_eq!(a.recv().unwrap(), msg);
        assert_eq!(msg.name(), "counters");
    }

    #[test]
    fn recv_times_out() {
        let (_a, mut b) = pair(Duration::from_millis(50));
        let t = Instant::now();
        assert!(matches!(b.recv(), Err(OobError::Timeout(_))));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let (a, mut b) = pair(Duration::from_secs(5));
        let mut raw = a.stream.try_clone().unwrap();
        raw.set_nonblocking(false).unwrap();
        raw.write_all(b"{\"msg\":\"nope\"}\n").unwrap();
        assert!(matches!(b.recv(), Err(OobError::Bad(_))));
    }
}
