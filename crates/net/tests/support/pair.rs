//! Two network devices on loopback with connected RC queue pairs, for the device-level
//! tests (fault-injected transfers, live captures, ATOMIC WRITE).
//!
//! Include it with `#[path = "support/pair.rs"] mod pair;` (it is not part of
//! `support/mod.rs`, so the socket-level tests do not compile it).
#![allow(dead_code)] // each test binary uses a different subset

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use uroce_net::{FaultConfig, NetConfig, NetDevice};
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, Mr, Pd, Qp, QpCap, QpInitAttr, QpType, RcConnect, RdmaInfo,
    SendFlags, SendOpcode, SendWr, Sge, WorkCompletion,
};
use uroce_wire::pmtu::Pmtu;
use uroce_wire::psn::Psn;

/// How one side of a pair is opened.
#[derive(Debug, Clone)]
pub struct SideConfig {
    /// The device's address (UDP port 4791 on it).
    pub addr: IpAddr,
    /// Device name.
    pub name: String,
    /// Faults on the device's outgoing packets (`None`: none, whatever `UROCE_FAULTS`
    /// says).
    pub faults: Option<FaultConfig>,
    /// The device's own pcap file, if any.
    pub capture: Option<PathBuf>,
    /// Size of the one registered memory region.
    pub mr_len: usize,
    /// Send and receive queue depth of every QP.
    pub queue_depth: u32,
    /// Whether the device may send with UDP GSO.
    pub gso: bool,
    /// `max_inline_data` of every QP.
    pub max_inline: u32,
}

impl SideConfig {
    /// A side on `addr` without faults or capture, 1 MiB of memory, queues of 256.
    pub fn new(addr: &str, name: &str) -> SideConfig {
        SideConfig {
            addr: addr
                .parse()
                .unwrap_or_else(|e| panic!("bad address {addr:?}: {e}")),
            name: name.to_owned(),
            faults: None,
            capture: None,
            mr_len: 1 << 20,
            queue_depth: 256,
            gso: true,
            max_inline: 64,
        }
    }
}

/// One device with a PD, a send CQ, a receive CQ, an RC QP on them and one memory region
/// with every access right. Fields drop in declaration order: QPs before the CQs, the
/// device last.
pub struct Side {
    /// The first RC QP (more: [`Side::add_qp`]).
    pub qp: Qp,
    /// The memory region.
    pub mr: Mr,
    /// Completions of send WRs (of every QP of this side).
    pub send_cq: Cq,
    /// Completions of receive WRs (of every QP of this side).
    pub recv_cq: Cq,
    /// The protection domain.
    pub pd: Pd,
    /// The device.
    pub dev: NetDevice,
    depth: u32,
    max_inline: u32,
}

/// Every access right of a memory region and of a QP.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

impl Side {
    /// Opens the device and creates the verbs objects; panics on failure.
    pub fn open(cfg: &SideConfig) -> Side {
        let mut net = NetConfig::new(cfg.addr);
        net.name = cfg.name.clone();
        net.faults = cfg.faults;
        net.capture = cfg.capture.clone();
        net.gso = cfg.gso;
        let dev = NetDevice::open(net)
            .unwrap_or_else(|e| panic!("open device on {}:4791: {e}", cfg.addr));
        Side::on(dev, cfg)
    }

    /// Creates the verbs objects on `dev`, opened by the caller (`cfg`'s device fields
    /// are not used); panics on failure.
    pub fn on(dev: NetDevice, cfg: &SideConfig) -> Side {
        let ctx = dev.context();
        let pd = ctx.alloc_pd().expect("alloc pd");
        let cqe = (cfg.queue_depth * 4).max(64);
        let send_cq = ctx.create_cq(cqe, None, 0).expect("send cq");
        let recv_cq = ctx.create_cq(cqe, None, 0).expect("recv cq");
        let mr = pd
            .reg_mr(
                MemBlock::new(cfg.mr_len).expect("memory block"),
                all_access(),
            )
            .expect("reg mr");
        let qp = create_qp(&pd, &send_cq, &recv_cq, cfg.queue_depth, cfg.max_inline);
        Side {
            qp,
            mr,
            send_cq,
            recv_cq,
            pd,
            dev,
            depth: cfg.queue_depth,
            max_inline: cfg.max_inline,
        }
    }

    /// Another RC QP on this side's PD and CQs.
    pub fn add_qp(&self) -> Qp {
        create_qp(
            &self.pd,
            &self.send_cq,
            &self.recv_cq,
            self.depth,
            self.max_inline,
        )
    }

    /// The device's address.
    pub fn ip(&self) -> IpAddr {
        self.dev.local_addr().ip()
    }

    /// An SGE of this side's region: `len` bytes at offset `off`.
    pub fn sge(&self, off: usize, len: usize) -> Sge {
        sge(&self.mr, off, len)
    }

    /// The remote address of offset `off` of this side's region.
    pub fn va(&self, off: usize) -> u64 {
        self.mr.iova() + off as u64
    }

    /// A signalled RDMA WRITE of the first `len` bytes of this side's region to the start
    /// of `to`'s region.
    pub fn write_wr(&self, to: &Side, wr_id: u64, len: usize) -> SendWr {
        SendWr {
            wr_id,
            opcode: SendOpcode::RdmaWrite,
            flags: SendFlags::SIGNALED,
            sg_list: vec![self.sge(0, len)].into(),
            rdma: RdmaInfo {
                remote_addr: to.va(0),
                rkey: to.mr.rkey(),
            },
            ..SendWr::default()
        }
    }

    /// Drops the verbs objects, then closes the device (flushing its capture file).
    pub fn close(self) {
        let Side {
            qp,
            mr,
            send_cq,
            recv_cq,
            pd,
            dev,
            ..
        } = self;
        drop((qp, mr, send_cq, recv_cq, pd));
        dev.close().expect("close device");
    }
}

fn create_qp(pd: &Pd, send_cq: &Cq, recv_cq: &Cq, depth: u32, max_inline: u32) -> Qp {
    let cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: max_inline,
    };
    pd.create_qp(&QpInitAttr::new(QpType::Rc, send_cq, recv_cq, cap))
        .expect("create RC qp")
}

/// An SGE of `mr`: `len` bytes at offset `off`.
pub fn sge(mr: &Mr, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.iova() + off as u64,
        length: u32::try_from(len).expect("SGE length fits u32"),
        lkey: mr.lkey(),
    }
}

/// The connection parameters both QPs of a pair get.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOpts {
    /// Path MTU.
    pub mtu: Pmtu,
    /// Local ACK timeout code (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Retries after a timeout or NAK.
    pub retry_cnt: u8,
    /// RNR retries (7: unlimited).
    pub rnr_retry: u8,
    /// RNR timer code the responder advertises.
    pub min_rnr_timer: u8,
    /// READ/atomic requests outstanding, both as initiator and as responder.
    pub rd_atomic: u8,
    /// First PSN of each direction.
    pub start_psn: u32,
}

impl Default for ConnectOpts {
    fn default() -> ConnectOpts {
        ConnectOpts {
            mtu: Pmtu::Mtu1024,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            start_psn: 100,
        }
    }
}

impl ConnectOpts {
    /// The connection attributes towards QP `peer_qpn` of the device at `peer_ip`.
    fn rc(&self, peer_ip: IpAddr, peer_qpn: u32) -> RcConnect {
        RcConnect {
            path_mtu: self.mtu,
            rq_psn: Psn::new(self.start_psn),
            sq_psn: Psn::new(self.start_psn),
            max_dest_rd_atomic: self.rd_atomic,
            max_rd_atomic: self.rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            ..RcConnect::new(peer_ip, peer_qpn)
        }
    }
}

/// Takes `qp` through INIT to RTR, towards QP `peer_qpn` of the device at `peer_ip`.
fn to_rtr(qp: &Qp, peer_ip: IpAddr, peer_qpn: u32, o: &ConnectOpts) {
    let c = o.rc(peer_ip, peer_qpn);
    let (init, mask) = c.init_attr();
    qp.modify(&init, mask).expect("modify to INIT");
    let (rtr, mask) = c.rtr_attr();
    qp.modify(&rtr, mask).expect("modify to RTR");
}

fn to_rts(qp: &Qp, o: &ConnectOpts) {
    // Only the RTS attributes are used: the peer's address was given at RTR.
    let (rts, mask) = o.rc(IpAddr::from([0u8; 4]), 0).rts_attr();
    qp.modify(&rts, mask).expect("modify to RTS");
}

/// Connects `qa` (on `a`) with `qb` (on `b`): both through INIT and RTR, then both to
/// RTS.
pub fn connect_qps(a: &Side, qa: &Qp, b: &Side, qb: &Qp, o: &ConnectOpts) {
    to_rtr(qa, b.ip(), qb.qp_num(), o);
    to_rtr(qb, a.ip(), qa.qp_num(), o);
    to_rts(qa, o);
    to_rts(qb, o);
}

/// Connects the first QPs of `a` and `b`.
pub fn connect(a: &Side, b: &Side, o: &ConnectOpts) {
    connect_qps(a, &a.qp, b, &b.qp, o);
}

/// Polls `cq` (busy, which also drives the device's progress) until `n` completions
/// arrived; panics after `limit`.
pub fn wait(cq: &Cq, n: usize, limit: Duration, what: &str) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        out.extend(cq.poll(n - out.len()));
        assert!(
            start.elapsed() < limit,
            "{what}: timed out after {limit:?} with {} of {n} completions: {out:?}",
            out.len()
        );
    }
    out
}

/// A pseudo-random byte pattern determined by `key` (distinct keys give unrelated
/// patterns, so data of one operation can never pass for another's): the splitmix64
/// sequence of `key`, little-endian.
pub fn pattern_into(key: u64, buf: &mut [u8]) {
    let mut state = key;
    for chunk in buf.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// [`pattern_into`] as a new vector of `len` bytes.
pub fn pattern(key: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    pattern_into(key, &mut v);
    v
}

/// The first offset at which `got` and `want` differ, if any.
pub fn first_difference(got: &[u8], want: &[u8]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(g, w)| g != w)
}
