//! [`TestMemory`]: an in-process [`Memory`] over regions the test registers.
//!
//! Each region is a plain byte vector with a virtual address, an lkey/rkey pair and a set
//! of [`Access`] rights. Every [`Memory`] method checks the key, the region's state
//! (invalidated, revoked), the permission and the bounds exactly as the trait documents,
//! and reports the typed error of [`crate::memory`]; a failed call changes nothing.
//!
//! Regions come two ways:
//!
//! * [`TestMemory::register`] picks the keys and the address. Keys are deterministic (no
//!   randomness needed in a simulation): the `i`-th region (0-based) has lkey
//!   `(i + 1) << 8 | 0x4C` and rkey `(i + 1) << 8 | 0x52`, so an engine that mixes up the
//!   two keys fails the lookup. Addresses start at [`TestMemory::DEFAULT_BASE`] (or the
//!   memory's base) and leave one unmapped page between regions, so an off-by-one access
//!   past a region's end never lands in the next one.
//! * [`TestMemory::add`] takes a fixed key (lkey == rkey) and address from the test, for
//!   tests that lay packets out byte by byte and name the key in them. The key helpers
//!   ([`TestMemory::put`], [`TestMemory::get`], ...) address such regions by key and
//!   absolute address.
//!
//! Memory windows are modelled coarsely, enough for the send queue's BIND_MW and
//! LOCAL_INV work requests: a window is a key naming an invalid region (an `add`ed region
//! after [`Memory::invalidate_local`]); [`Memory::bind_window`] replaces it with a fresh,
//! zero-filled region of the bind's range and rights under the new key (lkey == rkey). The
//! window does not alias the bytes of the region it is bound to, and the region named by
//! `mr_lkey` is not checked: the verbs layer's memory is the model of real windows.
//!
//! 64-bit words used by atomics are stored in the host's byte order, as a CPU would see
//! them; [`TestMemory::read_u64`] / [`TestMemory::write_u64`] use the same order.

use std::collections::HashMap;
use std::ops::{BitOr, BitOrAssign};
use std::sync::{Mutex, MutexGuard};

use thiserror::Error;

use crate::memory::{
    AtomicOp, LocalAccessError, Memory, MwBind, MwError, RemoteAccessError, RemoteOp, Sge,
};

/// Page size used to align the addresses of registered regions.
pub const PAGE: u64 = 4096;

/// Low byte of every lkey of a registered region.
const LKEY_TAG: u32 = 0x4C;
/// Low byte of every rkey of a registered region.
const RKEY_TAG: u32 = 0x52;

/// Access rights of a region (`enum ibv_access_flags` bit values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights: local read only.
    pub const NONE: Access = Access(0);
    /// The region may be written by local operations (receives, READ results, atomic
    /// results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Remote peers may RDMA READ from the region.
    pub const REMOTE_READ: Access = Access(4);
    /// Remote peers may execute atomics on the region.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Every right.
    pub const ALL: Access = Access(1 | 2 | 4 | 8);

    /// The rights of `enum ibv_access_flags` bits (a memory window's `access`); bits
    /// without a meaning here are kept and ignored.
    pub const fn from_bits(bits: u32) -> Access {
        Access(bits)
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// True when every right in `other` is also in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

/// What a test keeps of a region: its keys, address and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionHandle {
    /// Local key (for SGEs).
    pub lkey: u32,
    /// Remote key (for RETH / AtomicETH).
    pub rkey: u32,
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
}

impl RegionHandle {
    /// An SGE over `len` bytes at byte `offset` of the region (not bounds-checked: tests
    /// build out-of-bounds SGEs on purpose).
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr.wrapping_add(offset),
            length: len,
            lkey: self.lkey,
        }
    }

    /// The virtual address of byte `offset` of the region.
    pub fn va(&self, offset: u64) -> u64 {
        self.addr.wrapping_add(offset)
    }
}

/// Why a test helper of [`TestMemory`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TestMemoryError {
    /// The handle does not belong to this memory.
    #[error("no region with lkey {lkey:#x} in this memory")]
    UnknownRegion {
        /// The handle's lkey.
        lkey: u32,
    },
    /// The byte range is outside the region.
    #[error("bytes [{offset}, +{len}) are outside the {region_len}-byte region")]
    OutOfBounds {
        /// Offset into the region.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
}

/// Counts of what remote peers did to this memory (to prove exactly-once execution).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Successful `atomic_remote` calls (each one executed the atomic once).
    pub atomics: u64,
    /// Successful `write_remote` calls.
    pub remote_writes: u64,
    /// Successful `read_remote` calls.
    pub remote_reads: u64,
    /// Successful `invalidate_remote` calls.
    pub invalidations: u64,
    /// Successful `atomic_write_remote` calls (IBA 1.5 ATOMIC WRITE stores).
    pub atomic_writes: u64,
    /// Calls of any kind that returned an error.
    pub errors: u64,
}

#[derive(Debug)]
struct Region {
    lkey: u32,
    rkey: u32,
    addr: u64,
    access: Access,
    data: Vec<u8>,
    /// False after invalidation: both keys stop working.
    valid: bool,
    /// True while access is revoked (the keys still name the region).
    revoked: bool,
}

impl Region {
    /// `[addr, addr + len)` as a range of `data`, if it lies inside the region.
    fn range(&self, addr: u64, len: u64) -> Option<std::ops::Range<usize>> {
        let start = addr.checked_sub(self.addr)?;
        let end = start.checked_add(len)?;
        if end > self.data.len() as u64 {
            return None;
        }
        Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }

    fn handle(&self) -> RegionHandle {
        RegionHandle {
            lkey: self.lkey,
            rkey: self.rkey,
            addr: self.addr,
            len: self.data.len() as u64,
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// Every region ever added; a replaced or rebound one stays here without keys.
    regions: Vec<Region>,
    /// Index in `regions` of the region each lkey names.
    by_lkey: HashMap<u32, usize>,
    /// Index in `regions` of the region each rkey names.
    by_rkey: HashMap<u32, usize>,
    next_addr: u64,
    stats: MemoryStats,
}

impl Inner {
    fn lkey_region(&mut self, lkey: u32) -> Option<&mut Region> {
        let i = *self.by_lkey.get(&lkey)?;
        self.regions.get_mut(i)
    }

    fn rkey_region(&mut self, rkey: u32) -> Option<&mut Region> {
        let i = *self.by_rkey.get(&rkey)?;
        self.regions.get_mut(i)
    }

    /// Takes both keys away from the region that `key` names as an lkey or an rkey.
    fn unmap(&mut self, key: u32) {
        for i in [self.by_lkey.get(&key), self.by_rkey.get(&key)]
            .into_iter()
            .flatten()
            .copied()
            .collect::<Vec<_>>()
        {
            if let Some(r) = self.regions.get(i) {
                let (lkey, rkey) = (r.lkey, r.rkey);
                if self.by_lkey.get(&lkey) == Some(&i) {
                    self.by_lkey.remove(&lkey);
                }
                if self.by_rkey.get(&rkey) == Some(&i) {
                    self.by_rkey.remove(&rkey);
                }
            }
        }
    }

    /// Adds `region`, replacing any region one of its keys names.
    fn insert(&mut self, region: Region) -> RegionHandle {
        self.unmap(region.lkey);
        self.unmap(region.rkey);
        let i = self.regions.len();
        self.by_lkey.insert(region.lkey, i);
        self.by_rkey.insert(region.rkey, i);
        let handle = region.handle();
        self.regions.push(region);
        handle
    }
}

/// A [`Memory`] over regions registered by the test. Interior mutability through a mutex,
/// so it is `Sync` and can be shared by several engines.
#[derive(Debug)]
pub struct TestMemory {
    inner: Mutex<Inner>,
}

impl Default for TestMemory {
    fn default() -> Self {
        TestMemory::new()
    }
}

impl TestMemory {
    /// Where the first region of [`TestMemory::new`] starts.
    pub const DEFAULT_BASE: u64 = 0x1000_0000;

    /// An empty memory whose registered regions start at [`TestMemory::DEFAULT_BASE`].
    pub fn new() -> TestMemory {
        TestMemory::with_base(TestMemory::DEFAULT_BASE)
    }

    /// An empty memory whose first registered region starts at `base` rounded up to a
    /// page.
    pub fn with_base(base: u64) -> TestMemory {
        TestMemory {
            inner: Mutex::new(Inner {
                regions: Vec::new(),
                by_lkey: HashMap::new(),
                by_rkey: HashMap::new(),
                next_addr: base.div_ceil(PAGE).saturating_mul(PAGE),
                stats: MemoryStats::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while the lock was held cannot leave a region half-updated in a way
        // that matters to a test (every update is a single copy), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a zero-filled region of `len` bytes with `access` rights, at the next
    /// free page-aligned address, with keys of its own (see the module documentation).
    pub fn register(&self, len: usize, access: Access) -> RegionHandle {
        let mut inner = self.lock();
        // The n-th registration gets index n unless a fixed key of `add` took that
        // index's keys; each fixed key blocks at most one index, so the search ends within
        // `by_lkey.len() + 1` candidates.
        let first = inner.regions.len() + 1;
        let taken = |inner: &Inner, k: u32| {
            inner.by_lkey.contains_key(&k) || inner.by_rkey.contains_key(&k)
        };
        let tag_base = (first..=first + inner.by_lkey.len())
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX >> 8) << 8)
            .find(|t| !taken(&inner, t | LKEY_TAG) && !taken(&inner, t | RKEY_TAG))
            .unwrap_or(u32::MAX << 8);
        let addr = inner.next_addr;
        let len64 = len as u64;
        // One unmapped page after every region (also after empty ones).
        let span = len64.div_ceil(PAGE).saturating_add(1).saturating_mul(PAGE);
        inner.next_addr = addr.saturating_add(span);
        inner.insert(Region {
            lkey: tag_base | LKEY_TAG,
            rkey: tag_base | RKEY_TAG,
            addr,
            access,
            data: vec![0; len],
            valid: true,
            revoked: false,
        })
    }

    /// Adds a zero-filled region of `len` bytes at `base` whose lkey and rkey are both
    /// `key`, replacing any region that `key` names. The address is the test's choice
    /// (regions may even overlap: each has bytes of its own).
    pub fn add(&self, key: u32, base: u64, len: usize, access: Access) -> RegionHandle {
        self.lock().insert(Region {
            lkey: key,
            rkey: key,
            addr: base,
            access,
            data: vec![0; len],
            valid: true,
            revoked: false,
        })
    }

    fn with_region<T>(
        &self,
        h: &RegionHandle,
        f: impl FnOnce(&mut Region) -> Result<T, TestMemoryError>,
    ) -> Result<T, TestMemoryError> {
        let mut inner = self.lock();
        let region = inner
            .lkey_region(h.lkey)
            .filter(|r| r.addr == h.addr)
            .ok_or(TestMemoryError::UnknownRegion { lkey: h.lkey })?;
        f(region)
    }

    fn helper_range(
        region: &Region,
        offset: u64,
        len: u64,
    ) -> Result<std::ops::Range<usize>, TestMemoryError> {
        region
            .range(region.addr.saturating_add(offset), len)
            .filter(|_| offset <= region.data.len() as u64)
            .ok_or(TestMemoryError::OutOfBounds {
                offset,
                len,
                region_len: region.data.len() as u64,
            })
    }

    /// Fills the whole region with `byte` (ignores rights and state: a test helper).
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`] for a handle of another memory.
    pub fn fill(&self, h: &RegionHandle, byte: u8) -> Result<(), TestMemoryError> {
        self.with_region(h, |r| {
            r.data.fill(byte);
            Ok(())
        })
    }

    /// Writes `bytes` at byte `offset` of the region (ignores rights and state).
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`], [`TestMemoryError::OutOfBounds`].
    pub fn write(
        &self,
        h: &RegionHandle,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), TestMemoryError> {
        self.with_region(h, |r| {
            let range = Self::helper_range(r, offset, bytes.len() as u64)?;
            // invariant: helper_range returned a range inside r.data.
            r.data[range].copy_from_slice(bytes);
            Ok(())
        })
    }

    /// Reads `len` bytes at byte `offset` of the region (ignores rights and state).
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`], [`TestMemoryError::OutOfBounds`].
    pub fn read(
        &self,
        h: &RegionHandle,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, TestMemoryError> {
        self.with_region(h, |r| {
            let range = Self::helper_range(r, offset, len as u64)?;
            // invariant: helper_range returned a range inside r.data.
            Ok(r.data[range].to_vec())
        })
    }

    /// The whole region's contents.
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`].
    pub fn contents(&self, h: &RegionHandle) -> Result<Vec<u8>, TestMemoryError> {
        self.with_region(h, |r| Ok(r.data.clone()))
    }

    /// Reads the 64-bit word at byte `offset` (host byte order, as atomics store it).
    ///
    /// # Errors
    /// As [`TestMemory::read`].
    pub fn read_u64(&self, h: &RegionHandle, offset: u64) -> Result<u64, TestMemoryError> {
        let bytes = self.read(h, offset, 8)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes);
        Ok(u64::from_ne_bytes(word))
    }

    /// Writes the 64-bit word at byte `offset` (host byte order).
    ///
    /// # Errors
    /// As [`TestMemory::write`].
    pub fn write_u64(
        &self,
        h: &RegionHandle,
        offset: u64,
        value: u64,
    ) -> Result<(), TestMemoryError> {
        self.write(h, offset, &value.to_ne_bytes())
    }

    /// Invalidates the region as SEND_WITH_INVALIDATE / LOCAL_INV would: both keys stop
    /// working (lookups fail with `BadKey`).
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`].
    pub fn invalidate(&self, h: &RegionHandle) -> Result<(), TestMemoryError> {
        self.with_region(h, |r| {
            r.valid = false;
            Ok(())
        })
    }

    /// Makes an invalidated region valid again (a fresh registration with the same keys).
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`].
    pub fn revalidate(&self, h: &RegionHandle) -> Result<(), TestMemoryError> {
        self.with_region(h, |r| {
            r.valid = true;
            Ok(())
        })
    }

    /// True unless the region was invalidated.
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`].
    pub fn is_valid(&self, h: &RegionHandle) -> Result<bool, TestMemoryError> {
        self.with_region(h, |r| Ok(r.valid))
    }

    /// Revokes (`true`) or restores (`false`) access to the region: while revoked every
    /// access fails with `Revoked`.
    ///
    /// # Errors
    /// [`TestMemoryError::UnknownRegion`].
    pub fn set_revoked(&self, h: &RegionHandle, revoked: bool) -> Result<(), TestMemoryError> {
        self.with_region(h, |r| {
            r.revoked = revoked;
            Ok(())
        })
    }

    /// The handle of the region whose lkey is `key` (for regions of [`TestMemory::add`],
    /// also its rkey).
    pub fn region(&self, key: u32) -> Option<RegionHandle> {
        self.lock().lkey_region(key).map(|r| r.handle())
    }

    /// The region of `key` and the offset of `addr` in it, for the key helpers.
    #[track_caller]
    fn key_region(&self, key: u32, addr: u64) -> (RegionHandle, u64) {
        let Some(h) = self.region(key) else {
            panic!("no region with key {key:#x}");
        };
        (h, addr.wrapping_sub(h.addr))
    }

    /// Writes `bytes` at address `addr` of the region with lkey `key` (ignores rights and
    /// state: a test helper for regions of [`TestMemory::add`]).
    ///
    /// # Panics
    /// If no region has the key or the bytes are outside it.
    #[track_caller]
    pub fn put(&self, key: u32, addr: u64, bytes: &[u8]) {
        let (h, offset) = self.key_region(key, addr);
        if let Err(e) = self.write(&h, offset, bytes) {
            panic!("put at {addr:#x} of key {key:#x}: {e}");
        }
    }

    /// Reads `len` bytes at address `addr` of the region with lkey `key` (ignores rights
    /// and state).
    ///
    /// # Panics
    /// If no region has the key or the bytes are outside it.
    #[track_caller]
    pub fn get(&self, key: u32, addr: u64, len: usize) -> Vec<u8> {
        let (h, offset) = self.key_region(key, addr);
        match self.read(&h, offset, len) {
            Ok(bytes) => bytes,
            Err(e) => panic!("get at {addr:#x} of key {key:#x}: {e}"),
        }
    }

    /// Writes the 64-bit word at address `addr` of the region with lkey `key` (host byte
    /// order).
    ///
    /// # Panics
    /// As [`TestMemory::put`].
    #[track_caller]
    pub fn put_u64(&self, key: u32, addr: u64, value: u64) {
        self.put(key, addr, &value.to_ne_bytes());
    }

    /// Reads the 64-bit word at address `addr` of the region with lkey `key` (host byte
    /// order).
    ///
    /// # Panics
    /// As [`TestMemory::get`].
    #[track_caller]
    pub fn get_u64(&self, key: u32, addr: u64) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.get(key, addr, 8));
        u64::from_ne_bytes(word)
    }

    /// True when a region has lkey `key` and was not invalidated.
    pub fn is_key_valid(&self, key: u32) -> bool {
        self.lock().lkey_region(key).is_some_and(|r| r.valid)
    }

    /// Counts of remote operations so far.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }

    /// The region of `lkey` and the range `[addr, addr + len)` in it, after the local
    /// checks (`write` adds the LOCAL_WRITE check).
    fn local(
        inner: &mut Inner,
        lkey: u32,
        addr: u64,
        len: usize,
        write: bool,
    ) -> Result<(&mut Region, std::ops::Range<usize>), LocalAccessError> {
        let region = inner
            .lkey_region(lkey)
            .filter(|r| r.valid)
            .ok_or(LocalAccessError::BadKey { lkey })?;
        if region.revoked {
            return Err(LocalAccessError::Revoked { lkey });
        }
        if write && !region.access.contains(Access::LOCAL_WRITE) {
            return Err(LocalAccessError::NotWritable { lkey });
        }
        let range = region
            .range(addr, len as u64)
            .ok_or(LocalAccessError::OutOfBounds {
                lkey,
                addr,
                len: len as u64,
            })?;
        Ok((region, range))
    }

    /// The region of `rkey` and the range `[va, va + len)` in it, after the remote checks
    /// in this order: key (and not invalidated), not revoked, permission for `op`, bounds,
    /// atomic alignment.
    fn remote(
        inner: &mut Inner,
        rkey: u32,
        va: u64,
        len: u64,
        op: RemoteOp,
    ) -> Result<(&mut Region, std::ops::Range<usize>), RemoteAccessError> {
        let region = inner
            .rkey_region(rkey)
            .filter(|r| r.valid)
            .ok_or(RemoteAccessError::BadKey { rkey })?;
        if region.revoked {
            return Err(RemoteAccessError::Revoked { rkey });
        }
        let needed = match op {
            RemoteOp::Read => Access::REMOTE_READ,
            RemoteOp::Write => Access::REMOTE_WRITE,
            RemoteOp::Atomic => Access::REMOTE_ATOMIC,
        };
        if !region.access.contains(needed) {
            return Err(RemoteAccessError::NoPermission { rkey, op });
        }
        let range = region
            .range(va, len)
            .ok_or(RemoteAccessError::OutOfBounds { rkey, va, len })?;
        if op == RemoteOp::Atomic && va % 8 != 0 {
            return Err(RemoteAccessError::Misaligned { va });
        }
        Ok((region, range))
    }
}

/// Counts an error in the stats and passes the result through.
fn counted<T, E>(stats: &mut MemoryStats, r: Result<T, E>) -> Result<T, E> {
    if r.is_err() {
        stats.errors += 1;
    }
    r
}

impl Memory for TestMemory {
    fn read_local(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), LocalAccessError> {
        let mut inner = self.lock();
        let r = Self::local(&mut inner, lkey, addr, dst.len(), false).map(|(region, range)| {
            // invariant: `local` returned a range inside region.data of dst.len() bytes.
            dst.copy_from_slice(&region.data[range]);
        });
        counted(&mut inner.stats, r)
    }

    fn write_local(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), LocalAccessError> {
        let mut inner = self.lock();
        let r = Self::local(&mut inner, lkey, addr, src.len(), true).map(|(region, range)| {
            // invariant: `local` returned a range inside region.data of src.len() bytes.
            region.data[range].copy_from_slice(src);
        });
        counted(&mut inner.stats, r)
    }

    fn check_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        op: RemoteOp,
    ) -> Result<(), RemoteAccessError> {
        if len == 0 {
            return Ok(());
        }
        let mut inner = self.lock();
        let r = Self::remote(&mut inner, rkey, va, len, op).map(|_| ());
        counted(&mut inner.stats, r)
    }

    fn write_remote(&self, rkey: u32, va: u64, src: &[u8]) -> Result<(), RemoteAccessError> {
        if src.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        let r = Self::remote(&mut inner, rkey, va, src.len() as u64, RemoteOp::Write).map(
            |(region, range)| {
                // invariant: `remote` returned a range inside region.data of src.len() bytes.
                region.data[range].copy_from_slice(src);
            },
        );
        if r.is_ok() {
            inner.stats.remote_writes += 1;
        }
        counted(&mut inner.stats, r)
    }

    fn read_remote(&self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), RemoteAccessError> {
        if dst.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        let r = Self::remote(&mut inner, rkey, va, dst.len() as u64, RemoteOp::Read).map(
            |(region, range)| {
                // invariant: `remote` returned a range inside region.data of dst.len() bytes.
                dst.copy_from_slice(&region.data[range]);
            },
        );
        if r.is_ok() {
            inner.stats.remote_reads += 1;
        }
        counted(&mut inner.stats, r)
    }

    fn atomic_remote(&self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError> {
        let mut inner = self.lock();
        let r = Self::remote(&mut inner, rkey, va, 8, RemoteOp::Atomic).map(|(region, range)| {
            let mut word = [0u8; 8];
            // invariant: `remote` returned an 8-byte range inside region.data.
            word.copy_from_slice(&region.data[range.clone()]);
            let orig = u64::from_ne_bytes(word);
            let new = match op {
                AtomicOp::FetchAdd { add } => orig.wrapping_add(add),
                AtomicOp::CompareSwap { compare, swap } => {
                    if orig == compare {
                        swap
                    } else {
                        orig
                    }
                }
            };
            region.data[range].copy_from_slice(&new.to_ne_bytes());
            orig
        });
        if r.is_ok() {
            inner.stats.atomics += 1;
        }
        counted(&mut inner.stats, r)
    }

    /// The region's bytes sit behind the memory's lock: the 8 bytes are copied under it,
    /// so no reader sees them half written.
    fn atomic_write_remote(
        &self,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), RemoteAccessError> {
        let mut inner = self.lock();
        let r =
            Self::remote(&mut inner, rkey, va, 8, RemoteOp::Write).and_then(|(region, range)| {
                if va % 8 != 0 {
                    return Err(RemoteAccessError::Misaligned { va });
                }
                // invariant: `remote` returned an 8-byte range inside region.data.
                region.data[range].copy_from_slice(&value);
                Ok(())
            });
        if r.is_ok() {
            inner.stats.atomic_writes += 1;
        }
        counted(&mut inner.stats, r)
    }

    fn invalidate_remote(&self, rkey: u32) -> Result<(), RemoteAccessError> {
        let mut inner = self.lock();
        let r = inner
            .rkey_region(rkey)
            .filter(|r| r.valid)
            .map(|region| region.valid = false)
            .ok_or(RemoteAccessError::BadKey { rkey });
        if r.is_ok() {
            inner.stats.invalidations += 1;
        }
        counted(&mut inner.stats, r)
    }

    /// BIND_MW: the window `mw_rkey` (a key naming an invalid, i.e. unbound, region)
    /// becomes a fresh zero-filled region `new_rkey` (lkey == rkey) over
    /// `[addr, addr + length)` with the bind's rights. A valid region under `mw_rkey` is
    /// a bound window (`WrongState`); an unknown key is `BadWindow`.
    fn bind_window(&self, b: &MwBind) -> Result<(), MwError> {
        let mut inner = self.lock();
        let r = match inner.rkey_region(b.mw_rkey) {
            Some(w) if !w.valid => usize::try_from(b.length).map_err(|_| MwError::OutOfBounds {
                addr: b.addr,
                len: b.length,
            }),
            Some(_) => Err(MwError::WrongState { rkey: b.mw_rkey }),
            None => Err(MwError::BadWindow { rkey: b.mw_rkey }),
        }
        .map(|len| {
            inner.unmap(b.mw_rkey);
            inner.insert(Region {
                lkey: b.new_rkey,
                rkey: b.new_rkey,
                addr: b.addr,
                access: Access::from_bits(b.access),
                data: vec![0; len],
                valid: true,
                revoked: false,
            });
        });
        counted(&mut inner.stats, r)
    }

    /// LOCAL_INV: invalidates the valid region (bound window) `rkey`; an unknown or
    /// already invalid key is `BadWindow`.
    fn invalidate_local(&self, rkey: u32) -> Result<(), MwError> {
        let mut inner = self.lock();
        let r = inner
            .rkey_region(rkey)
            .filter(|r| r.valid)
            .map(|region| region.valid = false)
            .ok_or(MwError::BadWindow { rkey });
        counted(&mut inner.stats, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_page_aligned_distinct_and_separated() {
        let m = TestMemory::new();
        let a = m.register(10, Access::ALL);
        let b = m.register(4096, Access::ALL);
        let c = m.register(0, Access::ALL);
        let d = m.register(1, Access::ALL);
        for h in [a, b, c, d] {
            assert_eq!(h.addr % PAGE, 0);
            assert_ne!(h.lkey, h.rkey);
        }
        assert_eq!(a.addr, TestMemory::DEFAULT_BASE);
        // a: one page + gap; b: one page + gap; c: gap only.
        assert_eq!(b.addr, a.addr + 2 * PAGE);
        assert_eq!(c.addr, b.addr + 2 * PAGE);
        assert_eq!(d.addr, c.addr + PAGE);
    }

    #[test]
    fn local_access_checks() {
        let m = TestMemory::new();
        let rw = m.register(16, Access::LOCAL_WRITE);
        let ro = m.register(16, Access::NONE);
        m.write_local(rw.lkey, rw.va(4), b"abcd").unwrap();
        let mut out = [0u8; 4];
        m.read_local(rw.lkey, rw.va(4), &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        assert_eq!(
            m.write_local(ro.lkey, ro.va(0), b"x"),
            Err(LocalAccessError::NotWritable { lkey: ro.lkey })
        );
        assert_eq!(
            m.read_local(rw.rkey, rw.va(0), &mut out),
            Err(LocalAccessError::BadKey { lkey: rw.rkey })
        );
        assert_eq!(
            m.read_local(rw.lkey, rw.va(13), &mut out),
            Err(LocalAccessError::OutOfBounds {
                lkey: rw.lkey,
                addr: rw.va(13),
                len: 4
            })
        );
        assert_eq!(
            m.read_local(rw.lkey, rw.va(0) - 1, &mut out[..1]),
            Err(LocalAccessError::OutOfBounds {
                lkey: rw.lkey,
                addr: rw.va(0) - 1,
                len: 1
            })
        );
        // Exactly up to the end is fine.
        m.read_local(rw.lkey, rw.va(12), &mut out).unwrap();
        m.set_revoked(&rw, true).unwrap();
        assert_eq!(
            m.read_local(rw.lkey, rw.va(0), &mut out),
            Err(LocalAccessError::Revoked { lkey: rw.lkey })
        );
    }

    #[test]
    fn remote_access_checks_and_no_effect_on_error() {
        let m = TestMemory::new();
        let w = m.register(32, Access::REMOTE_WRITE);
        let r = m.register(32, Access::REMOTE_READ | Access::REMOTE_ATOMIC);
        m.write_remote(w.rkey, w.va(0), b"hello").unwrap();
        assert_eq!(m.read(&w, 0, 5).unwrap(), b"hello");
        assert_eq!(
            m.write_remote(r.rkey, r.va(0), b"x"),
            Err(RemoteAccessError::NoPermission {
                rkey: r.rkey,
                op: RemoteOp::Write
            })
        );
        assert_eq!(
            m.write_remote(w.rkey, w.va(30), b"xyz"),
            Err(RemoteAccessError::OutOfBounds {
                rkey: w.rkey,
                va: w.va(30),
                len: 3
            })
        );
        assert_eq!(m.read(&w, 30, 2).unwrap(), [0, 0]);
        assert_eq!(
            m.write_remote(w.lkey, w.va(0), b"x"),
            Err(RemoteAccessError::BadKey { rkey: w.lkey })
        );
        // Zero-length accesses are always allowed, even with a bad key (IBA C9-88).
        assert_eq!(m.check_remote(0xdead, 0, 0, RemoteOp::Read), Ok(()));
        assert_eq!(m.check_remote(r.rkey, r.va(0), 32, RemoteOp::Read), Ok(()));
        assert_eq!(
            m.atomic_remote(r.rkey, r.va(4), AtomicOp::FetchAdd { add: 1 }),
            Err(RemoteAccessError::Misaligned { va: r.va(4) })
        );
        assert_eq!(m.stats().atomics, 0);
        assert_eq!(m.stats().errors, 4);
    }

    #[test]
    fn atomics_execute_once_per_call() {
        let m = TestMemory::new();
        let h = m.register(16, Access::REMOTE_ATOMIC);
        m.write_u64(&h, 8, 40).unwrap();
        assert_eq!(
            m.atomic_remote(h.rkey, h.va(8), AtomicOp::FetchAdd { add: 2 }),
            Ok(40)
        );
        assert_eq!(m.read_u64(&h, 8).unwrap(), 42);
        let cas = AtomicOp::CompareSwap {
            compare: 42,
            swap: 7,
        };
        assert_eq!(m.atomic_remote(h.rkey, h.va(8), cas), Ok(42));
        assert_eq!(m.atomic_remote(h.rkey, h.va(8), cas), Ok(7));
        assert_eq!(m.read_u64(&h, 8).unwrap(), 7);
        assert_eq!(m.stats().atomics, 3);
    }

    #[test]
    fn invalidation_kills_both_keys() {
        let m = TestMemory::new();
        let h = m.register(8, Access::ALL);
        m.invalidate_remote(h.rkey).unwrap();
        assert_eq!(
            m.invalidate_remote(h.rkey),
            Err(RemoteAccessError::BadKey { rkey: h.rkey })
        );
        let mut b = [0u8; 1];
        assert_eq!(
            m.read_local(h.lkey, h.addr, &mut b),
            Err(LocalAccessError::BadKey { lkey: h.lkey })
        );
        assert!(!m.is_valid(&h).unwrap());
        m.revalidate(&h).unwrap();
        m.read_local(h.lkey, h.addr, &mut b).unwrap();
    }

    #[test]
    fn helpers_reject_foreign_handles_and_bounds() {
        let m = TestMemory::new();
        let other = TestMemory::with_base(0x9000_0000);
        let h = m.register(8, Access::ALL);
        let foreign = other.register(8, Access::ALL);
        assert_eq!(
            m.fill(&foreign, 1),
            Err(TestMemoryError::UnknownRegion { lkey: foreign.lkey })
        );
        assert_eq!(
            m.read(&h, 4, 5),
            Err(TestMemoryError::OutOfBounds {
                offset: 4,
                len: 5,
                region_len: 8
            })
        );
        m.fill(&h, 0xAB).unwrap();
        assert_eq!(m.contents(&h).unwrap(), vec![0xAB; 8]);
    }

    #[test]
    fn fixed_keys_name_both_sides_and_replace() {
        let m = TestMemory::new();
        let h = m.add(7, 0x1000, 16, Access::LOCAL_WRITE | Access::REMOTE_READ);
        assert_eq!((h.lkey, h.rkey, h.addr, h.len), (7, 7, 0x1000, 16));
        m.put(7, 0x1004, b"abcd");
        assert_eq!(m.get(7, 0x1004, 4), b"abcd");
        let mut out = [0u8; 4];
        m.read_remote(7, 0x1004, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        m.put_u64(7, 0x1008, 0x0102_0304_0506_0708);
        assert_eq!(m.get_u64(7, 0x1008), 0x0102_0304_0506_0708);
        assert_eq!(m.read_u64(&h, 8).unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(
            m.write_remote(7, 0x1000, b"x"),
            Err(RemoteAccessError::NoPermission {
                rkey: 7,
                op: RemoteOp::Write
            })
        );
        // A registered region next to fixed keys gets keys of its own.
        let r = m.register(8, Access::ALL);
        assert_eq!((r.lkey, r.rkey), (0x24C, 0x252));
        // Adding the key again replaces the region: fresh zero bytes at the new address.
        m.add(7, 0x5000, 8, Access::ALL);
        assert_eq!(m.get(7, 0x5000, 8), [0; 8]);
        assert_eq!(
            m.read_local(7, 0x1004, &mut out),
            Err(LocalAccessError::OutOfBounds {
                lkey: 7,
                addr: 0x1004,
                len: 4
            })
        );
        assert_eq!(m.region(7).map(|h| h.addr), Some(0x5000));
        assert!(m.is_key_valid(7));
        m.invalidate_remote(7).unwrap();
        assert!(!m.is_key_valid(7));
        assert!(!m.is_key_valid(0x99));
        // A fixed key that takes a registration's keys pushes the next one further.
        let m = TestMemory::new();
        m.add(0x24C, 0, 8, Access::ALL);
        let r = m.register(8, Access::ALL);
        assert_eq!((r.lkey, r.rkey), (0x34C, 0x352));
    }

    #[test]
    #[should_panic(expected = "no region with key 0x5")]
    fn key_helpers_panic_on_unknown_keys() {
        TestMemory::new().get(5, 0, 1);
    }

    #[test]
    fn windows_bind_and_invalidate() {
        let m = TestMemory::new();
        let bind = |mw_rkey, new_rkey| MwBind {
            mw_rkey,
            new_rkey,
            mr_lkey: 1,
            addr: 0x9000,
            length: 64,
            access: Access::REMOTE_WRITE.bits(),
            type1: false,
        };
        assert_eq!(
            m.bind_window(&bind(0x300, 0x301)),
            Err(MwError::BadWindow { rkey: 0x300 })
        );
        m.add(0x300, 0, 0, Access::NONE);
        assert_eq!(
            m.bind_window(&bind(0x300, 0x301)),
            Err(MwError::WrongState { rkey: 0x300 }),
            "a valid window is bound"
        );
        m.invalidate_local(0x300).unwrap();
        assert_eq!(
            m.invalidate_local(0x300),
            Err(MwError::BadWindow { rkey: 0x300 })
        );
        m.bind_window(&bind(0x300, 0x301)).unwrap();
        assert!(m.region(0x300).is_none(), "the old key is gone");
        m.write_remote(0x301, 0x9008, b"hello").unwrap();
        assert_eq!(m.get(0x301, 0x9008, 5), b"hello");
        assert_eq!(
            m.read_remote(0x301, 0x9008, &mut [0; 5]),
            Err(RemoteAccessError::NoPermission {
                rkey: 0x301,
                op: RemoteOp::Read
            })
        );
        m.invalidate_local(0x301).unwrap();
        assert!(!m.is_key_valid(0x301));
        assert_eq!(
            m.write_remote(0x301, 0x9008, b"x"),
            Err(RemoteAccessError::BadKey { rkey: 0x301 })
        );
        assert_eq!(m.get(0x301, 0x9008, 5), b"hello", "untouched");
    }
}
