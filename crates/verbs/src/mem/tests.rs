//! Unit tests of the memory accessors (registered ranges, atomic copies, proptest models).

use super::*;
use proptest::prelude::*;
use std::sync::mpsc;
use std::thread;

/// Deterministic pattern independent of the code under test.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn new_block_is_zeroed_and_sized() {
    for len in [0usize, 1, 7, 8, 9, 63, 64, 65, 4096] {
        let b = MemBlock::new(len).unwrap();
        assert_eq!(b.len(), len);
        assert_eq!(b.is_empty(), len == 0);
        assert!(b.is_owned());
        assert_eq!(b.base_addr() % 8, 0);
        assert_eq!(b.to_vec().unwrap(), vec![0u8; len]);
    }
}

#[test]
fn native_byte_order_matches_atomics() {
    // Bytes written by copy_in must be the in-memory bytes that the 64-bit atomic sees.
    let b = MemBlock::new(16).unwrap();
    let v: u64 = 0x0102_0304_0506_0708;
    b.copy_in(8, &v.to_ne_bytes()).unwrap();
    assert_eq!(b.atomic_load(8).unwrap(), v);
    b.atomic_store(0, 0x1122_3344_5566_7788).unwrap();
    let mut out = [0u8; 8];
    b.copy_out(0, &mut out).unwrap();
    assert_eq!(out, 0x1122_3344_5566_7788u64.to_ne_bytes());
}

#[test]
fn out_of_range_copies_fail_and_touch_nothing() {
    let b = MemBlock::from_slice(&pattern(20, 1)).unwrap();
    let err = b.copy_in(15, &[0xEE; 6]).unwrap_err();
    assert_eq!(
        err,
        MemError::OutOfRange {
            offset: 15,
            len: 6,
            size: 20
        }
    );
    assert!(b.copy_in(usize::MAX, &[1]).is_err());
    assert!(b.fill(19, 2, 0).is_err());
    let mut dst = [0x55u8; 4];
    assert!(b.copy_out(18, &mut dst).is_err());
    assert_eq!(dst, [0x55; 4]);
    assert_eq!(b.to_vec().unwrap(), pattern(20, 1));
    // Zero-length at the end is fine, past the end is not.
    b.copy_in(20, &[]).unwrap();
    assert!(b.copy_in(21, &[]).is_err());
}

#[test]
fn atomics_check_alignment_and_range() {
    let b = MemBlock::new(24).unwrap();
    assert!(matches!(
        b.atomic_fetch_add(4, 1),
        Err(MemError::Misaligned { offset: 4, .. })
    ));
    assert!(matches!(
        b.atomic_fetch_add(24, 1),
        Err(MemError::OutOfRange { .. })
    ));
    assert!(matches!(
        b.atomic_fetch_add(20, 1),
        Err(MemError::OutOfRange { .. })
    ));
    assert_eq!(b.atomic_fetch_add(16, 5).unwrap(), 0);
    assert_eq!(b.atomic_fetch_add(16, u64::MAX).unwrap(), 5); // wraps: 5 + (2^64-1) = 4
    assert_eq!(b.atomic_load(16).unwrap(), 4);
    assert_eq!(b.atomic_compare_swap(16, 3, 9).unwrap(), 4); // no swap
    assert_eq!(b.atomic_load(16).unwrap(), 4);
    assert_eq!(b.atomic_compare_swap(16, 4, 9).unwrap(), 4); // swap
    assert_eq!(b.atomic_load(16).unwrap(), 9);
    // Neighbouring words untouched.
    assert_eq!(&b.to_vec().unwrap()[..16], &[0u8; 16]);
}

#[test]
fn partial_fallback_only_touches_masked_bytes() {
    let w = AtomicU64::new(u64::from_ne_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
    let (mask, bits) = partial_word(3, &[0xA, 0xB]);
    store_partial_fallback(&w, mask, bits);
    assert_eq!(
        w.load(Ordering::Relaxed).to_ne_bytes(),
        [1, 2, 3, 0xA, 0xB, 6, 7, 8]
    );
    store_partial(&w, 7, &[0xC]);
    assert_eq!(
        w.load(Ordering::Relaxed).to_ne_bytes(),
        [1, 2, 3, 0xA, 0xB, 6, 7, 0xC]
    );
}

#[test]
fn concurrent_partial_writes_to_one_word_never_lose_updates() {
    // Each thread owns one byte of the same word and writes it with changing values;
    // a partial-word store that rewrote the other bytes from a stale copy would make
    // some thread read back a value it did not write.
    const ROUNDS: u32 = if cfg!(miri) { 50 } else { 100_000 };
    let b = MemBlock::new(8).unwrap();
    let bytes = [1usize, 3, 4, 6];
    let barrier = std::sync::Barrier::new(bytes.len());
    let lost: u32 = thread::scope(|s| {
        let handles: Vec<_> = bytes
            .iter()
            .map(|&at| {
                let (b, barrier) = (&b, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut lost = 0;
                    let mut back = [0u8; 1];
                    for round in 0..ROUNDS {
                        let v = (round as u8).wrapping_add(at as u8);
                        b.copy_in(at, &[v]).unwrap();
                        b.copy_out(at, &mut back).unwrap();
                        lost += u32::from(back[0] != v);
                    }
                    lost
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(lost, 0, "{lost} partial-word updates were lost");
    let mut expect = [0u8; 8];
    for at in bytes {
        expect[at] = ((ROUNDS - 1) as u8).wrapping_add(at as u8);
    }
    assert_eq!(b.to_vec().unwrap(), expect);
}

#[test]
fn fill_sets_exact_range() {
    for (off, len) in [
        (0usize, 0usize),
        (3, 1),
        (3, 5),
        (3, 6),
        (0, 40),
        (5, 27),
        (8, 8),
    ] {
        let b = MemBlock::from_slice(&pattern(40, 7)).unwrap();
        b.fill(off, len, 0xAB).unwrap();
        let mut expect = pattern(40, 7);
        expect[off..off + len].fill(0xAB);
        assert_eq!(b.to_vec().unwrap(), expect, "off {off} len {len}");
    }
}

#[test]
fn copy_from_block_handles_overlap_both_ways() {
    let n = 3 * BOUNCE_CHUNK + 13;
    for (src_off, dst_off, len) in [(0usize, 5usize, n - 5), (5, 0, n - 5), (1, 2, 9000)] {
        let init = pattern(n, 3);
        let b = MemBlock::from_slice(&init).unwrap();
        b.copy_from_block(dst_off, &b, src_off, len).unwrap();
        let mut expect = init.clone();
        expect.copy_within(src_off..src_off + len, dst_off);
        assert_eq!(b.to_vec().unwrap(), expect);
    }
    let a = MemBlock::from_slice(&pattern(100, 9)).unwrap();
    let c = MemBlock::new(100).unwrap();
    c.copy_from_block(10, &a, 3, 50).unwrap();
    let mut expect = vec![0u8; 100];
    expect[10..60].copy_from_slice(&pattern(100, 9)[3..53]);
    assert_eq!(c.to_vec().unwrap(), expect);
    assert!(c.copy_from_block(60, &a, 0, 41).is_err());
    assert!(c.copy_from_block(0, &a, 60, 41).is_err());
    assert_eq!(c.to_vec().unwrap(), expect);
}

#[test]
fn exclusive_gives_slice_and_revokes() {
    let b = MemBlock::from_slice(&pattern(13, 0)).unwrap();
    {
        let mut g = b.exclusive(Duration::from_secs(1)).unwrap();
        assert_eq!(&g[..], &pattern(13, 0)[..]);
        g[12] = 0xFF;
        g[0] = 0xEE;
        assert_eq!(b.copy_in(0, &[1]), Err(MemError::Revoked));
        assert_eq!(b.atomic_load(0), Err(MemError::Revoked));
        assert!(matches!(
            b.exclusive(Duration::ZERO),
            Err(MemError::ExclusiveHeld)
        ));
    }
    let mut expect = pattern(13, 0);
    expect[12] = 0xFF;
    expect[0] = 0xEE;
    assert_eq!(b.to_vec().unwrap(), expect);
    let r = b
        .with_exclusive(Duration::from_secs(1), |s| s.len())
        .unwrap();
    assert_eq!(r, 13);
}

#[test]
fn exclusive_times_out_on_held_ticket_and_undoes_revocation() {
    let b = MemBlock::new(8).unwrap();
    let t = b.access().unwrap();
    let err = b.exclusive(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(err, MemError::DrainTimeout { in_flight: 1, .. }));
    // The held ticket still works, and new tickets are granted again.
    t.copy_in(0, &[7]).unwrap();
    drop(t);
    assert_eq!(b.copy_out(0, &mut [0u8; 1]), Ok(()));
    assert!(b.exclusive(Duration::ZERO).is_ok());
}

#[test]
fn exclusive_waits_for_in_flight_ticket() {
    let b = MemBlock::new(16).unwrap();
    let (acquired_tx, acquired_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    thread::scope(|s| {
        let bref = &b;
        s.spawn(move || {
            let t = bref.access().unwrap();
            acquired_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            t.copy_in(0, &[0xAA; 16]).unwrap();
            // Dropping `t` releases the ticket.
        });
        // Owned by this closure, so a failed assertion drops it and unblocks the holder.
        let release_tx = release_tx;
        acquired_rx.recv().unwrap();
        let (got_tx, got_rx) = mpsc::channel();
        s.spawn(move || {
            let g = bref.exclusive(Duration::from_secs(30)).unwrap();
            got_tx.send(g.to_vec()).unwrap();
        });
        // The guard cannot be granted while the ticket is held...
        assert!(got_rx.recv_timeout(Duration::from_millis(100)).is_err());
        // ...and meanwhile new tickets are refused.
        assert_eq!(bref.access().map(|_| ()), Err(MemError::Revoked));
        release_tx.send(()).unwrap();
        // The guard sees the write made under the ticket.
        let seen = got_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(seen, vec![0xAA; 16]);
    });
    assert!(b.access().is_ok());
}

#[test]
fn no_access_lands_while_a_guard_is_held() {
    // Writers hammer the block while another thread repeatedly takes the guard, fills
    // the slice and checks that nothing changed it behind its back.
    let rounds: u32 = if cfg!(miri) { 5 } else { 2_000 };
    let b = MemBlock::new(64).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let intrusions: u32 = thread::scope(|s| {
        for w in 0..2u8 {
            let (b, stop) = (&b, &stop);
            s.spawn(move || {
                let mut n: u32 = 0;
                while !stop.load(Ordering::Relaxed) && n < 50_000_000 {
                    n += 1;
                    let _ = b.copy_in(0, &[0xF0 | w; 64]);
                    let _ = b.atomic_fetch_add(8, 1);
                }
            });
        }
        let mut intrusions = 0;
        for round in 0..rounds {
            let v = (round % 200) as u8;
            let mut g = b.exclusive(Duration::from_secs(10)).unwrap();
            g.fill(v);
            for _ in 0..50 {
                std::hint::spin_loop();
            }
            intrusions += u32::from(g.iter().any(|&x| x != v));
        }
        stop.store(true, Ordering::Relaxed);
        intrusions
    });
    assert_eq!(intrusions, 0);
}

#[test]
fn ticket_racing_a_guard_backs_out() {
    // The interleaving a stress test rarely hits: an accessor passed the cheap pre-check,
    // then a guard revoked and drained (count 0), then the accessor increments.
    let b = MemBlock::new(8).unwrap();
    let g = b.exclusive(Duration::ZERO).unwrap();
    assert_eq!(b.gate.enter_counted(), Err(MemError::Revoked));
    assert_eq!(b.gate.state.load(Ordering::Relaxed), REVOKED);
    drop(g);
    b.retire(Duration::ZERO).unwrap();
    assert_eq!(b.gate.enter_counted(), Err(MemError::Retired));
    assert_eq!(b.gate.state.load(Ordering::Relaxed), RETIRED);
}

#[test]
fn retire_closes_for_good() {
    let b = MemBlock::new(8).unwrap();
    let t = b.access().unwrap();
    assert!(matches!(
        b.retire(Duration::from_millis(10)),
        Err(MemError::DrainTimeout { .. })
    ));
    assert!(b.is_retired());
    assert_eq!(b.copy_in(0, &[1]).unwrap_err(), MemError::Retired);
    drop(t);
    b.retire(Duration::from_secs(1)).unwrap();
    assert_eq!(b.atomic_fetch_add(0, 1).unwrap_err(), MemError::Retired);
    assert!(matches!(
        b.exclusive(Duration::ZERO),
        Err(MemError::Retired)
    ));
    // A failed exclusive attempt must not leave the revoked flag behind.
    assert!(format!("{b:?}").contains("revoked: false"));
}

#[test]
fn raw_block_at_every_misalignment() {
    for shift in 0..8usize {
        for len in [0usize, 1, 2, 7, 8, 9, 15, 16, 17, 33] {
            let mut backing = vec![0x11u8; 64];
            let base = backing.as_mut_ptr().wrapping_add(8 + shift);
            // SAFETY: the range (bytes 8 + shift .. 8 + shift + len ≤ 48) lies inside
            // `backing`, which outlives the block and is not accessed until it is dropped.
            let b = unsafe { MemBlock::from_raw(base, len) }.unwrap();
            assert!(!b.is_owned());
            assert_eq!(b.base_addr(), base as u64);
            let data = pattern(len, shift as u8);
            b.copy_in(0, &data).unwrap();
            let mut back = vec![0u8; len];
            b.copy_out(0, &mut back).unwrap();
            assert_eq!(back, data);
            assert!(matches!(
                b.exclusive(Duration::ZERO),
                Err(MemError::NotOwned)
            ));
            drop(b);
            let mut expect = vec![0x11u8; 64];
            expect[8 + shift..8 + shift + len].copy_from_slice(&data);
            assert_eq!(backing, expect, "shift {shift} len {len}");
        }
    }
}

#[test]
fn raw_block_over_an_exact_allocation() {
    // Each range is a whole allocation of its own (alignment 1), so any access beyond it
    // would leave the allocation; under the memory-model interpreter that is reported.
    for len in 1..=19usize {
        let mut buf = vec![0u8; len];
        // SAFETY: the range is exactly `buf`, not otherwise accessed while `b` lives.
        let b = unsafe { MemBlock::from_raw(buf.as_mut_ptr(), len) }.unwrap();
        b.fill(0, len, 0x5A).unwrap();
        let data = pattern(len, 9);
        b.copy_in(0, &data).unwrap();
        assert_eq!(b.to_vec().unwrap(), data);
        let first_aligned = (8 - b.base_addr() as usize % 8) % 8;
        if first_aligned + 8 <= len {
            b.atomic_fetch_add(first_aligned, 1).unwrap();
        }
        for off in 0..len {
            let r = b.atomic_load(off);
            let aligned = (b.base_addr() as usize + off) % 8 == 0;
            assert_eq!(r.is_ok(), aligned && off + 8 <= len, "len {len} off {off}");
        }
        drop(b);
        let mut expect = data.clone();
        if first_aligned + 8 <= len {
            let w = &mut expect[first_aligned..first_aligned + 8];
            let v = u64::from_ne_bytes(w.try_into().unwrap()).wrapping_add(1);
            w.copy_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(buf, expect);
    }
}

#[test]
fn raw_rejects_null_and_wrap() {
    // SAFETY: these ranges are rejected before any access (or are empty).
    unsafe {
        assert!(matches!(
            MemBlock::from_raw(std::ptr::null_mut(), 4),
            Err(MemError::NullAddress { len: 4 })
        ));
        assert!(MemBlock::from_raw(std::ptr::null_mut(), 0).is_ok());
        let p = std::ptr::without_provenance_mut::<u8>(usize::MAX - 3);
        assert!(matches!(
            MemBlock::from_raw(p, 8),
            Err(MemError::AddressWrap { .. })
        ));
    }
}

proptest! {
    #[test]
    fn copy_roundtrip_and_neighbours(
        shift in 0usize..8,
        size in 0usize..200,
        a in 0usize..200,
        b in 0usize..200,
        seed in any::<u8>(),
    ) {
        let (off, end) = (a.min(b).min(size), a.max(b).min(size));
        let len = end - off;
        let init = pattern(size, seed);
        let data = pattern(len, seed ^ 0x5A).iter().map(|x| !x).collect::<Vec<_>>();
        // Owned block.
        let owned = MemBlock::from_slice(&init).unwrap();
        owned.copy_in(off, &data).unwrap();
        let mut expect = init.clone();
        expect[off..end].copy_from_slice(&data);
        prop_assert_eq!(owned.to_vec().unwrap(), expect.clone());
        let mut back = vec![0u8; len];
        owned.copy_out(off, &mut back).unwrap();
        prop_assert_eq!(&back, &data);
        // Raw block at an arbitrary misalignment, with guard bytes around it.
        let mut backing = vec![0xC3u8; size + 32];
        backing[8 + shift..8 + shift + size].copy_from_slice(&init);
        let p = backing.as_mut_ptr().wrapping_add(8 + shift);
        // SAFETY: the range lies inside `backing`, which is not otherwise accessed until
        // the block is dropped.
        let raw = unsafe { MemBlock::from_raw(p, size) }.unwrap();
        raw.copy_in(off, &data).unwrap();
        let mut back = vec![0u8; len];
        raw.copy_out(off, &mut back).unwrap();
        prop_assert_eq!(&back, &data);
        drop(raw);
        let mut expect_backing = vec![0xC3u8; size + 32];
        expect_backing[8 + shift..8 + shift + size].copy_from_slice(&expect);
        prop_assert_eq!(backing, expect_backing);
    }
}

/// Throughput of a 1 MiB copy in and out, whole and in 4 KiB pieces (a packet's payload),
/// best of 5 rounds, for an owned block, a Raw range with the public accessors (the bulk copy
/// on x86-64) and a Raw range with the word-atomic copy, next to a plain memcpy of the same
/// size (run with `--release -- --ignored --nocapture`).
#[test]
#[ignore]
fn copy_throughput_1mib() {
    const N: usize = 1 << 20;
    const ITERS: u32 = 300;
    const PIECE: usize = 4096;
    let owned = MemBlock::new(N).unwrap();
    let mut backing = vec![0u8; N + 8];
    // SAFETY: the range lies inside `backing`, not otherwise accessed while the block lives.
    let raw = unsafe { MemBlock::from_raw(backing.as_mut_ptr(), N + 8) }.unwrap();
    let src = pattern(N, 1);
    let mut dst = vec![0u8; N];
    let rate = |len: usize, f: &mut dyn FnMut()| {
        let mut best = 0f64;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..ITERS {
                f();
            }
            let r = (len as f64 * f64::from(ITERS)) / t.elapsed().as_secs_f64() / 1e9;
            best = best.max(r);
        }
        best
    };
    let rows: [(&str, &MemBlock, Path); 3] = [
        ("owned", &owned, Path::Words),
        ("raw", &raw, Path::Public),
        ("raw, word atomics", &raw, Path::Words),
    ];
    for (kind, b, path) in rows {
        for (name, offset) in [("aligned", 0usize), ("unaligned", 3)] {
            for piece in [N, PIECE] {
                let len = N - offset;
                let wr = rate(len, &mut || {
                    let a = b.access().unwrap();
                    for (i, c) in src[..len].chunks(piece).enumerate() {
                        let at = offset + i * piece;
                        match path {
                            Path::Public => a.copy_in(at, std::hint::black_box(c)),
                            Path::Words => a.copy_in_words(at, std::hint::black_box(c)),
                        }
                        .unwrap();
                    }
                });
                let rd = rate(len, &mut || {
                    let a = b.access().unwrap();
                    for (i, c) in dst[..len].chunks_mut(piece).enumerate() {
                        let at = offset + i * piece;
                        match path {
                            Path::Public => a.copy_out(at, std::hint::black_box(c)),
                            Path::Words => a.copy_out_words(at, std::hint::black_box(c)),
                        }
                        .unwrap();
                    }
                });
                assert_eq!(&dst[..len], &src[..len]);
                dst.fill(0);
                println!(
                    "{kind}, {name}, pieces of {piece}: copy_in {wr:.1} GB/s, copy_out {rd:.1} GB/s"
                );
            }
        }
    }
    let mc = rate(N, &mut || {
        std::hint::black_box(&mut dst[..]).copy_from_slice(&src[..]);
    });
    println!("memcpy: {mc:.1} GB/s");
    drop(raw);
}

// ---------------------------------------------------------------------------------------
// Raw ranges: the bulk copy (and the word-atomic copy it replaces on x86-64) touch exactly
// the bytes asked for. Each range lies in a larger buffer of guard bytes.
// ---------------------------------------------------------------------------------------

const GUARD: u8 = 0xC3;

/// Which copy a check drives on a Raw block: the public accessors (the bulk copy where the
/// target has it) or the word-atomic copy they fall back to elsewhere.
#[derive(Clone, Copy, Debug)]
enum Path {
    Public,
    Words,
}

/// Lengths of the accesses checked: every length up to 64, then around page sizes.
fn lengths() -> impl Iterator<Item = usize> {
    (0..=64).chain([4095, 4096, 4097, 8191, 8192, 8193, 65536 + 5])
}

/// Starts checked for a length: every misalignment of a short access, a few of a long one.
fn shifts(len: usize) -> Vec<usize> {
    if len <= 64 {
        (0..16).collect()
    } else {
        vec![0, 1, 7, 8, 63]
    }
}

/// `backing` (guard bytes and `init` at `at`) with a Raw block over `[at, at + init.len())`
/// handed to `f`; returns the backing after the block is dropped.
fn with_raw(at: usize, init: &[u8], f: impl FnOnce(&MemBlock)) -> Vec<u8> {
    let mut backing = vec![GUARD; at + init.len() + 80];
    backing[at..at + init.len()].copy_from_slice(init);
    let p = backing.as_mut_ptr().wrapping_add(at);
    // SAFETY: the range lies inside `backing`, which outlives the block and is not accessed
    // otherwise until the block is dropped.
    let b = unsafe { MemBlock::from_raw(p, init.len()) }.unwrap();
    f(&b);
    drop(b);
    backing
}

/// The backing `with_raw` should leave: guards, `init` at `at`, `data` at `at + off`.
fn expected(at: usize, init: &[u8], off: usize, data: &[u8]) -> Vec<u8> {
    let mut v = vec![GUARD; at + init.len() + 80];
    v[at..at + init.len()].copy_from_slice(init);
    v[at + off..at + off + data.len()].copy_from_slice(data);
    v
}

fn check_raw_copy_in_and_fill(path: Path) {
    for len in lengths() {
        for shift in shifts(len) {
            // The access is the whole block, and a part of a block 3 bytes longer each side.
            for (pad, off) in [(0usize, 0usize), (3, 3)] {
                let init = pattern(len + 2 * pad, 0x11);
                let data = pattern(len, 0x77);
                let got = with_raw(8 + shift, &init, |b| {
                    let a = b.access().unwrap();
                    match path {
                        Path::Public => a.copy_in(off, &data),
                        Path::Words => a.copy_in_words(off, &data),
                    }
                    .unwrap();
                });
                assert!(
                    got == expected(8 + shift, &init, off, &data),
                    "copy_in {path:?} len {len} shift {shift} pad {pad}"
                );
                let got = with_raw(8 + shift, &init, |b| {
                    let a = b.access().unwrap();
                    match path {
                        Path::Public => a.fill(off, len, 0x5A),
                        Path::Words => a.fill_words(off, len, 0x5A),
                    }
                    .unwrap();
                });
                assert!(
                    got == expected(8 + shift, &init, off, &vec![0x5A; len]),
                    "fill {path:?} len {len} shift {shift} pad {pad}"
                );
            }
        }
    }
}

fn check_raw_copy_out(path: Path) {
    for len in lengths() {
        for shift in shifts(len) {
            for (pad, off) in [(0usize, 0usize), (3, 3)] {
                let init = pattern(len + 2 * pad, 0x21);
                // The destination is at its own misalignment inside guard bytes too.
                let dshift = (shift * 5 + 3) % 8;
                let mut dst = vec![GUARD; len + 32];
                let after = with_raw(8 + shift, &init, |b| {
                    let a = b.access().unwrap();
                    let d = &mut dst[8 + dshift..8 + dshift + len];
                    match path {
                        Path::Public => a.copy_out(off, d),
                        Path::Words => a.copy_out_words(off, d),
                    }
                    .unwrap();
                });
                let mut want = vec![GUARD; len + 32];
                want[8 + dshift..8 + dshift + len].copy_from_slice(&init[off..off + len]);
                assert!(
                    dst == want,
                    "copy_out {path:?} len {len} shift {shift} pad {pad}"
                );
                assert!(
                    after == expected(8 + shift, &init, 0, &[]),
                    "copy_out {path:?} wrote its source: len {len} shift {shift} pad {pad}"
                );
            }
        }
    }
}

#[test]
fn raw_copy_in_and_fill_touch_exactly_their_bytes() {
    check_raw_copy_in_and_fill(Path::Public);
}

#[test]
fn raw_copy_out_touches_exactly_its_bytes() {
    check_raw_copy_out(Path::Public);
}

#[test]
fn raw_word_copies_touch_exactly_their_bytes() {
    // The word-atomic copy stays the Raw path on targets without the bulk copy.
    check_raw_copy_in_and_fill(Path::Words);
    check_raw_copy_out(Path::Words);
}

#[test]
fn raw_access_out_of_range_touches_nothing() {
    let init = pattern(40, 3);
    let got = with_raw(5, &init, |b| {
        assert!(b.copy_in(30, &[0xEE; 11]).is_err());
        assert!(b.fill(41, 0, 0).is_err());
        assert!(b.fill(39, 2, 0).is_err());
        let mut dst = [0x55u8; 4];
        assert!(b.copy_out(38, &mut dst).is_err());
        assert_eq!(dst, [0x55; 4]);
        b.copy_in(40, &[]).unwrap();
        b.fill(40, 0, 1).unwrap();
    });
    assert!(got == expected(5, &init, 0, &[]));
}

/// The kinds of block a block-to-block copy runs between.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Raw,
    Owned,
}

#[test]
fn copy_from_block_between_raw_and_owned() {
    let kinds = [
        (Kind::Raw, Kind::Raw),
        (Kind::Raw, Kind::Owned),
        (Kind::Owned, Kind::Raw),
        (Kind::Owned, Kind::Owned),
    ];
    for (dk, sk) in kinds {
        for len in lengths() {
            for shift in shifts(len).into_iter().step_by(3) {
                let (doff, soff) = (shift % 5, (shift * 3) % 7);
                let dinit = pattern(len + 8, 0x31);
                let sinit = pattern(len + 8, 0x47);
                let src_owned = MemBlock::from_slice(&sinit).unwrap();
                let dst_owned = MemBlock::from_slice(&dinit).unwrap();
                let copy = |dst: &MemBlock| {
                    let src_after = match sk {
                        Kind::Owned => {
                            dst.copy_from_block(doff, &src_owned, soff, len).unwrap();
                            src_owned.to_vec().unwrap()
                        }
                        Kind::Raw => {
                            let after = with_raw(8 + (shift + 3) % 8, &sinit, |s| {
                                dst.copy_from_block(doff, s, soff, len).unwrap();
                            });
                            let at = 8 + (shift + 3) % 8;
                            assert!(after == expected(at, &sinit, 0, &[]), "source guards");
                            after[at..at + sinit.len()].to_vec()
                        }
                    };
                    assert_eq!(
                        src_after, sinit,
                        "source changed: {dk:?} <- {sk:?} len {len}"
                    );
                };
                let mut want = dinit.clone();
                want[doff..doff + len].copy_from_slice(&sinit[soff..soff + len]);
                match dk {
                    Kind::Owned => {
                        copy(&dst_owned);
                        assert!(
                            dst_owned.to_vec().unwrap() == want,
                            "{dk:?} <- {sk:?} {len}"
                        );
                    }
                    Kind::Raw => {
                        let at = 8 + shift;
                        let got = with_raw(at, &dinit, |d| copy(d));
                        assert!(
                            got == expected(at, &want, 0, &[]),
                            "{dk:?} <- {sk:?} len {len} shift {shift}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn copy_from_raw_block_onto_itself_overlapping() {
    // Overlapping Raw ranges take the buffered path (memmove semantics); disjoint ones in the
    // same block the bulk copy.
    for len in [1usize, 7, 8, 9, 63, 64, 65, 4096, 4097, 10_000] {
        for (dst_off, src_off) in [(0usize, 3usize), (3, 0), (1, 9), (9, 1), (0, len + 1)] {
            let size = 2 * len + 16;
            let init = pattern(size, 0x61);
            let got = with_raw(11, &init, |b| {
                b.copy_from_block(dst_off, b, src_off, len).unwrap();
            });
            let mut want = init.clone();
            want.copy_within(src_off..src_off + len, dst_off);
            assert!(
                got == expected(11, &want, 0, &[]),
                "len {len} {dst_off} <- {src_off}"
            );
        }
    }
}

#[test]
fn raw_bulk_copy_next_to_atomics_loses_no_update() {
    // One thread copies into and out of the bytes on both sides of an aligned word while
    // another adds to that word: a copy that rewrote bytes outside its range (a wider store
    // of stale data) would lose additions.
    const ROUNDS: u64 = if cfg!(miri) { 20 } else { 20_000 };
    let mut backing = vec![0u8; 64];
    let base = backing.as_mut_ptr();
    let word_at = (8 - base.addr() % 8) % 8 + 16;
    // SAFETY: the range is all of `backing`, not otherwise accessed while the block lives.
    let b = unsafe { MemBlock::from_raw(base, 64) }.unwrap();
    thread::scope(|s| {
        let b = &b;
        s.spawn(move || {
            for _ in 0..ROUNDS {
                b.atomic_fetch_add(word_at, 1).unwrap();
            }
        });
        s.spawn(move || {
            let mut back = [0u8; 16];
            for round in 0..ROUNDS {
                let v = [round as u8; 16];
                b.copy_in(word_at - 16, &v).unwrap();
                b.copy_in(word_at + 8, &v[..13]).unwrap();
                b.fill(word_at - 3, 3, round as u8).unwrap();
                b.copy_out(word_at - 16, &mut back).unwrap();
            }
        });
    });
    assert_eq!(b.atomic_load(word_at).unwrap(), ROUNDS);
}
