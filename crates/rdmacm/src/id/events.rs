//! CM events on the CM thread: each routed to its id, which moves its phase and its QP
//! and reports the event to the application's channel.

use super::*;

/// Routes one CM event to its id (on the CM thread).
pub(crate) fn dispatch(dev: &Arc<DevState>, event: CmEvent) {
    let key = match &event {
        CmEvent::ReqReceived { listener, .. } => *listener,
        CmEvent::RepReceived { id, .. }
        | CmEvent::Established { id }
        | CmEvent::Rejected { id, .. }
        | CmEvent::DisconnectRequested { id }
        | CmEvent::Disconnected { id }
        | CmEvent::TimewaitExit { id }
        | CmEvent::Unreachable { id }
        | CmEvent::DisconnectTimeout { id }
        | CmEvent::SidrReply { id, .. } => *id,
        // The agent answered from the listener's QP; nothing to report.
        CmEvent::SidrReqReceived { listener, .. } => *listener,
    };
    let target = {
        let ids = lock(&dev.ids);
        let t = ids.get(&key.0).and_then(Weak::upgrade);
        if let Some(t) = &t {
            t.enter();
        }
        t
    };
    let Some(target) = target else {
        // Nobody wants it: a request for a destroyed listener is refused.
        if let CmEvent::ReqReceived { id, .. } = event {
            dev.cm.with_agent(|a, now| {
                let _ = a.reject(now, id, rej_reason::NO_RESOURCES, &[]);
            });
        }
        return;
    };
    let r = CmIdRef {
        inner: target.clone(),
    };
    r.on_event(dev, event);
    target.exit();
}

impl CmIdRef {
    fn report(&self, kind: EventKind, status: i32, param: ConnParam, ud: Option<UdParam>) {
        let mut ev = Event::new(kind, self.clone());
        ev.status = status;
        ev.param = param;
        ev.ud = ud;
        self.push(ev);
    }

    pub(super) fn forget(&self, dev: &DevState, st: &mut IdState) {
        if let Some(c) = st.conn.take() {
            lock(&dev.ids).remove(&c.0);
        }
    }

    fn on_event(&self, dev: &Arc<DevState>, event: CmEvent) {
        if let CmEvent::ReqReceived { id, from, req, .. } = &event {
            self.on_request(dev, *id, *from, req);
            return;
        }
        if let CmEvent::SidrReqReceived { id, from, req, .. } = &event {
            self.on_sidr_request(dev, *id, *from, req);
            return;
        }
        let mut st = lock(&self.inner.st);
        if matches!(st.phase, Phase::Destroyed | Phase::Aborted) {
            return;
        }
        match event {
            CmEvent::RepReceived { rep, .. } => {
                if st.phase != Phase::Connecting {
                    return;
                }
                let mut param = ConnParam {
                    private_data: rep.private_data.to_vec(),
                    responder_resources: rep.responder_resources,
                    initiator_depth: rep.initiator_depth,
                    flow_control: rep.e2e_flow_control,
                    retry_count: st.param.retry_count,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq,
                    qp_num: rep.local_qpn,
                };
                let Some(conn) = st.conn else { return };
                let Some(dst) = st.dst else { return };
                st.rep = Some(*rep);
                match (st.qp.clone(), active_connect(&st, dst.ip())) {
                    (Some(q), Some(c)) => {
                        match to_rts(&q, &c) {
                            Ok(()) => {
                                st.peer_param = Some(param);
                                // The RTU leaves; Established follows from the agent.
                                let _ = dev.cm.with_agent(|a, now| a.establish(now, conn));
                            }
                            Err(_) => {
                                dev.cm.with_agent(|a, now| {
                                    let _ = a.reject(now, conn, rej_reason::NO_QP, &[]);
                                });
                                self.forget(dev, &mut st);
                                st.phase = Phase::Disconnected;
                                param.private_data.clear();
                                self.report(EventKind::ConnectError, -22, param, None);
                            }
                        }
                    }
                    _ => self.report(EventKind::ConnectResponse, 0, param, None),
                }
            }
            CmEvent::Established { .. } => {
                if matches!(st.phase, Phase::Connecting | Phase::ReqReceived) {
                    st.phase = Phase::Connected;
                    if st.rtu_by_caller {
                        return;
                    }
                    let param = st.peer_param.clone().unwrap_or_else(|| st.param.clone());
                    self.report(EventKind::Established, 0, param, None);
                }
            }
            CmEvent::Rejected {
                reason,
                private_data,
                ..
            } => {
                self.forget(dev, &mut st);
                st.phase = Phase::Disconnected;
                let param = ConnParam {
                    private_data,
                    ..ConnParam::default()
                };
                self.report(EventKind::Rejected, i32::from(reason), param, None);
            }
            CmEvent::Unreachable { .. } => {
                self.forget(dev, &mut st);
                st.phase = Phase::Disconnected;
                self.report(
                    EventKind::Unreachable,
                    -ETIMEDOUT,
                    ConnParam::default(),
                    None,
                );
            }
            CmEvent::DisconnectRequested { id } => {
                if let Some(q) = &st.qp {
                    qp_error(q);
                }
                // The DREP leaves at once (the connection is over for us either way).
                dev.cm.with_agent(|a, now| {
                    let _ = a.disconnect(now, id, &[]);
                });
                self.disconnected(&mut st);
            }
            CmEvent::Disconnected { .. } | CmEvent::DisconnectTimeout { .. } => {
                if let Some(q) = &st.qp {
                    qp_error(q);
                }
                self.disconnected(&mut st);
            }
            CmEvent::TimewaitExit { .. } => {
                self.forget(dev, &mut st);
                self.report(EventKind::TimewaitExit, 0, ConnParam::default(), None);
            }
            CmEvent::SidrReply {
                status, qpn, qkey, ..
            } => {
                self.forget(dev, &mut st);
                if st.phase != Phase::Connecting {
                    return;
                }
                if status == 0 {
                    st.phase = Phase::Connected;
                    let ud = st.dst.map(|d| UdParam {
                        ah_ip: d.ip(),
                        qp_num: qpn,
                        qkey,
                    });
                    let param = ConnParam {
                        qp_num: qpn,
                        ..ConnParam::default()
                    };
                    self.report(EventKind::Established, 0, param, ud);
                } else {
                    st.phase = Phase::Disconnected;
                    self.report(
                        EventKind::Rejected,
                        i32::from(status),
                        ConnParam::default(),
                        None,
                    );
                }
            }
            CmEvent::ReqReceived { .. } | CmEvent::SidrReqReceived { .. } => {}
        }
    }

    fn disconnected(&self, st: &mut IdState) {
        st.phase = Phase::Disconnected;
        if !st.disconnect_reported {
            st.disconnect_reported = true;
            self.report(EventKind::Disconnected, 0, ConnParam::default(), None);
        }
    }

    /// A REQ for this listener: a new id for the connection, reported on the listener's
    /// channel.
    /// A SIDR request to a listener without QP: a new UD id in `ReqReceived`, reported as
    /// a connection request; accepting it answers with its QP.
    fn on_sidr_request(
        &self,
        dev: &Arc<DevState>,
        conn: ConnId,
        from: IpAddr,
        req: &uroce_wire::cm::SidrReqRepr,
    ) {
        let st = lock(&self.inner.st);
        if st.phase != Phase::Listening {
            return;
        }
        let Some(hdr) = CmaHeader::parse(&req.private_data)
            .ok()
            .filter(|h| h.src_ip == from)
        else {
            return;
        };
        let child = IdInner::new(&self.inner.cm, &self.inner.channel(), self.inner.ps);
        {
            let mut cs = lock(&child.st);
            cs.phase = Phase::ReqReceived;
            cs.dev = Some(dev.clone());
            cs.src = st.src.map(|s| SocketAddr::new(hdr.dst_ip, s.port()));
            cs.dst = Some(SocketAddr::new(hdr.src_ip, hdr.src_port));
            cs.conn = Some(conn);
        }
        lock(&dev.ids).insert(conn.0, Arc::downgrade(&child));
        let new_ref = CmIdRef {
            inner: child.clone(),
        };
        let owner = CmId {
            r: new_ref.clone(),
            destroyed: false,
        };
        let mut ev = Event::new(EventKind::ConnectRequest, new_ref);
        self.event_out();
        ev.listen_id = Some(self.clone());
        ev.param = ConnParam {
            private_data: req.private_data[HEADER_LEN..].to_vec(),
            ..ConnParam::default()
        };
        ev.ud = Some(UdParam {
            ah_ip: from,
            qp_num: 0,
            qkey: 0,
        });
        let ev = ev.with_new_id(owner);
        drop(st);
        self.push(ev);
    }

    fn on_request(&self, dev: &Arc<DevState>, conn: ConnId, from: IpAddr, req: &ReqRepr) {
        let st = lock(&self.inner.st);
        let refuse = |reason| {
            dev.cm.with_agent(|a, now| {
                let _ = a.reject(now, conn, reason, &[]);
            });
        };
        if st.phase != Phase::Listening {
            refuse(rej_reason::NO_RESOURCES);
            return;
        }
        let hdr = CmaHeader::parse(&req.private_data).ok();
        let Some(hdr) = hdr.filter(|h| h.src_ip == from) else {
            // Not an RDMA-CM request for this address.
            refuse(rej_reason::CONSUMER_DEFINED);
            return;
        };
        let child = IdInner::new(&self.inner.cm, &self.inner.channel(), self.inner.ps);
        {
            let mut cs = lock(&child.st);
            cs.phase = Phase::ReqReceived;
            cs.dev = Some(dev.clone());
            cs.src = st.src.map(|s| SocketAddr::new(hdr.dst_ip, s.port()));
            cs.dst = Some(SocketAddr::new(hdr.src_ip, hdr.src_port));
            cs.conn = Some(conn);
            cs.req = Some(*req);
            cs.rq_psn = fresh_psn(child.token);
            cs.param = ConnParam {
                responder_resources: req.responder_resources,
                initiator_depth: req.initiator_depth,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                qp_num: req.local_qpn,
                ..ConnParam::new()
            };
        }
        lock(&dev.ids).insert(conn.0, Arc::downgrade(&child));
        let new_ref = CmIdRef {
            inner: child.clone(),
        };
        let owner = CmId {
            r: new_ref.clone(),
            destroyed: false,
        };
        let mut ev = Event::new(EventKind::ConnectRequest, new_ref);
        self.event_out();
        ev.listen_id = Some(self.clone());
        ev.param = ConnParam {
            private_data: req.private_data[HEADER_LEN..].to_vec(),
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            flow_control: req.e2e_flow_control,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            qp_num: req.local_qpn,
        };
        let ev = ev.with_new_id(owner);
        drop(st);
        self.push(ev);
    }
}
