/* IBA 1.5 ATOMIC WRITE through the C API, two RC QPs of one device over loopback:
   - wr_atomic_write: ibv_wr_atomic_write on a QP created with IBV_QP_EX_WITH_ATOMIC_WRITE
     (and max_inline_data 0: the 8 bytes are an operand) stores the 8 bytes at the
     target, in their order, neighbours untouched; the completion is IBV_WC_ATOMIC_WRITE
     (9) with byte_len 8;
   - post_send: IBV_WR_ATOMIC_WRITE through ibv_post_send takes the 8 bytes from the SGE
     list (two SGEs of 3 + 5 bytes) and the target from wr.rdma;
   - inline: the same with IBV_SEND_INLINE, max_inline_data 0 notwithstanding;
   - wrong_length: ibv_post_send with 7 or 16 bytes fails with EINVAL, *bad_wr = the WR,
     nothing posted;
   - misaligned: an address that is not 8-byte aligned completes with
     IBV_WC_REM_INV_REQ_ERR (the target's invalid-request NAK), memory untouched;
   - no_remote_write: a region without IBV_ACCESS_REMOTE_WRITE completes with
     IBV_WC_REM_ACCESS_ERR, memory untouched;
   - send_ops: ibv_create_qp_ex refuses IBV_QP_EX_WITH_ATOMIC_WRITE on UC (EOPNOTSUPP);
     on an RC QP created without it ibv_wr_atomic_write fails at complete (EOPNOTSUPP).
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "rc_loopback.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static struct ibv_cq *cqa, *cqb;

/* One completion from cq within 10 s. */
static struct ibv_wc poll_one(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 10;
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			FAIL("%s: poll_cq", what);
		if (n == 1)
			return wc;
		if (now() > end)
			FAIL("%s: no completion", what);
	}
}

/* No completion on cq for 200 ms. */
static void expect_none(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 0.2;
	while (now() < end)
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			FAIL("%s: unexpected completion wr_id %llu status %s", what,
			     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
}

static void expect(struct ibv_wc wc, uint64_t wr_id, enum ibv_wc_status st, const char *what)
{
	if (wc.wr_id != wr_id || wc.status != st)
		FAIL("%s: wr_id %llu status %s (wanted %llu %s)", what, (unsigned long long)wc.wr_id,
		     ibv_wc_status_str(wc.status), (unsigned long long)wr_id, ibv_wc_status_str(st));
}

/* An RC QP on cq with `ops` as send_ops_flags (0: plain ibv_create_qp). */
static struct ibv_qp *rc_qp(struct ibv_cq *cq, uint64_t ops, uint32_t max_inline)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof a);
	a.qp_type = IBV_QPT_RC;
	a.send_cq = a.recv_cq = cq;
	a.cap.max_send_wr = 16;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 2;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = max_inline;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	a.pd = pd;
	if (ops) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = ops;
	}
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	if (!qp)
		FAIL("create_qp_ex ops %#llx: %s", (unsigned long long)ops, strerror(errno));
	return qp;
}

/* A connected pair: a (requester, created with `ops`) -> b. */
static void pair(uint64_t ops, struct ibv_qp **a, struct ibv_qp **b)
{
	*a = rc_qp(cqa, ops, 0);
	*b = rc_qp(cqb, 0, 0);
	connect_rc(*a, (*b)->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE, 1);
	connect_rc(*b, (*a)->qp_num, &gid, IBV_ACCESS_REMOTE_WRITE, 1);
}

static void atomic_write(struct ibv_qp *qp, uint64_t wr_id, uint32_t rkey, void *at, const void *val)
{
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
	if (!x)
		FAIL("qp_to_qp_ex");
	ibv_wr_start(x);
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(x, rkey, (uintptr_t)at, val);
	int rc = ibv_wr_complete(x);
	if (rc)
		FAIL("wr_complete (wr_id %llu): %s", (unsigned long long)wr_id, strerror(rc));
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx || ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("open / gid");
	pd = ibv_alloc_pd(ctx);
	cqa = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	cqb = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !cqa || !cqb)
		FAIL("pd / cq");
	static uint64_t abuf[512], bbuf[512], robuf[512];
	char *a8 = (char *)abuf, *b8 = (char *)bbuf;
	struct ibv_mr *mra = ibv_reg_mr(pd, abuf, sizeof abuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mrb = ibv_reg_mr(pd, bbuf, sizeof bbuf,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *mro = ibv_reg_mr(pd, robuf, sizeof robuf,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!mra || !mrb || !mro)
		FAIL("reg_mr: %s", strerror(errno));
	const unsigned char val[8] = { 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88 };
	const unsigned char fill[8] = { 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a };

	/* ---- ibv_wr_atomic_write ---- */
	struct ibv_qp *qa, *qb;
	pair(IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_SEND, &qa, &qb);
	memset(bbuf, 0x5a, sizeof bbuf);
	atomic_write(qa, 1, mrb->rkey, b8 + 8, val);
	struct ibv_wc wc = poll_one(cqa, "wr_atomic_write");
	expect(wc, 1, IBV_WC_SUCCESS, "wr_atomic_write");
	if (wc.opcode != IBV_WC_ATOMIC_WRITE || IBV_WC_ATOMIC_WRITE != 9 || wc.byte_len != 8)
		FAIL("wr_atomic_write: opcode %d byte_len %u", (int)wc.opcode, wc.byte_len);
	if (memcmp(b8 + 8, val, 8) || memcmp(b8, fill, 8) || memcmp(b8 + 16, fill, 8))
		FAIL("wr_atomic_write: the target holds %016llx (neighbours %016llx %016llx)",
		     (unsigned long long)bbuf[1], (unsigned long long)bbuf[0],
		     (unsigned long long)bbuf[2]);
	printf("PASS wr_atomic_write\n");

	/* ---- IBV_WR_ATOMIC_WRITE through ibv_post_send, the 8 bytes from two SGEs ---- */
	memcpy(a8 + 100, val, 3);
	memcpy(a8 + 203, val + 3, 5);
	struct ibv_sge sg[2] = {
		{ (uintptr_t)(a8 + 100), 3, mra->lkey },
		{ (uintptr_t)(a8 + 203), 5, mra->lkey },
	};
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = 2;
	wr.opcode = IBV_WR_ATOMIC_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = sg;
	wr.num_sge = 2;
	wr.wr.rdma.remote_addr = (uintptr_t)(b8 + 64);
	wr.wr.rdma.rkey = mrb->rkey;
	int rc = ibv_post_send(qa, &wr, &bad);
	if (rc)
		FAIL("post_send ATOMIC_WRITE: %s", strerror(rc));
	wc = poll_one(cqa, "post_send");
	expect(wc, 2, IBV_WC_SUCCESS, "post_send");
	if (wc.opcode != IBV_WC_ATOMIC_WRITE)
		FAIL("post_send: opcode %d", (int)wc.opcode);
	if (memcmp(b8 + 64, val, 8) || memcmp(b8 + 72, fill, 8))
		FAIL("post_send: the target holds %016llx", (unsigned long long)bbuf[8]);
	printf("PASS post_send\n");

	/* ---- The same with IBV_SEND_INLINE: the 8 bytes are copied at post (the sources
	   change right after it) although max_inline_data is 0: they are an operand ---- */
	wr.wr_id = 5;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	wr.wr.rdma.remote_addr = (uintptr_t)(b8 + 80);
	rc = ibv_post_send(qa, &wr, &bad);
	if (rc)
		FAIL("post_send ATOMIC_WRITE inline: %s", strerror(rc));
	memset(a8 + 100, 0, 3);
	memset(a8 + 203, 0, 5);
	wc = poll_one(cqa, "inline");
	expect(wc, 5, IBV_WC_SUCCESS, "inline");
	if (memcmp(b8 + 80, val, 8) || memcmp(b8 + 88, fill, 8))
		FAIL("inline: the target holds %016llx", (unsigned long long)bbuf[10]);
	memcpy(a8 + 100, val, 3);
	memcpy(a8 + 203, val + 3, 5);
	wr.send_flags = IBV_SEND_SIGNALED;
	printf("PASS inline\n");

	/* ---- 7 or 16 bytes: EINVAL at post, nothing posted ---- */
	uint32_t lens[2][2] = { { 3, 4 }, { 8, 8 } };
	for (int i = 0; i < 2; i++) {
		sg[0].length = lens[i][0];
		sg[1].length = lens[i][1];
		bad = NULL;
		rc = ibv_post_send(qa, &wr, &bad);
		if (rc != EINVAL || bad != &wr)
			FAIL("post_send of %u bytes: rc %d bad %p, wanted EINVAL and the WR",
			     lens[i][0] + lens[i][1], rc, (void *)bad);
	}
	expect_none(cqa, "wrong_length");
	if (memcmp(b8 + 72, fill, 8))
		FAIL("wrong_length: memory changed");
	printf("PASS wrong_length\n");

	/* ---- A misaligned address: REM_INV_REQ_ERR, memory untouched ---- */
	atomic_write(qa, 3, mrb->rkey, b8 + 132, val);
	expect(poll_one(cqa, "misaligned"), 3, IBV_WC_REM_INV_REQ_ERR, "misaligned");
	if (memcmp(b8 + 128, fill, 8) || memcmp(b8 + 136, fill, 8))
		FAIL("misaligned: memory changed");
	printf("PASS misaligned\n");

	/* ---- A region without REMOTE_WRITE: REM_ACCESS_ERR, memory untouched ---- */
	pair(IBV_QP_EX_WITH_ATOMIC_WRITE, &qa, &qb);
	memset(robuf, 0x5a, sizeof robuf);
	atomic_write(qa, 4, mro->rkey, (char *)robuf + 8, val);
	expect(poll_one(cqa, "no_remote_write"), 4, IBV_WC_REM_ACCESS_ERR, "no_remote_write");
	if (memcmp((char *)robuf + 8, fill, 8))
		FAIL("no_remote_write: memory changed");
	printf("PASS no_remote_write\n");

	/* ---- send_ops_flags ---- */
	struct ibv_qp_init_attr_ex ua;
	memset(&ua, 0, sizeof ua);
	ua.qp_type = IBV_QPT_UC;
	ua.send_cq = ua.recv_cq = cqa;
	ua.cap.max_send_wr = ua.cap.max_recv_wr = 4;
	ua.cap.max_send_sge = ua.cap.max_recv_sge = 1;
	ua.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ua.pd = pd;
	ua.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE;
	errno = 0;
	if (ibv_create_qp_ex(ctx, &ua) || errno != EOPNOTSUPP)
		FAIL("UC with ATOMIC_WRITE: errno %d, wanted EOPNOTSUPP", errno);
	pair(IBV_QP_EX_WITH_SEND, &qa, &qb);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qa);
	ibv_wr_start(x);
	x->wr_id = 5;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(x, mrb->rkey, (uintptr_t)(b8 + 256), val);
	rc = ibv_wr_complete(x);
	if (rc != EOPNOTSUPP)
		FAIL("atomic write outside send_ops_flags: %d, wanted EOPNOTSUPP", rc);
	expect_none(cqa, "send_ops");
	printf("PASS send_ops\n");
	return 0;
}
