//! Property tests: no input makes a parser panic.
//!
//! Arbitrary byte strings, and mutations of valid packets (bit flips, truncations,
//! extensions, opcode swaps, PadCnt/TVer changes), go through `PacketRepr::parse` and
//! every header's `Header::new_checked` + `Repr::parse`. Whatever `parse` accepts must also
//! be emittable, and re-parse to the same repr.

mod common;

use common::{arb_packet, OwnedPacket};
use proptest::prelude::*;
use uroce_wire::packet::icrc_on_wire;
use uroce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, mad, reth, xrceth, PacketRepr,
    WireError,
};

/// Runs every parser over `bytes`; panics only on a broken invariant.
fn parse_everything(bytes: &[u8]) {
    macro_rules! header {
        ($m:ident) => {{
            let checked = $m::Header::new_checked(bytes);
            match &checked {
                Ok(h) => {
                    let _ = $m::Repr::parse(h);
                }
                Err(e) => assert!(
                    matches!(e, WireError::Truncated { .. }),
                    "{}: {e}",
                    stringify!($m)
                ),
            }
            // A view made without the check must not panic either.
            let unchecked = $m::Header::new_unchecked(bytes);
            let via_checked = checked
                .as_ref()
                .map_err(Clone::clone)
                .and_then($m::Repr::parse);
            assert_eq!($m::Repr::parse(&unchecked), via_checked);
        }};
    }
    header!(bth);
    header!(reth);
    header!(aeth);
    header!(atomic_eth);
    header!(atomic_ack_eth);
    header!(immdt);
    header!(ieth);
    header!(deth);
    header!(feth);
    header!(xrceth);
    header!(mad);
    let _ = icrc_on_wire(bytes);

    if let Ok(p) = PacketRepr::parse(bytes) {
        // Accepted packets are self-consistent.
        assert_eq!(p.buffer_len(), bytes.len());
        assert_eq!(usize::from(p.bth.pad_cnt), p.pad_len());
        let _ = p.to_string();
        let mut out = vec![0u8; p.buffer_len()];
        let n = p.emit(&mut out).expect("what parse accepts, emit accepts");
        assert_eq!(n, bytes.len());
        assert_eq!(PacketRepr::parse(&out), Ok(p));
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    /// XOR `mask` into byte `at` (modulo the length).
    Flip { at: usize, mask: u8 },
    /// Keep only the first `n` bytes (modulo length + 1).
    Truncate(usize),
    /// Append bytes.
    Extend(Vec<u8>),
    /// Replace the opcode.
    Opcode(u8),
    /// Replace byte 1 (SE, M, PadCnt, TVer).
    Flags(u8),
    /// Remove `n` bytes at `at` (shifts the headers).
    Splice { at: usize, n: usize },
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<usize>(), 1u8..).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        2 => any::<usize>().prop_map(Mutation::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..40).prop_map(Mutation::Extend),
        3 => any::<u8>().prop_map(Mutation::Opcode),
        1 => any::<u8>().prop_map(Mutation::Flags),
        1 => (any::<usize>(), 1usize..12).prop_map(|(at, n)| Mutation::Splice { at, n }),
    ]
}

fn mutate(pkt: &OwnedPacket, mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = pkt.bytes();
    for m in mutations {
        match m {
            Mutation::Flip { at, mask } => {
                if !bytes.is_empty() {
                    let i = at % bytes.len();
                    bytes[i] ^= mask;
                }
            }
            Mutation::Truncate(n) => bytes.truncate(n % (bytes.len() + 1)),
            Mutation::Extend(more) => bytes.extend_from_slice(more),
            Mutation::Opcode(op) => {
                if let Some(b) = bytes.first_mut() {
                    *b = *op;
                }
            }
            Mutation::Flags(f) => {
                if let Some(b) = bytes.get_mut(1) {
                    *b = *f;
                }
            }
            Mutation::Splice { at, n } => {
                if !bytes.is_empty() {
                    let start = at % bytes.len();
                    let end = (start + n).min(bytes.len());
                    bytes.drain(start..end);
                }
            }
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        parse_everything(&bytes);
    }

    /// Arbitrary bytes behind a valid-looking BTH (TVer 0), so the parser gets past
    /// the first checks more often.
    #[test]
    fn arbitrary_bytes_after_plausible_bth(
        opcode in any::<u8>(),
        flags in 0u8..0x40,
        rest in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        let mut bytes = vec![opcode, flags & 0xf0, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1];
        bytes.extend_from_slice(&rest);
        parse_everything(&bytes);
    }

    #[test]
    fn mutated_valid_packets(
        pkt in arb_packet(),
        mutations in proptest::collection::vec(arb_mutation(), 1..4),
    ) {
        let bytes = mutate(&pkt, &mutations);
        parse_everything(&bytes);
    }
}

#[test]
fn every_prefix_of_every_table_opcode() {
    // Deterministic sweep: for each opcode, a zero-filled packet cut at every length.
    for opcode in 0u8..=0xff {
        let mut bytes = [0u8; 80];
        bytes[0] = opcode;
        for len in 0..=bytes.len() {
            parse_everything(&bytes[..len]);
        }
    }
}
