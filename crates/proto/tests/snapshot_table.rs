//! Pins the whole `MODIFY_TABLE` as a readable text table (one line per rule), so any change
//! to the state-machine data shows up as a reviewable snapshot diff. The snapshot was reviewed
//! line by line against IBA Vol 1 §11.2.5 and Linux's table (docs/INTEROP-NOTES.md §6).

use std::fmt::Write as _;

use uroce_proto::qp_state::{AttrMask, QpType, MODIFY_TABLE};

/// "A, B, C" with the `IBV_QP_` prefix dropped, or "–" for an empty set.
fn names(m: AttrMask) -> String {
    if m.is_empty() {
        return "–".to_string();
    }
    m.single_bits()
        .map(|b| b.attr_name().trim_start_matches("IBV_QP_"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn render() -> String {
    let mut out = String::new();
    for r in MODIFY_TABLE {
        let types = if r.types.len() == QpType::ALL.len() {
            "all".to_string()
        } else {
            r.types
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(",")
        };
        let transition = format!("{}→{}", r.from, r.to);
        let mark = if r.implicit { " (implicit)" } else { "" };
        writeln!(
            out,
            "{transition:<12} {types:<32} required: {:<72} optional: {}{mark}",
            names(r.required),
            names(r.optional),
        )
        .unwrap();
    }
    out
}

#[test]
fn modify_table_snapshot() {
    insta::assert_snapshot!("modify_table", render());
}

#[test]
fn render_has_one_line_per_rule() {
    assert_eq!(render().lines().count(), MODIFY_TABLE.len());
}
