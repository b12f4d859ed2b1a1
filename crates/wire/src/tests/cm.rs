use super::rdma_cm::{self, CmaHeader, PortSpace};
use super::*;
use core::net::IpAddr;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The class data of the REQ `rping` (Linux 6.1, rdma_rxe) sent from 198.18.0.3 to
/// 198.18.0.2 port 7174.
const KERNEL_REQ: &str = "8d0ef1d6000000000000000001061c06505400fffe12000300000000000000000000110100000001000000a0e63b75a7ffff37f0ffffffff00000000000000000000ffffc612000300000000000000000000ffffc61200024ef2d0000040009800000000000000000000000000000000000000000000000000000000000000000000000000000000000000000040abf9000000000000000000000000c6120003000000000000000000000000c61200020000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000";

#[test]
fn kernel_req_fields() {
    let data = hex(KERNEL_REQ);
    assert_eq!(data.len(), LEN);
    let v = Req::new_checked(&data[..]).unwrap();
    let r = ReqRepr::parse(&v).unwrap();
    assert_eq!(r.local_comm_id, 0x8d0e_f1d6);
    assert_eq!(r.service_id, 0x0000_0000_0106_1c06);
    assert_eq!(
        rdma_cm::parse_service_id(r.service_id),
        Some((PortSpace::Tcp, 7174))
    );
    assert_eq!(r.local_ca_guid, 0x5054_00ff_fe12_0003);
    assert_eq!(r.local_qpn, 0x11);
    assert_eq!(r.responder_resources, 1);
    assert_eq!(r.initiator_depth, 1);
    assert_eq!(r.remote_cm_response_timeout, 0x14);
    assert_eq!(r.transport_service_type, 0);
    assert_eq!(r.starting_psn, 0xe6_3b75);
    assert_eq!(r.local_cm_response_timeout, 0x14);
    assert_eq!(r.retry_count, 7);
    assert_eq!(r.pkey, 0xffff);
    assert_eq!(r.path_mtu, 3);
    assert_eq!(r.rnr_retry_count, 7);
    assert_eq!(r.max_cm_retries, 15);
    let p = r.primary_path;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
    assert_eq!(
        rdma_cm::addr_of_gid(p.local_gid),
        IpAddr::from([198, 18, 0, 3])
    );
    assert_eq!(
        rdma_cm::addr_of_gid(p.remote_gid),
        IpAddr::from([198, 18, 0, 2])
    );
    assert_eq!(p.flow_label, 0x4_ef2d);
    assert_eq!(p.hop_limit, 64);
    assert_eq!(p.local_ack_timeout, 0x13);
    assert!(!p.subnet_local);
    assert_eq!(r.alternate_path, PathRepr::default());
    let cma = CmaHeader::parse(&r.private_data).unwrap();
    assert_eq!(cma.version, 0);
    assert_eq!(cma.src_port, 0xabf9);
    assert_eq!(cma.src_ip, IpAddr::from([198, 18, 0, 3]));
    assert_eq!(cma.dst_ip, IpAddr::from([198, 18, 0, 2]));
    // Byte-identical re-emission, of the REQ and of the address header.
    let mut out = [0xaau8; LEN];
    r.emit(&mut Req::new_unchecked(&mut out[..]));
    assert_eq!(out[..], data[..]);
    let mut pd = r.private_data;
    pd[..rdma_cm::HEADER_LEN].fill(0xee);
    cma.emit(&mut pd).unwrap();
    assert_eq!(pd, r.private_data);
}

#[test]
fn packed_bits_sit_where_the_tables_say() {
    let mut buf = [0u8; LEN];
    let mut v = Req::new_unchecked(&mut buf[..]);
    v.set_remote_cm_response_timeout(0x1f);
    v.set_transport_service_type(1);
    v.set_e2e_flow_control(true);
    v.set_retry_count(5);
    v.set_sap_supported(true);
    assert_eq!(buf[43], 0b1111_1011);
    assert_eq!(buf[47], 0b0000_0101);
    assert_eq!(buf[139], 0b0000_0100);
    let mut buf = [0u8; LEN];
    let mut v = Rep::new_unchecked(&mut buf[..]);
    v.set_local_qpn(0xab_cdef);
    v.set_rnr_retry_count(6);
    v.set_srq(true);
    assert_eq!(buf[12..16], [0xab, 0xcd, 0xef, 0]);
    assert_eq!(buf[27], 0b1101_0000);
    let mut buf = [0u8; LEN];
    let mut v = Rej::new_unchecked(&mut buf[..]);
    v.set_message_rejected(msg_kind::REP);
    v.set_reject_info_length(0x7f);
    assert_eq!(buf[8..10], [0b0100_0000, 0b1111_1110]);
    let mut buf = [0u8; LEN];
    let mut v = Lap::new_unchecked(&mut buf[..]);
    v.set_alternate_path(&PathRepr {
        flow_label: 0xf_ffff,
        traffic_class: 0x12,
        packet_rate: 0x3f,
        sl: 0xf,
        subnet_local: true,
        local_ack_timeout: 0x1f,
        ..PathRepr::default()
    });
    assert_eq!(buf[56..64], [0xff, 0xff, 0xf0, 0x12, 0, 0x3f, 0xf8, 0xf8]);
}

#[test]
fn short_buffers_are_refused_and_views_never_panic() {
    let short = [0u8; LEN - 1];
    assert!(matches!(
        Req::new_checked(&short[..]),
        Err(WireError::Truncated { .. })
    ));
    let v = Req::new_unchecked(&short[..4]);
    assert_eq!(v.private_data(), [0u8; pd::REQ]);
    assert_eq!(v.primary_path().flow_label, 0);
    assert!(CmMad::parse(&[0u8; 255]).is_err());
    assert!(CmaHeader::parse(&[0u8; 35]).is_err());
}

#[test]
fn cm_mad_checks_class_and_keeps_unknown_attributes() {
    let mut m = [0u8; mad::MAD_LEN];
    m[0] = 1;
    m[1] = 0x04; // not CM
    assert!(matches!(
        CmMad::parse(&m),
        Err(WireError::InvalidField {
            field: "mgmt_class",
            ..
        })
    ));
    m[1] = mad::MGMT_CLASS_CM;
    m[16] = 0xff; // a vendor attribute, 0xff00
    m[100] = 0x5a;
    let parsed = CmMad::parse(&m).unwrap();
    assert!(matches!(
        parsed.message,
        CmMessage::Other {
            attribute_id: 0xff00,
            ..
        }
    ));
    assert_eq!(parsed.to_bytes(), m);
}

/// ClassPortInfo (IBA 13.4.8.1): a MAD whose every field holds a distinct value, written
/// by hand at the offsets of the attribute's table, parses to those values and re-emits
/// byte for byte; values wider than their fields are refused.
#[test]
fn class_port_info_layout() {
    let mut m = [0u8; mad::MAD_LEN];
    m[0] = 1;
    m[1] = mad::MGMT_CLASS_CM;
    m[2] = mad::CM_CLASS_VERSION;
    m[3] = 0x81; // GetResp
    m[17] = 0x01; // ClassPortInfo
    let d = &mut m[mad::LEN..];
    d[0] = 1; // BaseVersion
    d[1] = 2; // ClassVersion
    d[2..4].copy_from_slice(&0x0302u16.to_be_bytes()); // CapabilityMask
                                                       // CapabilityMask2 0x0123456 (27 bits), RespTimeValue 19.
    d[4..8].copy_from_slice(&((0x012_3456u32 << 5) | 19).to_be_bytes());
    for (i, b) in d[8..24].iter_mut().enumerate() {
        *b = 0xa0 + i as u8; // RedirectGID
    }
    // RedirectTC 0x11, SL 0x2, FL 0x34567.
    d[24..28].copy_from_slice(&(0x11u32 << 24 | 0x2 << 20 | 0x3_4567).to_be_bytes());
    d[28..30].copy_from_slice(&0x1234u16.to_be_bytes()); // RedirectLID
    d[30..32].copy_from_slice(&0xffffu16.to_be_bytes()); // RedirectP_Key
    d[33..36].copy_from_slice(&[0x00, 0x00, 0x01]); // RedirectQP 1
    d[36..40].copy_from_slice(&0x8001_0000u32.to_be_bytes()); // RedirectQ_Key
    for (i, b) in d[40..56].iter_mut().enumerate() {
        *b = 0xc0 + i as u8; // TrapGID
    }
    // TrapTC 0x22, SL 0xf, FL 0xfffff.
    d[56..60].copy_from_slice(&(0x22u32 << 24 | 0xf << 20 | 0xf_ffff).to_be_bytes());
    d[60..62].copy_from_slice(&0x5678u16.to_be_bytes()); // TrapLID
    d[62..64].copy_from_slice(&0x7fffu16.to_be_bytes()); // TrapP_Key
    d[64] = 64; // TrapHL
    d[65..68].copy_from_slice(&[0xab, 0xcd, 0xef]); // TrapQP
    d[68..72].copy_from_slice(&0x1357_9bdfu32.to_be_bytes()); // TrapQ_Key
    let parsed = CmMad::parse(&m).unwrap();
    let CmMessage::ClassPortInfo(c) = parsed.message else {
        panic!("{:?}", parsed.message)
    };
    let gid = |base: u8| core::array::from_fn::<u8, 16, _>(|i| base + i as u8);
    assert_eq!(
        c,
        ClassPortInfoRepr {
            base_version: 1,
            class_version: 2,
            capability_mask: 0x0302,
            capability_mask2: 0x012_3456,
            resp_time_value: 19,
            redirect: PortInfoTarget {
                gid: gid(0xa0),
                tc: 0x11,
                sl: 0x2,
                fl: 0x3_4567,
                lid: 0x1234,
                pkey: 0xffff,
                qp: 1,
                qkey: 0x8001_0000,
            },
            trap: PortInfoTarget {
                gid: gid(0xc0),
                tc: 0x22,
                sl: 0xf,
                fl: 0xf_ffff,
                lid: 0x5678,
                pkey: 0x7fff,
                qp: 0xab_cdef,
                qkey: 0x1357_9bdf,
            },
            trap_hl: 64,
        }
    );
    parsed.validate().unwrap();
    assert_eq!(parsed.to_bytes(), m);

    for bad in [
        ClassPortInfoRepr {
            capability_mask2: 1 << 27,
            ..c
        },
        ClassPortInfoRepr {
            resp_time_value: 32,
            ..c
        },
        ClassPortInfoRepr {
            redirect: PortInfoTarget {
                sl: 16,
                ..c.redirect
            },
            ..c
        },
        ClassPortInfoRepr {
            trap: PortInfoTarget {
                fl: 1 << 20,
                ..c.trap
            },
            ..c
        },
        ClassPortInfoRepr {
            trap: PortInfoTarget {
                qp: 1 << 24,
                ..c.trap
            },
            ..c
        },
    ] {
        assert!(
            matches!(bad.validate(), Err(WireError::InvalidField { .. })),
            "{bad:?}"
        );
    }
    assert!(ClassPortInfoRepr::parse(&[0u8; CLASS_PORT_INFO_LEN - 1]).is_err());
}

#[test]
fn validate_rejects_wide_values() {
    let r = RepRepr {
        local_comm_id: 1,
        remote_comm_id: 2,
        local_qkey: 0,
        local_qpn: 0x100_0000,
        local_eecn: 0,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 0,
        failover_accepted: 0,
        e2e_flow_control: false,
        rnr_retry_count: 0,
        srq: false,
        local_ca_guid: 0,
        private_data: [0; pd::REP],
    };
    assert_eq!(
        r.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Cm,
            field: "local_qpn",
            value: 0x100_0000
        })
    );
    assert!(RepRepr { local_qpn: 5, ..r }.validate().is_ok());
}

#[test]
fn service_ids() {
    assert_eq!(PortSpace::Tcp.service_id(18515), 0x0000_0000_0106_4853);
    assert_eq!(PortSpace::Udp.service_id(7174), 0x0000_0000_0111_1c06);
    assert_eq!(PortSpace::Ib.service_id(1), 0x0000_0000_013f_0001);
    assert_eq!(PortSpace::IpoIb.service_id(2), 0x0000_0000_0002_0002);
    assert_eq!(rdma_cm::parse_service_id(0x0000_0001_0106_4853), None);
    assert_eq!(rdma_cm::parse_service_id(0x0000_0000_0107_4853), None);
}

fn arr<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    proptest::collection::vec(any::<u8>(), N).prop_map(|v| v.try_into().unwrap())
}

fn arb_path() -> impl Strategy<Value = PathRepr> {
    (
        any::<(u16, u16)>(),
        arr::<16>(),
        arr::<16>(),
        0u32..1 << 20,
        0u8..64,
        any::<(u8, u8)>(),
        0u8..16,
        any::<bool>(),
        0u8..32,
    )
        .prop_map(
            |(lids, lg, rg, fl, rate, (tc, hop), sl, sn, ack)| PathRepr {
                local_lid: lids.0,
                remote_lid: lids.1,
                local_gid: lg,
                remote_gid: rg,
                flow_label: fl,
                packet_rate: rate,
                traffic_class: tc,
                hop_limit: hop,
                sl,
                subnet_local: sn,
                local_ack_timeout: ack,
            },
        )
}

prop_compose! {
    fn arb_req()(
        ids in any::<(u32, u64, u64, u32)>(),
        qpns in (0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24),
        rr in any::<(u8, u8)>(),
        t in (0u8..32, 0u8..4, 0u8..32, 0u8..8, 0u8..16, 0u8..8, 0u8..16, 0u8..8),
        flags in any::<[bool; 4]>(),
        pkey in any::<u16>(),
        primary_path in arb_path(),
        alternate_path in arb_path(),
        private_data in arr::<{ pd::REQ }>(),
    ) -> ReqRepr {
        ReqRepr {
            local_comm_id: ids.0,
            service_id: ids.1,
            local_ca_guid: ids.2,
            local_qkey: ids.3,
            local_qpn: qpns.0,
            responder_resources: rr.0,
            local_eecn: qpns.1,
            initiator_depth: rr.1,
            remote_eecn: qpns.2,
            remote_cm_response_timeout: t.0,
            transport_service_type: t.1,
            e2e_flow_control: flags[0],
            starting_psn: qpns.3,
            local_cm_response_timeout: t.2,
            retry_count: t.3,
            pkey,
            path_mtu: t.4,
            rdc_exists: flags[1],
            rnr_retry_count: t.5,
            max_cm_retries: t.6,
            srq: flags[2],
            extended_transport_type: t.7,
            primary_path,
            alternate_path,
            sap_supported: flags[3],
            private_data,
        }
    }
}

/// Any valid CM message.
pub(crate) fn arb_message() -> impl Strategy<Value = CmMessage> {
    let ids = any::<(u32, u32)>();
    prop_oneof![
        arb_req().prop_map(CmMessage::Req),
        (ids, 0u8..4, 0u8..32, arr::<{ pd::MRA }>()).prop_map(|(i, m, t, p)| CmMessage::Mra(
            MraRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                message_mraed: m,
                service_timeout: t,
                private_data: p
            }
        )),
        (
            ids,
            0u8..4,
            0u8..128,
            any::<u16>(),
            arr::<INFO_LEN>(),
            arr::<{ pd::REJ }>()
        )
            .prop_map(|(i, m, l, reason, ari, p)| CmMessage::Rej(RejRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                message_rejected: m,
                reject_info_length: l,
                reason,
                ari,
                private_data: p
            })),
        (
            ids,
            any::<(u32, u8, u8, u64)>(),
            (0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24),
            (0u8..32, 0u8..4, 0u8..8),
            any::<[bool; 2]>(),
            arr::<{ pd::REP }>()
        )
            .prop_map(|(i, a, q, t, f, p)| CmMessage::Rep(RepRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                local_qkey: a.0,
                local_qpn: q.0,
                local_eecn: q.1,
                starting_psn: q.2,
                responder_resources: a.1,
                initiator_depth: a.2,
                target_ack_delay: t.0,
                failover_accepted: t.1,
                e2e_flow_control: f[0],
                rnr_retry_count: t.2,
                srq: f[1],
                local_ca_guid: a.3,
                private_data: p
            })),
        (ids, arr::<{ pd::RTU }>()).prop_map(|(i, p)| CmMessage::Rtu(RtuRepr {
            local_comm_id: i.0,
            remote_comm_id: i.1,
            private_data: p
        })),
        (ids, 0u32..1 << 24, arr::<{ pd::DREQ }>()).prop_map(|(i, q, p)| CmMessage::Dreq(
            DreqRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                remote_qpn: q,
                private_data: p
            }
        )),
        (ids, arr::<{ pd::DREP }>()).prop_map(|(i, p)| CmMessage::Drep(DrepRepr {
            local_comm_id: i.0,
            remote_comm_id: i.1,
            private_data: p
        })),
        (
            ids,
            0u32..1 << 24,
            0u8..32,
            arb_path(),
            arr::<{ pd::LAP }>()
        )
            .prop_map(|(i, q, t, path, p)| CmMessage::Lap(LapRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                remote_qpn: q,
                remote_cm_response_timeout: t,
                alternate_path: path,
                private_data: p
            })),
        (
            ids,
            any::<(u8, u8)>(),
            arr::<INFO_LEN>(),
            arr::<{ pd::APR }>()
        )
            .prop_map(|(i, s, ai, p)| CmMessage::Apr(AprRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                additional_info_length: s.0,
                status: s.1,
                additional_info: ai,
                private_data: p
            })),
        (any::<(u32, u16, u64)>(), arr::<{ pd::SIDR_REQ }>()).prop_map(|(a, p)| {
            CmMessage::SidrReq(SidrReqRepr {
                request_id: a.0,
                pkey: a.1,
                service_id: a.2,
                private_data: p,
            })
        }),
        (
            any::<(u32, u8, u8, u64, u32)>(),
            0u32..1 << 24,
            arr::<INFO_LEN>(),
            arr::<{ pd::SIDR_REP }>()
        )
            .prop_map(|(a, q, ai, p)| CmMessage::SidrRep(SidrRepRepr {
                request_id: a.0,
                status: a.1,
                additional_info_length: a.2,
                qpn: q,
                service_id: a.3,
                qkey: a.4,
                additional_info: ai,
                private_data: p
            })),
    ]
}

proptest! {
    #[test]
    fn parse_emit_roundtrip(msg in arb_message(), tid in any::<u64>()) {
        prop_assert!(msg.validate().is_ok());
        let mad = CmMad::new(tid, msg);
        prop_assert!(mad.validate().is_ok());
        let bytes = mad.to_bytes();
        prop_assert_eq!(CmMad::parse(&bytes).unwrap(), mad);
        // And emit(parse(b)) == b for what emit produced.
        prop_assert_eq!(CmMad::parse(&bytes).unwrap().to_bytes(), bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(m) = CmMad::parse(&bytes) {
            // Whatever parses re-parses to the same value after emit.
            prop_assert_eq!(CmMad::parse(&m.to_bytes()).unwrap(), m);
        }
        let _ = CmaHeader::parse(&bytes);
    }

    #[test]
    fn cma_header_roundtrip(v6 in any::<bool>(), a in any::<[u8; 16]>(), b in any::<[u8; 16]>(), port in any::<u16>()) {
        let (src, dst) = if v6 {
            (IpAddr::from(a), IpAddr::from(b))
        } else {
            (IpAddr::from([a[0], a[1], a[2], a[3]]), IpAddr::from([b[0], b[1], b[2], b[3]]))
        };
        let h = CmaHeader { version: 0, src_port: port, src_ip: src, dst_ip: dst };
        let mut out = [0u8; pd::REQ];
        h.emit(&mut out).unwrap();
        prop_assert_eq!(CmaHeader::parse(&out).unwrap(), h);
        prop_assert_eq!(out[1] >> 4, if v6 { 6 } else { 4 });
    }
}
