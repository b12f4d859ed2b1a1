//! Carrying out a table row: the actions of [`table::CM_TABLE`] (messages built and
//! sent, retries armed, the timewait, events).

use super::*;

impl CmAgent {
    pub(super) fn send(&mut self, to: IpAddr, mad: CmMad) {
        self.stats.sent += 1;
        self.tx.push_back((to, mad.to_bytes()));
    }

    /// Runs the table row for (state, `input`) on connection `id`.
    pub(super) fn apply(&mut self, now: Instant, id: u32, input: CmInput, ctx: Ctx<'_>) {
        let Some(c) = self.conns.get(&id) else { return };
        let from = c.state;
        let Some(t) = transition(from, input) else {
            self.stats.ignored += 1;
            return;
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = t.to;
        }
        for &action in t.actions {
            self.act(now, id, from, t.to, action, ctx);
        }
        if t.to == CmState::Idle {
            self.conns.remove(&id);
        }
    }

    fn act(
        &mut self,
        now: Instant,
        id: u32,
        from: CmState,
        to: CmState,
        action: Action,
        ctx: Ctx<'_>,
    ) {
        let ca_guid = self.config.local_ca_guid;
        let fresh_tid = if action == Action::SendDreq {
            self.fresh_tid()
        } else {
            0
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let remote = c.remote;
        let ids = (id, c.remote_comm_id);
        let mut out: Option<(CmMad, bool)> = None; // (message, guarded)
        match action {
            Action::SendReq => {
                if let Some(req) = c.req {
                    out = Some((CmMad::new(c.req_tid, CmMessage::Req(req)), true));
                }
            }
            Action::SendRep => {
                if let Some(rep) = c.rep {
                    out = Some((CmMad::new(c.req_tid, CmMessage::Rep(rep)), true));
                }
            }
            Action::SendRtu => {
                let rtu = RtuRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    private_data: [0; pd::RTU],
                };
                out = Some((CmMad::new(c.req_tid, CmMessage::Rtu(rtu)), false));
            }
            Action::SendMra => {
                let kind = match to {
                    CmState::MraReqSent => msg_kind::REQ,
                    _ => msg_kind::REP,
                };
                let mra = MraRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message_mraed: kind,
                    service_timeout: c.mra_service_timeout,
                    private_data: [0; pd::MRA],
                };
                out = Some((CmMad::new(c.req_tid, CmMessage::Mra(mra)), false));
            }
            Action::SendRej | Action::SendRejTimeout | Action::SendRejStale => {
                let message_rejected = match from {
                    CmState::ReqRcvd | CmState::MraReqSent | CmState::Timewait => msg_kind::REQ,
                    CmState::RepRcvd | CmState::MraRepSent => msg_kind::REP,
                    _ => msg_kind::OTHER,
                };
                let (reason, info_len, ari, private_data) = match action {
                    Action::SendRejTimeout => {
                        let mut ari = [0u8; INFO_LEN];
                        ari[..8].copy_from_slice(&ca_guid.to_be_bytes());
                        (rej_reason::TIMEOUT, 8, ari, [0; pd::REJ])
                    }
                    Action::SendRejStale => {
                        (rej_reason::STALE_CONN, 0, [0; INFO_LEN], [0; pd::REJ])
                    }
                    _ => (c.rej_reason, 0, [0; INFO_LEN], c.rej_private_data),
                };
                let rej = RejRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    message_rejected,
                    reject_info_length: info_len,
                    reason,
                    ari,
                    private_data,
                };
                out = Some((CmMad::new(c.req_tid, CmMessage::Rej(rej)), false));
            }
            Action::SendDreq => {
                let dreq = DreqRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    remote_qpn: c.remote_qpn,
                    private_data: c.dreq_private_data,
                };
                out = Some((CmMad::new(fresh_tid, CmMessage::Dreq(dreq)), true));
            }
            Action::SendDrep => {
                let drep = DrepRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    private_data: [0; pd::DREP],
                };
                let tid = if ctx.tid != 0 { ctx.tid } else { c.dreq_tid };
                out = Some((CmMad::new(tid, CmMessage::Drep(drep)), false));
            }
            Action::SendAprUnsupported => {
                let apr = AprRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    additional_info_length: 0,
                    status: apr_status::UNSUPPORTED,
                    additional_info: [0; INFO_LEN],
                    private_data: [0; pd::APR],
                };
                out = Some((CmMad::new(ctx.tid, CmMessage::Apr(apr)), false));
            }
            Action::SendSidrReq => {
                if let Some(req) = c.sidr_req {
                    out = Some((CmMad::new(c.req_tid, CmMessage::SidrReq(req)), true));
                }
            }
            Action::SendSidrRep => {
                if let (Some(req), Some(ans)) = (c.sidr_req, c.sidr_answer) {
                    let rep = SidrRepRepr {
                        request_id: req.request_id,
                        status: sidr_status::SUCCESS,
                        additional_info_length: 0,
                        qpn: ans.qpn,
                        service_id: req.service_id,
                        qkey: ans.qkey,
                        additional_info: [0; INFO_LEN],
                        private_data: [0; pd::SIDR_REP],
                    };
                    out = Some((CmMad::new(c.req_tid, CmMessage::SidrRep(rep)), false));
                }
            }
            Action::Resend => {
                if let Some(bytes) = c.guarded {
                    self.stats.sent += 1;
                    self.tx.push_back((remote, bytes));
                }
            }
            Action::ArmRetry => c.deadline = Some(now + c.timeout),
            Action::ExtendTimer => {
                let service = match ctx.message {
                    Some(CmMessage::Mra(m)) => {
                        cm_timeout(m.service_timeout).min(self.config.max_peer_wait)
                    }
                    _ => Duration::ZERO,
                };
                c.deadline = Some(now + service + c.timeout);
            }
            Action::CancelTimer => {
                c.deadline = None;
                c.guarded = None;
            }
            Action::StartTimewait => {
                c.deadline = None;
                c.guarded = None;
                c.timewait_at = Some(now + c.timewait);
            }
            Action::Report(kind) => {
                let ev = self.event(id, kind, ctx);
                if let Some(ev) = ev {
                    self.events.push_back(ev);
                }
            }
        }
        if let Some((mad, guarded)) = out {
            let bytes = mad.to_bytes();
            if guarded {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.guarded = Some(bytes);
                    c.retries_left = c.max_retries;
                }
            }
            self.stats.sent += 1;
            self.tx.push_back((remote, bytes));
        }
    }

    fn event(&self, id: u32, kind: EventKind, ctx: Ctx<'_>) -> Option<CmEvent> {
        let c = self.conns.get(&id)?;
        let cid = ConnId(id);
        Some(match kind {
            EventKind::ReqReceived => CmEvent::ReqReceived {
                id: cid,
                listener: cid,
                from: c.remote,
                req: Box::new(c.req?),
            },
            EventKind::RepReceived => match ctx.message {
                Some(CmMessage::Rep(r)) => CmEvent::RepReceived {
                    id: cid,
                    rep: Box::new(*r),
                },
                _ => return None,
            },
            EventKind::Established => CmEvent::Established { id: cid },
            EventKind::Rejected => match ctx.message {
                Some(CmMessage::Rej(r)) => CmEvent::Rejected {
                    id: cid,
                    reason: r.reason,
                    private_data: r.private_data.to_vec(),
                },
                _ => return None,
            },
            EventKind::DisconnectRequested => CmEvent::DisconnectRequested { id: cid },
            EventKind::Disconnected => CmEvent::Disconnected { id: cid },
            EventKind::TimewaitExit => CmEvent::TimewaitExit { id: cid },
            EventKind::Unreachable => CmEvent::Unreachable { id: cid },
            EventKind::DisconnectTimeout => CmEvent::DisconnectTimeout { id: cid },
            EventKind::SidrReqReceived => CmEvent::SidrReqReceived {
                id: cid,
                listener: cid,
                from: c.remote,
                req: Box::new(c.sidr_req?),
            },
            EventKind::SidrReply => match ctx.message {
                Some(CmMessage::SidrRep(r)) => CmEvent::SidrReply {
                    id: cid,
                    status: r.status,
                    qpn: r.qpn,
                    qkey: r.qkey,
                },
                _ => return None,
            },
        })
    }
}
