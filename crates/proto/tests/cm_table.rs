//! Pins the whole CM transition table as readable text (one line per row, then per state
//! the inputs it drops or refuses), so any change to the state machine shows up as a
//! reviewable snapshot diff. Reviewed against IBA Vol 1 §12.9.6-12.9.8.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use uroce_proto::cm::table::{transition, Action, CmInput, CmState, CM_TABLE};

fn action(a: &Action) -> String {
    match a {
        Action::Report(kind) => format!("report {kind:?}"),
        other => format!("{other:?}"),
    }
}

fn render() -> String {
    let mut out = String::new();
    for t in CM_TABLE {
        let actions: Vec<String> = t.actions.iter().map(action).collect();
        writeln!(
            out,
            "{:<14} {:<17} → {:<14} {}",
            t.from.name(),
            format!("{:?}", t.input),
            t.to.name(),
            if actions.is_empty() {
                "–".to_string()
            } else {
                actions.join(", ")
            }
        )
        .unwrap();
    }
    writeln!(out).unwrap();
    for s in CmState::ALL {
        let dropped: Vec<String> = CmInput::ALL
            .iter()
            .filter(|i| transition(s, **i).is_none())
            .map(|i| format!("{i:?}"))
            .collect();
        writeln!(out, "{:<14} drops/refuses: {}", s.name(), dropped.join(" ")).unwrap();
    }
    out
}

#[test]
fn cm_table_snapshot() {
    insta::assert_snapshot!("cm_table", render());
}

#[test]
fn one_row_per_state_and_input() {
    let mut seen = BTreeSet::new();
    for t in CM_TABLE {
        assert!(
            seen.insert((t.from, t.input)),
            "two rows for ({}, {:?})",
            t.from,
            t.input
        );
    }
}

#[test]
fn every_state_but_listen_and_idle_can_be_left() {
    // No state is a trap: from each state some row leads elsewhere, and every state is
    // entered by some row (IDLE and LISTEN are where connections start).
    for s in CmState::ALL {
        let leaves = CM_TABLE.iter().any(|t| t.from == s && t.to != s);
        let entered = CM_TABLE.iter().any(|t| t.to == s && t.from != s);
        assert!(leaves, "{s} is never left");
        if s != CmState::Listen {
            assert!(entered, "{s} is never entered");
        }
    }
}

#[test]
fn retried_messages_have_bounded_retries() {
    // Every state that arms the retry timer handles both the timer (resend) and running
    // out of retries (leave the state) — the bound that keeps a vanished peer from
    // hanging a connection.
    for t in CM_TABLE {
        if t.actions.contains(&Action::ArmRetry) {
            let s = t.to;
            assert!(
                transition(s, CmInput::Timeout).is_some(),
                "{s}: no Timeout row"
            );
            let out = transition(s, CmInput::RetriesExhausted)
                .unwrap_or_else(|| panic!("{s}: no RetriesExhausted row"));
            assert_ne!(out.to, s, "{s}: retries exhausted stays put");
        }
    }
    // And timewait always ends.
    assert_eq!(
        transition(CmState::Timewait, CmInput::TimewaitExpired).map(|t| t.to),
        Some(CmState::Idle)
    );
}
