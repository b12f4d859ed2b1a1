//! A live packet capture (on the loopback interface, or any interface of any network
//! namespace), running in the background.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::tools::{read_lossy, run, tshark, TempFile};

/// A packet capture running in the background (`tshark -i lo -f FILTER -w FILE`).
pub struct LiveCapture {
    child: std::process::Child,
    file: TempFile,
    stderr: TempFile,
}

/// The payload of the datagrams [`LiveCapture::start_on_probed`] sends until the capturer
/// shows it captures; a test skips them when it reads the capture.
pub const PROBE: &[u8] = b"uroce-live-capture-probe";

impl LiveCapture {
    /// Starts capturing on the loopback interface with the capture filter `filter` and
    /// waits (at most 30 s) until the capturer reports that it is capturing. `Err` says
    /// why it could not start (tool missing, no permission, timeout).
    pub fn start(filter: &str) -> Result<LiveCapture, String> {
        LiveCapture::start_on("lo", filter, None)
    }

    /// [`LiveCapture::start`] on `interface`, in the network namespace of process
    /// `netns_of` when given (through `nsenter --net`, which runs the capturer itself
    /// there, so that stopping it by its process id works as for the plain form).
    pub fn start_on(
        interface: &str,
        filter: &str,
        netns_of: Option<u32>,
    ) -> Result<LiveCapture, String> {
        LiveCapture::spawn(interface, filter, netns_of, None)
    }

    /// [`LiveCapture::start_on`] that returns only once a packet is seen captured: the
    /// capturer reports that it captures before it does, and on a loaded machine it has
    /// missed the first hundreds of milliseconds after. `probe` must send one datagram
    /// that `filter` matches, with the payload [`PROBE`]; it is called every 100 ms until
    /// the capturer prints a packet (at most 30 s). The probes are in the capture.
    pub fn start_on_probed(
        interface: &str,
        filter: &str,
        netns_of: Option<u32>,
        probe: &dyn Fn(),
    ) -> Result<LiveCapture, String> {
        let summaries = TempFile::new("live-summaries", "txt");
        let capture = LiveCapture::spawn(interface, filter, netns_of, Some(&summaries))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(summaries.path()).map_or(0, |m| m.len()) == 0 {
            if Instant::now() >= deadline {
                return Err("the capture saw no probe within 30 s".into());
            }
            probe();
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(capture)
    }

    /// Starts the capturer; with `summaries`, it also prints a line per packet there
    /// (`-P`, line-buffered).
    fn spawn(
        interface: &str,
        filter: &str,
        netns_of: Option<u32>,
        summaries: Option<&TempFile>,
    ) -> Result<LiveCapture, String> {
        let file = TempFile::new("live", "pcap");
        let stderr = TempFile::new("live-stderr", "txt");
        let err = File::create(stderr.path()).map_err(|e| e.to_string())?;
        let mut cmd = match netns_of {
            Some(pid) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/proc/{pid}/ns/net"))
                    .arg("--")
                    .arg(tshark());
                c
            }
            None => Command::new(tshark()),
        };
        // A 64 MiB kernel buffer (`-B`, default 2 MiB): a capturer starved of CPU on a
        // loaded machine otherwise drops packets that the devices did send, and the tests
        // that compare the capture with the devices' counters fail for it.
        cmd.args([
            "-i", interface, "-B", "64", "-f", filter, "-F", "pcap", "-w",
        ])
        .arg(file.path())
        .stdin(Stdio::null())
        .stderr(err);
        match summaries {
            Some(f) => {
                cmd.args(["-l", "-P"])
                    .stdout(File::create(f.path()).map_err(|e| e.to_string())?);
            }
            None => {
                cmd.stdout(Stdio::null());
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", tshark()))?;
        let mut capture = LiveCapture {
            child,
            file,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = read_lossy(capture.stderr.path());
            if text.contains("Capturing on") {
                // The filter is attached before the message; a short pause covers the
                // capturer's own start-up of its ring buffer.
                std::thread::sleep(Duration::from_millis(300));
                return Ok(capture);
            }
            if let Ok(Some(status)) = capture.child.try_wait() {
                return Err(format!(
                    "capture exited ({status}) before capturing: {}",
                    text.trim()
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "capture did not start within 30 s: {}",
                    text.trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the capture (SIGINT, then SIGKILL after 15 s) and returns the file, which
    /// holds everything captured. `Err` if it could not be stopped cleanly.
    pub fn stop(mut self) -> Result<TempFile, String> {
        // Give the kernel a moment to hand the last packets to the capturer.
        std::thread::sleep(Duration::from_millis(300));
        let pid = self.child.id().to_string();
        let _ = run(
            {
                let mut kill = Command::new("kill");
                kill.args(["-INT", &pid]);
                kill
            },
            Duration::from_secs(10),
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!(
                        "capture did not stop on SIGINT: {}",
                        read_lossy(self.stderr.path()).trim()
                    ));
                }
            }
        }
        let file = TempFile(std::mem::replace(&mut self.file.0, PathBuf::new()));
        Ok(file)
    }
}

impl Drop for LiveCapture {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
