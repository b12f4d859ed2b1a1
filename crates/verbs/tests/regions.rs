//! Memory regions as objects: key-table publication, lookup by key, deregistration with
//! in-flight references (the MR checks themselves are in mr_checks.rs).

mod common;

use std::time::Duration;

use common::*;
use uroce_verbs::mr::key_index;
use uroce_verbs::{AccessFlags, MemBlock};

#[test]
fn registered_region_is_found_by_both_keys() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd
        .reg_mr(
            MemBlock::from_slice(b"hello, region!").expect("block"),
            access,
        )
        .expect("reg");
    let other = pd
        .reg_mr(MemBlock::new(8).expect("block"), AccessFlags::empty())
        .expect("reg");
    assert_ne!(
        key_index(mr.lkey()),
        key_index(other.lkey()),
        "distinct table slots"
    );
    assert_eq!(
        key_index(mr.lkey()),
        key_index(mr.rkey()),
        "both keys name one slot"
    );
    assert_eq!(pd.children().mrs, 2);

    let by_l = ctx.mr_for_key(mr.lkey()).expect("lkey lookup");
    let by_r = ctx.mr_for_key(mr.rkey()).expect("rkey lookup");
    assert!(by_l.same_region(&by_r));
    assert_eq!(by_l.pd_id(), pd.id());
    // A key with the right index but a wrong random part names nothing.
    let forged = mr.rkey() ^ 1;
    if forged != mr.lkey() {
        assert!(ctx.mr_for_key(forged).is_none());
    }
    // The transport reads through the lookup result with the usual checks.
    let mut buf = [0u8; 5];
    by_r.remote_read(pd.id(), mr.rkey(), mr.iova() + 7, &mut buf)
        .expect("remote read");
    assert_eq!(&buf, b"regio");
    assert!(
        by_r.remote_read(pd.id() + 1, mr.rkey(), mr.iova(), &mut buf)
            .is_err(),
        "another PD's QP is refused"
    );
    drop((by_l, by_r));
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    mr.destroy().expect("dereg");
    assert!(ctx.mr_for_key(lkey).is_none());
    assert!(ctx.mr_for_key(rkey).is_none());
    assert_eq!(
        ctx.counters().unknown_key_lookups,
        2 + u64::from(forged != lkey)
    );
    other.destroy().expect("dereg");
    assert_eq!(ctx.table_sizes().2, 0, "key indices released");
    pd.destroy().expect("pd");
}

#[test]
fn dereg_with_a_reference_in_flight_retires_the_memory() {
    let ctx = context();
    ctx.set_destroy_timeout(Duration::from_millis(20));
    let pd = ctx.alloc_pd().expect("pd");
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd
        .reg_mr(MemBlock::new(64).expect("block"), access)
        .expect("reg");
    let (rkey, iova) = (mr.rkey(), mr.iova());
    let stale = ctx.mr_for_key(rkey).expect("lookup");
    assert_eq!(mr.ref_count(), 3, "handle + table + lookup");
    // Deregistration does not wait for the stale reference forever: it retires the memory.
    mr.destroy().expect("dereg succeeds");
    assert!(ctx.mr_for_key(rkey).is_none(), "unpublished");
    assert!(stale.block().is_retired());
    assert!(
        stale.remote_write(pd.id(), rkey, iova, &[1, 2, 3]).is_err(),
        "memory is never touched after dereg returned"
    );
    assert_eq!(
        ctx.table_sizes().2,
        1,
        "the index stays reserved while referenced"
    );
    assert_eq!(pd.children().mrs, 1);
    drop(stale);
    assert_eq!(ctx.table_sizes().2, 0, "released with the last reference");
    assert_eq!(pd.children().mrs, 0);
    pd.destroy().expect("pd");
}

#[test]
fn invalid_registrations_are_refused_and_leave_nothing() {
    let ctx = context();
    let pd = ctx.alloc_pd().expect("pd");
    // REMOTE_WRITE without LOCAL_WRITE is invalid (IBA; EINVAL in verbs).
    assert!(pd
        .reg_mr(MemBlock::new(8).expect("block"), AccessFlags::REMOTE_WRITE)
        .is_err());
    assert_eq!(ctx.table_sizes().2, 0);
    assert_eq!(ctx.live_objects().mrs, 0);
    assert_eq!(pd.children().mrs, 0);
    let zb = pd
        .reg_mr_iova(
            MemBlock::new(16).expect("block"),
            AccessFlags::ZERO_BASED,
            0,
        )
        .expect("zero based");
    assert_eq!(zb.iova(), 0);
}
