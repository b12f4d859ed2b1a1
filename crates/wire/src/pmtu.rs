//! Path MTU: the largest payload of one packet (headers not counted).

use core::fmt;

/// The IB MTU enumeration (`IBV_MTU_*`): 256, 512, 1024, 2048 or 4096 payload bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Pmtu {
    /// 256 bytes (enum value 1).
    Mtu256 = 1,
    /// 512 bytes (enum value 2).
    Mtu512 = 2,
    /// 1024 bytes (enum value 3).
    Mtu1024 = 3,
    /// 2048 bytes (enum value 4).
    Mtu2048 = 4,
    /// 4096 bytes (enum value 5).
    Mtu4096 = 5,
}

impl Pmtu {
    /// All MTUs, smallest first.
    pub const ALL: [Pmtu; 5] = [
        Pmtu::Mtu256,
        Pmtu::Mtu512,
        Pmtu::Mtu1024,
        Pmtu::Mtu2048,
        Pmtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    #[inline]
    pub const fn bytes(self) -> u32 {
        128 << (self as u8)
    }

    /// The verbs enum value (1..=5).
    #[inline]
    pub const fn enum_value(self) -> u8 {
        self as u8
    }

    /// From the verbs enum value 1..=5; `None` otherwise.
    pub const fn from_enum(value: u8) -> Option<Pmtu> {
        match value {
            1 => Some(Pmtu::Mtu256),
            2 => Some(Pmtu::Mtu512),
            3 => Some(Pmtu::Mtu1024),
            4 => Some(Pmtu::Mtu2048),
            5 => Some(Pmtu::Mtu4096),
            _ => None,
        }
    }

    /// From an exact byte count (256, 512, 1024, 2048, 4096); `None` otherwise.
    pub const fn from_bytes(bytes: u32) -> Option<Pmtu> {
        match bytes {
            256 => Some(Pmtu::Mtu256),
            512 => Some(Pmtu::Mtu512),
            1024 => Some(Pmtu::Mtu1024),
            2048 => Some(Pmtu::Mtu2048),
            4096 => Some(Pmtu::Mtu4096),
            _ => None,
        }
    }

    /// The largest MTU whose packets fit a link of `link_mtu` bytes, leaving `overhead`
    /// bytes for IP/UDP/transport headers and ICRC; `None` if not even 256 fits.
    pub fn largest_fitting(link_mtu: u32, overhead: u32) -> Option<Pmtu> {
        let room = link_mtu.checked_sub(overhead)?;
        Pmtu::ALL.iter().rev().copied().find(|m| m.bytes() <= room)
    }

    /// Number of packets a message of `len` bytes needs: `ceil(len / mtu)`, at least 1
    /// (a zero-length message is one packet). This is also the number of PSNs an RDMA
    /// READ request of `len` bytes consumes.
    #[inline]
    pub const fn packets_for(self, len: u64) -> u64 {
        let m = self.bytes() as u64;
        if len == 0 {
            1
        } else {
            len.div_ceil(m)
        }
    }
}

impl fmt::Display for Pmtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

#[cfg(test)]
#[path = "tests/pmtu.rs"]
mod tests;
