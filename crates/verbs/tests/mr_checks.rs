//! Memory-region checks: every refused access yields the right typed error and leaves memory
//! untouched; copies, atomics and the exclusive-access gate behave under concurrency; raw
//! registrations write through to the application's memory; keys are unique and unguessable.

use std::collections::HashSet;
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use uroce_verbs::mem::{MemBlock, MemError};
use uroce_verbs::mr::{
    key_index, make_key, AccessError, AccessFlags, MrCore, RemoteOp, MAX_KEY_INDEX,
};

const PD: u32 = 7;
const OTHER_PD: u32 = 8;
const LEN: usize = 256;

/// A byte pattern with no period shorter than 256, independent of the code under test.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(151).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// A region of `LEN` bytes holding `pattern(LEN, 0x3C)`, with fresh random keys.
fn region(access: AccessFlags) -> MrCore {
    let mut rng = rand::rng();
    let lkey = make_key(5, &mut rng).unwrap();
    let rkey = make_key(5, &mut rng).unwrap();
    let block = MemBlock::from_slice(&pattern(LEN, 0x3C)).unwrap();
    MrCore::new(PD, block, access, lkey, rkey).unwrap()
}

fn assert_untouched(mr: &MrCore) {
    assert_eq!(
        mr.block().to_vec().unwrap(),
        pattern(LEN, 0x3C),
        "region memory changed by a refused access"
    );
}

/// The bounds a region of LEN bytes at `iova` must report, computed independently.
fn oob(mr: &MrCore, va: u64, len: u64) -> AccessError {
    AccessError::OutOfBounds {
        va,
        len,
        start: mr.iova(),
        end: mr.iova() + LEN as u64,
    }
}

// ------------------------------------------------------------------------------------------
// Out of bounds
// ------------------------------------------------------------------------------------------

#[test]
fn out_of_bounds_remote_write_below_above_straddling() {
    let mr = region(all_access());
    let base = mr.iova();
    let cases: [(u64, usize); 6] = [
        (base - 1, 4),              // starts below
        (base - 8, 8),              // entirely below
        (base + LEN as u64, 1),     // starts at the end
        (base + LEN as u64 + 9, 3), // entirely above
        (base + 250, 10),           // straddles the end
        (base - 2, LEN + 4),        // straddles both ends
    ];
    for (va, n) in cases {
        let data = vec![0xEEu8; n];
        assert_eq!(
            mr.remote_write(PD, mr.rkey(), va, &data),
            Err(oob(&mr, va, n as u64)),
            "va {va:#x} len {n}"
        );
        assert_eq!(
            mr.local_write(PD, mr.lkey(), va, &data),
            Err(oob(&mr, va, n as u64))
        );
        assert_eq!(mr.write(va, &data), Err(oob(&mr, va, n as u64)));
        assert_untouched(&mr);
        let mut dst = vec![0x99u8; n];
        assert_eq!(
            mr.remote_read(PD, mr.rkey(), va, &mut dst),
            Err(oob(&mr, va, n as u64))
        );
        assert_eq!(
            mr.local_read(PD, mr.lkey(), va, &mut dst),
            Err(oob(&mr, va, n as u64))
        );
        assert_eq!(
            dst,
            vec![0x99u8; n],
            "destination changed by a refused read"
        );
    }
    // The exact edges are accepted: the check is not off by one.
    mr.check_remote(PD, mr.rkey(), base, LEN as u64, RemoteOp::Write)
        .unwrap();
    mr.check_remote(PD, mr.rkey(), base + LEN as u64 - 1, 1, RemoteOp::Read)
        .unwrap();
}

#[test]
fn out_of_bounds_wrap_around_is_an_error_not_a_panic() {
    let mr = region(all_access());
    for (va, len) in [
        (u64::MAX - 3, 8u64),
        (u64::MAX, 1),
        (mr.iova() + 8, u64::MAX),
        (mr.iova(), u64::MAX - mr.iova() + 1), // end wraps to exactly 0
    ] {
        for op in [RemoteOp::Read, RemoteOp::Write, RemoteOp::Atomic] {
            assert_eq!(
                mr.check_remote(PD, mr.rkey(), va, len, op),
                Err(oob(&mr, va, len))
            );
        }
        assert_eq!(
            mr.check_local(PD, mr.lkey(), va, len, true),
            Err(oob(&mr, va, len))
        );
    }
    assert_eq!(
        mr.remote_write(PD, mr.rkey(), u64::MAX - 3, &[1; 8]),
        Err(oob(&mr, u64::MAX - 3, 8))
    );
    // A zero-based region: VA 0 is valid, a wrapping range is not.
    let zb = MrCore::new(
        PD,
        MemBlock::from_slice(&pattern(LEN, 0x3C)).unwrap(),
        all_access() | AccessFlags::ZERO_BASED,
        0x1001,
        0x2002,
    )
    .unwrap();
    assert_eq!(zb.iova(), 0);
    assert_eq!(
        zb.remote_write(PD, 0x2002, u64::MAX, &[1, 2]),
        Err(AccessError::OutOfBounds {
            va: u64::MAX,
            len: 2,
            start: 0,
            end: LEN as u64
        })
    );
    assert_untouched(&zb);
    assert_untouched(&mr);
}

#[test]
fn out_of_bounds_atomic() {
    let mr = region(all_access());
    let va = mr.iova() + LEN as u64; // aligned, one past the end
    assert_eq!(
        mr.remote_fetch_add(PD, mr.rkey(), va, 1),
        Err(oob(&mr, va, 8))
    );
    assert_eq!(
        mr.remote_compare_swap(PD, mr.rkey(), va - 256 - 8, 0, 1),
        Err(oob(&mr, va - 256 - 8, 8))
    );
    assert_untouched(&mr);
}

// ------------------------------------------------------------------------------------------
// Permissions
// ------------------------------------------------------------------------------------------

#[test]
fn wrong_access_flag_for_remote_write() {
    let mr =
        region(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC);
    let va = mr.iova() + 16;
    assert_eq!(
        mr.remote_write(PD, mr.rkey(), va, &[0xEE; 32]),
        Err(AccessError::NoPermission {
            needed: AccessFlags::REMOTE_WRITE
        })
    );
    assert_untouched(&mr);
}

#[test]
fn wrong_access_flag_for_remote_read() {
    let mr =
        region(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC);
    let mut dst = [0x99u8; 32];
    assert_eq!(
        mr.remote_read(PD, mr.rkey(), mr.iova(), &mut dst),
        Err(AccessError::NoPermission {
            needed: AccessFlags::REMOTE_READ
        })
    );
    assert_eq!(dst, [0x99u8; 32]);
    assert_untouched(&mr);
}

#[test]
fn wrong_access_flag_for_atomics() {
    let mr =
        region(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ);
    let va = mr.iova() + 64;
    let needed = AccessError::NoPermission {
        needed: AccessFlags::REMOTE_ATOMIC,
    };
    assert_eq!(
        mr.remote_fetch_add(PD, mr.rkey(), va, 1),
        Err(needed.clone())
    );
    let cur = u64::from_ne_bytes(pattern(LEN, 0x3C)[64..72].try_into().unwrap());
    // Even with a matching compare value nothing is swapped.
    assert_eq!(
        mr.remote_compare_swap(PD, mr.rkey(), va, cur, !cur),
        Err(needed)
    );
    assert_untouched(&mr);
}

#[test]
fn wrong_access_flag_for_local_write() {
    let mr = region(AccessFlags::REMOTE_READ);
    assert_eq!(
        mr.local_write(PD, mr.lkey(), mr.iova() + 3, &[0xEE; 9]),
        Err(AccessError::NoPermission {
            needed: AccessFlags::LOCAL_WRITE
        })
    );
    assert_untouched(&mr);
    // Local reads need no flag.
    let mut dst = [0u8; 9];
    mr.local_read(PD, mr.lkey(), mr.iova() + 3, &mut dst)
        .unwrap();
    assert_eq!(&dst[..], &pattern(LEN, 0x3C)[3..12]);
}

#[test]
fn granted_access_does_write_exactly_the_range() {
    // The positive control for the tests above: the same calls succeed with permission.
    let mr = region(all_access());
    mr.remote_write(PD, mr.rkey(), mr.iova() + 16, &[0xEE; 32])
        .unwrap();
    let mut expect = pattern(LEN, 0x3C);
    expect[16..48].fill(0xEE);
    assert_eq!(mr.block().to_vec().unwrap(), expect);
    mr.local_write(PD, mr.lkey(), mr.iova() + 255, &[0x01])
        .unwrap();
    expect[255] = 0x01;
    let old = mr
        .remote_fetch_add(PD, mr.rkey(), mr.iova() + 64, 5)
        .unwrap();
    let old_expect = u64::from_ne_bytes(expect[64..72].try_into().unwrap());
    assert_eq!(old, old_expect);
    expect[64..72].copy_from_slice(&old_expect.wrapping_add(5).to_ne_bytes());
    assert_eq!(mr.block().to_vec().unwrap(), expect);
}

// ------------------------------------------------------------------------------------------
// PD, keys, alignment
// ------------------------------------------------------------------------------------------

#[test]
fn wrong_pd() {
    let mr = region(all_access());
    let want = Err(AccessError::WrongPd {
        expected: PD,
        got: OTHER_PD,
    });
    assert_eq!(
        mr.remote_write(OTHER_PD, mr.rkey(), mr.iova(), &[0xEE; 8]),
        want
    );
    assert_eq!(
        mr.local_write(OTHER_PD, mr.lkey(), mr.iova(), &[0xEE; 8]),
        want
    );
    assert_eq!(
        mr.remote_fetch_add(OTHER_PD, mr.rkey(), mr.iova(), 1)
            .map(|_| ()),
        want
    );
    let mut dst = [0x99u8; 8];
    assert_eq!(
        mr.remote_read(OTHER_PD, mr.rkey(), mr.iova(), &mut dst),
        want
    );
    assert_eq!(dst, [0x99; 8]);
    assert_untouched(&mr);
}

#[test]
fn wrong_rkey_and_lkey() {
    let mr = region(all_access());
    let bad_rkey = mr.rkey() ^ 0x1; // same index, different random part
    assert_eq!(
        mr.remote_write(PD, bad_rkey, mr.iova(), &[0xEE; 8]),
        Err(AccessError::WrongKey { key: bad_rkey })
    );
    assert_eq!(
        mr.remote_compare_swap(PD, bad_rkey, mr.iova(), 0, 1),
        Err(AccessError::WrongKey { key: bad_rkey })
    );
    // The L_Key is not an R_Key and vice versa (unless the two draws coincided).
    if mr.lkey() != mr.rkey() {
        assert_eq!(
            mr.remote_write(PD, mr.lkey(), mr.iova(), &[0xEE; 8]),
            Err(AccessError::WrongKey { key: mr.lkey() })
        );
        assert_eq!(
            mr.local_write(PD, mr.rkey(), mr.iova(), &[0xEE; 8]),
            Err(AccessError::WrongKey { key: mr.rkey() })
        );
    }
    let bad_lkey = mr.lkey().wrapping_add(1 << 12); // same random part, other index
    assert_eq!(
        mr.local_write(PD, bad_lkey, mr.iova(), &[0xEE; 8]),
        Err(AccessError::WrongKey { key: bad_lkey })
    );
    assert_untouched(&mr);
}

#[test]
fn misaligned_atomics() {
    let mr = region(all_access());
    for delta in [1u64, 4, 7, 12] {
        let va = mr.iova() + delta;
        assert_eq!(
            mr.remote_fetch_add(PD, mr.rkey(), va, 1),
            Err(AccessError::Misaligned { va })
        );
        assert_eq!(
            mr.remote_compare_swap(PD, mr.rkey(), va, 0, 1),
            Err(AccessError::Misaligned { va })
        );
        assert_eq!(
            mr.atomic_fetch_add(va, 1),
            Err(AccessError::Misaligned { va })
        );
        assert_eq!(
            mr.check_remote(PD, mr.rkey(), va, 8, RemoteOp::Atomic),
            Err(AccessError::Misaligned { va })
        );
        // Alignment matters only for atomics.
        mr.check_remote(PD, mr.rkey(), va, 8, RemoteOp::Write)
            .unwrap();
    }
    assert_untouched(&mr);
}

#[test]
fn zero_based_raw_region_at_misaligned_address_rejects_atomics() {
    // VA 8 is aligned, but the memory it names is not: no atomic may straddle words.
    let mut backing = vec![0u64; 8];
    let p = backing.as_mut_ptr().cast::<u8>().wrapping_add(4);
    // SAFETY: bytes 4..52 of `backing` stay valid and are not otherwise accessed until the
    // region is dropped below.
    let block = unsafe { MemBlock::from_raw(p, 48) }.unwrap();
    let mr = MrCore::new(
        PD,
        block,
        all_access() | AccessFlags::ZERO_BASED,
        0x1001,
        0x2002,
    )
    .unwrap();
    assert_eq!(
        mr.remote_fetch_add(PD, 0x2002, 8, 1),
        Err(AccessError::Misaligned { va: 8 })
    );
    drop(mr);
    assert_eq!(backing, vec![0u64; 8]);
}

#[test]
fn zero_length_remote_access_is_not_validated_but_local_key_is() {
    let mr = region(AccessFlags::empty());
    assert_eq!(mr.remote_write(OTHER_PD, 0, u64::MAX, &[]), Ok(()));
    assert_eq!(mr.remote_read(OTHER_PD, 0, 0, &mut []), Ok(()));
    assert_eq!(
        mr.local_read(PD, 0, mr.iova(), &mut []),
        Err(AccessError::WrongKey { key: 0 })
    );
    let empty = MrCore::new(PD, MemBlock::new(0).unwrap(), all_access(), 0x1001, 0x2002).unwrap();
    assert!(empty.is_empty());
    assert_eq!(
        empty.remote_write(PD, 0x2002, empty.iova(), &[1]),
        Err(AccessError::OutOfBounds {
            va: empty.iova(),
            len: 1,
            start: empty.iova(),
            end: empty.iova()
        })
    );
    assert_untouched(&mr);
}

// ------------------------------------------------------------------------------------------
// Copies
// ------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A write by VA reads back identically and never touches bytes outside its range,
    /// for owned regions and for raw regions at every alignment.
    #[test]
    fn write_then_read_back(
        shift in 0usize..8,
        start in 0usize..LEN,
        len in 0usize..=LEN,
        seed in any::<u8>(),
    ) {
        let len = len.min(LEN - start);
        let data: Vec<u8> = pattern(len, seed).iter().map(|b| b ^ 0xA5).collect();
        let mut expect = pattern(LEN, 0x3C);
        expect[start..start + len].copy_from_slice(&data);

        let mr = region(all_access());
        mr.remote_write(PD, mr.rkey(), mr.iova() + start as u64, &data).unwrap();
        let mut back = vec![0u8; len];
        mr.remote_read(PD, mr.rkey(), mr.iova() + start as u64, &mut back).unwrap();
        prop_assert_eq!(&back, &data);
        prop_assert_eq!(mr.block().to_vec().unwrap(), expect.clone());

        // Raw: the region sits `shift` bytes past an 8-aligned address inside a larger
        // buffer whose guard bytes must survive.
        let guard = 0xC3u8;
        let mut init = vec![guard; (LEN / 8 + 4) * 8];
        init[8 + shift..8 + shift + LEN].copy_from_slice(&pattern(LEN, 0x3C));
        // A u64 vector for 8-byte alignment, initialised with plain writes.
        let mut backing: Vec<u64> = init
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        let base = backing.as_mut_ptr().cast::<u8>();
        {
            let p = base.wrapping_add(8 + shift);
            // SAFETY: bytes 8 + shift .. 8 + shift + LEN lie inside `backing`, which is
            // accessed only through this block while it lives.
            let block = unsafe { MemBlock::from_raw(p, LEN) }.unwrap();
            let mr = MrCore::new(PD, block, all_access(), 0x1001, 0x2002).unwrap();
            prop_assert_eq!(mr.iova(), p as u64);
            mr.local_write(PD, 0x1001, mr.iova() + start as u64, &data).unwrap();
            let mut back = vec![0u8; len];
            mr.local_read(PD, 0x1001, mr.iova() + start as u64, &mut back).unwrap();
            prop_assert_eq!(&back, &data);
        }
        let bytes: Vec<u8> = backing.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let mut expect_backing = vec![guard; bytes.len()];
        expect_backing[8 + shift..8 + shift + LEN].copy_from_slice(&expect);
        prop_assert_eq!(bytes, expect_backing);
    }
}

#[test]
fn raw_registration_writes_through_to_the_vec() {
    let mut buf = vec![0u8; 100];
    let addr = buf.as_mut_ptr();
    // SAFETY: the range is exactly `buf`'s allocation, which outlives the region and is not
    // touched while the region exists.
    let block = unsafe { MemBlock::from_raw(addr, buf.len()) }.unwrap();
    let mr = MrCore::new(PD, block, all_access(), 0x1001, 0x2002).unwrap();
    assert_eq!(mr.iova(), addr as u64);
    mr.remote_write(PD, 0x2002, addr as u64 + 10, b"hello, rdma")
        .unwrap();
    mr.remote_fetch_add(PD, 0x2002, (addr as u64 + 40 + 7) & !7, 0x0102_0304)
        .unwrap();
    mr.block().retire(Duration::from_secs(1)).unwrap();
    // After retirement nothing more reaches the memory.
    assert_eq!(
        mr.remote_write(PD, 0x2002, addr as u64, b"late"),
        Err(AccessError::Deregistered)
    );
    drop(mr);
    let mut expect = vec![0u8; 100];
    expect[10..21].copy_from_slice(b"hello, rdma");
    let w = ((addr as usize + 47) & !7) - addr as usize;
    expect[w..w + 8].copy_from_slice(&0x0102_0304u64.to_ne_bytes());
    assert_eq!(buf, expect);
}

// ------------------------------------------------------------------------------------------
// Concurrency
// ------------------------------------------------------------------------------------------

#[test]
fn concurrent_fetch_add_is_exact() {
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 20_000;
    let mr = region(all_access());
    let va = mr.iova() + 128;
    let initial = mr.block().atomic_load(128).unwrap();
    let barrier = Barrier::new(THREADS as usize);
    thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..PER_THREAD {
                    mr.remote_fetch_add(PD, mr.rkey(), va, 1).unwrap();
                }
            });
        }
    });
    assert_eq!(
        mr.block().atomic_load(128).unwrap(),
        initial.wrapping_add(THREADS * PER_THREAD)
    );
    // Neighbouring words are untouched.
    let mut expect = pattern(LEN, 0x3C);
    expect[128..136].copy_from_slice(&initial.wrapping_add(THREADS * PER_THREAD).to_ne_bytes());
    assert_eq!(mr.block().to_vec().unwrap(), expect);
}

#[test]
fn concurrent_compare_swap_hands_out_each_value_once() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 5_000;
    let mr = region(all_access());
    mr.block().atomic_store(0, 0).unwrap();
    let won: Vec<Vec<u64>> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    let mut attempts = 0;
                    while mine.len() < PER_THREAD && attempts < 10_000_000 {
                        attempts += 1;
                        let cur = mr.block().atomic_load(0).unwrap();
                        let prev = mr
                            .remote_compare_swap(PD, mr.rkey(), mr.iova(), cur, cur + 1)
                            .unwrap();
                        if prev == cur {
                            mine.push(cur);
                        }
                    }
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: HashSet<u64> = won.iter().flatten().copied().collect();
    let total: usize = won.iter().map(Vec::len).sum();
    assert_eq!(total, THREADS * PER_THREAD);
    assert_eq!(all.len(), total, "a value was swapped twice");
    assert_eq!(mr.block().atomic_load(0).unwrap(), total as u64);
}

#[test]
fn concurrent_disjoint_writers_and_readers() {
    // Ranges of 37 bytes share words at their edges, so edge merges race with each other.
    const RANGE: usize = 37;
    const WRITERS: usize = 4;
    const ROUNDS: usize = 3_000;
    let block = MemBlock::new(RANGE * WRITERS + 3).unwrap();
    let mr = MrCore::new(PD, block, all_access(), 0x1001, 0x2002).unwrap();
    let final_data = |w: usize| pattern(RANGE, 0x80 + w as u8);
    let barrier = Barrier::new(WRITERS + 2);
    thread::scope(|s| {
        for w in 0..WRITERS {
            let (mr, barrier) = (&mr, &barrier);
            s.spawn(move || {
                let va = mr.iova() + 1 + (w * RANGE) as u64;
                barrier.wait();
                for round in 0..ROUNDS {
                    mr.remote_write(PD, 0x2002, va, &pattern(RANGE, round as u8))
                        .unwrap();
                }
                mr.remote_write(PD, 0x2002, va, &final_data(w)).unwrap();
            });
        }
        for _ in 0..2 {
            let (mr, barrier) = (&mr, &barrier);
            s.spawn(move || {
                let mut snapshot = vec![0u8; RANGE * WRITERS + 3];
                barrier.wait();
                for _ in 0..ROUNDS {
                    mr.remote_read(PD, 0x2002, mr.iova(), &mut snapshot)
                        .unwrap();
                    // Bytes no writer owns stay zero at every instant.
                    assert_eq!(snapshot[0], 0);
                    assert_eq!(&snapshot[1 + RANGE * WRITERS..], &[0, 0]);
                }
            });
        }
    });
    let mem = mr.block().to_vec().unwrap();
    for w in 0..WRITERS {
        let start = 1 + w * RANGE;
        assert_eq!(&mem[start..start + RANGE], &final_data(w)[..], "range {w}");
    }
    assert_eq!(mem[0], 0);
    assert_eq!(&mem[1 + RANGE * WRITERS..], &[0, 0]);
}

#[test]
fn exclusive_guard_waits_for_in_flight_access_and_revokes_remote_access() {
    let mr = region(all_access());
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (granted_tx, granted_rx) = std::sync::mpsc::channel();
    thread::scope(|s| {
        let mr = &mr;
        // Owned by this closure, so a failed assertion drops it and unblocks the holder.
        let release_tx = release_tx;
        // An "engine" thread in the middle of a multi-step access.
        s.spawn(move || {
            let ticket = mr.block().access().unwrap();
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            ticket.copy_in(0, &[0xAB; 4]).unwrap();
        });
        held_rx.recv().unwrap();
        s.spawn(move || {
            let mut guard = mr.block().exclusive(Duration::from_secs(30)).unwrap();
            // The in-flight access completed before the slice was handed out.
            let seen = guard[..4].to_vec();
            guard[4] = 0xCD;
            granted_tx.send(seen).unwrap();
            // Hold the guard until the main thread has tried a remote access.
            thread::sleep(Duration::from_millis(50));
        });
        assert!(
            granted_rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "guard granted while an access was in flight"
        );
        // Revocation is already in force: new accesses are refused, memory untouched.
        assert_eq!(
            mr.remote_write(PD, mr.rkey(), mr.iova() + 8, &[0xEE; 8]),
            Err(AccessError::Revoked)
        );
        release_tx.send(()).unwrap();
        let seen = granted_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(seen, vec![0xAB; 4]);
        assert_eq!(
            mr.remote_fetch_add(PD, mr.rkey(), mr.iova() + 16, 1),
            Err(AccessError::Revoked)
        );
    });
    // The guard is gone: remote access works again and sees the application's write.
    let mut b = [0u8; 1];
    mr.remote_read(PD, mr.rkey(), mr.iova() + 4, &mut b)
        .unwrap();
    assert_eq!(b, [0xCD]);
    let mut expect = pattern(LEN, 0x3C);
    expect[..4].fill(0xAB);
    expect[4] = 0xCD;
    assert_eq!(mr.block().to_vec().unwrap(), expect);
    assert!(matches!(
        mr.block().exclusive(Duration::ZERO).map(|_| ()),
        Ok(())
    ));
    // Raw memory never yields a slice.
    let mut v = vec![0u8; 8];
    // SAFETY: `v` outlives the block and is not touched while it lives.
    let raw = unsafe { MemBlock::from_raw(v.as_mut_ptr(), 8) }.unwrap();
    assert_eq!(
        raw.exclusive(Duration::ZERO).map(|_| ()),
        Err(MemError::NotOwned)
    );
}

// ------------------------------------------------------------------------------------------
// Keys
// ------------------------------------------------------------------------------------------

#[test]
fn keys_are_distinct_recoverable_nonzero_and_not_sequential() {
    const N: u32 = 10_000;
    let mut rng = rand::rng();
    let indices: Vec<u32> = (0..N).map(|i| i * 97 % (MAX_KEY_INDEX + 1)).collect();
    let lkeys: Vec<u32> = indices
        .iter()
        .map(|&i| make_key(i, &mut rng).unwrap())
        .collect();
    let rkeys: Vec<u32> = indices
        .iter()
        .map(|&i| make_key(i, &mut rng).unwrap())
        .collect();
    assert_eq!(lkeys.iter().collect::<HashSet<_>>().len(), N as usize);
    for ((&i, &l), &r) in indices.iter().zip(&lkeys).zip(&rkeys) {
        assert_ne!(l, 0);
        assert_ne!(r, 0);
        assert_eq!(key_index(l), i);
        assert_eq!(key_index(r), i);
    }
    // The random part varies: 12 random bits give ~3700 distinct values in 10 000 draws.
    let randoms: HashSet<u32> = lkeys.iter().map(|k| k & 0xFFF).collect();
    assert!(
        randoms.len() > 3_000,
        "only {} distinct random parts",
        randoms.len()
    );
    // Keys of consecutive slots do not form an arithmetic sequence.
    let seq: Vec<u32> = (0..1000).map(|i| make_key(i, &mut rng).unwrap()).collect();
    let steps: HashSet<i64> = seq
        .windows(2)
        .map(|w| i64::from(w[1]) - i64::from(w[0]))
        .collect();
    assert!(steps.len() > 500, "only {} distinct steps", steps.len());
    // L_Key and R_Key are independent draws: they coincide only by chance (~1/4095).
    let same = lkeys.iter().zip(&rkeys).filter(|(l, r)| l == r).count();
    assert!(same < 30, "{same} of {N} lkey/rkey pairs are equal");
    // Index 0 is fine, and repeated draws for one slot differ.
    let zeros: HashSet<u32> = (0..200).map(|_| make_key(0, &mut rng).unwrap()).collect();
    assert!(zeros.len() > 150);
    assert!(!zeros.contains(&0));
}
