//! Packet capture files: writing RoCEv2 frames for a dissector to read (classic pcap),
//! and reading captures back (classic pcap and pcapng).
//!
//! * [`PcapWriter`] writes classic little-endian, microsecond-resolution pcap files with
//!   link type Ethernet (1). [`PcapWriter::write_roce`] frames a RoCEv2 packet in
//!   Ethernet + IP + UDP (headers from [`crate::ip`], made-up MAC addresses from
//!   [`mac_for`]) and seals its ICRC for exactly that IP header.
//! * [`PcapReader`] reads classic pcap (either byte order, microsecond or nanosecond
//!   timestamps) and pcapng (what capture tools and `editcap` write), and iterates
//!   `(timestamp, frame)`. [`PcapReader::datagram`] splits a frame according to its link
//!   type: Ethernet (1), raw IP (101, also 228/229), Linux "cooked" SLL (113) and SLL2
//!   (276), so that loopback captures (`-i lo` gives Ethernet, `-i any` gives SLL/SLL2)
//!   can be read as well.
//!
//! Classic pcap is 24 bytes of file header, then per packet a 16-byte record header
//! (seconds, sub-second units, captured length, original length) and the captured bytes.
//! pcapng is a sequence of typed, length-framed blocks. Both are handled here directly
//! rather than through a pcap crate so that errors carry exact byte offsets, records of
//! snap-length-truncated captures (original length above the snap length) are accepted,
//! pcapng timestamps honour `if_tsresol`, and nothing is buffered beyond one record.

use std::io::{Read, Write};
use std::time::Duration;

use crate::error::{HeaderKind, WireError};
use crate::ip::{self, Datagram, Endpoints, IpFields, ETHERNET_HEADER_LEN};

/// Link type of Ethernet II frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Link type of raw IP packets (version from the first nibble).
pub const LINKTYPE_RAW: u32 = 101;
/// Link type of Linux "cooked" captures, version 1 (16-byte header).
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// Link type of raw IPv4 packets.
pub const LINKTYPE_IPV4: u32 = 228;
/// Link type of raw IPv6 packets.
pub const LINKTYPE_IPV6: u32 = 229;
/// Link type of Linux "cooked" captures, version 2 (20-byte header).
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

/// Snap length written into new files (the usual libpcap default).
pub const SNAPLEN: u32 = 262_144;
/// Largest record this reader accepts, whatever the file header says; protects against
/// allocating gigabytes for a corrupt length field.
pub const MAX_RECORD_LEN: u32 = 16 * 1024 * 1024;

const FILE_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 16;
const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
const SLL_HEADER_LEN: usize = 16;
const SLL2_HEADER_LEN: usize = 20;

/// The link layers [`PcapReader::datagram`] understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// Ethernet II, optionally VLAN-tagged (link type 1).
    Ethernet,
    /// Bare IP packets, version from the first nibble (101, 228, 229).
    RawIp,
    /// Linux cooked capture v1 (113).
    LinuxSll,
    /// Linux cooked capture v2 (276).
    LinuxSll2,
}

impl LinkType {
    /// The link type for a pcap `network` field value, if supported.
    pub const fn from_linktype(value: u32) -> Option<LinkType> {
        match value {
            LINKTYPE_ETHERNET => Some(LinkType::Ethernet),
            LINKTYPE_RAW | LINKTYPE_IPV4 | LINKTYPE_IPV6 => Some(LinkType::RawIp),
            LINKTYPE_LINUX_SLL => Some(LinkType::LinuxSll),
            LINKTYPE_LINUX_SLL2 => Some(LinkType::LinuxSll2),
            _ => None,
        }
    }

    /// Splits one captured frame of this link type into its IP/UDP parts.
    ///
    /// # Errors
    /// [`WireError::Truncated`] for a short link header, [`WireError::InvalidField`] for a
    /// protocol other than IPv4/IPv6; then as [`Datagram::parse_ip`].
    pub fn datagram(self, frame: &[u8]) -> Result<Datagram<'_>, WireError> {
        match self {
            LinkType::Ethernet => Datagram::parse_ethernet(frame),
            LinkType::RawIp => Datagram::parse_ip(frame),
            LinkType::LinuxSll => cooked(frame, SLL_HEADER_LEN, SLL_HEADER_LEN - 2),
            LinkType::LinuxSll2 => cooked(frame, SLL2_HEADER_LEN, 0),
        }
    }
}

/// A Linux cooked header of `len` bytes whose protocol (EtherType) is at `proto_at`.
fn cooked(frame: &[u8], len: usize, proto_at: usize) -> Result<Datagram<'_>, WireError> {
    let truncated = WireError::Truncated {
        header: HeaderKind::Ethernet,
        offset: 0,
        needed: len,
        available: frame.len(),
    };
    let Some((header, packet)) = frame.split_at_checked(len) else {
        return Err(truncated);
    };
    let proto = match header.get(proto_at..proto_at + 2) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        // invariant: `proto_at + 2 <= len` for both cooked formats.
        _ => return Err(truncated),
    };
    let family = match proto {
        ip::ETHERTYPE_IPV4 => 4,
        ip::ETHERTYPE_IPV6 => 6,
        other => {
            return Err(WireError::InvalidField {
                header: HeaderKind::Ethernet,
                field: "cooked-capture protocol",
                value: u64::from(other),
            })
        }
    };
    Datagram::parse_ip_family(packet, len, family)
}

/// The made-up MAC address [`PcapWriter::write_roce`] gives an IP address: locally
/// administered unicast (`02:…`), followed by the IPv4 address (`02:00:a:b:c:d`) or the
/// last five bytes of the IPv6 address.
pub fn mac_for(addr: core::net::IpAddr) -> [u8; 6] {
    let mut mac = [0x02, 0, 0, 0, 0, 0];
    match addr {
        core::net::IpAddr::V4(a) => mac[2..].copy_from_slice(&a.octets()),
        core::net::IpAddr::V6(a) => mac[1..].copy_from_slice(&a.octets()[11..]),
    }
    mac
}

/// Writes a classic pcap file (link type Ethernet, microsecond timestamps).
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    frame: Vec<u8>,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the file header to `out`.
    ///
    /// # Errors
    /// [`WireError::Pcap`] if writing fails.
    pub fn new(mut out: W) -> Result<PcapWriter<W>, WireError> {
        let mut h = [0u8; FILE_HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC_MICROS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes()); // version 2.4
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0.
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)
            .map_err(|e| io_error("writing the file header", &e))?;
        Ok(PcapWriter {
            out,
            frame: Vec::new(),
        })
    }

    /// Appends one frame captured at `ts` (time since the Unix epoch; sub-microsecond
    /// parts are dropped).
    ///
    /// # Errors
    /// [`WireError::Pcap`] if the frame exceeds [`SNAPLEN`], the timestamp does not fit
    /// 32-bit seconds, or writing fails.
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> Result<(), WireError> {
        write_record(&mut self.out, ts, frame)
    }

    /// Frames a RoCEv2 packet in Ethernet + IP + UDP (Linux unconnected-socket IP fields,
    /// see [`crate::ip`]), computes its ICRC for that IP header, and appends it.
    ///
    /// `roce` is the UDP payload: BTH..pad followed by 4 ICRC bytes, whose value is
    /// ignored (the written frame carries the freshly computed ICRC). Returns that ICRC.
    ///
    /// # Errors
    /// As [`ip::build_datagram`] and [`PcapWriter::write_frame`].
    pub fn write_roce(
        &mut self,
        ts: Duration,
        ep: &Endpoints,
        roce: &[u8],
    ) -> Result<u32, WireError> {
        self.write_roce_with(ts, ep, &IpFields::LINUX_UDP_SOCKET, roce)
    }

    /// [`PcapWriter::write_roce`] with explicit IP header fields.
    ///
    /// # Errors
    /// As [`PcapWriter::write_roce`].
    pub fn write_roce_with(
        &mut self,
        ts: Duration,
        ep: &Endpoints,
        fields: &IpFields,
        roce: &[u8],
    ) -> Result<u32, WireError> {
        let ethertype = if ep.dst.is_ipv4() {
            ip::ETHERTYPE_IPV4
        } else {
            ip::ETHERTYPE_IPV6
        };
        let len = ETHERNET_HEADER_LEN + ep.headers_len()? + roce.len();
        self.frame.clear();
        self.frame.resize(len, 0);
        let (eth, datagram) = self.frame.split_at_mut(ETHERNET_HEADER_LEN);
        eth[0..6].copy_from_slice(&mac_for(ep.dst));
        eth[6..12].copy_from_slice(&mac_for(ep.src));
        eth[12..14].copy_from_slice(&ethertype.to_be_bytes());
        let (_, crc) = ip::build_datagram(ep, fields, roce, datagram)?;
        write_record(&mut self.out, ts, &self.frame)?;
        Ok(crc)
    }

    /// Flushes the underlying writer.
    ///
    /// # Errors
    /// [`WireError::Pcap`] if flushing fails.
    pub fn flush(&mut self) -> Result<(), WireError> {
        self.out.flush().map_err(|e| io_error("flushing", &e))
    }

    /// Flushes and returns the underlying writer.
    ///
    /// # Errors
    /// [`WireError::Pcap`] if flushing fails.
    pub fn into_inner(mut self) -> Result<W, WireError> {
        self.flush()?;
        Ok(self.out)
    }
}

fn write_record<W: Write>(out: &mut W, ts: Duration, frame: &[u8]) -> Result<(), WireError> {
    let len = u32::try_from(frame.len())
        .ok()
        .filter(|&l| l <= SNAPLEN)
        .ok_or_else(|| {
            WireError::Pcap(format!(
                "frame of {} bytes exceeds the snap length {SNAPLEN}",
                frame.len()
            ))
        })?;
    let secs = u32::try_from(ts.as_secs()).map_err(|_| {
        WireError::Pcap(format!("timestamp {}s does not fit 32 bits", ts.as_secs()))
    })?;
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[0..4].copy_from_slice(&secs.to_le_bytes());
    h[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h[12..16].copy_from_slice(&len.to_le_bytes());
    out.write_all(&h)
        .map_err(|e| io_error("writing a record header", &e))?;
    out.write_all(frame)
        .map_err(|e| io_error("writing a frame", &e))
}

fn io_error(what: &str, e: &std::io::Error) -> WireError {
    WireError::Pcap(format!("{what}: {e}"))
}

/// Reads a classic pcap or a pcapng file; iterate it for `(timestamp, frame)` pairs.
///
/// pcapng support covers what capture tools write: section header, interface description
/// (link type, `if_tsresol`), enhanced / simple / obsolete packet blocks; other blocks are
/// skipped. Iteration stops after the first error (a truncated record, an I/O error, an
/// absurd length): the stream cannot be resynchronised.
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    input: R,
    format: Format,
    /// Link type of the frame returned last (before the first: of the first interface).
    linktype: u32,
    snaplen: u32,
    /// Byte offset of the next record or block in the file.
    offset: u64,
    done: bool,
}

#[derive(Debug)]
enum Format {
    Classic {
        big_endian: bool,
        nanos: bool,
    },
    Ng {
        big_endian: bool,
        interfaces: Vec<Interface>,
    },
}

/// One pcapng interface description.
#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: u32,
    snaplen: u32,
    /// Timestamp units: `Decimal(k)` = 10^-k s, `Binary(k)` = 2^-k s.
    resolution: Resolution,
}

#[derive(Debug, Clone, Copy)]
enum Resolution {
    Decimal(u8),
    Binary(u8),
}

const PCAPNG_SHB: u32 = 0x0a0d_0d0a;
const PCAPNG_BYTE_ORDER: u32 = 0x1a2b_3c4d;
const PCAPNG_IDB: u32 = 1;
const PCAPNG_OPB: u32 = 2;
const PCAPNG_SPB: u32 = 3;
const PCAPNG_EPB: u32 = 6;
/// `if_tsresol` option code of an interface description block.
const PCAPNG_IF_TSRESOL: u16 = 9;
/// At most this many non-packet pcapng blocks in a row (bounds the skipping loop).
const MAX_SKIPPED_BLOCKS: usize = 1 << 20;

fn word32(b: &[u8], at: usize, big_endian: bool) -> u32 {
    let w = crate::error::field::get::<4>(b, at);
    if big_endian {
        u32::from_be_bytes(w)
    } else {
        u32::from_le_bytes(w)
    }
}

fn word16(b: &[u8], at: usize, big_endian: bool) -> u16 {
    let w = crate::error::field::get::<2>(b, at);
    if big_endian {
        u16::from_be_bytes(w)
    } else {
        u16::from_le_bytes(w)
    }
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the file header (classic pcap: the 24-byte header; pcapng: the
    /// section header block and the blocks up to the first interface description).
    ///
    /// # Errors
    /// [`WireError::Truncated`] (header [`HeaderKind::Pcap`]) for a file that ends inside
    /// its header; [`WireError::Pcap`] for an unknown magic number or an I/O error.
    pub fn new(mut input: R) -> Result<PcapReader<R>, WireError> {
        let mut magic = [0u8; 4];
        let got = read_full(&mut input, &mut magic)?;
        if got < magic.len() {
            return Err(WireError::Truncated {
                header: HeaderKind::Pcap,
                offset: 0,
                needed: FILE_HEADER_LEN,
                available: got,
            });
        }
        if u32::from_le_bytes(magic) == PCAPNG_SHB {
            return PcapReader::new_ng(input);
        }
        let mut h = [0u8; FILE_HEADER_LEN];
        h[..4].copy_from_slice(&magic);
        let got = read_full(&mut input, &mut h[4..])? + 4;
        if got < FILE_HEADER_LEN {
            return Err(WireError::Truncated {
                header: HeaderKind::Pcap,
                offset: 0,
                needed: FILE_HEADER_LEN,
                available: got,
            });
        }
        let (big_endian, nanos) = match (u32::from_le_bytes(magic), u32::from_be_bytes(magic)) {
            (MAGIC_MICROS, _) => (false, false),
            (MAGIC_NANOS, _) => (false, true),
            (_, MAGIC_MICROS) => (true, false),
            (_, MAGIC_NANOS) => (true, true),
            (le, _) => {
                return Err(WireError::Pcap(format!(
                    "not a pcap or pcapng file (magic {le:#010x})"
                )))
            }
        };
        Ok(PcapReader {
            input,
            format: Format::Classic { big_endian, nanos },
            snaplen: word32(&h, 16, big_endian),
            linktype: word32(&h, 20, big_endian),
            offset: FILE_HEADER_LEN as u64,
            done: false,
        })
    }

    fn new_ng(input: R) -> Result<PcapReader<R>, WireError> {
        // `big_endian` is set by the section header parsed below.
        let mut reader = PcapReader {
            input,
            format: Format::Ng {
                big_endian: false,
                interfaces: Vec::new(),
            },
            linktype: 0,
            snaplen: 0,
            offset: 0,
            done: false,
        };
        // The block type (the magic) was consumed; read the rest of the first 12 bytes.
        let mut head = [0u8; 12];
        head[..4].copy_from_slice(&PCAPNG_SHB.to_le_bytes());
        let got = read_full(&mut reader.input, &mut head[4..])?;
        if got < 8 {
            return Err(WireError::Truncated {
                header: HeaderKind::Pcap,
                offset: 0,
                needed: 12,
                available: 4 + got,
            });
        }
        reader.offset = 12;
        reader.parse_ng_block(head, 0)?;
        // Read ahead to the first interface description so that `link_type` is known;
        // a packet block before it is an error, the end of the file is not.
        for _ in 0..MAX_SKIPPED_BLOCKS {
            if let Format::Ng { interfaces, .. } = &reader.format {
                if let Some(first) = interfaces.first() {
                    reader.linktype = first.linktype;
                    reader.snaplen = first.snaplen;
                    return Ok(reader);
                }
            }
            match reader.read_ng_block()? {
                NgBlock::End => return Ok(reader),
                NgBlock::Packet(..) => {
                    return Err(WireError::Pcap(
                        "pcapng packet block before any interface description".into(),
                    ))
                }
                NgBlock::Other => {}
            }
        }
        Err(WireError::Pcap(
            "pcapng: no interface description found".into(),
        ))
    }

    /// The link type of the frame returned last (classic pcap: the file's `network`
    /// field; pcapng: that frame's interface, before the first frame the first
    /// interface's).
    pub fn linktype(&self) -> u32 {
        self.linktype
    }

    /// [`PcapReader::linktype`] if it is one [`PcapReader::datagram`] understands.
    pub fn link_type(&self) -> Option<LinkType> {
        LinkType::from_linktype(self.linktype)
    }

    /// The snap length (pcapng: of the interface of the frame returned last).
    pub fn snaplen(&self) -> u32 {
        self.snaplen
    }

    /// Splits a frame just read from this file according to its link type.
    ///
    /// # Errors
    /// [`WireError::Pcap`] for an unsupported link type; otherwise as
    /// [`LinkType::datagram`].
    pub fn datagram<'f>(&self, frame: &'f [u8]) -> Result<Datagram<'f>, WireError> {
        self.link_type()
            .ok_or_else(|| WireError::Pcap(format!("unsupported link type {}", self.linktype)))?
            .datagram(frame)
    }

    fn offset(&self) -> usize {
        usize::try_from(self.offset).unwrap_or(usize::MAX)
    }

    /// Reads exactly `len` bytes, or reports a truncated `what` starting at `start`.
    fn read_exact_at(&mut self, len: usize, start: usize) -> Result<Vec<u8>, WireError> {
        let mut buf = Vec::new();
        let got = (&mut self.input)
            .take(len as u64)
            .read_to_end(&mut buf)
            .map_err(|e| io_error("reading", &e))?;
        if got < len {
            return Err(WireError::Truncated {
                header: HeaderKind::Pcap,
                offset: start,
                needed: len,
                available: got,
            });
        }
        self.offset += got as u64;
        Ok(buf)
    }

    fn next_frame(&mut self) -> Option<Result<(Duration, Vec<u8>), WireError>> {
        match self.format {
            Format::Classic { big_endian, nanos } => self.read_record(big_endian, nanos),
            Format::Ng { .. } => {
                for _ in 0..MAX_SKIPPED_BLOCKS {
                    match self.read_ng_block() {
                        Ok(NgBlock::End) => return None,
                        Ok(NgBlock::Packet(ts, frame)) => return Some(Ok((ts, frame))),
                        Ok(NgBlock::Other) => {}
                        Err(e) => return Some(Err(e)),
                    }
                }
                Some(Err(WireError::Pcap(format!(
                    "more than {MAX_SKIPPED_BLOCKS} pcapng blocks without a packet"
                ))))
            }
        }
    }

    fn read_record(
        &mut self,
        big_endian: bool,
        nanos: bool,
    ) -> Option<Result<(Duration, Vec<u8>), WireError>> {
        let offset = self.offset();
        let mut h = [0u8; RECORD_HEADER_LEN];
        let got = match read_full(&mut self.input, &mut h) {
            Ok(got) => got,
            Err(e) => return Some(Err(e)),
        };
        if got == 0 {
            return None; // clean end of file
        }
        if got < RECORD_HEADER_LEN {
            return Some(Err(WireError::Truncated {
                header: HeaderKind::Pcap,
                offset,
                needed: RECORD_HEADER_LEN,
                available: got,
            }));
        }
        self.offset += RECORD_HEADER_LEN as u64;
        let (secs, frac, incl_len) = (
            word32(&h, 0, big_endian),
            word32(&h, 4, big_endian),
            word32(&h, 8, big_endian),
        );
        let sub_nanos = if nanos {
            frac
        } else {
            frac.saturating_mul(1000)
        };
        if sub_nanos >= 1_000_000_000 {
            return Some(Err(WireError::Pcap(format!(
                "record at byte {offset}: sub-second timestamp {frac} out of range"
            ))));
        }
        if incl_len > MAX_RECORD_LEN {
            return Some(Err(WireError::Pcap(format!(
                "record at byte {offset}: captured length {incl_len} exceeds {MAX_RECORD_LEN}"
            ))));
        }
        let frame = match self.read_exact_at(incl_len as usize, offset + RECORD_HEADER_LEN) {
            Ok(frame) => frame,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok((Duration::new(u64::from(secs), sub_nanos), frame)))
    }

    /// Checks a block's total length and reads the rest of the block after the first
    /// `consumed` bytes (at least 12), returning everything between them and the trailing
    /// copy of the length.
    fn block_rest(
        &mut self,
        total: u32,
        consumed: usize,
        start: usize,
    ) -> Result<Vec<u8>, WireError> {
        if total % 4 != 0 || (total as usize) < consumed + 4 || total > MAX_RECORD_LEN + 64 {
            return Err(WireError::Pcap(format!(
                "pcapng block at byte {start}: bad total length {total}"
            )));
        }
        let mut rest = self.read_exact_at(total as usize - consumed, start + consumed)?;
        rest.truncate(rest.len() - 4);
        Ok(rest)
    }

    /// Reads the next pcapng block. Every block is at least 12 bytes: type, total length,
    /// (body), total length; a section header's body starts with the byte-order magic,
    /// which sets the byte order of its section.
    fn read_ng_block(&mut self) -> Result<NgBlock, WireError> {
        let start = self.offset();
        let mut head = [0u8; 12];
        let got = read_full(&mut self.input, &mut head)?;
        if got == 0 {
            return Ok(NgBlock::End);
        }
        if got < head.len() {
            return Err(WireError::Truncated {
                header: HeaderKind::Pcap,
                offset: start,
                needed: head.len(),
                available: got,
            });
        }
        self.offset += head.len() as u64;
        self.parse_ng_block(head, start)
    }

    fn parse_ng_block(&mut self, head: [u8; 12], start: usize) -> Result<NgBlock, WireError> {
        if u32::from_le_bytes([head[0], head[1], head[2], head[3]]) == PCAPNG_SHB {
            let bom = [head[8], head[9], head[10], head[11]];
            let big_endian = match (u32::from_le_bytes(bom), u32::from_be_bytes(bom)) {
                (PCAPNG_BYTE_ORDER, _) => false,
                (_, PCAPNG_BYTE_ORDER) => true,
                _ => {
                    return Err(WireError::Pcap(format!(
                        "pcapng section header at byte {start}: bad byte-order magic"
                    )))
                }
            };
            // Version and section length: nothing to check for reading.
            self.block_rest(word32(&head, 4, big_endian), head.len(), start)?;
            self.format = Format::Ng {
                big_endian,
                interfaces: Vec::new(),
            };
            return Ok(NgBlock::Other);
        }
        let Format::Ng { big_endian, .. } = self.format else {
            return Err(WireError::Pcap("not a pcapng file".into()));
        };
        let block_type = word32(&head, 0, big_endian);
        let mut body = head[8..].to_vec();
        body.extend(self.block_rest(word32(&head, 4, big_endian), head.len(), start)?);
        match block_type {
            PCAPNG_IDB => {
                let interface = Interface {
                    linktype: u32::from(word16(&body, 0, big_endian)),
                    snaplen: word32(&body, 4, big_endian),
                    resolution: idb_resolution(&body, big_endian),
                };
                if let Format::Ng { interfaces, .. } = &mut self.format {
                    if interfaces.len() >= 1 << 16 {
                        return Err(WireError::Pcap("too many pcapng interfaces".into()));
                    }
                    interfaces.push(interface);
                }
                Ok(NgBlock::Other)
            }
            PCAPNG_EPB | PCAPNG_OPB => {
                // EPB: interface (32), ts high, ts low, captured len, original len, data.
                // OPB: interface (16), drops (16), then the same.
                let interface = if block_type == PCAPNG_EPB {
                    word32(&body, 0, big_endian)
                } else {
                    u32::from(word16(&body, 0, big_endian))
                };
                let ts = (u64::from(word32(&body, 4, big_endian)) << 32)
                    | u64::from(word32(&body, 8, big_endian));
                let caplen = word32(&body, 12, big_endian) as usize;
                let frame = body
                    .get(20..20usize.saturating_add(caplen))
                    .ok_or_else(|| {
                        WireError::Pcap(format!(
                            "pcapng packet block at byte {start}: captured length {caplen} \
                             exceeds the block"
                        ))
                    })?
                    .to_vec();
                let iface = self.interface(interface, start)?;
                Ok(NgBlock::Packet(timestamp(ts, iface.resolution)?, frame))
            }
            PCAPNG_SPB => {
                // Original length, then the data (cut to the snap length); no timestamp.
                let orig = word32(&body, 0, big_endian) as usize;
                let iface = self.interface(0, start)?;
                let caplen = orig
                    .min(iface.snaplen as usize)
                    .min(body.len().saturating_sub(4));
                let frame = body.get(4..4 + caplen).unwrap_or_default().to_vec();
                Ok(NgBlock::Packet(Duration::ZERO, frame))
            }
            _ => Ok(NgBlock::Other),
        }
    }

    /// The interface `id` of the current section; makes its link type current.
    fn interface(&mut self, id: u32, start: usize) -> Result<Interface, WireError> {
        let Format::Ng { interfaces, .. } = &self.format else {
            return Err(WireError::Pcap("not a pcapng file".into()));
        };
        let iface = interfaces.get(id as usize).copied().ok_or_else(|| {
            WireError::Pcap(format!(
                "pcapng packet block at byte {start}: unknown interface {id}"
            ))
        })?;
        self.linktype = iface.linktype;
        self.snaplen = iface.snaplen;
        Ok(iface)
    }
}

/// What one pcapng block turned out to be.
enum NgBlock {
    End,
    Packet(Duration, Vec<u8>),
    Other,
}

/// The `if_tsresol` option of an interface description body (after the 8 fixed bytes);
/// microseconds when absent.
fn idb_resolution(body: &[u8], big_endian: bool) -> Resolution {
    let mut at = 8;
    // Each option takes at least 4 bytes, so the loop ends within body.len() / 4 steps.
    for _ in 0..body.len() / 4 {
        let code = word16(body, at, big_endian);
        let len = usize::from(word16(body, at + 2, big_endian));
        if code == 0 || at + 4 > body.len() {
            break;
        }
        if code == PCAPNG_IF_TSRESOL && len >= 1 {
            let v = body.get(at + 4).copied().unwrap_or(6);
            return if v & 0x80 == 0 {
                Resolution::Decimal(v)
            } else {
                Resolution::Binary(v & 0x7f)
            };
        }
        at += 4 + len.div_ceil(4) * 4;
    }
    Resolution::Decimal(6)
}

/// A pcapng timestamp of `units` in `resolution` as a duration since the epoch.
fn timestamp(units: u64, resolution: Resolution) -> Result<Duration, WireError> {
    match resolution {
        Resolution::Decimal(k) if k <= 19 => {
            let per_sec = 10u64.pow(u32::from(k));
            let frac = u128::from(units % per_sec);
            let nanos = frac * 1_000_000_000 / u128::from(per_sec);
            // invariant: frac < per_sec, so nanos < 10^9 fits u32.
            Ok(Duration::new(units / per_sec, nanos as u32))
        }
        Resolution::Binary(k) if k <= 63 => {
            let secs = units >> k;
            let frac = u128::from(units & ((1u64 << k) - 1));
            // invariant: frac < 2^k, so the result is < 10^9.
            let nanos = (frac * 1_000_000_000) >> k;
            Ok(Duration::new(secs, nanos as u32))
        }
        _ => Err(WireError::Pcap(format!(
            "unsupported pcapng timestamp resolution {resolution:?}"
        ))),
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = Result<(Duration, Vec<u8>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.next_frame();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}

/// Reads until `buf` is full or the input ends; returns how many bytes were read.
fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> Result<usize, WireError> {
    let want = buf.len() as u64;
    let mut v = Vec::with_capacity(buf.len());
    let got = input
        .take(want)
        .read_to_end(&mut v)
        .map_err(|e| io_error("reading", &e))?;
    if let Some(dst) = buf.get_mut(..got) {
        dst.copy_from_slice(&v);
    }
    Ok(got)
}

#[cfg(test)]
#[path = "tests/pcap.rs"]
mod tests;
