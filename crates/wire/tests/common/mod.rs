//! Proptest strategies shared by `roundtrip.rs` and `no_panic.rs`: random *valid*
//! packets of any opcode in the table.
#![allow(dead_code)] // each test binary uses a subset

use proptest::prelude::*;
use uroce_wire::aeth::{NakCode, Syndrome};
use uroce_wire::opcode::{HeaderSet, OpcodeInfo, OPCODE_TABLE};
use uroce_wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, xrceth, PacketRepr, Psn,
};

/// A packet that owns its payload (a `PacketRepr` borrows it).
#[derive(Debug, Clone)]
pub struct OwnedPacket {
    pub info: &'static OpcodeInfo,
    pub bth: bth::Repr,
    pub xrceth: Option<xrceth::Repr>,
    pub deth: Option<deth::Repr>,
    pub feth: Option<feth::Repr>,
    pub reth: Option<reth::Repr>,
    pub aeth: Option<aeth::Repr>,
    pub atomic_eth: Option<atomic_eth::Repr>,
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    pub immdt: Option<immdt::Repr>,
    pub ieth: Option<ieth::Repr>,
    pub payload: Vec<u8>,
}

impl OwnedPacket {
    pub fn repr(&self) -> PacketRepr<'_> {
        PacketRepr {
            bth: self.bth,
            xrceth: self.xrceth,
            deth: self.deth,
            feth: self.feth,
            reth: self.reth,
            aeth: self.aeth,
            atomic_eth: self.atomic_eth,
            atomic_ack_eth: self.atomic_ack_eth,
            immdt: self.immdt,
            ieth: self.ieth,
            payload: &self.payload,
        }
    }

    /// The emitted bytes (ICRC left zero).
    pub fn bytes(&self) -> Vec<u8> {
        let repr = self.repr();
        let mut buf = vec![0u8; repr.buffer_len()];
        let n = repr.emit(&mut buf).expect("a valid packet emits");
        assert_eq!(n, buf.len());
        buf
    }
}

/// Every row of the opcode table (`PacketRepr` represents them all, FLUSH included).
pub fn all_rows() -> Vec<&'static OpcodeInfo> {
    OPCODE_TABLE.iter().collect()
}

pub fn arb_bth(opcode: u8) -> impl Strategy<Value = bth::Repr> {
    (
        any::<[bool; 6]>(),
        0u8..4,
        any::<u16>(),
        0u32..=0xff_ffff,
        any::<u32>(),
    )
        .prop_map(move |(flags, pad_cnt, pkey, dest_qp, psn)| bth::Repr {
            opcode,
            solicited: flags[0],
            mig_req: flags[1],
            pad_cnt,
            pkey,
            fecn: flags[2],
            becn: flags[3],
            dest_qp,
            ack_req: flags[4],
            psn: Psn::new(psn),
        })
}

pub fn arb_syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credit| Syndrome::Ack { credit }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        (0u8..32).prop_map(|c| Syndrome::Nak(NakCode::from_code(c))),
    ]
}

/// Every extension header with random field values; the opcode picks which are used.
#[derive(Debug, Clone)]
pub struct AllHeaders {
    xrceth: xrceth::Repr,
    deth: deth::Repr,
    feth: feth::Repr,
    reth: reth::Repr,
    aeth: aeth::Repr,
    atomic_eth: atomic_eth::Repr,
    atomic_ack_eth: atomic_ack_eth::Repr,
    immdt: immdt::Repr,
    ieth: ieth::Repr,
}

pub fn arb_headers() -> impl Strategy<Value = AllHeaders> {
    (
        0u32..=0xff_ffff,
        (any::<u32>(), 0u32..=0xff_ffff, 0u8..4, 0u8..16),
        (any::<u64>(), any::<u32>(), any::<u32>()),
        (arb_syndrome(), 0u32..=0xff_ffff),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(
                srqn,
                (qkey, src_qp, sel, plt),
                (va, rkey, dma_len),
                (syndrome, msn),
                at,
                orig,
                imm,
                inv,
            )| {
                AllHeaders {
                    xrceth: xrceth::Repr { srqn },
                    deth: deth::Repr { qkey, src_qp },
                    feth: feth::Repr {
                        selectivity_level: sel,
                        placement_type: plt,
                    },
                    reth: reth::Repr { va, rkey, dma_len },
                    aeth: aeth::Repr { syndrome, msn },
                    atomic_eth: atomic_eth::Repr {
                        va: at.0,
                        rkey: at.1,
                        swap_add: at.2,
                        compare: at.3,
                    },
                    atomic_ack_eth: atomic_ack_eth::Repr { orig },
                    immdt: immdt::Repr { imm },
                    ieth: ieth::Repr { rkey: inv },
                }
            },
        )
}

/// Payload lengths: mostly small (all residues mod 4), sometimes up to a 4096 PMTU.
pub fn arb_payload(info: &'static OpcodeInfo) -> BoxedStrategy<Vec<u8>> {
    match (info.payload, info.exact_payload) {
        (false, _) => Just(Vec::new()).boxed(),
        (true, Some(n)) => proptest::collection::vec(any::<u8>(), n).boxed(),
        (true, None) => prop_oneof![
            4 => proptest::collection::vec(any::<u8>(), 0..64),
            1 => proptest::collection::vec(any::<u8>(), 0..=4096),
        ]
        .boxed(),
    }
}

/// A random valid packet of the opcode `info`.
pub fn arb_packet_for(info: &'static OpcodeInfo) -> impl Strategy<Value = OwnedPacket> {
    (arb_bth(info.opcode), arb_headers(), arb_payload(info)).prop_map(move |(bth, h, payload)| {
        let has = |f: HeaderSet| info.headers.contains(f);
        OwnedPacket {
            info,
            bth,
            xrceth: has(HeaderSet::XRCETH).then_some(h.xrceth),
            deth: has(HeaderSet::DETH).then_some(h.deth),
            feth: has(HeaderSet::FETH).then_some(h.feth),
            reth: has(HeaderSet::RETH).then_some(h.reth),
            aeth: has(HeaderSet::AETH).then_some(h.aeth),
            atomic_eth: has(HeaderSet::ATOMIC_ETH).then_some(h.atomic_eth),
            atomic_ack_eth: has(HeaderSet::ATOMIC_ACK_ETH).then_some(h.atomic_ack_eth),
            immdt: has(HeaderSet::IMMDT).then_some(h.immdt),
            ieth: has(HeaderSet::IETH).then_some(h.ieth),
            payload,
        }
    })
}

/// A random valid packet of any opcode in the table.
pub fn arb_packet() -> impl Strategy<Value = OwnedPacket> {
    let rows = all_rows();
    proptest::sample::select(rows).prop_flat_map(arb_packet_for)
}

/// Header lengths from IBA Vol 1 §9.2/§9.3, independent of the crate's constants.
pub fn spec_header_len(set: HeaderSet) -> usize {
    let sizes = [
        (HeaderSet::XRCETH, 4),
        (HeaderSet::DETH, 8),
        (HeaderSet::FETH, 4),
        (HeaderSet::RETH, 16),
        (HeaderSet::AETH, 4),
        (HeaderSet::ATOMIC_ETH, 28),
        (HeaderSet::ATOMIC_ACK_ETH, 8),
        (HeaderSet::IMMDT, 4),
        (HeaderSet::IETH, 4),
    ];
    12 + sizes
        .iter()
        .filter(|(f, _)| set.contains(*f))
        .map(|(_, n)| n)
        .sum::<usize>()
}
