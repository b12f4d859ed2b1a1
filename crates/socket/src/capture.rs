//! Writing the packets a socket sends and receives to a pcap file.
//!
//! A UDP socket never sees the IP and UDP headers of its datagrams, so [`Capture`]
//! rebuilds them: the headers the kernel emits for a uroce socket (unconnected,
//! `IP_PMTUDISC_DO`; `docs/ICRC.md`): IPv4 Identification 0, DF, TTL 64, TOS 0 and a
//! correct header checksum, or IPv6 with traffic class 0, flow label 0, hop limit 64;
//! the real addresses and ports; and a correct UDP checksum, as the kernel computes it.
//! A received IPv4 packet is recorded with the Identification and DF flag its ICRC was
//! found valid for ([`Capture::record_with_ident`]: a GSO segment, a Soft-RoCE peer), so
//! its ICRC checks in the capture too. Each datagram is framed in Ethernet II with made-up locally administered MAC addresses
//! derived from the IP addresses (`uroce_wire::pcap::mac_for`), so any dissector reads
//! the file as a normal RoCEv2 capture.
//!
//! The RoCE bytes are written exactly as sent or received, ICRC included (nothing is
//! resealed): a corrupted packet shows its bad ICRC. A received packet from a peer that
//! does not follow the uroce convention (e.g. Linux rxe, which sends non-zero IPv4
//! Identifications) is written with the reconstructed header, so its ICRC will not verify
//! in the capture, which is exactly what the receiving socket could tell about it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uroce_wire::icrc_ident::Ipv4Ident;
use uroce_wire::ip::{self, Endpoints, ETHERNET_HEADER_LEN, UDP_HEADER_LEN};
use uroce_wire::pcap::{mac_for, PcapWriter};

use crate::SocketError;

/// A pcap file (or any writer) receiving RoCEv2 packets framed as the kernel sends them.
pub struct Capture {
    writer: PcapWriter<Box<dyn Write + Send>>,
    frame: Vec<u8>,
    packets: u64,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("packets", &self.packets)
            .finish_non_exhaustive()
    }
}

impl Capture {
    /// Creates (truncates) `path` and writes the pcap file header.
    ///
    /// # Errors
    /// [`SocketError::CaptureFile`] if the file cannot be created, [`SocketError::Capture`] if
    /// the header cannot be written.
    pub fn create(path: impl AsRef<Path>) -> Result<Capture, SocketError> {
        let path = path.as_ref();
        let file = File::create(path).map_err(|source| SocketError::CaptureFile {
            path: path.display().to_string(),
            source,
        })?;
        Capture::new(BufWriter::new(file))
    }

    /// Writes the pcap file header to `out` and captures into it.
    ///
    /// # Errors
    /// [`SocketError::Capture`] if the header cannot be written.
    pub fn new(out: impl Write + Send + 'static) -> Result<Capture, SocketError> {
        let boxed: Box<dyn Write + Send> = Box::new(out);
        Ok(Capture {
            writer: PcapWriter::new(boxed).map_err(SocketError::Capture)?,
            frame: Vec::new(),
            packets: 0,
        })
    }

    /// Packets written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Writes one datagram from `src` to `dst` carrying `roce` (BTH..ICRC, as is),
    /// stamped with the current time.
    ///
    /// # Errors
    /// As [`Capture::record_at`].
    pub fn record(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        roce: &[u8],
    ) -> Result<(), SocketError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.record_at(now, src, dst, roce)
    }

    /// [`Capture::record`] of a packet whose IPv4 header carried the Identification and
    /// DF flag of `ident` (segment k of a GSO train, a Soft-RoCE peer's packet; ignored
    /// for IPv6).
    ///
    /// # Errors
    /// As [`Capture::record_at`].
    pub fn record_with_ident(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        roce: &[u8],
        ident: Ipv4Ident,
    ) -> Result<(), SocketError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        self.record_frame(now, src, dst, roce, ident)
    }

    /// Writes one datagram from `src` to `dst` carrying `roce`, stamped `ts` (time since
    /// the Unix epoch).
    ///
    /// # Errors
    /// [`SocketError::Capture`] for mixed address families, a datagram longer than IP
    /// allows, or a failed write.
    pub fn record_at(
        &mut self,
        ts: Duration,
        src: SocketAddr,
        dst: SocketAddr,
        roce: &[u8],
    ) -> Result<(), SocketError> {
        self.record_frame(ts, src, dst, roce, Ipv4Ident::UROCE)
    }

    fn record_frame(
        &mut self,
        ts: Duration,
        src: SocketAddr,
        dst: SocketAddr,
        roce: &[u8],
        ident: Ipv4Ident,
    ) -> Result<(), SocketError> {
        let ep = Endpoints {
            src: src.ip(),
            dst: dst.ip(),
            src_port: src.port(),
            dst_port: dst.port(),
        };
        let headers_len = ep.headers_len().map_err(SocketError::Capture)?;
        self.frame.clear();
        self.frame
            .resize(ETHERNET_HEADER_LEN + headers_len + roce.len(), 0);
        let (eth, datagram) = self.frame.split_at_mut(ETHERNET_HEADER_LEN);
        let ethertype = if ep.dst.is_ipv4() {
            ip::ETHERTYPE_IPV4
        } else {
            ip::ETHERTYPE_IPV6
        };
        eth[0..6].copy_from_slice(&mac_for(ep.dst));
        eth[6..12].copy_from_slice(&mac_for(ep.src));
        eth[12..14].copy_from_slice(&ethertype.to_be_bytes());
        let fields = ip::IpFields {
            identification: ident.identification,
            dont_fragment: ident.dont_fragment,
            ..ip::IpFields::LINUX_UDP_SOCKET
        };
        let (ip_len, _) = ip::roce_headers_with(&ep, &fields, roce.len(), datagram)
            .map_err(SocketError::Capture)?;
        let (_, udp_and_payload) = datagram.split_at_mut(ip_len);
        let (udp, payload) = udp_and_payload.split_at_mut(UDP_HEADER_LEN);
        payload.copy_from_slice(roce);
        let sum = udp_checksum(ep.src, ep.dst, udp, payload);
        udp[6..8].copy_from_slice(&sum.to_be_bytes());
        self.writer
            .write_frame(ts, &self.frame)
            .map_err(SocketError::Capture)?;
        self.packets += 1;
        Ok(())
    }

    /// Flushes buffered records to the file.
    ///
    /// # Errors
    /// [`SocketError::Capture`] if writing fails.
    pub fn flush(&mut self) -> Result<(), SocketError> {
        self.writer.flush().map_err(SocketError::Capture)
    }
}

/// The UDP checksum (RFC 768 / RFC 8200 §8.1) of a datagram whose header `udp` has its
/// checksum field zero; 0 is sent as 0xFFFF.
fn udp_checksum(src: IpAddr, dst: IpAddr, udp: &[u8], payload: &[u8]) -> u16 {
    let udp_len = (udp.len() + payload.len()) as u32;
    let mut sum: u64 = 0;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            sum += ones_sum(&s.octets()) + ones_sum(&d.octets());
            sum += u64::from(ip::IP_PROTO_UDP) + u64::from(udp_len);
        }
        (s, d) => {
            let (s, d) = (to_v6(s), to_v6(d));
            sum += ones_sum(&s) + ones_sum(&d);
            sum += u64::from(udp_len >> 16) + u64::from(udp_len & 0xffff);
            sum += u64::from(ip::IP_PROTO_UDP);
        }
    }
    sum += ones_sum(udp) + ones_sum(payload);
    // Folding a u64 four times leaves at most 16 bits.
    for _ in 0..4 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

fn to_v6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Sum of big-endian 16-bit words (an odd final byte padded with zero), unfolded.
fn ones_sum(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(2);
    let mut sum: u64 = chunks
        .by_ref()
        .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 example words: 0x0001 0xf203 0xf4f5 0xf6f7 sum to 0xddf2 (folded).
    #[test]
    fn ones_complement_sum_matches_rfc1071() {
        let mut s = ones_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]);
        s = (s & 0xffff) + (s >> 16);
        assert_eq!(s, 0xddf2);
        assert_eq!(ones_sum(&[0xab]), 0xab00);
    }
}
