//! The ownership rules are type errors: each program in `tests/ui/` breaks one and must
//! fail to compile with the error recorded beside it.

#[test]
fn ownership_rules_are_type_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
