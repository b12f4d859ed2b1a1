//! The per-host registry (`uroce_socket::host`) across processes: a child process (this
//! test binary again, running [`child_member`]) joins the registry and a steered
//! `SO_REUSEPORT` group next to this process and listens on a CM service, is killed with
//! SIGKILL while REQs for it arrive, and is reaped, first as a zombie and then gone;
//! steering is right before and after.

use std::io::{self, BufRead as _, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use uroce_socket::host::{Registry, HOST_DIR_ENV};
use uroce_socket::steer::{self, QpnLayout, MAD_OFFSET, MIN_MAD_DATAGRAM_LEN};
use uroce_wire::cm::Req;
use uroce_wire::mad::{self, cm_attr};

/// Set (to the group's address) only in the child process.
const CHILD_ENV: &str = "UROCE_HOST_TEST_CHILD";

/// The CM service ID the child listens on (RDMA CM, TCP port 20010).
const SERVICE: u64 = 0x0000_0000_0106_4E2A;

/// A REQ for [`SERVICE`] to QP1, with `tag` at byte 12 (in the DETH's Q_Key).
fn req(tag: u8) -> Vec<u8> {
    let mut d = vec![0u8; MIN_MAD_DATAGRAM_LEN as usize + 4];
    d[0] = uroce_wire::opcode::op::UD_SEND_ONLY;
    d[7] = 1;
    d[12] = tag;
    let m = &mut d[MAD_OFFSET as usize..];
    let mut h = mad::Header::new_unchecked(&mut m[..mad::LEN]);
    h.set_base_version(mad::BASE_VERSION);
    h.set_mgmt_class(mad::MGMT_CLASS_CM);
    h.set_class_version(mad::CM_CLASS_VERSION);
    h.set_response_method(false, mad::METHOD_SEND);
    h.set_attribute_id(cm_attr::REQ);
    Req::new_unchecked(&mut m[mad::LEN..mad::MAD_LEN]).set_service_id(SERVICE);
    d
}

fn datagram(qpn: u32, tag: u8) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    b[0] = 0x04;
    b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    b[12] = tag;
    b
}

/// Waits up to `wait` for a datagram on the non-blocking `s`.
fn recv_within(s: &UdpSocket, wait: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 512];
    loop {
        match s.recv(&mut buf) {
            Ok(n) => return Some(buf[..n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("recv: {e}"),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Attaches the registry's program for `addr` through `s`.
fn attach(l: &uroce_socket::host::Locked<'_>, s: &UdpSocket, addr: SocketAddr) {
    let table = l.table(addr).expect("a certain order");
    steer::attach(s, &table.program()).expect("SO_ATTACH_REUSEPORT_CBPF (Linux 4.5+)");
}

/// The child's part (does nothing in an ordinary test run): joins the registry named by
/// `UROCE_HOST_DIR`, binds a member socket to the group in `UROCE_HOST_TEST_CHILD`,
/// listens on [`SERVICE`], attaches the new program, says `ready <slot>`, and waits to be
/// killed (at most 30 s).
#[test]
fn child_member() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let addr: SocketAddr = addr.parse().expect("address");
    assert!(std::env::var_os(HOST_DIR_ENV).is_some());
    let reg = Registry::open_default(QpnLayout::default()).expect("registry");
    let mut l = reg.lock().expect("lock");
    let slot = l.join().expect("join");
    let s = steer::bind_member(addr).expect("bind");
    l.joined_group(slot, addr).expect("group");
    l.listen(slot, SERVICE).expect("listen");
    attach(&l, &s, addr);
    l.commit().expect("commit");
    println!("ready {slot}");
    for _ in 0..300 {
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_killed_member_is_reaped_and_steering_recovers() {
    let dir = std::env::temp_dir().join(format!("uroce-host-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    let layout = QpnLayout::default();

    // This process: the first member, on an ephemeral port.
    let mut l = reg.lock().unwrap();
    let mine = l.join().unwrap();
    let me = steer::bind_member(SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 79, 18)),
        0,
    ))
    .unwrap();
    me.set_nonblocking(true).unwrap();
    let addr = me.local_addr().unwrap();
    l.joined_group(mine, addr).unwrap();
    attach(&l, &me, addr);
    l.commit().unwrap();

    // The child joins next to it.
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_member", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, addr.to_string())
        .env(HOST_DIR_ENV, &dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut theirs = None;
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    // Bounded: the child prints `ready` or exits (EOF) within its 30 s.
    while out.read_line(&mut line).unwrap_or(0) > 0 {
        // libtest prints `test child_member ... ` before it on the same line.
        if let Some((_, s)) = line.split_once("ready ") {
            theirs = Some(s.trim().parse::<u16>().unwrap());
            break;
        }
        line.clear();
    }
    let theirs = theirs.expect("the child joined");
    assert_ne!(theirs, mine);
    let members = reg.list().unwrap();
    assert_eq!(members.len(), 2);
    assert!(members
        .iter()
        .any(|m| m.pid == child.id() && m.slot == theirs));
    let state = reg.read().unwrap();
    assert_eq!(state.groups[&addr].order.slots(), &[mine, theirs]);

    assert_eq!(state.listeners.get(&SERVICE), Some(&theirs));

    // Steered across processes: the child's QPNs and the REQs for its service reach the
    // child, not this process.
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(&datagram(layout.qpn(theirs, 5).unwrap(), 1), addr)
        .unwrap();
    tx.send_to(&req(11), addr).unwrap();
    tx.send_to(&datagram(layout.qpn(mine, 5).unwrap(), 2), addr)
        .unwrap();
    assert_eq!(
        recv_within(&me, Duration::from_secs(5)).map(|d| d[12]),
        Some(2)
    );
    assert_eq!(recv_within(&me, Duration::from_millis(100)), None);

    // SIGKILL. The child is a zombie until waited for: already dead to the registry, and
    // its socket closed by the kernel as it exited.
    child.kill().unwrap();
    let member = *members.iter().find(|m| m.slot == theirs).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while member.is_alive() {
        assert!(Instant::now() < deadline, "the killed child still runs");
        std::thread::sleep(Duration::from_millis(10));
    }
    // A REQ for its service before anyone reaps: the stale program names index 1, past
    // the end of the group now, so the kernel hashes it to a member, this process, whose
    // CM has no listener for it and would reject it.
    tx.send_to(&req(12), addr).unwrap();
    assert_eq!(
        recv_within(&me, Duration::from_secs(5)).map(|d| d[12]),
        Some(12)
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let reaped = loop {
        let mut l = reg.lock().unwrap();
        let reaped = l.reap();
        if !reaped.is_empty() {
            assert_eq!(l.state().groups[&addr].order.slots(), &[mine]);
            assert!(l.state().groups[&addr].certain);
            assert!(l.state().listeners.is_empty(), "its listener went with it");
            attach(&l, &me, addr);
            l.commit().unwrap();
            break reaped;
        }
        drop(l);
        assert!(
            Instant::now() < deadline,
            "the killed child was never reaped"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].slot, theirs);
    child.wait().unwrap();
    let state = reg.read().unwrap();
    assert_eq!(state.members.len(), 1);
    assert!(state.freed.contains_key(&theirs));

    // Its QPNs now reach the designated member, this process; so do its own, and the
    // REQs for the service it listened on (rejected there: nobody listens).
    for (slot, tag) in [(theirs, 3), (mine, 4)] {
        tx.send_to(&datagram(layout.qpn(slot, 9).unwrap(), tag), addr)
            .unwrap();
        assert_eq!(
            recv_within(&me, Duration::from_secs(5)).map(|d| d[12]),
            Some(tag)
        );
    }
    tx.send_to(&req(13), addr).unwrap();
    assert_eq!(
        recv_within(&me, Duration::from_secs(5)).map(|d| d[12]),
        Some(13)
    );
    // Reaping again finds nothing; a second reap of a gone (waited) process is a no-op.
    let mut l = reg.lock().unwrap();
    assert!(l.reap().is_empty());
    l.leave(mine).unwrap();
    l.commit().unwrap();
    assert!(reg.list().unwrap().is_empty());
    assert!(reg.read().unwrap().groups.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The lock excludes other holders: a second process waiting for it gets it only when
/// the first lets go (here: two threads with their own descriptors, which `flock` treats
/// like two processes).
#[test]
fn the_lock_serialises_holders() {
    let dir = std::env::temp_dir().join(format!("uroce-host-lock-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    let l = reg.lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reg2 = reg.clone();
    let t = std::thread::spawn(move || {
        let mut l = reg2.lock().unwrap();
        let slot = l.join().unwrap();
        l.commit().unwrap();
        tx.send(slot).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "not while held"
    );
    drop(l);
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
    t.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
