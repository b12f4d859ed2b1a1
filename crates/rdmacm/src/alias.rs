//! Loopback addresses shared between processes.
//!
//! With the kernel's RDMA CM, every process of a host uses the one device of an interface
//! and every address of it: two processes may both use 127.0.0.1, one listening and one
//! connecting. A uroce device is one UDP socket per process, so only one process owns a
//! given address. On the loopback interface, where every 127.0.0.0/8 address (and `::1`)
//! reaches the host, the CM therefore lets an id bind a loopback address its device does
//! not own (the id uses the device's own address on the wire), and a listener so bound
//! announces itself: it holds an abstract Unix socket named
//! `uroce-rdma-cm/<port space>/<address>/<port>/<device address>` (the name disappears with
//! the socket, when the id goes or the process ends). A connect to a loopback address
//! looks for such a name in `/proc/net/unix` and sends its request to the device address
//! it names.
//!
//! Abstract socket names belong to the network namespace, so announcements are visible
//! exactly to the processes that share the loopback interface.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixDatagram};

/// Prefix of the announcement names.
const PREFIX: &str = "uroce-rdma-cm";

/// A listener's announcement; dropping it withdraws it.
#[derive(Debug)]
pub(crate) struct Announcement(#[allow(dead_code)] UnixDatagram);

fn key(ps: u16, addr: SocketAddr) -> String {
    format!("{PREFIX}/{ps}/{}/{}/", addr.ip(), addr.port())
}

/// Announces that the listener on `addr` (port space `ps`) is reached at `real`.
pub(crate) fn announce(ps: u16, addr: SocketAddr, real: IpAddr) -> io::Result<Announcement> {
    let name = format!("{}{real}", key(ps, addr));
    let sa = UnixAddr::from_abstract_name(name.as_bytes())?;
    UnixDatagram::bind_addr(&sa).map(Announcement)
}

/// The device address announced for a listener on `addr`, if any, from the lines of
/// `/proc/net/unix` (abstract names are shown with a leading `@`).
pub(crate) fn find_in(unix_table: &str, ps: u16, addr: SocketAddr) -> Option<IpAddr> {
    let want = format!("@{}", key(ps, addr));
    unix_table
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter_map(|name| name.strip_prefix(&want))
        .find_map(|real| real.parse().ok())
}

/// The device address announced for a listener on `addr`, if any.
pub(crate) fn find(ps: u16, addr: SocketAddr) -> Option<IpAddr> {
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    find_in(&table, ps, addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_is_found_until_dropped() {
        // A port nobody else announces (per process).
        let port = 20000 + (std::process::id() % 20000) as u16;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let real: IpAddr = "127.0.0.7".parse().expect("ip");
        assert_eq!(find(262, addr), None);
        let a = announce(262, addr, real).expect("announce");
        assert_eq!(find(262, addr), Some(real));
        assert_eq!(find(263, addr), None, "another port space");
        drop(a);
        assert_eq!(find(262, addr), None);
    }

    #[test]
    fn names_are_parsed_from_the_unix_table() {
        let table = "Num RefCount Protocol Flags Type St Inode Path\n\
            0000: 00000002 00000000 00000000 0002 01 1 @uroce-rdma-cm/262/127.0.0.1/7471/127.0.0.2\n\
            0000: 00000002 00000000 00000000 0002 01 2 /run/other.sock\n";
        let addr: SocketAddr = "127.0.0.1:7471".parse().expect("addr");
        assert_eq!(find_in(table, 262, addr), "127.0.0.2".parse().ok());
        let other: SocketAddr = "127.0.0.1:747".parse().expect("addr");
        assert_eq!(find_in(table, 262, other), None);
    }
}
