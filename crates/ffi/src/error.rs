//! The errors of the C library: [`FfiError`] (each maps to one `errno` value, which the
//! return helpers of `crate::entry` store and return) and the helpers that build the common
//! refusals.

use std::ffi::c_int;

use uroce_verbs::{Children, DestroyError, ObjectKind};

/// Why a call failed; each maps to one `errno` value.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FfiError {
    /// A pointer argument was NULL or not an object uroce handed out (or it was closed).
    #[error("{what} is NULL or not a live uroce object")]
    BadHandle {
        /// Which argument.
        what: &'static str,
    },
    /// A port number other than 1.
    #[error("port {port} does not exist (uroce devices have port 1 only)")]
    BadPort {
        /// The port asked for.
        port: u32,
    },
    /// A GID index beyond the table.
    #[error("GID index {index} is outside the table of {len} entries")]
    BadGidIndex {
        /// The index asked for.
        index: u64,
        /// Table length.
        len: u32,
    },
    /// An argument value the call does not accept.
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// The environment does not describe a usable device (e.g. `UROCE_ADDR` unparsable).
    #[error("device configuration: {0}")]
    Config(String),
    /// Opening the network device failed (address not local, port taken, …).
    #[error("cannot open device uroce0: {0}")]
    Open(String),
    /// The verbs layer refused the operation; `errno` is the verbs ABI's value for it.
    #[error("{op}: {reason}")]
    Refused {
        /// The verbs call.
        op: &'static str,
        /// The errno value reported (EINVAL, ENOMEM, EBUSY, …).
        errno: i32,
        /// The verbs layer's explanation.
        reason: String,
    },
    /// A feature this library does not implement (yet).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
}

impl FfiError {
    /// The `errno` value this error reports.
    pub fn errno(&self) -> i32 {
        match self {
            FfiError::BadHandle { .. }
            | FfiError::BadPort { .. }
            | FfiError::BadGidIndex { .. }
            | FfiError::Invalid(_)
            | FfiError::Config(_) => libc::EINVAL,
            FfiError::Open(_) => libc::ENODEV,
            FfiError::Refused { errno, .. } => *errno,
            FfiError::Unsupported(_) => libc::EOPNOTSUPP,
        }
    }
}

/// A verbs-layer refusal with its errno.
pub(crate) fn refused(op: &'static str, errno: c_int, e: impl std::fmt::Display) -> FfiError {
    FfiError::Refused {
        op,
        errno,
        reason: e.to_string(),
    }
}

/// `EBUSY` for `op` while `object` has live `children`. Checked under the registry lock
/// before the object is unpublished, so that a refused destroy leaves it registered
/// throughout: threads using it meanwhile (polling a CQ, posting to an SRQ, registering
/// memory in a PD) never find it missing. The verbs layer checks again when it destroys.
pub(crate) fn refuse_if_busy(
    op: &'static str,
    object: ObjectKind,
    children: Children,
) -> Result<(), FfiError> {
    if children.is_empty() {
        return Ok(());
    }
    Err(refused(
        op,
        libc::EBUSY,
        DestroyError::Busy { object, children },
    ))
}
