//! Bulk copies over Raw ranges: the C program's memory, copied the way the C program's own
//! code (or a NIC's DMA engine) would copy it.
//!
//! On x86-64 a copy is one `rep movsb` and a fill one `rep stosb`, each in an `asm!` block.
//! With the enhanced `rep movsb`/`stosb` of current x86-64 cores (and their fast short
//! variant) this moves the 4 KiB payload of a packet at memory speed, where the word-atomic
//! copy of the parent module goes one 64-bit load or store at a time. Why it is sound is the
//! parent module's "Raw blocks: the bulk copy": these instructions are the accesses foreign
//! code may already make to the range at any moment, not Rust loads and stores.
//!
//! Other targets (and the memory-model interpreter, which runs no assembly) have no bulk
//! copy: [`copy`] and [`fill`] return `false` there without touching memory, and the parent
//! module uses its word-atomic copy for Raw ranges as for owned blocks.

/// Copies `len` bytes from `src` to `dst`, lowest address first, and returns `true`.
///
/// # Safety
///
/// `src` is valid for reads and `dst` for writes of `len` bytes for the whole call (for a
/// Raw range: under a live ticket of its block). The ranges may overlap only if
/// `dst <= src` (the copy goes forward). Either range may be raced by foreign code and by
/// uroce's own bulk copies or atomics on other threads — the content of bytes written
/// concurrently is then unspecified — but not by ordinary Rust accesses (references).
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> bool {
    // SAFETY: `rep movsb` moves RCX bytes from [RSI] to [RDI], one address after the other
    // upwards (the direction flag is clear on entry to every `asm!` block), reading only
    // `[src, src + len)` and writing only `[dst, dst + len)`, which the caller guarantees
    // valid. It leaves RCX, RSI and RDI changed (declared as clobbered outputs), changes no
    // flags and uses no stack. Without `nomem`/`readonly` the compiler treats the block as
    // reading and writing memory, so no Rust access is moved across it; and x86-64 orders
    // the string stores before any later locked instruction (the ticket's release), so the
    // copy is complete for a thread that then observes the ticket returned.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags),
        );
    }
    true
}

/// Sets `len` bytes at `dst` to `byte` and returns `true`.
///
/// # Safety
///
/// As for [`copy`]'s destination: `dst` valid for writes of `len` bytes for the whole call.
#[cfg(all(target_arch = "x86_64", not(miri)))]
pub(super) unsafe fn fill(dst: *mut u8, byte: u8, len: usize) -> bool {
    // SAFETY: `rep stosb` stores AL into RCX bytes from [RDI] upwards (direction flag clear
    // on entry), writing only `[dst, dst + len)`, which the caller guarantees valid; RCX and
    // RDI are declared clobbered, no flags change, no stack is used; ordering as in `copy`.
    unsafe {
        core::arch::asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("al") byte,
            options(nostack, preserves_flags),
        );
    }
    true
}

/// No bulk copy on this target: touches nothing and returns `false`.
///
/// # Safety
///
/// None needed; kept `unsafe` to match the x86-64 signature.
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
pub(super) unsafe fn copy(_dst: *mut u8, _src: *const u8, _len: usize) -> bool {
    false
}

/// No bulk fill on this target: touches nothing and returns `false`.
///
/// # Safety
///
/// None needed; kept `unsafe` to match the x86-64 signature.
#[cfg(not(all(target_arch = "x86_64", not(miri))))]
pub(super) unsafe fn fill(_dst: *mut u8, _byte: u8, _len: usize) -> bool {
    false
}
