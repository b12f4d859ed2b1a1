//! Data patterns for `--verify`: the content of every message is a function of
//! (direction, iteration, QP, offset), so the receiver can check each byte it got without
//! any copy of what was sent.

use std::fmt;

/// Which side produced the data (so a reply never matches the request it answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Written or sent by the client.
    ToServer,
    /// Written or sent by the server (also the server's RDMA READ source).
    ToClient,
}

/// The SplitMix64 finaliser: a bijective mix of 64 bits.
pub const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seed of one message.
pub fn seed(dir: Dir, iter: u64, qp: u32) -> u64 {
    let d = match dir {
        Dir::ToServer => 0x5a5a_0000_0000_0000,
        Dir::ToClient => 0xa5a5_0000_0000_0000,
    };
    mix(mix(iter ^ d) ^ (u64::from(qp) << 40))
}

/// The 8 pattern bytes at the 8-aligned `offset` of the message with `seed`.
fn word(seed: u64, offset: usize) -> [u8; 8] {
    mix(seed ^ (offset as u64)).to_le_bytes()
}

/// Writes the pattern of (`dir`, `iter`, `qp`) into `out` (its whole length).
pub fn fill(out: &mut [u8], dir: Dir, iter: u64, qp: u32) {
    let s = seed(dir, iter, qp);
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let w = word(s, i * 8);
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
}

/// A byte that differs from the pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Offset of the first wrong byte in the message.
    pub offset: usize,
    /// What the pattern says.
    pub expected: u8,
    /// What was found.
    pub found: u8,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "byte {} is {:#04x}, expected {:#04x}",
            self.offset, self.found, self.expected
        )
    }
}

/// Checks `data` against the pattern of (`dir`, `iter`, `qp`).
pub fn check(data: &[u8], dir: Dir, iter: u64, qp: u32) -> Result<(), Mismatch> {
    let s = seed(dir, iter, qp);
    for (i, chunk) in data.chunks(8).enumerate() {
        let w = word(s, i * 8);
        if chunk != &w[..chunk.len()] {
            let (j, (&found, &expected)) = chunk
                .iter()
                .zip(w.iter())
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .unwrap_or((0, (&chunk[0], &w[0])));
            return Err(Mismatch {
                offset: i * 8 + j,
                expected,
                found,
            });
        }
    }
    Ok(())
}

/// The initial value of a QP's atomic target word.
pub fn atomic_base(qp: u32) -> u64 {
    seed(Dir::ToClient, u64::MAX, qp) & 0x0000_ffff_ffff_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_passes_and_detects_every_single_byte_change() {
        for len in [1usize, 7, 8, 9, 64, 1000] {
            let mut buf = vec![0u8; len];
            fill(&mut buf, Dir::ToServer, 3, 1);
            assert!(check(&buf, Dir::ToServer, 3, 1).is_ok());
            for i in 0..len {
                let mut bad = buf.clone();
                bad[i] ^= 0x10;
                let m = check(&bad, Dir::ToServer, 3, 1).unwrap_err();
                assert_eq!(m.offset, i);
                assert_eq!(m.found, bad[i]);
                assert_eq!(m.expected, buf[i]);
            }
        }
    }

    #[test]
    fn patterns_differ_by_iteration_qp_and_direction() {
        let mut a = vec![0u8; 64];
        fill(&mut a, Dir::ToServer, 0, 0);
        assert!(check(&a, Dir::ToServer, 1, 0).is_err());
        assert!(check(&a, Dir::ToServer, 0, 1).is_err());
        assert!(check(&a, Dir::ToClient, 0, 0).is_err());
        // A zeroed buffer (nothing arrived) never passes.
        assert!(check(&[0u8; 64], Dir::ToServer, 0, 0).is_err());
    }
}
