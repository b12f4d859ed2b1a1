//! XRC domains: the scope of XRC SRQs and XRC_RECV (target) QPs (IBA Vol 1 Annex A14).
//!
//! **Users.** A domain is opened once ([`crate::Context::alloc_xrcd`]) and may be opened
//! again ([`Xrcd::share`], what `ibv_open_xrcd` on the same file does): every [`Xrcd`]
//! handle is one *user* of the domain, and the domain lives until the last user closes
//! ([`Xrcd::destroy`] or drop). A user that is not the last one always closes at once; the
//! last one is refused with [`DestroyError::Busy`] while XRC SRQs or target QPs that still
//! have handles exist (so the domain is never freed under an SRQ or QP that uses it), and
//! closing it destroys the target QPs that only the domain holds (registered or not).
//!
//! **XRC_RECV QPs are owned by the domain.** In verbs an XRC target QP outlives the user
//! that created it: other users open it by number and it lives as long as the domain has
//! users. Here: dropping an XRC_RECV [`Qp`] handle without calling [`Qp::destroy`] hands
//! the QP to its domain — it stays published and keeps receiving — and [`Xrcd::open_qp`]
//! gives out a new handle for it. An explicit [`Qp::destroy`] destroys it. The legacy
//! registration calls keep a target QP without any handle: [`Xrcd::create_reg_qp`]
//! creates one already in RTR and registered once, [`Xrcd::reg_xrc_rcv_qp`] adds a
//! registration, [`Xrcd::unreg_xrc_rcv_qp`] removes one, and the QP is destroyed when its
//! last registration goes while no handle exists for it. When the domain's last user
//! goes, every target QP only the domain holds is destroyed. Async events of a target QP
//! go to the event queue of the context it lives in, which every user of the domain in
//! this process reads (all contexts of a process share one verbs context per device:
//! docs/ARCHITECTURE.md, "XRC domains"). Between processes: a domain opened on a file of a
//! shared device is recorded host-wide by `uroce_net::xrc`, which numbers its target QPs
//! ([`Xrcd::create_qp_numbered`]); a target QP still receives only in its own process.

use std::collections::BTreeMap;
use std::fmt;

use crate::connect::RcConnect;
use crate::context::{dec, get, try_inc, ContextCore};
use crate::cq::Cq;
use crate::error::{
    AllocError, Children, CreateQpError, CreateSrqError, DestroyError, ModifyQpError, ObjectKind,
    XrcError,
};
use crate::pd::Pd;
use crate::qp::{Qp, QpCap, QpCore, QpParts};
use crate::srq::{create_xrc, Srq, SrqInitAttr};
use crate::sync::{lock, Arc, AtomicUsize, Mutex};
use uroce_proto::qp_state::{QpState, QpType};

struct Owned {
    /// Open [`Xrcd`] handles (users of the domain); 0 once the last one closed.
    users: usize,
    /// Target QPs the domain holds without a handle.
    qps: Vec<Arc<QpCore>>,
    /// Registered target QPs (legacy API) and their registration counts.
    regs: BTreeMap<u32, (Arc<QpCore>, usize)>,
}

pub(crate) struct XrcdCore {
    pub(crate) id: u32,
    pub(crate) ctx: Arc<ContextCore>,
    /// XRC SRQs of the domain.
    pub(crate) srqs: AtomicUsize,
    /// XRC_RECV QPs of the domain (with or without handles).
    pub(crate) qps: AtomicUsize,
    owned: Mutex<Owned>,
}

impl XrcdCore {
    pub(crate) fn alloc(ctx: &Arc<ContextCore>) -> Result<Xrcd, AllocError> {
        let max = ctx.attr().max_xrcd;
        if !try_inc(&ctx.live.xrcds, max) {
            return Err(AllocError::Limit {
                object: ObjectKind::Xrcd,
                max,
            });
        }
        Ok(Xrcd {
            core: Arc::new(XrcdCore {
                id: ctx.next_id(),
                ctx: ctx.clone(),
                srqs: AtomicUsize::new(0),
                qps: AtomicUsize::new(0),
                owned: Mutex::new(Owned {
                    users: 1,
                    qps: Vec::new(),
                    regs: BTreeMap::new(),
                }),
            }),
            closed: false,
        })
    }

    /// Takes over an XRC_RECV QP whose handle is being dropped. `false` if the domain has
    /// no user left (the QP is then destroyed by the caller).
    pub(crate) fn adopt(&self, qp: &Arc<QpCore>) -> bool {
        let mut owned = lock(&self.owned);
        if owned.users == 0 || !qp.liveness.is_published() {
            return false;
        }
        if !owned.qps.iter().any(|q| Arc::ptr_eq(q, qp)) {
            owned.qps.push(qp.clone());
        }
        true
    }
}

impl Drop for XrcdCore {
    fn drop(&mut self) {
        dec(&self.ctx.live.xrcds);
    }
}

/// One user of an XRC domain (`ibv_xrcd`); see the module doc.
pub struct Xrcd {
    core: Arc<XrcdCore>,
    closed: bool,
}

impl Xrcd {
    /// The domain's id (unique within its context; equal for every user of the domain).
    pub fn id(&self) -> u32 {
        self.core.id
    }

    /// Whether `other` is a user of the same domain.
    pub fn same_domain(&self, other: &Xrcd) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }

    /// Opens the domain again: a new user (`ibv_open_xrcd` on a file already open).
    pub fn share(&self) -> Xrcd {
        lock(&self.core.owned).users += 1;
        Xrcd {
            core: self.core.clone(),
            closed: false,
        }
    }

    /// The domain's users (open handles).
    pub fn users(&self) -> usize {
        lock(&self.core.owned).users
    }

    /// Creates an XRC SRQ in this domain (`ibv_create_srq_ex` with `IBV_SRQT_XRC`); its
    /// receive completions go to `cq`.
    pub fn create_srq(&self, pd: &Pd, cq: &Cq, attr: &SrqInitAttr) -> Result<Srq, CreateSrqError> {
        create_xrc(&self.core, pd, cq, attr)
    }

    /// Creates an XRC_RECV (target) QP in this domain. It has no send queue, PD or CQ of its
    /// own: receives come from the XRC SRQ each packet names.
    pub fn create_qp(&self) -> Result<Qp, CreateQpError> {
        self.create_qp_at(None)
    }

    /// [`Xrcd::create_qp`] with the number `qpn`, not one from the context's range: the
    /// number a domain shared between processes allots host-wide (the domains file of
    /// `uroce_socket::xrcd`, from the reserved top slot of a shared device's QPN layout;
    /// docs/ARCHITECTURE.md, "XRC domains"). [`CreateQpError::QpnInUse`] when this context
    /// has a QP of that number; a number outside `2..=0xFFFFFE` is refused as invalid.
    pub fn create_qp_numbered(&self, qpn: u32) -> Result<Qp, CreateQpError> {
        if !(2..crate::context::MAX_QPN).contains(&qpn) {
            return Err(CreateQpError::QpnInUse(qpn));
        }
        self.create_qp_at(Some(qpn))
    }

    fn create_qp_at(&self, qpn: Option<u32>) -> Result<Qp, CreateQpError> {
        crate::engine::refuse_without_engine(&self.core.ctx, QpType::XrcRecv)?;
        QpCore::build(
            &self.core.ctx,
            QpParts {
                qp_type: QpType::XrcRecv,
                pd: None,
                send_cq: None,
                recv_cq: None,
                srq: None,
                xrcd: Some(self.core.clone()),
                cap: QpCap::default(),
                sq_sig_all: false,
                qpn,
            },
        )
    }

    /// The legacy `create_xrc_rcv_qp` verb: creates a target QP of this domain, takes it
    /// RESET→INIT→RTR in one call and registers it once for this user; returns its number.
    /// The QP has no handle: it is reached by number ([`Xrcd::open_qp`],
    /// [`Xrcd::reg_xrc_rcv_qp`]) and destroyed by the last [`Xrcd::unreg_xrc_rcv_qp`] (or
    /// with the domain).
    ///
    /// | attribute | from | |
    /// |---|---|---|
    /// | `qp_access_flags` | `c.access` | INIT, needed |
    /// | port, P_Key index | fixed: port 1, index 0 | INIT |
    /// | `ah_attr` (the initiator's address) | `c.dest_ip` | RTR, needed |
    /// | `dest_qp_num` (the initiator QP) | `c.dest_qpn` | RTR, needed |
    /// | `path_mtu` | `c.path_mtu` | RTR, needed |
    /// | `rq_psn` (the initiator's `sq_psn`) | `c.rq_psn` | RTR, needed |
    /// | `max_dest_rd_atomic` | `c.max_dest_rd_atomic` | RTR, needed |
    /// | `min_rnr_timer` | `c.min_rnr_timer` | RTR, needed |
    /// | `sq_psn`, `timeout`, `retry_cnt`, `rnr_retry`, `max_rd_atomic` | ignored | a target sends only responses; RTS is not needed to receive |
    ///
    /// On a modify error the QP is destroyed again and the error returned.
    pub fn create_reg_qp(&self, c: &RcConnect) -> Result<u32, XrcError> {
        let qp = self.create_qp().map_err(XrcError::Create)?;
        let (init, im) = c.init_attr();
        let (rtr, rm) = c.rtr_attr();
        let modified: Result<(), ModifyQpError> =
            qp.modify(&init, im).and_then(|()| qp.modify(&rtr, rm));
        if let Err(e) = modified {
            let _ = qp.destroy();
            return Err(XrcError::Modify(e));
        }
        debug_assert_eq!(qp.query().0.qp_state, QpState::Rtr);
        let qpn = qp.qp_num();
        lock(&self.core.owned)
            .regs
            .insert(qpn, (qp.core().clone(), 1));
        // The handle goes; the domain holds the QP.
        drop(qp);
        Ok(qpn)
    }

    /// A target QP of this domain by number: held by the domain, registered, or alive
    /// with a handle elsewhere.
    fn find_qp(&self, qpn: u32) -> Option<Arc<QpCore>> {
        let owned = lock(&self.core.owned);
        if let Some(q) = owned.qps.iter().find(|q| q.qpn() == qpn) {
            return Some(q.clone());
        }
        if let Some((q, _)) = owned.regs.get(&qpn) {
            return Some(q.clone());
        }
        drop(owned);
        self.core.ctx.qps.get(qpn).filter(|q| {
            q.qp_type == QpType::XrcRecv
                && q.xrcd.as_ref().is_some_and(|d| Arc::ptr_eq(d, &self.core))
        })
    }

    /// Registers this user on target QP `qpn` (legacy `reg_xrc_rcv_qp`): the domain keeps
    /// it until the matching [`Xrcd::unreg_xrc_rcv_qp`].
    pub fn reg_xrc_rcv_qp(&self, qpn: u32) -> Result<(), XrcError> {
        let q = self.find_qp(qpn).ok_or(XrcError::NoSuchQp(qpn))?;
        let mut owned = lock(&self.core.owned);
        owned.regs.entry(qpn).or_insert((q, 0)).1 += 1;
        Ok(())
    }

    /// Removes one registration of target QP `qpn` (legacy `unreg_xrc_rcv_qp`). The last
    /// one destroys the QP unless a handle for it exists.
    pub fn unreg_xrc_rcv_qp(&self, qpn: u32) -> Result<(), XrcError> {
        let doomed = {
            let mut owned = lock(&self.core.owned);
            let (_, n) = owned
                .regs
                .get_mut(&qpn)
                .ok_or(XrcError::NotRegistered(qpn))?;
            *n -= 1;
            if *n > 0 {
                return Ok(());
            }
            owned.regs.remove(&qpn);
            let pos = owned.qps.iter().position(|q| q.qpn() == qpn);
            pos.map(|p| owned.qps.swap_remove(p))
        };
        if let Some(core) = doomed {
            Qp::from_core(core)
                .destroy()
                .map_err(|(_, e)| XrcError::Destroy(e))?;
        }
        Ok(())
    }

    /// A new handle for a target QP of this domain (`ibv_open_qp`).
    pub fn open_qp(&self, qpn: u32) -> Result<Qp, XrcError> {
        {
            let mut owned = lock(&self.core.owned);
            if let Some(pos) = owned.qps.iter().position(|q| q.qpn() == qpn) {
                let core = owned.qps.swap_remove(pos);
                return Ok(Qp::from_core(core));
            }
        }
        self.find_qp(qpn)
            .map(Qp::from_core)
            .ok_or(XrcError::NoSuchQp(qpn))
    }

    /// Numbers of the XRC_RECV QPs the domain holds without a handle.
    pub fn owned_qps(&self) -> Vec<u32> {
        let owned = lock(&self.core.owned);
        let mut v: Vec<u32> = owned.qps.iter().map(|q| q.qpn()).collect();
        v.sort_unstable();
        v
    }

    /// Registration count of target QP `qpn` (0 if not registered).
    pub fn registrations(&self, qpn: u32) -> usize {
        lock(&self.core.owned).regs.get(&qpn).map_or(0, |(_, n)| *n)
    }

    /// The domain's children: XRC SRQs and XRC_RECV QPs.
    pub fn children(&self) -> Children {
        Children {
            qps: get(&self.core.qps),
            srqs: get(&self.core.srqs),
            ..Children::default()
        }
    }

    /// Closes this user (`ibv_close_xrcd`). Another user closes at once; the last one gets
    /// [`DestroyError::Busy`] while XRC SRQs or XRC_RECV QPs with live handles exist; the
    /// target QPs only the domain holds (handle dropped, or registered) are destroyed.
    pub fn destroy(mut self) -> Result<(), (Xrcd, DestroyError)> {
        {
            let owned = lock(&self.core.owned);
            // Target QPs only the domain holds (without handle, or registered).
            let mut held: Vec<u32> = owned.qps.iter().map(|q| q.qpn()).collect();
            held.extend(owned.regs.keys().copied());
            held.sort_unstable();
            held.dedup();
            if owned.users <= 1 {
                let srqs = get(&self.core.srqs);
                let qps = get(&self.core.qps).saturating_sub(held.len());
                if srqs > 0 || qps > 0 {
                    drop(owned);
                    let children = Children {
                        qps: get(&self.core.qps),
                        srqs,
                        ..Children::default()
                    };
                    return Err((
                        self,
                        DestroyError::Busy {
                            object: ObjectKind::Xrcd,
                            children,
                        },
                    ));
                }
            }
        }
        self.close_user();
        Ok(())
    }

    /// Removes this user; the last one destroys the target QPs only the domain holds.
    fn close_user(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let orphans = {
            let mut owned = lock(&self.core.owned);
            owned.users = owned.users.saturating_sub(1);
            if owned.users > 0 {
                return;
            }
            // One reference per QP (a QP both held and registered appears in both).
            let mut v: BTreeMap<u32, Arc<QpCore>> = std::mem::take(&mut owned.regs)
                .into_iter()
                .map(|(n, (q, _))| (n, q))
                .collect();
            for q in std::mem::take(&mut owned.qps) {
                v.insert(q.qpn(), q);
            }
            v
        };
        // Each becomes a handle again and is dropped, which (the domain having no user
        // left) destroys it.
        for core in orphans.into_values() {
            drop(Qp::from_core(core));
        }
    }

    /// Test hook: strong count of the domain's shared state (users, SRQs and QPs each hold
    /// one).
    #[doc(hidden)]
    pub fn ref_count(&self) -> usize {
        Arc::strong_count(&self.core)
    }
}

impl Drop for Xrcd {
    fn drop(&mut self) {
        self.close_user();
    }
}

impl fmt::Debug for Xrcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Xrcd")
            .field("id", &self.core.id)
            .field("children", &self.children())
            .finish()
    }
}
