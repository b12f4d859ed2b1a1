//! The agent's network side: a received MAD checked, matched to its connection (or
//! answered without one) and turned into a table input.

use super::*;

impl CmAgent {
    /// Takes in a MAD that QP1 received from `from`. Never panics; what cannot be used is
    /// dropped and counted.
    pub fn handle_mad(&mut self, now: Instant, from: IpAddr, mad: &[u8]) {
        self.handle_mad_inner(now, from, mad, true);
    }

    pub(super) fn handle_mad_inner(
        &mut self,
        now: Instant,
        from: IpAddr,
        mad: &[u8],
        may_hold: bool,
    ) {
        let Ok(m) = CmMad::parse(mad) else {
            self.stats.malformed += 1;
            return;
        };
        let tid = m.header.transaction_id;
        let ctx = Ctx {
            tid,
            message: Some(&m.message),
        };
        match &m.message {
            CmMessage::Req(req)
                if may_hold
                    && self.held_reqs.len() < MAX_HELD_REQS
                    && !self
                        .listeners
                        .values()
                        .any(|l| l.service_id == req.service_id)
                    && !self
                        .conns
                        .values()
                        .any(|c| c.remote == from && c.remote_comm_id == req.local_comm_id) =>
            {
                // Nobody listens (yet): a server may be listening again right now (a
                // program that destroys its listening id and makes a new one). Decide at
                // the grace deadline.
                if let Ok(raw) = <[u8; MAD_LEN]>::try_from(mad) {
                    self.held_reqs.push((now + UNMATCHED_REQ_GRACE, from, raw));
                } else {
                    self.on_req(now, from, tid, req, ctx);
                }
            }
            CmMessage::Req(req) => self.on_req(now, from, tid, req, ctx),
            CmMessage::SidrReq(req)
                if may_hold
                    && self.held_reqs.len() < MAX_HELD_REQS
                    && !self
                        .listeners
                        .values()
                        .any(|l| l.service_id == req.service_id) =>
            {
                // As for a REQ: a UD server may be listening again in a moment.
                if let Ok(raw) = <[u8; MAD_LEN]>::try_from(mad) {
                    self.held_reqs.push((now + UNMATCHED_REQ_GRACE, from, raw));
                } else {
                    self.on_sidr_req(now, from, tid, req, ctx);
                }
            }
            CmMessage::SidrReq(req) => self.on_sidr_req(now, from, tid, req, ctx),
            CmMessage::Mra(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvMra, ctx),
            CmMessage::Rej(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvRej, ctx),
            CmMessage::Rep(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvRep, ctx),
            CmMessage::Rtu(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvRtu, ctx),
            CmMessage::Drep(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvDrep, ctx),
            CmMessage::Lap(r) => self.deliver(now, from, r.remote_comm_id, CmInput::RecvLap, ctx),
            CmMessage::SidrRep(r) => {
                self.deliver(now, from, r.request_id, CmInput::RecvSidrRep, ctx)
            }
            CmMessage::Dreq(r) => {
                let conn = self
                    .conns
                    .get(&r.remote_comm_id)
                    .filter(|c| c.remote == from && c.remote_comm_id == r.local_comm_id);
                if let Some(c) = conn {
                    // A DREQ counts only if it names our QP (IBA §12.9.7).
                    if c.local_qpn == r.remote_qpn {
                        self.deliver(now, from, r.remote_comm_id, CmInput::RecvDreq, ctx);
                    } else {
                        self.stats.ignored += 1;
                    }
                } else {
                    // Unknown connection: answer so that the peer can finish.
                    self.stats.unmatched += 1;
                    let drep = DrepRepr {
                        local_comm_id: r.remote_comm_id,
                        remote_comm_id: r.local_comm_id,
                        private_data: [0; pd::DREP],
                    };
                    self.send(from, CmMad::new(tid, CmMessage::Drep(drep)));
                }
            }
            CmMessage::ClassPortInfo(_) => {
                if m.header.method == mad::METHOD_GET && !m.header.response {
                    self.answer_class_port_info(from, tid);
                } else {
                    self.stats.ignored += 1;
                }
            }
            CmMessage::Apr(_) | CmMessage::Other { .. } => self.stats.ignored += 1,
        }
    }

    /// Answers a Get(ClassPortInfo) with GetResp and the same transaction ID (IBA 13.4.5,
    /// 13.4.8.1): the CM class version, no traps or notices (CapabilityMask 0),
    /// [`RESP_TIME_VALUE`], and no redirection (zero redirect fields: the class is served
    /// here, on QP1).
    fn answer_class_port_info(&mut self, to: IpAddr, tid: u64) {
        let info = ClassPortInfoRepr {
            base_version: mad::BASE_VERSION,
            class_version: mad::CM_CLASS_VERSION,
            resp_time_value: RESP_TIME_VALUE,
            ..ClassPortInfoRepr::default()
        };
        let mut reply = CmMad::new(tid, CmMessage::ClassPortInfo(info));
        reply.header.method = mad::METHOD_GET;
        reply.header.response = true;
        self.send(to, reply);
    }

    fn deliver(&mut self, now: Instant, from: IpAddr, id: u32, input: CmInput, ctx: Ctx<'_>) {
        let Some(c) = self.conns.get(&id) else {
            self.stats.unmatched += 1;
            return;
        };
        if c.remote != from {
            self.stats.unmatched += 1;
            return;
        }
        // Once the peer's ID is known, every message must name it.
        let peer_id = match ctx.message {
            Some(CmMessage::Rep(r)) => Some(r.local_comm_id),
            Some(CmMessage::Rtu(r)) => Some(r.local_comm_id),
            Some(CmMessage::Drep(r)) => Some(r.local_comm_id),
            Some(CmMessage::Mra(r)) => Some(r.local_comm_id),
            Some(CmMessage::Lap(r)) => Some(r.local_comm_id),
            _ => None,
        };
        let first_rep =
            matches!(c.state, CmState::ReqSent | CmState::MraReqRcvd) && input == CmInput::RecvRep;
        if let Some(peer) = peer_id {
            if c.remote_comm_id != 0 && !first_rep && peer != c.remote_comm_id {
                self.stats.unmatched += 1;
                return;
            }
        }
        if transition(c.state, input).is_none() {
            self.stats.ignored += 1;
            return;
        }
        if first_rep {
            if let Some(CmMessage::Rep(r)) = ctx.message {
                let c = self.conns.get_mut(&id);
                if let Some(c) = c {
                    c.remote_comm_id = r.local_comm_id;
                    c.remote_qpn = r.local_qpn;
                }
            }
        }
        if input == CmInput::RecvDreq {
            if let Some(c) = self.conns.get_mut(&id) {
                c.dreq_tid = ctx.tid;
            }
        }
        self.apply(now, id, input, ctx);
    }

    fn on_req(&mut self, now: Instant, from: IpAddr, tid: u64, req: &ReqRepr, ctx: Ctx<'_>) {
        // A duplicate of a REQ we already have a connection for.
        let dup = self.conns.iter().find_map(|(&id, c)| {
            (c.passive && c.remote == from && c.remote_comm_id == req.local_comm_id).then_some(id)
        });
        if let Some(id) = dup {
            let state = self.conns.get(&id).map(|c| c.state);
            if state.is_some_and(|s| transition(s, CmInput::RecvReq).is_some()) {
                self.apply(now, id, CmInput::RecvReq, ctx);
            } else {
                self.stats.ignored += 1;
            }
            return;
        }
        let rej = |reason: u16| RejRepr {
            local_comm_id: 0,
            remote_comm_id: req.local_comm_id,
            message_rejected: msg_kind::REQ,
            reject_info_length: 0,
            reason,
            ari: [0; INFO_LEN],
            private_data: [0; pd::REJ],
        };
        // A new REQ from a QP that is connected to us under another communication ID.
        let stale = self.conns.values().any(|c| {
            c.remote == from
                && c.remote_qpn == req.local_qpn
                && matches!(
                    c.state,
                    CmState::Established
                        | CmState::RepSent
                        | CmState::MraRepRcvd
                        | CmState::DreqSent
                        | CmState::DreqRcvd
                )
        });
        if stale {
            self.stats.ignored += 1;
            self.send(
                from,
                CmMad::new(tid, CmMessage::Rej(rej(rej_reason::STALE_CONN))),
            );
            return;
        }
        let Some((&listener, _)) = self
            .listeners
            .iter()
            .find(|(_, l)| l.service_id == req.service_id)
        else {
            self.stats.unmatched += 1;
            self.send(
                from,
                CmMad::new(tid, CmMessage::Rej(rej(rej_reason::INVALID_SERVICE_ID))),
            );
            return;
        };
        // Bounded state under a flood of REQs: per listener, what its application has not
        // answered yet; per peer address, what is not yet established. Dropped, not
        // rejected: a REJ would go to an address the REQ may have forged, and a real
        // requester sends its REQ again after its timeout.
        let (mut pending, mut from_peer) = (0, 0);
        for c in self.conns.values().filter(|c| c.passive) {
            let unanswered = matches!(c.state, CmState::ReqRcvd | CmState::MraReqSent);
            if unanswered && c.listener == listener {
                pending += 1;
            }
            if c.remote == from
                && (unanswered || matches!(c.state, CmState::RepSent | CmState::MraRepRcvd))
            {
                from_peer += 1;
            }
        }
        if pending >= self.config.max_pending_per_listener
            || from_peer >= self.config.max_unestablished_per_peer
        {
            self.stats.req_over_limit += 1;
            return;
        }
        let Ok(id) = self.alloc_id() else {
            self.send(
                from,
                CmMad::new(tid, CmMessage::Rej(rej(rej_reason::NO_RESOURCES))),
            );
            return;
        };
        let mut c = Conn::new(CmState::Listen, from);
        c.passive = true;
        c.listener = listener;
        c.remote_comm_id = req.local_comm_id;
        c.remote_qpn = req.local_qpn;
        c.req_tid = tid;
        c.timeout = self.peer_wait(req.local_cm_response_timeout);
        c.max_retries = req.max_cm_retries;
        c.timewait = self.peer_wait(req.primary_path.local_ack_timeout);
        // The requester gives up after its response timeout × (retries + 1) (IBA 12.6.5:
        // Remote CM Response Timeout, Max CM Retries).
        let requester_waits = self
            .peer_wait(req.remote_cm_response_timeout)
            .saturating_mul(u32::from(req.max_cm_retries) + 1);
        c.unanswered_until = Some(now + requester_waits.min(self.config.max_unanswered_req));
        c.req = Some(*req);
        self.conns.insert(id, c);
        self.apply(now, id, CmInput::RecvReq, ctx);
        // The event names the listener.
        if let Some(CmEvent::ReqReceived { listener: l, .. }) = self.events.back_mut() {
            *l = ConnId(listener);
        }
    }

    fn on_sidr_req(
        &mut self,
        now: Instant,
        from: IpAddr,
        tid: u64,
        req: &SidrReqRepr,
        ctx: Ctx<'_>,
    ) {
        let found = self
            .listeners
            .iter()
            .find(|(_, l)| l.service_id == req.service_id)
            .map(|(&id, l)| (id, l.sidr, l.sidr_deferred));
        let answer = match found {
            Some((listener, Some(answer), _)) => Some((listener, Some(answer))),
            Some((listener, None, true)) => Some((listener, None)),
            _ => None,
        };
        let Some((listener, answer)) = answer else {
            self.stats.unmatched += 1;
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status: sidr_status::UNSUPPORTED,
                additional_info_length: 0,
                qpn: 0,
                service_id: req.service_id,
                qkey: 0,
                additional_info: [0; INFO_LEN],
                private_data: [0; pd::SIDR_REP],
            };
            self.send(from, CmMad::new(tid, CmMessage::SidrRep(rep)));
            return;
        };
        let Ok(id) = self.alloc_id() else {
            return;
        };
        let mut c = Conn::new(CmState::Listen, from);
        c.remote_comm_id = req.request_id;
        c.req_tid = tid;
        c.sidr_req = Some(*req);
        c.sidr_answer = answer;
        self.conns.insert(id, c);
        self.apply(now, id, CmInput::RecvSidrReq, ctx);
        if let Some(CmEvent::SidrReqReceived { listener: l, .. }) = self.events.back_mut() {
            *l = ConnId(listener);
        }
        if answer.is_some() {
            self.apply(now, id, CmInput::SidrAnswer, NO_CTX);
        }
    }
}
