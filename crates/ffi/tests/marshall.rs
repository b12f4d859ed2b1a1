//! The kernel-ABI marshalling helpers of `uroce_ffi::marshall`:
//!
//! * layout: a C program compiled against `<rdma/ib_user_verbs.h>`, `<rdma/ib_user_sa.h>`
//!   and `<infiniband/sa.h>` prints `sizeof`/`_Alignof` of the five structs and
//!   `offsetof`/`sizeof` of each of their fields, compared with the Rust mirrors;
//! * behaviour: kernel-side structs filled with distinct values go through the Rust
//!   functions, and every user-side field is checked against what the headers' field
//!   meanings say (host-order values copied, big-endian fields kept byte for byte, C's
//!   integer conversions between `__u32`, `int` and `uint8_t`); path records round-trip;
//!   NULL pointers do nothing;
//! * the C caller's view: a C program that calls the four public names on random inputs
//!   runs against the installed rdma-core 44 `libibverbs.so.1` (the reference behaviour),
//!   and against the built library once `libibverbs.map` exports the names; every field
//!   of its results must equal what the Rust functions give for the same input.
//!
//! The C parts need a C compiler (`$CC`, else `cc`) and the Debian package
//! `libibverbs-dev`; without them they are skipped, or fail under `UROCE_REQUIRE_TOOLS=1`.

mod support;

use std::fmt::Write as _;
use std::mem::{size_of, MaybeUninit};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::{compile_source, run_numbered};
use uroce_ffi::abi::*;
use uroce_ffi::marshall::*;
use uroce_testkit::{run, skip, Rng, TempFile};

// ---------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------

/// Byte every destination is filled with before a call, so that a field left unwritten
/// is visible.
const FILL: u8 = 0xa5;

/// A `T` whose bytes are all `byte`. Only used for the plain-data structs of this test,
/// for which every bit pattern is a valid value.
fn filled<T>(byte: u8) -> T {
    let mut v = MaybeUninit::<T>::uninit();
    // SAFETY: writes size_of::<T>() bytes into the owned, uninitialised value; every type
    // used here consists of integers, byte arrays and unions of them, so any bytes form a
    // valid value.
    unsafe {
        v.as_mut_ptr().write_bytes(byte, 1);
        v.assume_init()
    }
}

/// A `T` made of `bytes` (exactly `size_of::<T>()` of them); plain-data types only.
fn from_bytes<T>(bytes: &[u8]) -> T {
    assert_eq!(
        bytes.len(),
        size_of::<T>(),
        "byte count for {}",
        std::any::type_name::<T>()
    );
    // SAFETY: `bytes` holds size_of::<T>() initialised bytes; `read_unaligned` has no
    // alignment requirement; every bit pattern is a valid value of the plain-data types
    // used here.
    unsafe { bytes.as_ptr().cast::<T>().read_unaligned() }
}

/// The bytes of `v`. Only for the padding-free kernel structs (`ib_uverbs_*`,
/// `ib_user_path_rec`: their sizes equal the sum of their fields', as the layout test
/// proves), whose every byte belongs to an initialised field.
fn bytes_of<T>(v: &T) -> Vec<u8> {
    // SAFETY: `v` is a live value of size_of::<T>() bytes, all of them field bytes (no
    // padding), hence initialised.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()).to_vec() }
}

/// Raw, 8-aligned storage for one destination struct, so that "no byte was written" can
/// be checked on padding bytes too.
#[repr(C, align(8))]
struct Raw<const N: usize>([u8; N]);

/// `n` bytes counting up from `first` (wrapping), so that every multi-byte field of a
/// struct filled with them has a value no other field has.
fn counting(first: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| first.wrapping_add(i as u8)).collect()
}

/// The 16 bytes of a GID.
fn gid_bytes(g: &ibv_gid) -> [u8; 16] {
    // SAFETY: `raw` covers the whole union and every bit pattern is a valid byte array.
    unsafe { g.raw }
}

/// Named field values of a struct, for comparisons that report the field.
type Fields = Vec<(&'static str, u128)>;

/// A field value widened for [`Fields`].
trait Val {
    fn val(&self) -> u128;
}
impl Val for u8 {
    fn val(&self) -> u128 {
        u128::from(*self)
    }
}
impl Val for u16 {
    fn val(&self) -> u128 {
        u128::from(*self)
    }
}
impl Val for u32 {
    fn val(&self) -> u128 {
        u128::from(*self)
    }
}
impl Val for i32 {
    fn val(&self) -> u128 {
        u128::from(*self as u32)
    }
}
impl Val for [u8; 16] {
    fn val(&self) -> u128 {
        u128::from_be_bytes(*self)
    }
}
impl Val for ibv_gid {
    fn val(&self) -> u128 {
        u128::from_be_bytes(gid_bytes(self))
    }
}

/// `vals!(x; a, b.c)`: `[("a", x.a), ("b.c", x.b.c)]` as [`Fields`].
macro_rules! vals {
    ($x:expr; $($($p:ident).+),+ $(,)?) => {
        vec![$((stringify!($($p).+), Val::val(&$x.$($p).+))),+]
    };
}

fn ah_fields(a: &ibv_ah_attr) -> Fields {
    vals!(a; grh.dgid, grh.flow_label, grh.sgid_index, grh.hop_limit, grh.traffic_class,
        dlid, sl, src_path_bits, static_rate, is_global, port_num)
}

fn qp_fields(q: &ibv_qp_attr) -> Fields {
    let mut f = vals!(q; qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
        sq_psn, dest_qp_num, qp_access_flags, cap.max_send_wr, cap.max_recv_wr,
        cap.max_send_sge, cap.max_recv_sge, cap.max_inline_data, pkey_index, alt_pkey_index,
        en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
        port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit);
    f.extend(ah_fields(&q.ah_attr));
    f.extend(ah_fields(&q.alt_ah_attr));
    f
}

fn sa_fields(p: &ibv_sa_path_rec) -> Fields {
    vals!(p; dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
        reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
        packet_life_time_selector, packet_life_time, preference)
}

/// Differences between two field lists of the same struct, as readable lines.
fn diff(what: &str, got: &Fields, want: &Fields) -> Vec<String> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g.1 != w.1)
        .map(|(i, (g, w))| {
            // Fields past the first address vector of qp_fields repeat names; the index
            // disambiguates.
            format!(
                "{what}: field #{i} {}: got {:#x}, want {:#x}",
                g.0, g.1, w.1
            )
        })
        .collect()
}

fn qp_from_kern(k: &ib_uverbs_qp_attr) -> ibv_qp_attr {
    qp_from_kern_over(k, FILL)
}

/// [`qp_from_kern`] into a destination filled with `fill`.
fn qp_from_kern_over(k: &ib_uverbs_qp_attr, fill: u8) -> ibv_qp_attr {
    let mut u: ibv_qp_attr = filled(fill);
    // SAFETY: both pointers are to live, properly typed values.
    unsafe { uroce_ibv_copy_qp_attr_from_kern(&mut u, k) };
    u
}

fn ah_from_kern(k: &ib_uverbs_ah_attr) -> ibv_ah_attr {
    ah_from_kern_over(k, FILL)
}

/// [`ah_from_kern`] into a destination filled with `fill`.
fn ah_from_kern_over(k: &ib_uverbs_ah_attr, fill: u8) -> ibv_ah_attr {
    let mut u: ibv_ah_attr = filled(fill);
    // SAFETY: both pointers are to live, properly typed values.
    unsafe { uroce_ibv_copy_ah_attr_from_kern(&mut u, k) };
    u
}

fn path_from_kern(k: &ib_user_path_rec) -> ibv_sa_path_rec {
    path_from_kern_over(k, FILL)
}

/// [`path_from_kern`] into a destination filled with `fill`.
fn path_from_kern_over(k: &ib_user_path_rec, fill: u8) -> ibv_sa_path_rec {
    let mut u: ibv_sa_path_rec = filled(fill);
    // SAFETY: both pointers are to live, properly typed values.
    unsafe { uroce_ibv_copy_path_rec_from_kern(&mut u, k) };
    u
}

fn path_to_kern(u: &ibv_sa_path_rec) -> ib_user_path_rec {
    path_to_kern_over(u, FILL)
}

/// [`path_to_kern`] into a destination filled with `fill`.
fn path_to_kern_over(u: &ibv_sa_path_rec, fill: u8) -> ib_user_path_rec {
    let mut k: ib_user_path_rec = filled(fill);
    // SAFETY: both pointers are to live, properly typed values.
    unsafe { uroce_ibv_copy_path_rec_to_kern(&mut k, u) };
    k
}

// ---------------------------------------------------------------------------------------
// Behaviour, from the headers' field meanings.
// ---------------------------------------------------------------------------------------

/// Checks a user address vector against the kernel one it was made from: every field is
/// host order on both sides (`<rdma/ib_user_verbs.h>`, `<infiniband/verbs.h>`), so each
/// value carries over unchanged, the GID byte for byte.
fn check_ah(what: &str, u: &ibv_ah_attr, k: &ib_uverbs_ah_attr) {
    assert_eq!(gid_bytes(&u.grh.dgid), k.grh.dgid, "{what}.grh.dgid");
    assert_eq!(u.grh.flow_label, k.grh.flow_label, "{what}.grh.flow_label");
    assert_eq!(u.grh.sgid_index, k.grh.sgid_index, "{what}.grh.sgid_index");
    assert_eq!(u.grh.hop_limit, k.grh.hop_limit, "{what}.grh.hop_limit");
    assert_eq!(
        u.grh.traffic_class, k.grh.traffic_class,
        "{what}.grh.traffic_class"
    );
    assert_eq!(u.dlid, k.dlid, "{what}.dlid");
    assert_eq!(u.sl, k.sl, "{what}.sl");
    assert_eq!(u.src_path_bits, k.src_path_bits, "{what}.src_path_bits");
    assert_eq!(u.static_rate, k.static_rate, "{what}.static_rate");
    assert_eq!(u.is_global, k.is_global, "{what}.is_global");
    assert_eq!(u.port_num, k.port_num, "{what}.port_num");
}

#[test]
fn qp_attr_from_kern_copies_every_field() {
    // Counting bytes: every field of the kernel struct has its own value, so a field
    // taken from the wrong place cannot match by accident.
    let k: ib_uverbs_qp_attr = from_bytes(&counting(1, size_of::<ib_uverbs_qp_attr>()));
    // A few fields with meaningful values, written as C would.
    let k = ib_uverbs_qp_attr {
        qp_state: IBV_QPS_RTR,
        cur_qp_state: IBV_QPS_INIT,
        path_mtu: IBV_MTU_1024,
        dest_qp_num: 0x00ab_cdef,
        ah_attr: ib_uverbs_ah_attr {
            dlid: 0xc001,
            is_global: 1,
            ..k.ah_attr
        },
        ..k
    };
    let u = qp_from_kern(&k);

    // The target state is the caller's (the kernel echoes it): not overwritten.
    assert_eq!(u.qp_state, u32::from_ne_bytes([FILL; 4]));
    assert_eq!(u.cur_qp_state, IBV_QPS_INIT);
    assert_eq!(u.path_mtu, IBV_MTU_1024);
    assert_eq!(u.dest_qp_num, 0x00ab_cdef);
    assert_eq!(
        u.ah_attr.dlid, 0xc001,
        "LIDs are host order in both structs"
    );
    assert_eq!(u.ah_attr.is_global, 1);

    assert_eq!(u.path_mig_state, k.path_mig_state);
    assert_eq!(u.qkey, k.qkey);
    assert_eq!(u.rq_psn, k.rq_psn);
    assert_eq!(u.sq_psn, k.sq_psn);
    assert_eq!(u.qp_access_flags, k.qp_access_flags);
    // The kernel's flat ib_qp_cap members land in `cap`.
    assert_eq!(u.cap.max_send_wr, k.max_send_wr);
    assert_eq!(u.cap.max_recv_wr, k.max_recv_wr);
    assert_eq!(u.cap.max_send_sge, k.max_send_sge);
    assert_eq!(u.cap.max_recv_sge, k.max_recv_sge);
    assert_eq!(u.cap.max_inline_data, k.max_inline_data);
    check_ah("ah_attr", &u.ah_attr, &k.ah_attr);
    check_ah("alt_ah_attr", &u.alt_ah_attr, &k.alt_ah_attr);
    assert_eq!(u.pkey_index, k.pkey_index);
    assert_eq!(u.alt_pkey_index, k.alt_pkey_index);
    assert_eq!(u.en_sqd_async_notify, k.en_sqd_async_notify);
    assert_eq!(u.sq_draining, k.sq_draining);
    assert_eq!(u.max_rd_atomic, k.max_rd_atomic);
    assert_eq!(u.max_dest_rd_atomic, k.max_dest_rd_atomic);
    assert_eq!(u.min_rnr_timer, k.min_rnr_timer);
    assert_eq!(u.port_num, k.port_num);
    assert_eq!(u.timeout, k.timeout);
    assert_eq!(u.retry_cnt, k.retry_cnt);
    assert_eq!(u.rnr_retry, k.rnr_retry);
    assert_eq!(u.alt_port_num, k.alt_port_num);
    assert_eq!(u.alt_timeout, k.alt_timeout);
    // The kernel struct carries no rate limit: the caller's value stays.
    assert_eq!(u.rate_limit, u32::from_ne_bytes([FILL; 4]));

    // Every other field is written: a destination filled differently gives the same
    // values, qp_state and rate_limit aside.
    let mut over = qp_fields(&qp_from_kern_over(&k, 0x3c));
    let mut want = qp_fields(&u);
    for f in [&mut over, &mut want] {
        f.retain(|(n, _)| *n != "rate_limit" && *n != "qp_state");
    }
    assert!(
        diff("fill", &over, &want).is_empty(),
        "{:?}",
        diff("fill", &over, &want)
    );

    // The mask is not a field of ibv_qp_attr: changing it (or the reserved bytes)
    // changes nothing.
    let other = ib_uverbs_qp_attr {
        qp_attr_mask: !k.qp_attr_mask,
        reserved: [0x5a; 5],
        ..k
    };
    assert!(diff("mask", &qp_fields(&qp_from_kern(&other)), &qp_fields(&u)).is_empty());
}

#[test]
fn ah_attr_from_kern_copies_every_field() {
    let k: ib_uverbs_ah_attr = from_bytes(&counting(0x40, size_of::<ib_uverbs_ah_attr>()));
    let k = ib_uverbs_ah_attr {
        grh: ib_uverbs_global_route {
            // fe80::1, as the bytes of an IPv6 address.
            dgid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            flow_label: 0x000f_ffff,
            ..k.grh
        },
        static_rate: 7,
        ..k
    };
    let u = ah_from_kern(&k);
    assert_eq!(
        gid_bytes(&u.grh.dgid),
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    );
    assert_eq!(
        u.grh.flow_label, 0x000f_ffff,
        "flow label is host order both sides"
    );
    assert_eq!(u.static_rate, 7);
    check_ah("ah_attr", &u, &k);
    // Every field is written, whatever the destination held.
    assert!(diff(
        "fill",
        &ah_fields(&ah_from_kern_over(&k, 0x3c)),
        &ah_fields(&u)
    )
    .is_empty());

    // The reserved bytes are not read.
    let other = ib_uverbs_ah_attr {
        reserved: !k.reserved,
        grh: ib_uverbs_global_route {
            reserved: !k.grh.reserved,
            ..k.grh
        },
        ..k
    };
    assert!(diff(
        "reserved",
        &ah_fields(&ah_from_kern(&other)),
        &ah_fields(&u)
    )
    .is_empty());
}

#[test]
fn path_rec_from_kern_keeps_network_order_and_converts_widths() {
    let k: ib_user_path_rec = from_bytes(&counting(0x80, size_of::<ib_user_path_rec>()));
    let k = ib_user_path_rec {
        // Big-endian fields, as the kernel stores them: LIDs 0x1234 and 0x0056, flow
        // label 0x000abcde, P_Key 0x8001 (full member of partition 1).
        dlid: 0x1234u16.to_be(),
        slid: 0x0056u16.to_be(),
        flow_label: 0x000a_bcdeu32.to_be(),
        pkey: 0x8001u16.to_be(),
        // Host-order booleans; `int` on the user side.
        raw_traffic: 0xffff_ffff,
        reversible: 1,
        mtu: IBV_MTU_4096,
        ..k
    };
    let u = path_from_kern(&k);

    assert_eq!(gid_bytes(&u.dgid), k.dgid);
    assert_eq!(gid_bytes(&u.sgid), k.sgid);
    // Still network order: the first byte in memory is the most significant one.
    assert_eq!(u.dlid.to_ne_bytes(), [0x12, 0x34]);
    assert_eq!(u.slid.to_ne_bytes(), [0x00, 0x56]);
    assert_eq!(u.flow_label.to_ne_bytes(), [0x00, 0x0a, 0xbc, 0xde]);
    assert_eq!(u.pkey.to_ne_bytes(), [0x80, 0x01]);
    // __u32 0xffffffff assigned to an int is -1 (two's complement).
    assert_eq!(u.raw_traffic, -1);
    assert_eq!(u.reversible, 1);
    assert_eq!(u32::from(u.mtu), IBV_MTU_4096);
    assert_eq!(u.hop_limit, k.hop_limit);
    assert_eq!(u.traffic_class, k.traffic_class);
    assert_eq!(u.numb_path, k.numb_path);
    assert_eq!(u.sl, k.sl);
    assert_eq!(u.mtu_selector, k.mtu_selector);
    assert_eq!(u.rate_selector, k.rate_selector);
    assert_eq!(u.rate, k.rate);
    assert_eq!(u.packet_life_time_selector, k.packet_life_time_selector);
    assert_eq!(u.packet_life_time, k.packet_life_time);
    assert_eq!(u.preference, k.preference);

    // Every field is written, whatever the destination held.
    let d = diff(
        "fill",
        &sa_fields(&path_from_kern_over(&k, 0x3c)),
        &sa_fields(&u),
    );
    assert!(d.is_empty(), "{d:?}");

    // A __u32 MTU assigned to a uint8_t keeps its low byte.
    let wide = ib_user_path_rec {
        mtu: 0x0102_0305,
        ..k
    };
    assert_eq!(path_from_kern(&wide).mtu, 0x05);
}

#[test]
fn path_rec_to_kern_writes_every_field() {
    let mut u: ibv_sa_path_rec = from_bytes(&counting(0x10, size_of::<ibv_sa_path_rec>()));
    u.dlid = 0xbeefu16.to_be();
    u.pkey = 0x7fffu16.to_be();
    u.flow_label = 0x0001_2345u32.to_be();
    u.raw_traffic = -2;
    u.reversible = 0;
    u.mtu = IBV_MTU_256 as u8;
    let k = path_to_kern(&u);

    assert_eq!(k.dgid, gid_bytes(&u.dgid));
    assert_eq!(k.sgid, gid_bytes(&u.sgid));
    assert_eq!(k.dlid.to_ne_bytes(), [0xbe, 0xef]);
    assert_eq!(k.slid, u.slid);
    assert_eq!(k.pkey.to_ne_bytes(), [0x7f, 0xff]);
    assert_eq!(k.flow_label.to_ne_bytes(), [0x00, 0x01, 0x23, 0x45]);
    // int -2 assigned to a __u32 is 2^32 - 2.
    assert_eq!(k.raw_traffic, 0xffff_fffe);
    assert_eq!(k.reversible, 0);
    // The MTU is widened: its upper bytes are zero, not left over from before.
    assert_eq!(k.mtu, IBV_MTU_256);
    assert_eq!(k.hop_limit, u.hop_limit);
    assert_eq!(k.traffic_class, u.traffic_class);
    assert_eq!(k.numb_path, u.numb_path);
    assert_eq!(k.sl, u.sl);
    assert_eq!(k.mtu_selector, u.mtu_selector);
    assert_eq!(k.rate_selector, u.rate_selector);
    assert_eq!(k.rate, u.rate);
    assert_eq!(k.packet_life_time_selector, u.packet_life_time_selector);
    assert_eq!(k.packet_life_time, u.packet_life_time);
    assert_eq!(k.preference, u.preference);
    // Every byte of the (padding-free) kernel record is written: a destination filled
    // differently ends up identical.
    assert_eq!(path_to_kern_over(&u, 0x3c), k);
}

/// A random user path record (padding included, all bytes random).
fn random_sa(rng: &mut Rng) -> ibv_sa_path_rec {
    from_bytes(&rng.bytes(size_of::<ibv_sa_path_rec>()))
}

/// A random kernel path record whose MTU fits the user record's `uint8_t`.
fn random_kern_path(rng: &mut Rng) -> ib_user_path_rec {
    let mut k: ib_user_path_rec = from_bytes(&rng.bytes(size_of::<ib_user_path_rec>()));
    k.mtu &= 0xff;
    k
}

#[test]
fn path_records_round_trip() {
    const ROUNDS: u64 = 2000;
    let mut rng = Rng::new(0x6d61_7273_6861_6c6c);
    for i in 0..ROUNDS {
        // User → kernel → user: every field comes back.
        let u = random_sa(&mut rng);
        let back = path_from_kern(&path_to_kern(&u));
        let d = diff(
            &format!("round {i} user"),
            &sa_fields(&back),
            &sa_fields(&u),
        );
        assert!(d.is_empty(), "{}", d.join("\n"));

        // Kernel → user → kernel: the same 64 bytes (no padding in the kernel record).
        let k = random_kern_path(&mut rng);
        let again = path_to_kern(&path_from_kern(&k));
        assert_eq!(again, k, "round {i} kernel");
    }
}

#[test]
fn null_pointers_are_no_ops() {
    let kq: ib_uverbs_qp_attr = from_bytes(&counting(3, size_of::<ib_uverbs_qp_attr>()));
    let ka: ib_uverbs_ah_attr = from_bytes(&counting(5, size_of::<ib_uverbs_ah_attr>()));
    let kp: ib_user_path_rec = from_bytes(&counting(7, size_of::<ib_user_path_rec>()));
    let up: ibv_sa_path_rec = from_bytes(&counting(9, size_of::<ibv_sa_path_rec>()));
    let mut uq = Raw([FILL; size_of::<ibv_qp_attr>()]);
    let mut ua = Raw([FILL; size_of::<ibv_ah_attr>()]);
    let mut usa = Raw([FILL; size_of::<ibv_sa_path_rec>()]);
    let mut kout = Raw([FILL; size_of::<ib_user_path_rec>()]);
    // SAFETY: every non-NULL pointer is to live, 8-aligned storage of the right size (any
    // bytes are valid for these plain-data structs) or to a value of the right type; the
    // functions must not touch anything when the other pointer is NULL.
    unsafe {
        uroce_ibv_copy_qp_attr_from_kern(uq.0.as_mut_ptr().cast(), std::ptr::null());
        uroce_ibv_copy_qp_attr_from_kern(std::ptr::null_mut(), &kq);
        uroce_ibv_copy_ah_attr_from_kern(ua.0.as_mut_ptr().cast(), std::ptr::null());
        uroce_ibv_copy_ah_attr_from_kern(std::ptr::null_mut(), &ka);
        uroce_ibv_copy_path_rec_from_kern(usa.0.as_mut_ptr().cast(), std::ptr::null());
        uroce_ibv_copy_path_rec_from_kern(std::ptr::null_mut(), &kp);
        uroce_ibv_copy_path_rec_to_kern(kout.0.as_mut_ptr().cast(), std::ptr::null());
        uroce_ibv_copy_path_rec_to_kern(std::ptr::null_mut(), &up);
        uroce_ibv_copy_path_rec_to_kern(std::ptr::null_mut(), std::ptr::null());
    }
    let untouched = |b: &[u8]| b.iter().all(|&x| x == FILL);
    assert!(untouched(&uq.0), "qp_attr written");
    assert!(untouched(&ua.0), "ah_attr written");
    assert!(untouched(&usa.0), "sa_path_rec written");
    assert!(untouched(&kout.0), "user_path_rec written");
    // The sources are unchanged as well.
    assert_eq!(bytes_of(&kq), counting(3, size_of::<ib_uverbs_qp_attr>()));
    assert_eq!(bytes_of(&ka), counting(5, size_of::<ib_uverbs_ah_attr>()));
    assert_eq!(bytes_of(&kp), counting(7, size_of::<ib_user_path_rec>()));
    let d = diff(
        "source",
        &sa_fields(&up),
        &sa_fields(&from_bytes(&counting(9, 64))),
    );
    assert!(d.is_empty(), "{d:?}");
}

// ---------------------------------------------------------------------------------------
// C compilation helpers (shared by the layout and the C-caller tests).
// ---------------------------------------------------------------------------------------

/// The headers both C programs include.
const C_HEADERS: &str = "#include <stdio.h>\n#include <stddef.h>\n#include <stdlib.h>\n\
#include <string.h>\n#include <infiniband/verbs.h>\n#include <infiniband/sa.h>\n\
#include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>\n";

/// Whether a C program including [`C_HEADERS`] (and linked with `libs`) can be built;
/// reports the skip when not.
fn can_compile(test: &str, libs: &[&str]) -> bool {
    let probe = TempFile::new("ffi-marshall-probe", "bin");
    let src = format!("{C_HEADERS}int main(void) {{ return 0; }}\n");
    match compile_source(&src, &probe, libs) {
        Ok(()) => true,
        Err(e) => {
            skip(
                test,
                &format!(
                    "cannot build against <rdma/ib_user_verbs.h>, <rdma/ib_user_sa.h>, \
                     <infiniband/sa.h> {libs:?} (install a C compiler and the Debian \
                     package libibverbs-dev): {e}"
                ),
            );
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// Layout.
// ---------------------------------------------------------------------------------------

/// One layout check: a C expression pair printed by the program and the Rust numbers.
struct Check {
    /// What is checked, for messages.
    what: String,
    /// Two C expressions (`sizeof`/`_Alignof`, or `offsetof`/`sizeof` of the member).
    c: [String; 2],
    /// The Rust values of the same two numbers.
    rust: [usize; 2],
}

/// The size of the field that `_f` points to, found by type inference only (never called).
fn field_size<T, F>(_f: fn(*const T) -> *const F) -> usize {
    size_of::<F>()
}

/// `ty!(struct x)`: size and alignment of a C-named type.
macro_rules! ty {
    ($kw:ident $t:ident) => {{
        let c = concat!(stringify!($kw), " ", stringify!($t));
        Check {
            what: c.to_string(),
            c: [format!("sizeof({c})"), format!("_Alignof({c})")],
            rust: [size_of::<$t>(), core::mem::align_of::<$t>()],
        }
    }};
}

/// `fields! {struct x; a, b.c}`: offset and size of members with identical C and Rust
/// paths.
macro_rules! fields {
    ($kw:ident $t:ident; $($($p:ident).+),+ $(,)?) => {{
        let c = concat!(stringify!($kw), " ", stringify!($t));
        vec![$({
            let path = stringify!($($p).+).replace(' ', "");
            Check {
                what: format!("{c}.{path}"),
                c: [
                    format!("offsetof({c}, {path})"),
                    format!("sizeof((({c} *)0)->{path})"),
                ],
                rust: [
                    core::mem::offset_of!($t, $($p).+),
                    // SAFETY: the closure is never called; it only names the field's type.
                    field_size(|p: *const $t| unsafe { &raw const (*p).$($p).+ }),
                ],
            }
        }),+]
    }};
}

/// Every type and field of `uroce_ffi::marshall`.
fn layout_table() -> Vec<Check> {
    let mut t = vec![ty!(struct ib_uverbs_global_route)];
    t.extend(fields! {struct ib_uverbs_global_route;
        dgid, flow_label, sgid_index, hop_limit, traffic_class, reserved
    });
    t.push(ty!(struct ib_uverbs_ah_attr));
    t.extend(fields! {struct ib_uverbs_ah_attr;
        grh, grh.dgid, grh.flow_label, grh.sgid_index, grh.hop_limit, grh.traffic_class,
        grh.reserved, dlid, sl, src_path_bits, static_rate, is_global, port_num, reserved
    });
    t.push(ty!(struct ib_uverbs_qp_attr));
    t.extend(fields! {struct ib_uverbs_qp_attr;
        qp_attr_mask, qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
        dest_qp_num, qp_access_flags, ah_attr, ah_attr.grh.dgid, ah_attr.dlid,
        ah_attr.port_num, alt_ah_attr, alt_ah_attr.grh.flow_label, alt_ah_attr.reserved,
        max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data, pkey_index,
        alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic,
        min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout,
        reserved
    });
    t.push(ty!(struct ib_user_path_rec));
    t.extend(fields! {struct ib_user_path_rec;
        dgid, sgid, dlid, slid, raw_traffic, flow_label, reversible, mtu, pkey, hop_limit,
        traffic_class, numb_path, sl, mtu_selector, rate_selector, rate,
        packet_life_time_selector, packet_life_time, preference
    });
    t.push(ty!(struct ibv_sa_path_rec));
    t.extend(fields! {struct ibv_sa_path_rec;
        dgid, dgid.raw, sgid, sgid.global.interface_id, dlid, slid, raw_traffic, flow_label,
        hop_limit, traffic_class, reversible, numb_path, pkey, sl, mtu_selector, mtu,
        rate_selector, rate, packet_life_time_selector, packet_life_time, preference
    });
    t
}

#[test]
fn layout_matches_kernel_and_sa_headers() {
    const TEST: &str = "layout_matches_kernel_and_sa_headers";
    if !can_compile(TEST, &[]) {
        return;
    }
    let table = layout_table();
    let mut src = format!("{C_HEADERS}int main(void)\n{{\n");
    for (i, c) in table.iter().enumerate() {
        // `writeln!` into a String cannot fail.
        let _ = writeln!(src, "\tprintf(\"{i} %zu %zu\\n\", {}, {});", c.c[0], c.c[1]);
    }
    src.push_str("\treturn 0;\n}\n");
    let exe = TempFile::new("ffi-marshall-layout", "bin");
    if let Err(e) = compile_source(&src, &exe, &[]) {
        panic!("the generated layout program does not compile (a C name is wrong?): {e}");
    }
    let rows = run_numbered(&exe, table.len());
    let mut errors = Vec::new();
    for (check, &(a, b)) in table.iter().zip(&rows) {
        let nums = [a as usize, b as usize];
        if nums != check.rust {
            errors.push(format!(
                "{}: C {}={} {}={}, Rust {:?}",
                check.what, check.c[0], nums[0], check.c[1], nums[1], check.rust
            ));
        }
    }
    assert!(
        errors.is_empty(),
        "{} of {} checks differ from the headers:\n{}",
        errors.len(),
        table.len(),
        errors.join("\n")
    );
    eprintln!("marshall layout: {} checks match the headers", table.len());
}

// ---------------------------------------------------------------------------------------
// The C caller's view.
// ---------------------------------------------------------------------------------------

/// Reads records `<op byte><source struct bytes>` from the file `argv[1]`, calls the
/// matching public function on a destination filled with 0xa5 and prints the
/// destination's bytes in hex, one line per record. The prototypes are those of rdma-core
/// 44's `<infiniband/marshall.h>` (not shipped by Debian's libibverbs-dev).
const CALLER_C: &str = r#"
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

static void hex(const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

#define CASE(op, S, D, fn)                                      \
	case op: {                                              \
		S s;                                            \
		D d;                                            \
		if (fread(&s, sizeof(s), 1, f) != 1)            \
			return 2;                               \
		memset(&d, 0xa5, sizeof(d));                    \
		fn(&d, &s);                                     \
		hex(&d, sizeof(d));                             \
		break;                                          \
	}

int main(int argc, char **argv)
{
	FILE *f = argc == 2 ? fopen(argv[1], "rb") : NULL;
	int op;
	if (!f)
		return 1;
	for (;;) {
		op = fgetc(f);
		if (op == EOF)
			break;
		switch (op) {
		CASE('q', struct ib_uverbs_qp_attr, struct ibv_qp_attr, ibv_copy_qp_attr_from_kern)
		CASE('a', struct ib_uverbs_ah_attr, struct ibv_ah_attr, ibv_copy_ah_attr_from_kern)
		CASE('f', struct ib_user_path_rec, struct ibv_sa_path_rec, ibv_copy_path_rec_from_kern)
		CASE('t', struct ibv_sa_path_rec, struct ib_user_path_rec, ibv_copy_path_rec_to_kern)
		default:
			return 3;
		}
	}
	return 0;
}
"#;

/// One call of the C program: the operation byte and the source struct's bytes.
struct Case {
    op: u8,
    src: Vec<u8>,
}

/// Random sources for every operation (all bytes random, so every value, negative
/// `int`s and MTUs above 255 included, is exercised).
fn caller_cases() -> Vec<Case> {
    const PER_OP: usize = 64;
    let mut rng = Rng::new(0x00c0_ffee_0bad_cafe);
    let mut cases = Vec::new();
    for _ in 0..PER_OP {
        for (op, n) in [
            (b'q', size_of::<ib_uverbs_qp_attr>()),
            (b'a', size_of::<ib_uverbs_ah_attr>()),
            (b'f', size_of::<ib_user_path_rec>()),
            (b't', size_of::<ibv_sa_path_rec>()),
        ] {
            cases.push(Case {
                op,
                src: rng.bytes(n),
            });
        }
    }
    cases
}

/// Compares one line of the C program's output with the Rust function's result for
/// `case`; returns the differences.
fn compare_case(i: usize, case: &Case, line: &str) -> Vec<String> {
    let got: Vec<u8> = (0..line.len() / 2)
        .map(|j| u8::from_str_radix(&line[2 * j..2 * j + 2], 16).expect("hex output"))
        .collect();
    let what = format!("case {i} op {}", case.op as char);
    match case.op {
        b'q' => diff(
            &what,
            &qp_fields(&from_bytes(&got)),
            &qp_fields(&qp_from_kern(&from_bytes(&case.src))),
        ),
        b'a' => diff(
            &what,
            &ah_fields(&from_bytes(&got)),
            &ah_fields(&ah_from_kern(&from_bytes(&case.src))),
        ),
        b'f' => diff(
            &what,
            &sa_fields(&from_bytes(&got)),
            &sa_fields(&path_from_kern(&from_bytes(&case.src))),
        ),
        b't' => {
            // No padding in the kernel record: all 64 bytes must agree.
            let want = bytes_of(&path_to_kern(&from_bytes(&case.src)));
            if got == want {
                Vec::new()
            } else {
                vec![format!("{what}: got {got:02x?}, want {want:02x?}")]
            }
        }
        _ => unreachable!("unknown op"),
    }
}

/// Runs the caller program (optionally against the library in `lib_dir`) on `cases` and
/// compares each result with the Rust functions'.
fn check_caller(label: &str, exe: &Path, input: &Path, lib_dir: Option<&Path>, cases: &[Case]) {
    let mut cmd = Command::new(exe);
    cmd.arg(input);
    match lib_dir {
        Some(d) => cmd.env("LD_LIBRARY_PATH", d),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    let out = run(cmd, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{label}: {e}"));
    assert!(
        out.status.success(),
        "{label}: caller program failed ({}): {}",
        out.status,
        out.stderr
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        cases.len(),
        "{label}: one output line per case"
    );
    let errors: Vec<String> = cases
        .iter()
        .zip(&lines)
        .enumerate()
        .flat_map(|(i, (c, l))| compare_case(i, c, l))
        .collect();
    assert!(
        errors.is_empty(),
        "{label}: {} fields differ from the Rust functions:\n{}",
        errors.len(),
        errors.join("\n")
    );
    eprintln!(
        "{label}: {} calls agree with the Rust functions",
        cases.len()
    );
}

/// The public names, as `libibverbs.map` lists them once they are exported.
const PUBLIC_NAMES: [&str; 4] = [
    "ibv_copy_qp_attr_from_kern",
    "ibv_copy_ah_attr_from_kern",
    "ibv_copy_path_rec_from_kern",
    "ibv_copy_path_rec_to_kern",
];

#[test]
fn c_callers_see_what_rdma_core_44_gives() {
    const TEST: &str = "c_callers_see_what_rdma_core_44_gives";
    // Linked against the installed libibverbs.so (rdma-core 44): the program binds the
    // versioned public names, as librdmacm does.
    if !can_compile(TEST, &["-libverbs"]) {
        return;
    }
    let exe = TempFile::new("ffi-marshall-caller", "bin");
    if let Err(e) = compile_source(&format!("{C_HEADERS}{CALLER_C}"), &exe, &["-libverbs"]) {
        panic!("the caller program does not compile: {e}");
    }
    let cases = caller_cases();
    let input = TempFile::new("ffi-marshall-input", "bin");
    let bytes: Vec<u8> = cases
        .iter()
        .flat_map(|c| std::iter::once(c.op).chain(c.src.iter().copied()))
        .collect();
    std::fs::write(input.path(), bytes).expect("write input");

    // The reference: rdma-core's own library.
    check_caller("rdma-core 44", exe.path(), input.path(), None, &cases);

    // The built library, once it exports the names.
    let map = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("libibverbs.map"))
        .expect("read libibverbs.map");
    let listed = PUBLIC_NAMES
        .iter()
        .filter(|n| {
            map.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|w| w == **n)
        })
        .count();
    match listed {
        0 => eprintln!(
            "NOTE {TEST}: libibverbs.map does not export the marshalling helpers yet; the \
             built library was not called from C"
        ),
        4 => {
            let dir = support::LibDir::new("marshall");
            check_caller(
                "uroce libibverbs.so.1",
                exe.path(),
                input.path(),
                Some(&dir.0),
                &cases,
            );
        }
        n => panic!("libibverbs.map lists {n} of the 4 marshalling helpers"),
    }
}
