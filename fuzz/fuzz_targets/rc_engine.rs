//! Fuzz target: one RC QP (`uroce_proto::rc::RcQp`) driven by arbitrary bytes.
//!
//! Run with `cargo fuzz run rc_engine` (nightly, or `RUSTC_BOOTSTRAP=1`) from `fuzz/`.
//! The input is a little command language: each command byte picks an action (hand a
//! packet to the engine, let time pass, drain transmissions, post a WR, change state) and
//! the bytes after it are its arguments. Packets go through `PacketRepr::parse` first, as
//! in the I/O layer; a command can patch DestQP and the PSN of the packet bytes so that
//! the fuzzer reaches past the QP and PSN checks quickly. Beyond "never panics" it checks
//! that every packet the engine emits parses and is addressed to the peer, and that no WR
//! completes twice.
#![no_main]

use std::cell::RefCell;
use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use uroce_proto::memory::{AtomicOp, LocalAccessError, Memory, RemoteAccessError, RemoteOp, Sge};
use uroce_proto::qp_state::QpState;
use uroce_proto::rc::{CqKind, Env, RcConfig, RcQp};
use uroce_proto::time::Instant;
use uroce_proto::wr::{RecvWr, SendFlags, SendOpcode, SendWr};
use uroce_wire::{PacketRepr, Pmtu, Psn};

const QPN: u32 = 0x12;
const PEER: u32 = 0x34;
const SQ_PSN: u32 = 0x00FF_FF00;
const RQ_PSN: u32 = 7;
const LKEY: u32 = 0x100;
const RKEY: u32 = 0x200;
const ADDR: u64 = 0x10_0000;
const LEN: usize = 1 << 16;

/// One region with every right, word-addressed atomics in host order.
struct OneRegion {
    data: RefCell<Vec<u8>>,
}

impl OneRegion {
    fn range(addr: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(addr.checked_sub(ADDR)?).ok()?;
        let end = start.checked_add(len)?;
        (end <= LEN).then_some(start..end)
    }
}

impl Memory for OneRegion {
    fn read_local(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), LocalAccessError> {
        let r = Self::range(addr, dst.len())
            .filter(|_| lkey == LKEY)
            .ok_or(LocalAccessError::BadKey { lkey })?;
        dst.copy_from_slice(&self.data.borrow()[r]);
        Ok(())
    }
    fn write_local(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), LocalAccessError> {
        let r = Self::range(addr, src.len())
            .filter(|_| lkey == LKEY)
            .ok_or(LocalAccessError::BadKey { lkey })?;
        self.data.borrow_mut()[r].copy_from_slice(src);
        Ok(())
    }
    fn check_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        _op: RemoteOp,
    ) -> Result<(), RemoteAccessError> {
        if len == 0 {
            return Ok(());
        }
        let len =
            usize::try_from(len).map_err(|_| RemoteAccessError::OutOfBounds { rkey, va, len })?;
        Self::range(va, len)
            .filter(|_| rkey == RKEY)
            .map(|_| ())
            .ok_or(RemoteAccessError::BadKey { rkey })
    }
    fn write_remote(&self, rkey: u32, va: u64, src: &[u8]) -> Result<(), RemoteAccessError> {
        self.check_remote(rkey, va, src.len() as u64, RemoteOp::Write)?;
        if let Some(r) = Self::range(va, src.len()) {
            self.data.borrow_mut()[r].copy_from_slice(src);
        }
        Ok(())
    }
    fn read_remote(&self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), RemoteAccessError> {
        self.check_remote(rkey, va, dst.len() as u64, RemoteOp::Read)?;
        if let Some(r) = Self::range(va, dst.len()) {
            dst.copy_from_slice(&self.data.borrow()[r]);
        }
        Ok(())
    }
    fn atomic_remote(&self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError> {
        if va % 8 != 0 {
            return Err(RemoteAccessError::Misaligned { va });
        }
        self.check_remote(rkey, va, 8, RemoteOp::Atomic)?;
        let r = Self::range(va, 8).ok_or(RemoteAccessError::BadKey { rkey })?;
        let mut data = self.data.borrow_mut();
        let mut word = [0u8; 8];
        word.copy_from_slice(&data[r.clone()]);
        let orig = u64::from_ne_bytes(word);
        let new = match op {
            AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } if orig == compare => swap,
            AtomicOp::CompareSwap { .. } => orig,
        };
        data[r].copy_from_slice(&new.to_ne_bytes());
        Ok(orig)
    }
    fn atomic_write_remote(
        &self,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), RemoteAccessError> {
        if va % 8 != 0 {
            return Err(RemoteAccessError::Misaligned { va });
        }
        self.write_remote(rkey, va, &value)
    }
    fn invalidate_remote(&self, rkey: u32) -> Result<(), RemoteAccessError> {
        Err(RemoteAccessError::BadKey { rkey })
    }
}

/// Reads the input front to back; missing bytes read as zero.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let mut cfg = RcConfig::new(QPN, PEER);
    cfg.pmtu = Pmtu::from_enum(1 + input.u8() % 5).unwrap_or(Pmtu::Mtu1024);
    cfg.sq_psn = Psn::new(SQ_PSN);
    cfg.rq_psn = Psn::new(RQ_PSN);
    cfg.timeout = input.u8() % 20;
    cfg.max_rd_atomic = input.u8() % 4;
    cfg.max_dest_rd_atomic = input.u8() % 4;
    let mut qp = RcQp::new(cfg);
    let mem = OneRegion {
        data: RefCell::new(vec![0; LEN]),
    };
    let mut now = Instant::ZERO;
    let mut buf = vec![0u8; 4096 + 64];
    let mut next_wr = 0u64;
    let mut completed = HashSet::new();

    // Bounded: every command consumes at least one byte.
    while !input.0.is_empty() {
        match input.u8() % 8 {
            0..=2 => {
                let patch = input.u8();
                let len = usize::from(input.u16() % 4400);
                let mut pkt = input.bytes(len).to_vec();
                if patch & 1 != 0 && pkt.len() >= 12 {
                    pkt[5..8].copy_from_slice(&QPN.to_be_bytes()[1..]);
                }
                if patch & 2 != 0 && pkt.len() >= 12 {
                    let base = if patch & 4 != 0 { SQ_PSN } else { RQ_PSN };
                    let psn = base.wrapping_add(u32::from(patch >> 3)) & 0x00FF_FFFF;
                    pkt[9..12].copy_from_slice(&psn.to_be_bytes()[1..]);
                }
                if let Ok(p) = PacketRepr::parse(&pkt) {
                    qp.handle_packet(now, &p, &mut Env::new(&mem));
                }
            }
            3 => {
                now = Instant::from_nanos(now.as_nanos().saturating_add(u64::from(input.u32())));
                if qp.poll_timeout().is_some_and(|t| t <= now) {
                    qp.handle_timeout(now, &mut Env::new(&mem));
                }
            }
            4 => {
                for _ in 0..input.u8() {
                    let Some(n) = qp.poll_transmit(now, &mut Env::new(&mem), &mut buf) else {
                        break;
                    };
                    assert!(n <= buf.len());
                    let p =
                        PacketRepr::parse(&buf[..n]).expect("the engine emits packets that parse");
                    assert_eq!(p.bth.dest_qp, PEER);
                }
            }
            5 => {
                let op =
                    SendOpcode::from_u32(u32::from(input.u8() % 10)).unwrap_or(SendOpcode::Send);
                let len = u32::from(input.u16());
                let off = u64::from(input.u16());
                let mut wr = SendWr::new(
                    next_wr,
                    op,
                    vec![Sge {
                        addr: ADDR + off,
                        length: len,
                        lkey: LKEY,
                    }],
                );
                wr.remote_addr = ADDR + u64::from(input.u16());
                wr.rkey = RKEY;
                wr.flags = SendFlags::from_bits_truncate(u32::from(input.u8()));
                next_wr += 1;
                let _ = qp.post_send(wr);
            }
            6 => {
                let len = u32::from(input.u16());
                let _ = qp.post_recv(RecvWr {
                    wr_id: next_wr,
                    sg_list: vec![Sge {
                        addr: ADDR,
                        length: len,
                        lkey: LKEY,
                    }],
                });
                next_wr += 1;
            }
            _ => {
                let s = QpState::ALL[usize::from(input.u8()) % QpState::ALL.len()];
                qp.set_state(s);
            }
        }
        while let Some((kind, wc)) = qp.poll_completion() {
            assert!(
                completed.insert((kind == CqKind::Send, wc.wr_id)),
                "WR completed twice"
            );
        }
        while qp.poll_event().is_some() {}
    }
});
