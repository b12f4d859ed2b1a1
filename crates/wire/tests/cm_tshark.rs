//! CM MADs against the Linux kernel's CM and against an independent dissector (tshark).
//!
//! * `kernel_cm_mads_parse_reemit_and_match_tshark`: every CM MAD of
//!   `tests/fixtures/kernel_cm.pcap` (captured from Linux 6.1 rdma_rxe running rping,
//!   ucmatose, udaddy and `ib_write_bw -R`, see `tests/fixtures/README.md`) parses with
//!   [`CmMad::parse`] into the values tshark decodes, and re-emits byte-identical.
//! * `tshark_decodes_every_cm_message_as_emitted`: one MAD per CM message type, emitted by
//!   uroce and framed as RoCEv2 (IPv4/UDP 4791/BTH to QP1/DETH/MAD/ICRC) in a pcap, decodes
//!   in tshark with nothing malformed and every field tshark shows equal to uroce's.
//!
//! tshark 4.0 decodes REQ, REP, RTU, REJ, DREQ and DREP field by field (for the others it
//! shows the MAD header only), and reads the REQ's flow label misaligned: it shows the
//! 20-bit label shifted right by 8 bits (and its packet rate from the wrong byte, so the
//! packet rate is not compared).

use uroce_testkit as support;

use std::fs::File;
use std::io::BufReader;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use support::{num, Row, TempFile, PI_WARN};
use uroce_wire::cm::rdma_cm::{self, CmaHeader, PortSpace};
use uroce_wire::cm::*;
use uroce_wire::ip::Endpoints;
use uroce_wire::pcap::{PcapReader, PcapWriter};
use uroce_wire::{bth, deth, mad, PacketRepr, Psn};

const TEST: &str = "cm_tshark";

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kernel_cm.pcap")
}

/// What tshark should show for a field.
#[derive(Debug)]
enum Want {
    Num(u64),
    Text(String),
}

fn gid_text(gid: [u8; 16]) -> String {
    rdma_cm::addr_of_gid(gid).to_string()
}

/// The tshark fields of a path and what they should hold. `alt`: the alternate path, whose
/// GIDs tshark shows as bytes and whose flow label it reads correctly.
fn path_fields(p: &PathRepr, alt: bool, out: &mut Vec<(&'static str, Want)>) {
    use Want::*;
    if alt {
        out.push(("infiniband.cm.req.alt_locallid", Num(p.local_lid.into())));
        out.push(("infiniband.cm.req.alt_remotelid", Num(p.remote_lid.into())));
        out.push((
            "infiniband.cm.req.alt_tfcclass",
            Num(p.traffic_class.into()),
        ));
        out.push(("infiniband.cm.req.alt_hoplim", Num(p.hop_limit.into())));
        out.push(("infiniband.cm.req.alt_sl", Num(p.sl.into())));
        out.push((
            "infiniband.cm.req.alt_subnetlocal",
            Num(p.subnet_local.into()),
        ));
        out.push((
            "infiniband.cm.req.alt_localacktout",
            Num(p.local_ack_timeout.into()),
        ));
    } else {
        out.push(("infiniband.cm.req.prim_locallid", Num(p.local_lid.into())));
        out.push(("infiniband.cm.req.prim_remotelid", Num(p.remote_lid.into())));
        let v4 = matches!(rdma_cm::addr_of_gid(p.local_gid), IpAddr::V4(_));
        let (l, r) = if v4 {
            (
                "infiniband.cm.req.prim_localgid_ipv4",
                "infiniband.cm.req.prim_remotegid_ipv4",
            )
        } else {
            (
                "infiniband.cm.req.prim_localgid",
                "infiniband.cm.req.prim_remotegid",
            )
        };
        out.push((l, Text(gid_text(p.local_gid))));
        out.push((r, Text(gid_text(p.remote_gid))));
        // tshark 4.0 quirk: the label shifted right by 8 bits.
        out.push((
            "infiniband.cm.req.prim_flowlabel",
            Num((p.flow_label >> 8).into()),
        ));
        out.push((
            "infiniband.cm.req.prim_tfcclass",
            Num(p.traffic_class.into()),
        ));
        out.push(("infiniband.cm.req.prim_hoplim", Num(p.hop_limit.into())));
        out.push(("infiniband.cm.req.prim_sl", Num(p.sl.into())));
        out.push((
            "infiniband.cm.req.prim_subnetlocal",
            Num(p.subnet_local.into()),
        ));
        out.push((
            "infiniband.cm.req.prim_localacktout",
            Num(p.local_ack_timeout.into()),
        ));
    }
}

/// Every (tshark field, value) tshark should show for `m`.
fn expected(m: &CmMad) -> Vec<(&'static str, Want)> {
    use Want::*;
    let h = &m.header;
    let mut out = vec![
        ("infiniband.mad.mgmtclass", Num(h.mgmt_class.into())),
        ("infiniband.mad.classversion", Num(h.class_version.into())),
        ("infiniband.mad.method", Num(h.method.into())),
        ("infiniband.mad.transactionid", Num(h.transaction_id)),
        ("infiniband.mad.attributeid", Num(h.attribute_id.into())),
    ];
    match &m.message {
        CmMessage::Req(r) => {
            out.extend([
                ("infiniband.cm.req", Num(r.local_comm_id.into())),
                ("infiniband.cm.req.serviceid", Num(r.service_id)),
                ("infiniband.cm.req.localcaguid", Num(r.local_ca_guid)),
                ("infiniband.cm.req.localqkey", Num(r.local_qkey.into())),
                ("infiniband.cm.req.localqpn", Num(r.local_qpn.into())),
                (
                    "infiniband.cm.req.responderres",
                    Num(r.responder_resources.into()),
                ),
                ("infiniband.cm.req.localeecn", Num(r.local_eecn.into())),
                ("infiniband.cm.req.initdepth", Num(r.initiator_depth.into())),
                ("infiniband.cm.req.remoteeecn", Num(r.remote_eecn.into())),
                (
                    "infiniband.cm.req.remoteresptout",
                    Num(r.remote_cm_response_timeout.into()),
                ),
                (
                    "infiniband.cm.req.transpsvctype",
                    Num(r.transport_service_type.into()),
                ),
                (
                    "infiniband.cm.req.e2eflowctrl",
                    Num(r.e2e_flow_control.into()),
                ),
                ("infiniband.cm.req.startpsn", Num(r.starting_psn.into())),
                (
                    "infiniband.cm.req.localresptout",
                    Num(r.local_cm_response_timeout.into()),
                ),
                ("infiniband.cm.req.retrcount", Num(r.retry_count.into())),
                ("infiniband.cm.req.pkey", Num(r.pkey.into())),
                ("infiniband.cm.req.pppmtu", Num(r.path_mtu.into())),
                ("infiniband.cm.req.rdcexist", Num(r.rdc_exists.into())),
                (
                    "infiniband.cm.req.rnrretrcount",
                    Num(r.rnr_retry_count.into()),
                ),
                ("infiniband.cm.req.maxcmretr", Num(r.max_cm_retries.into())),
                ("infiniband.cm.req.srq", Num(r.srq.into())),
                (
                    "infiniband.cm.req.ext_transport",
                    Num(r.extended_transport_type.into()),
                ),
            ]);
            path_fields(&r.primary_path, false, &mut out);
            path_fields(&r.alternate_path, true, &mut out);
            // tshark decodes the RDMA CM address header for IP-based service IDs.
            if let (Some(_), Ok(cma)) = (
                rdma_cm::parse_service_id(r.service_id),
                CmaHeader::parse(&r.private_data),
            ) {
                let v4 = cma.src_ip.is_ipv4();
                out.push(("infiniband.cm.req.ip_cm.ipv", Num(if v4 { 4 } else { 6 })));
                out.push(("infiniband.cm.req.ip_cm.sport", Num(cma.src_port.into())));
                let (s, d) = if v4 {
                    (
                        "infiniband.cm.req.ip_cm.sip4",
                        "infiniband.cm.req.ip_cm.dip4",
                    )
                } else {
                    (
                        "infiniband.cm.req.ip_cm.sip6",
                        "infiniband.cm.req.ip_cm.dip6",
                    )
                };
                out.push((s, Text(cma.src_ip.to_string())));
                out.push((d, Text(cma.dst_ip.to_string())));
            }
        }
        CmMessage::Rep(r) => out.extend([
            ("infiniband.cm.rep", Num(r.local_comm_id.into())),
            (
                "infiniband.cm.rep.remotecommid",
                Num(r.remote_comm_id.into()),
            ),
            ("infiniband.cm.rep.localqkey", Num(r.local_qkey.into())),
            ("infiniband.cm.rep.localqpn", Num(r.local_qpn.into())),
            ("infiniband.cm.rep.localeecn", Num(r.local_eecn.into())),
            ("infiniband.cm.rep.startpsn", Num(r.starting_psn.into())),
            (
                "infiniband.cm.rep.respres",
                Num(r.responder_resources.into()),
            ),
            ("infiniband.cm.rep.initdepth", Num(r.initiator_depth.into())),
            (
                "infiniband.cm.rep.tgtackdelay",
                Num(r.target_ack_delay.into()),
            ),
            (
                "infiniband.cm.rep.failoveracc",
                Num(r.failover_accepted.into()),
            ),
            (
                "infiniband.cm.rep.e2eflowctrl",
                Num(r.e2e_flow_control.into()),
            ),
            (
                "infiniband.cm.rep.rnrretrcount",
                Num(r.rnr_retry_count.into()),
            ),
            ("infiniband.cm.rep.srq", Num(r.srq.into())),
            ("infiniband.cm.rep.localcaguid", Num(r.local_ca_guid)),
        ]),
        CmMessage::Rtu(r) => out.extend([
            ("infiniband.cm.rtu.localcommid", Num(r.local_comm_id.into())),
            (
                "infiniband.cm.rtu.remotecommid",
                Num(r.remote_comm_id.into()),
            ),
        ]),
        CmMessage::Rej(r) => out.extend([
            ("infiniband.cm.rej.localcommid", Num(r.local_comm_id.into())),
            (
                "infiniband.cm.rej.remotecommid",
                Num(r.remote_comm_id.into()),
            ),
            ("infiniband.cm.rej.msgrej", Num(r.message_rejected.into())),
            (
                "infiniband.cm.rej.rejinfolen",
                Num(r.reject_info_length.into()),
            ),
            ("infiniband.cm.rej.reason", Num(r.reason.into())),
        ]),
        CmMessage::Dreq(r) => out.extend([
            (
                "infiniband.cm.dreq.localcommid",
                Num(r.local_comm_id.into()),
            ),
            (
                "infiniband.cm.dreq.remotecommid",
                Num(r.remote_comm_id.into()),
            ),
            // tshark files the DREQ's remote QPN under a REQ field name.
            ("infiniband.cm.req.remoteqpneecn", Num(r.remote_qpn.into())),
        ]),
        CmMessage::Drep(r) => out.extend([
            (
                "infiniband.cm.drsp.localcommid",
                Num(r.local_comm_id.into()),
            ),
            (
                "infiniband.cm.drsp.remotecommid",
                Num(r.remote_comm_id.into()),
            ),
        ]),
        _ => {}
    }
    out
}

/// Every field [`expected`] can name, for one tshark run.
fn all_fields() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = vec![
        "frame.number",
        "ip.version",
        "_ws.malformed",
        "_ws.expert.severity",
        "_ws.expert.message",
    ];
    let samples = samples();
    for m in &samples {
        for (f, _) in expected(m) {
            if !names.contains(&f) {
                names.push(f);
            }
        }
    }
    for extra in [
        "infiniband.cm.req.prim_localgid",
        "infiniband.cm.req.prim_remotegid",
        "infiniband.cm.req.ip_cm.sip6",
        "infiniband.cm.req.ip_cm.dip6",
        "infiniband.cm.req.ip_cm.sip4",
        "infiniband.cm.req.ip_cm.dip4",
    ] {
        if !names.contains(&extra) {
            names.push(extra);
        }
    }
    names
}

fn check_row(row: &Row, m: &CmMad, what: &str) {
    assert!(row.all("_ws.malformed").is_empty(), "{what}: malformed");
    let ipv6 = row.number("ip.version") == Some(6);
    for (s, msg) in row
        .all("_ws.expert.severity")
        .iter()
        .zip(row.all("_ws.expert.message"))
    {
        // RoCEv2 senders put UDP checksum 0 in IPv6 datagrams too, which tshark notes.
        let zero_udp_checksum_v6 = ipv6 && msg == "Illegal checksum value (0)";
        assert!(
            num(s) < PI_WARN || zero_udp_checksum_v6,
            "{what}: expert info of severity {s}: {msg}"
        );
    }
    for (field, want) in expected(m) {
        match want {
            Want::Num(n) => assert_eq!(row.number(field), Some(n), "{what}: {field}"),
            Want::Text(t) => assert_eq!(row.single(field), Some(t.as_str()), "{what}: {field}"),
        }
    }
}

#[test]
fn kernel_cm_mads_parse_reemit_and_match_tshark() {
    let path = fixture();
    let reader = PcapReader::new(BufReader::new(File::open(&path).unwrap())).unwrap();
    let link = reader.link_type().unwrap();
    let frames: Vec<Vec<u8>> = reader.map(|r| r.unwrap().1).collect();
    assert_eq!(frames.len(), 18, "fixture frames");
    let mut mads = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for (i, frame) in frames.iter().enumerate() {
        let what = format!("kernel_cm.pcap packet {}", i + 1);
        let d = link.datagram(frame).unwrap();
        let roce = d.roce().unwrap();
        let p = PacketRepr::parse(roce).unwrap();
        assert_eq!(p.bth.dest_qp, mad::GSI_QPN, "{what}");
        assert_eq!(p.deth.map(|d| d.qkey), Some(mad::GSI_QKEY), "{what}");
        let m = CmMad::parse(p.payload).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            !matches!(m.message, CmMessage::Other { .. }),
            "{what}: not a CM message"
        );
        m.validate().unwrap();
        assert_eq!(&m.to_bytes()[..], p.payload, "{what}: re-emit");
        kinds.insert(m.header.attribute_id);
        // Facts the kernel's rdma_cm sets: the REQ's service ID is a TCP-port-space
        // one whose port is the destination port of the address header's connection.
        if let CmMessage::Req(r) = &m.message {
            let (ps, _) = rdma_cm::parse_service_id(r.service_id).unwrap();
            assert_eq!(ps, PortSpace::Tcp, "{what}");
            let cma = CmaHeader::parse(&r.private_data).unwrap();
            assert_eq!(cma.src_ip, d.endpoints().src, "{what}");
            assert_eq!(cma.dst_ip, d.endpoints().dst, "{what}");
        }
        if let CmMessage::SidrReq(r) = &m.message {
            let (ps, _) = rdma_cm::parse_service_id(r.service_id).unwrap();
            assert_eq!(ps, PortSpace::Udp, "{what}");
            let cma = CmaHeader::parse(&r.private_data).unwrap();
            assert_eq!(cma.dst_ip, d.endpoints().dst, "{what}");
        }
        mads.push(m);
    }
    assert_eq!(kinds.len(), 7, "REQ REP RTU DREQ DREP SIDR_REQ SIDR_REP");

    if !support::have_tshark(TEST) {
        return;
    }
    let rows = support::tshark_fields(&path, &all_fields(), &[]);
    assert_eq!(rows.len(), mads.len());
    for (i, (row, m)) in rows.iter().zip(&mads).enumerate() {
        check_row(row, m, &format!("kernel_cm.pcap packet {}", i + 1));
    }
    eprintln!(
        "{TEST}: {} kernel CM MADs parsed, re-emitted and match tshark",
        mads.len()
    );
}

fn path(src: IpAddr, dst: IpAddr, flow_label: u32) -> PathRepr {
    PathRepr {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: rdma_cm::gid_of(src),
        remote_gid: rdma_cm::gid_of(dst),
        flow_label,
        packet_rate: 0,
        traffic_class: 0x68,
        hop_limit: 64,
        sl: 3,
        subnet_local: false,
        local_ack_timeout: 18,
    }
}

fn filled<const N: usize>(seed: u8) -> [u8; N] {
    let mut a = [0u8; N];
    for (i, b) in a.iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8).wrapping_mul(7);
    }
    a
}

/// One MAD per message type (two REQs: IPv4 and IPv6 addresses).
fn samples() -> Vec<CmMad> {
    let a4 = IpAddr::from([198, 51, 100, 7]);
    let b4 = IpAddr::from([203, 0, 113, 9]);
    let a6: IpAddr = "2001:db8::7".parse().unwrap();
    let b6: IpAddr = "2001:db8:1::9".parse().unwrap();
    let req = |src: IpAddr, dst: IpAddr| {
        let mut private_data = filled::<{ private_data_len::REQ }>(1);
        CmaHeader {
            version: 0,
            src_port: 0xc123,
            src_ip: src,
            dst_ip: dst,
        }
        .emit(&mut private_data)
        .unwrap();
        ReqRepr {
            local_comm_id: 0x1122_3344,
            service_id: PortSpace::Tcp.service_id(18515),
            local_ca_guid: 0x0202_03ff_fe04_0506,
            local_qkey: 0,
            local_qpn: 0x12_3456,
            responder_resources: 16,
            local_eecn: 0,
            initiator_depth: 8,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 1,
            e2e_flow_control: true,
            starting_psn: 0xab_cdef,
            local_cm_response_timeout: 19,
            retry_count: 6,
            pkey: 0xffff,
            path_mtu: 5,
            rdc_exists: false,
            rnr_retry_count: 5,
            max_cm_retries: 15,
            srq: true,
            extended_transport_type: 0,
            primary_path: path(src, dst, 0x1_2345),
            alternate_path: PathRepr {
                local_lid: 0x11,
                remote_lid: 0x22,
                sl: 2,
                hop_limit: 1,
                subnet_local: true,
                local_ack_timeout: 7,
                traffic_class: 0x20,
                ..PathRepr::default()
            },
            sap_supported: false,
            private_data,
        }
    };
    let msgs = vec![
        CmMessage::Req(req(a4, b4)),
        CmMessage::Req(req(a6, b6)),
        CmMessage::Mra(MraRepr {
            local_comm_id: 0x5566_7788,
            remote_comm_id: 0x1122_3344,
            message_mraed: msg_kind::REQ,
            service_timeout: 24,
            private_data: filled(2),
        }),
        CmMessage::Rej(RejRepr {
            local_comm_id: 0x5566_7788,
            remote_comm_id: 0x1122_3344,
            message_rejected: msg_kind::REQ,
            reject_info_length: 0,
            reason: rej_reason::CONSUMER_DEFINED,
            ari: [0; INFO_LEN],
            private_data: filled(3),
        }),
        CmMessage::Rep(RepRepr {
            local_comm_id: 0x5566_7788,
            remote_comm_id: 0x1122_3344,
            local_qkey: 0,
            local_qpn: 0x65_4321,
            local_eecn: 0,
            starting_psn: 0x12_3123,
            responder_resources: 8,
            initiator_depth: 16,
            target_ack_delay: 15,
            failover_accepted: 0,
            e2e_flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x0a0b_0cff_fe0d_0e0f,
            private_data: filled(4),
        }),
        CmMessage::Rtu(RtuRepr {
            local_comm_id: 0x1122_3344,
            remote_comm_id: 0x5566_7788,
            private_data: filled(5),
        }),
        CmMessage::Dreq(DreqRepr {
            local_comm_id: 0x1122_3344,
            remote_comm_id: 0x5566_7788,
            remote_qpn: 0x65_4321,
            private_data: filled(6),
        }),
        CmMessage::Drep(DrepRepr {
            local_comm_id: 0x5566_7788,
            remote_comm_id: 0x1122_3344,
            private_data: filled(7),
        }),
        CmMessage::Lap(LapRepr {
            local_comm_id: 0x1122_3344,
            remote_comm_id: 0x5566_7788,
            remote_qpn: 0x65_4321,
            remote_cm_response_timeout: 20,
            alternate_path: path(a4, b4, 0x5_4321),
            private_data: filled(8),
        }),
        CmMessage::Apr(AprRepr {
            local_comm_id: 0x5566_7788,
            remote_comm_id: 0x1122_3344,
            additional_info_length: 0,
            status: apr_status::UNSUPPORTED,
            additional_info: [0; INFO_LEN],
            private_data: filled(9),
        }),
        CmMessage::SidrReq(SidrReqRepr {
            request_id: 0x0bad_cafe,
            pkey: 0xffff,
            service_id: PortSpace::Udp.service_id(7174),
            private_data: filled(10),
        }),
        CmMessage::SidrRep(SidrRepRepr {
            request_id: 0x0bad_cafe,
            status: sidr_status::SUCCESS,
            additional_info_length: 0,
            qpn: 0x00_0042,
            service_id: PortSpace::Udp.service_id(7174),
            qkey: 0x0123_4567,
            additional_info: [0; INFO_LEN],
            private_data: filled(11),
        }),
    ];
    msgs.into_iter()
        .enumerate()
        .map(|(i, m)| CmMad::new(0x0000_0002_0000_1000 + i as u64, m))
        .collect()
}

#[test]
fn tshark_decodes_every_cm_message_as_emitted() {
    if !support::have_tshark(TEST) {
        return;
    }
    let mads = samples();
    let file = TempFile::new(TEST, "pcap");
    let mut writer = PcapWriter::new(File::create(file.path()).unwrap()).unwrap();
    let ep4 = Endpoints::roce(
        IpAddr::from([198, 51, 100, 7]),
        IpAddr::from([203, 0, 113, 9]),
        0xd872,
    );
    let ep6 = Endpoints::roce(
        "2001:db8::7".parse().unwrap(),
        "2001:db8:1::9".parse().unwrap(),
        0xd872,
    );
    for (i, m) in mads.iter().enumerate() {
        // tshark shows a REQ's GIDs in the family of the IP header carrying it.
        let ep = match &m.message {
            CmMessage::Req(r) if rdma_cm::addr_of_gid(r.primary_path.local_gid).is_ipv6() => &ep6,
            _ => &ep4,
        };
        m.validate().unwrap();
        let bytes = m.to_bytes();
        assert_eq!(CmMad::parse(&bytes).unwrap(), *m);
        let packet = PacketRepr {
            bth: bth::Repr {
                opcode: 0x64, // UD SEND_ONLY
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: mad::GSI_QPN,
                ack_req: false,
                psn: Psn::new(i as u32),
            },
            xrceth: None,
            deth: Some(deth::Repr {
                qkey: mad::GSI_QKEY,
                src_qp: mad::GSI_QPN,
            }),
            feth: None,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload: &bytes,
        };
        let mut roce = vec![0u8; packet.buffer_len()];
        packet.emit(&mut roce).unwrap();
        let ts = Duration::from_millis(1_700_000_000_000 + i as u64);
        writer.write_roce(ts, ep, &roce).unwrap();
    }
    writer.into_inner().unwrap();
    let rows = support::tshark_fields(file.path(), &all_fields(), &[]);
    assert_eq!(rows.len(), mads.len());
    let mut decoded = 0;
    for (i, (row, m)) in rows.iter().zip(&mads).enumerate() {
        let what = format!(
            "emitted {} (packet {})",
            mad::cm_attr::name(m.header.attribute_id).unwrap_or("?"),
            i + 1
        );
        check_row(row, m, &what);
        decoded += expected(m).len();
    }
    eprintln!(
        "{TEST}: tshark decoded {} emitted CM MADs, {decoded} fields as emitted",
        mads.len()
    );
}
