//! [`PatternMemory`]: a memory without storage, for transfers of gigabytes.
//!
//! A separate type, not a mode of [`TestMemory`](super::TestMemory): it has no regions, no
//! keys and no bytes. Every key and address is valid and holds [`pattern_byte`] of the
//! address; writes are compared with the pattern and counted instead of stored. That is
//! what lets a unit test move gigabytes with every byte verified and no gigabyte of RAM,
//! and it is also why none of `TestMemory`'s checks (keys, bounds, rights) apply here.

use std::cell::Cell;

use crate::memory::{AtomicOp, LocalAccessError, Memory, RemoteAccessError, RemoteOp};

/// A memory without storage: every address holds `pattern_byte(addr)`; writes are checked
/// against the pattern and counted. Atomics and invalidations fail with `BadKey`.
#[derive(Debug, Default)]
pub struct PatternMemory {
    bytes_written: Cell<u64>,
    bad_bytes: Cell<u64>,
}

/// The pattern word of the 8-byte aligned address `a8` (a multiplicative hash).
fn pattern_word(a8: u64) -> u64 {
    let x = a8.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 29)
}

/// The byte every [`PatternMemory`] holds at `addr`.
pub fn pattern_byte(addr: u64) -> u8 {
    pattern_word(addr & !7).to_le_bytes()[(addr & 7) as usize]
}

/// Splits `[addr, addr + len)` into an unaligned head, whole aligned words, and a tail.
fn pattern_split(addr: u64, len: usize) -> (usize, usize) {
    let head = ((8 - (addr & 7) as usize) & 7).min(len);
    let words = (len - head) / 8;
    (head, words)
}

impl PatternMemory {
    /// Bytes written so far (local and remote writes).
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.get()
    }

    /// Damaged bytes written so far (a damaged aligned word counts once).
    pub fn bad_bytes(&self) -> u64 {
        self.bad_bytes.get()
    }

    fn fill(addr: u64, dst: &mut [u8]) {
        let (head, words) = pattern_split(addr, dst.len());
        let (h, rest) = dst.split_at_mut(head);
        let (mid, tail) = rest.split_at_mut(words * 8);
        for (i, b) in h.iter_mut().enumerate() {
            *b = pattern_byte(addr + i as u64);
        }
        let a = addr + head as u64;
        for (k, c) in mid.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&pattern_word(a + 8 * k as u64).to_le_bytes());
        }
        let t = a + (words * 8) as u64;
        for (i, b) in tail.iter_mut().enumerate() {
            *b = pattern_byte(t + i as u64);
        }
    }

    fn check(&self, addr: u64, src: &[u8]) {
        let (head, words) = pattern_split(addr, src.len());
        let a = addr + head as u64;
        let mut bad = 0u64;
        for (k, c) in src[head..head + words * 8].chunks_exact(8).enumerate() {
            if c != pattern_word(a + 8 * k as u64).to_le_bytes() {
                bad += 1; // counted per damaged word here, per byte below
            }
        }
        let bytewise = (0..head).chain(head + words * 8..src.len());
        bad += bytewise
            .filter(|i| src[*i] != pattern_byte(addr + *i as u64))
            .count() as u64;
        self.bad_bytes.set(self.bad_bytes.get() + bad);
        self.bytes_written
            .set(self.bytes_written.get() + src.len() as u64);
    }
}

impl Memory for PatternMemory {
    fn read_local(&self, _: u32, addr: u64, dst: &mut [u8]) -> Result<(), LocalAccessError> {
        Self::fill(addr, dst);
        Ok(())
    }
    fn write_local(&self, _: u32, addr: u64, src: &[u8]) -> Result<(), LocalAccessError> {
        self.check(addr, src);
        Ok(())
    }
    fn check_remote(&self, _: u32, _: u64, _: u64, _: RemoteOp) -> Result<(), RemoteAccessError> {
        Ok(())
    }
    fn write_remote(&self, _: u32, va: u64, src: &[u8]) -> Result<(), RemoteAccessError> {
        self.check(va, src);
        Ok(())
    }
    fn read_remote(&self, _: u32, va: u64, dst: &mut [u8]) -> Result<(), RemoteAccessError> {
        Self::fill(va, dst);
        Ok(())
    }
    fn atomic_remote(&self, rkey: u32, _: u64, _: AtomicOp) -> Result<u64, RemoteAccessError> {
        Err(RemoteAccessError::BadKey { rkey })
    }
    fn atomic_write_remote(&self, rkey: u32, _: u64, _: [u8; 8]) -> Result<(), RemoteAccessError> {
        Err(RemoteAccessError::BadKey { rkey })
    }
    fn invalidate_remote(&self, rkey: u32) -> Result<(), RemoteAccessError> {
        Err(RemoteAccessError::BadKey { rkey })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_fill_matches_pattern_byte() {
        let mut buf = vec![0u8; 1000];
        PatternMemory::fill(0x1234_56f0, &mut buf);
        for (i, b) in buf.iter().enumerate() {
            assert_eq!(*b, pattern_byte(0x1234_56f0 + i as u64));
        }
        let m = PatternMemory::default();
        m.check(0x1234_56f0, &buf);
        assert_eq!(m.bad_bytes(), 0);
        buf[300] ^= 1;
        m.check(0x1234_56f0, &buf);
        assert_eq!(m.bad_bytes(), 1);
    }
}
