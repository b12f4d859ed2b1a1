//! # Multicast groups: `ibv_attach_mcast` / `ibv_detach_mcast`
//!
//! A context keeps, per multicast GID, the UD QPs attached to it. RoCEv2 (IBA vol 1
//! Annex A17) maps a multicast GID onto an IP multicast group: an IPv6 multicast address
//! (`ff00::/8`) or an IPv4-mapped one (`::ffff:224.0.0.0/4`). A datagram sent to such a
//! GID carries DestQP `0xFFFFFF` ([`MULTICAST_QPN`]; IBA 9.8.3 / 10.5) and goes to the IP
//! group; the receiving device hands a copy to every QP attached to the group, each
//! applying its own Q_Key check (IBA 10.2.5).
//!
//! * Only UD QPs attach (the kernel's `ib_attach_mcast` rule): any other type, or a GID
//!   that is not multicast, is refused with [`McastError`] (`EINVAL`).
//! * Attaching twice is not an error (the QP is attached once, as in Linux rxe); detaching
//!   a QP that is not attached is ([`McastError::NotAttached`], `EINVAL`, as rxe).
//! * The first attachment of a group asks the I/O layer to join the IP group
//!   ([`crate::engine::Transport::join_group`]); the last detachment leaves it. A context
//!   without a transport only records the membership.
//! * A destroyed QP is detached from every group.
//! * Limits: [`MAX_MCAST_GRP`] groups per context and [`MAX_MCAST_QP_ATTACH`] QPs per
//!   group (the values Linux rxe reports), beyond them `ENOMEM`.
//!
//! The lookup the network side uses ([`crate::Context::mcast_members`]) takes only the
//! membership lock; attach and detach are serialised by a second lock held across the
//! transport call, so that the transport may take its own locks (which the receive path
//! holds while looking members up) without a lock-order inversion.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::device::Gid;
use crate::sync::{lock, Mutex};

/// DestQP of every multicast datagram (IBA 9.8.3: the multicast QPN).
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// Multicast groups per context (`max_mcast_grp`; Linux rxe's value).
pub const MAX_MCAST_GRP: u32 = 8192;
/// QPs per multicast group (`max_mcast_qp_attach`; Linux rxe's value).
pub const MAX_MCAST_QP_ATTACH: u32 = 56;
/// QP attachments over all groups (`max_total_mcast_qp_attach`; Linux rxe's value).
pub const MAX_TOTAL_MCAST_QP_ATTACH: u32 = 0x70000;

/// Why an attach or detach was refused.
#[derive(Debug, thiserror::Error)]
pub enum McastError {
    /// The GID is not a multicast GID (`EINVAL`).
    #[error("GID {0:?} is not a multicast GID")]
    NotMulticast(Gid),
    /// Only UD QPs attach to multicast groups (`EINVAL`).
    #[error("only UD QPs attach to multicast groups")]
    WrongQpType,
    /// Detach of a QP that is not attached to the group (`EINVAL`).
    #[error("the QP is not attached to the group")]
    NotAttached,
    /// Too many groups or attachments (`ENOMEM`).
    #[error("multicast limit reached ({0})")]
    Limit(&'static str),
    /// The I/O layer could not join the IP group.
    #[error("joining the IP multicast group failed: {0}")]
    Join(#[source] std::io::Error),
}

/// Whether `gid` is a RoCEv2 multicast GID: an IPv6 multicast address or an IPv4-mapped
/// IPv4 multicast address.
pub fn is_multicast_gid(gid: Gid) -> bool {
    gid.to_ip().is_multicast()
}

/// The IP group of a multicast GID.
pub fn group_ip(gid: Gid) -> IpAddr {
    gid.to_ip()
}

/// The per-context membership table.
#[derive(Default)]
pub(crate) struct McastTable {
    /// Serialises attach/detach (held across the transport's join/leave).
    ops: Mutex<()>,
    /// Group IP → attached QPNs, in attach order.
    members: Mutex<HashMap<IpAddr, Vec<u32>>>,
}

impl McastTable {
    /// Attaches `qpn` to `group`; `join` is called when the group is new to the context.
    pub(crate) fn attach(
        &self,
        group: IpAddr,
        qpn: u32,
        join: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<(), McastError> {
        let _ops = lock(&self.ops);
        {
            let mut m = lock(&self.members);
            if let Some(q) = m.get(&group) {
                if q.contains(&qpn) {
                    return Ok(());
                }
                if q.len() >= MAX_MCAST_QP_ATTACH as usize {
                    return Err(McastError::Limit("max_mcast_qp_attach"));
                }
            } else if m.len() >= MAX_MCAST_GRP as usize {
                return Err(McastError::Limit("max_mcast_grp"));
            }
            let total: usize = m.values().map(Vec::len).sum();
            if total >= MAX_TOTAL_MCAST_QP_ATTACH as usize {
                return Err(McastError::Limit("max_total_mcast_qp_attach"));
            }
            if let Some(q) = m.get_mut(&group) {
                q.push(qpn);
                return Ok(());
            }
        }
        join().map_err(McastError::Join)?;
        lock(&self.members).entry(group).or_default().push(qpn);
        Ok(())
    }

    /// Detaches `qpn` from `group`; `leave` is called when the group has no QP left.
    pub(crate) fn detach(
        &self,
        group: IpAddr,
        qpn: u32,
        leave: impl FnOnce(),
    ) -> Result<(), McastError> {
        let _ops = lock(&self.ops);
        let empty = {
            let mut m = lock(&self.members);
            let q = m.get_mut(&group).ok_or(McastError::NotAttached)?;
            let i = q
                .iter()
                .position(|&n| n == qpn)
                .ok_or(McastError::NotAttached)?;
            q.remove(i);
            if q.is_empty() {
                m.remove(&group);
                true
            } else {
                false
            }
        };
        if empty {
            leave();
        }
        Ok(())
    }

    /// Detaches `qpn` from every group; calls `leave` for each group left empty.
    pub(crate) fn detach_all(&self, qpn: u32, mut leave: impl FnMut(IpAddr)) {
        let _ops = lock(&self.ops);
        let emptied: Vec<IpAddr> = {
            let mut m = lock(&self.members);
            let mut emptied = Vec::new();
            m.retain(|g, q| {
                q.retain(|&n| n != qpn);
                if q.is_empty() {
                    emptied.push(*g);
                    false
                } else {
                    true
                }
            });
            emptied
        };
        for g in emptied {
            leave(g);
        }
    }

    /// The QPs attached to `group`, in attach order.
    pub(crate) fn members(&self, group: IpAddr) -> Vec<u32> {
        lock(&self.members).get(&group).cloned().unwrap_or_default()
    }

    /// The groups with at least one QP attached.
    pub(crate) fn groups(&self) -> Vec<IpAddr> {
        lock(&self.members).keys().copied().collect()
    }
}
