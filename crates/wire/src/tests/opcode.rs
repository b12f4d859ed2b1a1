use super::*;

/// Opcodes of IBA Vol 1 §9.2, A14, Rel. 1.5 (an independent transcription: the test parses
/// it instead of trusting the table above).
const SPEC_TABLE: &str = r"
| op (low 5 bits) | RC | UC | UD | XRC | headers after BTH | Pay | S/E/C/R |
|---|---|---|---|---|---|---|---|
| 0x00 SEND_FIRST | 0x00 | 0x20 | – | 0xA0 | [XRCETH] | yes | S, R |
| 0x01 SEND_MIDDLE | 0x01 | 0x21 | – | 0xA1 | [XRCETH] | yes | – |
| 0x02 SEND_LAST | 0x02 | 0x22 | – | 0xA2 | [XRCETH] | yes | E, C |
| 0x03 SEND_LAST_WITH_IMM | 0x03 | 0x23 | – | 0xA3 | [XRCETH] ImmDt | yes | E, C |
| 0x04 SEND_ONLY | 0x04 | 0x24 | 0x64 | 0xA4 | UD: DETH; XRC: XRCETH | yes | S, E, C, R |
| 0x05 SEND_ONLY_WITH_IMM | 0x05 | 0x25 | 0x65 | 0xA5 | UD: DETH ImmDt; XRC: XRCETH ImmDt | yes | S, E, C, R |
| 0x06 RDMA_WRITE_FIRST | 0x06 | 0x26 | – | 0xA6 | [XRCETH] RETH | yes | S |
| 0x07 RDMA_WRITE_MIDDLE | 0x07 | 0x27 | – | 0xA7 | [XRCETH] | yes | – |
| 0x08 RDMA_WRITE_LAST | 0x08 | 0x28 | – | 0xA8 | [XRCETH] | yes | E |
| 0x09 RDMA_WRITE_LAST_WITH_IMM | 0x09 | 0x29 | – | 0xA9 | [XRCETH] ImmDt | yes | E, C, R |
| 0x0A RDMA_WRITE_ONLY | 0x0A | 0x2A | – | 0xAA | [XRCETH] RETH | yes | S, E |
| 0x0B RDMA_WRITE_ONLY_WITH_IMM | 0x0B | 0x2B | – | 0xAB | [XRCETH] RETH ImmDt | yes | S, E, C, R |
| 0x0C RDMA_READ_REQUEST | 0x0C | – | – | 0xAC | [XRCETH] RETH | no | S, E |
| 0x0D RDMA_READ_RESPONSE_FIRST | 0x0D | – | – | 0xAD | AETH | yes | S |
| 0x0E RDMA_READ_RESPONSE_MIDDLE | 0x0E | – | – | 0xAE | (none) | yes | – |
| 0x0F RDMA_READ_RESPONSE_LAST | 0x0F | – | – | 0xAF | AETH | yes | E |
| 0x10 RDMA_READ_RESPONSE_ONLY | 0x10 | – | – | 0xB0 | AETH | yes | S, E |
| 0x11 ACKNOWLEDGE | 0x11 | – | – | 0xB1 | AETH | no | S, E |
| 0x12 ATOMIC_ACKNOWLEDGE | 0x12 | – | – | 0xB2 | AETH AtomicAckETH | no | S, E |
| 0x13 COMPARE_SWAP | 0x13 | – | – | 0xB3 | [XRCETH] AtomicETH | no | S, E |
| 0x14 FETCH_ADD | 0x14 | – | – | 0xB4 | [XRCETH] AtomicETH | no | S, E |
| 0x15 reserved | | | | | | | |
| 0x16 SEND_LAST_WITH_INVALIDATE | 0x16 | – | – | 0xB6 | [XRCETH] IETH | yes | E, C |
| 0x17 SEND_ONLY_WITH_INVALIDATE | 0x17 | – | – | 0xB7 | [XRCETH] IETH | yes | S, E, C, R |
| 0x1C FLUSH (IBA 1.5) | 0x1C | – | – | – | FETH RETH | no | S, E |
| 0x1D ATOMIC_WRITE (IBA 1.5) | 0x1D | – | – | – | RETH + 8-byte payload | yes (8) | S, E |
";

/// What the spec says about one opcode.
#[derive(Debug)]
struct Expected {
    opcode: u8,
    name: String,
    transport: Transport,
    headers: HeaderSet,
    payload: bool,
    exact_payload: Option<usize>,
    s: bool,
    e: bool,
    c: bool,
    r: bool,
}

fn header_tokens(text: &str, xrc: bool) -> HeaderSet {
    let mut set = HeaderSet::empty();
    for tok in text.split_whitespace() {
        set |= match tok {
            "[XRCETH]" if xrc => HeaderSet::XRCETH,
            "[XRCETH]" => HeaderSet::empty(),
            "XRCETH" => HeaderSet::XRCETH,
            "DETH" => HeaderSet::DETH,
            "FETH" => HeaderSet::FETH,
            "RETH" => HeaderSet::RETH,
            "AETH" => HeaderSet::AETH,
            "AtomicETH" => HeaderSet::ATOMIC_ETH,
            "AtomicAckETH" => HeaderSet::ATOMIC_ACK_ETH,
            "ImmDt" => HeaderSet::IMMDT,
            "IETH" => HeaderSet::IETH,
            "(none)" | "+" | "8-byte" | "payload" => HeaderSet::empty(),
            other => panic!("unknown header token {other:?}"),
        };
    }
    set
}

/// Headers of a cell for one transport. Cells of the form "UD: … ; XRC: …" list the
/// UD and XRC variants; RC/UC carry the UD list without the DETH.
fn headers_for(cell: &str, transport: Transport) -> HeaderSet {
    if let Some(rest) = cell.strip_prefix("UD: ") {
        let (ud, xrc) = rest.split_once("; XRC: ").unwrap();
        match transport {
            Transport::Ud => header_tokens(ud, false),
            Transport::Xrc => header_tokens(xrc, true),
            _ => header_tokens(ud, false) - HeaderSet::DETH,
        }
    } else {
        header_tokens(cell, transport == Transport::Xrc)
    }
}

fn spec_rows() -> Vec<Expected> {
    let mut out = Vec::new();
    for line in SPEC_TABLE.lines().filter(|l| l.starts_with("| 0x")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 8, "{line}");
        if cells[1].is_empty() {
            continue; // reserved
        }
        let name = cells[0].split_whitespace().nth(1).unwrap().to_string();
        let (payload, exact_payload) = match cells[6] {
            "yes" => (true, None),
            "no" => (false, None),
            "yes (8)" => (true, Some(8)),
            other => panic!("pay {other}"),
        };
        let flags: Vec<&str> = cells[7].split(", ").collect();
        let transports = [Transport::Rc, Transport::Uc, Transport::Ud, Transport::Xrc];
        for (col, transport) in cells[1..5].iter().zip(transports) {
            if *col == "–" {
                continue;
            }
            let opcode = u8::from_str_radix(col.trim_start_matches("0x"), 16).unwrap();
            out.push(Expected {
                opcode,
                name: name.clone(),
                transport,
                headers: headers_for(cells[5], transport),
                payload,
                exact_payload,
                s: flags.contains(&"S"),
                e: flags.contains(&"E"),
                c: flags.contains(&"C"),
                r: flags.contains(&"R"),
            });
        }
    }
    // IBA Annex A17: the RoCEv2 CNP is opcode 0x81 with 16 reserved bytes.
    out.push(Expected {
        opcode: 0x81,
        name: "CNP".into(),
        transport: Transport::Cnp,
        headers: HeaderSet::empty(),
        payload: true,
        exact_payload: Some(16),
        s: true,
        e: true,
        c: false,
        r: false,
    });
    out
}

fn operation_of(name: &str) -> Operation {
    match name {
        n if n.starts_with("SEND_") => Operation::Send,
        n if n.starts_with("RDMA_WRITE_") => Operation::RdmaWrite,
        "RDMA_READ_REQUEST" => Operation::RdmaReadRequest,
        n if n.starts_with("RDMA_READ_RESPONSE_") => Operation::RdmaReadResponse,
        "ACKNOWLEDGE" => Operation::Acknowledge,
        "ATOMIC_ACKNOWLEDGE" => Operation::AtomicAcknowledge,
        "COMPARE_SWAP" => Operation::CompareSwap,
        "FETCH_ADD" => Operation::FetchAdd,
        "FLUSH" => Operation::Flush,
        "ATOMIC_WRITE" => Operation::AtomicWrite,
        "CNP" => Operation::Cnp,
        other => panic!("no operation for {other}"),
    }
}

#[test]
fn table_matches_spec_transcription_row_by_row() {
    let rows = spec_rows();
    assert_eq!(rows.len(), OPCODE_TABLE.len(), "row count");
    for exp in &rows {
        let got = info(exp.opcode).unwrap_or_else(|| panic!("{:#04x} missing", exp.opcode));
        let ctx = format!("opcode {:#04x} {}", exp.opcode, exp.name);
        assert_eq!(got.opcode, exp.opcode, "{ctx}");
        assert_eq!(got.name, exp.name, "{ctx}");
        assert_eq!(got.transport, exp.transport, "{ctx}");
        assert_eq!(got.operation, operation_of(&exp.name), "{ctx}");
        assert_eq!(got.headers, exp.headers, "{ctx}");
        assert_eq!(got.payload, exp.payload, "{ctx}");
        assert_eq!(got.exact_payload, exp.exact_payload, "{ctx}");
        assert_eq!(got.position, Position::from_flags(exp.s, exp.e), "{ctx}");
        assert_eq!(got.starts_message(), exp.s, "{ctx}");
        assert_eq!(got.ends_message(), exp.e, "{ctx}");
        assert_eq!(got.completes_recv, exp.c, "{ctx}");
        assert_eq!(got.consumes_rwqe, exp.r, "{ctx}");
        assert_eq!(got.with_imm, exp.name.contains("WITH_IMM"), "{ctx}");
        assert_eq!(got.with_inv, exp.name.contains("WITH_INVALIDATE"), "{ctx}");
        let response = exp.name.starts_with("RDMA_READ_RESPONSE")
            || exp.name.ends_with("ACKNOWLEDGE")
            || exp.name == "CNP";
        assert_eq!(got.is_request, !response, "{ctx}");
        assert_eq!(Transport::of(exp.opcode), Some(exp.transport), "{ctx}");
    }
}

#[test]
fn write_last_with_imm_is_e_c_r_not_s() {
    let w = info(op::RC_RDMA_WRITE_LAST_WITH_IMM).unwrap();
    assert!(!w.starts_message() && w.ends_message() && w.completes_recv && w.consumes_rwqe);
}

#[test]
fn lookup_covers_exactly_the_table() {
    let mut found = 0;
    for op in 0u8..=0xff {
        match info(op) {
            Some(row) => {
                assert_eq!(row.opcode, op);
                found += 1;
            }
            None => assert!(OPCODE_TABLE.iter().all(|r| r.opcode != op)),
        }
    }
    assert_eq!(found, OPCODE_TABLE.len());
    for unknown in [
        0x15, 0x18, 0x1B, 0x1E, 0x1F, 0x2C, 0x40, 0x60, 0x80, 0xB5, 0xC0, 0xE0,
    ] {
        assert!(info(unknown).is_none(), "{unknown:#04x}");
    }
    // Sorted by opcode.
    assert!(OPCODE_TABLE.windows(2).all(|w| w[0].opcode < w[1].opcode));
}

#[test]
fn named_constants_name_their_rows() {
    let named = [
        (op::RC_SEND_FIRST, Transport::Rc, "SEND_FIRST"),
        (
            op::RC_RDMA_READ_RESPONSE_FIRST,
            Transport::Rc,
            "RDMA_READ_RESPONSE_FIRST",
        ),
        (op::RC_FLUSH, Transport::Rc, "FLUSH"),
        (op::RC_ATOMIC_WRITE, Transport::Rc, "ATOMIC_WRITE"),
        (
            op::RC_SEND_ONLY_WITH_INVALIDATE,
            Transport::Rc,
            "SEND_ONLY_WITH_INVALIDATE",
        ),
        (
            op::UC_RDMA_WRITE_ONLY_WITH_IMM,
            Transport::Uc,
            "RDMA_WRITE_ONLY_WITH_IMM",
        ),
        (op::UD_SEND_ONLY, Transport::Ud, "SEND_ONLY"),
        (
            op::UD_SEND_ONLY_WITH_IMM,
            Transport::Ud,
            "SEND_ONLY_WITH_IMM",
        ),
        (op::CNP, Transport::Cnp, "CNP"),
        (
            op::XRC_SEND_ONLY_WITH_INVALIDATE,
            Transport::Xrc,
            "SEND_ONLY_WITH_INVALIDATE",
        ),
        (
            op::XRC_ATOMIC_ACKNOWLEDGE,
            Transport::Xrc,
            "ATOMIC_ACKNOWLEDGE",
        ),
        (op::XRC_FETCH_ADD, Transport::Xrc, "FETCH_ADD"),
    ];
    for (code, transport, name) in named {
        let row = info(code).unwrap();
        assert_eq!((row.transport, row.name), (transport, name), "{code:#04x}");
    }
    assert_eq!(info(op::RC_SEND_ONLY).unwrap().to_string(), "RC SEND_ONLY");
}

#[test]
fn transport_prefixes() {
    let expect = [
        (0x00, Some(Transport::Rc)),
        (0x3f, Some(Transport::Uc)),
        (0x55, Some(Transport::Rd)),
        (0x64, Some(Transport::Ud)),
        (0x81, Some(Transport::Cnp)),
        (0xb7, Some(Transport::Xrc)),
        (0xc5, None),
        (0xff, Some(Transport::Vendor)),
    ];
    for (op, t) in expect {
        assert_eq!(Transport::of(op), t, "{op:#04x}");
    }
    assert_eq!(Transport::Xrc.prefix(), 0xa0);
    assert!(info(op::UD_SEND_ONLY).unwrap().valid_for(Transport::Ud));
    assert!(!info(op::UD_SEND_ONLY).unwrap().valid_for(Transport::Rc));
}

#[test]
fn header_lengths_from_spec_sizes() {
    // Sizes from IBA Vol 1 §9.3, Annex A14: XRCETH 4, DETH 8, RETH 16, AtomicETH 28, AETH 4,
    // AtomicAckETH 8, ImmDt 4, IETH 4, FETH 4.
    let expect = [
        (op::RC_SEND_MIDDLE, 0),
        (op::RC_RDMA_WRITE_ONLY_WITH_IMM, 20),
        (op::XRC_RDMA_WRITE_ONLY_WITH_IMM, 24),
        (op::RC_ATOMIC_ACKNOWLEDGE, 12),
        (op::XRC_COMPARE_SWAP, 32),
        (op::UD_SEND_ONLY_WITH_IMM, 12),
        (op::RC_FLUSH, 20),
        (op::XRC_SEND_LAST_WITH_INVALIDATE, 8),
        (op::CNP, 0),
    ];
    for (code, len) in expect {
        assert_eq!(info(code).unwrap().header_len(), len, "{code:#04x}");
    }
}

#[test]
fn header_order_is_wire_order() {
    let order: Vec<HeaderSet> = (HeaderSet::IMMDT | HeaderSet::RETH | HeaderSet::XRCETH)
        .header_order()
        .collect();
    assert_eq!(
        order,
        [HeaderSet::XRCETH, HeaderSet::RETH, HeaderSet::IMMDT]
    );
    let order: Vec<HeaderSet> = info(op::RC_FLUSH).unwrap().headers.header_order().collect();
    assert_eq!(order, [HeaderSet::FETH, HeaderSet::RETH]);
    assert_eq!(HeaderSet::AETH.kind(), Some(HeaderKind::Aeth));
    assert_eq!(HeaderSet::FETH.kind(), Some(HeaderKind::Feth));
    assert_eq!((HeaderSet::AETH | HeaderSet::RETH).kind(), None);
}

#[test]
fn opcode_for_inverts_the_table() {
    for row in OPCODE_TABLE {
        assert_eq!(
            opcode_for(
                row.transport,
                row.operation,
                row.position,
                row.with_imm,
                row.with_inv
            ),
            Some(row.opcode),
            "{row}"
        );
    }
    // Message flags only pick the opcode of the final packet.
    let send_imm = |pos| opcode_for(Transport::Rc, Operation::Send, pos, true, false);
    assert_eq!(send_imm(Position::First), Some(op::RC_SEND_FIRST));
    assert_eq!(send_imm(Position::Middle), Some(op::RC_SEND_MIDDLE));
    assert_eq!(send_imm(Position::Last), Some(op::RC_SEND_LAST_WITH_IMM));
    assert_eq!(
        opcode_for(Transport::Xrc, Operation::Send, Position::Only, false, true),
        Some(op::XRC_SEND_ONLY_WITH_INVALIDATE)
    );
    assert_eq!(
        opcode_for(
            Transport::Ud,
            Operation::Send,
            Position::First,
            false,
            false
        ),
        None
    );
    assert_eq!(
        opcode_for(
            Transport::Uc,
            Operation::RdmaReadRequest,
            Position::Only,
            false,
            false
        ),
        None
    );
    assert_eq!(
        opcode_for(Transport::Uc, Operation::Send, Position::Only, false, true),
        None
    );
    assert_eq!(
        opcode_for(Transport::Rc, Operation::Send, Position::Only, true, true),
        None
    );
    assert_eq!(
        opcode_for(
            Transport::Rc,
            Operation::RdmaWrite,
            Position::Only,
            false,
            true
        ),
        None
    );
}
