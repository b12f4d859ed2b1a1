use super::*;

/// The AETH of the IPv6 test vector of docs/INTEROP-NOTES.md §3: ACK syndrome 0x1F, MSN 7.
const SPEC_ACK: [u8; LEN] = [0x1f, 0x00, 0x00, 0x07];

#[test]
fn parse_spec_vector() {
    let h = Header::new_checked(&SPEC_ACK[..]).unwrap();
    assert_eq!(
        Repr::parse(&h).unwrap(),
        Repr {
            syndrome: Syndrome::Ack { credit: 0x1f },
            msn: 7
        }
    );
    assert_eq!(Syndrome::ACK_NO_CREDIT.to_byte(), 0x1f);
}

#[test]
fn parse_each_class_by_hand() {
    let cases: [([u8; 4], Syndrome, u32); 6] = [
        (
            [0x00, 0x12, 0x34, 0x56],
            Syndrome::Ack { credit: 0 },
            0x12_3456,
        ),
        (
            [0x2e, 0xff, 0xff, 0xff],
            Syndrome::RnrNak { timer: 14 },
            0xff_ffff,
        ),
        (
            [0x60, 0x00, 0x00, 0x01],
            Syndrome::Nak(NakCode::PsnSequenceError),
            1,
        ),
        (
            [0x62, 0x00, 0x00, 0x02],
            Syndrome::Nak(NakCode::RemoteAccessError),
            2,
        ),
        (
            [0x64, 0x00, 0x00, 0x03],
            Syndrome::Nak(NakCode::InvalidRdRequest),
            3,
        ),
        (
            [0x7f, 0x00, 0x01, 0x00],
            Syndrome::Nak(NakCode::Reserved(31)),
            0x100,
        ),
    ];
    for (bytes, syndrome, msn) in cases {
        let h = Header::new_checked(&bytes[..]).unwrap();
        assert_eq!(
            Repr::parse(&h).unwrap(),
            Repr { syndrome, msn },
            "{bytes:02x?}"
        );
        let mut out = [0u8; LEN];
        Repr { syndrome, msn }.emit(&mut Header::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }
}

#[test]
fn syndrome_bytes_for_every_value() {
    // From the IBA §9.3.5 table: 0x00-0x1F ACK, 0x20-0x3F RNR, 0x40-0x5F reserved,
    // 0x60-0x7F NAK (0x60..0x64 named), bit 7 reserved.
    for b in 0u8..=0xff {
        let got = Syndrome::from_byte(b);
        let expect = if b >= 0x80 || (0x40..0x60).contains(&b) {
            Err(WireError::InvalidField {
                header: HeaderKind::Aeth,
                field: "syndrome",
                value: u64::from(b),
            })
        } else if b < 0x20 {
            Ok(Syndrome::Ack { credit: b })
        } else if b < 0x40 {
            Ok(Syndrome::RnrNak { timer: b - 0x20 })
        } else {
            Ok(Syndrome::Nak(match b {
                0x60 => NakCode::PsnSequenceError,
                0x61 => NakCode::InvalidRequest,
                0x62 => NakCode::RemoteAccessError,
                0x63 => NakCode::RemoteOperationalError,
                0x64 => NakCode::InvalidRdRequest,
                _ => NakCode::Reserved(b - 0x60),
            }))
        };
        assert_eq!(got, expect, "syndrome {b:#04x}");
        if let Ok(s) = got {
            assert_eq!(s.to_byte(), b);
            assert!(s.validate().is_ok());
        }
    }
}

#[test]
fn validate_rejects_lossy_syndromes_and_wide_msn() {
    for bad in [
        Syndrome::Ack { credit: 0x20 },
        Syndrome::RnrNak { timer: 0xff },
        Syndrome::Nak(NakCode::Reserved(2)),
        Syndrome::Nak(NakCode::Reserved(32)),
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
    let r = Repr {
        syndrome: Syndrome::ACK_NO_CREDIT,
        msn: 0x0100_0000,
    };
    assert_eq!(
        r.validate(),
        Err(WireError::InvalidField {
            header: HeaderKind::Aeth,
            field: "msn",
            value: 0x0100_0000
        })
    );
}

/// Parses "a→b, c→d, …" (the notation of the tables below).
fn spec_pairs(text: &str) -> Vec<(u8, &str)> {
    text.split(", ")
        .map(|pair| {
            let (k, v) = pair.split_once('→').unwrap();
            (k.trim().parse().unwrap(), v.trim())
        })
        .collect()
}

/// "655.36" (ms) → 655360 (µs), without floating point.
fn ms_to_micros(ms: &str) -> u64 {
    let (int, frac) = ms.split_once('.').unwrap_or((ms, ""));
    let frac_micros = format!("{frac:0<3}");
    int.parse::<u64>().unwrap() * 1000 + frac_micros.parse::<u64>().unwrap()
}

#[test]
fn credit_table_matches_spec_text() {
    // Credit count encoding, IBA Vol 1 §9.7 (end-to-end flow control).
    let spec = "0→0, 1→1, 2→2, 3→3, 4→4, 5→6, 6→8, 7→12, 8→16, 9→24, 10→32, 11→48, \
                12→64, 13→96, 14→128, 15→192, 16→256, 17→384, 18→512, 19→768, 20→1024, \
                21→1536, 22→2048, 23→3072, 24→4096, 25→6144, 26→8192, 27→12288, \
                28→16384, 29→24576, 30→32768";
    let pairs = spec_pairs(spec);
    assert_eq!(pairs.len(), 31);
    for (code, credits) in pairs {
        assert_eq!(
            credit_count(code),
            Some(credits.parse().unwrap()),
            "code {code}"
        );
    }
    assert_eq!(credit_count(CREDIT_INVALID), None);
    assert_eq!(credit_count(0x20), None);
    assert_eq!(credit_count(0xff), None);
}

#[test]
fn rnr_table_matches_spec_text() {
    // RNR timer encoding, IBA Vol 1 §9.7 (milliseconds).
    let spec = "0→655.36, 1→0.01, 2→0.02, 3→0.03, 4→0.04, 5→0.06, 6→0.08, 7→0.12, \
                8→0.16, 9→0.24, 10→0.32, 11→0.48, 12→0.64, 13→0.96, 14→1.28, 15→1.92, \
                16→2.56, 17→3.84, 18→5.12, 19→7.68, 20→10.24, 21→15.36, 22→20.48, \
                23→30.72, 24→40.96, 25→61.44, 26→81.92, 27→122.88, 28→163.84, \
                29→245.76, 30→327.68, 31→491.52";
    let pairs = spec_pairs(spec);
    assert_eq!(pairs.len(), 32);
    for (code, ms) in pairs {
        assert_eq!(rnr_timer_micros(code), ms_to_micros(ms), "code {code}");
        assert_eq!(rnr_timer_micros(code | 0xe0), ms_to_micros(ms));
    }
}

#[test]
fn every_short_length_is_truncated() {
    for len in 0..LEN {
        let err = WireError::Truncated {
            header: HeaderKind::Aeth,
            offset: 0,
            needed: LEN,
            available: len,
        };
        assert_eq!(Header::new_checked(&SPEC_ACK[..len]).unwrap_err(), err);
        assert_eq!(
            Repr::parse(&Header::new_unchecked(&SPEC_ACK[..len])),
            Err(err)
        );
    }
}

#[test]
fn setters_write_raw_fields() {
    let mut buf = [0u8; LEN];
    let mut h = Header::new_unchecked(&mut buf[..]);
    h.set_syndrome(0x61);
    h.set_msn(0xab_cdef);
    assert_eq!(buf, [0x61, 0xab, 0xcd, 0xef]);
}
