//! Packets into the network: what the engines transmit (sealed, routed, scheduled on
//! their link with its loss, duplication, reordering, corruption and delay) and what a
//! test injects.

use super::*;

impl<E: Engine> SimNet<E> {
    /// Schedules a test-made packet from `src` to `dst` for delivery after `delay`: the
    /// datagram is built and sealed like an engine's (source port of `src_qpn`), then
    /// goes through the receiver's checks. It bypasses the link model and the filter.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`], [`SimError::Wire`] if the packet cannot be emitted.
    pub fn inject(
        &mut self,
        src: usize,
        src_qpn: u32,
        dst: usize,
        pkt: &PacketRepr<'_>,
        delay: Duration,
    ) -> Result<(), SimError> {
        let mut roce = vec![0u8; pkt.buffer_len()];
        let len = pkt.emit(&mut roce).map_err(SimError::Wire)?;
        roce.truncate(len);
        let datagram = self.seal(src, src_qpn, dst, &roce)?;
        self.inject_datagram(src, dst, datagram, PacketSummary::of(pkt), delay)
    }

    /// Schedules raw IP datagram bytes (anything: they need not parse) from `src` to
    /// `dst` after `delay`, bypassing the link model.
    ///
    /// # Errors
    /// [`SimError::UnknownNode`].
    pub fn inject_raw(
        &mut self,
        src: usize,
        dst: usize,
        datagram: Vec<u8>,
        delay: Duration,
    ) -> Result<(), SimError> {
        let summary = Datagram::parse_ip(&datagram)
            .ok()
            .and_then(|d| PacketRepr::parse(d.payload).ok())
            .map_or(PacketSummary::of(&PacketRepr::new(empty_bth(), &[])), |p| {
                PacketSummary::of(&p)
            });
        self.inject_datagram(src, dst, datagram, summary, delay)
    }

    /// Builds the sealed IP datagram a QP `src_qpn` on `src` would send to `dst` around
    /// `roce` (BTH..ICRC, ICRC bytes overwritten).
    ///
    /// # Errors
    /// [`SimError::UnknownNode`], [`SimError::Wire`].
    pub fn seal(
        &self,
        src: usize,
        src_qpn: u32,
        dst: usize,
        roce: &[u8],
    ) -> Result<Vec<u8>, SimError> {
        let ep = Endpoints::roce(self.addr(src)?, self.addr(dst)?, source_port(src_qpn));
        let headers = ep.headers_len().map_err(SimError::Wire)?;
        let mut datagram = vec![0u8; headers + roce.len()];
        let (h, body) = datagram.split_at_mut(headers);
        let (ip_len, _udp_len) = ip::roce_headers(&ep, roce.len(), h).map_err(SimError::Wire)?;
        body.copy_from_slice(roce);
        let (ip_h, udp_h) = h.split_at(ip_len);
        icrc::seal(ip_h, udp_h, body).map_err(SimError::Wire)?;
        Ok(datagram)
    }

    fn inject_datagram(
        &mut self,
        src: usize,
        dst: usize,
        datagram: Vec<u8>,
        summary: PacketSummary,
        delay: Duration,
    ) -> Result<(), SimError> {
        self.node(src)?;
        self.node(dst)?;
        let id = self.next_id;
        self.next_id += 1;
        self.stats.injected += 1;
        let at = self.now + delay;
        self.trace.push(TraceEntry {
            time: self.now,
            id,
            src,
            dst,
            packet: summary,
            event: TraceEvent::InFlight {
                copy: 0,
                arrive_at: at,
                corrupted_bit: None,
                reordered: false,
            },
        });
        self.schedule(at, id, 0, src, dst, false, summary, datagram);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn schedule(
        &mut self,
        at: Instant,
        id: u64,
        copy: u8,
        src: usize,
        dst: usize,
        corrupted: bool,
        summary: PacketSummary,
        datagram: Vec<u8>,
    ) {
        let seq = self.seq;
        self.seq += 1;
        self.queue.push(InFlight {
            at,
            seq,
            id,
            copy,
            src,
            dst,
            corrupted,
            summary,
            datagram,
        });
    }

    /// Lets every engine transmit what it has ready now, and collects completions and
    /// events. [`SimNet::step`] does this before and after each event; call it directly
    /// after posting work if you want to look at the trace before stepping.
    ///
    /// # Errors
    /// [`SimError::InvalidTransmit`], [`SimError::TransmitOverflow`],
    /// [`SimError::TransmitFlood`], [`SimError::Wire`].
    pub fn flush(&mut self) -> Result<(), SimError> {
        for node in 0..self.nodes.len() {
            // QPNs in order without holding a borrow across the transmissions (and without
            // allocating): the next key after the previous one.
            let mut next = self
                .nodes
                .get(node)
                .and_then(|n| n.qps.keys().next().copied());
            while let Some(qpn) = next {
                self.transmit_all(QpId { node, qpn })?;
                next = self.nodes.get(node).and_then(|n| {
                    n.qps
                        .range((std::ops::Bound::Excluded(qpn), std::ops::Bound::Unbounded))
                        .next()
                        .map(|(k, _)| *k)
                });
            }
        }
        self.collect();
        Ok(())
    }

    fn collect(&mut self) {
        for node in &mut self.nodes {
            for slot in node.qps.values_mut() {
                // Bounded by what the engine has queued; each call removes one.
                while let Some(c) = slot.ep.poll_completion() {
                    slot.completions.push(c);
                }
                while let Some(e) = slot.ep.poll_event() {
                    slot.events.push(e);
                }
            }
        }
    }

    fn transmit_all(&mut self, qp: QpId) -> Result<(), SimError> {
        let now = self.now;
        for _ in 0..self.limits.max_burst {
            let mut buf = std::mem::take(&mut self.buf);
            let sent = {
                let node = self
                    .nodes
                    .get_mut(qp.node)
                    .ok_or(SimError::UnknownNode(qp.node))?;
                let Node {
                    mem, srq, xrc, qps, ..
                } = node;
                let slot = qps.get_mut(&qp.qpn).ok_or(SimError::UnknownQp(qp))?;
                let mut env = NodeEnv { mem, srq, xrc };
                slot.ep
                    .poll_transmit(now, &mut engine_env(&mut env), &mut buf)
            };
            let result = match sent {
                None => {
                    self.buf = buf;
                    return Ok(());
                }
                Some(t) => self.send(qp, t.dst, &buf, t.len),
            };
            self.buf = buf;
            result?;
        }
        Err(SimError::TransmitFlood {
            qp,
            limit: self.limits.max_burst,
        })
    }

    /// The node a packet from `src` to `addr` reaches: the node with that address, if it
    /// is of the sender's address family (a socket cannot send across families).
    fn route(&self, src: usize, addr: IpAddr) -> Option<usize> {
        let from = self.nodes.get(src)?.addr;
        if from.is_ipv4() != addr.is_ipv4() {
            return None;
        }
        self.node_by_addr(addr)
    }

    /// One engine packet: checks, routes by its destination address, seals, and puts it
    /// through the link.
    fn send(&mut self, qp: QpId, dst: IpAddr, buf: &[u8], len: usize) -> Result<(), SimError> {
        let roce = buf.get(..len).ok_or(SimError::TransmitOverflow {
            qp,
            len,
            buf: buf.len(),
        })?;
        let route = self.route(qp.node, dst);
        let (summary, filter_verdict) = match PacketRepr::parse(roce) {
            Ok(pkt) => {
                let verdict = match route {
                    Some(peer) => {
                        let link = self.links.entry((qp.node, peer)).or_default();
                        let nth = link.sent;
                        link.filter
                            .as_mut()
                            .map_or(Verdict::Deliver, |f| f(&pkt, nth))
                    }
                    None => Verdict::Deliver,
                };
                (PacketSummary::of(&pkt), verdict)
            }
            Err(error) => {
                if self.strict {
                    return Err(SimError::InvalidTransmit { qp, len, error });
                }
                let blank = PacketRepr::new(empty_bth(), &[]);
                (PacketSummary::of(&blank), Verdict::Deliver)
            }
        };
        let Some(peer) = route else {
            // No node has this address: the packet leaves and is lost (counted, traced
            // with the destination node NO_NODE).
            let id = self.next_id;
            self.next_id += 1;
            self.stats.transmitted += 1;
            self.stats.transmitted_bytes += len as u64;
            self.stats.unroutable += 1;
            for event in [
                TraceEvent::Transmitted,
                TraceEvent::Dropped {
                    copy: 0,
                    reason: DropReason::Unroutable,
                },
            ] {
                self.trace.push(TraceEntry {
                    time: self.now,
                    id,
                    src: qp.node,
                    dst: NO_NODE,
                    packet: summary,
                    event,
                });
            }
            return Ok(());
        };
        let link = self.links.entry((qp.node, peer)).or_default();
        link.sent += 1;
        let cfg = link.cfg;
        let id = self.next_id;
        self.next_id += 1;
        self.stats.transmitted += 1;
        self.stats.transmitted_bytes += len as u64;
        let now = self.now;
        let src = qp.node;
        let entry = |event| TraceEntry {
            time: now,
            id,
            src,
            dst: peer,
            packet: summary,
            event,
        };
        self.trace.push(entry(TraceEvent::Transmitted));

        if filter_verdict == Verdict::Drop {
            self.stats.filtered += 1;
            self.trace.push(entry(TraceEvent::Filtered));
            return Ok(());
        }
        if self.rng.random::<f64>() < cfg.loss {
            self.stats.lost += 1;
            self.trace.push(entry(TraceEvent::Lost));
            return Ok(());
        }
        let mut datagram = self.seal(qp.node, qp.qpn, peer, roce)?;
        let mut copies: u8 = 1;
        if filter_verdict == Verdict::Duplicate {
            copies += 1;
        }
        if self.rng.random::<f64>() < cfg.dup {
            copies += 1;
        }
        self.stats.duplicated += u64::from(copies - 1);
        let extra = match filter_verdict {
            Verdict::Delay(d) => d,
            _ => Duration::ZERO,
        };
        for copy in 0..copies {
            let mut at = now + cfg.delay + extra;
            let reordered = self.rng.random::<f64>() < cfg.reorder;
            if reordered {
                let max = if cfg.jitter.is_zero() {
                    cfg.delay.max(Duration::from_micros(10))
                } else {
                    cfg.jitter
                };
                let max_ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
                at += Duration::from_nanos(self.rng.random_range(1..=max_ns));
                self.stats.reordered += 1;
            }
            // The last copy takes the datagram itself: no copy in the common case.
            let mut data = if copy + 1 == copies {
                std::mem::take(&mut datagram)
            } else {
                datagram.clone()
            };
            let mut corrupted_bit = None;
            if self.rng.random::<f64>() < cfg.corrupt {
                let bits = (data.len() as u64) * 8;
                if bits > 0 {
                    let bit = self.rng.random_range(0..bits);
                    if let Some(b) = usize::try_from(bit / 8).ok().and_then(|i| data.get_mut(i)) {
                        *b ^= 0x80 >> (bit % 8);
                    }
                    corrupted_bit = u32::try_from(bit).ok();
                    self.stats.corrupted += 1;
                }
            }
            self.trace.push(entry(TraceEvent::InFlight {
                copy,
                arrive_at: at,
                corrupted_bit,
                reordered,
            }));
            self.schedule(
                at,
                id,
                copy,
                src,
                peer,
                corrupted_bit.is_some(),
                summary,
                data,
            );
        }
        Ok(())
    }
}
