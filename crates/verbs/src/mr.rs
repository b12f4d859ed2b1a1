//! Memory regions: access flags, L_Key/R_Key generation, and the bounds, permission, key and
//! protection-domain checks for local SGEs and remote (R_Key, VA, length) accesses.
//!
//! [`MrCore`] is the device-independent core of a memory region: the [`MemBlock`] it covers,
//! the protection domain it belongs to, its access flags, its keys and its I/O virtual address
//! (IOVA, the address peers and SGEs use for byte 0). It performs every check an access
//! needs and the bounds-checked copies by virtual address; key allocation, PD ownership and
//! table lookup by key belong to the resource tables.
//!
//! # Keys
//!
//! A key is `index << 12 | random`, with a 20-bit table index ([`MAX_KEY_INDEX`]) and a
//! 12-bit random part drawn from `1..=0xFFF` ([`make_key`]):
//!
//! * the index makes lookup by key O(1) ([`key_index`]) and keeps keys of live regions
//!   distinct; 2^20 regions per device is far more than software RoCE needs;
//! * the random part makes a key not guessable from a neighbour's key or from the order of
//!   registration: a peer (or a buggy application using a stale key after the index was
//!   reused) hits a live region's key with probability 1/4095 per attempt, sixteen times
//!   less likely than with the 8-bit split of the Linux software driver. Sequential
//!   registrations give keys that differ in their low bits unpredictably;
//! * the random part is never zero, so no key is ever 0 — not even for index 0. Key 0 is
//!   what applications pass as the L_Key of inline sends without a region and what
//!   zero-length transfers may carry, so it must never name a region.
//!
//! The L_Key and R_Key of one region are independent draws for the same index. Pass a
//! cryptographically secure generator (e.g. `rand::rng()`).
//!
//! # Checks
//!
//! [`MrCore::check_local`] validates a local SGE (L_Key, PD, range, and `LOCAL_WRITE` when the
//! engine writes into it: receive buffers, READ responses, atomic results).
//! [`MrCore::check_remote`] validates a remote access (R_Key, PD of the QP, range, and the
//! permission for the operation; zero-length accesses are not validated, IBA C9-88). Each
//! failure is a distinct [`AccessError`]; range arithmetic never overflows (a `va + len` that
//! wraps around 2^64 is [`AccessError::OutOfBounds`]). The `remote_*`/`local_*` methods
//! combine check and access and touch no memory unless every check passed.

use crate::mem::{MemBlock, MemError};

bitflags::bitflags! {
    /// Memory-region access flags, with the verbs ABI's bit values.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local engine may write into the region (receive buffers, READ/atomic results).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA WRITE into the region.
        const REMOTE_WRITE = 2;
        /// Peers may RDMA READ from the region.
        const REMOTE_READ = 4;
        /// Peers may perform atomic operations on the region.
        const REMOTE_ATOMIC = 8;
        /// Memory windows may be bound to the region.
        const MW_BIND = 16;
        /// The region's virtual addresses start at 0 instead of the buffer address.
        const ZERO_BASED = 32;
        /// On-demand paging hint (accepted, no effect).
        const ON_DEMAND = 64;
        /// Huge-page backing hint (accepted, no effect).
        const HUGETLB = 128;
        /// PCIe relaxed-ordering hint (accepted, no effect).
        const RELAXED_ORDERING = 1 << 20;
    }
}

/// Number of bits of a key that hold the region's table index.
pub const KEY_INDEX_BITS: u32 = 20;
/// Number of random low bits of a key.
pub const KEY_RANDOM_BITS: u32 = 32 - KEY_INDEX_BITS;
/// Largest table index a key can carry.
pub const MAX_KEY_INDEX: u32 = (1 << KEY_INDEX_BITS) - 1;
/// Mask of the random part of a key.
const KEY_RANDOM_MASK: u32 = (1 << KEY_RANDOM_BITS) - 1;

/// Builds a key for table slot `index`: the index in the high 20 bits, a random non-zero
/// 12-bit value in the low bits. Never returns 0.
pub fn make_key(index: u32, rng: &mut impl rand::Rng) -> Result<u32, MrError> {
    if index > MAX_KEY_INDEX {
        return Err(MrError::KeyIndexTooLarge { index });
    }
    let random: u32 = rng.random_range(1..=KEY_RANDOM_MASK);
    Ok((index << KEY_RANDOM_BITS) | random)
}

/// The table index a key produced by [`make_key`] refers to.
pub fn key_index(key: u32) -> u32 {
    key >> KEY_RANDOM_BITS
}

/// The kind of remote access a request performs (the protocol layer's type): READ needs
/// [`AccessFlags::REMOTE_READ`], WRITE (also ATOMIC WRITE) [`AccessFlags::REMOTE_WRITE`],
/// compare-and-swap and fetch-and-add [`AccessFlags::REMOTE_ATOMIC`] and an 8-byte-aligned
/// VA.
pub use uroce_proto::memory::RemoteOp;

/// The access flag `op` needs on the region.
pub fn required_access(op: RemoteOp) -> AccessFlags {
    match op {
        RemoteOp::Read => AccessFlags::REMOTE_READ,
        RemoteOp::Write => AccessFlags::REMOTE_WRITE,
        RemoteOp::Atomic => AccessFlags::REMOTE_ATOMIC,
    }
}

/// Why an access to a memory region was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The L_Key/R_Key presented does not name this region.
    #[error("key {key:#010x} does not match the memory region")]
    WrongKey {
        /// The key presented.
        key: u32,
    },
    /// The region belongs to a different protection domain than the QP.
    #[error("protection domain mismatch: region belongs to PD {expected}, access from PD {got}")]
    WrongPd {
        /// The region's PD.
        expected: u32,
        /// The PD of the accessing QP.
        got: u32,
    },
    /// `[va, va + len)` is not inside the region `[start, end)` (or wraps around 2^64).
    #[error("range at {va:#x} of {len} bytes is outside the region [{start:#x}, {end:#x})")]
    OutOfBounds {
        /// Requested start address.
        va: u64,
        /// Requested length.
        len: u64,
        /// Region start (IOVA).
        start: u64,
        /// Region end (exclusive).
        end: u64,
    },
    /// The region lacks an access flag the operation needs.
    #[error("the region does not grant {needed:?}")]
    NoPermission {
        /// The flag that is missing.
        needed: AccessFlags,
    },
    /// An atomic operation targets an address that is not 8-byte aligned.
    #[error("atomic operation at {va:#x} is not 8-byte aligned")]
    Misaligned {
        /// The requested virtual address.
        va: u64,
    },
    /// The application currently holds exclusive local access to the region's memory.
    #[error("access to the region is revoked while the application holds it exclusively")]
    Revoked,
    /// The region has been deregistered.
    #[error("the region has been deregistered")]
    Deregistered,
}

/// Why a memory region could not be created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MrError {
    /// REMOTE_WRITE or REMOTE_ATOMIC was requested without LOCAL_WRITE (IBA; EINVAL in verbs).
    #[error("invalid access flags {0:?}: REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE")]
    InvalidAccess(AccessFlags),
    /// The access flags contain bits uroce does not know.
    #[error("unknown access flag bits {bits:#x}")]
    UnknownAccessBits {
        /// The unknown bits.
        bits: u32,
    },
    /// The region's virtual address range would wrap around 2^64.
    #[error("region of {len} bytes at IOVA {iova:#x} wraps around the 64-bit address space")]
    TooLarge {
        /// Length in bytes.
        len: u64,
        /// Requested IOVA.
        iova: u64,
    },
    /// ZERO_BASED was requested together with a non-zero explicit IOVA.
    #[error("ZERO_BASED region with non-zero IOVA {iova:#x}")]
    ZeroBasedIova {
        /// The conflicting IOVA.
        iova: u64,
    },
    /// A key of 0 was given; 0 never names a region.
    #[error("key 0 is reserved and cannot name a memory region")]
    ZeroKey,
    /// A table index does not fit in the key's index bits.
    #[error("key index {index} exceeds the maximum {max}", max = MAX_KEY_INDEX)]
    KeyIndexTooLarge {
        /// The index requested.
        index: u32,
    },
}

/// The device-independent core of a memory region.
#[derive(Debug)]
pub struct MrCore {
    pd_id: u32,
    access: AccessFlags,
    block: MemBlock,
    iova: u64,
    lkey: u32,
    rkey: u32,
}

impl MrCore {
    /// Creates a region over `block` in protection domain `pd_id`. Its IOVA is the block's
    /// address, or 0 with [`AccessFlags::ZERO_BASED`].
    pub fn new(
        pd_id: u32,
        block: MemBlock,
        access: AccessFlags,
        lkey: u32,
        rkey: u32,
    ) -> Result<MrCore, MrError> {
        let iova = if access.contains(AccessFlags::ZERO_BASED) {
            0
        } else {
            block.base_addr()
        };
        MrCore::with_iova(pd_id, block, access, iova, lkey, rkey)
    }

    /// Creates a region whose byte 0 has virtual address `iova` (`ibv_reg_mr_iova`).
    pub fn with_iova(
        pd_id: u32,
        block: MemBlock,
        access: AccessFlags,
        iova: u64,
        lkey: u32,
        rkey: u32,
    ) -> Result<MrCore, MrError> {
        let unknown = access.bits() & !AccessFlags::all().bits();
        if unknown != 0 {
            return Err(MrError::UnknownAccessBits { bits: unknown });
        }
        if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            && !access.contains(AccessFlags::LOCAL_WRITE)
        {
            return Err(MrError::InvalidAccess(access));
        }
        if access.contains(AccessFlags::ZERO_BASED) && iova != 0 {
            return Err(MrError::ZeroBasedIova { iova });
        }
        let len = block.len() as u64;
        if iova.checked_add(len).is_none() {
            return Err(MrError::TooLarge { len, iova });
        }
        if lkey == 0 || rkey == 0 {
            return Err(MrError::ZeroKey);
        }
        Ok(MrCore {
            pd_id,
            access,
            block,
            iova,
            lkey,
            rkey,
        })
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The owning protection domain.
    pub fn pd_id(&self) -> u32 {
        self.pd_id
    }

    /// The access flags.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Virtual address of byte 0.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.block.len() as u64
    }

    /// Whether the region is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.block.is_empty()
    }

    /// The memory the region covers.
    pub fn block(&self) -> &MemBlock {
        &self.block
    }

    /// Gives the memory back (after deregistration).
    pub fn into_block(self) -> MemBlock {
        self.block
    }

    /// Offset within the block of `[va, va + len)`, or `OutOfBounds`.
    fn offset_of(&self, va: u64, len: u64) -> Result<usize, AccessError> {
        // invariant (constructor): iova + block length does not overflow.
        let end = self.iova + self.len();
        let oob = AccessError::OutOfBounds {
            va,
            len,
            start: self.iova,
            end,
        };
        let inside = va >= self.iova && va.checked_add(len).is_some_and(|e| e <= end);
        if !inside {
            return Err(oob);
        }
        usize::try_from(va - self.iova).map_err(|_| oob)
    }

    /// Validates a local SGE `(lkey, addr, len)` used by a QP in PD `pd_id`; `write` when the
    /// engine will write into it. A zero-length SGE is checked for key and PD only.
    pub fn check_local(
        &self,
        pd_id: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<(), AccessError> {
        if lkey != self.lkey {
            return Err(AccessError::WrongKey { key: lkey });
        }
        self.check_pd(pd_id)?;
        if len == 0 {
            return Ok(());
        }
        self.offset_of(addr, len)?;
        if write && !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(AccessError::NoPermission {
                needed: AccessFlags::LOCAL_WRITE,
            });
        }
        Ok(())
    }

    /// Validates a remote access `(rkey, va, len)` arriving on a QP in PD `pd_id`.
    /// Zero-length accesses are not validated (IBA C9-88) and always succeed.
    pub fn check_remote(
        &self,
        pd_id: u32,
        rkey: u32,
        va: u64,
        len: u64,
        op: RemoteOp,
    ) -> Result<(), AccessError> {
        if len == 0 {
            return Ok(());
        }
        if rkey != self.rkey {
            return Err(AccessError::WrongKey { key: rkey });
        }
        self.check_pd(pd_id)?;
        self.offset_of(va, len)?;
        let needed = required_access(op);
        if !self.access.contains(needed) {
            return Err(AccessError::NoPermission { needed });
        }
        if op == RemoteOp::Atomic && va % 8 != 0 {
            return Err(AccessError::Misaligned { va });
        }
        Ok(())
    }

    fn check_pd(&self, pd_id: u32) -> Result<(), AccessError> {
        if pd_id != self.pd_id {
            return Err(AccessError::WrongPd {
                expected: self.pd_id,
                got: pd_id,
            });
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes at virtual address `addr` out of the region (bounds checked
    /// only; permission checks are the caller's).
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        let off = self.offset_of(addr, dst.len() as u64)?;
        self.block
            .copy_out(off, dst)
            .map_err(|e| self.mem_error(addr, e))
    }

    /// Copies `src` into the region at virtual address `addr` (bounds checked only;
    /// permission checks are the caller's).
    pub fn write(&self, addr: u64, src: &[u8]) -> Result<(), AccessError> {
        let off = self.offset_of(addr, src.len() as u64)?;
        self.block
            .copy_in(off, src)
            .map_err(|e| self.mem_error(addr, e))
    }

    /// Atomic fetch-and-add at the 8-aligned virtual address `va`; returns the old value.
    pub fn atomic_fetch_add(&self, va: u64, add: u64) -> Result<u64, AccessError> {
        let off = self.atomic_offset(va)?;
        self.block
            .atomic_fetch_add(off, add)
            .map_err(|e| self.mem_error(va, e))
    }

    /// Atomic compare-and-swap at the 8-aligned virtual address `va`; returns the old value.
    pub fn atomic_compare_swap(
        &self,
        va: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, AccessError> {
        let off = self.atomic_offset(va)?;
        self.block
            .atomic_compare_swap(off, compare, swap)
            .map_err(|e| self.mem_error(va, e))
    }

    /// 64-bit atomic store of `value` at the 8-aligned virtual address `va` (IBA 1.5
    /// ATOMIC WRITE): one store, ordered after every earlier access (bounds and alignment
    /// checked; permissions are the caller's).
    pub fn atomic_store(&self, va: u64, value: u64) -> Result<(), AccessError> {
        let off = self.atomic_offset(va)?;
        self.block
            .atomic_store(off, value)
            .map_err(|e| self.mem_error(va, e))
    }

    fn atomic_offset(&self, va: u64) -> Result<usize, AccessError> {
        if va % 8 != 0 {
            return Err(AccessError::Misaligned { va });
        }
        self.offset_of(va, 8)
    }

    fn mem_error(&self, va: u64, e: MemError) -> AccessError {
        match e {
            MemError::Revoked | MemError::ExclusiveHeld => AccessError::Revoked,
            MemError::Retired => AccessError::Deregistered,
            MemError::Misaligned { .. } => AccessError::Misaligned { va },
            MemError::OutOfRange { offset, len, .. } => AccessError::OutOfBounds {
                va: self.iova.wrapping_add(offset as u64),
                len: len as u64,
                start: self.iova,
                end: self.iova.wrapping_add(self.len()),
            },
            // Not produced by copies or atomics; report as an access outside the region.
            MemError::NotOwned
            | MemError::DrainTimeout { .. }
            | MemError::AllocFailed { .. }
            | MemError::NullAddress { .. }
            | MemError::AddressWrap { .. } => AccessError::OutOfBounds {
                va,
                len: 0,
                start: self.iova,
                end: self.iova.wrapping_add(self.len()),
            },
        }
    }

    /// Remote RDMA WRITE: checks (R_Key, PD, range, REMOTE_WRITE), then copies `src` in.
    pub fn remote_write(
        &self,
        pd_id: u32,
        rkey: u32,
        va: u64,
        src: &[u8],
    ) -> Result<(), AccessError> {
        self.check_remote(pd_id, rkey, va, src.len() as u64, RemoteOp::Write)?;
        if src.is_empty() {
            return Ok(());
        }
        self.write(va, src)
    }

    /// Remote RDMA READ: checks (R_Key, PD, range, REMOTE_READ), then copies into `dst`.
    pub fn remote_read(
        &self,
        pd_id: u32,
        rkey: u32,
        va: u64,
        dst: &mut [u8],
    ) -> Result<(), AccessError> {
        self.check_remote(pd_id, rkey, va, dst.len() as u64, RemoteOp::Read)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.read(va, dst)
    }

    /// Remote FETCH_ADD: checks (R_Key, PD, range, REMOTE_ATOMIC, alignment), then adds.
    pub fn remote_fetch_add(
        &self,
        pd_id: u32,
        rkey: u32,
        va: u64,
        add: u64,
    ) -> Result<u64, AccessError> {
        self.check_remote(pd_id, rkey, va, 8, RemoteOp::Atomic)?;
        self.atomic_fetch_add(va, add)
    }

    /// Remote COMPARE_SWAP: checks (R_Key, PD, range, REMOTE_ATOMIC, alignment), then swaps.
    pub fn remote_compare_swap(
        &self,
        pd_id: u32,
        rkey: u32,
        va: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, AccessError> {
        self.check_remote(pd_id, rkey, va, 8, RemoteOp::Atomic)?;
        self.atomic_compare_swap(va, compare, swap)
    }

    /// Remote ATOMIC WRITE (IBA 1.5): checks (R_Key, PD, range, REMOTE_WRITE, 8-byte
    /// alignment), then stores the 8 bytes `value` (in memory order) as one 64-bit store.
    pub fn remote_atomic_write(
        &self,
        pd_id: u32,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), AccessError> {
        self.check_remote(pd_id, rkey, va, 8, RemoteOp::Write)?;
        self.atomic_store(va, u64::from_ne_bytes(value))
    }

    /// Engine write into a local SGE (receive data, READ response, atomic result): checks
    /// (L_Key, PD, range, LOCAL_WRITE), then copies `src` in.
    pub fn local_write(
        &self,
        pd_id: u32,
        lkey: u32,
        addr: u64,
        src: &[u8],
    ) -> Result<(), AccessError> {
        self.check_local(pd_id, lkey, addr, src.len() as u64, true)?;
        if src.is_empty() {
            return Ok(());
        }
        self.write(addr, src)
    }

    /// Engine read from a local SGE (send data): checks (L_Key, PD, range), then copies out.
    pub fn local_read(
        &self,
        pd_id: u32,
        lkey: u32,
        addr: u64,
        dst: &mut [u8],
    ) -> Result<(), AccessError> {
        self.check_local(pd_id, lkey, addr, dst.len() as u64, false)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.read(addr, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: u32 = 3;
    const LKEY: u32 = 0x0000_5123;
    const RKEY: u32 = 0x0000_5ABC;

    fn mr(len: usize, access: AccessFlags) -> MrCore {
        MrCore::new(PD, MemBlock::new(len).unwrap(), access, LKEY, RKEY).unwrap()
    }

    #[test]
    fn remote_write_or_atomic_needs_local_write() {
        for bad in [
            AccessFlags::REMOTE_WRITE,
            AccessFlags::REMOTE_ATOMIC,
            AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ] {
            let r = MrCore::new(PD, MemBlock::new(8).unwrap(), bad, LKEY, RKEY);
            assert_eq!(r.unwrap_err(), MrError::InvalidAccess(bad));
        }
        for good in [
            AccessFlags::empty(),
            AccessFlags::REMOTE_READ,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
        ] {
            assert!(MrCore::new(PD, MemBlock::new(8).unwrap(), good, LKEY, RKEY).is_ok());
        }
    }

    #[test]
    fn constructor_rejects_bad_inputs() {
        let unknown = AccessFlags::from_bits_retain(1 << 12);
        assert_eq!(
            MrCore::new(PD, MemBlock::new(8).unwrap(), unknown, LKEY, RKEY).unwrap_err(),
            MrError::UnknownAccessBits { bits: 1 << 12 }
        );
        assert_eq!(
            MrCore::new(PD, MemBlock::new(8).unwrap(), AccessFlags::empty(), 0, RKEY).unwrap_err(),
            MrError::ZeroKey
        );
        assert_eq!(
            MrCore::with_iova(
                PD,
                MemBlock::new(16).unwrap(),
                AccessFlags::empty(),
                u64::MAX - 8,
                LKEY,
                RKEY
            )
            .unwrap_err(),
            MrError::TooLarge {
                len: 16,
                iova: u64::MAX - 8
            }
        );
        assert_eq!(
            MrCore::with_iova(
                PD,
                MemBlock::new(16).unwrap(),
                AccessFlags::ZERO_BASED,
                4096,
                LKEY,
                RKEY
            )
            .unwrap_err(),
            MrError::ZeroBasedIova { iova: 4096 }
        );
    }

    #[test]
    fn iova_follows_zero_based_flag() {
        let m = mr(64, AccessFlags::empty());
        assert_eq!(m.iova(), m.block().base_addr());
        let z = mr(64, AccessFlags::ZERO_BASED);
        assert_eq!(z.iova(), 0);
        assert!(z.check_local(PD, LKEY, 0, 64, false).is_ok());
        assert!(z.check_local(PD, LKEY, 1, 64, false).is_err());
    }

    #[test]
    fn zero_length_remote_is_not_validated() {
        let m = mr(16, AccessFlags::empty());
        assert_eq!(
            m.check_remote(PD + 1, 0, u64::MAX, 0, RemoteOp::Write),
            Ok(())
        );
        assert_eq!(m.remote_write(PD + 1, 0, 7, &[]), Ok(()));
    }

    #[test]
    fn local_zero_length_still_checks_key_and_pd() {
        let m = mr(16, AccessFlags::empty());
        assert_eq!(m.check_local(PD, LKEY, u64::MAX, 0, true), Ok(()));
        assert_eq!(
            m.check_local(PD, LKEY ^ 1, 0, 0, false),
            Err(AccessError::WrongKey { key: LKEY ^ 1 })
        );
        assert_eq!(
            m.check_local(PD + 1, LKEY, 0, 0, false),
            Err(AccessError::WrongPd {
                expected: PD,
                got: PD + 1
            })
        );
    }

    #[test]
    fn errors_display_what_was_wrong() {
        let e = AccessError::OutOfBounds {
            va: 0x10,
            len: 4,
            start: 0x0,
            end: 0x12,
        };
        assert_eq!(
            e.to_string(),
            "range at 0x10 of 4 bytes is outside the region [0x0, 0x12)"
        );
        assert!(AccessError::NoPermission {
            needed: AccessFlags::REMOTE_READ
        }
        .to_string()
        .contains("REMOTE_READ"));
    }

    #[test]
    fn key_layout() {
        struct ZeroRng;
        impl rand::RngCore for ZeroRng {
            fn next_u32(&mut self) -> u32 {
                0
            }
            fn next_u64(&mut self) -> u64 {
                0
            }
            fn fill_bytes(&mut self, dst: &mut [u8]) {
                dst.fill(0);
            }
        }
        // Even a generator that only produces zeros cannot make key 0.
        let k = make_key(0, &mut ZeroRng).unwrap();
        assert_ne!(k, 0);
        assert_eq!(key_index(k), 0);
        let k = make_key(MAX_KEY_INDEX, &mut ZeroRng).unwrap();
        assert_eq!(key_index(k), (1 << 20) - 1);
        assert_eq!(
            make_key(1 << 20, &mut rand::rng()),
            Err(MrError::KeyIndexTooLarge { index: 1 << 20 })
        );
    }
}
