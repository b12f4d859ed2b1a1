//! `uroce capture FILE.pcap [--addr IP] [-- PERF ARGS]`: runs `uroce perf` (by default a
//! quick local pair) with packet capture on the client's device, then summarises the file.

use std::fs::File;
use std::io::BufReader;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;
use uroce_wire::pcap::PcapReader;
use uroce_wire::PacketRepr;

use crate::perf::PerfArgs;

/// Options of the quick run, placed before the user's perf arguments (which override them).
/// 10000 bytes is three packets at a 4096-byte path MTU (loopback's), so every FIRST,
/// MIDDLE and LAST opcode appears.
pub const QUICK: &[&str] = &[
    "--iters",
    "20",
    "--size",
    "8,10000",
    "--tx-depth",
    "16",
    "--rx-depth",
    "32",
];

/// Options of `uroce capture`.
#[derive(Debug, Clone, clap::Args)]
pub struct CaptureArgs {
    /// The pcap file to write.
    #[arg(value_name = "FILE.pcap")]
    pub file: PathBuf,
    /// The capturing (client) device's address; opening it binds UDP 4791 there
    /// [default: $UROCE_ADDR or 127.0.0.1].
    #[arg(long, value_name = "IP")]
    pub addr: Option<IpAddr>,
    /// Arguments for `uroce perf` (after `--`); they override the quick defaults.
    #[arg(last = true, value_name = "PERF ARGS")]
    pub perf: Vec<String>,
}

/// Only for parsing the perf arguments of a capture.
#[derive(Debug, Parser)]
#[command(name = "uroce capture", args_override_self = true)]
struct PerfOnly {
    #[command(flatten)]
    perf: PerfArgs,
}

/// The perf options of a capture run.
pub fn perf_args(args: &CaptureArgs) -> Result<PerfArgs> {
    let mut argv: Vec<String> = vec!["uroce capture".into()];
    argv.extend(QUICK.iter().map(|s| s.to_string()));
    if let Some(a) = args.addr {
        argv.extend(["--addr".into(), a.to_string()]);
    }
    argv.extend(args.perf.iter().cloned());
    argv.extend(["--capture".into(), args.file.display().to_string()]);
    let parsed = PerfOnly::try_parse_from(argv).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(parsed.perf)
}

/// Counts the frames of `path` and the RoCEv2 packets that parse.
pub fn summarise(path: &Path) -> Result<(u64, u64)> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = PcapReader::new(BufReader::new(file))
        .with_context(|| format!("reading {}", path.display()))?;
    let (mut frames, mut roce) = (0u64, 0u64);
    while let Some(item) = reader.next() {
        let (_, frame) = item.with_context(|| format!("reading {}", path.display()))?;
        frames += 1;
        if let Ok(d) = reader.datagram(&frame) {
            if let Ok(p) = d.roce() {
                if PacketRepr::parse(p).is_ok() {
                    roce += 1;
                }
            }
        }
    }
    Ok((frames, roce))
}

/// Runs `uroce capture`; returns the exit status.
pub fn capture_cmd(args: &CaptureArgs) -> Result<u8> {
    let perf = perf_args(args)?;
    let code = crate::perf::perf_cmd(&perf)?;
    if code != 0 {
        return Ok(code);
    }
    let (frames, roce) = summarise(&args.file)?;
    println!(
        "capture: wrote {frames} packets ({roce} RoCEv2) to {}",
        args.file.display()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_perf_args_override_the_quick_ones() {
        let a = CaptureArgs {
            file: "x.pcap".into(),
            addr: Some("127.0.1.9".parse().unwrap()),
            perf: vec![
                "--iters".into(),
                "5".into(),
                "--test".into(),
                "send_lat".into(),
            ],
        };
        let p = perf_args(&a).unwrap();
        assert_eq!(p.iters, Some(5));
        assert_eq!(p.capture.as_deref(), Some(Path::new("x.pcap")));
        assert_eq!(p.addr, Some("127.0.1.9".parse().unwrap()));
        assert_eq!(p.tx_depth, 16);
        assert_eq!(p.test.unwrap().to_string(), "send_lat");
    }
}
