//! `uroce`: the command-line tool, the top layer of uroce.
//!
//! It sits above everything else (`wire` → `proto` → `verbs` → `net` → `ffi`/`cli`) and
//! holds no protocol logic of its own. It offers two views of the wire layer:
//!
//! * `uroce packet [--out FILE.pcap] [--ipv6] [--pmtu N]` builds one sample RoCEv2 packet
//!   per opcode of the opcode table (and a 5000-byte RC SEND segmented at the path MTU),
//!   frames each in Ethernet + IP + UDP, seals its ICRC for that IP header, prints one
//!   line per packet and writes them all to a pcap file for Wireshark / tshark.
//! * `uroce decode FILE` reads a pcap or pcapng capture and prints every RoCEv2 packet,
//!   with parse errors and ICRC mismatches; the exit status is 1 if any RoCEv2 packet was
//!   bad.
//!
//! and three views of a running device (`uroce-net`):
//!
//! * `uroce devinfo [--addr IP] [-v]` ([`devinfo`]): the device, its port, GID table and
//!   counters;
//! * `uroce perf …` ([`perf`]): latency and bandwidth tests between two processes or hosts,
//!   or, with no arguments, a local pair on 127.0.0.1 / 127.0.0.2;
//! * `uroce capture FILE.pcap [--addr IP] [-- PERF ARGS]` ([`capture`]): a quick local perf
//!   run with every packet of the client's device written to a pcap file.
//!
//! and `uroce run -- PROGRAM ARGS` ([`runner`]), which runs an unmodified verbs / RDMA-CM
//! program over uroce's `libibverbs.so.1` and `librdmacm.so.1`.
#![deny(unsafe_code)]

mod capture;
mod devinfo;
mod perf;
// `unsafe` only in the namespace system calls of the presentation (`uroce run`).
#[allow(unsafe_code)]
mod present;
mod runner;
mod stat;
#[allow(unsafe_code)]
mod userns;

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use uroce_wire::aeth::{self, Syndrome};
use uroce_wire::ip::Endpoints;
use uroce_wire::opcode::{self, HeaderSet, Operation, Position, Transport, OPCODE_TABLE};
use uroce_wire::pcap::{PcapReader, PcapWriter};
use uroce_wire::{
    atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, mad, packet, reth, xrceth,
    OpcodeInfo, PacketRepr, Pmtu, Psn, WireError,
};

/// Command-line interface of uroce.
#[derive(Debug, Parser)]
#[command(name = "uroce", version, about = "uroce: a userspace RoCEv2 stack")]
#[command(args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build one sample packet per opcode, print them and write them to a pcap file.
    Packet {
        /// Output pcap file.
        #[arg(long, default_value = "uroce-packets.pcap")]
        out: PathBuf,
        /// Frame the packets in IPv6 instead of IPv4.
        #[arg(long)]
        ipv6: bool,
        /// Path MTU in bytes (256, 512, 1024, 2048 or 4096): the payload of FIRST and
        /// MIDDLE packets and the segment size of the sample SEND.
        #[arg(long, default_value_t = 1024)]
        pmtu: u32,
    },
    /// Print the RoCEv2 packets of a pcap / pcapng capture, checking each ICRC.
    Decode {
        /// Capture file.
        file: PathBuf,
    },
    /// Show the device, its port and GID table, and its counters. Opening the device
    /// binds UDP port 4791 on its address.
    ///
    /// The device is opened just for this report, so its counters are zero; to see
    /// counters after traffic, run `uroce perf --counters` (both sides' device and
    /// per-QP counters after each test).
    Devinfo {
        /// The device's address [default: $UROCE_ADDR or 127.0.0.1].
        #[arg(long, value_name = "IP")]
        addr: Option<IpAddr>,
        /// Every device and port attribute.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Latency and bandwidth tests (send, write, read, atomic) between a server and a
    /// client; with no arguments, a local pair on 127.0.0.2 (server) and 127.0.0.1
    /// (client). Opening a device binds UDP port 4791 on its address.
    Perf(perf::PerfArgs),
    /// Run a quick local `uroce perf` pair and write every packet the client's device
    /// sends and receives to a pcap file (opening the device binds UDP 4791).
    Capture(capture::CaptureArgs),
    /// The counters of every running uroce device (each process's, also those of programs
    /// under `uroce run`): device-wide and per QP, drops by reason.
    Stat(stat::StatArgs),
    /// Run an unmodified verbs / RDMA-CM program on uroce: `uroce run -- rping -s`.
    /// Presents uroce's libibverbs.so.1 and librdmacm.so.1 (found next to this binary or
    /// in UROCE_LIB_DIR) through LD_LIBRARY_PATH and executes the program in its place. Every
    /// process opens the host's shared device on UROCE_ADDR (default 127.0.0.1);
    /// UROCE_SHARED=0 gives a process a device of its own (then, without UROCE_ADDR, on
    /// the first 127.0.0.x whose UDP 4791 is free).
    Run {
        /// The program and its arguments (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        program: Vec<std::ffi::OsString>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = run(cli);
    match result {
        Ok(code) => ExitCode::from(code),
        // The reader of our output went away (`uroce decode x.pcap | head`): not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uroce: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<u8> {
    let mut stdout = std::io::stdout().lock();
    match cli.command {
        Command::Packet { out, ipv6, pmtu } => {
            packet_cmd(&mut stdout, &out, ipv6, pmtu).map(|()| 0)
        }
        Command::Decode { file } => decode_cmd(&mut stdout, &file).map(|()| 0),
        Command::Stat(a) => stat::stat_cmd(&mut stdout, &a).map(|()| 0),
        Command::Devinfo { addr, verbose } => {
            drop(stdout);
            devinfo::devinfo_cmd(addr, verbose).map(|()| 0)
        }
        Command::Perf(args) => {
            drop(stdout);
            perf::perf_cmd(&args)
        }
        Command::Capture(args) => {
            drop(stdout);
            capture::capture_cmd(&args)
        }
        Command::Run { program } => {
            drop(stdout);
            runner::run_cmd(&program)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Size of the sample SEND message that is segmented at the path MTU.
const SEGMENTED_SEND_LEN: usize = 5000;
/// Capture timestamp of the first sample packet (2024-01-01T00:00:00Z); one ms apart.
const SAMPLE_EPOCH_SECS: u64 = 1_704_067_200;
/// Destination QP of the samples; the UD samples use their own source QP.
const SAMPLE_QPN: u32 = 0x11;

fn packet_cmd(stdout: &mut impl Write, out: &Path, ipv6: bool, pmtu: u32) -> Result<()> {
    let pmtu = Pmtu::from_bytes(pmtu)
        .with_context(|| format!("--pmtu {pmtu}: must be 256, 512, 1024, 2048 or 4096"))?;
    // Documentation addresses (RFC 5737 / RFC 3849).
    let ep = if ipv6 {
        Endpoints::roce(
            "2001:db8::1".parse::<IpAddr>()?,
            "2001:db8::2".parse::<IpAddr>()?,
            0xc000,
        )
    } else {
        Endpoints::roce(
            IpAddr::from([192, 0, 2, 1]),
            IpAddr::from([192, 0, 2, 2]),
            0xc000,
        )
    };
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut pcap = PcapWriter::new(BufWriter::new(file))?;

    let message: Vec<u8> = (0..SEGMENTED_SEND_LEN).map(|i| (i % 251) as u8).collect();
    let full_packet = vec![0xa5u8; pmtu.bytes() as usize];
    let zeros = [0u8; 16];
    let mut written = 0u32;
    let mut buf = Vec::new();
    let mut emit = |repr: &PacketRepr<'_>, pcap: &mut PcapWriter<_>| -> Result<()> {
        buf.clear();
        buf.resize(repr.buffer_len(), 0);
        repr.emit(&mut buf)
            .with_context(|| format!("emitting {repr}"))?;
        let ts = Duration::from_secs(SAMPLE_EPOCH_SECS) + Duration::from_millis(written.into());
        let icrc = pcap.write_roce(ts, &ep, &buf)?;
        writeln!(
            stdout,
            "{written:3} {repr} icrc={}",
            hex(&icrc.to_le_bytes())
        )?;
        written += 1;
        Ok(())
    };

    for (index, info) in OPCODE_TABLE.iter().enumerate() {
        let text = format!("uroce sample {}", info.name);
        let payload: &[u8] = match info.exact_payload {
            _ if !info.payload => &[],
            // The CNP's 16 bytes are reserved (zero); ATOMIC_WRITE carries 8 data bytes.
            Some(n) if info.operation == Operation::Cnp => zeros.get(..n).unwrap_or_default(),
            Some(n) => message.get(..n).unwrap_or_default(),
            None if matches!(info.position, Position::First | Position::Middle) => &full_packet,
            None => text.as_bytes(),
        };
        emit(&sample(info, Psn::new(index as u32), payload), &mut pcap)?;
    }

    // A SEND of SEGMENTED_SEND_LEN bytes cut at the path MTU: FIRST, MIDDLE…, LAST.
    let first_psn = Psn::new(0x100);
    let mut segments = 0;
    for (i, seg) in packet::segment(SEGMENTED_SEND_LEN as u64, pmtu).enumerate() {
        let op = opcode::opcode_for(Transport::Rc, Operation::Send, seg.position, false, false)
            .context("RC SEND has an opcode for every position")?;
        let start = usize::try_from(seg.offset)?;
        let chunk = &message[start..start + seg.len as usize];
        let mut b = sample_bth(op, first_psn + i as u32);
        b.ack_req = seg.position.ends();
        let repr = PacketRepr::new(b, chunk);
        repr.check_pmtu(pmtu)?;
        emit(&repr, &mut pcap)?;
        segments += 1;
    }
    pcap.into_inner()?;

    let family = if ipv6 { "IPv6" } else { "IPv4" };
    writeln!(
        stdout,
        "wrote {written} packets ({} opcodes + a {SEGMENTED_SEND_LEN}-byte RC SEND in \
         {segments} segments) to {} ({family}, PMTU {pmtu})",
        written - segments,
        out.display(),
    )?;
    Ok(())
}

fn sample_bth(opcode: u8, psn: Psn) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_cnt: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: SAMPLE_QPN,
        ack_req: false,
        psn,
    }
}

/// A sample packet of `info` with recognisable header values.
fn sample<'a>(info: &OpcodeInfo, psn: Psn, payload: &'a [u8]) -> PacketRepr<'a> {
    let h = info.headers;
    let mut b = sample_bth(info.opcode, psn);
    let reliable = matches!(info.transport, Transport::Rc | Transport::Xrc);
    b.ack_req = reliable && info.is_request && info.position.ends();
    b.becn = info.operation == Operation::Cnp;
    let message_len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    PacketRepr {
        xrceth: h
            .contains(HeaderSet::XRCETH)
            .then_some(xrceth::Repr { srqn: 0x42 }),
        deth: h.contains(HeaderSet::DETH).then_some(deth::Repr {
            qkey: 0x0123_4567,
            src_qp: 0x12,
        }),
        feth: h.contains(HeaderSet::FETH).then_some(feth::Repr {
            selectivity_level: feth::SELECTIVITY_RANGE,
            placement_type: feth::PLACEMENT_GLOBAL_VISIBILITY,
        }),
        reth: h.contains(HeaderSet::RETH).then_some(reth::Repr {
            va: 0x7f00_0000_1000,
            rkey: 0x0000_1234,
            dma_len: if info.payload { message_len } else { 4096 },
        }),
        aeth: h.contains(HeaderSet::AETH).then_some(aeth::Repr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: psn.value(),
        }),
        atomic_eth: h
            .contains(HeaderSet::ATOMIC_ETH)
            .then_some(atomic_eth::Repr {
                va: 0x7f00_0000_2000,
                rkey: 0x0000_1234,
                swap_add: 1,
                compare: 0,
            }),
        atomic_ack_eth: h
            .contains(HeaderSet::ATOMIC_ACK_ETH)
            .then_some(atomic_ack_eth::Repr { orig: 0x2a }),
        immdt: h
            .contains(HeaderSet::IMMDT)
            .then_some(immdt::Repr { imm: 0xdead_beef }),
        ieth: h
            .contains(HeaderSet::IETH)
            .then_some(ieth::Repr { rkey: 0x0000_1234 }),
        ..PacketRepr::new(b, payload)
    }
}

fn decode_cmd(stdout: &mut impl Write, path: &Path) -> Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = PcapReader::new(BufReader::new(file))
        .with_context(|| format!("reading {}", path.display()))?;
    let (mut frames, mut roce, mut bad, mut other) = (0u64, 0u64, 0u64, 0u64);
    while let Some(item) = reader.next() {
        let (ts, frame) = item.with_context(|| format!("reading {}", path.display()))?;
        frames += 1;
        let prefix = format!("#{frames} {}.{:06}", ts.as_secs(), ts.subsec_micros());
        let datagram = match reader.datagram(&frame) {
            Ok(d) => d,
            Err(e) => {
                other += 1;
                writeln!(stdout, "{prefix} not a UDP datagram: {e}")?;
                continue;
            }
        };
        let Ok(payload) = datagram.roce() else {
            other += 1;
            writeln!(stdout, "{prefix} {} not RoCEv2", datagram.endpoints())?;
            continue;
        };
        roce += 1;
        match decode_one(payload, &datagram) {
            Ok(line) => writeln!(stdout, "{prefix} {} {line}", datagram.endpoints())?,
            Err(e) => {
                bad += 1;
                writeln!(stdout, "{prefix} {} error: {e}", datagram.endpoints())?;
            }
        }
    }
    writeln!(
        stdout,
        "{frames} frames: {roce} RoCEv2 packets ({bad} bad), {other} other"
    )?;
    if bad > 0 {
        bail!("{bad} bad RoCEv2 packets in {}", path.display());
    }
    Ok(())
}

/// One RoCEv2 packet as a line, or why it is bad (parse error or ICRC mismatch).
fn decode_one(
    payload: &[u8],
    datagram: &uroce_wire::ip::Datagram<'_>,
) -> Result<String, WireError> {
    let repr = PacketRepr::parse(payload)?;
    datagram.verify_icrc()?;
    let mut line = format!("{repr} icrc ok");
    if repr.deth.is_some() && repr.bth.dest_qp == mad::GSI_QPN {
        if let Ok(h) = mad::Header::new_checked(repr.payload) {
            let attr = mad::cm_attr::name(h.attribute_id()).unwrap_or("?");
            line.push_str(&format!(
                " MAD class={:#04x} attr={attr} ({:#06x})",
                h.mgmt_class(),
                h.attribute_id()
            ));
        }
    }
    Ok(line)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_has_an_emittable_sample() {
        let payload = [0u8; 16];
        for info in OPCODE_TABLE {
            let body: &[u8] = match (info.payload, info.exact_payload) {
                (false, _) => &[],
                (true, Some(n)) => &payload[..n],
                (true, None) => &payload[..5],
            };
            let repr = sample(info, Psn::new(1), body);
            let mut buf = vec![0u8; repr.buffer_len()];
            repr.emit(&mut buf)
                .unwrap_or_else(|e| panic!("{info}: {e}"));
            let parsed = PacketRepr::parse(&buf).unwrap();
            assert_eq!(parsed.bth.opcode, info.opcode);
            assert_eq!(parsed.present_headers(), info.headers, "{info}");
            assert_eq!(parsed.feth, repr.feth, "{info}");
        }
    }

    #[test]
    fn cli_parses() {
        let cli = Cli::try_parse_from(["uroce", "packet", "--ipv6", "--pmtu", "4096"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Packet {
                ipv6: true,
                pmtu: 4096,
                ..
            }
        ));
        assert!(Cli::try_parse_from(["uroce", "decode"]).is_err());
    }
}
