//! The progress step (receive, deferral, timers, transmit) and the progress thread's loop.

use super::send::send_runs;
use super::*;

impl DeviceCore {
    /// One progress step; returns whether anything was received, timed out or sent.
    ///
    /// With `defer_rx_output` (an application thread polling a CQ), what the received
    /// packets make the QPs send is not sent in this step when their engine said it may
    /// wait ([`Reply::Deferrable`]: the ACK of a SEND or WRITE): the QPs go on the
    /// ready list, so the application sees its completions one system call sooner, and
    /// the ACK leaves with the next step or together with the application's next post
    /// (in a ping-pong, in the same batch as the reply, after it: the RC engine lets the
    /// reply go first, and a one-packet reply and its ACK leave as one GSO datagram).
    pub(super) fn step(&self, io: &mut ProgressState, defer_rx_output: bool) -> bool {
        self.step_at(io, defer_rx_output, self.now())
    }

    /// [`DeviceCore::step`] with the clock already read (`now`, this instant).
    pub(super) fn step_at(
        &self,
        io: &mut ProgressState,
        defer_rx_output: bool,
        now: Instant,
    ) -> bool {
        let mut work = false;
        io.touched.clear();
        // 0. A polling application's own posts (rung since its last step) leave first,
        // together with any ACKs deferred for them.
        if defer_rx_output && self.rung.swap(false, Ordering::SeqCst) {
            // Through the state's scratch list: no allocation on the data path.
            let mut qpns = std::mem::take(&mut io.parked);
            {
                let mut r = lock(&self.ready);
                self.has_ready.store(false, Ordering::SeqCst);
                qpns.extend(r.drain(..));
            }
            self.deferred_since.store(0, Ordering::Relaxed);
            work |= self.transmit_all(io, &qpns, now);
            qpns.clear();
            io.parked = qpns;
        }
        // 1. Receive. When a timer is due, everything already received goes first (an
        // ACK waiting in the socket after this process was not scheduled must count before
        // the deadline is judged), up to RX_ROUNDS_BEFORE_TIMERS batches.
        let Some(local_ip) = io.sock.as_ref().map(|sock| sock.local_addr().ip()) else {
            // A shared device that left the host-wide device: nothing moves any more.
            return work;
        };
        let rounds = if io.timers.values().any(|d| *d <= now) {
            RX_ROUNDS_BEFORE_TIMERS
        } else {
            RX_ROUNDS
        };
        for _ in 0..rounds {
            let ProgressState {
                sock,
                rx,
                touched,
                completed,
                ..
            } = &mut *io;
            let Some(sock) = sock.as_mut() else {
                break;
            };
            // Packets of a batch mostly go to one QP: keep the last reference (it is
            // dropped at the end of the batch, before anything could wait for it).
            let mut last: Option<QpRef> = None;
            // Each packet comes with the parse the socket's check made (parsed once).
            let got = sock.recv_batch_with(rx, |r| {
                let qpn = r.packet.bth.dest_qp;
                // A shared device: a datagram for another member's QP came here through a
                // stale steering program (a member left or died): dropped, counted, and
                // the registry checked at the end of this step. An XRC request is
                // steered by the XRC SRQ its XRCETH names (unless of slot 0).
                let srqn = r.packet.xrceth.map(|x| x.srqn);
                if let Some(h) = self
                    .host
                    .as_ref()
                    .filter(|h| h.is_foreign(h.steered_by(qpn, srqn)))
                {
                    h.foreign();
                    return;
                }
                // Likewise a CM MAD of another member's connection (steered by its
                // communication ID's slot).
                if qpn == uroce_wire::mad::GSI_QPN {
                    if let Some(h) = self.host.as_ref().filter(|h| h.is_foreign_mad(&r.packet)) {
                        h.foreign();
                        return;
                    }
                }
                let qp = match last.take() {
                    Some(q) if q.qp_num() == qpn => q,
                    _ => match self.ctx.qp_for_packet(qpn) {
                        Some(q) => q,
                        None => return,
                    },
                };
                let qp = last.insert(qp);
                // The socket reports the source address, and the ICRC check the IPv4
                // Identification the sender's kernel gave the packet; the IP header's
                // traffic class and hop limit are not asked for (Arrival's defaults).
                let mut from = Arrival::new(r.src.ip(), local_ip);
                if let Some(id) = r.ident {
                    from.ipv4_id = id.identification;
                }
                // The completions the packet produced are already on their CQs (the
                // verbs layer pushed them); only a QP without engine matters here.
                let Some(handled) = qp.engine_handle_packet(now, &from, &r.packet) else {
                    self.no_engine.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                if !touched.contains(&qpn) {
                    touched.push(qpn);
                }
                // The engine says its answer may wait for the application's next post
                // (an ACK of a SEND or WRITE; see below and `Reply::Deferrable`).
                if handled.reply == Reply::Deferrable && !completed.contains(&qpn) {
                    completed.push(qpn);
                }
            });
            drop(last);
            // A shared device whose group's order is uncertain: probes tell this
            // member's index (see `member.rs`).
            if let (Some(h), Some(sock)) = (self.host.as_ref(), io.sock.as_ref()) {
                for (index, key) in io.rx.probes() {
                    h.probe_received(index, key, sock);
                }
            }
            match got {
                Ok(n) if n > 0 => work = true,
                _ => break,
            }
            if io.rx.datagrams() < io.rx.capacity() {
                break;
            }
        }
        // 1b. The multicast groups joined.
        if !io.groups.is_empty() {
            work |= self.receive_groups(io, now);
        }
        if defer_rx_output && !io.completed.is_empty() {
            // The application is about to see what these requests brought (a receive
            // completion, data in its memory) and most likely posts next: the ACKs wait
            // on the ready list and leave with that post, or with a step at most
            // ACK_DEFER_NANOS later.
            let _ = self.deferred_since.compare_exchange(
                0,
                now.as_nanos().max(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            self.park(&io.completed);
            let completed = std::mem::take(&mut io.completed);
            io.touched.retain(|q| !completed.contains(q));
            io.completed = completed;
        }
        io.completed.clear();
        // 2. QPs rung by posters (and output deferred by an earlier step). A polling
        // application leaves deferred output alone for a moment (see above).
        let since = self.deferred_since.load(Ordering::Relaxed);
        let fresh =
            defer_rx_output && since != 0 && now.as_nanos().saturating_sub(since) < ACK_DEFER_NANOS;
        if !fresh && self.has_ready.swap(false, Ordering::SeqCst) {
            self.deferred_since.store(0, Ordering::Relaxed);
            let mut r = lock(&self.ready);
            for qpn in r.drain(..) {
                if !io.touched.contains(&qpn) {
                    io.touched.push(qpn);
                }
            }
        }
        // 3. Timers (the receive phase may have taken a while: what it brought counts
        // before a deadline is judged, and the deadline against the clock now). A step
        // that did nothing so far took no time worth a second clock read.
        let now = if work { self.now().max(now) } else { now };
        // (Into a scratch list kept for its capacity: no allocation on the data path.)
        let mut due = std::mem::take(&mut io.due);
        due.clear();
        due.extend(
            io.timers
                .iter()
                .filter(|(_, d)| **d <= now)
                .map(|(q, _)| *q),
        );
        for &qpn in &due {
            io.timers.remove(&qpn);
            if let Some(qp) = self.ctx.lookup_qp(qpn) {
                qp.engine_handle_timeout(now);
                work = true;
                if !io.touched.contains(&qpn) {
                    io.touched.push(qpn);
                }
            }
        }
        io.due = due;
        // 4. Transmit.
        let touched = std::mem::take(&mut io.touched);
        work |= self.transmit_all(io, &touched, now);
        io.touched = touched;
        // 5. A shared device looks at the host registry when due (see `member.rs`).
        if let (Some(h), Some(sock)) = (&self.host, io.sock.as_ref()) {
            h.maybe_check(sock, now.as_nanos());
        }
        work
    }

    /// Receives from every joined multicast group's socket and hands each datagram for
    /// DestQP 0xFFFFFF to every QP attached to the group (IBA 10.5; see [`crate::mcast`]),
    /// the group's address as the arrival's local address. Returns whether anything was
    /// received.
    fn receive_groups(&self, io: &mut ProgressState, now: Instant) -> bool {
        let mut work = false;
        let ProgressState {
            groups,
            rx,
            touched,
            ..
        } = io;
        for g in groups.iter_mut() {
            for _ in 0..RX_ROUNDS {
                let group = g.group;
                // The members, read once per batch, when its first packet comes.
                let mut members: Option<Vec<u32>> = None;
                let got = g.sock.recv_batch_with(rx, |r| {
                    let members = members.get_or_insert_with(|| self.ctx.mcast_members(group));
                    if r.packet.bth.dest_qp != MULTICAST_QPN || members.is_empty() {
                        self.mcast_dropped.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    let mut from = Arrival::new(r.src.ip(), group);
                    if let Some(id) = r.ident {
                        from.ipv4_id = id.identification;
                    }
                    for &qpn in members.iter() {
                        let Some(qp) = self.ctx.lookup_qp(qpn) else {
                            continue;
                        };
                        if qp.engine_handle_packet(now, &from, &r.packet).is_none() {
                            self.no_engine.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        if !touched.contains(&qpn) {
                            touched.push(qpn);
                        }
                    }
                });
                match got {
                    Ok(n) if n > 0 => work = true,
                    _ => break,
                }
                if rx.datagrams() < rx.capacity() {
                    break;
                }
            }
        }
        work
    }

    /// Transmits for each QP in `qpns` and records its next deadline.
    pub(super) fn transmit_all(&self, io: &mut ProgressState, qpns: &[u32], now: Instant) -> bool {
        let mut work = false;
        for &qpn in qpns {
            if let Some(qp) = self.ctx.lookup_qp(qpn) {
                work |= self.transmit(io, &qp, now);
                match qp.engine_poll_timeout() {
                    Some(d) => {
                        io.timers.insert(qpn, d);
                    }
                    None => {
                        io.timers.remove(&qpn);
                    }
                }
            } else {
                io.timers.remove(&qpn);
            }
        }
        work
    }

    /// Sends what `qp` has to send (bounded); returns whether anything was sent.
    ///
    /// `now` (when the caller's step began) is not what the engines see: the retransmit
    /// timer a request packet arms runs from its emission (IBA Vol 1 chapter 9, Local ACK
    /// Timeout), and the receive phase of a step, or a thread preempted on a loaded host,
    /// can put tens of milliseconds between the two. Each batch reads the clock afresh,
    /// just before the packets are built and sent, so that a timer is never armed earlier
    /// than its packet leaves (which would shorten the Local ACK Timeout and use up
    /// `retry_cnt` early).
    /// Transmits QP `qpn`'s output now (the caller holds the I/O lock) and arms its
    /// timer, waking the progress thread only if it would sleep past the new deadline.
    pub(super) fn transmit_now(&self, io: &mut ProgressState, qpn: u32, now: Instant) {
        if let Some(qp) = self.ctx.lookup_qp(qpn) {
            self.transmit(io, &qp, now);
            if let Some(d) = qp.engine_poll_timeout() {
                io.timers.insert(qpn, d);
                if self.sleeping.load(Ordering::SeqCst)
                    && d.as_nanos() < self.sleep_until.load(Ordering::SeqCst)
                {
                    self.wake();
                }
            }
        }
    }

    fn transmit(&self, io: &mut ProgressState, qp: &QpRef, now: Instant) -> bool {
        let mut sent = false;
        for round in 0..TX_ROUNDS {
            io.lens.clear();
            let now = self.now().max(now);
            let t = qp.engine_transmit(now, &mut io.tx, MAX_PACKET, TX_BATCH, &mut io.lens);
            if t.packets == 0 {
                break;
            }
            sent = true;
            let ProgressState { sock, tx, lens, .. } = io;
            let Some(sock) = sock.as_mut() else {
                break;
            };
            send_runs(sock, self.port, tx, lens);
            if !t.limited {
                break;
            }
            if round + 1 == TX_ROUNDS {
                // More to send: come back in the next step.
                self.mark_ready(qp.qp_num());
            }
        }
        sent
    }
}

pub(super) fn progress_thread(sh: &DeviceCore) {
    let mut buf = [0u8; 8];
    let mut last_work = sh.now();
    // The last known timer deadline, and whether the last wake-up was only to see whether
    // an application's busy polling had expired (no doorbell, no timer due).
    let mut known_deadline: Option<Instant> = None;
    let mut expiry_check = false;
    while !sh.stop.load(Ordering::SeqCst) {
        let busy = |now: Instant| sh.app_busy(now);
        // While an application busy polls it does the work; never wait for the lock then
        // (a blocked lock is a context switch on both sides). A wake-up that only found the
        // application still polling does nothing at all: it would only compete with it.
        let (deadline, worked) = if expiry_check && busy(sh.now()) {
            (known_deadline, false)
        } else if busy(sh.now()) {
            match sh.io.try_lock() {
                Ok(mut io) => {
                    let worked = sh.step(&mut io, false);
                    (sh.next_deadline(&io), worked)
                }
                Err(_) => (None, false),
            }
        } else {
            let mut io = lock(&sh.io);
            let worked = sh.step(&mut io, false);
            (sh.next_deadline(&io), worked)
        };
        let now = sh.now();
        let app_busy = busy(now);
        if worked {
            last_work = now;
        }
        sh.publish(now, false);
        // While traffic flows and no application thread polls, keep stepping for a
        // moment instead of paying a sleep and a wake-up per packet batch.
        if !app_busy && now.saturating_duration_since(last_work) < SPIN_AFTER_WORK {
            // Yield rather than spin: a thread we just woke (an application blocked on a
            // completion channel) gets the core at once on a small machine.
            std::thread::yield_now();
            continue;
        }
        let mut sleep = deadline.map_or(MAX_SLEEP, |d| d.saturating_duration_since(now));
        if app_busy {
            // Wake rarely: every wake-up steals a core from a spinning application on a
            // small machine. But wake when the application's busy polling would expire
            // (no poll for BUSY_POLL_GRACE), to watch the socket again at once: a program
            // may stop polling its CQ to block on a channel or to spin on memory for its
            // peer's next RDMA WRITE (ib_write_lat), and then only this thread serves it.
            // Only when no timer is armed, though: with operations in flight the
            // application is waiting for their completions and keeps polling (a bandwidth
            // test), and extra wake-ups measurably cost it throughput on 2 cores.
            sleep = sleep.min(BUSY_SLEEP);
            if deadline.is_none() {
                let last = sh.busy_since.load(Ordering::Relaxed);
                let expiry = Instant::from_nanos(last)
                    .saturating_add(BUSY_POLL_GRACE)
                    .saturating_duration_since(now);
                sleep = sleep.min(expiry.saturating_add(BUSY_EXPIRY_SLACK));
            }
        }
        sleep = sleep.min(MAX_SLEEP);
        sh.sleeping.store(true, Ordering::SeqCst);
        // Work on the ready list is ours unless an application busy polls (it sends what
        // its own steps deferred, with its next poll or post).
        let ready = !app_busy && sh.has_ready.load(Ordering::SeqCst);
        if ready || sh.stop.load(Ordering::SeqCst) {
            sh.sleeping.store(false, Ordering::SeqCst);
            continue;
        }
        if !sleep.is_zero() {
            sh.sleep_until
                .store(now.saturating_add(sleep).as_nanos(), Ordering::SeqCst);
            let ts = Timespec {
                tv_sec: i64::try_from(sleep.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(sleep.subsec_nanos()),
            };
            let group_fds: Vec<Arc<OwnedFd>> =
                lock(&sh.group_fds).iter().map(|(_, f)| f.clone()).collect();
            let sock_fd = lock(&sh.sock_fd).clone();
            let mut fds = vec![PollFd::new(&sh.doorbell, PollFlags::IN)];
            fds.extend(sock_fd.iter().map(|f| PollFd::new(&**f, PollFlags::IN)));
            fds.extend(group_fds.iter().map(|f| PollFd::new(&**f, PollFlags::IN)));
            // While the application busy-polls, only the doorbell and the timers wake us.
            let n = if app_busy { 1 } else { fds.len() };
            // EINTR and the like just end this sleep early.
            let _ = rustix::event::poll(&mut fds[..n], Some(&ts));
        }
        sh.sleeping.store(false, Ordering::SeqCst);
        let rang = rustix::io::read(&sh.doorbell, &mut buf).is_ok();
        let woke = sh.now();
        known_deadline = deadline;
        expiry_check = app_busy && !rang && deadline.is_none_or(|d| woke < d);
    }
}
