//! Errors of the wire layer.
//!
//! Every parse or emit failure is a [`WireError`] that names what was wrong and where
//! (the header, the field, the byte offset, the value seen and the value expected), so a
//! dropped packet can be explained from a log line alone.

use core::fmt;

/// Which header (or part of a datagram) an error refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderKind {
    /// Base Transport Header (12 bytes).
    Bth,
    /// RDMA Extended Transport Header (16 bytes).
    Reth,
    /// ACK Extended Transport Header (4 bytes).
    Aeth,
    /// Atomic Extended Transport Header (28 bytes).
    AtomicEth,
    /// Atomic ACK Extended Transport Header (8 bytes).
    AtomicAckEth,
    /// Immediate data (4 bytes).
    ImmDt,
    /// Invalidate Extended Transport Header (4 bytes).
    Ieth,
    /// FLUSH Extended Transport Header (4 bytes, IBA 1.5).
    Feth,
    /// Datagram Extended Transport Header (8 bytes).
    Deth,
    /// XRC Extended Transport Header (4 bytes).
    XrcEth,
    /// Management datagram common header (24 bytes).
    Mad,
    /// A communication-management message after the MAD header (232 bytes).
    Cm,
    /// The RDMA-CM IP header at the start of REQ / SIDR_REQ private data (36 bytes).
    CmaHeader,
    /// The packet payload (and its pad bytes).
    Payload,
    /// The invariant CRC trailer (4 bytes).
    Icrc,
    /// Ethernet II header.
    Ethernet,
    /// IPv4 header.
    Ipv4,
    /// IPv6 header.
    Ipv6,
    /// UDP header.
    Udp,
    /// pcap file framing.
    Pcap,
}

impl fmt::Display for HeaderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            HeaderKind::Bth => "BTH",
            HeaderKind::Reth => "RETH",
            HeaderKind::Aeth => "AETH",
            HeaderKind::AtomicEth => "AtomicETH",
            HeaderKind::AtomicAckEth => "AtomicAckETH",
            HeaderKind::ImmDt => "ImmDt",
            HeaderKind::Ieth => "IETH",
            HeaderKind::Feth => "FETH",
            HeaderKind::Deth => "DETH",
            HeaderKind::XrcEth => "XRCETH",
            HeaderKind::Mad => "MAD",
            HeaderKind::Cm => "CM message",
            HeaderKind::CmaHeader => "RDMA-CM header",
            HeaderKind::Payload => "payload",
            HeaderKind::Icrc => "ICRC",
            HeaderKind::Ethernet => "Ethernet",
            HeaderKind::Ipv4 => "IPv4",
            HeaderKind::Ipv6 => "IPv6",
            HeaderKind::Udp => "UDP",
            HeaderKind::Pcap => "pcap",
        };
        f.write_str(name)
    }
}

/// Why a packet could not be parsed or emitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends inside `header`, which starts at byte `offset` and needs `needed`
    /// bytes of which only `available` are there.
    #[error("truncated {header} at byte {offset}: need {needed}, have {available}")]
    Truncated {
        /// The header that does not fit.
        header: HeaderKind,
        /// Byte offset of the header within the parsed buffer.
        offset: usize,
        /// Bytes the header needs.
        needed: usize,
        /// Bytes left in the buffer from `offset` on.
        available: usize,
    },
    /// The BTH transport header version (TVer) is not 0.
    #[error("BTH transport header version {0} is not 0")]
    BadTver(u8),
    /// The BTH opcode is not in the opcode table.
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// BTH PadCnt says there are more pad bytes than bytes between headers and ICRC.
    #[error("pad count {pad} exceeds the {payload} bytes after the headers")]
    PadBeyondPayload {
        /// The PadCnt field.
        pad: u8,
        /// Bytes between the last header and the ICRC.
        payload: usize,
    },
    /// The ICRC on the wire is not the one computed over the packet.
    #[error("ICRC mismatch: computed {computed:#010x}, on wire {on_wire:#010x}")]
    IcrcMismatch {
        /// The ICRC computed over the packet.
        computed: u32,
        /// The ICRC found in the packet.
        on_wire: u32,
    },
    /// A field holds a value that is reserved or out of range.
    #[error("invalid {header} field {field}: {value:#x}")]
    InvalidField {
        /// The header holding the field.
        header: HeaderKind,
        /// The field name.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
    /// A representation has a header its opcode forbids (`present` = true) or lacks one
    /// its opcode needs (`present` = false).
    #[error("opcode {opcode:#04x}: {header} {}", if *present { "present but not allowed" } else { "required but missing" })]
    HeaderMismatch {
        /// The BTH opcode.
        opcode: u8,
        /// The header in question.
        header: HeaderKind,
        /// Whether the representation has that header.
        present: bool,
    },
    /// The opcode carries no payload but `len` bytes were given.
    #[error("opcode {opcode:#04x} carries no payload, got {len} bytes")]
    PayloadNotAllowed {
        /// The BTH opcode.
        opcode: u8,
        /// Payload length (pad included when parsing).
        len: usize,
    },
    /// The payload is longer than allowed.
    #[error("payload of {len} bytes exceeds the maximum of {max}")]
    PayloadTooLarge {
        /// Payload length.
        len: usize,
        /// Largest allowed payload length.
        max: usize,
    },
    /// The output buffer is too small for the packet being emitted.
    #[error("buffer too small: need {needed} bytes, have {available}")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes in the buffer.
        available: usize,
    },
    /// The IP version is neither 4 nor 6.
    #[error("unsupported IP version {version}")]
    UnsupportedIp {
        /// The IP version nibble.
        version: u8,
    },
    /// The IPv4 header carries options (IHL > 5), which RoCEv2 does not use.
    #[error("IPv4 header with options (IHL {ihl})")]
    IpOptions {
        /// The IHL field.
        ihl: u8,
    },
    /// The IP payload is not UDP.
    #[error("IP protocol {protocol} is not UDP")]
    NotUdp {
        /// The IP protocol / next-header field.
        protocol: u8,
    },
    /// The UDP destination port is not the RoCEv2 port 4791.
    #[error("UDP destination port {dst_port} is not RoCEv2 (4791)")]
    NotRoce {
        /// The UDP destination port.
        dst_port: u16,
    },
    /// A length field or a length disagrees with what the format requires.
    #[error("bad {header} {field}: {value} (expected {expected})")]
    BadLength {
        /// The header concerned.
        header: HeaderKind,
        /// What length was checked.
        field: &'static str,
        /// The length found.
        value: usize,
        /// The length required.
        expected: usize,
    },
    /// A pcap file could not be read or written.
    #[error("pcap: {0}")]
    Pcap(String),
}

/// Checks that `buf` holds at least `needed` bytes for `header`, which starts at
/// `offset` of the enclosing buffer; the error is [`WireError::Truncated`].
pub(crate) fn check_len(
    header: HeaderKind,
    buf: &[u8],
    offset: usize,
    needed: usize,
) -> Result<(), WireError> {
    if buf.len() < needed {
        Err(WireError::Truncated {
            header,
            offset,
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Panic-free fixed-size field access for the header views.
///
/// A view whose length was checked (`new_checked`) reads and writes whole fields. A view
/// made with `new_unchecked` over a buffer that is too short reads the missing field as
/// zero and ignores a write to it instead of panicking; emitting through such a view is a
/// caller bug, but it cannot crash the process. These helpers live here because every
/// header module already depends on this one.
pub(crate) mod field {
    /// Reads `N` bytes at `at`, or zeros if the buffer is too short.
    #[inline]
    pub(crate) fn get<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        if let Some(src) = at.checked_add(N).and_then(|end| buf.get(at..end)) {
            out.copy_from_slice(src);
        }
        out
    }

    /// Writes `N` bytes at `at`; does nothing if the buffer is too short.
    #[inline]
    pub(crate) fn put<const N: usize>(buf: &mut [u8], at: usize, value: [u8; N]) {
        if let Some(dst) = at.checked_add(N).and_then(|end| buf.get_mut(at..end)) {
            dst.copy_from_slice(&value);
        }
    }

    /// Reads one byte, or 0 if the buffer is too short.
    #[inline]
    pub(crate) fn u8_at(buf: &[u8], at: usize) -> u8 {
        buf.get(at).copied().unwrap_or(0)
    }

    /// Writes one byte; does nothing if the buffer is too short.
    #[inline]
    pub(crate) fn set_u8(buf: &mut [u8], at: usize, value: u8) {
        if let Some(b) = buf.get_mut(at) {
            *b = value;
        }
    }

    /// Big-endian u16 at `at`.
    #[inline]
    pub(crate) fn u16_at(buf: &[u8], at: usize) -> u16 {
        u16::from_be_bytes(get(buf, at))
    }

    /// Big-endian u32 at `at`.
    #[inline]
    pub(crate) fn u32_at(buf: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(get(buf, at))
    }

    /// Big-endian u64 at `at`.
    #[inline]
    pub(crate) fn u64_at(buf: &[u8], at: usize) -> u64 {
        u64::from_be_bytes(get(buf, at))
    }

    /// Big-endian 24-bit value in the three bytes at `at`.
    #[inline]
    pub(crate) fn u24_at(buf: &[u8], at: usize) -> u32 {
        let [a, b, c] = get::<3>(buf, at);
        u32::from_be_bytes([0, a, b, c])
    }

    /// Writes a big-endian u16.
    #[inline]
    pub(crate) fn set_u16(buf: &mut [u8], at: usize, value: u16) {
        put(buf, at, value.to_be_bytes());
    }

    /// Writes a big-endian u32.
    #[inline]
    pub(crate) fn set_u32(buf: &mut [u8], at: usize, value: u32) {
        put(buf, at, value.to_be_bytes());
    }

    /// Writes a big-endian u64.
    #[inline]
    pub(crate) fn set_u64(buf: &mut [u8], at: usize, value: u64) {
        put(buf, at, value.to_be_bytes());
    }

    /// Writes the low 24 bits of `value` big-endian into the three bytes at `at`.
    #[inline]
    pub(crate) fn set_u24(buf: &mut [u8], at: usize, value: u32) {
        let [_, a, b, c] = value.to_be_bytes();
        put(buf, at, [a, b, c]);
    }
}

#[cfg(test)]
#[path = "tests/error.rs"]
mod tests;
