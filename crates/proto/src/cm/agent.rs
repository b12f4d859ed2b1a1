//! The agent's application side: listening, connecting, accepting, rejecting,
//! disconnecting and SIDR requests, and what the caller polls (MADs to send, events, the
//! next deadline) and the timers.

use super::*;

impl CmAgent {
    /// An agent with no connections.
    pub fn new(config: AgentConfig) -> CmAgent {
        CmAgent {
            next_id: if config.id_range.contains(config.first_id) {
                config.first_id
            } else {
                config.id_range.first()
            },
            next_tid: 0,
            config,
            listeners: BTreeMap::new(),
            held_reqs: Vec::new(),
            conns: BTreeMap::new(),
            tx: VecDeque::new(),
            events: VecDeque::new(),
            stats: CmStats::default(),
        }
    }

    /// The drop and send counters.
    pub fn stats(&self) -> CmStats {
        self.stats
    }

    /// The state of a connection (`Listen` for a listener), `None` once it is gone.
    pub fn state(&self, id: ConnId) -> Option<CmState> {
        if self.listeners.contains_key(&id.0) {
            return Some(CmState::Listen);
        }
        self.conns.get(&id.0).map(|c| c.state)
    }

    /// The communication ID it tries next when it allots one (IDs are allotted by a
    /// cursor that moves forward through [`AgentConfig::id_range`]): an agent that takes
    /// over a range another left starts there ([`AgentConfig::first_id`]).
    pub fn next_id(&self) -> u32 {
        self.next_id
    }

    /// Number of connections (listeners not counted).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    pub(super) fn alloc_id(&mut self) -> Result<u32, CmError> {
        if self.conns.len() + self.listeners.len() >= self.config.max_connections {
            return Err(CmError::NoIdsLeft);
        }
        // At most one pass over the IDs in use finds a free one; when the range is smaller
        // than that and every ID in it is in use, the pass ends without one.
        let range = self.config.id_range;
        for _ in 0..=self.conns.len() + self.listeners.len() {
            let id = self.next_id;
            self.next_id = range.after(id);
            if !self.conns.contains_key(&id) && !self.listeners.contains_key(&id) {
                return Ok(id);
            }
        }
        Err(CmError::NoIdsLeft)
    }

    /// A wait a peer's message asks for (4.096 µs × 2^`t`), at most
    /// [`AgentConfig::max_peer_wait`].
    pub(super) fn peer_wait(&self, t: u8) -> Duration {
        cm_timeout(t).min(self.config.max_peer_wait)
    }

    pub(super) fn fresh_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        (u64::from(self.config.tid_high) << 32) | u64::from(self.next_tid)
    }

    /// Listens on `service_id`; `sidr` answers SIDR_REQs for it.
    pub fn listen(&mut self, service_id: u64, sidr: Option<SidrAnswer>) -> Result<ConnId, CmError> {
        if self.listeners.values().any(|l| l.service_id == service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        let id = self.alloc_id()?;
        self.listeners.insert(
            id,
            Listener {
                service_id,
                sidr,
                sidr_deferred: false,
            },
        );
        Ok(ConnId(id))
    }

    /// Listens for SIDR requests on `service_id` and reports each one
    /// ([`CmEvent::SidrReqReceived`]) without answering: the caller answers with
    /// [`CmAgent::sidr_answer`] (the passive side of an RDMA-CM UD id, which makes a QP
    /// per request).
    ///
    /// # Errors
    /// [`CmError::AlreadyListening`]; no free communication ID.
    pub fn listen_sidr_deferred(&mut self, service_id: u64) -> Result<ConnId, CmError> {
        if self.listeners.values().any(|l| l.service_id == service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        let id = self.alloc_id()?;
        self.listeners.insert(
            id,
            Listener {
                service_id,
                sidr: None,
                sidr_deferred: true,
            },
        );
        Ok(ConnId(id))
    }

    /// Answers a reported SIDR request (`id` from [`CmEvent::SidrReqReceived`]) with a
    /// SIDR_REP naming `answer`'s QP and Q_Key.
    ///
    /// # Errors
    /// [`CmError::UnknownId`] when `id` is not a SIDR request waiting for its answer.
    pub fn sidr_answer(
        &mut self,
        now: Instant,
        id: ConnId,
        answer: SidrAnswer,
    ) -> Result<(), CmError> {
        match self.conns.get_mut(&id.0) {
            Some(c) if c.state == CmState::SidrReqRcvd => c.sidr_answer = Some(answer),
            _ => return Err(CmError::UnknownId(id)),
        }
        self.apply(now, id.0, CmInput::SidrAnswer, NO_CTX);
        Ok(())
    }

    /// The service IDs listened on (by [`CmAgent::listen`] and
    /// [`CmAgent::listen_sidr_deferred`]), in no particular order: what a member of a
    /// host-wide device records in the host's registry, so that REQs for them are steered
    /// to it.
    pub fn listening(&self) -> impl Iterator<Item = u64> + '_ {
        self.listeners.values().map(|l| l.service_id)
    }

    /// Stops listening.
    pub fn stop_listening(&mut self, id: ConnId) -> Result<(), CmError> {
        self.listeners
            .remove(&id.0)
            .map(|_| ())
            .ok_or(CmError::UnknownId(id))
    }

    /// Sends a REQ; the connection reports `RepReceived`, `Rejected` or `Unreachable`.
    pub fn connect(&mut self, now: Instant, p: &ConnectParams) -> Result<ConnId, CmError> {
        let private_data = padded::<{ pd::REQ }>(&p.private_data)?;
        let id = self.alloc_id()?;
        let req = ReqRepr {
            local_comm_id: id,
            service_id: p.service_id,
            local_ca_guid: self.config.local_ca_guid,
            local_qkey: p.qkey,
            local_qpn: p.local_qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.cm_response_timeout,
            transport_service_type: p.transport_service_type,
            e2e_flow_control: false,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: p.pkey,
            path_mtu: p.path_mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: p.extended_transport_type,
            primary_path: p.path,
            alternate_path: PathRepr::default(),
            sap_supported: false,
            private_data,
        };
        req.validate()?;
        let mut c = Conn::new(CmState::Idle, p.remote);
        c.local_qpn = p.local_qpn;
        c.req_tid = (u64::from(self.config.tid_high) << 32) | u64::from(id);
        c.timeout = cm_timeout(p.cm_response_timeout) + 2 * cm_timeout(p.packet_life_time);
        c.max_retries = p.max_cm_retries;
        c.timewait = cm_timeout(p.path.local_ack_timeout) + 2 * cm_timeout(p.packet_life_time);
        c.req = Some(req);
        self.conns.insert(id, c);
        self.command(now, ConnId(id), CmInput::Connect)?;
        Ok(ConnId(id))
    }

    /// Accepts a connection in REQ_RCVD / MRA_REQ_SENT: sends the REP.
    pub fn accept(&mut self, now: Instant, id: ConnId, p: &AcceptParams) -> Result<(), CmError> {
        let private_data = padded::<{ pd::REP }>(&p.private_data)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        let rep = RepRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            local_qkey: p.qkey,
            local_qpn: p.local_qpn,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: p.target_ack_delay,
            failover_accepted: 0,
            e2e_flow_control: false,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.config.local_ca_guid,
            private_data,
        };
        rep.validate()?;
        if transition(c.state, CmInput::Accept).is_some() {
            c.rep = Some(rep);
            c.local_qpn = p.local_qpn;
        }
        self.command(now, id, CmInput::Accept)
    }

    /// Rejects a REQ (or, on the active side, a REP) with `reason` and private data.
    pub fn reject(
        &mut self,
        now: Instant,
        id: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let data = padded::<{ pd::REJ }>(private_data)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        c.rej_reason = reason;
        c.rej_private_data = data;
        self.command(now, id, CmInput::Reject)
    }

    /// Sends an MRA for the REQ or REP received, asking for 4.096 µs × 2^`service_timeout`.
    pub fn delay(&mut self, now: Instant, id: ConnId, service_timeout: u8) -> Result<(), CmError> {
        let extended = now + self.config.max_unanswered_req;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        c.mra_service_timeout = service_timeout.min(31);
        // The application asked for time: it has it, as long as for a fresh request.
        if c.unanswered_until.is_some() {
            c.unanswered_until = Some(extended);
        }
        self.command(now, id, CmInput::Delay)
    }

    /// Active side after `RepReceived`: sends the RTU. Passive side: data arrived before
    /// the RTU, the connection is established.
    pub fn establish(&mut self, now: Instant, id: ConnId) -> Result<(), CmError> {
        self.command(now, id, CmInput::Establish)
    }

    /// Disconnects: sends a DREQ when established, the DREP after `DisconnectRequested`,
    /// and gives up a REQ or SIDR_REQ not answered yet.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let data = padded::<{ pd::DREQ }>(private_data)?;
        let c = self.conns.get_mut(&id.0).ok_or(CmError::UnknownId(id))?;
        c.dreq_private_data = data;
        self.command(now, id, CmInput::Disconnect)
    }

    /// Sends a SIDR_REQ; the request reports `SidrReply` or `Unreachable`.
    pub fn sidr_request(&mut self, now: Instant, p: &SidrParams) -> Result<ConnId, CmError> {
        let private_data = padded::<{ pd::SIDR_REQ }>(&p.private_data)?;
        let id = self.alloc_id()?;
        let mut c = Conn::new(CmState::Idle, p.remote);
        c.req_tid = (u64::from(self.config.tid_high) << 32) | u64::from(id);
        c.timeout = cm_timeout(p.timeout);
        c.max_retries = p.max_retries;
        c.sidr_req = Some(SidrReqRepr {
            request_id: id,
            pkey: p.pkey,
            service_id: p.service_id,
            private_data,
        });
        self.conns.insert(id, c);
        self.command(now, ConnId(id), CmInput::SidrRequest)?;
        Ok(ConnId(id))
    }

    fn command(&mut self, now: Instant, id: ConnId, input: CmInput) -> Result<(), CmError> {
        let c = self.conns.get(&id.0).ok_or(CmError::UnknownId(id))?;
        if transition(c.state, input).is_none() {
            return Err(CmError::InvalidState {
                state: c.state,
                input,
            });
        }
        self.apply(now, id.0, input, NO_CTX);
        Ok(())
    }

    /// The next MAD to send: the destination's IP address and the 256 bytes for QP1.
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, [u8; MAD_LEN])> {
        self.tx.pop_front()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline at which [`CmAgent::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns
            .values()
            .flat_map(|c| [c.deadline, c.timewait_at, c.unanswered_deadline()])
            .flatten()
            .chain(self.held_reqs.iter().map(|h| h.0))
            .min()
    }

    /// Runs the timers that expired by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Held REQs: handled now (a listener appeared: accepted; else rejected).
        let (due, keep): (Vec<_>, Vec<_>) = self.held_reqs.drain(..).partition(|h| h.0 <= now);
        self.held_reqs = keep;
        for (_, from, mad) in due {
            self.handle_mad_inner(now, from, &mad, false);
        }
        // Requests their application never answered: the requester has given up.
        let expired: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.unanswered_deadline().is_some_and(|t| t <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.conns.remove(&id);
            self.stats.req_expired += 1;
        }
        let due: Vec<(u32, CmInput)> = self
            .conns
            .iter()
            .filter_map(|(&id, c)| {
                if c.timewait_at.is_some_and(|t| t <= now) {
                    Some((id, CmInput::TimewaitExpired))
                } else if c.deadline.is_some_and(|t| t <= now) {
                    if c.retries_left > 0 {
                        Some((id, CmInput::Timeout))
                    } else {
                        Some((id, CmInput::RetriesExhausted))
                    }
                } else {
                    None
                }
            })
            .collect();
        for (id, input) in due {
            if let Some(c) = self.conns.get_mut(&id) {
                match input {
                    CmInput::TimewaitExpired => c.timewait_at = None,
                    CmInput::Timeout => c.retries_left = c.retries_left.saturating_sub(1),
                    _ => {}
                }
                c.deadline = c.deadline.filter(|_| input == CmInput::TimewaitExpired);
                if transition(c.state, input).is_some() {
                    self.apply(now, id, input, NO_CTX);
                }
            }
        }
    }
}
