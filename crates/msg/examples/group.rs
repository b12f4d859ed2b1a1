//! Ordered group messaging: `--members N` member processes on 127.0.9.1 … 127.0.9.N form a
//! token ring over uroce-msg endpoints, each originates `--messages M` messages, every
//! member logs its deliveries, and the parent checks that all survivors delivered the
//! same messages in the same order. `--kill K --kill-after-ms T` kills member K mid-run
//! (the group must detect it and go on); `--loss P` injects P packet loss on every member
//! (`UROCE_FAULTS=drop=P,seed=i`; an `UROCE_FAULTS` already set is passed on as is).
//!
//! ```sh
//! cargo run --release -p uroce-msg --example group -- --members 3
//! cargo run --release -p uroce-msg --example group -- --members 3 --loss 0.01 --kill 3
//! ```

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use uroce_msg::group::{run_member, run_processes, verify_logs, GroupConfig};

struct Args {
    members: u8,
    member: Option<u8>,
    messages: u32,
    kill: Option<u8>,
    kill_after: Duration,
    loss: Option<f64>,
    base: String,
    dir: Option<PathBuf>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        members: 3,
        member: None,
        messages: 100,
        kill: None,
        kill_after: Duration::from_millis(250),
        loss: None,
        base: "127.0.9.".into(),
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--members" => a.members = v()?.parse().map_err(|e| format!("--members: {e}"))?,
            "--member" => a.member = Some(v()?.parse().map_err(|e| format!("--member: {e}"))?),
            "--messages" => a.messages = v()?.parse().map_err(|e| format!("--messages: {e}"))?,
            "--kill" => a.kill = Some(v()?.parse().map_err(|e| format!("--kill: {e}"))?),
            "--kill-after-ms" => {
                a.kill_after = Duration::from_millis(
                    v()?.parse().map_err(|e| format!("--kill-after-ms: {e}"))?,
                )
            }
            "--loss" => a.loss = Some(v()?.parse().map_err(|e| format!("--loss: {e}"))?),
            "--base" => a.base = v()?,
            "--dir" => a.dir = Some(PathBuf::from(v()?)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.members < 2 || a.members > 200 {
        return Err("--members must be 2..=200".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    match parse().and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("group: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<(), String> {
    let ids: Vec<u8> = (1..=a.members).collect();
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("uroce-group-{}", std::process::id())),
    };
    if let Some(me) = a.member {
        let mut cfg = GroupConfig::new(me, ids, &a.base, &dir);
        cfg.messages = a.messages;
        let n = run_member(cfg)?;
        println!("member {me}: delivered {n} messages");
        return Ok(());
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let start = Instant::now();
    let command = |i: u8| {
        let mut c = Command::new(&exe);
        c.args([
            "--member",
            &i.to_string(),
            "--members",
            &a.members.to_string(),
        ])
        .args(["--messages", &a.messages.to_string(), "--base", &a.base])
        .arg("--dir")
        .arg(&dir);
        if let Some(p) = a.loss {
            c.env("UROCE_FAULTS", format!("drop={p},seed={i}"));
        }
        c
    };
    let killed = run_processes(&ids, command, a.kill, a.kill_after, Duration::from_secs(90))?;
    let survivors: Vec<u8> = ids
        .iter()
        .copied()
        .filter(|i| !killed.contains(i))
        .collect();
    let n = verify_logs(&dir, &survivors, &killed, a.messages)?;
    println!(
        "group: {} members ({} killed), {n} messages delivered in the same order by every survivor, in {:.2} s; logs in {}",
        a.members,
        killed.len(),
        start.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(())
}
