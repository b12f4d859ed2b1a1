//! Exported helpers that need no verbs object, or only a context: enum-to-text and rate
//! conversions, the fork-safety calls, P_Key queries, the GID table, `ibv_reg_mr_iova`,
//! `ibv_query_qp_data_in_order`, and the provider-registration entry points that libmlx5
//! and libefa call from their constructors when a program merely links them (perftest).
//!
//! Conventions as in [`crate::context`]: internal `uroce_<name>` symbols renamed by
//! `.symver`, panics caught, `errno` set on failure.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;

use crate::abi::*;
use crate::device::{self, Registry};
use crate::entry::*;
use crate::error::FfiError;

symver!("uroce_ibv_node_type_str", "ibv_node_type_str@@IBVERBS_1.1");
symver!(
    "uroce_ibv_port_state_str",
    "ibv_port_state_str@@IBVERBS_1.1"
);
symver!(
    "uroce_ibv_event_type_str",
    "ibv_event_type_str@@IBVERBS_1.1"
);
symver!("uroce_ibv_rate_to_mult", "ibv_rate_to_mult@@IBVERBS_1.0");
symver!("uroce_mult_to_ibv_rate", "mult_to_ibv_rate@@IBVERBS_1.0");
symver!("uroce_ibv_rate_to_mbps", "ibv_rate_to_mbps@@IBVERBS_1.1");
symver!("uroce_mbps_to_ibv_rate", "mbps_to_ibv_rate@@IBVERBS_1.1");
symver!("uroce_ibv_fork_init", "ibv_fork_init@@IBVERBS_1.1");
symver!(
    "uroce_ibv_is_fork_initialized",
    "ibv_is_fork_initialized@@IBVERBS_1.13"
);
symver!(
    "uroce_ibv_dontfork_range",
    "ibv_dontfork_range@@IBVERBS_1.1"
);
symver!("uroce_ibv_dofork_range", "ibv_dofork_range@@IBVERBS_1.1");
symver!(
    "uroce_ibv_get_sysfs_path",
    "ibv_get_sysfs_path@@IBVERBS_1.0"
);
symver!("uroce_ibv_query_pkey", "ibv_query_pkey@@IBVERBS_1.1");
symver!(
    "uroce_ibv_get_pkey_index",
    "ibv_get_pkey_index@@IBVERBS_1.5"
);
symver!(
    "uroce__ibv_query_gid_table",
    "_ibv_query_gid_table@@IBVERBS_1.11"
);
symver!("uroce_ibv_reg_mr_iova", "ibv_reg_mr_iova@@IBVERBS_1.7");
symver!(
    "uroce_ibv_query_qp_data_in_order",
    "ibv_query_qp_data_in_order@@IBVERBS_1.14"
);
symver!(
    "uroce_ibv_register_driver",
    "ibv_register_driver@IBVERBS_1.1"
);
symver!(
    "uroce_verbs_register_driver_34",
    "verbs_register_driver_34@@IBVERBS_PRIVATE_34"
);
symver!(
    "uroce_verbs_allow_disassociate_destroy",
    "verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"
);

/// Text for values outside a table.
const UNKNOWN: &CStr = c"unknown";

/// Looks `v` up in `table`, "unknown" when out of range.
fn text(table: &[&'static CStr], v: c_int) -> *const c_char {
    usize::try_from(v)
        .ok()
        .and_then(|i| table.get(i))
        .map_or(UNKNOWN.as_ptr(), |s| s.as_ptr())
}

/// `enum ibv_node_type` names, indexed by value (`IBV_NODE_CA` = 1 … `IBV_NODE_UNSPECIFIED`).
const NODE_TYPE_STR: [&CStr; 8] = [
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

/// `enum ibv_port_state` names, indexed by value (`IBV_PORT_NOP` = 0 … `ACTIVE_DEFER` = 5).
const PORT_STATE_STR: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

/// `enum ibv_event_type` descriptions, indexed by value (`IBV_EVENT_CQ_ERR` = 0 …
/// `IBV_EVENT_WQ_FATAL` = 19).
const EVENT_TYPE_STR: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// `ibv_node_type_str(type)`: a static name ("unknown" for unknown values).
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_node_type_str(node_type: c_int) -> *const c_char {
    guard(UNKNOWN.as_ptr(), || text(&NODE_TYPE_STR, node_type))
}

/// `ibv_port_state_str(state)`: a static name ("unknown" for unknown values).
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_port_state_str(state: c_int) -> *const c_char {
    guard(UNKNOWN.as_ptr(), || text(&PORT_STATE_STR, state))
}

/// `ibv_event_type_str(event)`: a static description ("unknown" for unknown values).
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_event_type_str(event: c_int) -> *const c_char {
    guard(UNKNOWN.as_ptr(), || text(&EVENT_TYPE_STR, event))
}

/// `(enum ibv_rate, Mbit/s)` for every static rate of IBA (`IBV_RATE_2_5_GBPS` = 2 …
/// `IBV_RATE_1200_GBPS` = 24). The multiple of 2.5 Gbit/s is `Mbit/s / 2500` where that
/// is whole.
const RATES: [(c_int, c_int); 23] = [
    (2, 2_500),
    (5, 5_000),
    (3, 10_000),
    (6, 20_000),
    (4, 30_000),
    (7, 40_000),
    (8, 60_000),
    (9, 80_000),
    (10, 120_000),
    (11, 14_062),
    (12, 56_250),
    (13, 112_500),
    (14, 168_750),
    (15, 25_781),
    (16, 103_125),
    (17, 206_250),
    (18, 309_375),
    (19, 28_125),
    (20, 53_125),
    (21, 425_000),
    (22, 637_500),
    (23, 850_000),
    (24, 1_275_000),
];

/// The rates that are whole multiples of 2.5 Gbit/s: `(enum ibv_rate, multiple)`. The
/// FDR/EDR/HDR-era rates (14, 25, 56, 100, … Gbit/s lanes with 64b/66b coding) are not.
const MULTS: [(c_int, c_int); 15] = [
    (2, 1),
    (5, 2),
    (3, 4),
    (6, 8),
    (4, 12),
    (7, 16),
    (8, 24),
    (9, 32),
    (10, 48),
    (19, 11),
    (20, 20),
    (21, 160),
    (22, 240),
    (23, 320),
    (24, 480),
];

/// `ibv_rate_to_mult(rate)`: the rate as a multiple of 2.5 Gbit/s; -1 when it is not one,
/// for `IBV_RATE_MAX` and for unknown values.
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_rate_to_mult(rate: c_int) -> c_int {
    guard(-1, || {
        MULTS
            .iter()
            .find(|&&(r, _)| r == rate)
            .map_or(-1, |&(_, m)| m)
    })
}

/// `mult_to_ibv_rate(mult)`: the `enum ibv_rate` for a multiple of 2.5 Gbit/s;
/// `IBV_RATE_MAX` (0) when there is none.
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_mult_to_ibv_rate(mult: c_int) -> c_int {
    guard(0, || {
        MULTS
            .iter()
            .find(|&&(_, m)| m == mult)
            .map_or(0, |&(r, _)| r)
    })
}

/// `ibv_rate_to_mbps(rate)`: the rate in Mbit/s; -1 for `IBV_RATE_MAX` and unknown values.
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_rate_to_mbps(rate: c_int) -> c_int {
    guard(-1, || {
        RATES
            .iter()
            .find(|&&(r, _)| r == rate)
            .map_or(-1, |&(_, m)| m)
    })
}

/// `mbps_to_ibv_rate(mbps)`: the `enum ibv_rate` of exactly `mbps` Mbit/s; `IBV_RATE_MAX`
/// (0) when there is none.
///
/// # Safety
/// None: no pointer argument.
#[no_mangle]
pub unsafe extern "C" fn uroce_mbps_to_ibv_rate(mbps: c_int) -> c_int {
    guard(0, || {
        RATES
            .iter()
            .find(|&&(_, m)| m == mbps)
            .map_or(0, |&(r, _)| r)
    })
}

/// `enum ibv_fork_status` value: fork protection is not needed.
const IBV_FORK_UNNEEDED: c_int = 2;

/// `ibv_fork_init()`: 0. uroce reads and writes registered memory with ordinary loads
/// and stores from its own threads; no device DMA depends on the pages staying put, so a
/// `fork` cannot corrupt RDMA traffic (the child has no usable verbs objects).
///
/// # Safety
/// None.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized()`: `IBV_FORK_UNNEEDED` (see [`uroce_ibv_fork_init`]).
///
/// # Safety
/// None.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range(base, size)`: 0, nothing to do (see [`uroce_ibv_fork_init`]).
///
/// # Safety
/// None: the range is not touched.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range(base, size)`: 0, nothing to undo (see [`uroce_ibv_fork_init`]).
///
/// # Safety
/// None: the range is not touched.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_get_sysfs_path()`: `SYSFS_PATH` without trailing slashes, else "/sys", as
/// rdma-core's (see [`crate::sysfs::sysfs_path`]); the string lives as long as the process.
///
/// # Safety
/// None.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_get_sysfs_path() -> *const c_char {
    guard(c"/sys".as_ptr(), || crate::sysfs::sysfs_path().as_ptr())
}

/// The default, full-membership P_Key: entry 0 of the port's P_Key table, the only one
/// set (the other entries of the `pkey_tbl_len` table read as 0, the invalid key).
const DEFAULT_PKEY: u16 = 0xffff;

/// The port's P_Key table length, after checking the context and port (port 1 only).
fn pkey_table_len(context: *mut ibv_context, port_num: u8) -> Result<u16, FfiError> {
    let net = Registry::net(context)?;
    device::port_attr(&net, port_num).map(|p| p.pkey_tbl_len)
}

/// `ibv_query_pkey(context, port, index, pkey)`: entry `index` of the port's P_Key table
/// in network byte order (`__be16`): 0xffff at index 0, 0 (the invalid key) elsewhere; 0,
/// or -1 + `errno` `EINVAL` for a bad context, port, index or NULL output.
///
/// # Safety
/// `pkey` is NULL or points to a writable `__be16`.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        minus_one(pkey_table_len(context, port_num).and_then(|len| {
            if pkey.is_null() || index < 0 || index >= c_int::from(len) {
                return Err(FfiError::Invalid("P_Key index or output"));
            }
            let key = if index == 0 { DEFAULT_PKEY } else { 0 };
            // SAFETY: `pkey` is non-NULL and writable (caller guarantee).
            unsafe { pkey.write(key.to_be()) };
            Ok(())
        }))
    })
}

/// `ibv_get_pkey_index(context, port, pkey)`: the table index of `pkey` (given as
/// `__be16`), 0 for the default key; otherwise a negative errno (`-EINVAL` for a bad
/// context or port, `-ENOENT` for a key not in the table), as rdma-core returns it.
///
/// # Safety
/// None beyond the C contract: foreign handles are rejected.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard(-libc::EIO, || match pkey_table_len(context, port_num) {
        Err(e) => {
            crate::entry::report(&e);
            set_errno(e.errno());
            -e.errno()
        }
        Ok(_) if u16::from_be(pkey) == DEFAULT_PKEY => 0,
        Ok(_) => {
            set_errno(libc::ENOENT);
            -libc::ENOENT
        }
    })
}

/// `_ibv_query_gid_table(context, entries, max_entries, flags, entry_size)` (behind the
/// header's `ibv_query_gid_table`): writes the non-empty GID entries of every port, each
/// `entry_size` bytes apart, and returns how many; a negative errno on failure (`-EINVAL`
/// for non-zero flags, an `entry_size` below 32, a NULL array, a bad context, and — as
/// rdma-core and the kernel's uverbs report it — when `max_entries` is too small for the
/// table, 0 included).
///
/// # Safety
/// `entries` is valid for writing `max_entries * entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn uroce__ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    let fail = |e: FfiError| {
        crate::entry::report(&e);
        set_errno(e.errno());
        -(e.errno() as isize)
    };
    guard(-(libc::EIO as isize), || {
        if flags != 0 {
            return fail(FfiError::Invalid("ibv_query_gid_table: flags is not 0"));
        }
        if entry_size < size_of::<ibv_gid_entry>() {
            return fail(FfiError::Invalid(
                "ibv_query_gid_table: entry_size is below sizeof(struct ibv_gid_entry)",
            ));
        }
        if entries.is_null() {
            return fail(FfiError::Invalid("ibv_query_gid_table: entries is NULL"));
        }
        let net = match Registry::net(context) {
            Ok(n) => n,
            Err(e) => return fail(e),
        };
        let port_count = device::device_attr(&net).phys_port_cnt;
        let mut written = 0usize;
        for port in 1..=port_count {
            let len = match device::port_attr(&net, port) {
                Ok(p) => p.gid_tbl_len,
                Err(e) => return fail(e),
            };
            for index in 0..u32::try_from(len).unwrap_or(0) {
                let g = match device::gid(&net, port.into(), index.into()) {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(e) => return fail(e),
                };
                if written == max_entries {
                    return fail(FfiError::Invalid(
                        "ibv_query_gid_table: max_entries is smaller than the GID table",
                    ));
                }
                let e = ibv_gid_entry {
                    gid: ibv_gid { raw: g.0 },
                    gid_index: index,
                    port_num: port.into(),
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: crate::sysfs::ndev_ifindex(net.local_addr().ip()),
                };
                // SAFETY: `written < max_entries`, so the entry's bytes lie inside the
                // caller's array of `max_entries * entry_size` bytes; unaligned write
                // because `entry_size` need not be a multiple of the alignment.
                unsafe {
                    entries
                        .cast::<u8>()
                        .add(written * entry_size)
                        .cast::<ibv_gid_entry>()
                        .write_unaligned(e)
                };
                written += 1;
            }
        }
        written as isize
    })
}

/// `ibv_reg_mr_iova(pd, addr, length, iova, access)` (IBVERBS_1.7): `ibv_reg_mr_iova2`
/// with an `int` access mask.
///
/// # Safety
/// As `ibv_reg_mr_iova2`: `[addr, addr + length)` stays allocated until the MR is
/// deregistered.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded caller guarantee.
    unsafe { crate::mr::reg_mr_iova(pd, addr, length, iova, access) }
}

/// `ibv_query_qp_data_in_order(qp, op, flags)`: 0 (not guaranteed) for every QP and
/// operation. The answer 1 would let an application poll the last byte of an RDMA WRITE
/// to learn that the whole message is in memory. IBA orders the packets of a message
/// (PSN order) and uroce's RC responder does place them strictly in that order (an
/// out-of-order packet is dropped and NAKed, a duplicate is acknowledged and not written
/// again), but the bytes of one packet are copied with `memcpy`, which promises no store
/// order (overlapping head/tail stores for short copies; fast-string stores that may
/// become visible out of order on x86), and IBA defines the memory contents only once the
/// operation has completed. So uroce does not claim in-order placement.
///
/// # Safety
/// None: the QP is not dereferenced.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_query_qp_data_in_order(
    _qp: *mut c_void,
    _op: c_int,
    _flags: u32,
) -> c_int {
    0
}

/// `ibv_register_driver(name, init_func)` (the pre-34 provider interface): ignored. uroce
/// is its own device; hardware providers are never loaded.
///
/// # Safety
/// None: the arguments are not touched.
#[no_mangle]
pub unsafe extern "C" fn uroce_ibv_register_driver(_name: *const c_char, _init: *const c_void) {}

/// `verbs_register_driver_34(ops)`: ignored. libmlx5 and libefa call it from their ELF
/// constructors when a program links them (perftest does), before `main`; it must neither
/// fail nor print. uroce never loads providers, so their devices never appear.
///
/// # Safety
/// None: the argument is not touched.
#[no_mangle]
pub unsafe extern "C" fn uroce_verbs_register_driver_34(_ops: *const c_void) {}

/// `bool verbs_allow_disassociate_destroy` (a data symbol providers read): false.
#[no_mangle]
pub static uroce_verbs_allow_disassociate_destroy: bool = false;
