//! `Mr::rereg` (`ibv_rereg_mr`): the same keys in a new PD, with new access rights, over
//! new memory; invalid attributes and a foreign PD leave the region untouched; a late
//! reference to the old region makes the new one take fresh keys (and never sees the new
//! memory).

mod common;

use std::time::Duration;

use common::*;
use uroce_verbs::mr::key_index;
use uroce_verbs::{AccessFlags, MemBlock, ReregMrError};

#[test]
fn rereg_keeps_keys_and_moves_pd_access_and_memory() {
    let ctx = context();
    let (pd1, pd2) = (ctx.alloc_pd().expect("pd"), ctx.alloc_pd().expect("pd"));
    let mr = pd1
        .reg_mr(
            MemBlock::from_slice(b"old memory").expect("block"),
            AccessFlags::LOCAL_WRITE,
        )
        .expect("reg");
    let (lkey, rkey) = (mr.lkey(), mr.rkey());

    // Invalid access (REMOTE_WRITE needs LOCAL_WRITE): nothing changes.
    let mr = match mr.rereg(
        &pd2,
        MemBlock::new(16).expect("block"),
        AccessFlags::REMOTE_WRITE,
        None,
    ) {
        Err(ReregMrError::Invalid(mr, _)) => mr,
        other => panic!("expected Invalid, got {other:?}"),
    };
    assert_eq!((mr.lkey(), mr.rkey(), mr.pd_id()), (lkey, rkey, pd1.id()));
    assert!(ctx.mr_for_key(rkey).is_some(), "still published");

    // A PD of another context: refused, unchanged.
    let other_ctx = context();
    let foreign = other_ctx.alloc_pd().expect("pd");
    let mr = match mr.rereg(
        &foreign,
        MemBlock::new(16).expect("block"),
        AccessFlags::LOCAL_WRITE,
        None,
    ) {
        Err(ReregMrError::ForeignPd(mr)) => mr,
        other => panic!("expected ForeignPd, got {other:?}"),
    };
    assert_eq!(mr.pd_id(), pd1.id());

    // New PD, remote write, new memory: same keys, and the key lookup finds the new region.
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = mr
        .rereg(
            &pd2,
            MemBlock::from_slice(b"new memory!!").expect("block"),
            access,
            None,
        )
        .expect("rereg");
    assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey), "keys kept");
    assert_eq!(mr.pd_id(), pd2.id());
    assert_eq!(mr.access(), access);
    assert_eq!(mr.len(), 12);
    assert_eq!((pd1.children().mrs, pd2.children().mrs), (0, 1));
    let found = ctx.mr_for_key(rkey).expect("published under the old rkey");
    assert!(found.same_region(&mr));
    found
        .remote_write(pd2.id(), rkey, mr.iova(), b"NEW")
        .expect("remote write in the new PD");
    assert!(
        found.remote_write(pd1.id(), rkey, mr.iova(), b"x").is_err(),
        "the old PD's QPs are refused"
    );
    let mut buf = [0u8; 12];
    found.read(mr.iova(), &mut buf).expect("read");
    assert_eq!(&buf, b"NEW memory!!");
    drop(found);
    mr.destroy().expect("dereg");
    assert_eq!(pd2.children().mrs, 0);
    assert!(ctx.mr_for_key(lkey).is_none());
}

#[test]
fn rereg_with_a_late_reference_takes_fresh_keys() {
    let ctx = context();
    ctx.set_destroy_timeout(Duration::from_millis(20));
    let pd = ctx.alloc_pd().expect("pd");
    let mr = pd
        .reg_mr(MemBlock::new(64).expect("block"), AccessFlags::LOCAL_WRITE)
        .expect("reg");
    let (lkey, rkey) = (mr.lkey(), mr.rkey());
    let stale = ctx.mr_for_key(lkey).expect("lookup");
    let mr = mr
        .rereg(
            &pd,
            MemBlock::new(32).expect("block"),
            AccessFlags::LOCAL_WRITE,
            None,
        )
        .expect("rereg");
    assert_ne!(key_index(mr.lkey()), key_index(lkey), "another slot");
    assert_ne!((mr.lkey(), mr.rkey()), (lkey, rkey));
    assert!(stale.block().is_retired(), "the old memory is retired");
    assert!(!stale.same_region(&ctx.mr_for_key(mr.lkey()).expect("new")));
    assert!(ctx.mr_for_key(lkey).is_none());
    assert_eq!(
        pd.children().mrs,
        2,
        "the old region counts until its last reference goes"
    );
    drop(stale);
    assert_eq!(pd.children().mrs, 1);
    mr.destroy().expect("dereg");
}
