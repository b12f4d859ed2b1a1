//! Unit tests of the host registry.
use super::*;
use std::net::{IpAddr, Ipv4Addr};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uroce-host-unit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn proc_stat_reads_this_process() {
    let (state, start) = proc_stat(std::process::id()).expect("own stat");
    assert!(state == 'R' || state == 'S', "{state}");
    assert!(start > 0);
    let (_, start2, threads) = proc_stat_threads(std::process::id()).expect("own stat");
    assert_eq!(start2, start);
    let tasks = std::fs::read_dir("/proc/self/task").expect("tasks").count() as u64;
    assert!(
        threads >= 1 && threads.abs_diff(tasks) <= 2,
        "{threads} vs {tasks}"
    );
    assert_eq!(proc_stat(u32::MAX), None);
}

#[test]
fn text_round_trips_and_bad_text_is_refused() {
    let mut s = HostState::empty(QpnLayout::new(6).unwrap(), 4026531836);
    s.generation = 9;
    s.members.insert(
        3,
        Member {
            slot: 3,
            pid: 77,
            start_time: 123,
            joined_ms: 5,
        },
    );
    s.freed.insert(4, 99);
    s.resume.insert(
        4,
        Resume {
            qpn: 0x10_0203,
            comm_id: 0x1000_0007,
        },
    );
    s.groups.insert(
        "[::1]:4791".parse().unwrap(),
        GroupState {
            order: GroupOrder::from_slots(vec![3, 1]),
            certain: false,
            key: 8,
            found: [(1, 1)].into(),
        },
    );
    s.listeners.insert(0x0000_0000_0106_1C06, 3);
    s.listeners.insert(u64::MAX, 1);
    s.attached.insert(
        "[::1]:4791".parse().unwrap(),
        Attached {
            generation: 8,
            count: 3,
        },
    );
    let t = s.to_text();
    assert!(t.contains("listen 0x0000000001061c06 3\n"), "{t}");
    assert!(t.contains("attached [::1]:4791 8 3\n"), "{t}");
    assert!(t.contains("resume 4 1049091 268435463\n"), "{t}");
    assert!(
        t.contains("probing [::1]:4791 8\nfound [::1]:4791 1 1\n"),
        "{t}"
    );
    assert_eq!(HostState::parse(&t), Ok(s));
    for bad in [
        "",
        "uroce-host 3\n",
        "uroce-host 2\nmember 1 2\n",
        "uroce-host 2\nslot-bits 20\n",
        "uroce-host 2\ngroup 1.2.3.4 certain 1\n",
        "uroce-host 2\ngroup 1.2.3.4:1 maybe 1\n",
        "uroce-host 2\ngeneration 1 2\n",
        "uroce-host 2\nwhat 1\n",
        "uroce-host 2\nlisten 12 1\n",
        "uroce-host 2\nlisten 0x1\n",
        "uroce-host 2\nlisten 0xg 1\n",
        "uroce-host 2\nlisten 0x1 1 2\n",
        "uroce-host 2\nattached 1.2.3.4:1 1\n",
        "uroce-host 2\nattached 1.2.3.4 1 1\n",
        "uroce-host 2\nattached 1.2.3.4:1 1 1 1\n",
        "uroce-host 2\nresume 1 2\n",
        "uroce-host 2\nfound 1.2.3.4:1 0 1\n",
        "uroce-host 2\ngroup 1.2.3.4:1 certain 1\nprobing 1.2.3.4:1 3\n",
        "uroce-host 2\ngroup 1.2.3.4:1 uncertain 1\nfound 1.2.3.4:1 0\n",
        "uroce-host 2\nresume 1 2 4294967296\n",
    ] {
        assert!(HostState::parse(bad).is_err(), "{bad:?}");
    }
    // Another version's registry is named as such; abandoned (no member alive), it is
    // replaced.
    let (line, why) = HostState::parse("uroce-host 1\ngeneration 3\n").unwrap_err();
    assert_eq!(line, 1);
    assert!(why.contains("another version of uroce"), "{why}");
    let (_, me) = proc_stat(std::process::id()).unwrap();
    let live = format!("uroce-host 1\nmember 1 {} {me} 5\n", std::process::id());
    let dead = format!("uroce-host 1\nmember 1 {} {me} 5\n", u32::MAX);
    assert!(!other_version_abandoned(&live));
    assert!(other_version_abandoned(&dead));
    assert!(other_version_abandoned("uroce-host 1\ngeneration 3\n"));
    assert!(!other_version_abandoned(&format!("{MAGIC}\n")));
    assert!(!other_version_abandoned("something else\n"));
    let dir = scratch("other-version");
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    std::fs::write(reg.path(), &live).unwrap();
    assert!(matches!(
        reg.lock(),
        Err(HostError::Corrupt { line: 1, .. })
    ));
    std::fs::write(reg.path(), &dead).unwrap();
    let mut l = reg.lock().unwrap();
    assert!(l.state().members.is_empty());
    l.join().unwrap();
    l.commit().unwrap();
    assert!(std::fs::read_to_string(reg.path())
        .unwrap()
        .starts_with(MAGIC));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_clean_leave_is_resumed_at_once_and_a_reap_is_quarantined() {
    let dir = scratch("resume");
    let layout = QpnLayout::new(2).unwrap(); // slots 1 and 2, 2^22 QPNs each
    let reg = Registry::open(&dir, layout).unwrap();
    let mut l = reg.lock().unwrap();
    assert_eq!(l.join_resuming().unwrap(), (1, None));
    let r = Resume {
        qpn: layout.qpn(1, 77).unwrap(),
        comm_id: 0x4000_0009,
    };
    l.leave_resumable(1, r).unwrap();
    // Slot 2 was never used and comes first; then slot 1 resumes at once.
    assert_eq!(l.join_resuming().unwrap(), (2, None));
    assert_eq!(l.join_resuming().unwrap(), (1, Some(r)));
    assert!(l.state().resume.is_empty());
    // A resume outside the slot is not recorded: the slot is quarantined.
    let elsewhere = Resume {
        qpn: layout.qpn(2, 5).unwrap(),
        comm_id: 0,
    };
    l.leave_resumable(1, elsewhere).unwrap();
    assert!(matches!(
        l.join(),
        Err(HostError::Full {
            members: 1,
            quarantined: 1
        })
    ));
    assert_eq!(l.commit().unwrap(), 1);
    // Written and read back.
    let mut l = reg.lock().unwrap();
    l.leave_resumable(
        2,
        Resume {
            qpn: layout.qpn(2, 9).unwrap(),
            comm_id: 3,
        },
    )
    .unwrap();
    l.commit().unwrap();
    assert_eq!(
        reg.read().unwrap().resume.get(&2).map(|r| r.qpn),
        layout.qpn(2, 9)
    );
    // A member of the resumable slot that dies is reaped into quarantine.
    let mut l = reg.lock().unwrap();
    let (dead, resumed) = l.join_as(u32::MAX - 6, 1).unwrap();
    assert_eq!((dead, resumed.map(|r| r.comm_id)), (2, Some(3)));
    assert_eq!(l.reap().len(), 1);
    assert!(l.state().resume.is_empty());
    assert!(matches!(l.join(), Err(HostError::Full { .. })));
}

#[test]
fn join_prefers_unused_slots_and_honours_the_quarantine() {
    let dir = scratch("quarantine");
    let layout = QpnLayout::new(2).unwrap(); // slots 1 and 2
    let reg = Registry::open(&dir, layout).unwrap();
    let mut l = reg.lock().unwrap();
    assert_eq!(l.join().unwrap(), 1);
    l.leave(1).unwrap();
    // Slot 2 was never used: it comes before the just-freed 1.
    assert_eq!(l.join().unwrap(), 2);
    // Only slot 1 is free, and in quarantine.
    assert!(matches!(
        l.join(),
        Err(HostError::Full {
            members: 1,
            quarantined: 1
        })
    ));
    assert_eq!(l.commit().unwrap(), 1);
    // Without quarantine it comes back.
    let reg0 = Registry::open(&dir, layout)
        .unwrap()
        .with_quarantine(Duration::ZERO);
    let mut l = reg0.lock().unwrap();
    assert_eq!(l.join().unwrap(), 1);
    assert!(matches!(l.join(), Err(HostError::Full { .. })));
    drop(l); // discarded
    assert_eq!(reg.list().unwrap().len(), 1);
    // Another layout is refused.
    let other = Registry::open(&dir, QpnLayout::default()).unwrap();
    assert!(matches!(other.lock(), Err(HostError::Layout { .. })));
    // So is another PID namespace.
    let mut foreign = Registry::open(&dir, layout).unwrap();
    foreign.pid_ns ^= 1;
    assert!(matches!(
        foreign.lock(),
        Err(HostError::PidNamespace { .. })
    ));
    // The file is named after the network namespace.
    let name = reg
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let cookie = crate::sys::netns_cookie().expect("SO_NETNS_COOKIE (Linux 5.14+)");
    assert_eq!(
        name,
        format!("host-registry-net{}-c{cookie}", ns_inode("net"))
    );
    assert!(ns_inode("net") != 0 && ns_inode("pid") != 0);
    assert_eq!(reg.read().unwrap().pid_ns, ns_inode("pid"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attaches_are_counted_once_per_generation_without_a_new_one() {
    let dir = scratch("attached");
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    let a: SocketAddr = (IpAddr::V4(Ipv4Addr::new(127, 0, 77, 9)), 4791).into();
    let attached = |generation, count| Attached { generation, count };
    let ino = || std::fs::metadata(reg.path()).unwrap().ino();
    // A joiner attaches: the program of the generation it commits, counted.
    let mut l = reg.lock().unwrap();
    let s1 = l.join().unwrap();
    l.joined_group(s1, a).unwrap();
    l.attached(a);
    assert_eq!(l.commit().unwrap(), 1);
    assert_eq!(reg.read().unwrap().attached[&a], attached(1, 1));
    // Another member attaching the same program again: not counted, file untouched.
    let file = ino();
    let mut l = reg.lock().unwrap();
    l.attached(a);
    assert_eq!(l.commit().unwrap(), 1);
    assert_eq!(ino(), file);
    assert_eq!(reg.read().unwrap().attached[&a], attached(1, 1));
    // A change nobody attached (a reaper without a socket in the group): the record
    // stays behind the generation until a member attaches; that attach is written
    // without a new generation (which would make every member attach again).
    let mut l = reg.lock().unwrap();
    let s2 = l.join().unwrap();
    l.joined_group(s2, a).unwrap();
    assert_eq!(l.commit().unwrap(), 2);
    assert_eq!(reg.read().unwrap().attached[&a], attached(1, 1));
    let file = ino();
    let mut l = reg.lock().unwrap();
    l.attached(a);
    assert_eq!(l.commit().unwrap(), 2);
    assert_ne!(ino(), file);
    let state = reg.read().unwrap();
    assert_eq!((state.generation, state.attached[&a]), (2, attached(2, 2)));
    // An attach before a later change of the same lock is forgotten.
    let mut l = reg.lock().unwrap();
    l.attached(a);
    assert!(l.left_group(s2, a));
    l.leave(s2).unwrap();
    assert_eq!(l.commit().unwrap(), 3);
    assert_eq!(reg.read().unwrap().attached[&a], attached(2, 2));
    // Discarded changes note nothing.
    let mut l = reg.lock().unwrap();
    l.attached(a);
    drop(l);
    assert_eq!(reg.read().unwrap().attached[&a], attached(2, 2));
    // A group without sockets gets no record, and a group's record goes with its
    // last socket.
    let none: SocketAddr = (IpAddr::V4(Ipv4Addr::new(127, 0, 77, 10)), 4791).into();
    let mut l = reg.lock().unwrap();
    l.attached(none);
    assert_eq!(l.commit().unwrap(), 3);
    assert!(!reg.read().unwrap().attached.contains_key(&none));
    let mut l = reg.lock().unwrap();
    assert!(l.left_group(s1, a));
    l.attached(a);
    l.leave(s1).unwrap();
    assert_eq!(l.commit().unwrap(), 4);
    assert!(reg.read().unwrap().attached.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn groups_follow_binds_closes_and_leaves() {
    let dir = scratch("groups");
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    let a: SocketAddr = (IpAddr::V4(Ipv4Addr::new(127, 0, 77, 3)), 4791).into();
    let b: SocketAddr = "[::1]:4791".parse().unwrap();
    let mut l = reg.lock().unwrap();
    let slots: Vec<u16> = (0..4).map(|_| l.join().unwrap()).collect();
    assert_eq!(slots, [1, 2, 3, 4]);
    for &s in &slots {
        assert_eq!(l.joined_group(s, a).unwrap(), u32::from(s) - 1);
    }
    l.joined_group(3, b).unwrap();
    l.joined_group(1, b).unwrap();
    assert!(matches!(
        l.joined_group(9, a),
        Err(HostError::NotMember { slot: 9 })
    ));
    assert!(l.left_group(2, a));
    assert!(!l.left_group(2, a));
    assert_eq!(l.state().groups[&a].order.slots(), &[1, 4, 3]);
    l.leave(1).unwrap();
    assert_eq!(l.state().groups[&a].order.slots(), &[3, 4]);
    assert_eq!(l.state().groups[&b].order.slots(), &[3]);
    let t = l.table(a).unwrap();
    assert_eq!(t.designated(), 0);
    assert_eq!(t.index_for(QpnLayout::default().qpn(4, 1).unwrap()), 1);
    let g = l.commit().unwrap();
    // What was committed is what the next holder reads.
    let l = reg.lock().unwrap();
    assert_eq!(l.state().generation, g);
    assert_eq!(l.state().groups[&a].order.slots(), &[3, 4]);
    // Nothing changed: the generation stays.
    assert_eq!(l.commit().unwrap(), g);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reaping_members_that_died_together_may_leave_a_group_uncertain() {
    let dir = scratch("reap");
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    let a: SocketAddr = "127.0.77.4:4791".parse().unwrap();
    let b: SocketAddr = "127.0.77.5:4791".parse().unwrap();
    let mut l = reg.lock().unwrap();
    let me = l.join().unwrap();
    // Two members of a process that is gone (pid beyond pid_max).
    let dead1 = l.join_as(u32::MAX - 1, 1).unwrap().0;
    let dead2 = l.join_as(u32::MAX - 2, 1).unwrap().0;
    // a: [dead1, dead2, me]: either order of their closes leaves [me].
    // b: [dead1, me, dead2]: dead1 first -> [dead2, me] -> [me]; dead2 first ->
    //    [dead1, me] -> [me]. Both certain.
    for s in [dead1, dead2, me] {
        l.joined_group(s, a).unwrap();
    }
    for s in [dead1, me, dead2] {
        l.joined_group(s, b).unwrap();
    }
    let reaped = l.reap();
    assert_eq!(reaped.len(), 2);
    assert_eq!(l.state().members.len(), 1);
    for g in [a, b] {
        assert!(l.state().groups[&g].certain);
        assert_eq!(l.state().groups[&g].order.slots(), &[me]);
    }
    // Now a real ambiguity: [x, y, me, me2] with x and y dying.
    let x = l.join_as(u32::MAX - 3, 1).unwrap().0;
    let y = l.join_as(u32::MAX - 4, 1).unwrap().0;
    let me2 = l.join().unwrap();
    let c: SocketAddr = "127.0.77.6:4791".parse().unwrap();
    for s in [x, y, me, me2] {
        l.joined_group(s, c).unwrap();
    }
    assert_eq!(l.reap().len(), 2);
    assert!(!l.state().groups[&c].certain);
    assert!(l.table(c).is_none(), "no program from a guess");
    l.set_order(c, GroupOrder::from_slots(vec![me2, me]));
    assert_eq!(
        l.table(c)
            .unwrap()
            .index_for(QpnLayout::default().qpn(me, 0).unwrap()),
        1
    );
    assert!(l.state().freed.contains_key(&x));
    l.commit().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn probes_make_an_uncertain_group_certain_when_every_index_is_found() {
    let dir = scratch("found");
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    let c: SocketAddr = "127.0.77.7:4791".parse().unwrap();
    let mut l = reg.lock().unwrap();
    let me = l.join().unwrap();
    let x = l.join_as(u32::MAX - 3, 1).unwrap().0;
    let y = l.join_as(u32::MAX - 4, 1).unwrap().0;
    let me2 = l.join().unwrap();
    for s in [x, y, me, me2] {
        l.joined_group(s, c).unwrap();
    }
    l.commit().unwrap();
    let mut l = reg.lock().unwrap();
    assert_eq!(l.reap().len(), 2);
    let key = l.state().groups[&c].key;
    assert_ne!(key, 0);
    // A probe with another key (sent before the order moved, or forged), one for a slot
    // not in the group: ignored.
    assert!(!l.found(c, 0, me, key ^ 1));
    assert!(!l.found(c, 0, x, key));
    assert!(l.state().groups[&c].found.is_empty());
    // me is at 0 (a wrong finding first, then corrected: the later one replaces it).
    assert!(!l.found(c, 1, me, key));
    assert!(!l.found(c, 0, me, key));
    assert_eq!(l.state().groups[&c].found, [(0, me)].into());
    assert!(l.table(c).is_none());
    l.commit().unwrap();
    // Read back from the file, then the last index: certain, and a program again.
    let mut l = reg.lock().unwrap();
    assert_eq!(l.state().groups[&c].found, [(0, me)].into());
    assert_eq!(l.state().groups[&c].key, key);
    assert!(l.found(c, 1, me2, key));
    let g = &l.state().groups[&c];
    assert!(g.certain && g.found.is_empty());
    assert_eq!(g.order.slots(), &[me, me2]);
    assert!(l.table(c).is_some());
    assert!(!l.found(c, 0, me, key), "certain: nothing to find");
    // Uncertain again; a joiner's index is known, a member that leaves moves the order:
    // what was found is void, and so is the key.
    let z = l.join_as(u32::MAX - 5, 1).unwrap().0;
    let w = l.join_as(u32::MAX - 6, 1).unwrap().0;
    l.left_group(me, c);
    l.left_group(me2, c);
    for s in [z, w, me, me2] {
        l.joined_group(s, c).unwrap();
    }
    l.reap();
    let key = l.state().groups[&c].key;
    assert!(!l.state().groups[&c].certain);
    assert!(!l.found(c, 1, me2, key));
    let joined = l.join().unwrap();
    l.joined_group(joined, c).unwrap();
    assert_eq!(
        l.state().groups[&c].found,
        [(1, me2), (2, joined)].into(),
        "a joiner's index is known"
    );
    l.left_group(joined, c);
    assert!(l.state().groups[&c].found.is_empty());
    assert_ne!(l.state().groups[&c].key, key);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A REQ for `service` to QP1 (BTH, DETH, MAD), as the steering program sees it.
fn req_for(service: u64) -> Vec<u8> {
    use crate::steer::{MAD_OFFSET, MIN_MAD_DATAGRAM_LEN};
    use uroce_wire::cm::Req;
    use uroce_wire::mad::{self, cm_attr};
    let mut d = vec![0u8; MIN_MAD_DATAGRAM_LEN as usize];
    d[0] = uroce_wire::opcode::op::UD_SEND_ONLY;
    d[7] = 1;
    let m = &mut d[MAD_OFFSET as usize..];
    let mut h = mad::Header::new_unchecked(&mut m[..mad::LEN]);
    h.set_mgmt_class(mad::MGMT_CLASS_CM);
    h.set_attribute_id(cm_attr::REQ);
    Req::new_unchecked(&mut m[mad::LEN..]).set_service_id(service);
    d
}

#[test]
fn listeners_are_recorded_and_go_with_their_member() {
    const SVC: u64 = 0x0000_0000_0106_1C06;
    const SVC2: u64 = 0x0000_0000_0106_1C07;
    let dir = scratch("listen");
    let reg = Registry::open(&dir, QpnLayout::default()).unwrap();
    let a: SocketAddr = "127.0.83.20:4791".parse().unwrap();
    let mut l = reg.lock().unwrap();
    let me = l.join().unwrap();
    let other = l.join().unwrap();
    let dead = l.join_as(u32::MAX - 5, 1).unwrap().0;
    for s in [me, other, dead] {
        l.joined_group(s, a).unwrap();
    }
    l.listen(dead, SVC).unwrap();
    l.listen(dead, SVC).unwrap(); // again: nothing changes
    l.listen(other, SVC2).unwrap();
    assert!(matches!(
        l.listen(me, SVC),
        Err(HostError::ServiceTaken { service: SVC, slot }) if slot == dead
    ));
    assert!(matches!(
        l.listen(99, 5),
        Err(HostError::NotMember { slot: 99 })
    ));
    let t = l.table(a).unwrap();
    assert_eq!(
        t.index_for_datagram(&req_for(SVC)),
        2,
        "the listener's index"
    );
    assert_eq!(t.index_for_datagram(&req_for(SVC2)), 1);
    assert_eq!(t.index_for_datagram(&req_for(7)), 0, "nobody: designated");
    let g1 = l.commit().unwrap();
    assert_eq!(reg.read().unwrap().listeners.len(), 2);

    // The listener of SVC is killed while REQs arrive: once reaped, its listener is
    // gone, the generation moves, and the next program sends its REQs to the
    // designated member (index 0, which rejects them).
    let mut l = reg.lock().unwrap();
    assert_eq!(l.reap().len(), 1);
    assert_eq!(l.state().listeners.get(&SVC), None);
    let t = l.table(a).unwrap();
    assert_eq!(t.index_for_datagram(&req_for(SVC)), 0);
    assert_eq!(t.index_for_datagram(&req_for(SVC2)), 1);
    let g2 = l.commit().unwrap();
    assert!(g2 > g1);

    // Unlisten: only by its member; leave drops the rest.
    let mut l = reg.lock().unwrap();
    assert!(!l.unlisten(me, SVC2));
    assert!(l.unlisten(other, SVC2));
    assert!(!l.unlisten(other, SVC2));
    l.listen(other, SVC).unwrap();
    l.leave(other).unwrap();
    assert!(l.state().listeners.is_empty());
    let t = l.table(a).unwrap();
    assert_eq!(t.index_for_datagram(&req_for(SVC)), 0);
    assert!(l.commit().unwrap() > g2);

    // At most MAX_LISTENERS.
    let mut l = reg.lock().unwrap();
    for i in 0..MAX_LISTENERS as u64 {
        l.listen(me, 0x1000 + i).unwrap();
    }
    assert!(matches!(l.listen(me, 1), Err(HostError::TooManyListeners)));
    l.listen(me, 0x1000).unwrap(); // one it has: fine
    drop(l);
    let _ = std::fs::remove_dir_all(&dir);
}
