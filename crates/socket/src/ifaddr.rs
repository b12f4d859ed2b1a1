//! Which network interface (netdev) owns a local address: the interface a uroce device
//! bound to that address presents as its net device (`ndev_ifindex` of a GID entry,
//! `/sys/class/infiniband/<dev>/device/net/<ifname>` in `uroce run`), and its MTU, from
//! which the device's port MTU derives as rxe's derives from its netdev's.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A network interface: its name and kernel interface index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Netdev {
    /// Interface name (`lo`, `eth0`, …).
    pub name: String,
    /// Kernel interface index (`if_nametoindex`).
    pub ifindex: u32,
}

/// The interface that owns `addr`: the one that has it as an address; else the one whose
/// subnet contains it (the loopback interface for every 127.0.0.0/8 address, which the
/// kernel routes locally without listing each); else, for a loopback address, `lo`.
/// `None` when the interface list cannot be read or no interface matches.
pub fn netdev_of(addr: IpAddr) -> Option<Netdev> {
    let list = interfaces();
    let exact = list.iter().find(|(_, a, _)| *a == addr);
    let subnet = || {
        list.iter()
            .filter(|(_, a, m)| same_subnet(*a, addr, *m))
            .max_by_key(|(_, _, m)| prefix_len(*m))
    };
    if let Some((name, _, _)) = exact.or_else(subnet) {
        return by_name(name);
    }
    if addr.is_loopback() {
        return by_name("lo");
    }
    None
}

/// A [`Netdev`] for an interface name, if the kernel knows it.
pub fn by_name(name: &str) -> Option<Netdev> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (ifindex != 0).then(|| Netdev {
        name: name.to_owned(),
        ifindex,
    })
}

/// The MTU of the interface that owns `addr` ([`netdev_of`]): 65536 for a loopback
/// address on Linux's default `lo`. `None` when no interface owns it or the kernel does
/// not say.
pub fn link_mtu(addr: IpAddr) -> Option<u32> {
    mtu(&netdev_of(addr)?.name)
}

/// The MTU of the interface `name` (`SIOCGIFMTU`), if the kernel knows the interface.
pub fn mtu(name: &str) -> Option<u32> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return None;
    }
    // SAFETY: FFI call with constant arguments; the result is checked.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` is a descriptor just opened and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `ifreq` is plain data (a name array and a union of integers and
    // sockaddrs), for which all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the NUL-terminated `ifr_name` (the name is shorter than
    // IFNAMSIZ, the rest zero) and writes `ifr_ifru.ifru_mtu` of `req`, which lives for
    // the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    if rc != 0 {
        return None;
    }
    // SAFETY: on success the kernel wrote the union's MTU member (an int).
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).ok().filter(|&m| m > 0)
}

fn prefix_len(mask: IpAddr) -> u32 {
    match mask {
        IpAddr::V4(m) => u32::from(m).count_ones(),
        IpAddr::V6(m) => u128::from(m).count_ones(),
    }
}

fn same_subnet(a: IpAddr, b: IpAddr, mask: IpAddr) -> bool {
    match (a, b, mask) {
        (IpAddr::V4(a), IpAddr::V4(b), IpAddr::V4(m)) => {
            let m = u32::from(m);
            m != 0 && u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b), IpAddr::V6(m)) => {
            let m = u128::from(m);
            m != 0 && u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

/// Every (interface name, address, netmask) of `getifaddrs(3)`, IPv4 and IPv6.
fn interfaces() -> Vec<(String, IpAddr, IpAddr)> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    // Bounded: the kernel's list is finite and NULL-terminated; the cap guards a corrupt one.
    for _ in 0..4096 {
        if cur.is_null() {
            break;
        }
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        // SAFETY: the address and netmask pointers are NULL or point at a sockaddr of the
        // family in `sa_family`; `ifa_name` is a NUL-terminated string.
        unsafe {
            if let (Some(a), Some(m)) = (sockaddr_ip(ifa.ifa_addr), sockaddr_ip(ifa.ifa_netmask)) {
                let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
                out.push((name, a, m));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The IP address of a `sockaddr_in` / `sockaddr_in6`.
///
/// # Safety
/// `sa` is NULL or points at a sockaddr whose size matches its `sa_family`.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-NULL, and the family tells which struct it is (caller contract).
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                Some(IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_belong_to_lo() {
        let lo = by_name("lo").expect("the loopback interface exists");
        assert!(lo.ifindex > 0);
        for a in ["127.0.0.1", "127.0.31.7", "::1"] {
            let a: IpAddr = a.parse().expect("address");
            assert_eq!(netdev_of(a), Some(lo.clone()), "{a}");
        }
    }

    #[test]
    fn the_loopback_interface_has_an_mtu() {
        let lo = mtu("lo").expect("lo has an MTU");
        assert!(lo >= 1280, "{lo}");
        assert_eq!(link_mtu("127.0.31.7".parse().expect("address")), Some(lo));
        assert_eq!(mtu("no-such-if0"), None);
        assert_eq!(mtu(""), None);
        assert_eq!(mtu("a-name-far-too-long-for-ifnamsiz"), None);
    }

    #[test]
    fn subnets_compare_under_the_mask() {
        let m: IpAddr = "255.0.0.0".parse().expect("mask");
        let a: IpAddr = "127.0.0.1".parse().expect("a");
        assert!(same_subnet(a, "127.9.9.9".parse().expect("b"), m));
        assert!(!same_subnet(a, "10.0.0.1".parse().expect("c"), m));
        assert!(!same_subnet(a, "::1".parse().expect("d"), m));
        assert_eq!(prefix_len(m), 8);
    }

    #[test]
    fn unknown_interfaces_have_no_index() {
        assert_eq!(by_name("no-such-if0"), None);
        assert_eq!(by_name("bad\0name"), None);
    }
}
