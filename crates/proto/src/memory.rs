//! How the engines reach memory: the [`Memory`] trait.
//!
//! The transport engines never touch memory directly. Local scatter/gather entries and
//! remote (R_Key, VA, length) accesses go through a [`Memory`] implementation that the
//! layer above provides: the verbs layer implements it over its memory-region table (with
//! the QP's protection domain bound in), tests implement it over plain buffers. Every
//! method checks bounds, keys, PD and permissions itself and reports a typed error; the
//! engine turns those errors into the completion statuses and NAKs the spec requires.

use thiserror::Error;

/// One scatter/gather element of a work request: `length` bytes at virtual address `addr`
/// of the memory region with local key `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Number of bytes.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// The kind of remote access a request asks for (selects the permission checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemoteOp {
    /// RDMA READ: needs REMOTE_READ.
    Read,
    /// RDMA WRITE: needs REMOTE_WRITE.
    Write,
    /// Atomics: need REMOTE_ATOMIC and an 8-byte aligned VA.
    Atomic,
}

/// An IB atomic operation on one 64-bit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Fetch-and-add: `*va += add`, returns the original value.
    FetchAdd {
        /// The addend.
        add: u64,
    },
    /// Compare-and-swap: `if *va == compare { *va = swap }`, returns the original value.
    CompareSwap {
        /// The value compared with memory.
        compare: u64,
        /// The value stored on a match.
        swap: u64,
    },
}

/// Why a local (lkey) access failed. The requester completes the WR with
/// `LOC_PROT_ERR` for any of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LocalAccessError {
    /// No memory region with this lkey (or it belongs to another PD).
    #[error("no memory region for lkey {lkey:#x}")]
    BadKey {
        /// The key.
        lkey: u32,
    },
    /// The range is outside the memory region.
    #[error("local access [{addr:#x}, +{len}) outside the memory region of lkey {lkey:#x}")]
    OutOfBounds {
        /// The key.
        lkey: u32,
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// Writing needs LOCAL_WRITE, which the region lacks.
    #[error("memory region of lkey {lkey:#x} is not locally writable")]
    NotWritable {
        /// The key.
        lkey: u32,
    },
    /// Access to the region is currently revoked (the application holds it exclusively).
    #[error("memory region of lkey {lkey:#x} is revoked")]
    Revoked {
        /// The key.
        lkey: u32,
    },
}

/// Why a remote (rkey) access failed. The responder answers with NAK Remote Access Error
/// (or Invalid Request for a misaligned atomic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RemoteAccessError {
    /// No memory region with this rkey in the QP's PD.
    #[error("no memory region for rkey {rkey:#x}")]
    BadKey {
        /// The key.
        rkey: u32,
    },
    /// The range is outside the memory region.
    #[error("remote access [{va:#x}, +{len}) outside the memory region of rkey {rkey:#x}")]
    OutOfBounds {
        /// The key.
        rkey: u32,
        /// Start address.
        va: u64,
        /// Length.
        len: u64,
    },
    /// The region does not grant this kind of remote access.
    #[error("memory region of rkey {rkey:#x} does not permit remote {op:?}")]
    NoPermission {
        /// The key.
        rkey: u32,
        /// The access asked for.
        op: RemoteOp,
    },
    /// Atomic (or ATOMIC WRITE) on an address that is not 8-byte aligned.
    #[error("atomic at unaligned address {va:#x}")]
    Misaligned {
        /// The address.
        va: u64,
    },
    /// Access to the region is currently revoked.
    #[error("memory region of rkey {rkey:#x} is revoked")]
    Revoked {
        /// The key.
        rkey: u32,
    },
}

/// Memory as the engines see it. Implementations check everything (key, PD, bounds,
/// permission) in each call; a failed call has no effect on memory.
///
/// All methods take `&self`: the memory behind a region can be shared by many QPs and
/// threads, so implementations use interior mutability (the verbs layer's regions are
/// word-atomic; test memories use locks).
pub trait Memory {
    /// Copies `dst.len()` bytes from local memory `[addr, addr + dst.len())` of `lkey`.
    fn read_local(&self, lkey: u32, addr: u64, dst: &mut [u8]) -> Result<(), LocalAccessError>;

    /// Copies `src` into local memory at `addr` of `lkey` (needs LOCAL_WRITE).
    fn write_local(&self, lkey: u32, addr: u64, src: &[u8]) -> Result<(), LocalAccessError>;

    /// Checks that a remote access of `len` bytes at `va` with `rkey` would be allowed,
    /// without touching memory. A zero-length access is always allowed (IBA C9-88).
    fn check_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        op: RemoteOp,
    ) -> Result<(), RemoteAccessError>;

    /// Copies `src` into remote-accessible memory (needs REMOTE_WRITE).
    fn write_remote(&self, rkey: u32, va: u64, src: &[u8]) -> Result<(), RemoteAccessError>;

    /// Copies remote-accessible memory into `dst` (needs REMOTE_READ).
    fn read_remote(&self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), RemoteAccessError>;

    /// Executes an atomic on the 8-byte word at `va` (needs REMOTE_ATOMIC, 8-byte
    /// alignment) and returns the original value. Exactly once per call.
    fn atomic_remote(&self, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, RemoteAccessError>;

    /// IBA 1.5 ATOMIC WRITE: stores the 8 payload bytes `value` (in the order they came
    /// off the wire, which is their order in memory) at the 8-byte aligned `va` as **one**
    /// 64-bit store that no concurrent reader sees half done, ordered after every earlier
    /// write of the responder (needs REMOTE_WRITE; a misaligned `va` is
    /// [`RemoteAccessError::Misaligned`]). Exactly once per call; a failed call leaves
    /// memory untouched.
    fn atomic_write_remote(
        &self,
        rkey: u32,
        va: u64,
        value: [u8; 8],
    ) -> Result<(), RemoteAccessError>;

    /// Invalidates the memory region (or window) with `rkey` (SEND_WITH_INVALIDATE).
    fn invalidate_remote(&self, rkey: u32) -> Result<(), RemoteAccessError>;

    /// Executes a memory-window bind (a BIND_MW work request, or the bind of a type 1
    /// window) for the QP whose engine calls it, when the request reaches the head of the
    /// send queue's unstarted work. Memories without windows refuse it.
    fn bind_window(&self, bind: &MwBind) -> Result<(), MwError> {
        let _ = bind;
        Err(MwError::NotSupported)
    }

    /// Executes a LOCAL_INV work request for `rkey` (a type 2 memory window), in
    /// send-queue order. Memories without windows refuse it.
    fn invalidate_local(&self, rkey: u32) -> Result<(), MwError> {
        let _ = rkey;
        Err(MwError::NotSupported)
    }
}

/// A memory-window bind as the send queue carries it (IBA 10.6.7.2; `ibv_mw_bind_info`
/// plus the window's keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwBind {
    /// The window's current R_Key (names the window).
    pub mw_rkey: u32,
    /// The R_Key the window has once bound: the application's choice for a type 2 window
    /// (only the low 8 "key" bits may differ from `mw_rkey`), chosen by the verbs layer
    /// for a type 1 window.
    pub new_rkey: u32,
    /// L_Key of the memory region the window is bound to.
    pub mr_lkey: u32,
    /// First virtual address of the window (inside the region).
    pub addr: u64,
    /// Length in bytes (0 unbinds a type 1 window).
    pub length: u64,
    /// The window's access rights (`IBV_ACCESS_REMOTE_*` bits, `ZERO_BASED`).
    pub access: u32,
    /// True for the bind of a type 1 window (`ibv_bind_mw`), false for a BIND_MW work
    /// request on a type 2 window.
    pub type1: bool,
}

/// Why a bind or local invalidate failed. The requester completes the WR with
/// `MW_BIND_ERR` (bind) or `LOC_QP_OP_ERR` (LOCAL_INV) and the QP enters ERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MwError {
    /// This memory has no memory windows.
    #[error("memory windows are not supported here")]
    NotSupported,
    /// No window with this key in the QP's protection domain.
    #[error("no memory window for rkey {rkey:#x}")]
    BadWindow {
        /// The key.
        rkey: u32,
    },
    /// The window's type does not allow the operation (e.g. LOCAL_INV of a type 1
    /// window, a BIND_MW work request naming a type 1 window).
    #[error("the memory window of rkey {rkey:#x} has the wrong type for this operation")]
    WrongType {
        /// The key.
        rkey: u32,
    },
    /// A type 2 window that is already bound (it must be invalidated first), or a window
    /// bound to another QP.
    #[error("the memory window of rkey {rkey:#x} is in the wrong state")]
    WrongState {
        /// The key.
        rkey: u32,
    },
    /// The new R_Key changes more than the 8-bit key field.
    #[error("new rkey {new_rkey:#x} changes more than the key field of {rkey:#x}")]
    BadNewKey {
        /// The window's current key.
        rkey: u32,
        /// The key asked for.
        new_rkey: u32,
    },
    /// The region is unknown, in another PD, or not registered with MW_BIND.
    #[error("memory region of lkey {lkey:#x} cannot have windows bound")]
    BadRegion {
        /// The region's L_Key.
        lkey: u32,
    },
    /// The range is outside the region.
    #[error("window [{addr:#x}, +{len}) is outside its memory region")]
    OutOfBounds {
        /// Start.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// Access rights the window may not have (unknown bits, or remote write/atomic on a
    /// region without LOCAL_WRITE).
    #[error("access rights {access:#x} are not allowed for this window")]
    BadAccess {
        /// The rights asked for.
        access: u32,
    },
}

/// Why a scatter or gather over an SGE list failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SgError {
    /// The byte range asked for goes past the end of the SGE list.
    #[error("{wanted} bytes at offset {offset} exceed the SGE list's {total} bytes")]
    Overflow {
        /// Offset into the list.
        offset: u64,
        /// Bytes asked for.
        wanted: u64,
        /// Total bytes of the list.
        total: u64,
    },
    /// A local access failed.
    #[error(transparent)]
    Access(#[from] LocalAccessError),
}

/// Total bytes described by an SGE list.
pub fn sg_total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Copies `dst.len()` bytes starting at byte `offset` of the message described by `sges`
/// (the SGEs laid end to end) out of local memory.
pub fn gather(mem: &dyn Memory, sges: &[Sge], offset: u64, dst: &mut [u8]) -> Result<(), SgError> {
    walk(sges, offset, dst.len() as u64, |sge, at, start, n| {
        let part = dst.get_mut(start..start + n).ok_or(SgError::Overflow {
            offset,
            wanted: n as u64,
            total: sg_total(sges),
        })?;
        mem.read_local(sge.lkey, at, part).map_err(SgError::from)
    })
}

/// Copies `src` into local memory at byte `offset` of the message described by `sges`.
pub fn scatter(mem: &dyn Memory, sges: &[Sge], offset: u64, src: &[u8]) -> Result<(), SgError> {
    walk(sges, offset, src.len() as u64, |sge, at, start, n| {
        let part = src.get(start..start + n).ok_or(SgError::Overflow {
            offset,
            wanted: n as u64,
            total: sg_total(sges),
        })?;
        mem.write_local(sge.lkey, at, part).map_err(SgError::from)
    })
}

/// Visits the pieces of `[offset, offset + len)` of the SGE list: for each piece, the SGE,
/// the address inside it, the piece's start in the caller's buffer and its length.
fn walk(
    sges: &[Sge],
    offset: u64,
    len: u64,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), SgError>,
) -> Result<(), SgError> {
    let total = sg_total(sges);
    if offset.checked_add(len).is_none_or(|end| end > total) {
        return Err(SgError::Overflow {
            offset,
            wanted: len,
            total,
        });
    }
    let mut skip = offset;
    let mut done: u64 = 0;
    for sge in sges {
        if done == len {
            break;
        }
        let sge_len = u64::from(sge.length);
        if skip >= sge_len {
            skip -= sge_len;
            continue;
        }
        let n = (sge_len - skip).min(len - done);
        // Both fit in usize: n ≤ len and done < len, and len came from a slice length.
        let start = usize::try_from(done).map_err(|_| SgError::Overflow {
            offset,
            wanted: len,
            total,
        })?;
        let count = usize::try_from(n).map_err(|_| SgError::Overflow {
            offset,
            wanted: len,
            total,
        })?;
        f(sge, sge.addr.wrapping_add(skip), start, count)?;
        done += n;
        skip = 0;
    }
    Ok(())
}
