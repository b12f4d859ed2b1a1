/* Extended CQs (ibv_create_cq_ex, ibv_start_poll/next_poll/end_poll, ibv_wc_read_*) and
   stale handles, in one process: two RC QPs a -> b of one device, each with an extended
   CQ created with IBV_WC_STANDARD_FLAGS.
   Every scenario (SEND with immediate, RDMA WRITE with immediate, plain SEND/RECV, an
   error completion) runs twice with the same work requests: once polled with ibv_poll_cq
   (on ibv_cq_ex_to_cq of the CQ), once with the extended API; every accessor must report
   what ibv_poll_cq reported for the same completion (wr_id, status, opcode, vendor_err,
   byte_len, imm_data, qp_num, src_qp, wc_flags, slid, sl, dlid_path_bits), and the data
   must have arrived.
   Then: refusals at create (EOPNOTSUPP for CVLAN and IGNORE_OVERRUN, EINVAL for
   unknown comp_mask), ENOENT on an empty CQ, next_poll walking three completions in
   order, completion events of an extended CQ through its channel, and handles used after
   their destroy (QP, CQ, extended CQ, SRQ) refused with EINVAL / -1 instead of crashing.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "rc_loopback.h"

/* One completion as the extended accessors report it. */
struct exwc {
	uint64_t wr_id;
	int status, opcode;
	uint32_t vendor_err, byte_len, imm, qp_num, src_qp, wc_flags, slid;
	uint8_t sl, dlid_path_bits;
};

static void read_current(struct ibv_cq_ex *cq, struct exwc *e)
{
	e->wr_id = cq->wr_id;
	e->status = cq->status;
	e->opcode = ibv_wc_read_opcode(cq);
	e->vendor_err = ibv_wc_read_vendor_err(cq);
	e->byte_len = ibv_wc_read_byte_len(cq);
	e->imm = ibv_wc_read_imm_data(cq);
	e->qp_num = ibv_wc_read_qp_num(cq);
	e->src_qp = ibv_wc_read_src_qp(cq);
	e->wc_flags = ibv_wc_read_wc_flags(cq);
	e->slid = ibv_wc_read_slid(cq);
	e->sl = ibv_wc_read_sl(cq);
	e->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
}

static void poll_ex(struct ibv_cq_ex *cq, struct exwc *e, const char *what)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	double end = now() + 10;
	for (;;) {
		int r = ibv_start_poll(cq, &attr);
		if (r == 0)
			break;
		if (r != ENOENT)
			FAIL("%s: ibv_start_poll %d", what, r);
		if (now() > end)
			FAIL("%s: no completion (extended)", what);
	}
	read_current(cq, e);
	ibv_end_poll(cq);
}

static void poll_wc(struct ibv_cq *cq, struct ibv_wc *wc, const char *what)
{
	double end = now() + 10;
	for (;;) {
		int r = ibv_poll_cq(cq, 1, wc);
		if (r == 1)
			return;
		if (r < 0)
			FAIL("%s: ibv_poll_cq %d", what, r);
		if (now() > end)
			FAIL("%s: no completion", what);
	}
}

static void same(const struct ibv_wc *w, const struct exwc *e, const char *what)
{
#define CHECK(a, b) do { if ((uint64_t)(a) != (uint64_t)(b)) \
	FAIL("%s: %s: ibv_poll_cq %llu, extended %llu", what, #b, (unsigned long long)(a), (unsigned long long)(b)); } while (0)
	CHECK(w->wr_id, e->wr_id);
	CHECK(w->status, e->status);
	CHECK(w->opcode, e->opcode);
	CHECK(w->vendor_err, e->vendor_err);
	CHECK(w->byte_len, e->byte_len);
	CHECK(w->imm_data, e->imm);
	CHECK(w->qp_num, e->qp_num);
	CHECK(w->src_qp, e->src_qp);
	CHECK(w->wc_flags, e->wc_flags);
	CHECK(w->slid, e->slid);
	CHECK(w->sl, e->sl);
	CHECK(w->dlid_path_bits, e->dlid_path_bits);
#undef CHECK
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_qp *a, *b;
static struct ibv_cq_ex *acq, *bcq;
static struct ibv_mr *amr, *bmr;
static char abuf[4096], bbuf[4096];

enum scenario { SEND_IMM, WRITE_IMM, SEND_PLAIN };

/* Posts one scenario (round `round` changes the payload), returns the two completions. */
static void run(enum scenario s, int round, int extended, struct ibv_wc *sw, struct ibv_wc *rw,
		struct exwc *se, struct exwc *re, const char *what)
{
	int len = 100 + 7 * (int)s;
	memset(bbuf, 0, sizeof bbuf);
	for (int i = 0; i < len; i++)
		abuf[i] = (char)(i * 3 + round + (int)s);
	struct ibv_sge rsge = { (uintptr_t)bbuf, sizeof bbuf, bmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 200 + s, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	if (ibv_post_recv(b, &rwr, &bad_r))
		FAIL("%s: post_recv", what);
	struct ibv_sge ssge = { (uintptr_t)abuf, (uint32_t)len, amr->lkey };
	struct ibv_send_wr swr = { .wr_id = 100 + s, .sg_list = &ssge, .num_sge = 1,
				   .send_flags = IBV_SEND_SIGNALED }, *bad_s;
	switch (s) {
	case SEND_IMM:
		swr.opcode = IBV_WR_SEND_WITH_IMM;
		swr.imm_data = htobe32(0x11223344);
		break;
	case WRITE_IMM:
		swr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		swr.imm_data = htobe32(0xa5a5f00d);
		swr.wr.rdma.remote_addr = (uintptr_t)bbuf;
		swr.wr.rdma.rkey = bmr->rkey;
		break;
	case SEND_PLAIN:
		swr.opcode = IBV_WR_SEND;
		break;
	}
	if (ibv_post_send(a, &swr, &bad_s))
		FAIL("%s: post_send", what);
	if (extended) {
		poll_ex(acq, se, what);
		poll_ex(bcq, re, what);
	} else {
		poll_wc(ibv_cq_ex_to_cq(acq), sw, what);
		poll_wc(ibv_cq_ex_to_cq(bcq), rw, what);
	}
	if (memcmp(abuf, bbuf, len))
		FAIL("%s: data differs", what);
}

static void compare(enum scenario s, const char *name)
{
	struct ibv_wc sw, rw;
	struct exwc se, re;
	run(s, 1, 0, &sw, &rw, NULL, NULL, name);
	run(s, 2, 1, NULL, NULL, &se, &re, name);
	if (sw.status != IBV_WC_SUCCESS || rw.status != IBV_WC_SUCCESS)
		FAIL("%s: status %d/%d", name, sw.status, rw.status);
	same(&sw, &se, name);
	same(&rw, &re, name);
	int want_imm = s != SEND_PLAIN;
	if (!!(re.wc_flags & IBV_WC_WITH_IMM) != want_imm)
		FAIL("%s: IBV_WC_WITH_IMM %s", name, want_imm ? "missing" : "set");
	if (re.qp_num != b->qp_num || re.src_qp != a->qp_num || se.qp_num != a->qp_num)
		FAIL("%s: qp numbers", name);
	printf("PASS %s opcode %d/%d byte_len %u imm %#x\n", name, se.opcode, re.opcode,
	       re.byte_len, be32toh(re.imm));
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("open");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("gid");
	pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	if (!pd || !ch)
		FAIL("pd/channel");

	/* Refusals, as rxe refuses them. */
	struct ibv_cq_init_attr_ex cia;
	memset(&cia, 0, sizeof cia);
	cia.cqe = 16;
	cia.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_CVLAN;
	errno = 0;
	if (ibv_create_cq_ex(ctx, &cia) || errno != EOPNOTSUPP)
		FAIL("CVLAN wc_flags: errno %d", errno);
	cia.wc_flags = IBV_WC_STANDARD_FLAGS;
	cia.comp_mask = 1 << 6;
	errno = 0;
	if (ibv_create_cq_ex(ctx, &cia) || errno != EINVAL)
		FAIL("unknown comp_mask: errno %d", errno);
	cia.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
	cia.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
	errno = 0;
	if (ibv_create_cq_ex(ctx, &cia) || errno != EOPNOTSUPP)
		FAIL("IGNORE_OVERRUN: errno %d", errno);
	printf("PASS refusals\n");

	cia.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
	cia.channel = ch;
	cia.cq_context = (void *)0x5eed;
	acq = ibv_create_cq_ex(ctx, &cia);
	cia.channel = NULL;
	cia.cq_context = NULL;
	bcq = ibv_create_cq_ex(ctx, &cia);
	if (!acq || !bcq)
		FAIL("create_cq_ex: errno %d", errno);
	amr = ibv_reg_mr(pd, abuf, sizeof abuf, IBV_ACCESS_LOCAL_WRITE);
	bmr = ibv_reg_mr(pd, bbuf, sizeof bbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 8;
	ia.cap.max_recv_wr = 8;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(acq);
	a = ibv_create_qp(pd, &ia);
	ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(bcq);
	b = ibv_create_qp(pd, &ia);
	if (!amr || !bmr || !a || !b)
		FAIL("mr/qp");
	to_rts(a, b->qp_num, &gid);
	to_rts(b, a->qp_num, &gid);

	struct ibv_poll_cq_attr pattr = { 0 };
	if (ibv_start_poll(bcq, &pattr) != ENOENT)
		FAIL("empty CQ: ENOENT expected");
	printf("PASS empty_enoent\n");

	compare(SEND_IMM, "send_with_imm");
	compare(WRITE_IMM, "rdma_write_with_imm");
	compare(SEND_PLAIN, "recv");

	/* next_poll walks completions in order. */
	struct ibv_sge ssge = { (uintptr_t)abuf, 8, amr->lkey };
	for (int i = 0; i < 3; i++) {
		struct ibv_sge rsge = { (uintptr_t)bbuf, sizeof bbuf, bmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 300 + i, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
		struct ibv_send_wr swr = { .wr_id = 400 + i, .sg_list = &ssge, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
		if (ibv_post_recv(b, &rwr, &bad_r) || ibv_post_send(a, &swr, &bad_s))
			FAIL("post (next_poll)");
	}
	/* A send completes on its ACK, sent after the receive completed: once the three
	   sends are in, so are the three receives, and one session walks them all. */
	for (int i = 0; i < 3; i++) {
		struct exwc e;
		poll_ex(acq, &e, "next_poll sends");
		if (e.wr_id != 400u + i)
			FAIL("send order: %llu", (unsigned long long)e.wr_id);
	}
	if (ibv_start_poll(bcq, &pattr))
		FAIL("start_poll (next_poll)");
	for (int i = 0; i < 3; i++) {
		if (i && ibv_next_poll(bcq))
			FAIL("next_poll %d", i);
		if (bcq->wr_id != 300u + i || bcq->status != IBV_WC_SUCCESS ||
		    ibv_wc_read_opcode(bcq) != IBV_WC_RECV || ibv_wc_read_byte_len(bcq) != 8)
			FAIL("next_poll: wr_id %llu, want %d", (unsigned long long)bcq->wr_id, 300 + i);
	}
	if (ibv_next_poll(bcq) != ENOENT)
		FAIL("next_poll past the end: ENOENT expected");
	ibv_end_poll(bcq);
	printf("PASS next_poll\n");

	/* Completion events on an extended CQ. */
	if (ibv_req_notify_cq(ibv_cq_ex_to_cq(acq), 0))
		FAIL("req_notify_cq");
	{
		struct ibv_sge rsge = { (uintptr_t)bbuf, sizeof bbuf, bmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 500, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
		struct ibv_send_wr swr = { .wr_id = 501, .sg_list = &ssge, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
		if (ibv_post_recv(b, &rwr, &bad_r) || ibv_post_send(a, &swr, &bad_s))
			FAIL("post (event)");
	}
	struct ibv_cq *evcq;
	void *evctx;
	if (ibv_get_cq_event(ch, &evcq, &evctx))
		FAIL("get_cq_event");
	if (evcq != ibv_cq_ex_to_cq(acq) || evctx != (void *)0x5eed)
		FAIL("event names %p/%p", (void *)evcq, evctx);
	ibv_ack_cq_events(evcq, 1);
	{
		struct exwc e;
		poll_ex(acq, &e, "event");
		poll_ex(bcq, &e, "event recv");
	}
	printf("PASS cq_event\n");

	/* An error completion: RDMA WRITE to a bad rkey (remote access error), compared as
	   above on two fresh QP pairs (the first error moves a QP to ERR). */
	for (int round = 0; round < 2; round++) {
		ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(acq);
		struct ibv_qp *ea = ibv_create_qp(pd, &ia);
		ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(bcq);
		struct ibv_qp *eb = ibv_create_qp(pd, &ia);
		if (!ea || !eb)
			FAIL("error qps");
		to_rts(ea, eb->qp_num, &gid);
		to_rts(eb, ea->qp_num, &gid);
		struct ibv_send_wr swr = { .wr_id = 600, .sg_list = &ssge, .num_sge = 1,
					   .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
		swr.wr.rdma.remote_addr = (uintptr_t)bbuf;
		swr.wr.rdma.rkey = bmr->rkey ^ 0x5a5a00;
		if (ibv_post_send(ea, &swr, &bad_s))
			FAIL("post (error)");
		static struct ibv_wc ew;
		static struct exwc ee;
		if (round == 0) {
			poll_wc(ibv_cq_ex_to_cq(acq), &ew, "error");
			if (ew.status == IBV_WC_SUCCESS)
				FAIL("error: a write to a bad rkey succeeded");
		} else {
			poll_ex(acq, &ee, "error");
			struct ibv_wc w2 = ew;
			w2.qp_num = ee.qp_num; /* a fresh QP: only its number may differ */
			if (ee.qp_num != ea->qp_num)
				FAIL("error: qp_num %u, want %u", ee.qp_num, ea->qp_num);
			same(&w2, &ee, "error");
			printf("PASS error_completion status %s vendor_err %u\n",
			       ibv_wc_status_str(ee.status), ee.vendor_err);
		}
		if (ibv_destroy_qp(ea) || ibv_destroy_qp(eb))
			FAIL("destroy error qps");
		/* Flush whatever the error left on the CQs. */
		struct ibv_wc junk;
		while (ibv_poll_cq(ibv_cq_ex_to_cq(acq), 1, &junk) > 0)
			;
		while (ibv_poll_cq(ibv_cq_ex_to_cq(bcq), 1, &junk) > 0)
			;
	}

	/* Handles used after their destroy are refused (the memory stays uroce's). */
	struct ibv_srq_init_attr sia;
	memset(&sia, 0, sizeof sia);
	sia.attr.max_wr = 4;
	sia.attr.max_sge = 1;
	struct ibv_srq *srq = ibv_create_srq(pd, &sia);
	struct ibv_cq *pcq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	if (!srq || !pcq)
		FAIL("srq/cq");
	if (ibv_destroy_qp(a) || ibv_destroy_srq(srq) || ibv_destroy_cq(pcq))
		FAIL("destroy");
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &ssge, .num_sge = 1,
				   .opcode = IBV_WR_SEND }, *bad_s = NULL;
	if (ibv_post_send(a, &swr, &bad_s) != EINVAL || bad_s != &swr)
		FAIL("post_send on a destroyed QP");
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &ssge, .num_sge = 1 }, *bad_r = NULL;
	if (ibv_post_recv(a, &rwr, &bad_r) != EINVAL)
		FAIL("post_recv on a destroyed QP");
	if (ibv_post_srq_recv(srq, &rwr, &bad_r) != EINVAL)
		FAIL("post_srq_recv on a destroyed SRQ");
	struct ibv_wc wc;
	if (ibv_poll_cq(pcq, 1, &wc) != -1)
		FAIL("poll_cq on a destroyed CQ");
	if (ibv_req_notify_cq(pcq, 0) != EINVAL)
		FAIL("req_notify_cq on a destroyed CQ");
	if (ibv_destroy_qp(a) != EINVAL || ibv_destroy_srq(srq) != EINVAL || ibv_destroy_cq(pcq) != EINVAL)
		FAIL("second destroy");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	if (ibv_query_qp(a, &qa, IBV_QP_STATE, &qia) != EINVAL)
		FAIL("query_qp on a destroyed QP");
	if (ibv_destroy_qp(b) || ibv_destroy_cq(ibv_cq_ex_to_cq(bcq)))
		FAIL("destroy b/bcq");
	if (ibv_start_poll(bcq, &pattr) != EINVAL)
		FAIL("start_poll on a destroyed extended CQ");
	printf("PASS stale_handles\n");

	if (ibv_dereg_mr(amr) || ibv_dereg_mr(bmr) || ibv_destroy_cq(ibv_cq_ex_to_cq(acq)) ||
	    ibv_destroy_comp_channel(ch) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		FAIL("teardown");
	ibv_free_device_list(list);
	printf("PASS teardown\n");
	return 0;
}
