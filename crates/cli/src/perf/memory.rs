//! The memory behind `uroce perf`'s regions (`--memory`).
//!
//! * `raw` (the default): the tool maps its buffers itself (anonymous, page-aligned) and
//!   registers them as a raw address range ([`MemBlock::from_raw`]), as a C program
//!   registers its own memory through the libibverbs ABI (perftest does). uroce then copies
//!   payload in and out with plain copies (docs/ARCHITECTURE.md, "Verbs memory"), so this
//!   measures what such a program gets.
//! * `owned`: uroce allocates the block ([`MemBlock::new`]), memory that Rust code may read
//!   concurrently, so that every copy in and out is word-atomic.
//!
//! Either way the tool touches its buffers only through the region's block (copies, fills,
//! atomic loads), never through Rust references.

use std::ops::Deref;

use anyhow::{bail, Context as _, Result};
use uroce_verbs::{AccessFlags, MemBlock, Mr, Pd};

/// Where a region's memory comes from (`--memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MemoryKind {
    /// The tool's own anonymous mapping, registered as a raw range (plain copies).
    #[default]
    Raw,
    /// A block owned by uroce (word-atomic copies).
    Owned,
}

impl MemoryKind {
    /// The option's value.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::Raw => "raw",
            MemoryKind::Owned => "owned",
        }
    }
}

/// An anonymous private mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// Maps `len` (> 0) zero-filled, readable and writable bytes.
    fn new(len: usize) -> Result<Mapping> {
        if len == 0 {
            bail!("a mapping of 0 bytes");
        }
        // SAFETY: an anonymous private mapping at an address of the kernel's choice touches
        // no existing memory; the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("mapping {len} bytes"));
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned and nothing refers to the
        // mapping any more (Region drops its region, and keeps the mapping forever if the
        // region could not be retired).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// A registered region over memory of the chosen kind. Dereferences to its [`Mr`].
pub struct Region {
    /// The region (`None` only while dropping).
    mr: Option<Mr>,
    /// The memory of a raw region; unmapped only after the region was deregistered.
    map: Option<Mapping>,
}

impl Region {
    /// Registers `len` bytes of `kind` memory with `access` on `pd`.
    pub fn new(pd: &Pd, kind: MemoryKind, len: usize, access: AccessFlags) -> Result<Region> {
        let (block, map) = match kind {
            MemoryKind::Owned => {
                let block =
                    MemBlock::new(len).with_context(|| format!("allocating {len} bytes"))?;
                (block, None)
            }
            MemoryKind::Raw => {
                let map = Mapping::new(len.max(1))?;
                // SAFETY: the mapping is live, readable and writable for `len` bytes; the
                // Region owns it for the block's whole life (it is unmapped only after the
                // region was deregistered and its memory retired, and leaked otherwise);
                // the tool never makes Rust references into it: it reads and writes the
                // buffers only through this block (after the completions that say the
                // network is done with them).
                let block = unsafe { MemBlock::from_raw(map.ptr, len) }
                    .with_context(|| format!("wrapping {len} mapped bytes"))?;
                (block, Some(map))
            }
        };
        let mr = pd.reg_mr(block, access).context("registering memory")?;
        Ok(Region { mr: Some(mr), map })
    }
}

impl Deref for Region {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        // `mr` is taken only in `drop`.
        self.mr.as_ref().expect("the region is live until dropped")
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let Some(mr) = self.mr.take() else { return };
        match mr.destroy() {
            Ok(()) => {}
            Err((mr, _)) => {
                // The memory may still be referenced: keep the mapping for good.
                if let Some(map) = self.map.take() {
                    std::mem::forget(map);
                }
                // Dropping the handle retires the memory once more, best effort; the
                // mapping stays valid whatever happens.
                drop(mr);
            }
        }
        // Deregistered and retired: nothing refers to the mapping any more (unmapped when
        // `map` drops).
    }
}
