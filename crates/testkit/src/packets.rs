//! Deterministic random numbers and random RoCE packets of any opcode.

/// A small deterministic generator (SplitMix64), so that a failing seed reproduces
/// exactly, on every platform and forever.
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 32 random bits.
    pub fn u32(&mut self) -> u32 {
        (self.u64() >> 32) as u32
    }

    /// A random value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n
    }

    /// A random 24-bit value.
    pub fn u24(&mut self) -> u32 {
        self.u32() & 0x00ff_ffff
    }

    /// A random byte.
    pub fn u8(&mut self) -> u8 {
        self.u64() as u8
    }

    /// A random bool.
    pub fn bool(&mut self) -> bool {
        self.u64() & 1 == 1
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.u8()).collect()
    }
}

/// One packet built for a test: the header values it was emitted from and its bytes.
pub struct Sample {
    /// The headers (with an empty payload; see [`Sample::payload`]).
    pub repr: uroce_wire::PacketRepr<'static>,
    /// The payload.
    pub payload: Vec<u8>,
    /// BTH..pad followed by 4 zero ICRC bytes.
    pub roce: Vec<u8>,
}

/// Builds a packet of opcode `info` with random header values and a random payload of up
/// to `max_payload` bytes (opcodes with a fixed payload get exactly that). A FLUSH gets a
/// random FETH (any selectivity level and placement type the field widths allow).
pub fn random_sample(rng: &mut Rng, info: &uroce_wire::OpcodeInfo, max_payload: usize) -> Sample {
    use uroce_wire::opcode::{HeaderSet, Operation};
    use uroce_wire::{
        aeth, atomic_ack_eth, atomic_eth, bth, deth, feth, ieth, immdt, reth, xrceth,
    };

    let is_cnp = info.operation == Operation::Cnp;
    let bth = bth::Repr {
        opcode: info.opcode,
        solicited: rng.bool(),
        mig_req: rng.bool(),
        pad_cnt: 0,
        pkey: rng.u32() as u16 | 0x8000,
        fecn: rng.bool(),
        becn: is_cnp || rng.bool(),
        dest_qp: rng.u24(),
        ack_req: rng.bool(),
        psn: uroce_wire::Psn::new(rng.u24()),
    };
    let h = info.headers;
    // A syndrome of one of the three defined classes: ACK 0x00, RNR NAK 0x20, NAK 0x60.
    let class = [0x00, 0x20, 0x60][rng.below(3) as usize];
    let syndrome = aeth::Syndrome::from_byte(class | (rng.u8() & 0x1f)).expect("defined class");
    let repr = uroce_wire::PacketRepr {
        xrceth: h
            .contains(HeaderSet::XRCETH)
            .then(|| xrceth::Repr { srqn: rng.u24() }),
        deth: h.contains(HeaderSet::DETH).then(|| deth::Repr {
            qkey: rng.u32(),
            src_qp: rng.u24(),
        }),
        feth: h.contains(HeaderSet::FETH).then(|| feth::Repr {
            selectivity_level: rng.u8() & 0x03,
            placement_type: rng.u8() & 0x0f,
        }),
        reth: h.contains(HeaderSet::RETH).then(|| reth::Repr {
            va: rng.u64(),
            rkey: rng.u32(),
            dma_len: rng.u32(),
        }),
        aeth: h.contains(HeaderSet::AETH).then(|| aeth::Repr {
            syndrome,
            msn: rng.u24(),
        }),
        atomic_eth: h.contains(HeaderSet::ATOMIC_ETH).then(|| atomic_eth::Repr {
            va: rng.u64() & !7,
            rkey: rng.u32(),
            swap_add: rng.u64(),
            compare: rng.u64(),
        }),
        atomic_ack_eth: h
            .contains(HeaderSet::ATOMIC_ACK_ETH)
            .then(|| atomic_ack_eth::Repr { orig: rng.u64() }),
        immdt: h
            .contains(HeaderSet::IMMDT)
            .then(|| immdt::Repr { imm: rng.u32() }),
        ieth: h
            .contains(HeaderSet::IETH)
            .then(|| ieth::Repr { rkey: rng.u32() }),
        ..uroce_wire::PacketRepr::new(bth, &[])
    };
    let payload = match info.exact_payload {
        Some(n) if is_cnp => vec![0; n],
        Some(n) => rng.bytes(n),
        None if info.payload => {
            let len = rng.below(max_payload as u64 + 1) as usize;
            rng.bytes(len)
        }
        None => Vec::new(),
    };

    let full = uroce_wire::PacketRepr {
        payload: &payload,
        ..repr
    };
    let mut roce = vec![0u8; full.buffer_len()];
    let n = full
        .emit(&mut roce)
        .unwrap_or_else(|e| panic!("emit {:#04x}: {e}", info.opcode));
    assert_eq!(n, roce.len());
    Sample {
        repr,
        payload,
        roce,
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
