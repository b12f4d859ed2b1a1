//! Errors of the socket layer.

use std::io;
use std::net::{IpAddr, SocketAddr};

use uroce_wire::WireError;

use crate::faults::FaultParseError;

/// Why a socket operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// The UDP socket could not be created or bound.
    #[error("cannot bind a UDP socket to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// A socket option could not be set or read.
    #[error("socket option {option} on {local}: {source}")]
    SocketOption {
        /// The option, e.g. `IP_MTU_DISCOVER`.
        option: &'static str,
        /// The socket's local address.
        local: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// An address that cannot be used to compute an ICRC: the unspecified address (the
    /// kernel would pick the real source address, which the ICRC covers) or an
    /// IPv4-mapped IPv6 address (the datagram would travel as IPv4).
    #[error("address {addr} cannot be used: {why}")]
    UnusableAddress {
        /// The address.
        addr: IpAddr,
        /// Why not.
        why: &'static str,
    },
    /// The two ends of a datagram are of different address families.
    #[error("{local} and {remote} are of different address families")]
    AddressFamily {
        /// This socket's address.
        local: SocketAddr,
        /// The peer's address.
        remote: SocketAddr,
    },
    /// Building headers or sealing the ICRC failed (e.g. a packet shorter than BTH+ICRC
    /// or longer than a datagram can be).
    #[error("cannot seal the ICRC of a packet from {local} to {remote}: {source}")]
    Seal {
        /// The sender's address.
        local: SocketAddr,
        /// The destination.
        remote: SocketAddr,
        /// The wire-layer error.
        source: WireError,
    },
    /// `sendmmsg` failed in a way that is not about one packet (e.g. a bad descriptor).
    #[error("sending on {local}: {source}")]
    Send {
        /// The socket's local address.
        local: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// `recvmmsg` failed.
    #[error("receiving on {local}: {source}")]
    Recv {
        /// The socket's local address.
        local: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// `poll` failed.
    #[error("polling {local}: {source}")]
    Poll {
        /// The socket's local address.
        local: SocketAddr,
        /// What the kernel said.
        source: io::Error,
    },
    /// A receive batch was configured with impossible sizes.
    #[error("receive batch of {slots} slots of {slot_len} bytes: {why}")]
    BatchSize {
        /// Slots asked for.
        slots: usize,
        /// Bytes per slot asked for.
        slot_len: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// Writing the packet capture failed.
    #[error("packet capture: {0}")]
    Capture(WireError),
    /// Creating the packet capture file failed.
    #[error("cannot create capture file {path}: {source}")]
    CaptureFile {
        /// The file.
        path: String,
        /// What the OS said.
        source: io::Error,
    },
    /// The fault-injection configuration is invalid.
    #[error(transparent)]
    Faults(#[from] FaultParseError),
    /// `UROCE_ICRC` is not one of the policy names.
    #[error("UROCE_ICRC={value:?}: expected strict, any-id or unverified")]
    BadIcrcPolicy {
        /// Its value.
        value: String,
    },
}
