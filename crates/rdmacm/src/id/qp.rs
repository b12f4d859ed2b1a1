//! An id's QP: the port space's QP types, creating, binding and destroying it, and the
//! attributes `rdma_init_qp_attr` gives for each state.

use super::*;

impl CmIdRef {
    /// Whether the id's port space takes a QP of type `t`: UDP a UD QP, TCP an RC QP, IB
    /// an RC QP or either XRC half (`RDMA_PS_IB` is how librdmacm connects XRC).
    fn accepts(&self, t: QpType) -> bool {
        match self.inner.ps {
            PortSpace::Udp => t == QpType::Ud,
            PortSpace::Tcp => t == QpType::Rc,
            PortSpace::Ib => matches!(t, QpType::Rc | QpType::XrcSend | QpType::XrcRecv),
            PortSpace::IpoIb => false,
        }
    }

    /// The binding protocol's step 1 (see `uroce_verbs::binding`): the reference is
    /// stored under the id's lock before the binding is published.
    fn bind_qp_locked(&self, st: &mut IdState, qp: QpRef) -> Result<(), CmError> {
        if st.qp.is_some() {
            return Err(CmError::QpBound);
        }
        st.qp = Some(qp.clone());
        let owner: Arc<dyn BindingOwner> = self.inner.clone();
        match qp.bind_endpoint(self.inner.token, owner) {
            Ok(()) => Ok(()),
            Err(e) => {
                st.qp = None;
                Err(match e {
                    BindError::AlreadyBound => CmError::QpBound,
                    BindError::Destroyed => CmError::QpDestroyed,
                })
            }
        }
    }

    fn init_qp(&self, qp: &QpRef) -> Result<(), CmError> {
        if !self.accepts(qp.qp_type()) {
            return Err(CmError::Invalid("QP type does not match the port space"));
        }
        match (self.inner.ps, qp.state()) {
            (PortSpace::Udp, QpState::Reset) => qp.activate_ud(UDP_QKEY).map_err(verbs),
            (PortSpace::Udp, QpState::Rts) => Ok(()),
            (_, QpState::Reset) => {
                let (attr, mask) = uroce_verbs::rc_init_attr(
                    AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_ATOMIC,
                );
                qp.modify(&attr, mask).map_err(verbs)
            }
            (PortSpace::Tcp | PortSpace::Ib, QpState::Init) => Ok(()),
            _ => Err(CmError::Invalid("the QP must be in RESET or INIT")),
        }
    }

    /// Creates the id's QP on `pd` (`rdma_create_qp`; RC for TCP ids, UD for UDP ones),
    /// moves it to INIT (UD: to RTS with [`UDP_QKEY`]) and binds it; the id owns it.
    ///
    /// # Errors
    /// Verbs errors; [`CmError::QpBound`] when the id has a QP.
    pub fn create_qp(&self, pd: &Pd, attr: &QpInitAttr<'_>) -> Result<QpRef, CmError> {
        if !self.accepts(attr.qp_type) {
            return Err(CmError::Invalid("QP type does not match the port space"));
        }
        if lock(&self.inner.st).qp.is_some() {
            return Err(CmError::QpBound);
        }
        let qp = pd.create_qp(attr).map_err(verbs)?;
        self.init_qp(&qp)?;
        let r: QpRef = (*qp).clone();
        let mut st = lock(&self.inner.st);
        self.bind_qp_locked(&mut st, r.clone())?;
        st.owned_qp = Some(qp);
        Ok(r)
    }

    /// Binds a QP the caller owns (moved to INIT if in RESET; UD: to RTS).
    ///
    /// # Errors
    /// [`CmError::QpBound`] (this id has a QP, or the QP has an id),
    /// [`CmError::QpDestroyed`], verbs errors.
    pub fn bind_qp(&self, qp: &QpRef) -> Result<(), CmError> {
        let mut st = lock(&self.inner.st);
        if matches!(st.phase, Phase::Destroyed | Phase::Aborted) {
            return Err(invalid("bind_qp", st.phase));
        }
        if st.qp.is_some() {
            return Err(CmError::QpBound);
        }
        // Bind first (the QP cannot be taken by another id meanwhile), then INIT.
        self.bind_qp_locked(&mut st, qp.clone())?;
        drop(st);
        if let Err(e) = self.init_qp(qp) {
            let mut st = lock(&self.inner.st);
            if st.qp.as_ref().is_some_and(|q| q.same_qp(qp)) {
                st.qp = None;
                qp.unbind_endpoint(self.inner.token);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Unbinds and destroys the QP the id created (`rdma_destroy_qp`), or unbinds one it
    /// was given.
    ///
    /// # Errors
    /// [`CmError::NoQp`]; verbs errors from the destroy.
    pub fn destroy_qp(&self) -> Result<(), CmError> {
        let (qp, owned) = {
            let mut st = lock(&self.inner.st);
            (st.qp.take(), st.owned_qp.take())
        };
        let qp = qp.ok_or(CmError::NoQp)?;
        qp.unbind_endpoint(self.inner.token);
        drop(qp);
        if let Some(q) = owned {
            q.destroy().map_err(|(_, e)| verbs(e))?;
        }
        Ok(())
    }

    /// The attributes and mask that move a QP of type `qp_type` to `state` for this id's
    /// connection (`rdma_init_qp_attr`), for a QP the caller moves itself: INIT any time
    /// after the address is bound; RTR and RTS (RC, XRC) once the peer is known (the REQ on
    /// the passive side, the REP on the active side). UD: INIT with the RDMA CM's Q_Key,
    /// RTR, RTS.
    ///
    /// # Errors
    /// [`CmError::InvalidState`] (too early), [`CmError::Invalid`] (another state).
    pub fn qp_attr(&self, qp_type: QpType, state: QpState) -> Result<(QpAttr, AttrMask), CmError> {
        let st = lock(&self.inner.st);
        if matches!(st.phase, Phase::Idle | Phase::Destroyed) {
            return Err(invalid("init_qp_attr", st.phase));
        }
        if qp_type == QpType::Ud {
            let mut a = QpAttr {
                qp_state: state,
                ..QpAttr::default()
            };
            let mask = match state {
                QpState::Init => {
                    a.pkey_index = 0;
                    a.port_num = uroce_verbs::device::PORT_NUM;
                    a.qkey = UDP_QKEY;
                    AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY
                }
                QpState::Rtr => AttrMask::STATE,
                QpState::Rts => AttrMask::STATE | AttrMask::SQ_PSN,
                _ => return Err(CmError::Invalid("init_qp_attr: INIT, RTR or RTS")),
            };
            return Ok((a, mask));
        }
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_ATOMIC;
        if state == QpState::Init {
            return Ok(uroce_verbs::rc_init_attr(access));
        }
        if !matches!(state, QpState::Rtr | QpState::Rts) {
            return Err(CmError::Invalid("init_qp_attr: INIT, RTR or RTS"));
        }
        let dst = st.dst.ok_or_else(|| invalid("init_qp_attr", st.phase))?;
        let c = if let Some(req) = st.req.as_ref() {
            // Before the accept, as the kernel's CM: the responder resources are what the
            // REQ's initiator depth asks for, the initiator depth what its responder
            // resources allow.
            let param = ConnParam {
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                ..st.param.clone()
            };
            passive_connect(&st, &param, dst.ip())
        } else {
            active_connect(&st, dst.ip())
        }
        .ok_or_else(|| invalid("init_qp_attr", st.phase))?;
        let c = RcConnect {
            min_rnr_timer: EXTERNAL_QP_MIN_RNR_TIMER,
            ..c
        };
        Ok(if state == QpState::Rtr {
            c.rtr_attr_for(qp_type)
        } else {
            c.rts_attr_for(qp_type)
        })
    }
}
