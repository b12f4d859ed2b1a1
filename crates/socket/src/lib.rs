//! # uroce-socket: RoCEv2 on Linux UDP sockets
//!
//! The socket layer of uroce (like quinn-udp beside quinn-proto): it puts RoCEv2 packets
//! (BTH..ICRC, built by `uroce-wire`) on real UDP sockets, port 4791, and takes them off
//! again: batching, GSO/GRO, ICRC sealing and checking, faults, capture, counters;
//! nothing of the protocol and nothing of the device (`uroce-net` drives QPs over it).
//!
//! ## Layering
//! `wire` → `proto` → `verbs` → `socket` → **`net`** → `ffi` / `cli` (see
//! `docs/ARCHITECTURE.md`); this crate uses only `uroce-wire` (packet formats, ICRC, pcap
//! framing) among the uroce crates. Dependencies: `libc` (the system calls), `rustix`
//! (poll, multicast options), `rand` (seeded fault injection), `thiserror`.
//!
//! ## What is here
//! * [`RoceSocket`] ([`socket`]): an unconnected, non-blocking UDP socket with
//!   `IP_PMTUDISC_DO`, large buffers, batched send ([`RoceSocket::send_batch`], one
//!   `sendmmsg` per 64 packets) and receive ([`RoceSocket::recv_batch`], one `recvmmsg`
//!   into a preallocated [`RecvBatch`]), ICRC sealing ([`seal_for`]) and checking
//!   ([`verify_icrc`], [`verify_icrc_with`], [`IcrcPolicy`]).
//! * Trains of equal-size packets to one destination ([`RoceSocket::send_train`]) go out
//!   with UDP segmentation offload (`UDP_SEGMENT`, many packets per system call), and
//!   received datagrams the kernel coalesced (`UDP_GRO`) are split back into packets by
//!   [`RoceSocket::recv_batch`]; the k-th packet of a GSO message carries IPv4
//!   Identification k and is sealed for it (measured; see [`socket`]).
//! * [`faults`]: seeded drop / duplicate / reorder / corrupt on outgoing packets
//!   (`UROCE_FAULTS=drop=0.01,seed=7`).
//! * [`capture`]: every packet sent and received written to a pcap file, with the IP and
//!   UDP headers the kernel emits.
//! * [`counters`]: per-socket packet, byte, error and fault counters.
//! * [`steer`] and [`host`]: building blocks of a device shared by every process of a
//!   host (used by the device runtime's opt-in shared device): a classic BPF program that
//!   steers the datagrams of a `SO_REUSEPORT` group to the member socket that owns their
//!   destination QP, and the per-host registry of members, slots and group orders.
//! * [`xrcd`]: building block of XRC domains shared between processes: the per-user file
//!   of domains, their references and their host-wide target QP numbers (not used yet).
//!
//! ## The ICRC / IP-header contract
//! The RoCEv2 ICRC covers most of the IP header, including the IPv4 Identification and
//! flags, which a UDP socket does not control. For an **unconnected** socket with
//! `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, bound to a specific address and sending without IP
//! options, Linux emits IPv4 Identification 0 with DF set (and k for the k-th datagram of
//! a GSO message); so the sender seals the ICRC for exactly that header (addresses, ports
//! and lengths included), and the receiver checks it against the same reconstruction
//! first. A peer with other Identifications (Linux Soft-RoCE counts them per
//! destination) is recognised by solving for the Identification and DF flag its ICRC is
//! valid for (`uroce_wire::icrc_ident`; [`IcrcPolicy`], `UROCE_ICRC`); `docs/ICRC.md` has
//! the details and the cost in error detection. IPv6 has nothing unpredictable that the
//! ICRC covers. Sockets are therefore never connected and never bound to the unspecified
//! address.
//!
//! ## Unsafe policy
//! `unsafe` is denied in the whole crate except the private `sys` module, which wraps the
//! few system calls the standard library lacks (`setsockopt` / `getsockopt`, including
//! `SO_ATTACH_REUSEPORT_CBPF`, `sendmmsg`,
//! `recvmmsg`, `poll`, the `pthread_atfork` handler of [`fork`], the OFD byte-range locks of
//! [`xrcd::records`]), and [`ifaddr`] (`getifaddrs`, `if_nametoindex`), in safe functions over borrowed Rust values; each block carries a
//! `// SAFETY:` comment saying why the pointers it hands the kernel are valid for the
//! call. Received bytes are only ever read through safe slices, and nothing here panics
//! on network input.
//!
//! Linux only.
#![deny(unsafe_code)]

#[cfg(not(target_os = "linux"))]
compile_error!("uroce-socket uses Linux socket behaviour (sendmmsg, recvmmsg, IP_PMTUDISC_DO)");

pub mod capture;
pub mod counters;
mod error;
pub mod faults;
mod files;
pub mod fork;
pub mod host;
#[allow(unsafe_code)]
pub mod ifaddr;
pub mod mcast;
pub mod socket;
pub mod steer;
#[allow(unsafe_code)]
mod sys;
pub mod xrcd;

pub use capture::Capture;
pub use counters::{CounterSnapshot, Counters};
pub use error::SocketError;
pub use faults::{FaultConfig, FaultInjector, FaultParseError};
pub use socket::{
    seal_for, verify_icrc, verify_icrc_with, BufferSizes, IcrcCheck, IcrcPolicy, OutPacket,
    Received, RecvBatch, RecvDatagram, RecvStatus, RoceSocket, SocketConfig, BATCH_MAX,
    DEFAULT_BUFFER_BYTES, ICRC_ENV,
};
pub use uroce_wire::icrc_ident::Ipv4Ident;
