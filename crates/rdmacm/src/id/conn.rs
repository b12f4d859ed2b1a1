//! Connecting: listen, connect, accept, reject, establish, disconnect, and the QP
//! transitions a connection's REQ / REP decide.

use super::*;

/// How many other ephemeral ports a listen tries when another process of the host listens
/// on its id's (see [`CmIdRef::listen`]).
const EPHEMERAL_TRIES: u32 = 16;

impl CmIdRef {
    /// Listens (`rdma_listen`) on the bound address's port. A UDP id with a QP answers SIDR
    /// requests with it; one without reports each request as [`EventKind::ConnectRequest`]
    /// whose new id answers with its own QP when accepted.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (not bound), [`CmError::AddrInUse`] when another process
    /// of the host listens on the port (a shared device: the host's registry steers the
    /// port's requests to that process; an id bound to an ephemeral port takes another
    /// one instead, a few times), CM errors.
    pub fn listen(&self, _backlog: u32) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::Bound {
            return Err(invalid("listen", st.phase));
        }
        let Some(dev) = st.dev.clone() else {
            return Err(invalid("listen", st.phase));
        };
        // Bounded: an ephemeral port another process listens on is replaced at most
        // EPHEMERAL_TRIES times.
        let mut tries = 0;
        let src = loop {
            let Some(src) = st.src else {
                return Err(invalid("listen", st.phase));
            };
            match self.listen_on(&mut st, &dev, src) {
                Err(CmError::AddrInUse(_)) if st.ephemeral && tries < EPHEMERAL_TRIES => {
                    tries += 1;
                    let ps = self.inner.ps;
                    dev.release_port(ps, src.port(), self.inner.token);
                    let port = dev.reserve_port(ps, 0, self.inner.token)?;
                    st.src = Some(SocketAddr::new(src.ip(), port));
                    st.port_reserved = Some(port);
                }
                Err(e) => return Err(e),
                Ok(()) => break src,
            }
        };
        st.phase = Phase::Listening;
        if let Some(a) = st.alias {
            // Without the announcement only processes that connect to the device's own
            // address reach this listener; the listen itself stands.
            st.announcement = alias::announce(
                self.inner.ps.value(),
                SocketAddr::new(a, src.port()),
                dev.ip(),
            )
            .ok();
        }
        Ok(())
    }

    /// The CM listen of [`CmIdRef::listen`] on `src`'s port: `AddrInUse` (and nothing
    /// listening) when the host's registry steers the port to another process.
    fn listen_on(
        &self,
        st: &mut IdState,
        dev: &Arc<DevState>,
        src: SocketAddr,
    ) -> Result<(), CmError> {
        // A UDP listener with a QP answers SIDR requests from it; one without reports each
        // request as a connection request whose new id answers when accepted.
        let (sidr, deferred) = match (self.inner.ps, st.qp.as_ref()) {
            (PortSpace::Udp, Some(q)) => (
                Some(SidrAnswer {
                    qpn: q.qp_num(),
                    qkey: UDP_QKEY,
                }),
                false,
            ),
            (PortSpace::Udp, None) => (None, true),
            _ => (None, false),
        };
        let sid = self.inner.ps.service_id(src.port());
        let weak = Arc::downgrade(&self.inner);
        let conn = dev
            .cm
            .with_agent(|a, _| {
                let c = if deferred {
                    a.listen_sidr_deferred(sid)?
                } else {
                    a.listen(sid, sidr)?
                };
                lock(&dev.ids).insert(c.0, weak);
                Ok(c)
            })
            .map_err(cm_err::<uroce_proto::cm::CmError>)?;
        if dev.cm.refused(sid) {
            // Another process of the host listens on the port: its requests go there.
            // The port is in use, as the kernel's CM says of a port bound on the host.
            dev.cm.with_agent(|a, _| {
                let _ = a.stop_listening(conn);
            });
            lock(&dev.ids).remove(&conn.0);
            return Err(CmError::AddrInUse(src.port()));
        }
        st.conn = Some(conn);
        Ok(())
    }

    fn private_with_header(
        &self,
        st: &IdState,
        user: &[u8],
        max: usize,
    ) -> Result<Vec<u8>, CmError> {
        if user.len() + HEADER_LEN > max {
            return Err(CmError::PrivateDataTooLong {
                len: user.len(),
                max: max - HEADER_LEN,
            });
        }
        let (Some(src), Some(dst)) = (st.src, st.dst) else {
            return Err(invalid("connect", st.phase));
        };
        let hdr = CmaHeader {
            version: 0,
            src_port: src.port(),
            src_ip: src.ip(),
            dst_ip: dst.ip(),
        };
        let mut out = vec![0u8; HEADER_LEN + user.len()];
        hdr.emit(&mut out[..HEADER_LEN]).map_err(cm_err)?;
        out[HEADER_LEN..].copy_from_slice(user);
        Ok(out)
    }

    /// Connects (`rdma_connect`): a REQ (TCP) or a SIDR_REQ (UDP) to the resolved
    /// destination. Reports [`EventKind::Established`] (after moving the id's QP to RTS and
    /// sending the RTU; UDP: with the remote QPN and Q_Key), [`EventKind::ConnectResponse`]
    /// (an id without QP), [`EventKind::Rejected`] or [`EventKind::Unreachable`].
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (route not resolved), [`CmError::NoQp`],
    /// [`CmError::PrivateDataTooLong`], CM errors.
    pub fn connect(&self, param: &ConnParam) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::RouteResolved {
            return Err(invalid("connect", st.phase));
        }
        let (Some(dev), Some(src), Some(mut dst)) = (st.dev.clone(), st.src, st.dst) else {
            return Err(invalid("connect", st.phase));
        };
        let param = &within_device(param, &dev);
        // A listener on a loopback address that another process's device owns announces
        // the device it is on (see `alias`).
        if dst.ip().is_loopback() {
            if let Some(real) = alias::find(self.inner.ps.value(), dst) {
                dst = SocketAddr::new(real, dst.port());
                st.dst = Some(dst);
            }
        }
        let weak = Arc::downgrade(&self.inner);
        let sid = self.inner.ps.service_id(dst.port());
        let conn = if self.inner.ps == PortSpace::Udp {
            let p = SidrParams {
                remote: dst.ip(),
                service_id: sid,
                pkey: 0xFFFF,
                timeout: st.cm_response_timeout,
                max_retries: st.max_cm_retries,
                private_data: self.private_with_header(&st, &param.private_data, pdl::SIDR_REQ)?,
            };
            dev.cm.with_agent(|a, now| {
                let c = a.sidr_request(now, &p)?;
                lock(&dev.ids).insert(c.0, weak);
                Ok(c)
            })
        } else {
            let local_qpn = match (&st.qp, param.qp_num) {
                (Some(q), _) => q.qp_num(),
                (None, n) if n != 0 => n,
                _ => return Err(CmError::NoQp),
            };
            let (transport_service_type, extended_transport_type) =
                req_transport(st.qp.as_ref().map(|q| q.qp_type()));
            let psn = fresh_psn(self.inner.token);
            let path = PathRepr {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: rdma_cm::gid_of(src.ip()),
                remote_gid: rdma_cm::gid_of(dst.ip()),
                hop_limit: 64,
                local_ack_timeout: st.local_ack_timeout,
                ..PathRepr::default()
            };
            let p = ConnectParams {
                remote: dst.ip(),
                service_id: sid,
                local_qpn,
                starting_psn: psn,
                qkey: 0,
                responder_resources: param.responder_resources,
                initiator_depth: param.initiator_depth,
                transport_service_type,
                extended_transport_type,
                path,
                pkey: 0xFFFF,
                path_mtu: own_mtu(&st).enum_value(),
                retry_count: param.retry_count.min(7),
                rnr_retry_count: param.rnr_retry_count.min(7),
                cm_response_timeout: st.cm_response_timeout,
                packet_life_time: 0,
                max_cm_retries: st.max_cm_retries,
                srq: param.srq,
                private_data: self.private_with_header(&st, &param.private_data, pdl::REQ)?,
            };
            st.rq_psn = psn;
            dev.cm.with_agent(|a, now| {
                let c = a.connect(now, &p)?;
                lock(&dev.ids).insert(c.0, weak);
                Ok(c)
            })
        }
        .map_err(cm_err::<uroce_proto::cm::CmError>)?;
        st.param = param.clone();
        st.conn = Some(conn);
        st.phase = Phase::Connecting;
        Ok(())
    }

    /// Accepts a connection request (`rdma_accept`): moves the id's QP to RTR and RTS from
    /// the REQ, then sends the REP. [`EventKind::Established`] follows the RTU.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (not a request), [`CmError::NoQp`], verbs and CM errors.
    pub fn accept(&self, param: &ConnParam) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::ReqReceived {
            return Err(invalid("accept", st.phase));
        }
        if self.inner.ps == PortSpace::Udp {
            // A SIDR request: the SIDR_REP names the id's QP (already in RTS).
            let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
                return Err(invalid("accept", st.phase));
            };
            let qpn = match (&st.qp, param.qp_num) {
                (Some(q), _) => q.qp_num(),
                (None, n) if n != 0 => n,
                _ => return Err(CmError::NoQp),
            };
            dev.cm
                .with_agent(|a, now| {
                    a.sidr_answer(
                        now,
                        conn,
                        SidrAnswer {
                            qpn,
                            qkey: UDP_QKEY,
                        },
                    )
                })
                .map_err(cm_err)?;
            self.forget(&dev, &mut st);
            st.phase = Phase::Connected;
            st.param = param.clone();
            return Ok(());
        }
        let (Some(dev), Some(conn), Some(req), Some(dst)) =
            (st.dev.clone(), st.conn, st.req, st.dst)
        else {
            return Err(invalid("accept", st.phase));
        };
        let param = &within_device(param, &dev);
        // Fixed when the request came (`qp_attr` reports it before the accept): the
        // PSN the REP announces, which we expect to receive.
        let psn = st.rq_psn;
        let responder = param.responder_resources.min(req.initiator_depth);
        let initiator = param.initiator_depth.min(req.responder_resources);
        let local_qpn = match (&st.qp, param.qp_num) {
            (Some(q), _) => {
                let c = passive_connect(&st, param, dst.ip())
                    .ok_or_else(|| invalid("accept", st.phase))?;
                to_rts(q, &c)?;
                q.qp_num()
            }
            (None, n) if n != 0 => n,
            _ => return Err(CmError::NoQp),
        };
        let p = AcceptParams {
            local_qpn,
            starting_psn: psn,
            qkey: 0,
            responder_resources: responder,
            initiator_depth: initiator,
            target_ack_delay: 0,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: param.srq,
            private_data: param.private_data.clone(),
        };
        if p.private_data.len() > pdl::REP {
            return Err(CmError::PrivateDataTooLong {
                len: p.private_data.len(),
                max: pdl::REP,
            });
        }
        dev.cm
            .with_agent(|a, now| a.accept(now, conn, &p))
            .map_err(cm_err)?;
        st.param = param.clone();
        Ok(())
    }

    /// Rejects a connection request (`rdma_reject`) with a consumer-defined REJ carrying
    /// `private_data` (at most 148 bytes).
    ///
    /// # Errors
    /// [`CmError::InvalidState`], [`CmError::PrivateDataTooLong`], CM errors.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if st.phase != Phase::ReqReceived {
            return Err(invalid("reject", st.phase));
        }
        if private_data.len() > pdl::REJ {
            return Err(CmError::PrivateDataTooLong {
                len: private_data.len(),
                max: pdl::REJ,
            });
        }
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn.take()) else {
            return Err(invalid("reject", st.phase));
        };
        dev.cm
            .with_agent(|a, now| a.reject(now, conn, rej_reason::CONSUMER_DEFINED, private_data))
            .map_err(cm_err)?;
        lock(&dev.ids).remove(&conn.0);
        st.phase = Phase::Disconnected;
        drop(st);
        wait_transmitted(&dev);
        Ok(())
    }

    /// For an id without QP after [`EventKind::ConnectResponse`]: sends the RTU
    /// (`rdma_establish`). The id is connected; no [`EventKind::Established`] follows (as
    /// with the Linux RDMA CM, where the active side learns of nothing more).
    ///
    /// # Errors
    /// [`CmError::InvalidState`], CM errors.
    pub fn establish(&self) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
            return Err(invalid("establish", st.phase));
        };
        dev.cm
            .with_agent(|a, now| a.establish(now, conn))
            .map_err(cm_err)?;
        st.rtu_by_caller = st.phase == Phase::Connecting;
        Ok(())
    }

    /// Data arrived on the QP of an accepted connection before the RTU (`rdma_notify`
    /// with `IBV_EVENT_COMM_EST`): the connection is established now
    /// ([`EventKind::Established`] follows), as the RTU would (IBA Vol 1, 12.9.8.1: a
    /// communication-established event stands in for a lost RTU).
    ///
    /// # Errors
    /// [`CmError::AlreadyConnected`] when it is established; [`CmError::InvalidState`]
    /// unless the id accepted a request (or connected) and waits for the RTU; CM errors.
    pub fn notify_established(&self) -> Result<(), CmError> {
        let st = lock(&self.inner.st);
        match st.phase {
            Phase::Connected => return Err(CmError::AlreadyConnected),
            Phase::ReqReceived | Phase::Connecting => {}
            p => return Err(invalid("notify", p)),
        }
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
            return Err(invalid("notify", st.phase));
        };
        dev.cm
            .with_agent(|a, now| a.establish(now, conn))
            .map_err(cm_err)
    }

    /// Moves the id to another event channel (`rdma_migrate_id`): its later events, and
    /// those not retrieved yet (in order), go to `channel`.
    pub fn migrate(&self, channel: &EventChannel) {
        let _st = lock(&self.inner.st);
        let mut ch = lock(&self.inner.channel);
        if Arc::ptr_eq(&ch, &channel.inner) {
            return;
        }
        let pending = ch.purge(self.inner.token);
        *ch = channel.inner.clone();
        for ev in pending {
            ch.push(ev);
        }
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR and a DREQ leaves (or, while
    /// connecting, the REQ is given up). [`EventKind::Disconnected`] follows the DREP (or
    /// its timeout).
    ///
    /// # Errors
    /// [`CmError::InvalidState`], CM errors.
    pub fn disconnect(&self) -> Result<(), CmError> {
        let st = lock(&self.inner.st);
        if st.phase == Phase::Disconnected {
            // The peer disconnected first: as the kernel's CM, a late disconnect succeeds
            // (the QP is already in the error state and the DREP was sent).
            if let Some(q) = &st.qp {
                qp_error(q);
            }
            return Ok(());
        }
        if !matches!(st.phase, Phase::Connected | Phase::Connecting) {
            return Err(invalid("disconnect", st.phase));
        }
        let (Some(dev), Some(conn)) = (st.dev.clone(), st.conn) else {
            return Err(invalid("disconnect", st.phase));
        };
        if let Some(q) = &st.qp {
            qp_error(q);
        }
        dev.cm
            .with_agent(|a, now| a.disconnect(now, conn, &[]))
            .map_err(cm_err)?;
        drop(st);
        wait_transmitted(&dev);
        Ok(())
    }

    /// Destroy's work (see [`CmId::destroy`]).
    pub(super) fn retire(&self) -> Result<(), CmError> {
        let inner = &self.inner;
        let (qp, owned, dev) = {
            let mut st = lock(&inner.st);
            let prev = st.phase;
            if prev != Phase::Destroyed {
                st.phase = Phase::Destroyed;
                // Withdrawn now, not when the last reference to the id goes.
                st.announcement = None;
                if let Some(dev) = st.dev.clone() {
                    if let Some(conn) = st.conn.take() {
                        // Unpublished first: no callback starts for it after this.
                        lock(&dev.ids).remove(&conn.0);
                        dev.cm.with_agent(|a, now| match prev {
                            Phase::Listening => {
                                let _ = a.stop_listening(conn);
                            }
                            Phase::ReqReceived => {
                                if a.reject(now, conn, rej_reason::CONSUMER_DEFINED, &[])
                                    .is_err()
                                {
                                    let _ = a.disconnect(now, conn, &[]);
                                }
                            }
                            _ => {
                                let _ = a.disconnect(now, conn, &[]);
                            }
                        });
                    }
                    if let Some(p) = st.port_reserved.take() {
                        dev.release_port(inner.ps, p, inner.token);
                    }
                }
                inner.cm.live_ids.fetch_sub(1, Ordering::SeqCst);
            }
            (st.qp.take(), st.owned_qp.take(), st.dev.clone())
        };
        if let Some(dev) = dev {
            wait_transmitted(&dev);
        }
        if let Some(q) = qp {
            q.unbind_endpoint(inner.token);
        }
        if let Some(q) = owned {
            // Unbound above: the destroy calls no one back.
            let _ = q.destroy();
        }
        drop(inner.channel().purge(inner.token));
        // Bounded wait for acknowledgements and callbacks in flight.
        let deadline = Instant::now() + DESTROY_TIMEOUT;
        let mut r = lock(&inner.refs);
        while *r > 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(CmError::InUse(*r));
            }
            r = inner
                .refs_cv
                .wait_timeout(r, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        Ok(())
    }
}

pub(super) fn to_rts(q: &QpRef, c: &RcConnect) -> Result<(), CmError> {
    if q.state() == QpState::Reset {
        let (a, m) = c.init_attr();
        q.modify(&a, m).map_err(verbs)?;
    }
    // The XRC halves leave out the attributes their side does not have (IBA Annex A14).
    let (a, m) = c.rtr_attr_for(q.qp_type());
    q.modify(&a, m).map_err(verbs)?;
    let (a, m) = c.rts_attr_for(q.qp_type());
    q.modify(&a, m).map_err(verbs)
}

/// The REQ's Transport Service Type and Extended Transport Type for a QP of `qp_type`
/// (IBA 12.6.5, and Annex A14 for XRC: type 3 with extended type 1, as the Linux CM
/// writes it); RC when the id has no QP of its own.
pub(super) fn req_transport(qp_type: Option<QpType>) -> (u8, u8) {
    match qp_type {
        Some(QpType::Uc) => (1, 0),
        Some(QpType::XrcSend) => (3, 1),
        _ => (0, 0),
    }
}

/// `param` with its RDMA READ / atomic depths no larger than the device allows: as
/// librdmacm does, a program's `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` (0xFF; libfabric
/// passes them) or any larger value becomes the device's `max_qp_rd_atom` /
/// `max_qp_init_rd_atom`, so the REQ or REP announces what the QP will have.
fn within_device(param: &ConnParam, dev: &DevState) -> ConnParam {
    let attr = dev.dev.device().attr();
    let cap = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    let mut p = param.clone();
    p.responder_resources = p.responder_resources.min(cap(attr.max_qp_rd_atom));
    p.initiator_depth = p.initiator_depth.min(cap(attr.max_qp_init_rd_atom));
    p
}

/// The active side's QP attributes after the REP (`None` before it).
pub(super) fn active_connect(st: &IdState, dest_ip: IpAddr) -> Option<RcConnect> {
    let rep = st.rep.as_ref()?;
    let psns = StartPsns::active(st.rq_psn, rep.starting_psn);
    Some(RcConnect {
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        dest_ip,
        dest_qpn: rep.local_qpn,
        path_mtu: own_mtu(st),
        rq_psn: Psn::new(psns.rq_psn),
        max_dest_rd_atomic: st.param.responder_resources.min(rep.initiator_depth),
        min_rnr_timer: 12,
        sq_psn: Psn::new(psns.sq_psn),
        timeout: st.local_ack_timeout,
        retry_cnt: st.param.retry_count.min(7),
        rnr_retry: rep.rnr_retry_count,
        max_rd_atomic: st.param.initiator_depth.min(rep.responder_resources),
    })
}

/// The passive side's QP attributes from the REQ (`param`: what it accepts with).
pub(super) fn passive_connect(
    st: &IdState,
    param: &ConnParam,
    dest_ip: IpAddr,
) -> Option<RcConnect> {
    let req = st.req.as_ref()?;
    let psns = StartPsns::passive(req.starting_psn, st.rq_psn);
    Some(RcConnect {
        access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC,
        dest_ip,
        dest_qpn: req.local_qpn,
        path_mtu: pmtu_of(req.path_mtu).min(own_mtu(st)),
        rq_psn: Psn::new(psns.rq_psn),
        max_dest_rd_atomic: param.responder_resources.min(req.initiator_depth),
        min_rnr_timer: 12,
        sq_psn: Psn::new(psns.sq_psn),
        timeout: if st.ack_timeout_set {
            st.local_ack_timeout
        } else {
            req.primary_path.local_ack_timeout
        },
        retry_cnt: req.retry_count,
        rnr_retry: req.rnr_retry_count,
        max_rd_atomic: param.initiator_depth.min(req.responder_resources),
    })
}

pub(super) fn qp_error(q: &QpRef) {
    if !matches!(q.state(), QpState::Err | QpState::Reset) {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = q.modify(&attr, AttrMask::STATE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn req_names_the_transport_of_the_qp() {
        assert_eq!(req_transport(Some(QpType::Rc)), (0, 0));
        assert_eq!(req_transport(None), (0, 0));
        assert_eq!(req_transport(Some(QpType::Uc)), (1, 0));
        assert_eq!(req_transport(Some(QpType::XrcSend)), (3, 1));
    }
}
