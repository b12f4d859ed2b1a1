//! The hook the verbs context calls: ring (post), poll progress (empty CQ poll), flush,
//! multicast groups.

use super::*;

/// The transport hook installed on the context; weak, so the context does not keep the
/// device alive.
pub(super) struct DeviceTransport(pub(super) Weak<DeviceCore>);

impl Transport for DeviceTransport {
    fn ring(&self, qpn: u32) {
        let Some(sh) = self.0.upgrade() else {
            return;
        };
        let now = sh.now();
        let prev_post = sh.last_post.swap(now.as_nanos(), Ordering::Relaxed);
        let in_burst = now.as_nanos().saturating_sub(prev_post) < BURST_GAP_NANOS;
        if in_burst && sh.app_busy(now) {
            // Posts in quick succession from a busy-polling application wait for its next
            // poll (typically right after the burst), which sends them first thing, all
            // together: a burst leaves as one batch (GSO trains). An isolated post (a
            // ping-pong) goes out at once below.
            sh.park(&[qpn]);
            sh.rung.store(true, Ordering::SeqCst);
            return;
        }
        let guard = sh.io.try_lock();
        match guard {
            Ok(mut io) => {
                sh.transmit_now(&mut io, qpn, now);
                // Output parked for this post leaves with it: the ACKs a poll deferred
                // (above all an XRC target QP's, which is never the posting QP: its ACK
                // would otherwise wait for a later step, up to the progress thread's
                // sleep), and QPs rung during a burst.
                if sh.has_ready.swap(false, Ordering::SeqCst) {
                    sh.deferred_since.store(0, Ordering::Relaxed);
                    // Through the state's scratch list: no allocation on the data path.
                    let mut parked = std::mem::take(&mut io.parked);
                    parked.extend(lock(&sh.ready).drain(..).filter(|&q| q != qpn));
                    for &q in &parked {
                        sh.transmit_now(&mut io, q, now);
                    }
                    parked.clear();
                    io.parked = parked;
                }
            }
            Err(_) => sh.mark_ready(qpn),
        }
    }

    fn flush(&self, qpn: u32) {
        let Some(sh) = self.0.upgrade() else {
            return;
        };
        let mut io = lock(&sh.io);
        let now = sh.now();
        sh.transmit_all(&mut io, &[qpn], now);
    }

    fn join_group(&self, group: IpAddr) -> std::io::Result<()> {
        let Some(sh) = self.0.upgrade() else {
            return Err(std::io::Error::from_raw_os_error(
                rustix::io::Errno::NODEV.raw_os_error(),
            ));
        };
        let local = SocketAddr::new(sh.ctx.device().addr(), sh.port);
        let cfg = SocketConfig {
            icrc_policy: sh.icrc,
            ..SocketConfig::default()
        };
        let sock =
            RoceSocket::bind_group(group, local.ip(), sh.port, cfg).map_err(|e| match e {
                SocketError::Bind { source, .. } => source,
                other => std::io::Error::other(other.to_string()),
            })?;
        let fd = Arc::new(sock.as_fd().try_clone_to_owned()?);
        lock(&sh.io).groups.push(GroupSock { group, sock });
        lock(&sh.group_fds).push((group, fd));
        // The progress thread watches the new socket from its next sleep on.
        sh.wake();
        Ok(())
    }

    fn leave_group(&self, group: IpAddr) {
        let Some(sh) = self.0.upgrade() else {
            return;
        };
        lock(&sh.group_fds).retain(|(g, _)| *g != group);
        // Closing the socket leaves the group.
        lock(&sh.io).groups.retain(|g| g.group != group);
        sh.wake();
    }

    fn poll_progress(&self) -> bool {
        let Some(sh) = self.0.upgrade() else {
            return false;
        };
        let at = sh.now();
        let now = at.as_nanos().max(1);
        let prev = sh.last_app_poll.swap(now, Ordering::Relaxed);
        // Only repeated polls mean busy polling: one empty poll before blocking on a
        // completion channel must not take the socket away from the progress thread.
        if prev != 0 && now.saturating_sub(prev) < REPOLL_WINDOW_NANOS {
            sh.busy_since.store(now, Ordering::Relaxed);
        }
        let guard = sh.io.try_lock();
        match guard {
            Ok(mut io) => sh.step_at(&mut io, true, at),
            Err(_) => false,
        }
    }
}
