//! Live connections survive a loaded machine. CPU burner processes, six per core, keep the
//! machine busy (a CI runner at a load average of 12 on 2 cores) while unmodified
//! `ibv_rc_pingpong` pairs run one after the other; none may end in `RETRY_EXC_ERR`
//! ("transport retry counter exceeded"): a retransmit timer that fired late because the
//! process was not scheduled says nothing about the peer (the RC engine's "Retry counting").
//! That a vanished peer still fails within the bound is checked by the engine's tests
//! (`rc::tests::recovery`) and by the interop suite against the kernel's rxe.
//!
//! `UROCE_LOAD_RUNS` sets the number of pairs (default 6, about 25 s; 100 for the long check).
//! Without ibverbs-utils the test is skipped (failing under `UROCE_REQUIRE_TOOLS=1`).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

mod support;

use support::{debian_command, free_tcp_port, have_program, run_server_client, LibDir};

const PROGRAM: &str = "/usr/bin/ibv_rc_pingpong";
const LIMIT: Duration = Duration::from_secs(120);

/// Busy processes (`sh -c 'while :; do :; done'`, as other jobs of a CI runner would be),
/// killed when dropped.
struct Burners {
    children: Vec<std::process::Child>,
}

impl Burners {
    fn start(n: usize) -> Burners {
        let children = (0..n)
            .filter_map(|_| {
                std::process::Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .stdin(std::process::Stdio::null())
                    .spawn()
                    .ok()
            })
            .collect();
        Burners { children }
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn pingpong_pairs_survive_six_burners_per_core() {
    let test = "pingpong_pairs_survive_six_burners_per_core";
    if !have_program(test, PROGRAM) {
        return;
    }
    let runs: usize = std::env::var("UROCE_LOAD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let dir = LibDir::new(test);
    let (server, client) = (Ipv4Addr::new(127, 0, 52, 1), Ipv4Addr::new(127, 0, 52, 2));
    let burners = Burners::start(6 * cores);
    let start = Instant::now();
    let mut failed = Vec::new();
    for i in 0..runs {
        let port = free_tcp_port();
        let args: Vec<String> = ["-g", "0", "-n", "1000", "-p"]
            .iter()
            .map(|s| s.to_string())
            .chain([port.to_string()])
            .collect();
        let mut cargs = args.clone();
        cargs.push(server.to_string());
        let (s, c) = run_server_client(
            test,
            debian_command(&dir, PROGRAM, server, &args),
            debian_command(&dir, PROGRAM, client, &cargs),
            port,
            LIMIT,
        );
        if !(s.status.success() && c.status.success()) {
            failed.push(format!(
                "run {i}: server {:?}: {} {}\nclient {:?}: {} {}",
                s.status, s.stdout, s.stderr, c.status, c.stdout, c.stderr
            ));
        }
    }
    drop(burners);
    let retry_exceeded = failed
        .iter()
        .filter(|f| f.contains("retry counter exceeded"))
        .count();
    eprintln!(
        "{test}: {runs} pairs under {} burners in {:?}: {} failed, {retry_exceeded} with \
         RETRY_EXC_ERR",
        6 * cores,
        start.elapsed(),
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n---\n"));
}
