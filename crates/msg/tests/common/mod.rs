//! Two network devices in one process with a connected endpoint pair.

#![allow(dead_code)]

use std::net::IpAddr;

use uroce_msg::{Endpoint, MsgConfig, PendingEndpoint, SendPool};
use uroce_net::{FaultConfig, NetConfig, NetDevice};
use uroce_verbs::Pd;

pub struct Side {
    pub ep: Endpoint,
    pub pool: SendPool,
    pub pd: Pd,
    pub dev: NetDevice,
}

pub fn device(addr: &str, faults: Option<FaultConfig>) -> NetDevice {
    let mut cfg = NetConfig::new(addr.parse::<IpAddr>().expect("addr"));
    cfg.faults = faults;
    NetDevice::open(cfg).expect("open device")
}

/// A connected pair on `a` and `b` with `pool_bufs` send buffers of `buf` bytes each side.
pub fn pair(
    a: &str,
    b: &str,
    faults: Option<FaultConfig>,
    cfg: &MsgConfig,
    pool_bufs: usize,
) -> (Side, Side) {
    let da = device(a, faults);
    let db = device(
        b,
        faults.map(|f| FaultConfig {
            seed: f.seed + 1,
            ..f
        }),
    );
    let pda = da.context().alloc_pd().expect("pd");
    let pdb = db.context().alloc_pd().expect("pd");
    let pa = SendPool::new(&pda, pool_bufs, cfg.recv_buf_size).expect("pool");
    let pb = SendPool::new(&pdb, pool_bufs, cfg.recv_buf_size).expect("pool");
    let ea = PendingEndpoint::new(da.context(), &pda, &pa, cfg).expect("endpoint");
    let eb = PendingEndpoint::new(db.context(), &pdb, &pb, cfg).expect("endpoint");
    let (ia, ib) = (ea.info(), eb.info());
    let ea = ea
        .connect(db.local_addr().ip(), ib, cfg)
        .expect("connect a");
    let eb = eb
        .connect(da.local_addr().ip(), ia, cfg)
        .expect("connect b");
    (
        Side {
            ep: ea,
            pool: pa,
            pd: pda,
            dev: da,
        },
        Side {
            ep: eb,
            pool: pb,
            pd: pdb,
            dev: db,
        },
    )
}

/// Deterministic message content: the message number and its length, then a pattern.
pub fn fill(buf: &mut [u8], n: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (n as usize).wrapping_mul(131).wrapping_add(i * 7) as u8;
    }
    if let Some(h) = buf.get_mut(..8) {
        h.copy_from_slice(&n.to_le_bytes());
    }
}

pub fn check(buf: &[u8], n: u64) -> bool {
    let mut want = vec![0; buf.len()];
    fill(&mut want, n);
    want == buf
}
