//! The XRC domains file (`uroce_socket::xrcd`) across processes: a child process (this
//! test binary again, running [`child_holder`]) opens a domain named by a real file's
//! device and inode and creates a target QP in it; this process opens the same domain;
//! the child is killed with SIGKILL; the reap drops the child's reference and the target
//! QP stays with the domain, which this process's last close destroys, returning the QP.
//! Then a domain held by a killed child alone is destroyed by the reap.

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use uroce_socket::steer::QpnLayout;
use uroce_socket::xrcd::{target_qpns, DomainId, Domains};

/// Set (to the domain file's path) only in the child process.
const CHILD_ENV: &str = "UROCE_XRCD_TEST_CHILD";
/// The directory of the domains file, in the child.
const DIR_ENV: &str = "UROCE_XRCD_TEST_DIR";

/// The child's part (does nothing in an ordinary test run): opens the domain of the file
/// in `UROCE_XRCD_TEST_CHILD`, creates a target QP, says `ready <qpn>`, and waits to be
/// killed (at most 30 s).
#[test]
fn child_holder() {
    let Ok(file) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = std::env::var(DIR_ENV).expect("directory");
    let f = std::fs::File::open(file).expect("domain file");
    let id = DomainId::of_file(&f).expect("fstat");
    let d = Domains::new(dir, QpnLayout::default());
    let mut l = d.lock().expect("lock");
    l.open_ref(id);
    let q = l.create_target_qp(id).expect("target QP");
    l.commit().expect("commit");
    println!("ready {q}");
    std::thread::sleep(std::time::Duration::from_secs(30));
}

/// Starts a child holding the domain of `file` and returns it with its target QP.
fn spawn_holder(dir: &Path, file: &Path) -> (Child, u32) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holder", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, file)
        .env(DIR_ENV, dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let out = BufReader::new(child.stdout.take().unwrap());
    match ready_qpn(out) {
        Some(q) => (child, q),
        None => {
            kill(child);
            panic!("the child did not say ready");
        }
    }
}

/// The QPN of the child's `ready` line; `None` at its end or after 20 other lines.
fn ready_qpn(mut out: impl std::io::BufRead) -> Option<u32> {
    let mut line = String::new();
    // Bounded: the child prints a few lines at most before `ready`.
    for _ in 0..20 {
        line.clear();
        if out.read_line(&mut line).ok()? == 0 {
            return None;
        }
        // libtest may print the test's name on the same line first.
        if let Some((_, q)) = line.trim().split_once("ready ") {
            return q.trim().parse().ok();
        }
    }
    None
}

fn kill(mut child: Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("wait");
}

#[test]
fn a_target_qp_survives_its_creator_and_dies_with_the_last_holder() {
    let dir = std::env::temp_dir().join(format!("uroce-xrcd-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("xrc_domain");
    std::fs::write(&file, b"").unwrap();
    let id = DomainId::of_file(&std::fs::File::open(&file).unwrap()).unwrap();
    let d = Domains::new(&dir, QpnLayout::default());

    // The child creates the domain and a target QP; this process opens it too.
    let (child, q) = spawn_holder(&dir, &file);
    assert!(target_qpns(QpnLayout::default()).contains(&q));
    let mut l = d.lock().unwrap();
    assert!(l.open_ref(id), "the child's domain");
    assert_eq!(l.state().domains[&id].refs.len(), 2);
    assert!(l.reap().dead.is_empty(), "the child lives");
    l.commit().unwrap();
    // Killed: the reap drops its reference, the target QP stays with the domain.
    kill(child);
    let mut l = d.lock().unwrap();
    let r = l.reap();
    assert_eq!(r.dead.len(), 1);
    assert!(r.destroyed.is_empty());
    assert_eq!(l.state().domains[&id].target_qps, vec![q]);
    // The last close destroys the domain with the child's target QP.
    let c = l.close_ref(id).unwrap();
    assert_eq!(c.destroyed, vec![q]);
    l.commit().unwrap();
    assert!(d.read().unwrap().domains.is_empty());

    // A domain whose only holder was killed is destroyed by the reap.
    let (child, q2) = spawn_holder(&dir, &file);
    assert_ne!(q2, q, "the cursor moved on");
    kill(child);
    let mut l = d.lock().unwrap();
    let r = l.reap();
    assert_eq!(r.destroyed, vec![(id, vec![q2])]);
    l.commit().unwrap();
    assert!(d.read().unwrap().domains.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
