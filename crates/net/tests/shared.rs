//! Shared devices (`NetConfig::shared`): several devices on one address, each a member of
//! the host-wide device (its own `SO_REUSEPORT` socket on `address:4791`, a slot in the
//! per-host registry, QPNs in its slot, the kernel steering each datagram to the member
//! of its destination QP).
//!
//! * two members in this process carry RC traffic both ways and a UD datagram between
//!   them; a third and a fourth join, the third leaves from the middle of the group (the
//!   last member moves into its index), the fourth leaves; traffic stays right;
//! * a member in a child process (this test binary again, running [`child_member`]) is
//!   killed with SIGKILL between two members of this process: their traffic goes on (RC
//!   retransmits what a stale program misdelivered) and the child's slot is reaped;
//! * QP1: MADs of a class other than CM to the address reach the designated member (the
//!   lowest slot) only; every member's GSI QP sends; a datagram for a slot nobody holds
//!   reaches the designated member too, which drops and counts it; a CM MAD of an ID
//!   nobody owns reaches the designated member, which keeps it, and one a stale program
//!   delivers to the other member is dropped and counted there;
//! * the CM of members that are not the designated one: the second of three members
//!   connects (REQ/REP/RTU) to a service the third listens on, data flows over the
//!   connected RC QPs, the connection is closed (DREQ/DREP), and the designated member's
//!   CM sees none of it (the kernel steers by service ID and communication ID; its own
//!   listen on the same service is refused by the registry and counted); once the
//!   listener's device is closed, a REQ for its service is rejected by the designated
//!   member (invalid service ID) rather than lost.
//!
//! * two members in child processes killed at once, which leaves the kernel's order of
//!   the group unknown to the registry: the members probe, the order is certain again
//!   with a program attached, and nothing is misdelivered after;
//! * a device opened and closed again and again on a host with one free slot: each open
//!   gets that slot at once (a clean leave needs no quarantine) and carries on with the
//!   QPNs and communication IDs where the last one stopped.
//! * XRC between members: requests reach the member of the XRC SRQ they name (or of
//!   their target QP, for SRQ numbers of slot 0);
//! * XRC domains opened on a file (the device's domains file): references of two members
//!   and of a child process (this test binary again, running [`child_xrc_domain`]),
//!   `O_CREAT`/`O_EXCL` decided host-wide, a target QP numbered from the reserved top
//!   slot receiving XRC traffic, the child killed without closing and reaped, the last
//!   close destroying the domain; a device of another address (127.0.81.10) has domains
//!   of its own.
//!
//! Each test has its own address (127.0.81.x) and its own registry directory, given
//! through the configuration (the tests run in parallel threads of one process).

#[path = "support/pair.rs"]
mod pair;

use std::io::{BufRead as _, BufReader};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pair::{connect_qps, pattern, wait, ConnectOpts, Side, SideConfig};
use uroce_net::xrc::{Closed, DomainId, DomainOpenError};
use uroce_net::{seal_for, CmEventSink, CmService, NetConfig, NetDevice};
use uroce_proto::cm::{AcceptParams, CmEvent, ConnId, ConnectParams};
use uroce_socket::host::{Registry, HOST_DIR_ENV};
use uroce_socket::steer::QpnLayout;
use uroce_socket::xrcd::target_qpns;
use uroce_verbs::{
    AhAttr, Qp, QpCap, QpInitAttr, QpType, RcConnect, RecvWr, SendWr, SrqInitAttr, UdDest,
    WcStatus, WorkCompletion,
};
use uroce_wire::cm::rdma_cm::{gid_of, PortSpace};
use uroce_wire::cm::{rej_reason, PathRepr};
use uroce_wire::opcode::op;
use uroce_wire::{bth, PacketRepr, Psn};

const LIMIT: Duration = Duration::from_secs(20);
/// Set (to the address) only in the child process.
const CHILD_ENV: &str = "UROCE_SHARED_TEST_CHILD";
/// Set (to `<address> <file>`) only in the child process of the XRC domains test.
const XRC_CHILD_ENV: &str = "UROCE_SHARED_TEST_XRC_CHILD";
const QKEY: u32 = 0x1122_3344;
/// A UD receive buffer starts with room for the GRH.
const GRH: usize = 40;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uroce-shared-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn shared_config(addr: IpAddr, name: &str, dir: Option<PathBuf>) -> NetConfig {
    let mut c = NetConfig::new(addr);
    c.name = name.to_owned();
    c.faults = None;
    c.shared = true;
    c.host_dir = dir;
    c.publish_stats = false;
    c
}

/// A shared device on `addr` with its verbs objects.
fn member(addr: &str, name: &str, dir: &Path) -> Side {
    let cfg = SideConfig::new(addr, name);
    let dev = NetDevice::open(shared_config(cfg.addr, name, Some(dir.to_path_buf())))
        .unwrap_or_else(|e| panic!("open shared device {name} on {addr}: {e}"));
    let side = Side::on(dev, &cfg);
    let slot = side.dev.host_slot().expect("a member");
    assert_eq!(
        QpnLayout::default().slot_of(side.qp.qp_num()),
        slot,
        "{name}: QPN {:#x} outside its slot {slot}",
        side.qp.qp_num()
    );
    assert_eq!(
        side.dev.local_addr(),
        SocketAddr::new(cfg.addr, 4791),
        "{name}: every member is bound to address:4791"
    );
    side
}

/// Connection options for these tests: an ACK timeout of 67 ms (code 14; 8 tries, about
/// half a second) rather than the default 4 ms, so that a process kept off the CPU for a
/// few tens of milliseconds on a loaded machine is not taken for a lost path; what the
/// tests check (steering, reaps, probes) does not depend on it.
fn patient() -> ConnectOpts {
    ConnectOpts {
        timeout: 14,
        ..ConnectOpts::default()
    }
}

/// [`member`] with SRQ numbers of its slot (`NetConfig::xrc_srq_slots`).
fn slot_srq_member(addr: &str, name: &str, dir: &Path) -> Side {
    let cfg = SideConfig::new(addr, name);
    let mut net = shared_config(cfg.addr, name, Some(dir.to_path_buf()));
    net.xrc_srq_slots = true;
    Side::on(
        NetDevice::open(net).unwrap_or_else(|e| panic!("open {name}: {e}")),
        &cfg,
    )
}

/// `from`'s QP `qf` sends `len` bytes (pattern `key`) to `to`'s QP `qt`, which checks
/// them. Both sides' CQs are polled until the completions arrive (bounded).
fn send_and_check(from: &Side, qf: &Qp, to: &Side, qt: &Qp, key: u64, what: &str) {
    let len = 3000; // three packets at MTU 1024
    let data = pattern(key, len);
    from.mr.block().copy_in(0, &data).expect("fill");
    to.mr.block().copy_in(8192, &vec![0; len]).expect("clear");
    qt.post_recv(RecvWr::new(key, vec![to.sge(8192, len)]))
        .expect("post recv");
    qf.post_send(SendWr::send(key, vec![from.sge(0, len)]))
        .expect("post send");
    let s = wait(&from.send_cq, 1, LIMIT, what);
    assert_eq!(
        (s[0].wr_id, s[0].status),
        (key, WcStatus::Success),
        "{what}"
    );
    let r = wait(&to.recv_cq, 1, LIMIT, what);
    assert_eq!(
        (r[0].wr_id, r[0].status),
        (key, WcStatus::Success),
        "{what}"
    );
    let mut got = vec![0; len];
    to.mr.block().copy_out(8192, &mut got).expect("read");
    assert!(got == data, "{what}: data differs");
}

fn both_ways(a: &Side, qa: &Qp, b: &Side, qb: &Qp, key: u64, what: &str) {
    send_and_check(a, qa, b, qb, key, &format!("{what}: there"));
    send_and_check(b, qb, a, qa, key + 1, &format!("{what}: back"));
}

fn ud_qp(s: &Side) -> Qp {
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp =
        s.pd.create_qp(&QpInitAttr::new(QpType::Ud, &s.send_cq, &s.recv_cq, cap))
            .expect("ud qp");
    qp.activate_ud(QKEY).expect("activate ud");
    qp
}

fn one_completion(cq: &uroce_verbs::Cq, what: &str) -> WorkCompletion {
    let mut w = wait(cq, 1, LIMIT, what);
    w.remove(0)
}

#[test]
fn members_in_one_process_carry_rc_and_ud_while_others_join_and_leave() {
    let dir = scratch("one-process");
    let addr = "127.0.81.1";
    let a = member(addr, "sha", &dir);
    let b = member(addr, "shb", &dir);
    let (sa, sb) = (a.dev.host_slot().unwrap(), b.dev.host_slot().unwrap());
    assert_ne!(sa, sb);
    let o = patient();
    connect_qps(&a, &a.qp, &b, &b.qp, &o);
    both_ways(&a, &a.qp, &b, &b.qp, 10, "A-B");

    // A UD datagram from A to B over the same address.
    let (ua, ub) = (ud_qp(&a), ud_qp(&b));
    let len = 200;
    let data = pattern(77, len);
    a.mr.block().copy_in(0, &data).expect("fill");
    ub.post_recv(RecvWr::new(5, vec![b.sge(16384, GRH + len)]))
        .expect("ud recv");
    let ah =
        a.pd.create_ah(&AhAttr::to_ip(b.ip()))
            .expect("address handle");
    let mut wr = SendWr::send(6, vec![a.sge(0, len)]);
    wr.ud = Some(UdDest {
        ah: ah.reference(),
        remote_qpn: ub.qp_num(),
        remote_qkey: QKEY,
    });
    ua.post_send(wr).expect("ud send");
    let s = one_completion(&a.send_cq, "UD send");
    assert_eq!((s.wr_id, s.status), (6, WcStatus::Success));
    let r = one_completion(&b.recv_cq, "UD receive");
    assert_eq!((r.wr_id, r.status), (5, WcStatus::Success));
    assert_eq!(r.src_qp, ua.qp_num());
    let mut got = vec![0; len];
    b.mr.block().copy_out(16384 + GRH, &mut got).expect("read");
    assert!(got == data, "UD data differs");

    // C and D join: order [A, B, C, D]. C leaves from the middle (D moves into its index,
    // with the program C attached before its close); then D leaves.
    let c = member(addr, "shc", &dir);
    let d = member(addr, "shd", &dir);
    let (qac, qad) = (a.add_qp(), a.add_qp());
    connect_qps(&a, &qac, &c, &c.qp, &o);
    connect_qps(&a, &qad, &d, &d.qp, &o);
    both_ways(&a, &qac, &c, &c.qp, 20, "A-C");
    both_ways(&a, &qad, &d, &d.qp, 30, "A-D");
    both_ways(&a, &a.qp, &b, &b.qp, 40, "A-B with four members");
    let reg = Registry::open(&dir, QpnLayout::default()).expect("registry");
    assert_eq!(reg.list().expect("list").len(), 4);
    drop(qac);
    c.close();
    let group: SocketAddr = SocketAddr::new(addr.parse().unwrap(), 4791);
    let sd = d.dev.host_slot().unwrap();
    assert_eq!(
        reg.read().expect("read").groups[&group].order.slots(),
        &[sa, sb, sd]
    );
    both_ways(&a, &qad, &d, &d.qp, 50, "A-D after C left");
    both_ways(&a, &a.qp, &b, &b.qp, 60, "A-B after C left");
    drop(qad);
    d.close();
    both_ways(&a, &a.qp, &b, &b.qp, 70, "A-B after D left");
    assert_eq!(reg.list().expect("list").len(), 2);

    // No datagram ever reached the wrong member of this process.
    for (s, name) in [(&a, "A"), (&b, "B")] {
        assert_eq!(s.dev.counters().dropped_foreign_slot, 0, "{name}");
    }
    drop((ua, ub, ah));
    a.close();
    b.close();
    let state = reg.read().expect("read");
    assert!(state.members.is_empty() && state.groups.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// XRC between members of one address: the initiator in A, the domain with its target
/// QP and XRC SRQ in B, whose SRQ numbers are of its slot (`NetConfig::xrc_srq_slots`:
/// the kernel steers an XRC request by the SRQ its XRCETH names); then a domain in C,
/// whose SRQ numbers are of slot 0 (the default: requests go by the target QP). The
/// requests reach the SRQ's member, the ACKs the initiator's, and no member sees a
/// datagram of another's slot.
#[test]
fn xrc_requests_reach_the_member_of_their_srq() {
    let dir = scratch("xrc");
    let addr = "127.0.81.6";
    let a = member(addr, "xra", &dir);
    let b = slot_srq_member(addr, "xrb", &dir);
    let c = member(addr, "xrc", &dir);
    // A is the designated member (the lowest slot), which gets whatever the program does
    // not steer: the domains are in B and C.
    let slot = |s: &Side| s.dev.host_slot().unwrap();
    assert!(slot(&a) < slot(&b) && slot(&a) < slot(&c));
    xrc_between(&a, &b, true, 0);
    xrc_between(&a, &c, false, 10);
    for (s, name) in [(&a, "A"), (&b, "B"), (&c, "C")] {
        assert_eq!(s.dev.counters().dropped_foreign_slot, 0, "{name}");
    }
    a.close();
    b.close();
    c.close();
    let _ = std::fs::remove_dir_all(&dir);
}

/// An XRC_SEND QP of `ini` sends four messages into an XRC SRQ of a domain of `tgt`
/// through a target QP of that domain; the SRQ's number is of `tgt`'s slot when
/// `slotted`, else of slot 0.
fn xrc_between(ini: &Side, tgt: &Side, slotted: bool, keys: u64) {
    let xrcd = tgt.dev.context().alloc_xrcd().expect("xrcd");
    xrc_into(ini, tgt, &xrcd, None, slotted, keys);
}

/// [`xrc_between`] into domain `xrcd` of `tgt`, through a target QP numbered `number`
/// (a host-wide number of the domain's) or, when `None`, one of `tgt`'s slot.
fn xrc_into(
    ini: &Side,
    tgt: &Side,
    xrcd: &uroce_verbs::Xrcd,
    number: Option<u32>,
    slotted: bool,
    keys: u64,
) {
    let layout = QpnLayout::default();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: 0,
    };
    let mut attr = QpInitAttr::new(QpType::XrcSend, &ini.send_cq, &ini.send_cq, cap);
    attr.recv_cq = None;
    let iqp = ini.pd.create_qp(&attr).expect("xrc send qp");
    let tqp = match number {
        Some(n) => xrcd.create_qp_numbered(n).expect("numbered target qp"),
        None => xrcd.create_qp().expect("target qp"),
    };
    let srq = xrcd
        .create_srq(
            &tgt.pd,
            &tgt.recv_cq,
            &SrqInitAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .expect("xrc srq");
    let tslot = tgt.dev.host_slot().unwrap();
    assert_eq!(layout.slot_of(iqp.qp_num()), ini.dev.host_slot().unwrap());
    match number {
        Some(n) => assert_eq!(tqp.qp_num(), n),
        None => assert_eq!(layout.slot_of(tqp.qp_num()), tslot),
    }
    let want = if slotted { tslot } else { 0 };
    assert_eq!(layout.slot_of(srq.srq_num()), want, "SRQ number's slot");
    tqp.connect_rc(&RcConnect::new(ini.ip(), iqp.qp_num()))
        .expect("target to RTR");
    iqp.connect_rc(&RcConnect::new(tgt.ip(), tqp.qp_num()))
        .expect("initiator to RTS");
    for key in keys..keys + 4 {
        let len = 2500; // three packets at MTU 1024
        let data = pattern(key, len);
        ini.mr.block().copy_in(0, &data).expect("fill");
        srq.post_recv(RecvWr::new(key, vec![tgt.sge(8192, len)]))
            .expect("post recv");
        let mut wr = SendWr::send(key, vec![ini.sge(0, len)]);
        wr.xrc_remote_srqn = srq.srq_num();
        iqp.post_send(wr).expect("post send");
        let s = one_completion(&ini.send_cq, "XRC send");
        assert_eq!((s.wr_id, s.status), (key, WcStatus::Success));
        let r = one_completion(&tgt.recv_cq, "XRC receive");
        assert_eq!((r.wr_id, r.status), (key, WcStatus::Success));
        let mut got = vec![0; len];
        tgt.mr.block().copy_out(8192, &mut got).expect("read");
        assert!(got == data, "XRC data differs");
    }
    drop((iqp, srq));
    tqp.destroy()
        .map_err(|(_, e)| e)
        .expect("destroy target qp");
}

/// The child's part (does nothing in an ordinary test run): opens a shared device on the
/// address in `UROCE_SHARED_TEST_CHILD`, with the registry of `UROCE_HOST_DIR`, says
/// `ready <slot>`, and waits to be killed (at most 30 s).
#[test]
fn child_member() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    assert!(std::env::var_os(HOST_DIR_ENV).is_some());
    let dev = NetDevice::open(shared_config(
        addr.parse().expect("address"),
        "shchild",
        None,
    ))
    .expect("child device");
    println!("ready {}", dev.host_slot().expect("a member"));
    for _ in 0..300 {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The child's part of the XRC domains test (does nothing in an ordinary test run): opens
/// a shared device with slot SRQ numbers on the address in `UROCE_SHARED_TEST_XRC_CHILD`,
/// opens the domain of the file named there (without `O_CREAT`: the parent holds it),
/// says `ready <slot>`, and waits to be killed (at most 30 s) without closing.
#[test]
fn child_xrc_domain() {
    let Ok(v) = std::env::var(XRC_CHILD_ENV) else {
        return;
    };
    let (addr, file) = v.split_once(' ').expect("address and file");
    let mut cfg = shared_config(addr.parse().expect("address"), "xdchild", None);
    cfg.xrc_srq_slots = true;
    let dev = NetDevice::open(cfg).expect("child device");
    let f = std::fs::File::open(file).expect("domain file");
    let id = DomainId::of_file(&f).expect("fstat");
    let r = dev.open_xrc_domain(id, false, false).expect("open domain");
    println!("ready {}", dev.host_slot().expect("a member"));
    for _ in 0..300 {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(r);
}

/// XRC domains opened on a file across processes (`NetDevice::open_xrc_domain`, the
/// device's domains file): references of this process and of a child process are recorded,
/// `O_CREAT`/`O_EXCL` are decided host-wide, a target QP numbered from the domain's
/// host-wide allotment (the reserved top slot) receives XRC traffic steered by its SRQ's
/// slot, the child killed without closing is reaped, and the last close destroys the
/// domain with its target QP numbers.
#[test]
fn xrc_domains_on_a_file_are_counted_host_wide_and_number_target_qps() {
    let dir = scratch("xrcd");
    let addr = "127.0.81.9";
    let a = member(addr, "xda", &dir);
    let b = slot_srq_member(addr, "xdb", &dir);
    assert!(b.dev.xrc_srq_slots() && !a.dev.xrc_srq_slots());
    let file = dir.join("domain");
    std::fs::write(&file, b"").expect("domain file");
    let id = DomainId::of_file(&std::fs::File::open(&file).expect("open")).expect("fstat");
    let domains = b
        .dev
        .xrc_domains()
        .expect("a shared device has the domains file");
    let refs = |who: u32| -> Vec<u32> {
        domains
            .read()
            .expect("read")
            .domains
            .get(&id)
            .map_or(vec![], |d| {
                d.refs
                    .iter()
                    .filter(|r| r.pid == who)
                    .map(|r| r.count)
                    .collect()
            })
    };
    let me = std::process::id();

    assert!(matches!(
        b.dev.open_xrc_domain(id, false, false),
        Err(DomainOpenError::Absent(_))
    ));
    let r1 = b
        .dev
        .open_xrc_domain(id, true, true)
        .expect("create")
        .expect("shared");
    assert!(matches!(
        b.dev.open_xrc_domain(id, true, true),
        Err(DomainOpenError::Exists(_))
    ));
    // Another device of the host (another member) sees the same domain.
    let r2 = a
        .dev
        .open_xrc_domain(id, false, false)
        .expect("open")
        .expect("shared");
    assert_eq!(refs(me), vec![2]);
    assert!(r1.numbers_target_qps() && !r2.numbers_target_qps());
    // A device of another address has domains of its own (as the kernel's are per
    // device): O_EXCL succeeds there.
    let other = NetDevice::open(shared_config(
        "127.0.81.10".parse().unwrap(),
        "xdo",
        Some(dir.clone()),
    ))
    .expect("open xdo");
    let r3 = other
        .open_xrc_domain(id, true, true)
        .expect("another device's domain")
        .expect("shared");
    assert_ne!(other.xrc_domains().unwrap().path(), domains.path());
    drop(r3);
    other.close().expect("close xdo");
    assert_eq!(r2.alloc_target_qpn().expect("alloc"), None);

    // A target QP numbered host-wide, in B's domain, receives from A: the request is
    // steered by the slot of the SRQ it names.
    let qpn = r1.alloc_target_qpn().expect("alloc").expect("numbered");
    let layout = QpnLayout::default();
    assert!(target_qpns(layout).contains(&qpn));
    assert!(!layout.is_member_slot(layout.slot_of(qpn)));
    let xrcd = b.dev.context().alloc_xrcd().expect("xrcd");
    xrc_into(&a, &b, &xrcd, Some(qpn), true, 20);
    assert!(r1.release_target_qpn(qpn).expect("release"));
    assert!(!domains.read().expect("read").holds(qpn));
    drop(xrcd);

    // A child process opens the domain too, and is killed without closing it.
    let (mut child, _) = ready_child(
        "child_xrc_domain",
        (XRC_CHILD_ENV, &format!("{addr} {}", file.display())),
        &dir,
    );
    let cpid = child.id();
    assert_eq!(refs(cpid), vec![1]);
    let kept = r1.alloc_target_qpn().expect("alloc").expect("numbered");
    child.kill().unwrap();
    child.wait().unwrap();
    // The next change of the file reaps the dead child's reference.
    r2.close().expect("close");
    assert_eq!((refs(cpid), refs(me)), (vec![], vec![1]));
    assert!(domains.read().expect("read").holds(kept));
    // The last reference destroys the domain and gives its target QPs back.
    let closed = r1.close().expect("close");
    assert_eq!(
        closed,
        Closed {
            still_held: false,
            destroyed: vec![kept]
        }
    );
    assert!(domains.read().expect("read").domains.is_empty());
    assert!(matches!(
        b.dev.open_xrc_domain(id, false, false),
        Err(DomainOpenError::Absent(_))
    ));
    // A reference dropped without `close` is closed too.
    drop(b.dev.open_xrc_domain(id, true, false).expect("create"));
    assert!(domains.read().expect("read").domains.is_empty());
    assert_eq!(a.dev.counters().dropped_foreign_slot, 0);
    assert_eq!(b.dev.counters().dropped_foreign_slot, 0);
    a.close();
    b.close();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A child process (this test binary running the test `name`, with the variable `env`
/// set and the registry in `dir`) once it printed `ready <what>`: the child and `<what>`.
fn ready_child(name: &str, env: (&str, &str), dir: &Path) -> (std::process::Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(env.0, env.1)
        .env(HOST_DIR_ENV, dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    // Bounded: the child prints `ready` or exits (EOF) within its 30 s.
    while out.read_line(&mut line).unwrap_or(0) > 0 {
        if let Some((_, what)) = line.split_once("ready ") {
            let what = what.trim().to_owned();
            return (child, what);
        }
        line.clear();
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the child {name} did not get ready");
}

/// A member in a child process ([`child_member`]) on `addr` with the registry in `dir`,
/// and its slot once it joined.
fn child_process_member(addr: &str, dir: &Path) -> (std::process::Child, u16) {
    let (child, slot) = ready_child("child_member", (CHILD_ENV, addr), dir);
    (child, slot.parse().expect("the child's slot"))
}

#[test]
fn a_killed_member_in_another_process_is_reaped_and_traffic_goes_on() {
    let dir = scratch("killed");
    let addr = "127.0.81.2";
    let a = member(addr, "ka", &dir);
    // The child joins next: order [A, child, B].
    let (mut child, theirs) = child_process_member(addr, &dir);
    let b = member(addr, "kb", &dir);
    let reg = Registry::open(&dir, QpnLayout::default()).expect("registry");
    let group = SocketAddr::new(addr.parse().unwrap(), 4791);
    let (sa, sb) = (a.dev.host_slot().unwrap(), b.dev.host_slot().unwrap());
    assert_eq!(
        reg.read().expect("read").groups[&group].order.slots(),
        &[sa, theirs, sb]
    );
    let o = patient();
    connect_qps(&a, &a.qp, &b, &b.qp, &o);
    both_ways(&a, &a.qp, &b, &b.qp, 10, "A-B next to the child");

    // SIGKILL: the kernel closes the child's socket and B moves into its index; until a
    // member reaps and attaches again, B's datagrams may reach A (dropped, counted, and
    // retransmitted by RC).
    child.kill().unwrap();
    child.wait().unwrap();
    both_ways(&a, &a.qp, &b, &b.qp, 20, "A-B after the kill");
    let deadline = Instant::now() + LIMIT;
    loop {
        let state = reg.read().expect("read");
        if state.members.len() == 2 {
            assert!(state.freed.contains_key(&theirs));
            assert_eq!(state.groups[&group].order.slots(), &[sa, sb]);
            assert!(state.groups[&group].certain);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the killed child was never reaped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    both_ways(&a, &a.qp, &b, &b.qp, 30, "A-B after the reap");
    a.close();
    b.close();
    assert!(reg.list().expect("list").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A MAD of a class other than CM (not steered by communication or service ID) with
/// transaction id `tid`.
/// A CM DREP (IBA vol 1 §12.6.12) whose RemoteCommID is `ours`: the steering program
/// sends it to the member of `ours`'s slot, or the designated member when nobody holds
/// that slot.
fn drep_mad(ours: u32) -> Vec<u8> {
    use uroce_wire::mad;
    let mut buf = vec![0u8; mad::MAD_LEN];
    let mut h = mad::Header::new_checked(&mut buf[..]).expect("header");
    h.set_base_version(mad::BASE_VERSION);
    h.set_mgmt_class(mad::MGMT_CLASS_CM);
    h.set_class_version(mad::CM_CLASS_VERSION);
    h.set_response_method(false, mad::METHOD_SEND);
    h.set_transaction_id(0x77);
    h.set_attribute_id(mad::cm_attr::DREP);
    // CM message: LocalCommID, then RemoteCommID.
    buf[mad::LEN..mad::LEN + 4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    buf[mad::LEN + 4..mad::LEN + 8].copy_from_slice(&ours.to_be_bytes());
    buf
}

fn perf_mad(tid: u64) -> Vec<u8> {
    use uroce_wire::mad;
    let mut buf = vec![0u8; mad::MAD_LEN];
    let mut h = mad::Header::new_checked(&mut buf[..]).expect("header");
    h.set_base_version(mad::BASE_VERSION);
    h.set_mgmt_class(0x04); // performance management
    h.set_class_version(1);
    h.set_response_method(false, mad::METHOD_SEND);
    h.set_transaction_id(tid);
    buf
}

#[test]
fn qp1_and_unowned_slots_go_to_the_designated_member_and_every_member_sends_mads() {
    let dir = scratch("gsi");
    let addr: IpAddr = "127.0.81.3".parse().unwrap();
    let a = NetDevice::open(shared_config(addr, "ga", Some(dir.clone()))).expect("A");
    let b = NetDevice::open(shared_config(addr, "gb", Some(dir.clone()))).expect("B");
    // A holds the lower slot: the designated member.
    assert!(a.host_slot() < b.host_slot());
    let mut pc = NetConfig::new("127.0.81.4".parse().unwrap());
    pc.faults = None;
    pc.publish_stats = false;
    let peer = NetDevice::open(pc).expect("peer");
    let wait = Duration::from_secs(5);
    let none = Duration::from_millis(100);

    // To the address's QP1: the designated member only.
    for tid in [1, 2, 3] {
        peer.gsi().send_mad(addr, 1, &perf_mad(tid)).expect("send");
        let got = a.gsi().recv_mad(wait).expect("recv").expect("at A");
        assert_eq!(got.mad, perf_mad(tid));
    }
    assert!(b.gsi().recv_mad(none).expect("recv").is_none());

    // From either member: leaves from that member's socket, with the shared address.
    for (tid, m) in [(10, &a), (11, &b)] {
        m.gsi()
            .send_mad(peer.local_addr().ip(), 1, &perf_mad(tid))
            .expect("send");
        let got = peer
            .gsi()
            .recv_mad(wait)
            .expect("recv")
            .expect("at the peer");
        assert_eq!((got.mad, got.src, got.src_qpn), (perf_mad(tid), addr, 1));
    }

    // A datagram for a QPN of a slot nobody holds (a member that is gone) reaches the
    // designated member, which drops and counts it (and reaps).
    let layout = QpnLayout::default();
    let nobody = (1..=layout.max_slot())
        .find(|s| Some(*s) != a.host_slot() && Some(*s) != b.host_slot())
        .unwrap();
    let pkt = PacketRepr::new(
        bth::Repr {
            opcode: op::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_cnt: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: layout.qpn(nobody, 7).unwrap(),
            ack_req: true,
            psn: Psn::new(0),
        },
        &[1, 2, 3, 4],
    );
    let mut bytes = vec![0u8; pkt.buffer_len()];
    pkt.emit(&mut bytes).expect("emit");
    let raw = UdpSocket::bind("127.0.81.4:0").expect("bind");
    let to = SocketAddr::new(addr, 4791);
    seal_for(raw.local_addr().unwrap(), to, &mut bytes).expect("seal");
    raw.send_to(&bytes, to).expect("send");
    let start = Instant::now();
    while a.counters().dropped_foreign_slot == 0 {
        assert!(start.elapsed() < LIMIT, "the datagram was not counted");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(a.counters().dropped_foreign_slot, 1);
    assert_eq!(b.counters().dropped_foreign_slot, 0);

    // A CM MAD of a connection of a slot nobody holds: the designated member's, which
    // keeps it (its CM would drop it as unmatched or answer a DREQ).
    let nobody_id = *layout.comm_ids(nobody).unwrap().start() | 5;
    peer.gsi()
        .send_mad(addr, 1, &drep_mad(nobody_id))
        .expect("send");
    let got = a.gsi().recv_mad(wait).expect("recv").expect("at A");
    assert_eq!(got.mad, drep_mad(nobody_id));
    assert!(b.gsi().recv_mad(none).expect("recv").is_none());
    assert_eq!(a.counters().dropped_foreign_slot, 1);

    // A stale program (here: one that sends everything to B, the second socket of the
    // group, attached through a third socket of the group) delivers A's CM MAD to B,
    // which drops and counts it, and attaches the right program again.
    let a_id = *layout.comm_ids(a.host_slot().unwrap()).unwrap().start() | 9;
    let stale = uroce_socket::steer::bind_member(SocketAddr::new(addr, 4791)).expect("bind");
    let everything_to_b = uroce_socket::steer::SteeringTable::new(layout, 1).program();
    uroce_socket::steer::attach(&stale, &everything_to_b).expect("attach");
    peer.gsi().send_mad(addr, 1, &drep_mad(a_id)).expect("send");
    let start = Instant::now();
    while b.counters().dropped_foreign_slot == 0 {
        assert!(start.elapsed() < LIMIT, "the MAD was not counted");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(b.gsi().recv_mad(none).expect("recv").is_none());
    // The third socket is the last of the group: its close moves nobody.
    drop(stale);
    let start = Instant::now();
    loop {
        peer.gsi().send_mad(addr, 1, &drep_mad(a_id)).expect("send");
        if a.gsi().recv_mad(none).expect("recv").is_some() {
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "B did not attach the right program again"
        );
    }
    assert_eq!(a.counters().dropped_foreign_slot, 1);
    drop((a, b, peer));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Forwards every CM event of a device.
struct Forward(Mutex<Sender<CmEvent>>);

impl CmEventSink for Forward {
    fn cm_event(&self, _service: &CmService, event: CmEvent) {
        let _ = self.0.lock().unwrap().send(event);
    }
}

/// The CM of `side`'s device, with its events sent to the returned receiver.
fn cm_of(side: &Side) -> (Arc<CmService>, Receiver<CmEvent>) {
    let cm = side.dev.cm().expect("cm").clone();
    let (tx, rx) = channel();
    cm.set_sink(Some(Arc::new(Forward(Mutex::new(tx)))));
    (cm, rx)
}

/// The first event of `rx` that `pick` takes (the others are skipped); panics after
/// [`LIMIT`].
fn event<T>(rx: &Receiver<CmEvent>, what: &str, mut pick: impl FnMut(CmEvent) -> Option<T>) -> T {
    let deadline = Instant::now() + LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) => {
                if let Some(t) = pick(e) {
                    return t;
                }
            }
            Err(_) => panic!("{what}: no such CM event within {LIMIT:?}"),
        }
    }
}

fn cm_connect_params(ip: IpAddr, service_id: u64, local_qpn: u32, psn: u32) -> ConnectParams {
    ConnectParams {
        remote: ip,
        service_id,
        local_qpn,
        starting_psn: psn,
        qkey: 0,
        responder_resources: 1,
        initiator_depth: 1,
        transport_service_type: 0,
        extended_transport_type: 0,
        path: PathRepr {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid_of(ip),
            remote_gid: gid_of(ip),
            hop_limit: 64,
            local_ack_timeout: 14,
            ..PathRepr::default()
        },
        pkey: 0xffff,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        // 4.096 µs × 2^16 ≈ 0.27 s per try.
        cm_response_timeout: 16,
        packet_life_time: 0,
        max_cm_retries: 5,
        srq: false,
        private_data: Vec::new(),
    }
}

#[test]
fn the_cm_of_members_that_are_not_designated_connects_and_disconnects() {
    const SERVICE: u64 = PortSpace::Tcp.service_id(7300);
    let dir = scratch("cm");
    let addr = "127.0.81.5";
    let ip: IpAddr = addr.parse().unwrap();
    let layout = QpnLayout::default();
    let first = member(addr, "shcm1", &dir);
    let active = member(addr, "shcm2", &dir);
    let passive = member(addr, "shcm3", &dir);
    let slots = [first.dev.host_slot(), active.dev.host_slot()];
    let (a_slot, p_slot) = (slots[1].unwrap(), passive.dev.host_slot().unwrap());
    assert!(
        slots[0].unwrap() < a_slot && a_slot < p_slot,
        "{slots:?} {p_slot}"
    );
    let (first_cm, first_rx) = cm_of(&first);
    let (a_cm, a_rx) = cm_of(&active);
    let (p_cm, p_rx) = cm_of(&passive);

    // The listener: its ID is in its slot's range, and the registry knows its service.
    let listener = p_cm
        .with_agent(|ag, _| ag.listen(SERVICE, None))
        .expect("listen");
    assert!(
        layout.comm_ids(p_slot).unwrap().contains(&listener.0),
        "listener ID {:#x} outside slot {p_slot}",
        listener.0
    );
    let registry = Registry::open(&dir, layout).expect("registry");
    assert_eq!(
        registry.read().expect("read").listeners.get(&SERVICE),
        Some(&p_slot),
        "the listener is recorded"
    );
    // Another member's CM listening on the same service is not recorded (counted): REQs
    // keep going to the first listener.
    let second = first_cm
        .with_agent(|ag, _| ag.listen(SERVICE, None))
        .expect("listen in the agent");
    assert_eq!(first.dev.counters().listen_refused, 1);
    assert_eq!(passive.dev.counters().listen_refused, 0);
    assert_eq!(
        registry.read().expect("read").listeners.get(&SERVICE),
        Some(&p_slot)
    );
    first_cm
        .with_agent(|ag, _| ag.stop_listening(second))
        .expect("stop listening");
    assert_eq!(
        registry.read().expect("read").listeners.get(&SERVICE),
        Some(&p_slot),
        "a member that stops listening removes only its own record"
    );

    // REQ (steered by service ID) → REP (by the active side's communication ID) → RTU.
    let (qa, qp) = (active.qp.qp_num(), passive.qp.qp_num());
    let o = patient();
    let req = cm_connect_params(ip, SERVICE, qa, o.start_psn);
    let a_id: ConnId = a_cm
        .with_agent(|ag, now| ag.connect(now, &req))
        .expect("connect");
    assert!(
        layout.comm_ids(a_slot).unwrap().contains(&a_id.0),
        "connection ID {:#x} outside slot {a_slot}",
        a_id.0
    );
    let (p_id, peer_qpn) = event(&p_rx, "REQ at the listener", |e| match e {
        CmEvent::ReqReceived { id, req, .. } => Some((id, req.local_qpn)),
        _ => None,
    });
    assert_eq!(peer_qpn, qa);
    assert!(layout.comm_ids(p_slot).unwrap().contains(&p_id.0));
    let accept = AcceptParams {
        local_qpn: qp,
        starting_psn: o.start_psn,
        qkey: 0,
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 0,
        rnr_retry_count: 7,
        srq: false,
        private_data: Vec::new(),
    };
    p_cm.with_agent(|ag, now| ag.accept(now, p_id, &accept))
        .expect("accept");
    let rep_qpn = event(&a_rx, "REP at the active side", |e| match e {
        CmEvent::RepReceived { id, rep } if id == a_id => Some(rep.local_qpn),
        CmEvent::Rejected { reason, .. } => panic!("rejected: {reason}"),
        CmEvent::Unreachable { .. } => panic!("the REQ or REP was lost"),
        _ => None,
    });
    assert_eq!(rep_qpn, qp);
    connect_qps(&active, &active.qp, &passive, &passive.qp, &o);
    a_cm.with_agent(|ag, now| ag.establish(now, a_id))
        .expect("establish");
    event(&p_rx, "RTU at the passive side", |e| match e {
        CmEvent::Established { id } if id == p_id => Some(()),
        _ => None,
    });

    both_ways(
        &active,
        &active.qp,
        &passive,
        &passive.qp,
        0xC0,
        "over the CM's connection",
    );

    // DREQ (by the passive side's communication ID) → DREP (by the active side's).
    a_cm.with_agent(|ag, now| ag.disconnect(now, a_id, b""))
        .expect("disconnect");
    event(&p_rx, "DREQ at the passive side", |e| match e {
        CmEvent::DisconnectRequested { id } if id == p_id => Some(()),
        _ => None,
    });
    p_cm.with_agent(|ag, now| ag.disconnect(now, p_id, b""))
        .expect("answer the DREQ");
    event(&a_rx, "DREP at the active side", |e| match e {
        CmEvent::Disconnected { id } if id == a_id => Some(()),
        CmEvent::DisconnectTimeout { .. } => panic!("the DREQ or DREP was lost"),
        _ => None,
    });
    assert_eq!(
        first_cm.counters().mads_received,
        0,
        "the designated member's CM saw none of it"
    );
    assert!(first_rx.try_recv().is_err());

    // The listener's device closes: its service leaves the registry and the program, and
    // a REQ for it goes to the designated member, which rejects it.
    drop(p_cm);
    passive.close();
    assert_eq!(registry.read().expect("read").listeners.get(&SERVICE), None);
    let req = cm_connect_params(ip, SERVICE, active.add_qp().qp_num(), o.start_psn);
    let id = a_cm
        .with_agent(|ag, now| ag.connect(now, &req))
        .expect("connect again");
    let reason = event(
        &a_rx,
        "an answer to the REQ without listener",
        |e| match e {
            CmEvent::Rejected { id: i, reason, .. } if i == id => Some(reason),
            CmEvent::Unreachable { .. } => panic!("the REQ was lost"),
            _ => None,
        },
    );
    assert_eq!(reason, rej_reason::INVALID_SERVICE_ID);
    assert!(first_cm.counters().mads_received >= 1);
    drop((first_cm, a_cm));
    active.close();
    first.close();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_device_closed_cleanly_leaves_its_slot_to_the_next_at_once_numbering_carried_on() {
    let dir = scratch("resume");
    // Every slot but the last is held (by this process, alive throughout).
    let layout = QpnLayout::default();
    let registry = Registry::open(&dir, layout).expect("registry");
    let mut l = registry.lock().expect("lock");
    for _ in 1..layout.max_slot() {
        l.join().expect("join");
    }
    l.commit().expect("commit");
    let mut last: Option<(u16, u32, u32)> = None;
    for round in 0..4 {
        let side = member("127.0.81.8", &format!("resume{round}"), &dir);
        let slot = side.dev.host_slot().expect("a member");
        assert_eq!(slot, layout.max_slot(), "round {round}: the one free slot");
        let qpn = side.qp.qp_num();
        // The CM allots an ID (a listener), so its cursor moves.
        let cm = side.dev.cm().expect("cm");
        let first_id = cm.with_agent(|a, _| a.next_id());
        let listener = cm
            .with_agent(|a, _| a.listen(0x1000 + round, None))
            .expect("listen");
        assert_eq!(layout.comm_slot_of(listener.0), slot, "round {round}");
        if let Some((prev_slot, next_qpn, next_id)) = last {
            assert_eq!(prev_slot, slot);
            assert_eq!(qpn, next_qpn, "round {round}: QPNs carry on");
            assert_eq!(first_id, next_id, "round {round}: comm IDs carry on");
        }
        cm.with_agent(|a, _| a.stop_listening(listener))
            .expect("stop listening");
        last = Some((
            slot,
            side.dev.context().next_qpn(),
            cm.with_agent(|a, _| a.next_id()),
        ));
        drop(side);
        let r = registry.read().expect("read");
        assert!(!r.members.contains_key(&slot), "round {round}: left");
        assert!(r.resume.contains_key(&slot), "round {round}: resumable");
    }
}

#[test]
fn members_that_die_together_leave_an_order_that_probes_find_again() {
    let dir = scratch("probe");
    let addr = "127.0.81.7";
    // Order [X, Y, A, B] with X and Y in child processes: whether X's or Y's close came
    // first decides whether the kernel's order is [B, A] or [A, B]; the registry cannot
    // know (uncertain) and the members probe.
    let (mut x, sx) = child_process_member(addr, &dir);
    let (mut y, sy) = child_process_member(addr, &dir);
    let a = member(addr, "pa", &dir);
    let b = member(addr, "pb", &dir);
    let group = SocketAddr::new(addr.parse().unwrap(), 4791);
    let reg = Registry::open(&dir, QpnLayout::default()).expect("registry");
    let (sa, sb) = (a.dev.host_slot().unwrap(), b.dev.host_slot().unwrap());
    assert_eq!(
        reg.read().expect("read").groups[&group].order.slots(),
        &[sx, sy, sa, sb]
    );
    let o = patient();
    connect_qps(&a, &a.qp, &b, &b.qp, &o);
    both_ways(&a, &a.qp, &b, &b.qp, 10, "A-B next to X and Y");
    // Both killed before either is reaped (the members reap every second).
    x.kill().unwrap();
    y.kill().unwrap();
    x.wait().unwrap();
    y.wait().unwrap();
    let deadline = Instant::now() + LIMIT;
    loop {
        let state = reg.read().expect("read");
        let g = &state.groups[&group];
        if state.members.len() == 2 && g.certain {
            let mut slots = g.order.slots().to_vec();
            slots.sort_unstable();
            assert_eq!(slots, [sa.min(sb), sa.max(sb)]);
            let attached = state.attached[&group];
            if attached.generation == state.generation {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the order never became certain with a program: {state:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let probes = a.dev.counters().probes_sent + b.dev.counters().probes_sent;
    assert!(
        probes >= 2,
        "the order was found by probing ({probes} probes)"
    );
    // The program is the kernel's order: nothing misdelivered any more.
    let before = a.dev.counters().dropped_foreign_slot + b.dev.counters().dropped_foreign_slot;
    for round in 0..3 {
        both_ways(&a, &a.qp, &b, &b.qp, 20 + round, "A-B after the probes");
    }
    let after = a.dev.counters().dropped_foreign_slot + b.dev.counters().dropped_foreign_slot;
    assert_eq!(after, before, "datagrams misdelivered after the probes");
    a.close();
    b.close();
    let _ = std::fs::remove_dir_all(&dir);
}
