//! Running the simulation: the next event (a delivery or a timer) in virtual time,
//! delivery with its checks, and the run-until helpers.

use super::*;

impl<E: Engine> SimNet<E> {
    /// The earliest pending event.
    fn next_event(&self) -> Option<Next> {
        let delivery = self.queue.peek().map(|p| p.at);
        let mut timer: Option<(Instant, QpId)> = None;
        for (node, n) in self.nodes.iter().enumerate() {
            for (&qpn, slot) in &n.qps {
                if let Some(t) = slot.ep.poll_timeout() {
                    if timer.is_none_or(|(best, _)| t < best) {
                        timer = Some((t, QpId { node, qpn }));
                    }
                }
            }
        }
        match (delivery, timer) {
            (Some(d), Some((t, qp))) => {
                // Ties go to the delivery: a response that arrives exactly at the
                // deadline counts as in time.
                if t < d {
                    Some(Next::Timer(t, qp))
                } else {
                    Some(Next::Delivery(d))
                }
            }
            (Some(d), None) => Some(Next::Delivery(d)),
            (None, Some((t, qp))) => Some(Next::Timer(t, qp)),
            (None, None) => None,
        }
    }

    /// When the next event is due (a deadline in the past counts as now).
    pub fn next_event_time(&self) -> Option<Instant> {
        self.next_event().map(|n| match n {
            Next::Delivery(t) | Next::Timer(t, _) => t.max(self.now),
        })
    }

    /// Transmits what is ready, then processes the earliest pending event (advancing
    /// virtual time to it), then transmits again and collects completions. Returns
    /// `false` when nothing was pending.
    ///
    /// # Errors
    /// As [`SimNet::flush`]; [`SimError::TimerStuck`].
    pub fn step(&mut self) -> Result<bool, SimError> {
        self.flush()?;
        let Some(next) = self.next_event() else {
            return Ok(false);
        };
        match next {
            Next::Delivery(at) => {
                self.now = self.now.max(at);
                if let Some(p) = self.queue.pop() {
                    self.deliver(p);
                }
            }
            Next::Timer(at, qp) => {
                self.now = self.now.max(at);
                self.fire_timer(qp)?;
            }
        }
        self.stats.steps += 1;
        self.flush()?;
        Ok(true)
    }

    fn fire_timer(&mut self, qp: QpId) -> Result<(), SimError> {
        let now = self.now;
        let fires = match self.timer_streak {
            Some((q, t, n)) if q == qp && t == now => n + 1,
            _ => 1,
        };
        if fires > self.limits.max_timer_fires {
            return Err(SimError::TimerStuck { qp, at: now, fires });
        }
        self.timer_streak = Some((qp, now, fires));
        self.stats.timeouts += 1;
        self.with_qp(qp, |ep, env, now| {
            ep.handle_timeout(now, &mut engine_env(env))
        })
    }

    fn drop_packet(&mut self, p: &InFlight, reason: DropReason) {
        let counter = match reason {
            DropReason::BadIp => &mut self.stats.bad_ip,
            DropReason::IpChecksum => &mut self.stats.ip_checksum,
            DropReason::UdpChecksum => &mut self.stats.udp_checksum,
            DropReason::NotRoce => &mut self.stats.not_roce,
            DropReason::Icrc => &mut self.stats.icrc,
            DropReason::Parse => &mut self.stats.parse,
            DropReason::Unroutable => &mut self.stats.unroutable,
        };
        *counter += 1;
        self.trace.push(TraceEntry {
            time: self.now,
            id: p.id,
            src: p.src,
            dst: p.dst,
            packet: p.summary,
            event: TraceEvent::Dropped {
                copy: p.copy,
                reason,
            },
        });
    }

    /// The receiving host's checks, then the engine.
    fn deliver(&mut self, p: InFlight) {
        let now = self.now;
        let datagram = match Datagram::parse_ip(&p.datagram) {
            Ok(d) => d,
            Err(_) => return self.drop_packet(&p, DropReason::BadIp),
        };
        let checksum_ok = match datagram.ip_header {
            [_, _, _, _, _, _, _, _, _, _, hi, lo, ..] if datagram.ip_header.len() == 20 => {
                ip::ipv4_checksum(datagram.ip_header) == u16::from_be_bytes([*hi, *lo])
            }
            // IPv6 has no header checksum.
            _ => true,
        };
        if !checksum_ok {
            return self.drop_packet(&p, DropReason::IpChecksum);
        }
        if datagram.udp_header.get(6..8) != Some(&[0, 0][..]) {
            return self.drop_packet(&p, DropReason::UdpChecksum);
        }
        let Ok(roce) = datagram.roce() else {
            return self.drop_packet(&p, DropReason::NotRoce);
        };
        let Some(dst_node) = self.node_by_addr(datagram.dst) else {
            return self.drop_packet(&p, DropReason::Unroutable);
        };
        if datagram.verify_icrc().is_err() {
            return self.drop_packet(&p, DropReason::Icrc);
        }
        let Ok(pkt) = PacketRepr::parse(roce) else {
            return self.drop_packet(&p, DropReason::Parse);
        };
        let qpn = pkt.bth.dest_qp;
        // Whether the source is the QP's peer is the engine's to check (a host's socket
        // delivers a datagram from anyone).
        if !self
            .nodes
            .get(dst_node)
            .is_some_and(|n| n.qps.contains_key(&qpn))
        {
            return self.drop_packet(&p, DropReason::Unroutable);
        }
        let arrival = arrival_of(&datagram);
        if p.corrupted {
            self.stats.corrupted_delivered += 1;
        }
        self.stats.delivered += 1;
        self.trace.push(TraceEntry {
            time: now,
            id: p.id,
            src: p.src,
            dst: p.dst,
            packet: p.summary,
            event: TraceEvent::Delivered { copy: p.copy },
        });
        let node = match self.nodes.get_mut(dst_node) {
            Some(n) => n,
            None => return,
        };
        let Node {
            mem, srq, xrc, qps, ..
        } = node;
        if let Some(slot) = qps.get_mut(&qpn) {
            let mut env = NodeEnv { mem, srq, xrc };
            slot.ep
                .handle_packet(now, &arrival, &pkt, &mut engine_env(&mut env));
        }
    }

    /// Steps until `cond` holds (checked before every step, after transmitting), at most
    /// `max_steps` steps and `max_time` of virtual time from now. Returns the statistics
    /// when the condition held.
    ///
    /// # Errors
    /// [`SimError::StepLimit`], [`SimError::TimeLimit`], [`SimError::Stalled`], or an
    /// engine misbehaviour from [`SimNet::step`].
    pub fn run_until(
        &mut self,
        mut cond: impl FnMut(&SimNet<E>) -> bool,
        max_steps: u64,
        max_time: Duration,
    ) -> Result<Stats, SimError> {
        let limit = self.now + max_time;
        for _ in 0..max_steps {
            self.flush()?;
            if cond(self) {
                return Ok(self.stats());
            }
            match self.next_event_time() {
                None => return Err(SimError::Stalled { now: self.now }),
                Some(next) if next > limit => return Err(SimError::TimeLimit { limit, next }),
                Some(_) => {}
            }
            self.step()?;
        }
        self.flush()?;
        if cond(self) {
            return Ok(self.stats());
        }
        Err(SimError::StepLimit {
            steps: max_steps,
            now: self.now,
        })
    }

    /// Runs until nothing is in flight and every engine is idle (see
    /// [`SimNet::run_until`]).
    ///
    /// # Errors
    /// As [`SimNet::run_until`].
    pub fn run_until_quiet(
        &mut self,
        max_steps: u64,
        max_time: Duration,
    ) -> Result<Stats, SimError> {
        self.run_until(|n| n.is_quiet(), max_steps, max_time)
    }

    /// Advances virtual time by `d`, processing every event due until then.
    ///
    /// # Errors
    /// As [`SimNet::step`]; [`SimError::StepLimit`] after `max_steps`.
    pub fn advance(&mut self, d: Duration, max_steps: u64) -> Result<Stats, SimError> {
        let until = self.now + d;
        for _ in 0..max_steps {
            self.flush()?;
            match self.next_event_time() {
                Some(t) if t <= until => {
                    self.step()?;
                }
                _ => {
                    self.now = self.now.max(until);
                    self.flush()?;
                    return Ok(self.stats());
                }
            }
        }
        Err(SimError::StepLimit {
            steps: max_steps,
            now: self.now,
        })
    }
}
