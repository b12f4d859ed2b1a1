//! # IP multicast groups for UD multicast (RoCEv2)
//!
//! RoCEv2 (IBA vol 1 Annex A17) carries a multicast GID as an IP multicast destination:
//! a datagram to a multicast GID is a UDP datagram to the group's address, port 4791, with
//! DestQP `0xFFFFFF`. The device therefore
//! * sends to a group from its ordinary socket, which has the outgoing multicast
//!   interface set to the device's own interface (`IP_MULTICAST_IF` / `IPV6_MULTICAST_IF`;
//!   for a loopback address that is `lo`) and multicast loopback on (`IP_MULTICAST_LOOP`,
//!   the kernel default), so that devices of the same host receive what it sends;
//! * receives a group on a socket of its own per group ([`group_socket`]): bound to
//!   `group:4791` with `SO_REUSEADDR`, so every device of the host that joined the group
//!   gets its copy, joined to the group on the device's interface
//!   (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`) and bound to that interface, so that it
//!   takes only datagrams that arrived there. The socket bound to the device's unicast
//!   address never sees multicast datagrams (Linux delivers them only to sockets bound
//!   to the group or the wildcard address).
//!
//! The verbs layer asks for a group when the first QP of the context attaches to it and
//! gives it up when the last one detaches (`uroce_verbs::Transport::join_group`); the
//! device's receive step (`uroce_net::device`) hands every datagram of a group to each QP
//! attached to it.

use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::AsFd;

use rustix::net::{sockopt, AddressFamily, SocketFlags, SocketType};

/// A socket bound to `group:port` (with `SO_REUSEADDR`) and joined to `group` on the
/// interface of the local address `iface`.
///
/// # Errors
/// Socket creation, option, bind or join errors; `EINVAL` when `group` is not multicast
/// or the families of `group` and `iface` differ.
pub fn group_socket(group: IpAddr, iface: IpAddr, port: u16) -> io::Result<UdpSocket> {
    if !group.is_multicast() || group.is_ipv4() != iface.is_ipv4() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let family = if group.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(family, SocketType::DGRAM, SocketFlags::CLOEXEC, None)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    // IPv4 joins by address and needs no index; IPv6 cannot do without it.
    let index = ifindex(iface);
    // Only datagrams that arrived on the device's interface: Linux hands a datagram to a
    // group to every socket bound to the group that is a member of it on any interface
    // (for IPv6 the membership's interface is not compared at all, and IP_MULTICAST_ALL /
    // IPV6_MULTICAST_ALL is on by default), so without this a device on one interface
    // gets a second copy of what another interface of the host received (the sender's
    // own looped-back copy, on a host where two interfaces joined the group).
    // Unprivileged since Linux 5.7 for a socket not yet bound to a device; where it is
    // refused, the socket stays unbound (as before) rather than the join failing.
    if let Ok(index) = index {
        let _ = crate::sys::set_int_option(
            fd.as_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTOIFINDEX,
            index as libc::c_int,
        );
    }
    match (group, iface) {
        (IpAddr::V4(g), IpAddr::V4(i)) => {
            rustix::net::bind(&fd, &SocketAddr::new(group, port))?;
            sockopt::set_ip_add_membership(&fd, &g, &i)?;
        }
        (IpAddr::V6(g), _) => {
            let index = index?;
            // A group of link-local (or interface-local) scope can only be bound with its
            // interface as scope id (EINVAL otherwise); for other scopes the kernel
            // ignores it.
            rustix::net::bind(&fd, &SocketAddr::V6(SocketAddrV6::new(g, port, 0, index)))?;
            sockopt::set_ipv6_add_membership(&fd, &g, index)?;
        }
        _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
    Ok(UdpSocket::from(fd))
}

/// Sets the outgoing multicast interface of the device socket `fd` (bound to `local`) to
/// the device's interface. Multicast loopback stays on (the kernel default; set
/// explicitly).
///
/// # Errors
/// The option errors.
pub fn set_sending_interface(fd: impl AsFd, local: IpAddr) -> io::Result<()> {
    match local {
        IpAddr::V4(a) => {
            sockopt::set_ip_multicast_if(&fd, &a)?;
            sockopt::set_ip_multicast_loop(&fd, true)?;
        }
        IpAddr::V6(_) => {
            sockopt::set_ipv6_multicast_if(&fd, ifindex(local)?)?;
            sockopt::set_ipv6_multicast_loop(&fd, true)?;
        }
    }
    Ok(())
}

/// The interface index of the interface that owns `local` (`ENODEV` if none).
fn ifindex(local: IpAddr) -> io::Result<u32> {
    crate::ifaddr::netdev_of(local)
        .map(|n| n.ifindex)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENODEV))
}
