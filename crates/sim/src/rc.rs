//! The RC engine (`uroce_proto::rc::RcQp`, an `Engine`) on the simulated network, and [`Pair`]: two nodes with
//! one connected RC QP each, the harness the engine's tests use.
//!
//! ```
//! use uroce_proto::rc::CqKind;
//! use uroce_proto::wr::{RecvWr, SendOpcode, SendWr, WcStatus};
//! use uroce_sim::rc::Pair;
//! use uroce_sim::Access;
//!
//! let mut pair = Pair::new(1);
//! let (a, b) = (pair.a, pair.b);
//! let src = pair.register(a, 64, Access::LOCAL_WRITE);
//! let dst = pair.register(b, 64, Access::LOCAL_WRITE);
//! pair.mem(a).write(&src, 0, b"hello").unwrap();
//! pair.post_recv(b, RecvWr::new(7, vec![dst.sge(0, 64)])).unwrap();
//! pair.post_send(a, SendWr::new(1, SendOpcode::Send, vec![src.sge(0, 5)])).unwrap();
//! let wcs = pair.wait_completions(b, CqKind::Recv, 1).unwrap();
//! assert_eq!((wcs[0].wr_id, wcs[0].status, wcs[0].byte_len), (7, WcStatus::Success, 5));
//! assert_eq!(pair.mem(b).read(&dst, 0, 5).unwrap(), b"hello");
//! ```

use std::time::Duration;

use uroce_proto::engine::Engine;
use uroce_proto::rc::{CqKind, PostError, RcConfig, RcQp};
use uroce_proto::wr::{RecvWr, SendWr, WorkCompletion};
use uroce_wire::Psn;

use crate::memory::{Access, RegionHandle, TestMemory};
use crate::net::{LinkConfig, QpId, SimError, SimNet};

/// Steps a [`Pair`] wait may take before it gives up.
pub const WAIT_MAX_STEPS: u64 = 50_000_000;
/// Virtual time a [`Pair`] wait may take before it gives up.
pub const WAIT_MAX_TIME: Duration = Duration::from_secs(3600);

/// Two nodes (0 and 1) with one RC QP each, connected to each other: `a` on node 0,
/// `b` on node 1.
#[derive(Debug)]
pub struct Pair {
    /// The network (links, filters, trace, stats).
    pub net: SimNet<RcQp>,
    /// The QP on node 0.
    pub a: QpId,
    /// The QP on node 1.
    pub b: QpId,
}

impl Pair {
    /// QP number of `a`.
    pub const QPN_A: u32 = 0x11;
    /// QP number of `b`.
    pub const QPN_B: u32 = 0x22;
    /// First PSN `a` sends (and `b` expects).
    pub const PSN_A: u32 = 1000;
    /// First PSN `b` sends (and `a` expects).
    pub const PSN_B: u32 = 5000;

    /// Matched default configurations for `a` and `b` (`RcConfig::new` defaults with
    /// the QPNs and PSNs above).
    pub fn configs() -> (RcConfig, RcConfig) {
        let mut a = RcConfig::new(Pair::QPN_A, Pair::QPN_B);
        let mut b = RcConfig::new(Pair::QPN_B, Pair::QPN_A);
        a.sq_psn = Psn::new(Pair::PSN_A);
        b.rq_psn = Psn::new(Pair::PSN_A);
        b.sq_psn = Psn::new(Pair::PSN_B);
        a.rq_psn = Psn::new(Pair::PSN_B);
        (a, b)
    }

    /// A pair with [`Pair::configs`], perfect links, randomness from `seed`.
    pub fn new(seed: u64) -> Pair {
        let (a, b) = Pair::configs();
        Pair::with_configs(seed, a, b)
    }

    /// A pair with the given configurations (the caller keeps QPNs and PSNs matched;
    /// each `peer` address is set to the other node's, each `local` to its own).
    pub fn with_configs(seed: u64, mut a: RcConfig, mut b: RcConfig) -> Pair {
        let mut net = SimNet::new(seed);
        // invariant: two nodes and two distinct QPNs on distinct nodes cannot fail.
        let n0 = net.add_node().unwrap_or(0);
        let n1 = net.add_node().unwrap_or(1);
        let unspecified = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        a.peer = net.addr(n1).unwrap_or(unspecified);
        b.peer = net.addr(n0).unwrap_or(unspecified);
        a.local = net.addr(n0).ok();
        b.local = net.addr(n1).ok();
        let a = net
            .add_qp(n0, n1, RcQp::new(a))
            .unwrap_or(QpId { node: n0, qpn: 0 });
        let b = net
            .add_qp(n1, n0, RcQp::new(b))
            .unwrap_or(QpId { node: n1, qpn: 0 });
        Pair { net, a, b }
    }

    /// The other QP.
    pub fn peer(&self, qp: QpId) -> QpId {
        if qp == self.a {
            self.b
        } else {
            self.a
        }
    }

    /// Sets both directions to `cfg`.
    ///
    /// # Errors
    /// [`SimError::BadProbability`].
    pub fn set_links(&mut self, cfg: LinkConfig) -> Result<(), SimError> {
        self.net.set_links(self.a.node, self.b.node, cfg)
    }

    /// The memory of `qp`'s node.
    pub fn mem(&self, qp: QpId) -> &TestMemory {
        // invariant: both nodes exist for the pair's lifetime; the fallback is never
        // taken.
        match self.net.memory(qp.node) {
            Ok(m) => m,
            Err(_) => unreachable_memory(),
        }
    }

    /// Registers a region on `qp`'s node.
    pub fn register(&self, qp: QpId, len: usize, access: Access) -> RegionHandle {
        self.mem(qp).register(len, access)
    }

    /// The engine of `qp`.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn qp(&self, qp: QpId) -> Result<&RcQp, SimError> {
        self.net.qp(qp)
    }

    /// The engine of `qp`, mutably.
    ///
    /// # Errors
    /// [`SimError::UnknownQp`].
    pub fn qp_mut(&mut self, qp: QpId) -> Result<&mut RcQp, SimError> {
        self.net.qp_mut(qp)
    }

    /// Posts a send WR on `qp` (it goes out at the next step).
    ///
    /// # Errors
    /// The engine's [`PostError`].
    pub fn post_send(&mut self, qp: QpId, wr: SendWr) -> Result<(), PostError> {
        match self.net.qp_mut(qp) {
            Ok(e) => e.post_send(wr),
            Err(_) => Err(PostError::InvalidWr(uroce_proto::wr::WrError::UnknownQp)),
        }
    }

    /// Posts a receive WR on `qp`.
    ///
    /// # Errors
    /// The engine's [`PostError`].
    pub fn post_recv(&mut self, qp: QpId, wr: RecvWr) -> Result<(), PostError> {
        match self.net.qp_mut(qp) {
            Ok(e) => e.post_recv(wr),
            Err(_) => Err(PostError::InvalidWr(uroce_proto::wr::WrError::UnknownQp)),
        }
    }

    /// Completions of `kind` collected from `qp` so far (not removed).
    pub fn completions(&self, qp: QpId, kind: CqKind) -> Vec<WorkCompletion> {
        self.net
            .completions(qp)
            .map(|c| {
                c.iter()
                    .filter(|(k, _)| *k == kind)
                    .map(|(_, wc)| *wc)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes and returns the completions of `kind` collected from `qp`.
    pub fn take_completions(&mut self, qp: QpId, kind: CqKind) -> Vec<WorkCompletion> {
        let Ok(all) = self.net.take_completions(qp) else {
            return Vec::new();
        };
        let (mine, others): (Vec<_>, Vec<_>) = all.into_iter().partition(|(k, _)| *k == kind);
        // The other kind stays, in order.
        if let Ok(slot) = self.net.completions_mut(qp) {
            *slot = others;
        }
        mine.into_iter().map(|(_, wc)| wc).collect()
    }

    /// Runs until `qp` has at least `n` completions of `kind` collected, then removes
    /// and returns them all (of that kind).
    ///
    /// # Errors
    /// As [`SimNet::run_until`] (with [`WAIT_MAX_STEPS`], [`WAIT_MAX_TIME`]).
    pub fn wait_completions(
        &mut self,
        qp: QpId,
        kind: CqKind,
        n: usize,
    ) -> Result<Vec<WorkCompletion>, SimError> {
        self.net.run_until(
            |net| {
                net.completions(qp)
                    .map(|c| c.iter().filter(|(k, _)| *k == kind).count() >= n)
                    .unwrap_or(false)
            },
            WAIT_MAX_STEPS,
            WAIT_MAX_TIME,
        )?;
        Ok(self.take_completions(qp, kind))
    }

    /// Runs until no packet is in flight and both engines are idle.
    ///
    /// # Errors
    /// As [`SimNet::run_until`].
    pub fn run_until_quiet(&mut self) -> Result<(), SimError> {
        self.net
            .run_until_quiet(WAIT_MAX_STEPS, WAIT_MAX_TIME)
            .map(|_| ())
    }

    /// Runs until `cond` holds.
    ///
    /// # Errors
    /// As [`SimNet::run_until`].
    pub fn run_until(&mut self, cond: impl FnMut(&SimNet<RcQp>) -> bool) -> Result<(), SimError> {
        self.net
            .run_until(cond, WAIT_MAX_STEPS, WAIT_MAX_TIME)
            .map(|_| ())
    }
}

/// An empty memory for the unreachable case in [`Pair::mem`]: every key lookup in it
/// fails, so a test that somehow got here fails too.
fn unreachable_memory() -> &'static TestMemory {
    static EMPTY: std::sync::OnceLock<TestMemory> = std::sync::OnceLock::new();
    EMPTY.get_or_init(TestMemory::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uroce_proto::engine::Engine;
    use uroce_proto::wr::{SendOpcode, WcStatus};

    /// The simulator drives any `Engine` behind a box: an RC pair as `Box<dyn Engine>`
    /// moves a SEND and sees the real peer addresses.
    #[test]
    fn boxed_engines_run_on_the_sim() {
        let (ca, cb) = Pair::configs();
        let mut net: SimNet<Box<dyn Engine>> = SimNet::new(3);
        let (n0, n1) = (net.add_node().unwrap(), net.add_node().unwrap());
        let (mut ca, mut cb) = (ca, cb);
        ca.peer = net.addr(n1).unwrap();
        cb.peer = net.addr(n0).unwrap();
        let a = net.add_qp(n0, n1, Box::new(RcQp::new(ca))).unwrap();
        let b = net.add_qp(n1, n0, Box::new(RcQp::new(cb))).unwrap();
        let mem_a = net.memory(n0).unwrap().register(64, Access::LOCAL_WRITE);
        let mem_b = net.memory(n1).unwrap().register(64, Access::LOCAL_WRITE);
        net.memory(n0).unwrap().write(&mem_a, 0, b"boxed").unwrap();
        let e = net.qp_mut(b).unwrap();
        e.post_recv(RecvWr::new(9, vec![mem_b.sge(0, 64)])).unwrap();
        let mut wr = SendWr::new(1, SendOpcode::Send, vec![mem_a.sge(0, 5)]);
        wr.flags = uroce_proto::wr::SendFlags::SIGNALED;
        net.qp_mut(a).unwrap().post_send(wr).unwrap();
        net.run_until_quiet(10_000, WAIT_MAX_TIME).unwrap();
        let recv = net.take_completions(b).unwrap();
        assert_eq!(recv.len(), 1);
        assert_eq!(recv[0].0, CqKind::Recv);
        assert_eq!((recv[0].1.wr_id, recv[0].1.status), (9, WcStatus::Success));
        assert_eq!(
            net.memory(n1).unwrap().read(&mem_b, 0, 5).unwrap(),
            b"boxed"
        );
        let sent = net.take_completions(a).unwrap();
        assert_eq!(sent.len(), 1);
        assert_eq!(net.trace().transmitted(n0, n1).len(), 1);
    }
}
