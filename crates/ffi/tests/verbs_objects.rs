//! The object and data-path entry points called directly, the way C callers do: PD, MR,
//! completion channel, CQ, SRQ and RC QP life cycles, a UD QP through its attribute sets
//! (Q_Key and SQ PSN read back), UC created, XRC refused (fields of the C structures, destroy
//! order refusals with `EBUSY`, stale and foreign handles with `EINVAL`), two RC QPs of one
//! device connected to each other through the `ibv_context.ops` slots (SEND, INLINE
//! SEND_WITH_IMM, a `bad_wr` chain), a receive taken from an SRQ (`post_srq_recv`, the
//! one-shot limit), a completion event through the channel fd, a QP that went to ERR on its
//! own (`qp->state` refreshed by `ibv_query_qp`), and the unimplemented parts failing with
//! `EOPNOTSUPP`.
//!
//! Expectations come from the verbs ABI (verbs.h values and rules: IBV_WC_RECV = 128,
//! immediate data in network order, REMOTE_WRITE needs LOCAL_WRITE, rdma-core's status
//! strings), not from uroce. Everything runs in one test function: the library's registry
//! is process-wide and configured from `UROCE_ADDR` once.

use std::ffi::{c_int, c_void, CStr};
use std::net::Ipv4Addr;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use uroce_ffi::abi::*;
use uroce_ffi::ah::*;
use uroce_ffi::context::*;
use uroce_ffi::cq::*;
use uroce_ffi::mr::*;
use uroce_ffi::pd::*;
use uroce_ffi::qp::*;
use uroce_ffi::srq::*;

/// A loopback address no other test uses.
const ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 54, 3);
const LEN: usize = 4096;

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A zeroed C structure.
fn zeroed<T>() -> T {
    // SAFETY: only used for the verbs C structures, which are integers, raw pointers and
    // unions of those: all-zero bytes are valid.
    unsafe { std::mem::zeroed() }
}

/// Polls `cq` through the context's `poll_cq` slot until one completion arrives (5 s).
fn poll_one(ctx: *mut ibv_context, cq: *mut ibv_cq) -> ibv_wc {
    // SAFETY: `ctx` is a live context; reading its ops table.
    let poll = unsafe { (*ctx).ops.poll_cq }.expect("poll_cq slot set");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut wc: ibv_wc = zeroed();
    loop {
        // SAFETY: one writable ibv_wc.
        let n = unsafe { poll(cq, 1, &mut wc) };
        assert!(n >= 0, "poll_cq failed");
        if n == 1 {
            return wc;
        }
        assert!(Instant::now() < deadline, "no completion within 5 s");
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Posts one receive of `len` bytes at `addr` through the `post_recv` slot.
fn post_recv(ctx: *mut ibv_context, qp: *mut ibv_qp, wr_id: u64, addr: *mut u8, lkey: u32) {
    let mut sge = ibv_sge {
        addr: addr as u64,
        length: LEN as u32,
        lkey,
    };
    let mut wr = ibv_recv_wr {
        wr_id,
        next: null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad: *mut ibv_recv_wr = null_mut();
    // SAFETY: live context; the WR and its SGE live across the call.
    let rc = unsafe { (*ctx).ops.post_recv.expect("post_recv slot")(qp, &mut wr, &mut bad) };
    assert_eq!(rc, 0, "post_recv");
}

/// Moves `qp` through INIT, RTR and RTS towards `remote_qpn` on this device.
fn connect(qp: *mut ibv_qp, remote_qpn: u32) {
    let mut a: ibv_qp_attr = zeroed();
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    // SAFETY: live QP, readable attr.
    assert_eq!(unsafe { uroce_ibv_modify_qp(qp, &mut a, m as c_int) }, 0);
    // SAFETY: live QP allocated by the library.
    assert_eq!(unsafe { (*qp).state }, IBV_QPS_INIT);

    let mut a: ibv_qp_attr = zeroed();
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = 3; // IBV_MTU_1024
    a.dest_qp_num = remote_qpn;
    a.rq_psn = 0x100;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.grh.dgid = ibv_gid {
        raw: ADDR.to_ipv6_mapped().octets(),
    };
    let m = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    // SAFETY: live QP, readable attr.
    assert_eq!(unsafe { uroce_ibv_modify_qp(qp, &mut a, m as c_int) }, 0);

    let mut a: ibv_qp_attr = zeroed();
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0x100;
    a.max_rd_atomic = 1;
    let m = IBV_QP_STATE
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC;
    // SAFETY: live QP, readable attr.
    assert_eq!(unsafe { uroce_ibv_modify_qp(qp, &mut a, m as c_int) }, 0);
    // SAFETY: live QP allocated by the library.
    assert_eq!(unsafe { (*qp).state }, IBV_QPS_RTS);
}

#[test]
fn verbs_objects_and_data_path_behave_like_rdma_core() {
    // Set before the library reads the environment (the only test in the binary).
    std::env::set_var("UROCE_ADDR", ADDR.to_string());
    std::env::remove_var("UROCE_FAULTS");

    // SAFETY: every call below follows the C contract of the function (live or NULL
    // handles, writable outputs); each block's pointers are checked as it goes.
    unsafe {
        let list = uroce_ibv_get_device_list(null_mut());
        assert!(!list.is_null(), "errno {}", errno());
        let ctx = uroce_ibv_open_device(*list);
        uroce_ibv_free_device_list(list);
        assert!(!ctx.is_null(), "errno {}", errno());

        // --- PD and MRs.
        assert!(uroce_ibv_alloc_pd(null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let pd = uroce_ibv_alloc_pd(ctx);
        assert!(!pd.is_null(), "errno {}", errno());
        assert_eq!((*pd).context, ctx);

        // --- Address handles: real objects under the PD (IBA 11.2.2), validated.
        let mut ah_attr: ibv_ah_attr = std::mem::zeroed();
        ah_attr.is_global = 1;
        ah_attr.port_num = 1;
        ah_attr.grh.hop_limit = 64;
        ah_attr.grh.dgid.raw = Ipv4Addr::new(127, 0, 54, 9).to_ipv6_mapped().octets();
        let ah = uroce_ibv_create_ah(pd, &mut ah_attr);
        assert!(!ah.is_null(), "errno {}", errno());
        assert_eq!(((*ah).context, (*ah).pd), (ctx, pd));
        assert_eq!(
            uroce_ibv_dealloc_pd(pd),
            libc::EBUSY,
            "a PD with an AH is busy"
        );
        let mut bad = ah_attr;
        bad.port_num = 2;
        assert!(
            uroce_ibv_create_ah(pd, &mut bad).is_null(),
            "port 2 does not exist"
        );
        assert_eq!(errno(), libc::EINVAL);
        let mut bad = ah_attr;
        bad.grh.dgid.raw = [0; 16];
        assert!(
            uroce_ibv_create_ah(pd, &mut bad).is_null(),
            "zero destination GID"
        );
        assert_eq!(errno(), libc::EINVAL);
        assert!(uroce_ibv_create_ah(pd, null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(uroce_ibv_destroy_ah(ah), 0);
        assert_eq!(uroce_ibv_destroy_ah(ah), libc::EINVAL, "stale AH");

        let mut buf_a = vec![0u8; LEN];
        let mut buf_b = vec![0u8; LEN];
        let (pa, pb) = (buf_a.as_mut_ptr(), buf_b.as_mut_ptr());
        // REMOTE_WRITE without LOCAL_WRITE is invalid (verbs rule).
        assert!(uroce_ibv_reg_mr(pd, pa.cast(), LEN, IBV_ACCESS_REMOTE_WRITE as c_int).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(uroce_ibv_reg_mr(null_mut(), pa.cast(), LEN, 1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mr_a = uroce_ibv_reg_mr(pd, pa.cast(), LEN, IBV_ACCESS_LOCAL_WRITE as c_int);
        let mr_b = uroce_ibv_reg_mr(pd, pb.cast(), LEN, IBV_ACCESS_LOCAL_WRITE as c_int);
        assert!(!mr_a.is_null() && !mr_b.is_null(), "errno {}", errno());
        assert_eq!((*mr_a).addr, pa.cast::<c_void>());
        assert_eq!((*mr_a).length, LEN);
        assert_eq!((*mr_a).pd, pd);
        assert_eq!((*mr_a).context, ctx);
        assert_ne!((*mr_a).lkey, 0);
        assert_ne!((*mr_a).lkey, (*mr_b).lkey);

        // --- Channel and CQs.
        let ch = uroce_ibv_create_comp_channel(ctx);
        assert!(!ch.is_null(), "errno {}", errno());
        assert!((*ch).fd >= 0);
        let token = 0x5eed_usize as *mut c_void;
        let cq_b = uroce_ibv_create_cq(ctx, 16, token, ch, 0);
        let cq_a = uroce_ibv_create_cq(ctx, 16, null_mut(), null_mut(), 0);
        assert!(!cq_a.is_null() && !cq_b.is_null(), "errno {}", errno());
        assert_eq!((*cq_b).channel, ch);
        assert_eq!((*cq_b).cq_context, token);
        assert!((*cq_b).cqe >= 16);
        assert!(uroce_ibv_create_cq(ctx, -1, null_mut(), null_mut(), 0).is_null());
        assert_eq!(errno(), libc::EINVAL);

        // --- QPs.
        let mut ia = ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: cq_a,
            recv_cq: cq_a,
            srq: null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            qp_type: IBV_QPT_UD,
            sq_sig_all: 0,
        };
        // UD: created, moved through the UD attribute sets (INIT: P_Key index, port,
        // Q_Key; RTR: the state alone, an address vector is a foreign attribute; RTS:
        // SQ PSN), and the Q_Key reported back.
        let ud = uroce_ibv_create_qp(pd, &mut ia);
        assert!(!ud.is_null(), "UD created: errno {}", errno());
        assert_eq!((*ud).qp_type, IBV_QPT_UD);
        let mut a: ibv_qp_attr = zeroed();
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = 0x1111_1111;
        let m = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        assert_eq!(uroce_ibv_modify_qp(ud, &mut a, m as c_int), 0);
        a.qp_state = IBV_QPS_RTR;
        let m_av = IBV_QP_STATE | IBV_QP_AV;
        assert_eq!(
            uroce_ibv_modify_qp(ud, &mut a, m_av as c_int),
            libc::EINVAL,
            "an AV at UD RTR"
        );
        assert_eq!(uroce_ibv_modify_qp(ud, &mut a, IBV_QP_STATE as c_int), 0);
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = 0x00ab_cdef;
        let m = IBV_QP_STATE | IBV_QP_SQ_PSN;
        assert_eq!(uroce_ibv_modify_qp(ud, &mut a, m as c_int), 0);
        let mut qa: ibv_qp_attr = zeroed();
        let mut qi: ibv_qp_init_attr = zeroed();
        assert_eq!(
            uroce_ibv_query_qp(ud, &mut qa, IBV_QP_STATE as c_int, &mut qi),
            0
        );
        assert_eq!(
            (qa.qp_state, qa.qkey, qa.sq_psn),
            (IBV_QPS_RTS, 0x1111_1111, 0x00ab_cdef)
        );
        assert_eq!(qi.qp_type, IBV_QPT_UD);
        assert_eq!(uroce_ibv_destroy_qp(ud), 0);
        // UC and XRC_SEND (its receive CQ ignored) are created too; XRC_RECV needs an
        // XRC domain (`ibv_create_qp_ex`), so `ibv_create_qp` refuses it.
        let caps = ia.cap;
        for t in [IBV_QPT_UC, IBV_QPT_XRC_SEND] {
            ia.qp_type = t;
            ia.cap = caps;
            let q = uroce_ibv_create_qp(pd, &mut ia);
            assert!(!q.is_null(), "type {t} created: errno {}", errno());
            assert_eq!((*q).qp_type, t);
            assert_eq!(uroce_ibv_destroy_qp(q), 0);
        }
        ia.qp_type = IBV_QPT_XRC_RECV;
        assert!(
            uroce_ibv_create_qp(pd, &mut ia).is_null(),
            "XRC_RECV refused"
        );
        assert_eq!(errno(), libc::EOPNOTSUPP, "XRC_RECV");
        // (An XRC_SEND QP reports no receive queue in the granted caps.)
        ia.cap = caps;
        ia.qp_type = IBV_QPT_RC;
        let qp_a = uroce_ibv_create_qp(pd, &mut ia);
        assert!(!qp_a.is_null(), "errno {}", errno());
        assert!(ia.cap.max_send_wr >= 4 && ia.cap.max_inline_data >= 64);
        ia.send_cq = cq_b;
        ia.recv_cq = cq_b;
        let qp_b = uroce_ibv_create_qp(pd, &mut ia);
        assert!(!qp_b.is_null(), "errno {}", errno());
        assert_eq!((*qp_a).state, IBV_QPS_RESET);
        assert_eq!((*qp_a).qp_type, IBV_QPT_RC);
        assert_eq!((*qp_a).pd, pd);
        assert_eq!((*qp_b).send_cq, cq_b);
        assert_ne!((*qp_a).qp_num, (*qp_b).qp_num);
        // The extended QP is the same allocation: `qp_base` is the QP, every op is set.
        let qpx = uroce_ibv_qp_to_qp_ex(qp_a);
        assert_eq!(qpx.cast::<ibv_qp>(), qp_a);
        assert!((*qpx).wr_start.is_some() && (*qpx).wr_complete.is_some());
        assert!((*qpx).wr_atomic_write.is_some(), "refusing ops are set too");
        assert!(uroce_ibv_qp_to_qp_ex(pd.cast()).is_null(), "not a QP");
        assert_eq!(errno(), libc::EINVAL);

        let mut qa: ibv_qp_attr = zeroed();
        let mut qi: ibv_qp_init_attr = zeroed();
        assert_eq!(
            uroce_ibv_query_qp(qp_a, &mut qa, IBV_QP_CAP as c_int, &mut qi),
            0
        );
        assert_eq!(qa.qp_state, IBV_QPS_RESET);
        assert_eq!(qi.qp_type, IBV_QPT_RC);
        assert_eq!(qi.send_cq, cq_a);
        assert!(qi.cap.max_inline_data >= 64);

        // An invalid state is refused and changes nothing.
        let mut bad: ibv_qp_attr = zeroed();
        bad.qp_state = 42;
        assert_eq!(
            uroce_ibv_modify_qp(qp_a, &mut bad, IBV_QP_STATE as c_int),
            libc::EINVAL
        );
        assert_eq!((*qp_a).state, IBV_QPS_RESET);

        connect(qp_a, (*qp_b).qp_num);
        connect(qp_b, (*qp_a).qp_num);

        // --- SEND A → B, B's receive completion announced on the channel.
        post_recv(ctx, qp_b, 7, pb, (*mr_b).lkey);
        let notify = (*ctx).ops.req_notify_cq.expect("req_notify_cq slot");
        assert_eq!(notify(cq_b, 0), 0);
        for (i, b) in buf_a.iter_mut().take(100).enumerate() {
            *b = i as u8 ^ 0xa5;
        }
        let mut sge = ibv_sge {
            addr: pa as u64,
            length: 100,
            lkey: (*mr_a).lkey,
        };
        let mut wr: ibv_send_wr = zeroed();
        wr.wr_id = 11;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        let mut bad_wr: *mut ibv_send_wr = null_mut();
        let post_send = (*ctx).ops.post_send.expect("post_send slot");
        assert_eq!(post_send(qp_a, &mut wr, &mut bad_wr), 0);

        let mut pfd = libc::pollfd {
            fd: (*ch).fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 5000), 1, "channel fd readable");
        let mut ev_cq: *mut ibv_cq = null_mut();
        let mut ev_ctx: *mut c_void = null_mut();
        assert_eq!(uroce_ibv_get_cq_event(ch, &mut ev_cq, &mut ev_ctx), 0);
        assert_eq!(ev_cq, cq_b);
        assert_eq!(ev_ctx, token);

        let wc = poll_one(ctx, cq_b);
        assert_eq!(wc.status, IBV_WC_SUCCESS);
        assert_eq!(wc.opcode, IBV_WC_RECV);
        assert_eq!(wc.wr_id, 7);
        assert_eq!(wc.byte_len, 100);
        assert_eq!(wc.qp_num, (*qp_b).qp_num);
        assert_eq!(buf_b[..100], buf_a[..100]);
        let wc = poll_one(ctx, cq_a);
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id),
            (IBV_WC_SUCCESS, IBV_WC_SEND, 11)
        );
        uroce_ibv_ack_cq_events(cq_b, 1);
        assert_eq!((*cq_b).comp_events_completed, 1);

        // --- INLINE SEND_WITH_IMM: the payload is copied at post time.
        post_recv(ctx, qp_b, 8, pb, (*mr_b).lkey);
        let mut inline_src = *b"inline payload";
        let mut sge = ibv_sge {
            addr: inline_src.as_mut_ptr() as u64,
            length: inline_src.len() as u32,
            lkey: 0,
        };
        let mut wr: ibv_send_wr = zeroed();
        wr.wr_id = 12;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        wr.imm_data = 0x0102_0304u32.to_be();
        assert_eq!(post_send(qp_a, &mut wr, &mut bad_wr), 0);
        inline_src.fill(0);
        let wc = poll_one(ctx, cq_b);
        assert_eq!((wc.status, wc.wr_id), (IBV_WC_SUCCESS, 8));
        assert_ne!(wc.wc_flags & IBV_WC_WITH_IMM, 0);
        assert_eq!(wc.imm_data, 0x0102_0304u32.to_be());
        assert_eq!(&buf_b[..14], b"inline payload");
        assert_eq!(poll_one(ctx, cq_a).wr_id, 12);

        // --- A chain whose second WR is invalid: the first is posted, bad_wr = second.
        post_recv(ctx, qp_b, 9, pb, (*mr_b).lkey);
        let mut sge = ibv_sge {
            addr: pa as u64,
            length: 8,
            lkey: (*mr_a).lkey,
        };
        let mut second: ibv_send_wr = zeroed();
        second.wr_id = 14;
        second.opcode = 99;
        let mut first: ibv_send_wr = zeroed();
        first.wr_id = 13;
        first.sg_list = &mut sge;
        first.num_sge = 1;
        first.opcode = IBV_WR_SEND;
        first.send_flags = IBV_SEND_SIGNALED;
        first.next = &mut second;
        assert_eq!(post_send(qp_a, &mut first, &mut bad_wr), libc::EINVAL);
        assert_eq!(bad_wr, &mut second as *mut ibv_send_wr);
        assert_eq!(poll_one(ctx, cq_a).wr_id, 13);
        assert_eq!(poll_one(ctx, cq_b).wr_id, 9);

        // --- SRQ: sizes, the limit, an RC QP fed by it, post_srq_recv chains.
        let mut sia = ibv_srq_init_attr {
            srq_context: token,
            attr: ibv_srq_attr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        assert!(uroce_ibv_create_srq(null_mut(), &mut sia).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let srq = uroce_ibv_create_srq(pd, &mut sia);
        assert!(!srq.is_null(), "errno {}", errno());
        assert_eq!(((*srq).context, (*srq).pd), (ctx, pd));
        assert_eq!((*srq).srq_context, token);
        assert!(sia.attr.max_wr >= 8 && sia.attr.max_sge >= 1);
        let mut sa: ibv_srq_attr = zeroed();
        assert_eq!(uroce_ibv_query_srq(srq, &mut sa), 0);
        assert!(sa.max_wr >= 8);
        assert_eq!(sa.srq_limit, 0);
        sa.srq_limit = 2;
        assert_eq!(uroce_ibv_modify_srq(srq, &mut sa, IBV_SRQ_LIMIT), 0);
        sa.srq_limit = 1 << 30;
        assert_eq!(
            uroce_ibv_modify_srq(srq, &mut sa, IBV_SRQ_LIMIT),
            libc::EINVAL,
            "a limit above max_wr"
        );
        assert_eq!(uroce_ibv_query_srq(srq, &mut sa), 0);
        assert_eq!(sa.srq_limit, 2);

        ia.qp_type = IBV_QPT_RC;
        ia.srq = srq;
        ia.send_cq = cq_a;
        ia.recv_cq = cq_b;
        let qp_s = uroce_ibv_create_qp(pd, &mut ia);
        assert!(!qp_s.is_null(), "errno {}", errno());
        assert_eq!((*qp_s).srq, srq);
        assert_eq!(ia.cap.max_recv_wr, 0, "no receive queue of its own");
        assert_eq!(
            uroce_ibv_query_qp(qp_s, &mut qa, IBV_QP_CAP as c_int, &mut qi),
            0
        );
        assert_eq!(qi.srq, srq);
        ia.srq = null_mut();
        ia.recv_cq = cq_a;
        let qp_t = uroce_ibv_create_qp(pd, &mut ia);
        assert!(!qp_t.is_null(), "errno {}", errno());
        connect(qp_s, (*qp_t).qp_num);
        connect(qp_t, (*qp_s).qp_num);

        // The QP's own receive queue does not exist.
        let mut sge = ibv_sge {
            addr: pb as u64,
            length: LEN as u32,
            lkey: (*mr_b).lkey,
        };
        let mut rwr = ibv_recv_wr {
            wr_id: 20,
            next: null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad_rwr: *mut ibv_recv_wr = null_mut();
        let post_recv_slot = (*ctx).ops.post_recv.expect("post_recv slot");
        assert_eq!(post_recv_slot(qp_s, &mut rwr, &mut bad_rwr), libc::EINVAL);
        // A chain whose second WR is invalid: the first is posted, bad_wr = second.
        let mut second = ibv_recv_wr {
            wr_id: 22,
            next: null_mut(),
            sg_list: null_mut(),
            num_sge: -1,
        };
        rwr.wr_id = 21;
        rwr.next = &mut second;
        let post_srq = (*ctx).ops.post_srq_recv.expect("post_srq_recv slot");
        assert_eq!(post_srq(srq, &mut rwr, &mut bad_rwr), libc::EINVAL);
        assert_eq!(bad_rwr, &mut second as *mut ibv_recv_wr);
        assert_eq!(post_srq(null_mut(), &mut rwr, &mut bad_rwr), libc::EINVAL);
        assert_eq!(bad_rwr, &mut rwr as *mut ibv_recv_wr);

        buf_a[..5].copy_from_slice(b"srq!!");
        let mut sge = ibv_sge {
            addr: pa as u64,
            length: 5,
            lkey: (*mr_a).lkey,
        };
        let mut wr: ibv_send_wr = zeroed();
        wr.wr_id = 23;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        assert_eq!(post_send(qp_t, &mut wr, &mut bad_wr), 0);
        let wc = poll_one(ctx, cq_b);
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id),
            (IBV_WC_SUCCESS, IBV_WC_RECV, 21)
        );
        assert_eq!((wc.byte_len, wc.qp_num), (5, (*qp_s).qp_num));
        assert_eq!(&buf_b[..5], b"srq!!");
        assert_eq!(poll_one(ctx, cq_a).wr_id, 23);
        // Taking the only WQE left fewer than the limit of 2: the limit fired and disarmed.
        assert_eq!(uroce_ibv_query_srq(srq, &mut sa), 0);
        assert_eq!(sa.srq_limit, 0);

        // --- A QP leaving RTS on its own: an RDMA WRITE to a QP without REMOTE_WRITE is
        // NAKed Invalid Request, the requester's WR completes REM_INV_REQ_ERR and its QP goes
        // to ERR. `qp->state` still says RTS (no ibv_modify_qp happened) until a query
        // that asks for the state refreshes it, as libibverbs' ibv_query_qp does.
        let mut wr: ibv_send_wr = zeroed();
        wr.wr_id = 24;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma = ibv_send_wr_rdma {
            remote_addr: pb as u64,
            rkey: (*mr_b).rkey,
        };
        assert_eq!(post_send(qp_t, &mut wr, &mut bad_wr), 0);
        let wc = poll_one(ctx, cq_a);
        assert_eq!((wc.status, wc.wr_id), (IBV_WC_REM_INV_REQ_ERR, 24));
        assert_eq!((*qp_t).state, IBV_QPS_RTS);
        assert_eq!(
            uroce_ibv_query_qp(qp_t, &mut qa, IBV_QP_STATE as c_int, &mut qi),
            0
        );
        assert_eq!(qa.qp_state, IBV_QPS_ERR);
        assert_eq!((*qp_t).state, IBV_QPS_ERR, "refreshed by the query");

        assert_eq!(uroce_ibv_destroy_srq(srq), libc::EBUSY, "a QP is attached");
        assert_eq!(uroce_ibv_destroy_qp(qp_s), 0);
        assert_eq!(uroce_ibv_destroy_qp(qp_t), 0);
        assert_eq!(uroce_ibv_destroy_srq(srq), 0);
        assert_eq!(uroce_ibv_destroy_srq(srq), libc::EINVAL, "stale SRQ");
        assert_eq!(uroce_ibv_query_srq(srq, &mut sa), libc::EINVAL, "stale SRQ");

        // --- Status strings (rdma-core's texts).
        let s = |v| CStr::from_ptr(uroce_ibv_wc_status_str(v)).to_str().unwrap();
        assert_eq!(s(0), "success");
        assert_eq!(s(5), "Work Request Flushed Error");
        assert_eq!(s(12), "transport retry counter exceeded");
        assert_eq!(s(999), "unknown");
        assert_eq!(s(-1), "unknown");

        // --- Destroy order: parents refuse while children live.
        assert_eq!(uroce_ibv_dealloc_pd(pd), libc::EBUSY);
        assert_eq!(uroce_ibv_destroy_cq(cq_b), libc::EBUSY);
        assert_eq!(uroce_ibv_destroy_comp_channel(ch), libc::EBUSY);
        assert_eq!(uroce_ibv_destroy_qp(qp_a), 0);
        assert_eq!(uroce_ibv_destroy_qp(qp_a), libc::EINVAL, "stale QP");
        assert_eq!(uroce_ibv_destroy_qp(qp_b), 0);
        assert_eq!(uroce_ibv_destroy_cq(cq_b), 0);
        assert_eq!(uroce_ibv_destroy_cq(cq_a), 0);
        assert_eq!(uroce_ibv_destroy_cq(cq_a), libc::EINVAL, "stale CQ");
        assert_eq!(uroce_ibv_destroy_comp_channel(ch), 0);
        assert_eq!(uroce_ibv_dereg_mr(mr_a), 0);
        assert_eq!(uroce_ibv_dereg_mr(mr_b), 0);
        assert_eq!(uroce_ibv_dereg_mr(mr_b), libc::EINVAL, "stale MR");
        assert_eq!(uroce_ibv_dealloc_pd(pd), 0);
        assert_eq!(uroce_ibv_close_device(ctx), 0);
    }
}
