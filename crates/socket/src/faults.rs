//! Seeded fault injection on outgoing packets: drop, duplicate, reorder, corrupt.
//!
//! Configured by a string such as `drop=0.01,dup=0.001,reorder=0.01,corrupt=0.0001,seed=7`
//! ([`FaultConfig::parse`]), typically from the `UROCE_FAULTS` environment variable
//! ([`FaultConfig::from_env`]). Each probability applies to every packet independently:
//!
//! 1. **drop** (`drop`): the packet is not sent at all.
//! 2. **corrupt** (`corrupt`): one bit of the packet (BTH..ICRC) is flipped, *after* the
//!    ICRC was sealed, so the receiver's ICRC check must catch it. The bit is never in
//!    BTH byte 4 (FECN, BECN and the reserved bits): the ICRC masks that byte, so a flip
//!    there would be undetectable by design.
//! 3. **duplicate** (`dup`): the packet is sent twice.
//! 4. **reorder** (`reorder`): the packet (both copies, if duplicated) is held back and
//!    sent after the next 1 to [`MAX_HOLD_DISTANCE`] packets the injector processes (a
//!    dropped packet counts too). At most [`MAX_HELD`] packets wait; when the queue is
//!    full the oldest is released first. [`FaultInjector::release_all`] sends whatever
//!    still waits (the socket does so when the caller flushes).
//!
//! **Determinism:** the injector draws the same number of random values for every packet
//! whatever happens to it, from a `StdRng` seeded with `seed`, so for one seed and one
//! packet sequence (the destinations and lengths; the contents do not matter) the faults
//! are always the same. The stream is that of `rand` 0.9's `StdRng`, stable for a given
//! `rand` release.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The environment variable [`FaultConfig::from_env`] reads.
pub const ENV_VAR: &str = "UROCE_FAULTS";
/// A held-back packet is released after at most this many further packets.
pub const MAX_HOLD_DISTANCE: u64 = 8;
/// At most this many packets are held back at once.
pub const MAX_HELD: usize = 32;
/// The byte of the transport packet (BTH byte 4) that the ICRC masks and corruption
/// therefore never touches.
pub const MASKED_BTH_BYTE: usize = 4;

/// What faults to inject, and the seed of the random choices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// Probability that a packet is dropped.
    pub drop: f64,
    /// Probability that a packet is sent twice.
    pub dup: f64,
    /// Probability that a packet is held back and sent later.
    pub reorder: f64,
    /// Probability that one bit of a packet is flipped.
    pub corrupt: f64,
    /// Seed of the random choices.
    pub seed: u64,
}

/// Why a fault configuration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FaultParseError {
    /// An item has no `=value`.
    #[error("fault item {item:?} has no value (expected key=value)")]
    MissingValue {
        /// The item as written.
        item: String,
    },
    /// A key that is not `drop`, `dup`, `reorder`, `corrupt` or `seed`.
    #[error("unknown fault key {key:?} (known: drop, dup, reorder, corrupt, seed)")]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A key given twice.
    #[error("fault key {key:?} given twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// A probability that is not a number in `0..=1`.
    #[error("fault {key}={value:?}: not a probability between 0 and 1")]
    BadProbability {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
    },
    /// A seed that is not a decimal or `0x` hexadecimal 64-bit number.
    #[error("fault seed={value:?}: not a 64-bit number (decimal or 0x hex)")]
    BadSeed {
        /// The value as written.
        value: String,
    },
    /// The environment variable is not valid UTF-8.
    #[error("{var} is not valid UTF-8")]
    NotUnicode {
        /// The variable.
        var: &'static str,
    },
}

impl FaultConfig {
    /// No faults (seed 0).
    pub const NONE: FaultConfig = FaultConfig {
        drop: 0.0,
        dup: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        seed: 0,
    };

    /// Parses `key=value` items separated by commas (whitespace around items and
    /// values is ignored, empty items are skipped). Keys: `drop`, `dup`, `reorder`,
    /// `corrupt` (probabilities in `0..=1`) and `seed` (decimal or `0x` hex); keys not
    /// given are 0. The empty string is [`FaultConfig::NONE`].
    ///
    /// # Errors
    /// A [`FaultParseError`] naming the offending item, key or value.
    pub fn parse(s: &str) -> Result<FaultConfig, FaultParseError> {
        let mut config = FaultConfig::NONE;
        let mut seen: [bool; 5] = [false; 5];
        // Bounded by the number of commas in `s`.
        for item in s.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let Some((key, value)) = item.split_once('=') else {
                return Err(FaultParseError::MissingValue {
                    item: item.to_string(),
                });
            };
            let (key, value) = (key.trim(), value.trim());
            let (index, slot) = match key {
                "drop" => (0, Some(&mut config.drop)),
                "dup" => (1, Some(&mut config.dup)),
                "reorder" => (2, Some(&mut config.reorder)),
                "corrupt" => (3, Some(&mut config.corrupt)),
                "seed" => (4, None),
                _ => {
                    return Err(FaultParseError::UnknownKey {
                        key: key.to_string(),
                    })
                }
            };
            if std::mem::replace(&mut seen[index], true) {
                return Err(FaultParseError::DuplicateKey {
                    key: key.to_string(),
                });
            }
            match slot {
                Some(p) => *p = parse_probability(key, value)?,
                None => config.seed = parse_seed(value)?,
            }
        }
        Ok(config)
    }

    /// Reads [`ENV_VAR`] (`UROCE_FAULTS`): `None` when it is unset or blank.
    ///
    /// # Errors
    /// As [`FaultConfig::parse`]; [`FaultParseError::NotUnicode`] for a non-UTF-8 value.
    pub fn from_env() -> Result<Option<FaultConfig>, FaultParseError> {
        match std::env::var(ENV_VAR) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => FaultConfig::parse(&v).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(FaultParseError::NotUnicode { var: ENV_VAR })
            }
        }
    }

    /// True when no fault can ever happen.
    pub fn is_none(&self) -> bool {
        self.drop == 0.0 && self.dup == 0.0 && self.reorder == 0.0 && self.corrupt == 0.0
    }
}

impl Default for FaultConfig {
    fn default() -> FaultConfig {
        FaultConfig::NONE
    }
}

impl FromStr for FaultConfig {
    type Err = FaultParseError;

    fn from_str(s: &str) -> Result<FaultConfig, FaultParseError> {
        FaultConfig::parse(s)
    }
}

/// Writes the form [`FaultConfig::parse`] reads back to an equal value.
impl fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drop={},dup={},reorder={},corrupt={},seed={}",
            self.drop, self.dup, self.reorder, self.corrupt, self.seed
        )
    }
}

fn parse_probability(key: &str, value: &str) -> Result<f64, FaultParseError> {
    match value.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(FaultParseError::BadProbability {
            key: key.to_string(),
            value: value.to_string(),
        }),
    }
}

fn parse_seed(value: &str) -> Result<u64, FaultParseError> {
    let parsed = match value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse::<u64>(),
    };
    parsed.map_err(|_| FaultParseError::BadSeed {
        value: value.to_string(),
    })
}

/// A packet the injector lets out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Where it goes.
    pub dst: SocketAddr,
    /// Its bytes (BTH..ICRC), corrupted if `corrupted_bit` says so.
    pub bytes: Vec<u8>,
    /// The bit that was flipped (bit `b % 8`, counted from the least significant, of
    /// byte `b / 8`), if any.
    pub corrupted_bit: Option<usize>,
}

/// What the injector did to one packet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Effects {
    /// It was dropped (nothing else happened to it).
    pub dropped: bool,
    /// This bit was flipped.
    pub corrupted_bit: Option<usize>,
    /// It was duplicated.
    pub duplicated: bool,
    /// It was held back, to be released after this many further packets.
    pub held_for: Option<u64>,
}

#[derive(Debug)]
struct Held {
    release_at: u64,
    packet: Outgoing,
}

/// Applies a [`FaultConfig`] to a sequence of outgoing packets (see the module docs).
#[derive(Debug)]
pub struct FaultInjector {
    config: FaultConfig,
    rng: StdRng,
    /// Packets processed so far.
    seq: u64,
    held: VecDeque<Held>,
}

impl FaultInjector {
    /// An injector for `config`, seeded with `config.seed`.
    pub fn new(config: FaultConfig) -> FaultInjector {
        FaultInjector {
            config,
            rng: StdRng::seed_from_u64(config.seed),
            seq: 0,
            held: VecDeque::with_capacity(MAX_HELD),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FaultConfig {
        &self.config
    }

    /// Packets waiting to be sent later.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Runs one packet (`roce`, already sealed, to `dst`) through the injector and
    /// appends to `out` what is to be sent now: nothing, it, it twice, and/or earlier
    /// held-back packets that are now due (after it, which is what reorders them).
    pub fn process(&mut self, dst: SocketAddr, roce: &[u8], out: &mut Vec<Outgoing>) -> Effects {
        // Six draws per packet whatever the outcome, so that the choices for packet n
        // depend only on the seed and n.
        let u_drop: f64 = self.rng.random();
        let u_corrupt: f64 = self.rng.random();
        let u_dup: f64 = self.rng.random();
        let u_reorder: f64 = self.rng.random();
        let bit_draw: u64 = self.rng.random();
        let hold_draw: u64 = self.rng.random();
        self.seq += 1;

        let mut effects = Effects::default();
        if u_drop < self.config.drop {
            effects.dropped = true;
        } else {
            let mut packet = Outgoing {
                dst,
                bytes: roce.to_vec(),
                corrupted_bit: None,
            };
            if u_corrupt < self.config.corrupt {
                if let Some(bit) = flip_bit(&mut packet.bytes, bit_draw) {
                    packet.corrupted_bit = Some(bit);
                    effects.corrupted_bit = Some(bit);
                }
            }
            effects.duplicated = u_dup < self.config.dup;
            let copies = if effects.duplicated { 2 } else { 1 };
            if u_reorder < self.config.reorder {
                let distance = 1 + hold_draw % MAX_HOLD_DISTANCE;
                effects.held_for = Some(distance);
                for _ in 0..copies {
                    if self.held.len() >= MAX_HELD {
                        if let Some(oldest) = self.held.pop_front() {
                            out.push(oldest.packet);
                        }
                    }
                    self.held.push_back(Held {
                        release_at: self.seq + distance,
                        packet: packet.clone(),
                    });
                }
            } else {
                if effects.duplicated {
                    out.push(packet.clone());
                }
                out.push(packet);
            }
        }
        self.release_due(out);
        effects
    }

    /// Appends every held-back packet to `out`, oldest first.
    pub fn release_all(&mut self, out: &mut Vec<Outgoing>) {
        out.extend(self.held.drain(..).map(|h| h.packet));
    }

    /// Releases the held packets that are due, in the order they were held.
    fn release_due(&mut self, out: &mut Vec<Outgoing>) {
        let seq = self.seq;
        // Bounded by MAX_HELD.
        let mut i = 0;
        while i < self.held.len() {
            if self.held.get(i).is_some_and(|h| h.release_at <= seq) {
                if let Some(h) = self.held.remove(i) {
                    out.push(h.packet);
                }
            } else {
                i += 1;
            }
        }
    }
}

/// Flips one bit of `bytes` chosen by `draw`, never in [`MASKED_BTH_BYTE`]; returns its
/// index (byte * 8 + bit), or None for an empty packet.
fn flip_bit(bytes: &mut [u8], draw: u64) -> Option<usize> {
    let eligible_bytes = if bytes.len() > MASKED_BTH_BYTE {
        bytes.len() - 1
    } else {
        bytes.len()
    };
    let eligible_bits = (eligible_bytes as u64).checked_mul(8).filter(|&n| n > 0)?;
    // Multiply-shift maps the 64-bit draw onto 0..eligible_bits without modulo bias
    // worth mentioning.
    let k = ((u128::from(draw) * u128::from(eligible_bits)) >> 64) as usize;
    let mut byte = k / 8;
    if bytes.len() > MASKED_BTH_BYTE && byte >= MASKED_BTH_BYTE {
        byte += 1;
    }
    let b = bytes.get_mut(byte)?;
    *b ^= 1 << (k % 8);
    Some(byte * 8 + k % 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flip_bit_skips_the_masked_byte_and_covers_the_rest() {
        let len = 16;
        let mut hit = vec![false; len * 8];
        // Draws spread over the whole u64 range reach every eligible bit.
        let steps = 4096u64;
        for i in 0..steps {
            let mut bytes = vec![0u8; len];
            let draw = i * (u64::MAX / steps);
            let bit = flip_bit(&mut bytes, draw).unwrap();
            assert_eq!(bytes[bit / 8], 1 << (bit % 8));
            assert_eq!(bytes.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
            hit[bit] = true;
        }
        for (bit, &h) in hit.iter().enumerate() {
            assert_eq!(h, bit / 8 != MASKED_BTH_BYTE, "bit {bit}");
        }
        assert_eq!(flip_bit(&mut [], 5), None);
    }
}
