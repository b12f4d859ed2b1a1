//! Binding a QP to at most one connection endpoint (an RDMA-CM id).
//!
//! A connection manager moves a QP through its states from the messages it exchanges, so
//! it holds a counted reference ([`crate::QpRef`]) to the QP while the connection lives.
//! Real CMs fail in three ways here: two endpoints driving one QP, an endpoint whose QP was
//! destroyed under it (use after free or a leaked reference that makes the destroy hang),
//! and an event for a QP that is gone. The protocol, which every QP carries as a
//! [`BindSlot`]:
//!
//! 1. **Bind** ([`crate::QpRef::bind_endpoint`]): the endpoint, under its own lock, clones
//!    its QP reference first and then publishes the binding in the QP's slot (one mutex):
//!    `Free` → `Bound(token, owner)`. A slot already `Bound` refuses with
//!    [`BindError::AlreadyBound`], a `Dead` one (the QP is being destroyed) with
//!    [`BindError::Destroyed`]; the endpoint then drops the reference it took.
//! 2. **Unbind** ([`crate::QpRef::unbind_endpoint`]): only the token that bound can free
//!    the slot.
//! 3. **Destroy** (`Qp::destroy`): after the QP is unpublished, the slot becomes `Dead`
//!    (no bind succeeds any more) and the owner it held, if any, is told once
//!    ([`BindingOwner::qp_destroyed`], on the destroying thread, with no verbs lock held):
//!    the endpoint takes its lock, drops its QP reference and aborts its setup. Then the
//!    destroy waits for the references as usual (an endpoint callback in flight holds its
//!    own clone and finishes first), so nothing is freed under a user.
//!
//! Under `--cfg loom` the slot's mutex is loom's; `tests/loom_binding.rs` checks the
//! protocol against a racing bind, second bind and destroy.

use crate::sync::{lock, Mutex};

/// The owner side of a binding: told when its QP is destroyed.
pub trait BindingOwner: Send + Sync {
    /// The bound QP (number `qpn`) is being destroyed: drop every reference to it and
    /// abort what it was used for. Called at most once per binding.
    fn qp_destroyed(&self, qpn: u32);
}

/// Why a bind failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// The QP is bound to another endpoint.
    #[error("the QP is already bound to a connection endpoint")]
    AlreadyBound,
    /// The QP is being destroyed.
    #[error("the QP is being destroyed")]
    Destroyed,
}

enum Slot<O> {
    Free,
    Bound(u64, O),
    Dead,
}

/// One QP's binding (see the module documentation). `O` is the owner the slot hands back
/// when the QP dies.
pub struct BindSlot<O> {
    slot: Mutex<Slot<O>>,
}

impl<O> Default for BindSlot<O> {
    fn default() -> Self {
        BindSlot::new()
    }
}

impl<O> BindSlot<O> {
    /// A free slot.
    pub fn new() -> BindSlot<O> {
        BindSlot {
            slot: Mutex::new(Slot::Free),
        }
    }

    /// Binds `owner` under `token`.
    ///
    /// # Errors
    /// [`BindError::AlreadyBound`], [`BindError::Destroyed`].
    pub fn bind(&self, token: u64, owner: O) -> Result<(), BindError> {
        let mut s = lock(&self.slot);
        match *s {
            Slot::Free => {
                *s = Slot::Bound(token, owner);
                Ok(())
            }
            Slot::Bound(..) => Err(BindError::AlreadyBound),
            Slot::Dead => Err(BindError::Destroyed),
        }
    }

    /// Frees the slot if `token` holds it; returns whether it did.
    pub fn unbind(&self, token: u64) -> bool {
        let mut s = lock(&self.slot);
        if matches!(*s, Slot::Bound(t, _) if t == token) {
            *s = Slot::Free;
            true
        } else {
            false
        }
    }

    /// The token bound now.
    pub fn bound_token(&self) -> Option<u64> {
        match *lock(&self.slot) {
            Slot::Bound(t, _) => Some(t),
            _ => None,
        }
    }

    /// Marks the slot dead (no bind succeeds any more) and returns the owner it held.
    pub fn kill(&self) -> Option<O> {
        match std::mem::replace(&mut *lock(&self.slot), Slot::Dead) {
            Slot::Bound(_, o) => Some(o),
            _ => None,
        }
    }
}
