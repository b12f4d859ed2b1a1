//! tshark decodes every CM MAD uroce sends, with no malformed field: a capture (the
//! device's own, `NetConfig::capture`) of two loopback devices exchanging each kind of
//! message the connection manager produces — REQ, REP, RTU, DREQ and DREP (a connection
//! closed by the client and one closed by the server), REJ (a port nobody listens on),
//! SIDR_REQ and SIDR_REP (a UDP id) — read back by tshark, which must name every message
//! and report no malformed packet and no expert info of warning level or above. The first
//! connection's SENDs also pin the starting-PSN rule: the client's first PSN is the REP's
//! Starting PSN, the server's the REQ's.

mod common;

use std::collections::BTreeMap;

use common::*;
use uroce_rdmacm::{CmId, ConnParam, EventChannel, EventKind, PortSpace, RdmaCm};
use uroce_testkit as support;
use uroce_verbs::QpType;

use support::{have_tshark, num, tshark_fields, TempFile, PI_WARN};

const TEST: &str = "every_cm_mad_uroce_sends_decodes_in_tshark";
const CLIENT: &str = "127.0.216.1";
const SERVER: &str = "127.0.216.2";

/// CM attribute IDs (IBA Vol 1 §12.6, Table 104) and tshark's names for them.
const EXPECTED: [(u64, &str); 8] = [
    (0x10, "ConnectRequest"),
    (0x12, "ConnectReject"),
    (0x13, "ConnectReply"),
    (0x14, "ReadyToUse"),
    (0x15, "DisconnectRequest"),
    (0x16, "DisconnectReply"),
    (0x17, "ServiceIDResReq"),
    (0x18, "ServiceIDResReqResp"),
];

fn resolved(cm: &RdmaCm, ps: PortSpace, port: u16) -> (CmId, EventChannel) {
    let ch = cm.create_event_channel().unwrap();
    let id = cm.create_id(&ch, ps).unwrap();
    id.resolve_addr(Some(sa(CLIENT, 0)), sa(SERVER, port), T)
        .unwrap();
    ch.expect(EventKind::AddrResolved, T).unwrap();
    id.resolve_route(T).unwrap();
    ch.expect(EventKind::RouteResolved, T).unwrap();
    (id, ch)
}

/// An RC connection on `port`, closed by the client or the server.
fn connection(cm: &RdmaCm, port: u16, client_ends: bool) {
    let chs = cm.create_event_channel().unwrap();
    let listener = cm.create_id(&chs, PortSpace::Tcp).unwrap();
    listener.bind_addr(sa(SERVER, port)).unwrap();
    listener.listen(1).unwrap();
    let (cid, chc) = resolved(cm, PortSpace::Tcp, port);
    let cres = Res::new(&cid);
    let cqp = cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
    cqp.post_recv(cres.recv_wr(0, 64)).unwrap();
    let mut p = ConnParam::new();
    p.private_data = b"private".to_vec();
    cid.connect(&p).unwrap();
    let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
    let sid = req.take_id().unwrap();
    drop(req);
    let sres = Res::new(&sid);
    let sqp = sid.create_qp(&sres.pd, &sres.attr(QpType::Rc)).unwrap();
    sqp.post_recv(sres.recv_wr(0, 64)).unwrap();
    sid.accept(&ConnParam::new()).unwrap();
    chc.expect(EventKind::Established, T).unwrap();
    chs.expect(EventKind::Established, T).unwrap();
    // One SEND each way: their PSNs are checked against the REQ and REP.
    cqp.post_send(cres.send_wr(1024, b"ping")).unwrap();
    ok(&cres.completion());
    ok(&sres.completion());
    sqp.post_send(sres.send_wr(1024, b"pong")).unwrap();
    ok(&sres.completion());
    ok(&cres.completion());
    let (closer, other) = if client_ends {
        (&cid, &chs)
    } else {
        (&sid, &chc)
    };
    closer.disconnect().unwrap();
    other.expect(EventKind::Disconnected, T).unwrap();
}

#[test]
fn every_cm_mad_uroce_sends_decodes_in_tshark() {
    let file = TempFile::new("cm-mads", "pcap");
    {
        let client = device(CLIENT, None, Some(file.path()));
        let server = device(SERVER, None, None);
        let cm = RdmaCm::new();
        cm.add_device(client).unwrap();
        cm.add_device(server).unwrap();

        connection(&cm, 7101, true);
        connection(&cm, 7102, false);

        // REJ: nobody listens on this port.
        let (cid, chc) = resolved(&cm, PortSpace::Tcp, 7103);
        let cres = Res::new(&cid);
        cid.create_qp(&cres.pd, &cres.attr(QpType::Rc)).unwrap();
        cid.connect(&ConnParam::new()).unwrap();
        assert_eq!(chc.expect(EventKind::Rejected, T).unwrap().status, 8);

        // SIDR: a UDP listener answers with the QP of the id its request made.
        let chs = cm.create_event_channel().unwrap();
        let listener = cm.create_id(&chs, PortSpace::Udp).unwrap();
        listener.bind_addr(sa(SERVER, 7104)).unwrap();
        listener.listen(1).unwrap();
        let (uid, chu) = resolved(&cm, PortSpace::Udp, 7104);
        let ures = Res::new(&uid);
        uid.create_qp(&ures.pd, &ures.attr(QpType::Ud)).unwrap();
        uid.connect(&ConnParam::new()).unwrap();
        let mut req = chs.expect(EventKind::ConnectRequest, T).unwrap();
        let sid = req.take_id().unwrap();
        drop(req);
        let sres = Res::new(&sid);
        let sqp = sid.create_qp(&sres.pd, &sres.attr(QpType::Ud)).unwrap();
        sid.accept(&ConnParam::new()).unwrap();
        let est = chu.expect(EventKind::Established, T).unwrap();
        assert_eq!(est.ud.as_ref().map(|u| u.qp_num), Some(sqp.qp_num()));
        // Everything goes (ids, then the devices with the RdmaCm): the capture is
        // complete and flushed when the client's device closes.
    }
    if !have_tshark(TEST) {
        return;
    }
    let rows = tshark_fields(
        file.path(),
        &[
            "frame.number",
            "ip.src",
            "_ws.malformed",
            "_ws.expert.severity",
            "_ws.expert.message",
            "infiniband.bth.destqp",
            "infiniband.mad.attributeid",
            "_ws.col.Info",
            "infiniband.bth.opcode",
            "infiniband.bth.psn",
            "infiniband.cm.req.startpsn",
            "infiniband.cm.rep.startpsn",
        ],
        &[],
    );
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    // The first connection's REQ and REP starting PSNs and the first RC SEND ONLY (opcode 4)
    // from each end.
    let mut req_psn = None;
    let mut rep_psn = None;
    let mut first_send: BTreeMap<String, u64> = BTreeMap::new();
    for row in &rows {
        req_psn = req_psn.or(row.number("infiniband.cm.req.startpsn"));
        rep_psn = rep_psn.or(row.number("infiniband.cm.rep.startpsn"));
        if row.number("infiniband.bth.opcode") == Some(4) {
            let src = row.single("ip.src").unwrap_or_default().to_string();
            let psn = row.number("infiniband.bth.psn").expect("PSN");
            first_send.entry(src).or_insert(psn);
        }
    }
    // The REQ announces what the passive side sends with, the REP what the active side
    // sends with (uroce_proto::cm::StartPsns; the Linux CM reads them so).
    let (req_psn, rep_psn) = (req_psn.expect("REQ PSN"), rep_psn.expect("REP PSN"));
    assert_ne!(req_psn, rep_psn, "the check needs two different PSNs");
    assert_eq!(first_send.get(CLIENT), Some(&rep_psn), "{first_send:x?}");
    assert_eq!(first_send.get(SERVER), Some(&req_psn), "{first_send:x?}");
    for row in &rows {
        let what = format!("frame {:?}", row.single("frame.number"));
        assert!(row.all("_ws.malformed").is_empty(), "{what}: malformed");
        for (sev, msg) in row
            .all("_ws.expert.severity")
            .iter()
            .zip(row.all("_ws.expert.message"))
        {
            assert!(num(sev) < PI_WARN, "{what}: expert info {sev} {msg:?}");
        }
        if row.number("infiniband.bth.destqp") != Some(1) {
            continue;
        }
        let attr = row
            .number("infiniband.mad.attributeid")
            .unwrap_or_else(|| panic!("{what}: a MAD to QP 1 without a MAD header"));
        let (_, name) = EXPECTED
            .iter()
            .find(|(a, _)| *a == attr)
            .unwrap_or_else(|| panic!("{what}: unexpected CM attribute {attr:#x}"));
        let info = row.single("_ws.col.Info").unwrap_or_default();
        assert!(
            info.contains(&format!("CM: {name}")),
            "{what}: tshark says {info:?}, expected {name}"
        );
        *seen.entry(attr).or_default() += 1;
    }
    eprintln!("{} packets; CM MADs by attribute: {seen:x?}", rows.len());
    for (attr, name) in EXPECTED {
        assert!(
            seen.contains_key(&attr),
            "no {name} in the capture: {seen:?}"
        );
    }
    // Each of the two connections: one REQ, REP, RTU, DREQ, DREP (no retries on loopback
    // are expected, but a retry is no error: at least).
    for attr in [0x10, 0x13, 0x14, 0x15, 0x16] {
        assert!(seen[&attr] >= 2, "{attr:#x}: {seen:?}");
    }
}
