//! `uroce stat`: the counters every running uroce device publishes (see
//! `uroce_net::stats`), device-wide and per QP, for the user of a program that runs on
//! uroce: which datagrams are dropped, and why.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use uroce_net::stats::{read_all, stat_dir, DeviceStat};

/// Options of `uroce stat`.
#[derive(Debug, clap::Args)]
pub struct StatArgs {
    /// Every counter, zeros included (default: the non-zero ones).
    #[arg(long)]
    pub all: bool,
    /// Only the devices of this process.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Device counters only, no per-QP sections.
    #[arg(long)]
    pub no_qps: bool,
    /// Where the devices publish (default: `$UROCE_STAT_DIR`, else
    /// `/dev/shm/uroce-<uid>/stat`, without `/dev/shm` `/tmp/uroce-<uid>/stat`).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the devices' counters; says so when no device runs.
pub fn stat_cmd(out: &mut impl Write, a: &StatArgs) -> Result<()> {
    let dir = a.dir.clone().unwrap_or_else(stat_dir);
    let devices: Vec<DeviceStat> = read_all(&dir)
        .into_iter()
        .filter(|d| a.pid.is_none_or(|p| p == d.pid))
        .collect();
    if devices.is_empty() {
        writeln!(
            out,
            "no running uroce device publishes in {}",
            dir.display()
        )?;
        return Ok(());
    }
    let shown = |v: u64| a.all || v != 0;
    for d in &devices {
        writeln!(out, "{} {} pid {}", d.name, d.addr, d.pid)?;
        for (n, v) in d.counters.iter().filter(|c| shown(c.1)) {
            writeln!(out, "  {n} {v}")?;
        }
        if a.no_qps {
            continue;
        }
        for q in &d.qps {
            let counters: Vec<_> = q.counters.iter().filter(|c| shown(c.1)).collect();
            if counters.is_empty() && !a.all {
                continue;
            }
            writeln!(out, "  qp {:#08x} {} {}", q.qpn, q.qp_type, q.state)?;
            for (n, v) in counters {
                writeln!(out, "    {n} {v}")?;
            }
        }
    }
    Ok(())
}
