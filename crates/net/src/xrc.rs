//! XRC domains opened on a file, across the processes of a host (IBA Vol 1 Annex A14; the
//! verbs `ibv_open_xrcd` on a file): each open of a domain on a *shared* device
//! ([`crate::NetConfig::shared`]) is recorded as one reference of this process in the
//! device's domains file ([`uroce_socket::xrcd`]; beside the host registry, one per network
//! namespace and device address, since the kernel keeps XRC domains per device), so that
//! every process of the user on that device agrees on which domains exist (`O_CREAT` /
//! `O_EXCL` decide against the whole host, not one process), and a domain ends with its
//! last reference on the host: a close, or the reap of a process that exited without
//! closing.
//!
//! With slot SRQ numbers ([`crate::NetConfig::xrc_srq_slots`]) the domain's target QPs are
//! also numbered from the domain's host-wide allotment (the reserved top slot of the QPN
//! layout), so that the number belongs to the domain rather than to the creator's member
//! slot, which a later process may take. Without them a target QP keeps a number of its
//! member's slot: XRC requests naming slot-0 SRQ numbers are steered by their target QP,
//! and one of the top slot would reach the designated member instead.
//!
//! What this does *not* do yet: the target QP itself (its responder state) is still kept
//! by the process that created it (docs/ARCHITECTURE.md, "XRC domains", says what sharing
//! it needs).

use uroce_socket::xrcd::LockedDomains;
pub use uroce_socket::xrcd::{Closed, DomainId, Domains, XrcdError};

use crate::NetDevice;

/// Why a domain could not be opened on a file.
#[derive(Debug, thiserror::Error)]
pub enum DomainOpenError {
    /// `O_EXCL`, and a process of the host holds the domain.
    #[error("XRC domain {0} exists (O_EXCL)")]
    Exists(DomainId),
    /// No process of the host holds the domain, and `O_CREAT` is not set.
    #[error("no XRC domain {0} on this host, and O_CREAT is not set")]
    Absent(DomainId),
    /// The domains file.
    #[error(transparent)]
    File(#[from] XrcdError),
}

/// One reference of this process to a domain opened on a file, recorded in the domains
/// file; closed by [`DomainRef::close`] or on drop (errors ignored then). A forked child's
/// copy never changes the file.
#[derive(Debug)]
pub struct DomainRef {
    domains: Domains,
    id: DomainId,
    numbered: bool,
    owner: u32,
    closed: bool,
}

/// Takes the lock and drops the references of processes that are gone (their domains
/// left without any are destroyed: their target QPs lived in those processes).
fn locked(domains: &Domains) -> Result<LockedDomains<'_>, XrcdError> {
    let mut l = domains.lock()?;
    l.reap();
    Ok(l)
}

impl NetDevice {
    /// Records one more reference of this process to domain `id` (the device and inode of
    /// the file it was opened on) in the device's domains file; `None` for an exclusive
    /// device, whose domains stay per process. `create` (`O_CREAT`) allows creating a
    /// domain nobody on the host holds, `exclusive` (`O_EXCL`) requires it.
    ///
    /// # Errors
    /// [`DomainOpenError`].
    pub fn open_xrc_domain(
        &self,
        id: DomainId,
        create: bool,
        exclusive: bool,
    ) -> Result<Option<DomainRef>, DomainOpenError> {
        let Some(domains) = self.xrc_domains() else {
            return Ok(None);
        };
        let mut l = locked(&domains)?;
        let exists = l.state().domains.contains_key(&id);
        if exists && exclusive {
            return Err(DomainOpenError::Exists(id));
        }
        if !exists && !create {
            return Err(DomainOpenError::Absent(id));
        }
        l.open_ref(id);
        l.commit()?;
        Ok(Some(DomainRef {
            domains,
            id,
            numbered: self.xrc_srq_slots(),
            owner: std::process::id(),
            closed: false,
        }))
    }
}

impl DomainRef {
    /// The domain.
    pub fn id(&self) -> DomainId {
        self.id
    }

    /// Whether the domain's target QPs are numbered host-wide (see the module docs).
    pub fn numbers_target_qps(&self) -> bool {
        self.numbered
    }

    /// A new target QP number of the domain's host-wide allotment, committed to the file
    /// (the caller gives it back with [`DomainRef::release_target_qpn`] if it cannot create
    /// the QP); `None` when the domain's target QPs are not numbered host-wide.
    ///
    /// # Errors
    /// [`XrcdError`]: the file, or every number taken.
    pub fn alloc_target_qpn(&self) -> Result<Option<u32>, XrcdError> {
        if !self.numbered {
            return Ok(None);
        }
        let mut l = locked(&self.domains)?;
        let qpn = l.create_target_qp(self.id)?;
        l.commit()?;
        Ok(Some(qpn))
    }

    /// Removes target QP `qpn` from the domain (it was destroyed, or never created);
    /// whether the domain had it.
    ///
    /// # Errors
    /// [`XrcdError`]: the file.
    pub fn release_target_qpn(&self, qpn: u32) -> Result<bool, XrcdError> {
        let mut l = locked(&self.domains)?;
        let had = l.destroy_target_qp(self.id, qpn);
        l.commit()?;
        Ok(had)
    }

    /// Closes this reference; the domain's last reference on the host destroys it (see
    /// [`Closed`]).
    ///
    /// # Errors
    /// [`XrcdError`]: the file, or the reference was reaped meanwhile
    /// ([`XrcdError::NotHeld`]: this process was taken for dead).
    pub fn close(mut self) -> Result<Closed, XrcdError> {
        self.close_ref()
    }

    fn close_ref(&mut self) -> Result<Closed, XrcdError> {
        if self.closed || self.owner != std::process::id() {
            self.closed = true;
            return Ok(Closed::default());
        }
        self.closed = true;
        let mut l = locked(&self.domains)?;
        let closed = l.close_ref(self.id)?;
        l.commit()?;
        Ok(closed)
    }
}

impl Drop for DomainRef {
    fn drop(&mut self) {
        let _ = self.close_ref();
    }
}
