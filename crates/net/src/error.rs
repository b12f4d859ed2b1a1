//! Errors of the device: those of its sockets (`uroce_socket::SocketError`) and its own.

use std::io;

use uroce_socket::{FaultParseError, SocketError};

/// Why opening or running a network device failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// A socket of the device: binding, options, sending, receiving, capture, faults.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// An environment variable does not hold what it should.
    #[error("{var}={value:?} is not an IP address")]
    BadAddr {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// Creating the verbs device or context failed.
    #[error("device: {0}")]
    Device(String),
    /// Setting up the device's GSI QP (QP1) failed.
    #[error(transparent)]
    Gsi(#[from] crate::gsi::GsiError),
    /// The per-host registry of a shared device (see `uroce_socket::host`).
    #[error(transparent)]
    Host(#[from] uroce_socket::host::HostError),
    /// The kernel refused the steering program of a shared device's reuseport group
    /// (`SO_ATTACH_REUSEPORT_CBPF`, Linux 4.5+).
    #[error("cannot steer the reuseport group of {group}: {source}")]
    Steer {
        /// The group (`address:port`).
        group: std::net::SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// A system call of the device's progress machinery failed (eventfd, thread spawn).
    #[error("device I/O setup: {0}")]
    Io(io::Error),
}

impl From<FaultParseError> for NetError {
    fn from(e: FaultParseError) -> NetError {
        NetError::Socket(SocketError::Faults(e))
    }
}
