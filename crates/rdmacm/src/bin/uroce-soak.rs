//! `uroce-soak`: mixed traffic on real loopback sockets for a long time, under injected
//! loss, duplication and reordering, every message checked, and the process's resources
//! watched for growth.
//!
//! Two devices (127.0.61.1 and 127.0.61.2, or `--addrs A,B`; `--faults` on both, default
//! `drop=0.01,dup=0.005,reorder=0.01`) carry, each in a thread of its own until the time is
//! up:
//! * an RC stream of SENDs (1 B … 8 KiB) with an RDMA WRITE and a READ back every 16
//!   messages: every message arrives once, in order, byte for byte;
//! * an XRC stream (initiator → a target QP delivering into an XRC SRQ): the same;
//! * a UC stream and a UD stream: what arrives is byte for byte what was sent for its
//!   sequence number (UC and UD may lose messages and UD may duplicate them);
//! * RDMA-CM churn: connect, one SEND each way, disconnect, destroy, again;
//! * QP churn: an RC QP pair made, connected, used once and destroyed, again.
//!
//! Every `--report` seconds it prints the resident set size, the open descriptors, the QPs
//! alive and the messages checked per stream. It fails (exit 1) when a check fails, a
//! stream stops making progress, or between the first report after a quarter of the run
//! and the end the RSS grew by more than 16 MiB and 25 %, the descriptors by more than 8 or
//! the live QPs by more than 8.
//!
//! A watchdog thread measures how late 1 ms sleeps wake (`sched-delay`, the longest per
//! report): on a loaded machine a device's progress thread can go unscheduled longer than
//! the requesters' 8 × ACK timeout (`--ack-timeout`, code 14 ≈ 67 ms by default), which an
//! RC requester cannot tell from a dead peer; a RETRY_EXC_ERR then says so.
//!
//! `uroce-soak --seconds 3600` is the hour-long run (`scripts/soak`); the test command runs
//! it for two minutes (`crates/rdmacm/tests/soak.rs`).

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uroce_net::{FaultConfig, NetConfig, NetDevice};
use uroce_rdmacm::{ConnParam, EventKind, PortSpace, RdmaCm};
use uroce_verbs::{
    AccessFlags, AhAttr, Cq, MemBlock, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, RcConnect, RdmaInfo,
    RecvWr, SendFlags, SendOpcode, SendWr, Sge, SrqInitAttr, UcConnect, UdDest, WcStatus,
    WorkCompletion,
};

/// The two devices' addresses unless `--addrs A,B` says otherwise.
const ADDRS: (&str, &str) = ("127.0.61.1", "127.0.61.2");
const WAIT: Duration = Duration::from_secs(30);
const QKEY: u32 = 0x5eed_0001;
const GRH: usize = 40;

type Res<T> = Result<T, String>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// The byte at position `i` of message `seq` of stream `stream`.
fn pattern(stream: u8, seq: u64, i: usize) -> u8 {
    let x = (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xbf58_476d))
        .wrapping_add(u64::from(stream));
    (x >> 29) as u8
}

fn message(stream: u8, seq: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| pattern(stream, seq, i)).collect();
    // The sequence number rides in the first 8 bytes (when there are 8).
    if len >= 8 {
        v[..8].copy_from_slice(&seq.to_be_bytes());
    }
    v
}

fn check(stream: u8, seq: u64, got: &[u8]) -> Res<()> {
    let want = message(stream, seq, got.len());
    if got == want.as_slice() {
        Ok(())
    } else {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
        Err(format!(
            "stream {stream}: message {seq} differs at byte {at} of {}",
            got.len()
        ))
    }
}

/// One completion from `cq` within [`WAIT`], successful.
fn wait(cq: &Cq, stop: &AtomicBool) -> Res<WorkCompletion> {
    let start = Instant::now();
    // Bounded by WAIT.
    loop {
        if let Some(wc) = cq.poll(1).pop() {
            return if wc.status == WcStatus::Success {
                Ok(wc)
            } else {
                Err(format!("WR {} completed with {:?}", wc.wr_id, wc.status))
            };
        }
        if start.elapsed() > WAIT {
            return Err(format!("no completion within {WAIT:?}"));
        }
        if stop.load(Ordering::Relaxed) && start.elapsed() > Duration::from_secs(5) {
            return Err("stopped while waiting".into());
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// A PD, a CQ and a registered region on a device.
struct Side {
    pd: Pd,
    cq: Cq,
    mr: Mr,
}

impl Side {
    fn new(dev: &NetDevice, len: usize) -> Res<Side> {
        let ctx = dev.context();
        let pd = ctx.alloc_pd().map_err(|e| e.to_string())?;
        let cq = ctx.create_cq(256, None, 0).map_err(|e| e.to_string())?;
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let mr = pd
            .reg_mr(MemBlock::new(len).map_err(|e| e.to_string())?, access)
            .map_err(|e| e.to_string())?;
        Ok(Side { pd, cq, mr })
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.iova() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    fn qp(&self, t: QpType, depth: u32) -> Res<Qp> {
        let cap = QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let mut attr = QpInitAttr::new(t, &self.cq, &self.cq, cap);
        if t == QpType::XrcSend {
            attr.recv_cq = None;
            attr.cap.max_recv_wr = 0;
            attr.cap.max_recv_sge = 0;
        }
        self.pd.create_qp(&attr).map_err(|e| e.to_string())
    }

    fn put(&self, off: usize, data: &[u8]) -> Res<()> {
        self.mr
            .block()
            .copy_in(off, data)
            .map_err(|e| e.to_string())
    }

    fn get(&self, off: usize, len: usize) -> Res<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.mr
            .block()
            .copy_out(off, &mut v)
            .map_err(|e| e.to_string())?;
        Ok(v)
    }
}

/// What the streams share with the reporter.
struct Shared {
    stop: AtomicBool,
    /// Messages checked, per stream.
    checked: [AtomicU64; 6],
    /// The longest a 1 ms sleep of the watchdog thread overran since the last report, µs:
    /// how long this process could go unscheduled (an RC requester whose peer's progress
    /// thread is not run for retry_cnt × the ACK timeout ends in RETRY_EXC_ERR, as it would
    /// with a peer that is gone).
    sched_delay_us: AtomicU64,
    /// The RC and XRC requesters' Local ACK Timeout code (`--ack-timeout`).
    ack_timeout: u8,
}

/// The Local ACK Timeout code of the RC and XRC streams unless `--ack-timeout` says
/// otherwise: 14, 4.096 µs × 2^14 ≈ 67 ms, what ibv_rc_pingpong and perftest use. With the
/// 7 retries that is ≈ 0.5 s a peer may go unheard before RETRY_EXC_ERR; at 12 (17 ms,
/// 134 ms in all) a loaded 2-core machine starved a device's thread that long.
const ACK_TIMEOUT: u8 = 14;

/// Measures scheduling delay until told to stop: sleeps 1 ms at a time and records by how
/// much each sleep overran.
fn watchdog(sh: &Shared) {
    // Bounded by `stop`.
    while !sh.stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
        let over = t.elapsed().saturating_sub(Duration::from_millis(1));
        sh.sched_delay_us
            .fetch_max(over.as_micros() as u64, Ordering::Relaxed);
    }
}

const NAMES: [&str; 6] = ["rc", "xrc", "uc", "ud", "cm-churn", "qp-churn"];

const SLOT: usize = 8192 + 64;

/// RC: SENDs of varying size, each checked in order; a WRITE and a READ back every 16.
fn rc_stream(a: &NetDevice, b: &NetDevice, sh: &Shared) -> Res<()> {
    let (sa, sb) = (Side::new(a, 16 * SLOT)?, Side::new(b, 16 * SLOT)?);
    let (qa, qb) = (sa.qp(QpType::Rc, 16)?, sb.qp(QpType::Rc, 16)?);
    let c = |peer: &NetDevice, qpn| RcConnect {
        timeout: sh.ack_timeout,
        ..RcConnect::new(peer.local_addr().ip(), qpn)
    };
    qa.connect_rc(&c(b, qb.qp_num()))
        .map_err(|e| e.to_string())?;
    qb.connect_rc(&c(a, qa.qp_num()))
        .map_err(|e| e.to_string())?;
    let mut seq = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let len = 1 + (seq as usize * 613) % 8192;
        let slot = (seq % 8) as usize;
        qb.post_recv(RecvWr::new(seq, vec![sb.sge(slot * SLOT, SLOT)]))
            .map_err(|e| e.to_string())?;
        sa.put(slot * SLOT, &message(0, seq, len))?;
        let mut wr = SendWr::send(seq, vec![sa.sge(slot * SLOT, len)]);
        wr.flags = SendFlags::SIGNALED;
        qa.post_send(wr).map_err(|e| e.to_string())?;
        wait(&sa.cq, &sh.stop)?;
        let wc = wait(&sb.cq, &sh.stop)?;
        if wc.wr_id != seq || wc.byte_len as usize != len {
            return Err(format!("rc: message {seq} arrived as {wc:?}"));
        }
        check(0, seq, &sb.get(slot * SLOT, len)?)?;
        if seq % 16 == 15 {
            // WRITE A's message into B's slot 9, READ it back into A's slot 10.
            let w = message(0, seq ^ 0xffff, 4096);
            sa.put(9 * SLOT, &w)?;
            for (op, off, remote) in [
                (SendOpcode::RdmaWrite, 9 * SLOT, 9 * SLOT),
                (SendOpcode::RdmaRead, 10 * SLOT, 9 * SLOT),
            ] {
                let wr = SendWr {
                    wr_id: seq,
                    opcode: op,
                    flags: SendFlags::SIGNALED,
                    sg_list: vec![sa.sge(off, 4096)].into(),
                    rdma: RdmaInfo {
                        remote_addr: sb.mr.iova() + remote as u64,
                        rkey: sb.mr.rkey(),
                    },
                    ..SendWr::default()
                };
                qa.post_send(wr).map_err(|e| e.to_string())?;
                wait(&sa.cq, &sh.stop)?;
            }
            if sa.get(10 * SLOT, 4096)? != w || sb.get(9 * SLOT, 4096)? != w {
                return Err(format!("rc: WRITE/READ of message {seq} differs"));
            }
        }
        sh.checked[0].fetch_add(1, Ordering::Relaxed);
        seq += 1;
    }
    Ok(())
}

/// XRC: an initiator on A sends into an XRC SRQ behind a target QP on B; in order.
fn xrc_stream(a: &NetDevice, b: &NetDevice, sh: &Shared) -> Res<()> {
    let (sa, sb) = (Side::new(a, 8 * SLOT)?, Side::new(b, 8 * SLOT)?);
    let ini = sa.qp(QpType::XrcSend, 16)?;
    let xrcd = b.context().alloc_xrcd().map_err(|e| e.to_string())?;
    let srq = xrcd
        .create_srq(
            &sb.pd,
            &sb.cq,
            &SrqInitAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .map_err(|e| e.to_string())?;
    let tgt = xrcd.create_qp().map_err(|e| e.to_string())?;
    tgt.connect_rc(&RcConnect::new(a.local_addr().ip(), ini.qp_num()))
        .map_err(|e| e.to_string())?;
    ini.connect_rc(&RcConnect {
        timeout: sh.ack_timeout,
        ..RcConnect::new(b.local_addr().ip(), tgt.qp_num())
    })
    .map_err(|e| e.to_string())?;
    let mut seq = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let len = 1 + (seq as usize * 389) % 4096;
        let slot = (seq % 4) as usize;
        srq.post_recv(RecvWr::new(seq, vec![sb.sge(slot * SLOT, SLOT)]))
            .map_err(|e| e.to_string())?;
        sa.put(slot * SLOT, &message(1, seq, len))?;
        let mut wr = SendWr::send(seq, vec![sa.sge(slot * SLOT, len)]);
        wr.flags = SendFlags::SIGNALED;
        wr.xrc_remote_srqn = srq.srq_num();
        ini.post_send(wr).map_err(|e| e.to_string())?;
        wait(&sa.cq, &sh.stop)?;
        let wc = wait(&sb.cq, &sh.stop)?;
        if wc.wr_id != seq || wc.byte_len as usize != len {
            return Err(format!("xrc: message {seq} arrived as {wc:?}"));
        }
        check(1, seq, &sb.get(slot * SLOT, len)?)?;
        sh.checked[1].fetch_add(1, Ordering::Relaxed);
        seq += 1;
    }
    drop((tgt, srq));
    let _ = xrcd.destroy();
    Ok(())
}

/// UC and UD: unreliable, so messages may be lost (and UD ones duplicated): whatever
/// arrives must be byte for byte the message its sequence number names.
fn unreliable_stream(a: &NetDevice, b: &NetDevice, sh: &Shared, ud: bool) -> Res<()> {
    let stream = if ud { 3 } else { 2 };
    let (sa, sb) = (Side::new(a, 64 * 1024)?, Side::new(b, 64 * 1024)?);
    let t = if ud { QpType::Ud } else { QpType::Uc };
    let (qa, qb) = (sa.qp(t, 32)?, sb.qp(t, 32)?);
    if ud {
        qa.activate_ud(QKEY).map_err(|e| e.to_string())?;
        qb.activate_ud(QKEY).map_err(|e| e.to_string())?;
    } else {
        qa.connect_uc(&UcConnect::new(b.local_addr().ip(), qb.qp_num()))
            .map_err(|e| e.to_string())?;
        qb.connect_uc(&UcConnect::new(a.local_addr().ip(), qa.qp_num()))
            .map_err(|e| e.to_string())?;
    }
    let ah = sa
        .pd
        .create_ah(&AhAttr::to_ip(b.local_addr().ip()))
        .map_err(|e| e.to_string())?;
    let slot = 1024 + GRH;
    for k in 0..32u64 {
        qb.post_recv(RecvWr::new(k, vec![sb.sge(k as usize * slot, slot)]))
            .map_err(|e| e.to_string())?;
    }
    let mut seq = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let len = 8 + (seq as usize * 131) % 1000;
        sa.put(48 * 1024, &message(stream, seq, len))?;
        let mut wr = SendWr::send(seq, vec![sa.sge(48 * 1024, len)]);
        wr.flags = SendFlags::SIGNALED;
        if ud {
            wr.ud = Some(UdDest {
                ah: ah.reference(),
                remote_qpn: qb.qp_num(),
                remote_qkey: QKEY,
            });
        }
        qa.post_send(wr).map_err(|e| e.to_string())?;
        wait(&sa.cq, &sh.stop)?;
        seq += 1;
        // Take what arrived (bounded: at most the posted receives).
        for wc in sb.cq.poll(32) {
            if wc.status != WcStatus::Success {
                return Err(format!("{}: receive {wc:?}", NAMES[stream as usize]));
            }
            let at = wc.wr_id as usize * slot + if ud { GRH } else { 0 };
            let len = wc.byte_len as usize - if ud { GRH } else { 0 };
            let data = sb.get(at, len)?;
            let got_seq = u64::from_be_bytes(data[..8].try_into().unwrap_or([0; 8]));
            check(stream, got_seq, &data)?;
            sh.checked[stream as usize].fetch_add(1, Ordering::Relaxed);
            qb.post_recv(RecvWr::new(
                wc.wr_id,
                vec![sb.sge(wc.wr_id as usize * slot, slot)],
            ))
            .map_err(|e| e.to_string())?;
        }
        // Pace the sender: an unreliable stream must not outrun its receiver's queue.
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// RDMA-CM: connect, one SEND each way, disconnect and destroy, over and over.
fn cm_churn(cm: &RdmaCm, a: IpAddr, b: IpAddr, sh: &Shared) -> Res<()> {
    let e = |x: uroce_rdmacm::CmError| x.to_string();
    let mut round = 0u64;
    let port = 7700;
    let chs = cm.create_event_channel().map_err(e)?;
    let listener = cm.create_id(&chs, PortSpace::Tcp).map_err(e)?;
    listener.bind_addr(SocketAddr::new(b, port)).map_err(e)?;
    listener.listen(8).map_err(e)?;
    while !sh.stop.load(Ordering::Relaxed) {
        let chc = cm.create_event_channel().map_err(e)?;
        let cid = cm.create_id(&chc, PortSpace::Tcp).map_err(e)?;
        cid.resolve_addr(Some(SocketAddr::new(a, 0)), SocketAddr::new(b, port), WAIT)
            .map_err(e)?;
        chc.expect(EventKind::AddrResolved, WAIT).map_err(e)?;
        cid.resolve_route(WAIT).map_err(e)?;
        chc.expect(EventKind::RouteResolved, WAIT).map_err(e)?;
        let dev_a = cid.device().ok_or("no device for the client id")?;
        let ca = Side::new(&dev_a, 4096)?;
        let qa = cid.create_qp(&ca.pd, &qp_attr(&ca)).map_err(e)?;
        qa.post_recv(RecvWr::new(1, vec![ca.sge(0, 256)]))
            .map_err(|x| x.to_string())?;
        cid.connect(&ConnParam::new()).map_err(e)?;
        let mut req = chs.expect(EventKind::ConnectRequest, WAIT).map_err(e)?;
        let sid = req.take_id().ok_or("no id in the request")?;
        drop(req);
        let dev_b = sid.device().ok_or("no device for the server id")?;
        let cb = Side::new(&dev_b, 4096)?;
        let qb = sid.create_qp(&cb.pd, &qp_attr(&cb)).map_err(e)?;
        qb.post_recv(RecvWr::new(2, vec![cb.sge(0, 256)]))
            .map_err(|x| x.to_string())?;
        sid.accept(&ConnParam::new()).map_err(e)?;
        chc.expect(EventKind::Established, WAIT).map_err(e)?;
        chs.expect(EventKind::Established, WAIT).map_err(e)?;
        for (from, q, to) in [(&ca, &qa, &cb), (&cb, &qb, &ca)] {
            from.put(1024, &message(4, round, 64))?;
            let mut wr = SendWr::send(round, vec![from.sge(1024, 64)]);
            wr.flags = SendFlags::SIGNALED;
            q.post_send(wr).map_err(|x| x.to_string())?;
            wait(&from.cq, &sh.stop)?;
            let wc = wait(&to.cq, &sh.stop)?;
            check(4, round, &to.get(0, wc.byte_len as usize)?)?;
        }
        cid.disconnect().map_err(e)?;
        chc.expect(EventKind::Disconnected, WAIT).map_err(e)?;
        chs.expect(EventKind::Disconnected, WAIT).map_err(e)?;
        // The QP handles go before their ids (an id waits for the QP it destroys).
        drop((qa, qb));
        drop((sid, cid, ca, cb));
        sh.checked[4].fetch_add(1, Ordering::Relaxed);
        round += 1;
    }
    Ok(())
}

fn qp_attr(s: &Side) -> QpInitAttr<'_> {
    QpInitAttr::new(
        QpType::Rc,
        &s.cq,
        &s.cq,
        QpCap {
            max_send_wr: 8,
            max_recv_wr: 8,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
    )
}

/// QP churn: an RC pair made, connected, used once, destroyed.
fn qp_churn(a: &NetDevice, b: &NetDevice, sh: &Shared) -> Res<()> {
    let (sa, sb) = (Side::new(a, 4096)?, Side::new(b, 4096)?);
    let mut round = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let (qa, qb) = (sa.qp(QpType::Rc, 4)?, sb.qp(QpType::Rc, 4)?);
        qa.connect_rc(&RcConnect::new(b.local_addr().ip(), qb.qp_num()))
            .map_err(|e| e.to_string())?;
        qb.connect_rc(&RcConnect::new(a.local_addr().ip(), qa.qp_num()))
            .map_err(|e| e.to_string())?;
        qb.post_recv(RecvWr::new(round, vec![sb.sge(0, 256)]))
            .map_err(|e| e.to_string())?;
        sa.put(1024, &message(5, round, 200))?;
        let mut wr = SendWr::send(round, vec![sa.sge(1024, 200)]);
        wr.flags = SendFlags::SIGNALED;
        qa.post_send(wr).map_err(|e| e.to_string())?;
        wait(&sa.cq, &sh.stop)?;
        wait(&sb.cq, &sh.stop)?;
        check(5, round, &sb.get(0, 200)?)?;
        qa.destroy().map_err(|(_, e)| e.to_string())?;
        qb.destroy().map_err(|(_, e)| e.to_string())?;
        sh.checked[5].fetch_add(1, Ordering::Relaxed);
        round += 1;
    }
    Ok(())
}

/// (RSS KiB, open descriptors) of this process.
fn resources() -> (u64, usize) {
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    (rss, fds)
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let secs: u64 = arg(&args, "--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(3600);
    let every: u64 = arg(&args, "--report")
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let ack_timeout: u8 = arg(&args, "--ack-timeout")
        .and_then(|s| s.parse().ok())
        .filter(|&t| t < 32)
        .unwrap_or(ACK_TIMEOUT);
    let addrs = arg(&args, "--addrs");
    let (addr_a, addr_b) = addrs
        .as_deref()
        .and_then(|s| s.split_once(','))
        .unwrap_or(ADDRS);
    let faults =
        arg(&args, "--faults").unwrap_or_else(|| "drop=0.01,dup=0.005,reorder=0.01".into());
    let faults = match FaultConfig::parse(&faults) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("uroce-soak: --faults: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let open = |addr: &str| -> Res<Arc<NetDevice>> {
        let mut cfg = NetConfig::new(ip(addr));
        cfg.faults = Some(faults);
        cfg.publish_stats = false;
        NetDevice::open(cfg)
            .map(Arc::new)
            .map_err(|e| format!("device on {addr}: {e}"))
    };
    let (a, b) = match (open(addr_a), open(addr_b)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("uroce-soak: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let cm = RdmaCm::new();
    if let Err(e) = cm
        .add_device(a.clone())
        .and_then(|()| cm.add_device(b.clone()))
    {
        eprintln!("uroce-soak: rdma-cm: {e}");
        return std::process::ExitCode::from(2);
    }
    let sh = Arc::new(Shared {
        stop: AtomicBool::new(false),
        checked: Default::default(),
        sched_delay_us: AtomicU64::new(0),
        ack_timeout,
    });
    let dog = {
        let sh = sh.clone();
        std::thread::spawn(move || watchdog(&sh))
    };
    let cm = Arc::new(cm);
    let mut workers = Vec::new();
    for k in 0..6 {
        let (a, b, sh, cm) = (a.clone(), b.clone(), sh.clone(), cm.clone());
        workers.push(std::thread::spawn(move || {
            let r = match k {
                0 => rc_stream(&a, &b, &sh),
                1 => xrc_stream(&a, &b, &sh),
                2 => unreliable_stream(&a, &b, &sh, false),
                3 => unreliable_stream(&a, &b, &sh, true),
                4 => cm_churn(&cm, a.local_addr().ip(), b.local_addr().ip(), &sh),
                _ => qp_churn(&a, &b, &sh),
            };
            if r.is_err() {
                sh.stop.store(true, Ordering::Relaxed);
            }
            r
        }));
    }
    let start = Instant::now();
    let qps = || a.context().qp_numbers().len() + b.context().qp_numbers().len();
    let mut samples: Vec<(u64, u64, usize, usize)> = Vec::new();
    let mut last: Vec<u64> = vec![0; 6];
    let mut stalled = None;
    let mut worst_delay = 0u64;
    println!("uroce-soak: {secs} s, faults {faults:?}, RC ACK timeout code {ack_timeout}");
    // Bounded by `secs`.
    while start.elapsed() < Duration::from_secs(secs) && !sh.stop.load(Ordering::Relaxed) {
        std::thread::sleep(
            Duration::from_secs(every.min(secs))
                .min(Duration::from_secs(secs).saturating_sub(start.elapsed())),
        );
        let (rss, fds) = resources();
        let now: Vec<u64> = sh
            .checked
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let t = start.elapsed().as_secs();
        let delay = sh.sched_delay_us.swap(0, Ordering::Relaxed);
        worst_delay = worst_delay.max(delay);
        println!(
            "t={t:>5} s rss={rss} KiB fds={fds} qps={} sched-delay={:.1} ms checked: {}",
            qps(),
            delay as f64 / 1000.0,
            NAMES
                .iter()
                .zip(&now)
                .map(|(n, c)| format!("{n}={c}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        if let Some(i) = (0..6).find(|&i| now[i] == last[i]) {
            stalled = Some(format!(
                "stream {} made no progress for {every} s",
                NAMES[i]
            ));
            sh.stop.store(true, Ordering::Relaxed);
        }
        samples.push((t, rss, fds, qps()));
        last = now;
    }
    sh.stop.store(true, Ordering::Relaxed);
    let _ = dog.join();
    // The window a failure ended in is not reported by the loop above.
    worst_delay = worst_delay.max(sh.sched_delay_us.load(Ordering::Relaxed));
    let mut failed: Vec<String> = Vec::new();
    for (k, w) in workers.into_iter().enumerate() {
        match w.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed.push(format!("{}: {e}", NAMES[k])),
            Err(_) => failed.push(format!("{}: panicked", NAMES[k])),
        }
    }
    failed.extend(stalled);
    // Growth between the first sample after a quarter of the run and the last.
    let base = samples.iter().find(|s| s.0 >= secs / 4);
    if let (Some(b0), Some(end)) = (base, samples.last()) {
        if end.1 > b0.1 + (16 * 1024).max(b0.1 / 4) {
            failed.push(format!("RSS grew from {} KiB to {} KiB", b0.1, end.1));
        }
        if end.2 > b0.2 + 8 {
            failed.push(format!("descriptors grew from {} to {}", b0.2, end.2));
        }
        if end.3 > b0.3 + 8 {
            failed.push(format!("live QPs grew from {} to {}", b0.3, end.3));
        }
    }
    let c = (a.counters(), b.counters());
    println!(
        "injected: dropped {} + {}, duplicated {} + {}, reordered {} + {}; retransmitted {} + {}",
        c.0.socket.injected_drops,
        c.1.socket.injected_drops,
        c.0.socket.injected_dups,
        c.1.socket.injected_dups,
        c.0.socket.injected_reorders,
        c.1.socket.injected_reorders,
        c.0.transport.retransmitted_packets,
        c.1.transport.retransmitted_packets
    );
    println!(
        "ACK timeouts {} + {} ({} + {} excused), retries exceeded {} + {}; \
         longest scheduling delay {:.1} ms (last window {:.1} ms)",
        c.0.transport.timeouts,
        c.1.transport.timeouts,
        c.0.transport.timeouts_excused,
        c.1.transport.timeouts_excused,
        c.0.transport.retry_exceeded,
        c.1.transport.retry_exceeded,
        worst_delay as f64 / 1000.0,
        sh.sched_delay_us.load(Ordering::Relaxed) as f64 / 1000.0
    );
    // 4.096 µs × 2^t, eight times (the first try and 7 retries).
    let budget_ms = 8.0 * 4.096e-3 * f64::from(1u32 << ack_timeout.min(31));
    if failed.iter().any(|f| f.contains("RetryExcErr")) && worst_delay as f64 / 1000.0 >= budget_ms
    {
        failed.push(format!(
            "the process went {:.1} ms unscheduled, longer than the {budget_ms:.0} ms the \
             requesters wait for an unheard peer (8 × the ACK timeout): a starved peer \
             thread looks like a dead peer",
            worst_delay as f64 / 1000.0
        ));
    }
    if failed.is_empty() {
        println!("uroce-soak: ok");
        std::process::ExitCode::SUCCESS
    } else {
        println!("uroce-soak: FAILED\n{}", failed.join("\n"));
        std::process::ExitCode::FAILURE
    }
}
