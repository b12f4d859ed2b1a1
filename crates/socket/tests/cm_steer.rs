//! Steering CM MADs to QP1 in a real `SO_REUSEPORT` group on loopback
//! (`uroce_socket::steer`): the messages answering a connection reach the member whose
//! slot is in the communication ID they name, REQs and SIDR_REQs the member listening on
//! their service ID, and everything else to QP1 the designated member; when a listener
//! closes, its REQs go to the designated member, which rejects them.
//!
//! Each test uses an address of its own (127.0.83.x), for the reason given in
//! `tests/steer.rs`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use uroce_socket::steer::{self, GroupOrder, QpnLayout, SteeringTable, MAD_OFFSET};
use uroce_wire::cm::{Dreq, Rej, Rep, Req, Rtu, SidrRep, SidrReq};
use uroce_wire::mad::{self, cm_attr};
use uroce_wire::opcode::op;

const TEST: &str = "cm_steer";
const SERVICE_A: u64 = 0x0000_0000_0106_4E20; // RDMA CM, TCP port 20000
const SERVICE_B: u64 = 0x0000_0000_0111_4E21; // RDMA CM, UDP port 20001
const UNKNOWN: u64 = 0x0000_0000_0106_4E22;

/// A datagram to QP1 (BTH of a UD SEND only, DETH, a CM MAD of `attr` whose body `body`
/// writes, ICRC) carrying `tag` in its transaction ID.
fn gsi(attr: u16, tag: u64, body: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut d = vec![0u8; MAD_OFFSET as usize + mad::MAD_LEN + 4];
    d[0] = op::UD_SEND_ONLY;
    d[5..8].copy_from_slice(&[0, 0, 1]);
    let m = &mut d[MAD_OFFSET as usize..];
    let mut h = mad::Header::new_unchecked(&mut m[..mad::LEN]);
    h.set_base_version(mad::BASE_VERSION);
    h.set_mgmt_class(mad::MGMT_CLASS_CM);
    h.set_class_version(mad::CM_CLASS_VERSION);
    h.set_response_method(false, mad::METHOD_SEND);
    h.set_transaction_id(tag);
    h.set_attribute_id(attr);
    body(&mut m[mad::LEN..mad::MAD_LEN]);
    d
}

/// A message of `attr` for our communication ID `ours`.
fn answer(attr: u16, ours: u32, tag: u64) -> Vec<u8> {
    gsi(attr, tag, |b| match attr {
        cm_attr::REP => Rep::new_unchecked(b).set_remote_comm_id(ours),
        cm_attr::RTU => Rtu::new_unchecked(b).set_remote_comm_id(ours),
        cm_attr::REJ => Rej::new_unchecked(b).set_remote_comm_id(ours),
        cm_attr::DREQ => Dreq::new_unchecked(b).set_remote_comm_id(ours),
        cm_attr::SIDR_REP => SidrRep::new_unchecked(b).set_request_id(ours),
        _ => unreachable!(),
    })
}

fn request(sidr: bool, service: u64, tag: u64) -> Vec<u8> {
    if sidr {
        gsi(cm_attr::SIDR_REQ, tag, |b| {
            SidrReq::new_unchecked(b).set_service_id(service)
        })
    } else {
        gsi(cm_attr::REQ, tag, |b| {
            let mut v = Req::new_unchecked(b);
            v.set_local_comm_id(0x5EED_0001);
            v.set_service_id(service);
        })
    }
}

/// Member sockets (non-blocking) and the slot of each.
struct Group {
    addr: SocketAddr,
    members: Vec<(u16, UdpSocket)>,
    order: GroupOrder,
    layout: QpnLayout,
}

impl Group {
    fn bind(ip: IpAddr, slots: &[u16]) -> io::Result<Group> {
        let mut g = Group {
            addr: SocketAddr::new(ip, 0),
            members: Vec::new(),
            order: GroupOrder::default(),
            layout: QpnLayout::default(),
        };
        for &slot in slots {
            let s = steer::bind_member(g.addr)?;
            s.set_nonblocking(true)?;
            g.addr = s.local_addr()?;
            g.members.push((slot, s));
            g.order.joined(slot);
        }
        Ok(g)
    }

    fn close(&mut self, slot: u16) {
        let i = self.members.iter().position(|m| m.0 == slot).unwrap();
        drop(self.members.remove(i));
        assert!(self.order.left(slot));
    }

    fn attach(&self, table: &SteeringTable) {
        if let Err(e) = steer::attach(&self.members[0].1, &table.program()) {
            panic!("{TEST}: SO_ATTACH_REUSEPORT_CBPF refused ({e}); Linux 4.5+ needed");
        }
    }

    /// Sends each datagram and checks it arrives, alone, at the member of its slot.
    fn expect(&self, tx: &UdpSocket, cases: &[(Vec<u8>, u16)]) {
        let mut buf = [0u8; 512];
        for (d, slot) in cases {
            tx.send_to(d, self.addr).unwrap();
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut got = None;
            while got.is_none() && Instant::now() < deadline {
                for (s, sock) in &self.members {
                    match sock.recv(&mut buf) {
                        Ok(n) => {
                            assert_eq!(&buf[..n], &d[..], "another datagram");
                            got = Some(*s);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("recv: {e}"),
                    }
                }
                if got.is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let attr =
                u16::from_be_bytes([d[MAD_OFFSET as usize + 16], d[MAD_OFFSET as usize + 17]]);
            assert_eq!(got, Some(*slot), "attribute {attr:#x}: member slot");
        }
    }
}

#[test]
fn cm_mads_reach_their_connection_listener_or_the_designated_member() {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 83, 1));
    let mut g = Group::bind(ip, &[4, 9, 2]).unwrap();
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let l = g.layout;
    let designated = 2; // the lowest slot
    let mut t = SteeringTable::from_order(l, &g.order).unwrap();
    t.listen(SERVICE_A, 9);
    t.listen(SERVICE_B, 4);
    g.attach(&t);

    let mut tag = 0;
    let mut next = || {
        tag += 1;
        tag
    };
    let mut cases = Vec::new();
    // A REP (RTU, REJ, DREQ, SIDR_REP) for a communication ID of slot k: member k.
    for &slot in &[4u16, 9, 2] {
        let ids = l.comm_ids(slot).unwrap();
        for id in [*ids.start(), ids.start() + 0x4321, *ids.end()] {
            for attr in [
                cm_attr::REP,
                cm_attr::RTU,
                cm_attr::REJ,
                cm_attr::DREQ,
                cm_attr::SIDR_REP,
            ] {
                cases.push((answer(attr, id, next()), slot));
            }
        }
    }
    // An ID of a slot nobody holds: the designated member.
    cases.push((
        answer(cm_attr::REP, *l.comm_ids(7).unwrap().start(), next()),
        designated,
    ));
    // REQ and SIDR_REQ: at the listener; an unknown service at the designated member.
    for sidr in [false, true] {
        cases.push((request(sidr, SERVICE_A, next()), 9));
        cases.push((request(sidr, SERVICE_B, next()), 4));
        cases.push((request(sidr, UNKNOWN, next()), designated));
    }
    // ClassPortInfo: the designated member.
    cases.push((gsi(cm_attr::CLASS_PORT_INFO, next(), |_| {}), designated));
    g.expect(&tx, &cases);

    // The listener of SERVICE_A (slot 9, index 1) closes: the last member (slot 2) moves
    // into its index. Its replacement program has no listener for SERVICE_A: REQs for it
    // reach the designated member, which answers REJ "invalid service ID".
    g.close(9);
    let mut t = SteeringTable::from_order(l, &g.order).unwrap();
    t.listen(SERVICE_B, 4);
    g.attach(&t);
    let cases = vec![
        (request(false, SERVICE_A, next()), designated),
        (request(true, SERVICE_A, next()), designated),
        (request(false, SERVICE_B, next()), 4),
        (
            answer(cm_attr::DREQ, l.comm_ids(9).unwrap().start() + 1, next()),
            designated,
        ),
        (
            answer(cm_attr::REP, l.comm_ids(2).unwrap().start() + 1, next()),
            2,
        ),
        (
            answer(cm_attr::REP, l.comm_ids(4).unwrap().start() + 1, next()),
            4,
        ),
    ];
    g.expect(&tx, &cases);
}
