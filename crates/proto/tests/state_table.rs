//! Exhaustive check of the modify-QP state machine against an independent transcription of
//! the Linux modify-QP table (IBA Vol 1 §11.2.5; docs/INTEROP-NOTES.md §6).
//!
//! `SPEC_TABLE` below is that table transcribed as text (header lines with the ABI
//! values, the abbreviation list and the markdown table). It is parsed here, without looking
//! at the crate's `MODIFY_TABLE`, into (from, to, type) → (required, optional); then every QP
//! type × every (from, to) pair is driven through `check_modify` with masks derived from that
//! parse and the check's algorithm (INTEROP-NOTES §6):
//!
//! (1) CUR_STATE only when the current state is RTR, RTS, SQD or SQE; (2) the (cur,next)
//! entry must be valid — validity is per transition, a type the valid entry does not name has
//! empty required/optional sets; (3) every required bit present; (4) nothing outside
//! required ∪ optional ∪ {STATE}.

use std::collections::{BTreeMap, BTreeSet};

use uroce_proto::qp_state::{
    check_modify, rule, AttrMask, ModifyError, QpState, QpType, MODIFY_TABLE,
};

/// The Linux modify-QP table (docs/INTEROP-NOTES.md §6), transcribed.
const SPEC_TABLE: &str = r#"
States: RESET 0, INIT 1, RTR 2, RTS 3, SQD 4, SQE 5, ERR 6.
Attribute-mask bits: STATE 1<<0, CUR_STATE 1<<1, EN_SQD_ASYNC_NOTIFY 1<<2, ACCESS_FLAGS 1<<3, PKEY_INDEX 1<<4, PORT 1<<5, QKEY 1<<6, AV 1<<7, PATH_MTU 1<<8, TIMEOUT 1<<9, RETRY_CNT 1<<10, RNR_RETRY 1<<11, RQ_PSN 1<<12, MAX_QP_RD_ATOMIC 1<<13, ALT_PATH 1<<14, MIN_RNR_TIMER 1<<15, SQ_PSN 1<<16, MAX_DEST_RD_ATOMIC 1<<17, PATH_MIG_STATE 1<<18, CAP 1<<19, DEST_QPN 1<<20, RATE_LIMIT 1<<25. (RC `verbs.h`; kernel `enum ib_qp_attr_mask` identical)
QP types: kernel SMI 0, GSI 1, RC 2, UC 3, UD 4, RAW_PACKET 8, XRC_INI 9, XRC_TGT 10 (libibverbs RC 2, UC 3, UD 4, RAW_PACKET 8, XRC_SEND 9, XRC_RECV 10).
Abbreviations: PKI=PKEY_INDEX, ACC=ACCESS_FLAGS, CUR=CUR_STATE, MIG=PATH_MIG_STATE, MDRA=MAX_DEST_RD_ATOMIC, MQRA=MAX_QP_RD_ATOMIC, RNRT=MIN_RNR_TIMER, ALT=ALT_PATH, SQDN=EN_SQD_ASYNC_NOTIFY.

| transition | QP type | required | optional |
|---|---|---|---|
| RESET→RESET | all | – | – |
| RESET→INIT | UD | PKI, PORT, QKEY | – |
| | UC, RC, XRC_INI, XRC_TGT | PKI, PORT, ACC | – |
| | SMI, GSI | PKI, QKEY | – |
| | RAW_PACKET | PORT | – |
| INIT→INIT | UD | – | PKI, PORT, QKEY |
| | UC, RC, XRC_INI, XRC_TGT | – | PKI, PORT, ACC |
| | SMI, GSI | – | PKI, QKEY |
| INIT→RTR | UD | – | PKI, QKEY |
| | UC | AV, PATH_MTU, DEST_QPN, RQ_PSN | ALT, ACC, PKI |
| | RC | AV, PATH_MTU, DEST_QPN, RQ_PSN, MDRA, RNRT | ALT, ACC, PKI |
| | XRC_INI | AV, PATH_MTU, DEST_QPN, RQ_PSN | ALT, ACC, PKI |
| | XRC_TGT | AV, PATH_MTU, DEST_QPN, RQ_PSN, MDRA, RNRT | ALT, ACC, PKI |
| | SMI, GSI | – | PKI, QKEY |
| RTR→RTS | UD | SQ_PSN | CUR, QKEY |
| | UC | SQ_PSN | CUR, ALT, ACC, MIG |
| | RC | TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MQRA | CUR, ALT, ACC, RNRT, MIG |
| | XRC_INI | TIMEOUT, RETRY_CNT, RNR_RETRY, SQ_PSN, MQRA | CUR, ALT, ACC, MIG |
| | XRC_TGT | TIMEOUT, SQ_PSN | CUR, ALT, ACC, RNRT, MIG |
| | SMI, GSI | SQ_PSN | CUR, QKEY |
| | RAW_PACKET | – | RATE_LIMIT |
| RTS→RTS | UD | – | CUR, QKEY |
| | UC | – | CUR, ACC, ALT, MIG |
| | RC | – | CUR, ACC, ALT, MIG, RNRT |
| | XRC_INI | – | CUR, ACC, ALT, MIG |
| | XRC_TGT | – | CUR, ACC, ALT, MIG, RNRT |
| | SMI, GSI | – | CUR, QKEY |
| | RAW_PACKET | – | RATE_LIMIT |
| RTS→SQD | UD, UC, RC, XRC_INI, XRC_TGT, SMI, GSI | – | SQDN |
| SQD→RTS | UD | – | CUR, QKEY |
| | UC | – | CUR, ALT, ACC, MIG |
| | RC | – | CUR, ALT, ACC, RNRT, MIG |
| | XRC_INI | – | CUR, ALT, ACC, MIG |
| | XRC_TGT | – | CUR, ALT, ACC, RNRT, MIG |
| | SMI, GSI | – | CUR, QKEY |
| SQD→SQD | UD | – | PKI, QKEY |
| | UC | – | AV, ALT, ACC, PKI, MIG |
| | RC | – | PORT, AV, TIMEOUT, RETRY_CNT, RNR_RETRY, MQRA, MDRA, ALT, ACC, PKI, RNRT, MIG |
| | XRC_INI | – | PORT, AV, TIMEOUT, RETRY_CNT, RNR_RETRY, MQRA, ALT, ACC, PKI, MIG |
| | XRC_TGT | – | PORT, AV, TIMEOUT, MDRA, ALT, ACC, PKI, RNRT, MIG |
| | SMI, GSI | – | PKI, QKEY |
| SQE→RTS | UD | – | CUR, QKEY |
| | UC | – | CUR, ACC |
| | SMI, GSI | – | CUR, QKEY |
| | RC, XRC | (entry valid, no attributes besides STATE; RC never enters SQE) | – |
| INIT/RTR/RTS/SQD/SQE/ERR → ERR | all | – | – |
| INIT/RTR/RTS/SQD/SQE/ERR → RESET | all | – | – |
"#;

/// States in which the spec allows CUR_STATE (INTEROP-NOTES §6, step 1).
const CUR_STATE_OK: [&str; 4] = ["RTR", "RTS", "SQD", "SQE"];

/// The spec, parsed.
struct Spec {
    /// State name → ABI value.
    states: BTreeMap<String, u32>,
    /// Kernel QP-type name → ABI value.
    types: BTreeMap<String, u32>,
    /// Attribute name (as in the spec header line) → mask bit.
    bits: BTreeMap<String, u32>,
    /// (from, to) pairs that have an entry.
    valid: BTreeSet<(u32, u32)>,
    /// (from, to, type) → (required, optional) for the rows the table lists.
    listed: BTreeMap<(u32, u32, u32), (u32, u32)>,
}

/// Parses "NAME value, NAME value, ..." into a map.
fn parse_pairs(list: &str, value: impl Fn(&str) -> u32) -> BTreeMap<String, u32> {
    list.split(", ")
        .map(|item| {
            let (name, v) = item.trim().split_once(' ').expect("NAME value");
            (name.to_string(), value(v))
        })
        .collect()
}

/// The text after `prefix` on the line that starts with it.
fn line_after(prefix: &str) -> &'static str {
    SPEC_TABLE
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?}"))
}

fn parse_spec() -> Spec {
    let states = parse_pairs(line_after("States: ").trim_end_matches('.'), |v| {
        v.parse().unwrap()
    });
    let types_text = line_after("QP types: kernel ");
    let types_text = &types_text[..types_text.find(" (").unwrap()];
    let types = parse_pairs(types_text, |v| v.parse().unwrap());
    let bits_text = line_after("Attribute-mask bits: ");
    let bits_text = &bits_text[..bits_text.find('.').unwrap()];
    let bits = parse_pairs(bits_text, |v| {
        let shift: u32 = v.strip_prefix("1<<").unwrap().parse().unwrap();
        1u32 << shift
    });
    let abbrev: BTreeMap<&str, &str> = line_after("Abbreviations: ")
        .trim_end_matches('.')
        .split(", ")
        .map(|a| a.split_once('=').unwrap())
        .collect();

    let attr_set = |cell: &str| -> u32 {
        // "–" = none; a parenthesised remark ("entry valid, no attributes besides STATE")
        // also means no attributes.
        if cell == "–" || cell.starts_with('(') {
            return 0;
        }
        cell.split(", ")
            .map(|n| {
                let full = abbrev.get(n).copied().unwrap_or(n);
                *bits.get(full).unwrap_or_else(|| panic!("unknown attr {n}"))
            })
            .fold(0, |acc, b| {
                assert_eq!(acc & b, 0, "attribute listed twice in {cell}");
                acc | b
            })
    };
    let type_set = |cell: &str| -> Vec<u32> {
        if cell == "all" {
            return types.values().copied().collect();
        }
        cell.split(", ")
            .flat_map(|n| match n {
                "XRC" => vec!["XRC_INI", "XRC_TGT"],
                other => vec![other],
            })
            .map(|n| *types.get(n).unwrap_or_else(|| panic!("unknown type {n}")))
            .collect()
    };

    let mut valid = BTreeSet::new();
    let mut listed = BTreeMap::new();
    let mut transition: Option<(Vec<u32>, u32)> = None;
    let mut rows = 0;
    for line in SPEC_TABLE.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 6, "{line}");
        if cells[1] == "transition" || cells[1] == "---" {
            continue;
        }
        rows += 1;
        if !cells[1].is_empty() {
            let (from, to) = cells[1].split_once('→').unwrap();
            let froms = from
                .trim()
                .split('/')
                .map(|s| states[s.trim()])
                .collect::<Vec<_>>();
            transition = Some((froms, states[to.trim()]));
        }
        let (froms, to) = transition
            .clone()
            .expect("continuation row before any transition");
        let (req, opt) = (attr_set(cells[3]), attr_set(cells[4]));
        assert_eq!(req & opt, 0, "{line}");
        for &from in &froms {
            valid.insert((from, to));
            for t in type_set(cells[2]) {
                let prev = listed.insert((from, to, t), (req, opt));
                assert!(prev.is_none(), "type listed twice: {line}");
            }
        }
    }
    assert_eq!(rows, 47, "table rows parsed");
    assert_eq!(states.len(), 7);
    assert_eq!(types.len(), 8);
    assert_eq!(bits.len(), 22);
    Spec {
        states,
        types,
        bits,
        valid,
        listed,
    }
}

impl Spec {
    fn state(&self, v: u32) -> QpState {
        QpState::from_u32(v).unwrap()
    }
    fn qp_type(&self, v: u32) -> QpType {
        QpType::from_u32(v).unwrap()
    }
    /// Every (type, from, to) with the spec's entry: `Some((required, optional))` for a valid
    /// transition (types the entry does not name get empty sets), `None` when invalid.
    fn cases(&self) -> Vec<Case> {
        let mut out = Vec::new();
        for &t in self.types.values() {
            for &from in self.states.values() {
                for &to in self.states.values() {
                    let entry = self
                        .valid
                        .contains(&(from, to))
                        .then(|| self.listed.get(&(from, to, t)).copied().unwrap_or((0, 0)));
                    out.push((self.qp_type(t), self.state(from), self.state(to), entry));
                }
            }
        }
        assert_eq!(out.len(), 8 * 7 * 7);
        out
    }
    fn all_bits(&self) -> u32 {
        self.bits.values().fold(0, |a, b| a | b)
    }
    fn bit(&self, name: &str) -> u32 {
        self.bits[name]
    }
    fn cur_ok(&self, s: QpState) -> bool {
        CUR_STATE_OK.iter().any(|n| self.states[*n] == s.as_u32())
    }
}

/// (type, from, to, `Some((required, optional))` when the transition is valid).
type Case = (QpType, QpState, QpState, Option<(u32, u32)>);

fn mask(bits: u32) -> AttrMask {
    AttrMask::from_bits_retain(bits)
}

/// The value to pass for CUR_STATE: the actual state when the mask has the bit.
fn cur_for(bits: u32, spec: &Spec, from: QpState) -> Option<QpState> {
    (bits & spec.bit("CUR_STATE") != 0).then_some(from)
}

fn single_bits(bits: u32) -> impl Iterator<Item = u32> {
    (0..32).map(|i| 1u32 << i).filter(move |b| bits & b != 0)
}

#[test]
fn spec_header_values_match_crate() {
    let spec = parse_spec();
    for (name, &v) in &spec.states {
        let s = QpState::from_u32(v).unwrap_or_else(|| panic!("state {name}"));
        assert_eq!(s.name(), name);
        assert_eq!(s.as_u32(), v);
    }
    for (name, &v) in &spec.types {
        let t = QpType::from_u32(v).unwrap_or_else(|| panic!("type {name}"));
        assert_eq!(t.name(), name);
    }
    // libibverbs names for the XRC types (spec: XRC_SEND 9, XRC_RECV 10).
    assert_eq!(QpType::from_u32(9), Some(QpType::XrcSend));
    assert_eq!(QpType::from_u32(10), Some(QpType::XrcRecv));
    for (name, &b) in &spec.bits {
        let m = AttrMask::from_bits(b).unwrap_or_else(|| panic!("bit {name}"));
        assert_eq!(m.attr_name(), format!("IBV_QP_{name}"));
    }
    assert_eq!(AttrMask::all().bits(), spec.all_bits());
    // Values outside the spec's lists are rejected.
    for v in 0..64 {
        assert_eq!(
            QpState::from_u32(v).is_some(),
            spec.states.values().any(|&s| s == v)
        );
        assert_eq!(
            QpType::from_u32(v).is_some(),
            spec.types.values().any(|&t| t == v)
        );
    }
}

#[test]
fn crate_rules_match_spec_table() {
    let spec = parse_spec();
    for (t, from, to, entry) in spec.cases() {
        let got = rule(t, from, to);
        match entry {
            None => assert!(got.is_none(), "{t} {from}→{to} should have no rule"),
            Some((req, opt)) => {
                let r = got.unwrap_or_else(|| panic!("{t} {from}→{to} should have a rule"));
                assert_eq!((r.from, r.to), (from, to));
                assert_eq!(r.required.bits(), req, "{t} {from}→{to} required");
                assert_eq!(r.optional.bits(), opt, "{t} {from}→{to} optional");
                let listed = spec
                    .listed
                    .contains_key(&(from.as_u32(), to.as_u32(), t.as_u32()));
                assert_eq!(r.implicit, !listed, "{t} {from}→{to} implicit flag");
            }
        }
    }
    // No row in the crate's table is outside the spec's valid pairs.
    for r in MODIFY_TABLE {
        assert!(spec.valid.contains(&(r.from.as_u32(), r.to.as_u32())));
    }
}

/// (a) required attrs alone, required + each optional attr, required + all optional.
#[test]
fn legal_transitions_accept_required_and_optional() {
    let spec = parse_spec();
    let state = spec.bit("STATE");
    let mut checked = 0;
    for (t, from, to, entry) in spec.cases() {
        let Some((req, opt)) = entry else { continue };
        let mut masks = vec![state | req, state | req | opt];
        masks.extend(single_bits(opt).map(|b| state | req | b));
        if from == to {
            // Attribute-only modify: STATE absent.
            masks.push(req);
            masks.extend(single_bits(opt).map(|b| req | b));
        }
        for m in masks {
            let res = check_modify(t, from, to, mask(m), cur_for(m, &spec, from));
            assert_eq!(res, Ok(()), "{t} {from}→{to} mask {m:#x}");
            checked += 1;
        }
    }
    assert!(checked > 300, "{checked}");
}

/// (b) each missing required attr is named; with several missing, the lowest bit is named,
/// and a missing attribute is reported before a foreign one.
#[test]
fn missing_required_attribute_is_named() {
    let spec = parse_spec();
    let state = spec.bit("STATE");
    let mut checked = 0;
    for (t, from, to, entry) in spec.cases() {
        let Some((req, opt)) = entry else { continue };
        let want = |b: u32| {
            Err(ModifyError::MissingAttribute {
                attr: mask(b),
                name: mask(b).attr_name(),
                from,
                to,
            })
        };
        for b in single_bits(req) {
            let m = state | (req & !b) | opt;
            let res = check_modify(t, from, to, mask(m), cur_for(m, &spec, from));
            assert_eq!(res, want(b), "{t} {from}→{to}");
            match res {
                Err(e) => assert!(e.to_string().contains(&format!(
                    "IBV_QP_{}",
                    spec.bits.iter().find(|(_, &v)| v == b).unwrap().0
                ))),
                Ok(()) => unreachable!(),
            }
            checked += 1;
        }
        if req != 0 {
            let lowest = single_bits(req).next().unwrap();
            assert_eq!(check_modify(t, from, to, mask(state), None), want(lowest));
            // Foreign bits (all bits except CUR_STATE outside the allowed set) do not take
            // precedence over a missing one.
            let foreign = spec.all_bits() & !(req | opt | state | spec.bit("CUR_STATE"));
            assert_eq!(
                check_modify(t, from, to, mask(state | foreign), None),
                want(lowest),
                "{t} {from}→{to}"
            );
        }
    }
    assert!(checked > 50, "{checked}");
}

/// (c) every bit outside required ∪ optional ∪ {STATE} is refused and named; CUR_STATE in a
/// state that does not accept it fails the CUR_STATE rule first.
#[test]
fn foreign_attribute_is_named() {
    let spec = parse_spec();
    let state = spec.bit("STATE");
    let cur = spec.bit("CUR_STATE");
    let mut checked = 0;
    for (t, from, to, entry) in spec.cases() {
        let Some((req, opt)) = entry else { continue };
        let foreign = spec.all_bits() & !(req | opt | state);
        let unexpected = |b: u32| {
            Err(ModifyError::UnexpectedAttribute {
                attr: mask(b),
                name: mask(b).attr_name(),
                from,
                to,
            })
        };
        for b in single_bits(foreign) {
            let m = state | req | b;
            let res = check_modify(t, from, to, mask(m), cur_for(m, &spec, from));
            if b == cur && !spec.cur_ok(from) {
                assert_eq!(res, Err(ModifyError::CurStateNotAllowed { current: from }));
            } else {
                assert_eq!(res, unexpected(b), "{t} {from}→{to} bit {b:#x}");
                let text = res.unwrap_err().to_string();
                let name = spec.bits.iter().find(|(_, &v)| v == b).unwrap().0;
                assert!(text.contains(&format!("IBV_QP_{name}")), "{text}");
            }
            checked += 1;
        }
        // Several foreign bits: the lowest is reported.
        let foreign_no_cur = foreign & !cur;
        if foreign_no_cur.count_ones() >= 2 {
            let lowest = single_bits(foreign_no_cur).next().unwrap();
            assert_eq!(
                check_modify(t, from, to, mask(state | req | foreign_no_cur), None),
                unexpected(lowest)
            );
        }
    }
    assert!(checked > 1000, "{checked}");
}

/// (d) every (from, to) pair the spec table does not list is invalid for every type, whatever
/// the attributes.
#[test]
fn absent_pairs_are_invalid_transitions() {
    let spec = parse_spec();
    let state = spec.bit("STATE");
    let no_cur = spec.all_bits() & !spec.bit("CUR_STATE");
    let mut checked = 0;
    for (t, from, to, entry) in spec.cases() {
        if entry.is_some() {
            continue;
        }
        let want = Err(ModifyError::InvalidTransition {
            qp_type: t,
            from,
            to,
        });
        for m in [state, no_cur] {
            assert_eq!(
                check_modify(t, from, to, mask(m), None),
                want,
                "{t} {from}→{to}"
            );
        }
        if from == to {
            assert_eq!(check_modify(t, from, to, mask(0), None), want);
        }
        checked += 1;
    }
    // Spot checks named in the spec text.
    for (from, to) in [
        ("RESET", "RTR"),
        ("INIT", "RTS"),
        ("RTR", "RTR"),
        ("RESET", "ERR"),
    ] {
        assert!(!spec.valid.contains(&(spec.states[from], spec.states[to])));
    }
    // 49 pairs; valid: 10 single transitions + 6 → ERR + 6 → RESET.
    assert_eq!(spec.valid.len(), 22);
    assert_eq!(checked, 8 * (49 - 22));
}

/// (e) CUR_STATE: only in RTR/RTS/SQD/SQE (checked before the entry), must equal the actual
/// state, then counts as an ordinary attribute (optional in some rows, foreign in others).
#[test]
fn cur_state_semantics() {
    let spec = parse_spec();
    let state = spec.bit("STATE");
    let cur = spec.bit("CUR_STATE");
    for (t, from, to, entry) in spec.cases() {
        let m = mask(state | cur | entry.map_or(0, |(req, _)| req));
        if !spec.cur_ok(from) {
            for given in QpState::ALL {
                assert_eq!(
                    check_modify(t, from, to, m, Some(given)),
                    Err(ModifyError::CurStateNotAllowed { current: from }),
                    "{t} {from}→{to}"
                );
            }
            continue;
        }
        for given in QpState::ALL.into_iter().filter(|&g| g != from) {
            assert_eq!(
                check_modify(t, from, to, m, Some(given)),
                Err(ModifyError::CurStateMismatch {
                    given,
                    actual: from
                })
            );
        }
        assert_eq!(
            check_modify(t, from, to, m, None),
            Err(ModifyError::CurStateValueMissing)
        );
        let res = check_modify(t, from, to, m, Some(from));
        match entry {
            None => assert_eq!(
                res,
                Err(ModifyError::InvalidTransition {
                    qp_type: t,
                    from,
                    to
                })
            ),
            Some((_, opt)) if opt & cur != 0 => assert_eq!(res, Ok(()), "{t} {from}→{to}"),
            Some(_) => assert_eq!(
                res,
                Err(ModifyError::UnexpectedAttribute {
                    attr: AttrMask::CUR_STATE,
                    name: "IBV_QP_CUR_STATE",
                    from,
                    to
                }),
                "{t} {from}→{to}"
            ),
        }
    }
    // Without CUR_STATE in the mask a supplied value is ignored.
    let rts = spec.state(spec.states["RTS"]);
    assert_eq!(
        check_modify(QpType::Rc, rts, rts, mask(state), Some(QpState::Reset)),
        Ok(())
    );
}

/// A target state different from the current one without STATE in the mask is refused, and
/// unnamed mask bits are refused before anything else.
#[test]
fn state_bit_and_unknown_bits() {
    let spec = parse_spec();
    for (t, from, to, entry) in spec.cases() {
        let req = entry.map_or(0, |(r, _)| r);
        if from != to {
            assert_eq!(
                check_modify(t, from, to, mask(req), None),
                Err(ModifyError::StateAttributeMissing {
                    current: from,
                    next: to
                })
            );
        }
        for unknown in single_bits(!spec.all_bits()) {
            assert_eq!(
                check_modify(t, from, to, mask(spec.bit("STATE") | req | unknown), None),
                Err(ModifyError::UnknownAttributeBits { bits: unknown })
            );
        }
    }
    let unknown = !spec.all_bits();
    assert_eq!(unknown.count_ones(), 10);
    let rst = spec.state(spec.states["RESET"]);
    assert_eq!(
        check_modify(QpType::Rc, rst, rst, mask(u32::MAX), None),
        Err(ModifyError::UnknownAttributeBits { bits: unknown })
    );
}
