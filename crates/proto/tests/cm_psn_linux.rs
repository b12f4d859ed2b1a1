//! The starting-PSN rule of [`StartPsns`] against connections the Linux kernel's CM set up
//! (Soft-RoCE to Soft-RoCE, recorded by the interop suite: `rping` and `ucmatose` in the wire
//! crate's fixtures). For every REQ/REP pair in a capture, the first request packet each
//! side sends on the new connection must carry the send PSN the rule derives from the REQ
//! and REP, and each side's receive PSN must be the other's send PSN. The rule taken the
//! other way round (the REQ's PSN as the active side's send PSN, which uroce used before
//! and which made a Linux passive side treat every packet as a duplicate) fails here.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::net::IpAddr;
use std::path::PathBuf;

use uroce_proto::cm::StartPsns;
use uroce_wire::cm::{CmMad, CmMessage, RepRepr, ReqRepr};
use uroce_wire::mad::GSI_QPN;
use uroce_wire::pcap::PcapReader;
use uroce_wire::PacketRepr;

/// One packet of a capture: source, destination QP, opcode is a request, PSN, payload.
struct Pkt {
    src: IpAddr,
    dest_qp: u32,
    request: bool,
    psn: u32,
    payload: Vec<u8>,
}

fn read(name: &str) -> Vec<Pkt> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../wire/tests/fixtures/rxe")
        .join(name);
    let file = File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = PcapReader::new(BufReader::new(file)).unwrap();
    let link = reader.link_type().unwrap();
    let mut out = Vec::new();
    for rec in reader {
        let (_, frame) = rec.unwrap();
        let d = link.datagram(&frame).unwrap();
        let roce = d.roce().unwrap();
        let p = PacketRepr::parse(roce).unwrap();
        out.push(Pkt {
            src: d.src,
            dest_qp: p.bth.dest_qp,
            request: p.info().is_some_and(|i| i.is_request),
            psn: p.bth.psn.value(),
            payload: p.payload.to_vec(),
        });
    }
    out
}

/// The first request packet from `src` to `qpn` at or after packet `from`.
fn first_request(pkts: &[Pkt], from: usize, src: IpAddr, qpn: u32) -> Option<u32> {
    pkts[from..]
        .iter()
        .find(|p| p.request && p.src == src && p.dest_qp == qpn)
        .map(|p| p.psn)
}

/// Checks every connection of one capture with `rule` (active, passive); returns how many
/// connections carried data both ways, and the first mismatch.
fn check(
    name: &str,
    rule: fn(&ReqRepr, &RepRepr) -> (StartPsns, StartPsns),
) -> (usize, Vec<String>) {
    let pkts = read(name);
    let mut reqs: HashMap<u32, (IpAddr, ReqRepr)> = HashMap::new();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (i, p) in pkts.iter().enumerate() {
        if p.dest_qp != GSI_QPN {
            continue;
        }
        let Ok(mad) = CmMad::parse(&p.payload) else {
            continue;
        };
        match mad.message {
            CmMessage::Req(req) => {
                reqs.insert(req.local_comm_id, (p.src, req));
            }
            CmMessage::Rep(rep) => {
                let Some((active_ip, req)) = reqs.get(&rep.remote_comm_id) else {
                    continue;
                };
                let passive_ip = p.src;
                let (active, passive) = rule(req, &rep);
                assert_eq!(
                    active.sq_psn, passive.rq_psn,
                    "{name}: active sends what passive expects"
                );
                assert_eq!(
                    passive.sq_psn, active.rq_psn,
                    "{name}: passive sends what active expects"
                );
                let a = first_request(&pkts, i, *active_ip, rep.local_qpn);
                let b = first_request(&pkts, i, passive_ip, req.local_qpn);
                if let (Some(a), Some(b)) = (a, b) {
                    checked += 1;
                    if a != active.sq_psn {
                        wrong.push(format!(
                            "{name}: active side's first PSN {a:#08x}, rule says {:#08x}",
                            active.sq_psn
                        ));
                    }
                    if b != passive.sq_psn {
                        wrong.push(format!(
                            "{name}: passive side's first PSN {b:#08x}, rule says {:#08x}",
                            passive.sq_psn
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    (checked, wrong)
}

fn uroce_rule(req: &ReqRepr, rep: &RepRepr) -> (StartPsns, StartPsns) {
    (
        StartPsns::active(req.starting_psn, rep.starting_psn),
        StartPsns::passive(req.starting_psn, rep.starting_psn),
    )
}

/// The rule the other way round (REQ's PSN = the active side's send PSN).
fn reversed_rule(req: &ReqRepr, rep: &RepRepr) -> (StartPsns, StartPsns) {
    (
        StartPsns::passive(req.starting_psn, rep.starting_psn),
        StartPsns::active(req.starting_psn, rep.starting_psn),
    )
}

const CAPTURES: [&str; 2] = ["rxe-rxe-rping.pcap", "rxe-rxe-ucmatose.pcap"];

#[test]
fn start_psns_match_the_linux_cm() {
    let mut total = 0;
    for name in CAPTURES {
        let (n, wrong) = check(name, uroce_rule);
        assert!(wrong.is_empty(), "{wrong:#?}");
        total += n;
    }
    // Both captures hold at least one connection with data both ways.
    assert!(total >= 2, "only {total} connections with data both ways");
}

#[test]
fn the_reversed_rule_is_caught() {
    for name in CAPTURES {
        let (n, wrong) = check(name, reversed_rule);
        assert!(n > 0, "{name}: no connection with data both ways");
        assert_eq!(wrong.len(), 2 * n, "{name}: {wrong:#?}");
    }
}

#[test]
fn start_psns_are_24_bits() {
    let a = StartPsns::active(0x0100_0001, 0xFF12_3456);
    assert_eq!((a.sq_psn, a.rq_psn), (0x12_3456, 0x00_0001));
    let p = StartPsns::passive(0x0100_0001, 0xFF12_3456);
    assert_eq!((p.sq_psn, p.rq_psn), (0x00_0001, 0x12_3456));
}
