use super::*;

/// A CM REQ header laid out by hand from IBA §13.4 and ch. 12: BaseVersion 1, class 0x07,
/// ClassVersion 2, Method Send (0x03), status 0, TID 0x0000_0001_0000_0abc,
/// AttributeID 0x0010, reserved 0xffff (ignored), AttributeModifier 0.
const CM_REQ: [u8; LEN] = [
    0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, // versions, method, status, cs
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x0a, 0xbc, // TID
    0x00, 0x10, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, // attr id, reserved, attr mod
];

fn cm_req() -> Repr {
    Repr {
        base_version: BASE_VERSION,
        mgmt_class: MGMT_CLASS_CM,
        class_version: CM_CLASS_VERSION,
        response: false,
        method: METHOD_SEND,
        status: 0,
        class_specific: 0,
        transaction_id: 0x0000_0001_0000_0abc,
        attribute_id: cm_attr::REQ,
        attribute_modifier: 0,
    }
}

#[test]
fn parse_cm_req_header() {
    let mut mad = [0u8; MAD_LEN];
    mad[..LEN].copy_from_slice(&CM_REQ);
    mad[LEN] = 0x42;
    let h = Header::new_checked(&mad[..]).unwrap();
    assert_eq!(h.reserved(), 0xffff);
    assert_eq!(Repr::parse(&h).unwrap(), cm_req());
    assert_eq!(h.data().len(), DATA_LEN);
    assert_eq!(h.data()[0], 0x42);
}

#[test]
fn parse_response_bit_and_every_field() {
    // R=1, method 0x7f, status 0x1234, class specific 0xabcd, attr mod 0xdeadbeef.
    let bytes: [u8; LEN] = [
        0x01, 0x07, 0x02, 0xff, 0x12, 0x34, 0xab, 0xcd, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
        0x08, 0x00, 0x1a, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef,
    ];
    let r = Repr::parse(&Header::new_checked(&bytes[..]).unwrap()).unwrap();
    assert!(r.response);
    assert_eq!(r.method, 0x7f);
    assert_eq!(r.status, 0x1234);
    assert_eq!(r.class_specific, 0xabcd);
    assert_eq!(r.transaction_id, 0x0102_0304_0506_0708);
    assert_eq!(r.attribute_id, cm_attr::APR);
    assert_eq!(r.attribute_modifier, 0xdead_beef);
    let mut out = [0u8; LEN];
    r.emit(&mut Header::new_unchecked(&mut out[..]));
    assert_eq!(out, bytes);
}

#[test]
fn emit_cm_req_header() {
    let mut out = [0x99u8; LEN + 2];
    cm_req().emit(&mut Header::new_unchecked(&mut out[..]));
    let mut expect = CM_REQ;
    expect[18] = 0; // reserved written as 0
    expect[19] = 0;
    assert_eq!(out[..LEN], expect);
    assert_eq!(out[LEN..], [0x99, 0x99], "class data untouched");
}

#[test]
fn validate_rejects_8_bit_method() {
    let mut r = cm_req();
    r.method = 0x83;
    assert_eq!(
        r.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Mad,
            field: "method",
            value: 0x83
        })
    );
    assert!(cm_req().validate().is_ok());
}

#[test]
fn cm_attribute_ids_from_spec() {
    // IBA Vol 1 ch. 12, CM attribute IDs: ClassPortInfo 0x0001, REQ 0x0010, MRA 0x0011, REJ 0x0012,
    // REP 0x0013, RTU 0x0014, DREQ 0x0015, DREP 0x0016, SIDR_REQ 0x0017,
    // SIDR_REP 0x0018, LAP 0x0019, APR 0x001A.
    let spec = [
        (cm_attr::CLASS_PORT_INFO, 0x0001, "ClassPortInfo"),
        (cm_attr::REQ, 0x0010, "REQ"),
        (cm_attr::MRA, 0x0011, "MRA"),
        (cm_attr::REJ, 0x0012, "REJ"),
        (cm_attr::REP, 0x0013, "REP"),
        (cm_attr::RTU, 0x0014, "RTU"),
        (cm_attr::DREQ, 0x0015, "DREQ"),
        (cm_attr::DREP, 0x0016, "DREP"),
        (cm_attr::SIDR_REQ, 0x0017, "SIDR_REQ"),
        (cm_attr::SIDR_REP, 0x0018, "SIDR_REP"),
        (cm_attr::LAP, 0x0019, "LAP"),
        (cm_attr::APR, 0x001a, "APR"),
    ];
    for (constant, value, name) in spec {
        assert_eq!(constant, value);
        assert_eq!(cm_attr::name(value), Some(name));
    }
    assert_eq!(cm_attr::name(0x0020), None);
    assert_eq!((GSI_QPN, GSI_QKEY), (1, 0x8001_0000));
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::Mad,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&CM_REQ[..len]).unwrap_err(), err);
        assert_eq!(
            Repr::parse(&Header::new_unchecked(&CM_REQ[..len])),
            Err(err)
        );
    }
}
