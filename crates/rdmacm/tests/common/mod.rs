//! Helpers of the RDMA-CM tests: devices on loopback, QP resources, one message.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uroce_net::{FaultConfig, NetConfig, NetDevice};
use uroce_rdmacm::{CmId, RdmaCm};
use uroce_verbs::{
    AccessFlags, Cq, MemBlock, Mr, Pd, QpCap, QpInitAttr, QpType, RecvWr, SendWr, Sge, WcStatus,
    WorkCompletion,
};

pub const T: Duration = Duration::from_secs(10);

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

pub fn sa(s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(s), port)
}

pub fn device(
    addr: &str,
    faults: Option<&str>,
    capture: Option<&std::path::Path>,
) -> Arc<NetDevice> {
    let mut cfg = NetConfig::new(ip(addr));
    cfg.faults = faults.map(|f| FaultConfig::parse(f).expect("faults"));
    cfg.capture = capture.map(std::path::Path::to_path_buf);
    Arc::new(NetDevice::open(cfg).expect("open device"))
}

/// One `RdmaCm` with a device at each address.
pub fn cm_with(addrs: &[&str], faults: Option<&str>) -> RdmaCm {
    let cm = RdmaCm::new();
    for a in addrs {
        cm.add_device(device(a, faults, None)).expect("add device");
    }
    cm
}

/// What a connection side needs for its QP.
pub struct Res {
    pub pd: Pd,
    pub cq: Cq,
    pub mr: Mr,
}

impl Res {
    pub fn new(id: &CmId) -> Res {
        let dev = id.device().expect("bound id");
        let pd = dev.context().alloc_pd().expect("pd");
        let cq = dev.context().create_cq(64, None, 0).expect("cq");
        let mr = pd
            .reg_mr(MemBlock::new(4096).expect("mem"), AccessFlags::LOCAL_WRITE)
            .expect("mr");
        Res { pd, cq, mr }
    }

    pub fn attr(&self, t: QpType) -> QpInitAttr<'_> {
        QpInitAttr::new(
            t,
            &self.cq,
            &self.cq,
            QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
        )
    }

    pub fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.iova() + off as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    pub fn recv_wr(&self, off: usize, len: usize) -> RecvWr {
        RecvWr::new(7, vec![self.sge(off, len)])
    }

    pub fn send_wr(&self, off: usize, data: &[u8]) -> SendWr {
        self.mr.block().copy_in(off, data).expect("copy in");
        SendWr::send(9, vec![self.sge(off, data.len())])
    }

    /// One completion, polling at most `T`.
    pub fn completion(&self) -> WorkCompletion {
        let deadline = Instant::now() + T;
        while Instant::now() < deadline {
            if let Some(wc) = self.cq.poll(1).pop() {
                return wc;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        panic!("no completion within {T:?}");
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        self.mr.block().copy_out(off, &mut out).expect("copy out");
        out
    }
}

pub fn ok(wc: &WorkCompletion) {
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
}
