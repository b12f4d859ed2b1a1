//! The bytes a memory region covers ([`MemBlock`]) and the only code in uroce that touches
//! registered memory by address.
//!
//! # The problem
//!
//! Once memory is registered, the network may read or write it at any moment: a peer's
//! RDMA WRITE lands in it, a peer's RDMA READ copies out of it, an atomic updates a word,
//! and the transport engine does all of this from whatever thread drives the QP. If the
//! application at the same time held an ordinary `&[u8]` or `&mut [u8]` to the buffer,
//! every such network access would be a data race — undefined behaviour in Rust's memory
//! model, not merely "unspecified bytes". A safe Rust API therefore must never hand out an
//! ordinary slice of memory while remote (or engine) access is possible.
//!
//! # The design
//!
//! A [`MemBlock`] comes in two kinds:
//!
//! * **Owned** ([`MemBlock::new`], [`MemBlock::from_slice`]): uroce allocates the memory
//!   itself as a `Box<[AtomicU64]>` (8-byte aligned, zero-initialised, `ceil(len / 8)`
//!   words) and remembers the exact byte length. The application never gets a plain
//!   reference to these words except through an [`ExclusiveGuard`] (below).
//! * **Raw** ([`MemBlock::from_raw`], `unsafe`): an address range owned by someone else,
//!   registered through the C ABI. The caller promises that the range stays valid until the
//!   block is dropped or [`MemBlock::retire`] has returned `Ok`.
//!
//! **Every access uroce makes to the bytes of an owned block is an atomic operation on a
//! naturally aligned `AtomicU64` word**, from every thread. So is every IB atomic on a Raw
//! range, and every copy on a Raw range on targets without the bulk copy, except the at most
//! 7 leading and 7 trailing bytes of a Raw range that are not part of a whole aligned word,
//! which use `AtomicU8` (see below). Copies on a Raw range on x86-64 are the *bulk copy*
//! instead: the C program's memory copied as the C program or a NIC copies it (see "Raw
//! blocks: the bulk copy"). The word-atomic copies:
//!
//! * copies ([`MemAccess::copy_in`], [`MemAccess::copy_out`], [`MemAccess::fill`]) move the
//!   aligned middle of the range with one `Relaxed` 64-bit load or store per word
//!   (`u64::from_ne_bytes` / `to_ne_bytes`, so the byte at address `a` is always byte
//!   `a % 8` of the word in memory order, on any endianness);
//! * a partial word at either edge of a copy is read with an atomic load, or written with a
//!   compare-and-swap on the containing aligned word that replaces only the wanted bytes
//!   and writes back the current value of the others. The CAS is retried a bounded number
//!   of times (64); if it keeps losing under pathological contention the bytes
//!   are written wait-free with `fetch_and(!mask)` followed by `fetch_or(bits)`, which also
//!   never changes bytes outside the mask (a concurrent reader of *those* bytes may then see
//!   them zero for an instant — only bytes that are themselves being written concurrently,
//!   whose content RDMA leaves unspecified anyway);
//! * IB atomics ([`MemAccess::atomic_fetch_add`], [`MemAccess::atomic_compare_swap`]) are a
//!   single `SeqCst` read-modify-write on the aligned word, so each call takes effect
//!   exactly once, atomically with respect to every other access.
//!
//! Because all accesses are atomic, concurrent copies and atomics from any number of
//! threads never form a data race in Rust's memory model: overlapping concurrent writes
//! leave *some* mixture of the written values (exactly what the IB specification permits),
//! never undefined behaviour. uroce never uses atomics of different sizes on the same bytes
//! (8-bit atomics only ever touch bytes that no 64-bit atomic covers), so the "mixed-size
//! atomics" restriction of the memory model does not arise. Values are native-endian: an IB
//! atomic adds to the 64-bit integer as the host CPU sees it (as the Linux software RoCE
//! driver does).
//!
//! # Local exclusive access: the gate
//!
//! The application sometimes needs a real `&mut [u8]` (to hand a buffer to a parser, to
//! `read(2)` into it…). [`MemBlock::exclusive`] provides one for Owned blocks by **revoking
//! uroce's access for the guard's lifetime**:
//!
//! * every accessor first takes a cheap shared *ticket* ([`MemAccess`]): one `fetch_add` on
//!   the block's gate word, which fails with [`MemError::Revoked`] if a guard is held (or
//!   [`MemError::Retired`] after [`MemBlock::retire`]); the ticket is given back with a
//!   `Release` `fetch_sub` when the [`MemAccess`] is dropped. Nothing touches the bytes
//!   without a live ticket — the atomic views are only reachable through [`MemAccess`];
//! * the guard sets the revoked flag (`fetch_or`), then waits — bounded spinning, then
//!   yielding, then short sleeps, up to a caller-given timeout — until the ticket count is
//!   zero (`Acquire` loads);
//! * only then does it create the `&mut [u8]`.
//!
//! Why this is sound: all read-modify-writes of the gate word are totally ordered. A ticket
//! whose `fetch_add` comes after the guard's `fetch_or` sees the flag and backs off without
//! touching memory. A ticket whose `fetch_add` came before is counted, and the guard waits
//! for its `Release` decrement; the guard's `Acquire` load that observes the count reach zero
//! synchronises with it, so every atomic access made under that ticket *happens before* the
//! first non-atomic access through the slice. While the guard lives no new ticket can be
//! taken, a second guard is refused ([`MemError::ExclusiveHeld`]), and the guard hands out
//! the slice only through `&self`/`&mut self` borrows of itself, so the borrow checker keeps
//! the slices it produces from aliasing. Dropping the guard clears the flag with `Release`;
//! the `Acquire` `fetch_add` of the next ticket synchronises with it, so the application's
//! non-atomic writes happen before uroce's next atomic access. Non-atomic and atomic accesses
//! to the same bytes are allowed as long as they are ordered by happens-before, which the gate
//! guarantees. The words live in `AtomicU64` (an `UnsafeCell`), so writing through a pointer
//! derived from the shared `&[AtomicU64]` is permitted interior mutability. Forgetting a
//! guard (`mem::forget`) leaves the block revoked forever — safe, merely unusable.
//!
//! A Raw block never produces a slice ([`MemBlock::exclusive`] returns
//! [`MemError::NotOwned`]): its memory belongs to foreign code that may touch it at any time.
//!
//! # Raw blocks and retirement
//!
//! A Raw block never touches a byte outside the registered range. The range is split into
//! up to 7 leading bytes before its first 8-aligned address, the 8-aligned 64-bit words that
//! lie wholly inside it, and up to 7 trailing bytes. Words are accessed exactly as in an
//! Owned block; the leading and trailing bytes with `AtomicU8` operations. No aligned 8-byte
//! word containing a leading or trailing byte lies inside the range, so no 64-bit atomic
//! (copy or IB atomic) ever covers those bytes: every byte is accessed with one atomic size
//! only. (Widening the edges to their containing aligned words would reach up to 7 bytes
//! past the caller's object — possibly another allocation, which is undefined behaviour in
//! Rust's model even though the hardware would tolerate it.)
//! The C application may access the memory concurrently with plain loads and stores; that is
//! outside Rust's memory model in the same way that DMA by a device is, and the content of
//! racing bytes is unspecified (C verbs semantics). See [`MemBlock::from_raw`] for the exact
//! contract.
//!
//! [`MemBlock::retire`] permanently closes the gate and waits for in-flight tickets to drain:
//! after it returns `Ok`, no accessor will ever touch the memory again, even through a block
//! that is still shared (for example held in an `Arc` by an engine thread). Deregistration
//! of a Raw MR must call it before returning to the C caller, who may then free the memory.
//!
//! # Raw blocks: the bulk copy
//!
//! A word-atomic copy cannot be vectorised: it moves 8 bytes per instruction, where a plain
//! copy moves 32 or 64 (docs/BENCHMARKS.md, "Design choices measured", has the figures).
//! It is needed where Rust code may access the bytes concurrently — an owned block, whose
//! words the application and uroce's other threads read and write as `AtomicU64`s: a plain
//! copy racing them would be a data race, undefined behaviour. A Raw range is different: it
//! is the C program's memory, which the `from_raw` contract already lets foreign code (the
//! program's plain loads and stores, a device's DMA) access at any moment concurrently with
//! uroce's atomics, with the content of racing bytes unspecified, as the IB specification
//! leaves it for racing RDMA accesses.
//!
//! So on x86-64 [`MemAccess::copy_in`], [`MemAccess::copy_out`], [`MemAccess::fill`] and
//! [`MemBlock::copy_from_block`] (Raw to Raw, ranges disjoint) move a Raw range's bytes with
//! one `rep movsb` (`rep stosb` for a fill) in an `asm!` block (module `bulk`), which runs at
//! memory speed for the sizes uroce copies (enhanced and fast-short `rep movsb` of current
//! cores). Why this is sound:
//!
//! * the copy is not a Rust access. The compiler treats the `asm!` block as opaque code that
//!   may read and write the memory its pointers reach (no `nomem`/`readonly`), as it treats a
//!   call into the C program; what the block does is what the hardware does with those
//!   instructions: byte loads and stores, each single-copy atomic on x86-64, with no notion
//!   of a data race. These are exactly the accesses the C program may make to the range
//!   itself at any moment, which the design already admits next to uroce's atomics. Racing
//!   the bulk copy therefore adds nothing new: an IB atomic or a word-atomic copy on another
//!   thread meeting it behaves as it would meeting the program's own `memcpy`, and two bulk
//!   copies meeting leave some mixture of bytes;
//! * it touches only `[address, address + len)` of the range, checked against the block
//!   before the copy (`raw_at`), never a byte outside it (no widening to words), and the
//!   other operand is a Rust slice, which cannot lie inside the range (the `from_raw`
//!   contract forbids Rust references to it);
//! * it runs under a ticket like every other access, so the gate, retirement and the
//!   [`MemBlock::retire`] guarantee are unchanged: the ticket's `Release` decrement is a
//!   locked instruction, which x86-64 does not reorder with earlier stores (string stores
//!   included), and the compiler cannot move the `asm!` block across it; after `retire`
//!   returns `Ok` no bulk copy is running or can start.
//!
//! Owned blocks keep the word-atomic copy: their bytes are a Rust allocation of `AtomicU64`s
//! that Rust code reads concurrently, not foreign memory. Other targets (and the
//! memory-model interpreter, which runs no assembly) keep the word-atomic copy for Raw ranges
//! too. Mixed copies (Raw to owned, owned to Raw, overlapping Raw ranges) go through
//! [`MemBlock::copy_from_block`]'s stack buffer, each side with its own copy.
//!
//! # Liveness
//!
//! Tickets are held only by [`MemAccess`] values; uroce's own accessors hold them for the
//! duration of one copy or atomic, never across a call into foreign code. Waiting for tickets
//! to drain is bounded by the caller's timeout ([`MemError::DrainTimeout`]).

use std::fmt;
use std::ops::Range;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Bytes per atomic word.
const WORD: usize = 8;

/// How many times a partial-word compare-and-swap is retried before the wait-free
/// `fetch_and`/`fetch_or` fallback is used.
const CAS_ATTEMPTS: u32 = 64;

mod bulk;

/// Largest chunk moved through the stack buffer by [`MemBlock::copy_from_block`].
const BOUNCE_CHUNK: usize = 4096;

/// Errors from [`MemBlock`] and [`MemAccess`] operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// The byte range `[offset, offset + len)` does not lie inside the block.
    #[error("byte range at offset {offset} of length {len} exceeds the block of {size} bytes")]
    OutOfRange {
        /// Requested start offset within the block.
        offset: usize,
        /// Requested length in bytes.
        len: usize,
        /// Size of the block in bytes.
        size: usize,
    },
    /// A 64-bit atomic was requested at an address that is not 8-byte aligned.
    #[error("atomic access at offset {offset} (address {addr:#x}) is not 8-byte aligned")]
    Misaligned {
        /// Offset within the block.
        offset: usize,
        /// Absolute address of that offset.
        addr: u64,
    },
    /// An [`ExclusiveGuard`] currently revokes uroce's access to the block.
    #[error("access revoked: the application holds exclusive local access to the block")]
    Revoked,
    /// The block was retired (its memory region deregistered); it is never accessed again.
    #[error("the block has been retired (memory region deregistered)")]
    Retired,
    /// Another [`ExclusiveGuard`] is already held for this block.
    #[error("exclusive access to the block is already held")]
    ExclusiveHeld,
    /// Exclusive slice access was requested for memory uroce does not own.
    #[error("exclusive slice access is only available for memory owned by uroce, not for a raw address range")]
    NotOwned,
    /// In-flight accesses did not finish within the allowed time.
    #[error("{in_flight} in-flight access(es) did not finish within {waited:?}")]
    DrainTimeout {
        /// Tickets still held when the wait gave up.
        in_flight: usize,
        /// How long the wait lasted.
        waited: Duration,
    },
    /// Allocating an owned block failed.
    #[error("allocating a block of {len} bytes failed")]
    AllocFailed {
        /// Requested length in bytes.
        len: usize,
    },
    /// A raw range of non-zero length starts at the null address.
    #[error("raw range of {len} bytes starts at the null address")]
    NullAddress {
        /// Length of the range.
        len: usize,
    },
    /// A raw range wraps around the end of the address space.
    #[error("raw range at {addr:#x} of {len} bytes wraps around the address space")]
    AddressWrap {
        /// Start address.
        addr: usize,
        /// Length of the range.
        len: usize,
    },
}

// ---------------------------------------------------------------------------------------
// Gate
// ---------------------------------------------------------------------------------------

/// Flag: an [`ExclusiveGuard`] is held (or being acquired).
const REVOKED: usize = 1 << (usize::BITS - 1);
/// Flag: the block is retired for good.
const RETIRED: usize = 1 << (usize::BITS - 2);
/// The low bits count live tickets.
const COUNT_MASK: usize = !(REVOKED | RETIRED);

/// Ticket counter plus the revoked/retired flags, in one word.
struct Gate {
    state: AtomicUsize,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            state: AtomicUsize::new(0),
        }
    }

    fn flag_error(state: usize) -> Option<MemError> {
        if state & RETIRED != 0 {
            Some(MemError::Retired)
        } else if state & REVOKED != 0 {
            Some(MemError::Revoked)
        } else {
            None
        }
    }

    /// Takes a ticket, or reports why none can be had.
    fn enter(&self) -> Result<(), MemError> {
        // Cheap pre-check so a stream of refused callers does not keep the count non-zero.
        if let Some(e) = Self::flag_error(self.state.load(Ordering::Relaxed)) {
            return Err(e);
        }
        self.enter_counted()
    }

    /// The authoritative step of [`Gate::enter`]: a counted increment that is backed out if
    /// a flag was set before it (in the gate word's modification order).
    fn enter_counted(&self) -> Result<(), MemError> {
        let prev = self.state.fetch_add(1, Ordering::Acquire);
        if let Some(e) = Self::flag_error(prev) {
            self.state.fetch_sub(1, Ordering::Release);
            return Err(e);
        }
        Ok(())
    }

    fn exit(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// Waits until no ticket is live, up to `timeout`. The loop is bounded by the deadline.
    fn drain(&self, timeout: Duration) -> Result<(), MemError> {
        let start = Instant::now();
        let mut round: u32 = 0;
        loop {
            let in_flight = self.state.load(Ordering::Acquire) & COUNT_MASK;
            if in_flight == 0 {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(MemError::DrainTimeout { in_flight, waited });
            }
            if round < 64 {
                std::hint::spin_loop();
            } else if round < 128 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50).min(timeout - waited));
            }
            round = round.saturating_add(1);
        }
    }
}

// ---------------------------------------------------------------------------------------
// MemBlock
// ---------------------------------------------------------------------------------------

enum Storage {
    /// Memory owned by uroce; `words.len() == ceil(len / 8)`. The bytes of the last word
    /// beyond `len` are padding that belongs to the block.
    Owned(Box<[AtomicU64]>),
    /// Foreign memory `[ptr, ptr + len)`, split into `head` leading bytes before the first
    /// 8-aligned address, `words` aligned 64-bit words, and the remaining trailing bytes
    /// (`len - head - 8 * words`, fewer than 8). When no aligned word fits, every byte is a
    /// leading byte (`head == len`, `words == 0`). `ptr` may be null only when `len == 0`.
    Raw {
        ptr: *mut u8,
        head: usize,
        words: usize,
    },
}

/// The bytes a memory region covers: owned by uroce or a registered raw address range.
///
/// All access goes through atomics (see the [module documentation](self) for why that is
/// sound); plain slices exist only inside an [`ExclusiveGuard`].
pub struct MemBlock {
    storage: Storage,
    /// Exact length in bytes.
    len: usize,
    gate: Gate,
}

// SAFETY: an Owned block is a Box of atomics, which is Send. A Raw block is a pointer to
// memory the `from_raw` caller guaranteed to be valid (independently of which thread uses
// it) until the block is dropped or retired; uroce only touches it under a ticket, with
// atomic operations or the bulk copy (which foreign code may race), from any thread.
unsafe impl Send for MemBlock {}
// SAFETY: every method reachable through `&MemBlock` either touches no memory or goes
// through a gate ticket and word-sized atomic operations, which are thread-safe, or (Raw
// ranges) the bulk copy, which is not a Rust access and may race (module doc); the only
// non-atomic Rust access (ExclusiveGuard) first excludes all others through the gate.
unsafe impl Sync for MemBlock {}

impl fmt::Debug for MemBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.gate.state.load(Ordering::Relaxed);
        f.debug_struct("MemBlock")
            .field("kind", &if self.is_owned() { "owned" } else { "raw" })
            .field("base_addr", &format_args!("{:#x}", self.base_addr()))
            .field("len", &self.len)
            .field("revoked", &(state & REVOKED != 0))
            .field("retired", &(state & RETIRED != 0))
            .finish()
    }
}

impl MemBlock {
    /// Allocates a zero-filled block of `len` bytes owned by uroce (8-byte aligned).
    pub fn new(len: usize) -> Result<MemBlock, MemError> {
        let words = len.div_ceil(WORD);
        let mut v: Vec<AtomicU64> = Vec::new();
        v.try_reserve_exact(words)
            .map_err(|_| MemError::AllocFailed { len })?;
        v.resize_with(words, || AtomicU64::new(0));
        Ok(MemBlock {
            storage: Storage::Owned(v.into_boxed_slice()),
            len,
            gate: Gate::new(),
        })
    }

    /// Allocates an owned block holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Result<MemBlock, MemError> {
        let block = MemBlock::new(data.len())?;
        block.copy_in(0, data)?;
        Ok(block)
    }

    /// Wraps the raw address range `[addr, addr + len)` (memory registration via the C ABI).
    ///
    /// A zero-length range is valid with any address, even null; it is never dereferenced.
    /// A non-zero length at the null address ([`MemError::NullAddress`]) or a range that
    /// wraps around the address space ([`MemError::AddressWrap`]) is refused.
    ///
    /// uroce never touches a byte outside the range. Inside it, copies and fills on x86-64
    /// are the bulk copy (module doc, "Raw blocks: the bulk copy"): plain byte loads and
    /// stores as the program's own code makes. IB atomics (and copies on other targets)
    /// access the 8-byte-aligned words that lie wholly within the range with 64-bit atomics,
    /// and the fewer than 8 leading and trailing bytes outside those words with 8-bit atomics
    /// (no aligned word containing them lies within the range, so no byte is ever accessed
    /// with two atomic sizes).
    ///
    /// # Safety
    ///
    /// Until this block is dropped or [`MemBlock::retire`] has returned `Ok` (whichever comes
    /// first), the caller guarantees that:
    /// * the range is one live allocation (or part of one), mapped and readable, and also
    ///   writable if it may be written through this block (a memory region granting local or
    ///   remote write access, or any use of the write/atomic methods);
    /// * the memory is not freed or unmapped;
    /// * the range is not accessed through Rust references (`&`/`&mut`) nor by Rust code
    ///   that assumes exclusive access. Foreign (C) code and devices may access it
    ///   concurrently, as with DMA: the content of bytes written concurrently by both sides
    ///   is then unspecified.
    ///
    /// On targets where a 64-bit atomic load is implemented as a read-modify-write, read-only
    /// mappings are not supported.
    ///
    /// Two Raw blocks over overlapping memory that start at different addresses may split it
    /// differently (one block's leading bytes inside the other's words). Concurrent writes to
    /// the same bytes through both are then 8-bit and 64-bit atomics racing — outside Rust's
    /// memory model like the foreign accesses above, single-copy atomic per byte on x86-64
    /// and AArch64, and unspecified in content as any racing RDMA access is.
    pub unsafe fn from_raw(addr: *mut u8, len: usize) -> Result<MemBlock, MemError> {
        let a = addr.addr();
        if len != 0 && addr.is_null() {
            return Err(MemError::NullAddress { len });
        }
        if a.checked_add(len).is_none() {
            return Err(MemError::AddressWrap { addr: a, len });
        }
        // Bytes from `addr` up to the next 8-aligned address; a range that ends before it
        // (or exactly at it) has no whole word.
        let to_aligned = (WORD - a % WORD) % WORD;
        let (head, words) = if to_aligned >= len {
            (len, 0)
        } else {
            (to_aligned, (len - to_aligned) / WORD)
        };
        Ok(MemBlock {
            storage: Storage::Raw {
                ptr: addr,
                head,
                words,
            },
            len,
            gate: Gate::new(),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether uroce owns the memory (as opposed to a registered raw range).
    pub fn is_owned(&self) -> bool {
        matches!(self.storage, Storage::Owned(_))
    }

    /// Address of byte 0, used as the virtual address of a memory region that is not
    /// zero-based. For an empty owned block this is a dangling but aligned address.
    pub fn base_addr(&self) -> u64 {
        let a = match &self.storage {
            Storage::Owned(words) => words.as_ptr().addr(),
            Storage::Raw { ptr, .. } => ptr.addr(),
        };
        a as u64
    }

    /// Whether [`MemBlock::retire`] has been called.
    pub fn is_retired(&self) -> bool {
        self.gate.state.load(Ordering::Acquire) & RETIRED != 0
    }

    /// Takes a ticket for a series of accesses. Holding a [`MemAccess`] delays
    /// [`MemBlock::exclusive`] and [`MemBlock::retire`], so keep it short.
    pub fn access(&self) -> Result<MemAccess<'_>, MemError> {
        self.gate.enter()?;
        Ok(MemAccess { block: self })
    }

    /// Copies `src` into the block at `offset`. Nothing is written unless the whole range
    /// fits.
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.access()?.copy_in(offset, src)
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the block. `dst` is untouched
    /// unless the whole range fits.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.access()?.copy_out(offset, dst)
    }

    /// Sets `len` bytes starting at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemError> {
        self.access()?.fill(offset, len, byte)
    }

    /// Returns a snapshot of the whole block.
    pub fn to_vec(&self) -> Result<Vec<u8>, MemError> {
        let access = self.access()?;
        let mut v = Vec::new();
        v.try_reserve_exact(self.len)
            .map_err(|_| MemError::AllocFailed { len: self.len })?;
        v.resize(self.len, 0);
        access.copy_out(0, &mut v)?;
        Ok(v)
    }

    /// 64-bit atomic fetch-and-add (wrapping) at `offset`; returns the previous value.
    pub fn atomic_fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemError> {
        self.access()?.atomic_fetch_add(offset, add)
    }

    /// 64-bit atomic compare-and-swap at `offset`; returns the previous value (the swap
    /// happened iff it equals `compare`).
    pub fn atomic_compare_swap(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemError> {
        self.access()?.atomic_compare_swap(offset, compare, swap)
    }

    /// 64-bit atomic load at `offset`.
    pub fn atomic_load(&self, offset: usize) -> Result<u64, MemError> {
        self.access()?.atomic_load(offset)
    }

    /// 64-bit atomic store at `offset` (IB ATOMIC_WRITE).
    pub fn atomic_store(&self, offset: usize, value: u64) -> Result<(), MemError> {
        self.access()?.atomic_store(offset, value)
    }

    /// Copies `len` bytes from `src` at `src_offset` into this block at `dst_offset`.
    ///
    /// Both ranges are checked before anything is written. `src` may be this very block
    /// (or another block over the same memory); overlapping ranges are copied as if through
    /// an intermediate buffer (`memmove`), provided nothing else writes them concurrently.
    /// Two disjoint Raw ranges are copied directly with the bulk copy (module doc, "Raw
    /// blocks: the bulk copy"); anything else goes through a stack buffer in 4 KiB chunks.
    pub fn copy_from_block(
        &self,
        dst_offset: usize,
        src: &MemBlock,
        src_offset: usize,
        len: usize,
    ) -> Result<(), MemError> {
        let dst_access = self.access()?;
        let src_access = src.access()?;
        check_range(dst_offset, len, self.len)?;
        check_range(src_offset, len, src.len)?;
        let dst_addr = self.base_addr().wrapping_add(dst_offset as u64);
        let src_addr = src.base_addr().wrapping_add(src_offset as u64);
        let disjoint = dst_addr.abs_diff(src_addr) >= len as u64;
        if let (true, Some(d), Some(s)) = (
            disjoint,
            dst_access.raw_at(dst_offset, len)?,
            src_access.raw_at(src_offset, len)?,
        ) {
            // SAFETY: both ranges lie inside their blocks' Raw ranges (`raw_at` checked them),
            // valid for reading (`src`) and writing (`self`) while the two tickets live (the
            // `from_raw` contract, as in `MemAccess::views`), and they do not overlap. Racing
            // accesses are foreign code and uroce's own bulk copies and atomics, which
            // `bulk::copy` allows.
            if unsafe { bulk::copy(d, s, len) } {
                return Ok(());
            }
        }
        let backward = dst_addr > src_addr && dst_addr - src_addr < len as u64;
        let mut buf = [0u8; BOUNCE_CHUNK];
        let chunks = len.div_ceil(BOUNCE_CHUNK);
        for i in 0..chunks {
            let idx = if backward { chunks - 1 - i } else { i };
            let start = idx * BOUNCE_CHUNK;
            let n = (len - start).min(BOUNCE_CHUNK);
            let b = buf.get_mut(..n).ok_or(MemError::OutOfRange {
                offset: start,
                len: n,
                size: BOUNCE_CHUNK,
            })?;
            src_access.copy_out(src_offset + start, b)?;
            dst_access.copy_in(dst_offset + start, b)?;
        }
        Ok(())
    }

    /// Revokes uroce's access (remote and engine) and returns a guard that derefs to the
    /// whole block as an ordinary `&mut [u8]`.
    ///
    /// Sets the revoked flag, then waits up to `timeout` for in-flight accesses to finish.
    /// While the guard lives every accessor fails with [`MemError::Revoked`] (a network
    /// access is then refused like an access to an invalid region). Errors: [`MemError::NotOwned`]
    /// for Raw blocks, [`MemError::ExclusiveHeld`] if another guard is held,
    /// [`MemError::Retired`], or [`MemError::DrainTimeout`] (the revocation is undone).
    pub fn exclusive(&self, timeout: Duration) -> Result<ExclusiveGuard<'_>, MemError> {
        if !self.is_owned() {
            return Err(MemError::NotOwned);
        }
        let prev = self.gate.state.fetch_or(REVOKED, Ordering::AcqRel);
        if prev & REVOKED != 0 {
            return Err(MemError::ExclusiveHeld);
        }
        if prev & RETIRED != 0 {
            self.gate.state.fetch_and(!REVOKED, Ordering::Release);
            return Err(MemError::Retired);
        }
        if let Err(e) = self.gate.drain(timeout) {
            self.gate.state.fetch_and(!REVOKED, Ordering::Release);
            return Err(e);
        }
        Ok(ExclusiveGuard { block: self })
    }

    /// Runs `f` with exclusive `&mut [u8]` access to the block (see [`MemBlock::exclusive`]).
    pub fn with_exclusive<R>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, MemError> {
        let mut guard = self.exclusive(timeout)?;
        Ok(f(&mut guard))
    }

    /// Permanently closes the block to all accessors and waits up to `timeout` for in-flight
    /// accesses to finish. After `Ok`, uroce never touches the memory again (a Raw range may
    /// then be freed by its owner). On [`MemError::DrainTimeout`] the block stays closed and
    /// `retire` may be called again to keep waiting.
    pub fn retire(&self, timeout: Duration) -> Result<(), MemError> {
        self.gate.state.fetch_or(RETIRED, Ordering::AcqRel);
        self.gate.drain(timeout)
    }
}

fn check_range(offset: usize, len: usize, size: usize) -> Result<(), MemError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(MemError::OutOfRange { offset, len, size }),
    }
}

/// The non-empty intersection of `[start, end)` and `[lo, hi)`.
fn intersect(start: usize, end: usize, lo: usize, hi: usize) -> Option<Range<usize>> {
    let (a, b) = (start.max(lo), end.min(hi));
    (a < b).then_some(a..b)
}

/// Where one part of an access lands.
enum Place<'v> {
    /// Leading or trailing bytes of a Raw block, accessed with 8-bit atomics.
    Bytes(&'v [AtomicU8]),
    /// A run of words; the part starts at byte `bo` of the first word.
    Words { bo: usize, words: &'v [AtomicU64] },
}

/// One part of an access: its byte range relative to the access start, and where it lands.
struct Segment<'v> {
    at: Range<usize>,
    place: Place<'v>,
}

// ---------------------------------------------------------------------------------------
// MemAccess: a ticket
// ---------------------------------------------------------------------------------------

/// A live ticket on a [`MemBlock`]: while it exists the block cannot be revoked or retired,
/// and its methods access the memory without taking further tickets. Obtained from
/// [`MemBlock::access`]; dropping it gives the ticket back.
pub struct MemAccess<'a> {
    block: &'a MemBlock,
}

impl fmt::Debug for MemAccess<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemAccess")
            .field("block", self.block)
            .finish()
    }
}

impl Drop for MemAccess<'_> {
    fn drop(&mut self) {
        self.block.gate.exit();
    }
}

impl<'a> MemAccess<'a> {
    /// The block this ticket is for.
    pub fn block(&self) -> &'a MemBlock {
        self.block
    }

    /// The three atomic views of the block: leading bytes, aligned words, trailing bytes
    /// (see [`Storage`]). Only reachable through a live ticket, so the block is neither
    /// revoked (no `&mut [u8]` exists) nor retired (Raw memory is still valid), and the views
    /// cannot outlive the ticket.
    fn views(&self) -> (&[AtomicU8], &[AtomicU64], &[AtomicU8]) {
        match &self.block.storage {
            Storage::Owned(words) => (&[], words, &[]),
            Storage::Raw { ptr, head, words } => {
                let (ptr, head, words) = (*ptr, *head, *words);
                let tail = self.block.len - head - words * WORD;
                if self.block.len == 0 {
                    return (&[], &[], &[]);
                }
                // SAFETY: `[ptr, ptr + len)` is one live allocation (or part of one) for as
                // long as this ticket lives: the `from_raw` contract guarantees validity until
                // the block is dropped (impossible while `self` borrows it) or `retire`
                // returned Ok (impossible while this ticket is live: `retire` waits for it,
                // and no ticket is granted once the retired flag is set). `len > 0`, so `ptr`
                // is non-null. The three views partition exactly that range: `head` bytes at
                // `ptr`, then `words` words at `ptr + head`, which is 8-aligned by construction
                // (`from_raw`; only used when `words > 0`), then `tail` bytes; all offsets stay
                // in bounds, so `add` is sound. `AtomicU8`/`AtomicU64` have the size of
                // `u8`/`u64`, alignment 1/8, and every bit pattern is valid; a shared reference
                // to atomics asserts no immutability, and uroce accesses the memory only
                // through these atomics.
                unsafe {
                    let lead =
                        std::slice::from_raw_parts(ptr.cast_const().cast::<AtomicU8>(), head);
                    let words_ptr = ptr.add(head);
                    let mid: &[AtomicU64] = if words == 0 {
                        &[]
                    } else {
                        std::slice::from_raw_parts(words_ptr.cast_const().cast(), words)
                    };
                    let tail_ptr = words_ptr.add(words * WORD);
                    let trail = std::slice::from_raw_parts(tail_ptr.cast_const().cast(), tail);
                    (lead, mid, trail)
                }
            }
        }
    }

    /// For a non-empty access of `len` bytes at `offset` of a Raw block, the address of its
    /// first byte (for the bulk copy); `None` for an owned block or an empty access. The
    /// range is checked first ([`MemError::OutOfRange`]).
    fn raw_at(&self, offset: usize, len: usize) -> Result<Option<*mut u8>, MemError> {
        check_range(offset, len, self.block.len)?;
        Ok(match self.block.storage {
            // In bounds (checked above), so this is the address `ptr.add(offset)` would give.
            Storage::Raw { ptr, .. } if len > 0 => Some(ptr.wrapping_add(offset)),
            _ => None,
        })
    }

    /// Splits `[offset, offset + len)` into the parts that fall on leading bytes, on words
    /// and on trailing bytes, each with its byte range relative to `offset`. Nothing is
    /// accessed; every part is resolved before any is used.
    fn segments(&self, offset: usize, len: usize) -> Result<[Option<Segment<'_>>; 3], MemError> {
        let size = self.block.len;
        let oor = MemError::OutOfRange { offset, len, size };
        check_range(offset, len, size)?;
        let end = offset + len;
        let (head_bytes, words, tail_bytes) = self.views();
        let head = head_bytes.len();
        // Owned: the word region extends past `len` into padding; clip it to the block.
        let words_end = head
            .saturating_add(words.len().saturating_mul(WORD))
            .min(size);

        let lead = match intersect(offset, end, 0, head) {
            Some(r) => {
                let bytes = head_bytes.get(r.clone()).ok_or(oor.clone())?;
                Some(Segment {
                    at: r.start - offset..r.end - offset,
                    place: Place::Bytes(bytes),
                })
            }
            None => None,
        };
        let mid = match intersect(offset, end, head, words_end) {
            Some(r) => {
                let pos = r.start - head;
                let run = words
                    .get(pos / WORD..(r.end - head).div_ceil(WORD))
                    .ok_or(oor.clone())?;
                Some(Segment {
                    at: r.start - offset..r.end - offset,
                    place: Place::Words {
                        bo: pos % WORD,
                        words: run,
                    },
                })
            }
            None => None,
        };
        let trail = match intersect(offset, end, words_end, size) {
            Some(r) => {
                let bytes = tail_bytes
                    .get(r.start - words_end..r.end - words_end)
                    .ok_or(oor)?;
                Some(Segment {
                    at: r.start - offset..r.end - offset,
                    place: Place::Bytes(bytes),
                })
            }
            None => None,
        };
        Ok([lead, mid, trail])
    }

    /// The aligned word holding the 8 bytes at `offset`.
    fn word(&self, offset: usize) -> Result<&AtomicU64, MemError> {
        let size = self.block.len;
        check_range(offset, WORD, size)?;
        let addr = self.block.base_addr().wrapping_add(offset as u64);
        let (head_bytes, words, _) = self.views();
        let head = head_bytes.len();
        // An 8-aligned address whose 8 bytes are inside the block always starts a whole word
        // of the word region (leading/trailing bytes never contain one).
        if addr % WORD as u64 != 0 || offset < head || (offset - head) % WORD != 0 {
            return Err(MemError::Misaligned { offset, addr });
        }
        words
            .get((offset - head) / WORD)
            .ok_or(MemError::OutOfRange {
                offset,
                len: WORD,
                size,
            })
    }

    /// Copies `src` into the block at `offset` (see [`MemBlock::copy_in`]).
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        if let Some(dst) = self.raw_at(offset, src.len())? {
            // SAFETY: `[dst, dst + src.len())` lies inside the block's Raw range (`raw_at`
            // checked it), which is valid for writes while this ticket lives (the `from_raw`
            // contract, as argued in `views`; a block that is written through must be
            // writable). `src` is a Rust slice, so it is not inside the Raw range (no Rust
            // reference into it may exist). Racing accesses to the range are foreign code and
            // uroce's own bulk copies and atomics, which `bulk::copy` allows.
            if unsafe { bulk::copy(dst, src.as_ptr(), src.len()) } {
                return Ok(());
            }
        }
        self.copy_in_words(offset, src)
    }

    /// [`MemAccess::copy_in`] with word atomics only (owned blocks; Raw ranges on targets
    /// without the bulk copy).
    fn copy_in_words(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        let segments = self.segments(offset, src.len())?;
        for seg in segments.into_iter().flatten() {
            let Some(part) = src.get(seg.at) else {
                continue; // invariant: segments lie within [0, src.len())
            };
            match seg.place {
                Place::Bytes(bytes) => {
                    for (b, v) in bytes.iter().zip(part) {
                        b.store(*v, Ordering::Relaxed);
                    }
                }
                Place::Words { bo, words } => write_span(words, bo, part),
            }
        }
        Ok(())
    }

    /// Copies bytes at `offset` out into `dst` (see [`MemBlock::copy_out`]).
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        if let Some(src) = self.raw_at(offset, dst.len())? {
            // SAFETY: `[src, src + dst.len())` lies inside the block's Raw range (`raw_at`
            // checked it), readable while this ticket lives (the `from_raw` contract, as in
            // `views`). `dst` is an exclusive Rust slice, so it is valid for writes and not
            // inside the Raw range. Racing writes to the range are foreign code and uroce's
            // own bulk copies and atomics, which `bulk::copy` allows.
            if unsafe { bulk::copy(dst.as_mut_ptr(), src, dst.len()) } {
                return Ok(());
            }
        }
        self.copy_out_words(offset, dst)
    }

    /// [`MemAccess::copy_out`] with word atomics only.
    fn copy_out_words(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let segments = self.segments(offset, dst.len())?;
        for seg in segments.into_iter().flatten() {
            let Some(part) = dst.get_mut(seg.at) else {
                continue; // invariant: segments lie within [0, dst.len())
            };
            match seg.place {
                Place::Bytes(bytes) => {
                    for (b, v) in bytes.iter().zip(part) {
                        *v = b.load(Ordering::Relaxed);
                    }
                }
                Place::Words { bo, words } => read_span(words, bo, part),
            }
        }
        Ok(())
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemError> {
        if let Some(dst) = self.raw_at(offset, len)? {
            // SAFETY: `[dst, dst + len)` lies inside the block's Raw range (`raw_at` checked
            // it), writable while this ticket lives (the `from_raw` contract, as in `views`);
            // racing accesses are those `bulk::fill` allows.
            if unsafe { bulk::fill(dst, byte, len) } {
                return Ok(());
            }
        }
        self.fill_words(offset, len, byte)
    }

    /// [`MemAccess::fill`] with word atomics only.
    fn fill_words(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemError> {
        let segments = self.segments(offset, len)?;
        for seg in segments.into_iter().flatten() {
            match seg.place {
                Place::Bytes(bytes) => {
                    for b in bytes {
                        b.store(byte, Ordering::Relaxed);
                    }
                }
                Place::Words { bo, words } => fill_span(words, bo, seg.at.len(), byte),
            }
        }
        Ok(())
    }

    /// 64-bit atomic fetch-and-add (wrapping, `SeqCst`) at the 8-aligned `offset`.
    pub fn atomic_fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemError> {
        Ok(self.word(offset)?.fetch_add(add, Ordering::SeqCst))
    }

    /// 64-bit atomic compare-and-swap (`SeqCst`) at the 8-aligned `offset`; returns the
    /// previous value.
    pub fn atomic_compare_swap(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemError> {
        let w = self.word(offset)?;
        Ok(
            match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(prev) | Err(prev) => prev,
            },
        )
    }

    /// 64-bit atomic load (`SeqCst`) at the 8-aligned `offset`.
    pub fn atomic_load(&self, offset: usize) -> Result<u64, MemError> {
        Ok(self.word(offset)?.load(Ordering::SeqCst))
    }

    /// 64-bit atomic store (`SeqCst`) at the 8-aligned `offset`.
    pub fn atomic_store(&self, offset: usize, value: u64) -> Result<(), MemError> {
        self.word(offset)?.store(value, Ordering::SeqCst);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Word-level copy kernels. `words` is exactly the run of words covering the byte range,
// whose first byte is at position `bo` (< 8) of `words[0]`.
// ---------------------------------------------------------------------------------------

/// Mask and value words (native byte order) for `bytes` placed at byte `bo` of a word.
fn partial_word(bo: usize, bytes: &[u8]) -> (u64, u64) {
    let mut mask = [0u8; WORD];
    let mut val = [0u8; WORD];
    if let (Some(m), Some(v)) = (
        mask.get_mut(bo..bo + bytes.len()),
        val.get_mut(bo..bo + bytes.len()),
    ) {
        m.fill(0xff);
        v.copy_from_slice(bytes);
    }
    (u64::from_ne_bytes(mask), u64::from_ne_bytes(val))
}

/// Writes `bytes` (1..=8-bo of them) at byte `bo` of `w`, leaving the other bytes as they
/// are: bounded CAS, then the wait-free and/or fallback.
fn store_partial(w: &AtomicU64, bo: usize, bytes: &[u8]) {
    let (mask, bits) = partial_word(bo, bytes);
    if mask == u64::MAX {
        w.store(bits, Ordering::Relaxed);
        return;
    }
    let mut cur = w.load(Ordering::Relaxed);
    for _ in 0..CAS_ATTEMPTS {
        let new = (cur & !mask) | bits;
        match w.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(actual) => cur = actual,
        }
    }
    store_partial_fallback(w, mask, bits);
}

/// Wait-free partial store: clears then sets the masked bytes; bytes outside `mask` are
/// never changed.
fn store_partial_fallback(w: &AtomicU64, mask: u64, bits: u64) {
    w.fetch_and(!mask, Ordering::Relaxed);
    w.fetch_or(bits & mask, Ordering::Relaxed);
}

/// Reads `dst.len()` (1..=8-bo) bytes at byte `bo` of `w`.
fn load_partial(w: &AtomicU64, bo: usize, dst: &mut [u8]) {
    let bytes = w.load(Ordering::Relaxed).to_ne_bytes();
    if let Some(s) = bytes.get(bo..bo + dst.len()) {
        dst.copy_from_slice(s);
    }
}

fn write_span(words: &[AtomicU64], bo: usize, src: &[u8]) {
    let mut words = words;
    let mut src = src;
    if bo != 0 || src.len() < WORD {
        let n = (WORD - bo).min(src.len());
        let (Some((w, rest_w)), Some((head, rest_s))) =
            (words.split_first(), src.split_at_checked(n))
        else {
            return;
        };
        store_partial(w, bo, head);
        words = rest_w;
        src = rest_s;
    }
    let chunks = src.chunks_exact(WORD);
    let tail = chunks.remainder();
    let full = src.len() / WORD;
    for (w, c) in words.iter().zip(chunks) {
        if let Some(a) = c.first_chunk::<WORD>() {
            w.store(u64::from_ne_bytes(*a), Ordering::Relaxed);
        }
    }
    if !tail.is_empty() {
        if let Some(w) = words.get(full) {
            store_partial(w, 0, tail);
        }
    }
}

fn read_span(words: &[AtomicU64], bo: usize, dst: &mut [u8]) {
    let mut words = words;
    let mut dst = dst;
    if bo != 0 || dst.len() < WORD {
        let n = (WORD - bo).min(dst.len());
        let (Some((w, rest_w)), Some((head, rest_d))) =
            (words.split_first(), dst.split_at_mut_checked(n))
        else {
            return;
        };
        load_partial(w, bo, head);
        words = rest_w;
        dst = rest_d;
    }
    let full = dst.len() / WORD;
    let (mid, tail) = dst.split_at_mut(full * WORD);
    for (w, c) in words.iter().zip(mid.chunks_exact_mut(WORD)) {
        if let Some(a) = c.first_chunk_mut::<WORD>() {
            *a = w.load(Ordering::Relaxed).to_ne_bytes();
        }
    }
    if !tail.is_empty() {
        if let Some(w) = words.get(full) {
            load_partial(w, 0, tail);
        }
    }
}

fn fill_span(words: &[AtomicU64], bo: usize, len: usize, byte: u8) {
    let pattern = [byte; WORD];
    let mut words = words;
    let mut len = len;
    if bo != 0 || len < WORD {
        let n = (WORD - bo).min(len);
        let Some((w, rest_w)) = words.split_first() else {
            return;
        };
        if let Some(p) = pattern.get(..n) {
            store_partial(w, bo, p);
        }
        words = rest_w;
        len -= n;
    }
    let full = len / WORD;
    let value = u64::from_ne_bytes(pattern);
    for w in words.iter().take(full) {
        w.store(value, Ordering::Relaxed);
    }
    let tail = len % WORD;
    if tail != 0 {
        if let (Some(w), Some(p)) = (words.get(full), pattern.get(..tail)) {
            store_partial(w, 0, p);
        }
    }
}

// ---------------------------------------------------------------------------------------
// ExclusiveGuard
// ---------------------------------------------------------------------------------------

/// Exclusive local access to an owned [`MemBlock`]: while it lives uroce's accessors (remote
/// and engine) fail with [`MemError::Revoked`], and it derefs to the block's bytes as an
/// ordinary slice. Dropping it restores uroce's access.
pub struct ExclusiveGuard<'a> {
    block: &'a MemBlock,
}

impl fmt::Debug for ExclusiveGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExclusiveGuard")
            .field("block", self.block)
            .finish()
    }
}

impl ExclusiveGuard<'_> {
    /// Pointer to byte 0 of the owned words; null-free and aligned even when empty.
    fn byte_ptr(&self) -> *mut u8 {
        match &self.block.storage {
            // `as_ptr` of the whole slice keeps provenance over every word.
            Storage::Owned(words) => words.as_ptr().cast::<u8>().cast_mut(),
            // invariant: `exclusive` refuses Raw blocks, so no guard exists for one.
            Storage::Raw { .. } => NonNull::<u8>::dangling().as_ptr(),
        }
    }

    fn byte_len(&self) -> usize {
        if self.block.is_owned() {
            self.block.len
        } else {
            0
        }
    }
}

impl Deref for ExclusiveGuard<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: for an Owned block the pointer addresses `ceil(len/8)` initialised
        // `AtomicU64`s, i.e. at least `len` initialised bytes, derived from the whole boxed
        // slice; u8 has no invalid values and alignment 1. No one writes these bytes while
        // the returned borrow lives: uroce's accessors cannot take tickets (revoked flag held
        // by this guard, in-flight tickets drained with Acquire before the guard existed),
        // no second guard can exist, and writes through this guard need `&mut self`, which
        // the borrow of `self` excludes. For a (never constructed) Raw guard the slice is
        // empty at a dangling aligned pointer.
        unsafe { std::slice::from_raw_parts(self.byte_ptr().cast_const(), self.byte_len()) }
    }
}

impl DerefMut for ExclusiveGuard<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, the range is `len` initialised bytes inside the owned words.
        // Exclusivity: the gate's revoked flag is held by this guard and all tickets were
        // drained (their Release decrements synchronise with our Acquire drain), so no
        // atomic access is in flight or can start until the guard's Release on drop; only
        // one guard can exist per block, and `&mut self` makes this the only live slice
        // derived from the guard. The bytes live inside `UnsafeCell`s (`AtomicU64`), so
        // mutating them through a pointer derived from a shared reference is permitted.
        unsafe { std::slice::from_raw_parts_mut(self.byte_ptr(), self.byte_len()) }
    }
}

impl Drop for ExclusiveGuard<'_> {
    fn drop(&mut self) {
        // Release: the application's writes through the slice happen before any later
        // ticket (taken with Acquire) is granted.
        self.block.gate.state.fetch_and(!REVOKED, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests;
