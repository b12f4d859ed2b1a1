/* The extended QP's work-request API (ibv_qp_to_qp_ex, ibv_wr_*) through the C header's
   inlines, in one process: QPs of the one device connected to each other over loopback.
   The expectations are the verbs API's (rdma-core's ibv_wr_post(3)) and IBA's:
   - rc_all_opcodes: one ibv_wr_start .. ibv_wr_complete list on an RC QP created with
     ibv_create_qp_ex and IBV_QP_INIT_ATTR_SEND_OPS_FLAGS holds SEND (ibv_wr_set_sge),
     SEND with immediate (ibv_wr_set_inline_data), RDMA WRITE (ibv_wr_set_sge_list, two
     SGEs), RDMA WRITE with immediate, RDMA READ, compare-and-swap, fetch-and-add and a
     SEND with ibv_wr_set_inline_data_list; every send completion arrives in order with
     its wr_id and opcode, the data lands, READ brings the remote bytes, the atomics
     return the old values and leave the new ones;
   - abort: ibv_wr_abort posts nothing (no completion; the receive WQE stays for the next
     SEND);
   - batch_error: a list with an inline payload longer than max_inline_data, one with
     ibv_wr_atomic_write (not in the QP's send_ops_flags: EOPNOTSUPP), one longer than the send queue
     (ENOMEM), one with a setter before any operation and one with ibv_wr_set_ud_addr on
     an RC QP: ibv_wr_complete fails and posts nothing, not even the valid WRs before
     the bad one;
   - send_ops_flags: an operation outside the QP's send_ops_flags fails at complete with
     EOPNOTSUPP; ibv_create_qp_ex refuses flags the QP type cannot do with EOPNOTSUPP;
   - mw_bind_local_inv: a type 2 window bound with ibv_wr_bind_mw accepts an RDMA WRITE
     with its key; ibv_wr_local_inv completes with IBV_WC_LOCAL_INV; a WRITE with the
     invalidated key completes with IBV_WC_REM_ACCESS_ERR and leaves memory untouched;
   - mw_send_inv: a window bound with ibv_wr_bind_mw is invalidated by the peer's
     ibv_wr_send_inv (receive completion with IBV_WC_WITH_INV and the key); a WRITE with
     it then fails with IBV_WC_REM_ACCESS_ERR;
   - uc: SEND, SEND with immediate, RDMA WRITE, RDMA WRITE with immediate on UC;
   - uc_mw: a type 2 window bound with ibv_wr_bind_mw on a UC QP accepts the peer's WRITE;
     after ibv_wr_local_inv a WRITE with its key is dropped and changes nothing;
   - ud: SEND and SEND with immediate with ibv_wr_set_ud_addr on UD (the payload after
     the 40-byte GRH area);
   - xrc: SEND with ibv_wr_set_xrc_srqn from an XRC_SEND QP to an XRC SRQ.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

#define RC_OPS (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | \
		IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | \
		IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | \
		IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV)
#define UC_OPS (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | \
		IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_LOCAL_INV | \
		IBV_QP_EX_WITH_BIND_MW)
#define UD_OPS (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM)
#define QKEY 0x11111111u

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

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

/* No completion on cq for 300 ms. */
static void expect_none(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 0.3;
	while (now() < end) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n != 0)
			FAIL("%s: unexpected completion wr_id %llu status %s", what,
			     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	}
}

static void expect(struct ibv_wc wc, uint64_t wr_id, enum ibv_wc_status st, int opcode, const char *what)
{
	if (wc.wr_id != wr_id || wc.status != st || (opcode >= 0 && (int)wc.opcode != opcode))
		FAIL("%s: wr_id %llu status %s opcode %d (wanted %llu %s %d)", what,
		     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), (int)wc.opcode,
		     (unsigned long long)wr_id, ibv_wc_status_str(st), opcode);
}

static struct ibv_qp *create_qp(enum ibv_qp_type t, struct ibv_cq *cq, uint64_t ops, uint32_t max_send)
{
	struct ibv_qp_init_attr_ex a;
	memset(&a, 0, sizeof a);
	a.qp_type = t;
	a.send_cq = a.recv_cq = cq;
	a.cap.max_send_wr = max_send;
	a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 4;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 64;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	a.pd = pd;
	a.send_ops_flags = ops;
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	if (!qp)
		FAIL("ibv_create_qp_ex type %d ops %#llx: %s", t, (unsigned long long)ops, strerror(errno));
	return qp;
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	int rc = ibv_modify_qp(qp, a, mask);
	if (rc)
		FAIL("modify %s: %s", what, strerror(rc));
}

/* INIT → RTR → RTS for RC, UC and XRC_SEND (to QPN dqpn); UD needs no peer. */
static void connect_qp(struct ibv_qp *qp, uint32_t dqpn)
{
	struct ibv_qp_attr a;
	int rc_like = qp->qp_type == IBV_QPT_RC || qp->qp_type == IBV_QPT_XRC_SEND ||
		      qp->qp_type == IBV_QPT_XRC_RECV;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	if (qp->qp_type == IBV_QPT_UD) {
		a.qkey = QKEY;
		modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, "INIT");
	} else {
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				    (qp->qp_type == IBV_QPT_UC ? 0 : IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
		modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
	}
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	if (qp->qp_type == IBV_QPT_UD) {
		modify(qp, &a, IBV_QP_STATE, "RTR");
	} else {
		int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = dqpn;
		a.rq_psn = 1;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.hop_limit = 64;
		a.ah_attr.port_num = 1;
		if (rc_like) {
			a.max_dest_rd_atomic = 4;
			a.min_rnr_timer = 12;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
		modify(qp, &a, mask, "RTR");
	}
	if (qp->qp_type == IBV_QPT_XRC_RECV)
		return;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (rc_like) {
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 4;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	modify(qp, &a, mask, "RTS");
}

static void post_recv(struct ibv_qp *qp, uint64_t wr_id, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge s = { (uintptr_t)buf, len, lkey };
	struct ibv_recv_wr w, *bad;
	memset(&w, 0, sizeof w);
	w.wr_id = wr_id;
	w.sg_list = &s;
	w.num_sge = 1;
	if (ibv_post_recv(qp, &w, &bad))
		FAIL("post_recv %llu", (unsigned long long)wr_id);
}

static struct ibv_qp_ex *to_ex(struct ibv_qp *qp)
{
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
	if (!x)
		FAIL("ibv_qp_to_qp_ex: %s", strerror(errno));
	if (&x->qp_base != qp)
		FAIL("ibv_qp_to_qp_ex: qp_base is not the QP");
	return x;
}

/* Sets the next WR's id and flags (signaled). */
static void next(struct ibv_qp_ex *x, uint64_t wr_id)
{
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
}

static char bufa[16384] __attribute__((aligned(64)));
static char bufb[16384] __attribute__((aligned(64)));
static struct ibv_mr *mra, *mrb;

/* A one-WR RDMA WRITE of len bytes of bufa to dst with rkey. */
static void write_one(struct ibv_qp_ex *x, uint64_t wr_id, char *dst, uint32_t rkey, uint32_t len)
{
	ibv_wr_start(x);
	next(x, wr_id);
	ibv_wr_rdma_write(x, rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mra->lkey, (uintptr_t)bufa, len);
	int rc = ibv_wr_complete(x);
	if (rc)
		FAIL("write %llu: ibv_wr_complete %s", (unsigned long long)wr_id, strerror(rc));
}

static void rc_pair(struct ibv_cq *cqa, struct ibv_cq *cqb, struct ibv_qp **qa, struct ibv_qp **qb)
{
	*qa = create_qp(IBV_QPT_RC, cqa, RC_OPS, 16);
	*qb = create_qp(IBV_QPT_RC, cqb, RC_OPS, 16);
	connect_qp(*qa, (*qb)->qp_num);
	connect_qp(*qb, (*qa)->qp_num);
}

static void check_complete_fails(struct ibv_qp_ex *x, int want, const char *what)
{
	int rc = ibv_wr_complete(x);
	if (rc != want)
		FAIL("%s: ibv_wr_complete returned %d (%s), wanted %d (%s)", what, rc, strerror(rc), want,
		     strerror(want));
}

int main(void)
{
	int n;
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("open");
	if (ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("gid");
	pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cqa = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *cqb = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !cqa || !cqb)
		FAIL("pd/cq");
	mra = ibv_reg_mr(pd, bufa, sizeof bufa, IBV_ACCESS_LOCAL_WRITE);
	mrb = ibv_reg_mr(pd, bufb, sizeof bufb,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			 IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND);
	if (!mra || !mrb)
		FAIL("mr");
	struct ibv_qp *qa, *qb;
	rc_pair(cqa, cqb, &qa, &qb);
	struct ibv_qp_ex *xa = to_ex(qa), *xb = to_ex(qb);
	int in_order = ibv_query_qp_data_in_order(qa, IBV_WR_RDMA_WRITE, 0);
	if (in_order != 0 && in_order != 1)
		FAIL("ibv_query_qp_data_in_order returned %d", in_order);

	/* ---- Every RC opcode in one list. ---- */
	for (int i = 0; i < 1024; i++)
		bufa[i] = (char)(i * 13 + 7);
	for (int i = 0; i < 128; i++)
		bufb[3072 + i] = (char)(i * 5 + 3);
	uint64_t *cas = (uint64_t *)(bufb + 4096), *faa = (uint64_t *)(bufb + 4104);
	*cas = 7;
	*faa = 1000;
	post_recv(qb, 101, bufb + 0, 256, mrb->lkey);
	post_recv(qb, 102, bufb + 256, 256, mrb->lkey);
	post_recv(qb, 103, bufb + 512, 256, mrb->lkey);
	post_recv(qb, 104, bufb + 768, 256, mrb->lkey);
	static const char inl[] = "inline hello";
	static char part1[] = "gathered ", part2[] = "inline list";
	struct ibv_data_buf bufs[2] = { { part1, 9 }, { part2, 11 } };
	struct ibv_sge two[2] = { { (uintptr_t)(bufa + 200), 50, mra->lkey },
				  { (uintptr_t)(bufa + 300), 70, mra->lkey } };
	ibv_wr_start(xa);
	next(xa, 1);
	ibv_wr_send(xa);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 100);
	next(xa, 2);
	ibv_wr_send_imm(xa, htobe32(0x11223344));
	ibv_wr_set_inline_data(xa, (void *)inl, 12);
	next(xa, 3);
	ibv_wr_rdma_write(xa, mrb->rkey, (uintptr_t)(bufb + 1024));
	ibv_wr_set_sge_list(xa, 2, two);
	next(xa, 4);
	ibv_wr_rdma_write_imm(xa, mrb->rkey, (uintptr_t)(bufb + 2048), htobe32(0x55667788));
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)(bufa + 400), 64);
	next(xa, 5);
	ibv_wr_rdma_read(xa, mrb->rkey, (uintptr_t)(bufb + 3072));
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)(bufa + 8192), 128);
	next(xa, 6);
	ibv_wr_atomic_cmp_swp(xa, mrb->rkey, (uintptr_t)cas, 7, 99);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)(bufa + 9000), 8);
	next(xa, 7);
	ibv_wr_atomic_fetch_add(xa, mrb->rkey, (uintptr_t)faa, 5);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)(bufa + 9008), 8);
	next(xa, 8);
	ibv_wr_send(xa);
	ibv_wr_set_inline_data_list(xa, 2, bufs);
	int rc = ibv_wr_complete(xa);
	if (rc)
		FAIL("ibv_wr_complete: %s", strerror(rc));
	/* Inline data was copied at set time: changing the source now changes nothing. */
	part1[0] = 'X';
	static const int want_op[] = { IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE,
				       IBV_WC_RDMA_READ, IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD, IBV_WC_SEND };
	for (int i = 0; i < 8; i++)
		expect(poll_one(cqa, "rc list"), i + 1, IBV_WC_SUCCESS, want_op[i], "rc list");
	struct ibv_wc wc = poll_one(cqb, "recv 1");
	expect(wc, 101, IBV_WC_SUCCESS, IBV_WC_RECV, "recv send");
	if (wc.byte_len != 100 || memcmp(bufb, bufa, 100))
		FAIL("send: byte_len %u or data differs", wc.byte_len);
	wc = poll_one(cqb, "recv 2");
	expect(wc, 102, IBV_WC_SUCCESS, IBV_WC_RECV, "recv send_imm");
	if (wc.byte_len != 12 || !(wc.wc_flags & IBV_WC_WITH_IMM) || be32toh(wc.imm_data) != 0x11223344 ||
	    memcmp(bufb + 256, inl, 12))
		FAIL("send_imm: byte_len %u flags %#x imm %#x", wc.byte_len, wc.wc_flags, be32toh(wc.imm_data));
	wc = poll_one(cqb, "recv 3");
	expect(wc, 103, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, "recv write_imm");
	if (!(wc.wc_flags & IBV_WC_WITH_IMM) || be32toh(wc.imm_data) != 0x55667788)
		FAIL("write_imm: flags %#x imm %#x", wc.wc_flags, be32toh(wc.imm_data));
	wc = poll_one(cqb, "recv 4");
	expect(wc, 104, IBV_WC_SUCCESS, IBV_WC_RECV, "recv inline list");
	if (wc.byte_len != 20 || memcmp(bufb + 768, "gathered inline list", 20))
		FAIL("inline list: byte_len %u data '%.20s'", wc.byte_len, bufb + 768);
	if (memcmp(bufb + 1024, bufa + 200, 50) || memcmp(bufb + 1074, bufa + 300, 70))
		FAIL("write with an SGE list: data differs");
	if (memcmp(bufb + 2048, bufa + 400, 64))
		FAIL("write_imm: data differs");
	if (memcmp(bufa + 8192, bufb + 3072, 128))
		FAIL("read: data differs");
	if (*(uint64_t *)(bufa + 9000) != 7 || *cas != 99)
		FAIL("cmp_swp: old %llu new %llu", (unsigned long long)*(uint64_t *)(bufa + 9000),
		     (unsigned long long)*cas);
	if (*(uint64_t *)(bufa + 9008) != 1000 || *faa != 1005)
		FAIL("fetch_add: old %llu new %llu", (unsigned long long)*(uint64_t *)(bufa + 9008),
		     (unsigned long long)*faa);
	printf("PASS rc_all_opcodes\n");

	/* ---- ibv_wr_abort posts nothing. ---- */
	post_recv(qb, 110, bufb + 4608, 256, mrb->lkey);
	memset(bufa, 0x41, 32);
	ibv_wr_start(xa);
	next(xa, 20);
	ibv_wr_send(xa);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 32);
	ibv_wr_abort(xa);
	expect_none(cqa, "abort");
	expect_none(cqb, "abort (receiver)");
	memset(bufa, 0x42, 32);
	ibv_wr_start(xa);
	next(xa, 21);
	ibv_wr_send(xa);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 16);
	if ((rc = ibv_wr_complete(xa)))
		FAIL("send after abort: %s", strerror(rc));
	expect(poll_one(cqa, "after abort"), 21, IBV_WC_SUCCESS, IBV_WC_SEND, "after abort");
	wc = poll_one(cqb, "recv after abort");
	expect(wc, 110, IBV_WC_SUCCESS, IBV_WC_RECV, "recv after abort");
	if (wc.byte_len != 16 || bufb[4608] != 0x42)
		FAIL("the receive after an abort got %u bytes starting %#x", wc.byte_len, bufb[4608]);
	printf("PASS abort\n");

	/* ---- An error anywhere in the list: nothing is posted. ---- */
	post_recv(qb, 111, bufb + 4608, 256, mrb->lkey);
	static char big[200];
	memset(bufb + 5120, 0x33, 256);
	ibv_wr_start(xa); /* inline payload longer than max_inline_data (64) */
	next(xa, 30);
	ibv_wr_send(xa);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 8);
	next(xa, 31);
	ibv_wr_rdma_write(xa, mrb->rkey, (uintptr_t)(bufb + 5120));
	ibv_wr_set_inline_data(xa, big, sizeof big);
	check_complete_fails(xa, EINVAL, "inline too long");
	ibv_wr_start(xa); /* ATOMIC WRITE: not in RC_OPS (tests/c/atomic_write.c runs it) */
	next(xa, 32);
	ibv_wr_send(xa);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 8);
	next(xa, 33);
	ibv_wr_atomic_write(xa, mrb->rkey, (uintptr_t)(bufb + 5120), big);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 8);
	check_complete_fails(xa, EOPNOTSUPP, "atomic write");
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	if (ibv_query_qp(qa, &qattr, IBV_QP_CAP, &qinit))
		FAIL("query_qp");
	ibv_wr_start(xa); /* more WRs than the send queue holds */
	for (uint32_t i = 0; i <= qinit.cap.max_send_wr; i++) {
		next(xa, 40 + i);
		ibv_wr_rdma_write(xa, mrb->rkey, (uintptr_t)(bufb + 5120));
		ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 8);
	}
	check_complete_fails(xa, ENOMEM, "queue overflow");
	ibv_wr_start(xa); /* a setter before any operation */
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 8);
	next(xa, 34);
	ibv_wr_send(xa);
	check_complete_fails(xa, EINVAL, "setter first");
	ibv_wr_start(xa); /* a UD address on an RC QP */
	next(xa, 35);
	ibv_wr_send(xa);
	ibv_wr_set_ud_addr(xa, NULL, 1, QKEY);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 8);
	check_complete_fails(xa, EINVAL, "ud addr on RC");
	check_complete_fails(xa, EINVAL, "complete without start");
	expect_none(cqa, "failed lists");
	expect_none(cqb, "failed lists (receiver)");
	for (int i = 0; i < 256; i++)
		if (bufb[5120 + i] != 0x33)
			FAIL("a failed list wrote remote memory");
	memset(bufa, 0x43, 16);
	ibv_wr_start(xa);
	next(xa, 36);
	ibv_wr_send(xa);
	ibv_wr_set_sge(xa, mra->lkey, (uintptr_t)bufa, 16);
	if ((rc = ibv_wr_complete(xa)))
		FAIL("send after failed lists: %s", strerror(rc));
	expect(poll_one(cqa, "after errors"), 36, IBV_WC_SUCCESS, IBV_WC_SEND, "after errors");
	wc = poll_one(cqb, "recv after errors");
	expect(wc, 111, IBV_WC_SUCCESS, IBV_WC_RECV, "recv after errors");
	if (wc.byte_len != 16 || bufb[4608] != 0x43)
		FAIL("the receive after failed lists got %u bytes starting %#x", wc.byte_len, bufb[4608]);
	printf("PASS batch_error\n");

	/* ---- send_ops_flags. ---- */
	struct ibv_qp *qs = create_qp(IBV_QPT_RC, cqa, IBV_QP_EX_WITH_SEND, 4);
	struct ibv_qp_ex *xs = to_ex(qs);
	ibv_wr_start(xs);
	next(xs, 50);
	ibv_wr_rdma_write(xs, mrb->rkey, (uintptr_t)(bufb + 5120));
	ibv_wr_set_sge(xs, mra->lkey, (uintptr_t)bufa, 8);
	check_complete_fails(xs, EOPNOTSUPP, "op outside send_ops_flags");
	if (ibv_destroy_qp(qs))
		FAIL("destroy qs");
	struct {
		enum ibv_qp_type t;
		uint64_t ops;
	} refused[] = {
		{ IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ },
		{ IBV_QPT_UC, IBV_QP_EX_WITH_SEND_WITH_INV },
		{ IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE },
		{ IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_WRITE },
		{ IBV_QPT_RC, IBV_QP_EX_WITH_TSO },
	};
	for (unsigned i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		struct ibv_qp_init_attr_ex a;
		memset(&a, 0, sizeof a);
		a.qp_type = refused[i].t;
		a.send_cq = a.recv_cq = cqa;
		a.cap.max_send_wr = a.cap.max_recv_wr = 4;
		a.cap.max_send_sge = a.cap.max_recv_sge = 1;
		a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.pd = pd;
		a.send_ops_flags = refused[i].ops;
		errno = 0;
		struct ibv_qp *q = ibv_create_qp_ex(ctx, &a);
		if (q || errno != EOPNOTSUPP)
			FAIL("create_qp_ex type %d ops %#llx: %p errno %d, wanted NULL + EOPNOTSUPP",
			     refused[i].t, (unsigned long long)refused[i].ops, (void *)q, errno);
	}
	printf("PASS send_ops_flags\n");

	/* ---- Memory windows: bind, write, LOCAL_INV, write after invalidate. ---- */
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	if (!mw)
		FAIL("alloc_mw");
	uint32_t k1 = ibv_inc_rkey(mw->rkey);
	char *win = bufb + 6144;
	struct ibv_mw_bind_info bi = { mrb, (uintptr_t)win, 1024, IBV_ACCESS_REMOTE_WRITE };
	ibv_wr_start(xb);
	next(xb, 60);
	ibv_wr_bind_mw(xb, mw, k1, &bi);
	if ((rc = ibv_wr_complete(xb)))
		FAIL("bind: %s", strerror(rc));
	expect(poll_one(cqb, "bind"), 60, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "bind");
	for (int i = 0; i < 200; i++)
		bufa[i] = (char)(i * 11 + 1);
	write_one(xa, 61, win + 10, k1, 200);
	expect(poll_one(cqa, "write through window"), 61, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "write through window");
	if (memcmp(win + 10, bufa, 200))
		FAIL("write through the window: data differs");
	ibv_wr_start(xb);
	next(xb, 62);
	ibv_wr_local_inv(xb, k1);
	if ((rc = ibv_wr_complete(xb)))
		FAIL("local_inv: %s", strerror(rc));
	expect(poll_one(cqb, "local_inv"), 62, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, "local_inv");
	char before[1024];
	memcpy(before, win, sizeof before);
	memset(bufa, 0x5a, 64);
	write_one(xa, 63, win, k1, 64);
	expect(poll_one(cqa, "write after local_inv"), 63, IBV_WC_REM_ACCESS_ERR, -1, "write after local_inv");
	if (memcmp(before, win, sizeof before))
		FAIL("a write after LOCAL_INV changed the memory");
	printf("PASS mw_bind_local_inv\n");

	/* ---- SEND with Invalidate through ibv_wr_send_inv (a fresh pair). ---- */
	struct ibv_cq *cqc = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *cqd = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!cqc || !cqd)
		FAIL("cq c/d");
	struct ibv_qp *qc, *qd;
	rc_pair(cqc, cqd, &qc, &qd);
	struct ibv_qp_ex *xc = to_ex(qc), *xd = to_ex(qd);
	uint32_t k2 = ibv_inc_rkey(k1);
	ibv_wr_start(xd);
	next(xd, 70);
	ibv_wr_bind_mw(xd, mw, k2, &bi);
	if ((rc = ibv_wr_complete(xd)))
		FAIL("rebind: %s", strerror(rc));
	expect(poll_one(cqd, "rebind"), 70, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "rebind");
	post_recv(qd, 120, bufb + 4608, 256, mrb->lkey);
	ibv_wr_start(xc);
	next(xc, 71);
	ibv_wr_send_inv(xc, k2);
	ibv_wr_set_sge(xc, mra->lkey, (uintptr_t)bufa, 16);
	if ((rc = ibv_wr_complete(xc)))
		FAIL("send_inv: %s", strerror(rc));
	expect(poll_one(cqc, "send_inv"), 71, IBV_WC_SUCCESS, IBV_WC_SEND, "send_inv");
	wc = poll_one(cqd, "recv with inv");
	expect(wc, 120, IBV_WC_SUCCESS, IBV_WC_RECV, "recv with inv");
	if (!(wc.wc_flags & IBV_WC_WITH_INV) || wc.invalidated_rkey != k2)
		FAIL("recv: wc_flags %#x invalidated_rkey %#x, wanted WITH_INV and %#x", wc.wc_flags,
		     wc.invalidated_rkey, k2);
	memcpy(before, win, sizeof before);
	write_one(xc, 72, win, k2, 64);
	expect(poll_one(cqc, "write after send_inv"), 72, IBV_WC_REM_ACCESS_ERR, -1, "write after send_inv");
	if (memcmp(before, win, sizeof before))
		FAIL("a write after SEND with Invalidate changed the memory");
	printf("PASS mw_send_inv\n");

	/* ---- UC: SEND, SEND with immediate, WRITE, WRITE with immediate. ---- */
	struct ibv_cq *cqe = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *cqf = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!cqe || !cqf)
		FAIL("cq e/f");
	struct ibv_qp *ue = create_qp(IBV_QPT_UC, cqe, UC_OPS, 16);
	struct ibv_qp *uf = create_qp(IBV_QPT_UC, cqf, UC_OPS, 16);
	connect_qp(ue, uf->qp_num);
	connect_qp(uf, ue->qp_num);
	struct ibv_qp_ex *xe = to_ex(ue);
	memset(bufb + 10240, 0, 2048);
	for (int i = 0; i < 512; i++)
		bufa[i] = (char)(i * 3 + 2);
	post_recv(uf, 130, bufb + 10240, 256, mrb->lkey);
	post_recv(uf, 131, bufb + 10496, 256, mrb->lkey);
	post_recv(uf, 132, bufb + 10752, 256, mrb->lkey);
	ibv_wr_start(xe);
	next(xe, 80);
	ibv_wr_send(xe);
	ibv_wr_set_sge(xe, mra->lkey, (uintptr_t)bufa, 100);
	next(xe, 81);
	ibv_wr_send_imm(xe, htobe32(0xabcdef01));
	ibv_wr_set_sge(xe, mra->lkey, (uintptr_t)(bufa + 100), 50);
	next(xe, 82);
	ibv_wr_rdma_write(xe, mrb->rkey, (uintptr_t)(bufb + 11264));
	ibv_wr_set_sge(xe, mra->lkey, (uintptr_t)(bufa + 150), 300);
	next(xe, 83);
	ibv_wr_rdma_write_imm(xe, mrb->rkey, (uintptr_t)(bufb + 11776), htobe32(0x01020304));
	ibv_wr_set_sge(xe, mra->lkey, (uintptr_t)(bufa + 450), 40);
	if ((rc = ibv_wr_complete(xe)))
		FAIL("uc list: %s", strerror(rc));
	static const int uc_op[] = { IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE };
	for (int i = 0; i < 4; i++)
		expect(poll_one(cqe, "uc list"), 80 + i, IBV_WC_SUCCESS, uc_op[i], "uc list");
	wc = poll_one(cqf, "uc recv send");
	expect(wc, 130, IBV_WC_SUCCESS, IBV_WC_RECV, "uc recv send");
	if (wc.byte_len != 100 || memcmp(bufb + 10240, bufa, 100))
		FAIL("uc send: data differs");
	wc = poll_one(cqf, "uc recv send_imm");
	expect(wc, 131, IBV_WC_SUCCESS, IBV_WC_RECV, "uc recv send_imm");
	if (wc.byte_len != 50 || be32toh(wc.imm_data) != 0xabcdef01 || memcmp(bufb + 10496, bufa + 100, 50))
		FAIL("uc send_imm: data or imm differs");
	wc = poll_one(cqf, "uc recv write_imm");
	expect(wc, 132, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, "uc recv write_imm");
	if (be32toh(wc.imm_data) != 0x01020304)
		FAIL("uc write_imm: imm %#x", be32toh(wc.imm_data));
	if (memcmp(bufb + 11264, bufa + 150, 300) || memcmp(bufb + 11776, bufa + 450, 40))
		FAIL("uc write: data differs");
	printf("PASS uc\n");

	/* ---- UC memory window: bind with ibv_wr_bind_mw on the owner's UC QP, WRITE through
	   it, ibv_wr_local_inv, then a WRITE with the invalidated key is dropped silently (UC
	   responder errors are silent drops) and the memory stays untouched. ---- */
	struct ibv_qp_ex *xf = to_ex(uf);
	struct ibv_mw *umw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	if (!umw)
		FAIL("alloc_mw (uc)");
	uint32_t uk = ibv_inc_rkey(umw->rkey);
	char *uwin = bufb + 14336;
	struct ibv_mw_bind_info ubi = { mrb, (uintptr_t)uwin, 512, IBV_ACCESS_REMOTE_WRITE };
	ibv_wr_start(xf);
	next(xf, 84);
	ibv_wr_bind_mw(xf, umw, uk, &ubi);
	if ((rc = ibv_wr_complete(xf)))
		FAIL("uc bind: %s", strerror(rc));
	expect(poll_one(cqf, "uc bind"), 84, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "uc bind");
	for (int i = 0; i < 100; i++)
		bufa[i] = (char)(i * 7 + 3);
	write_one(xe, 85, uwin + 4, uk, 100);
	expect(poll_one(cqe, "uc write through window"), 85, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
	       "uc write through window");
	double until = now() + 10;
	while (memcmp(uwin + 4, bufa, 100) && now() < until)
		;
	if (memcmp(uwin + 4, bufa, 100))
		FAIL("uc write through the window: data differs");
	ibv_wr_start(xf);
	next(xf, 86);
	ibv_wr_local_inv(xf, uk);
	if ((rc = ibv_wr_complete(xf)))
		FAIL("uc local_inv: %s", strerror(rc));
	expect(poll_one(cqf, "uc local_inv"), 86, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, "uc local_inv");
	memcpy(before, uwin, 512);
	memset(bufa, 0x6b, 64);
	write_one(xe, 87, uwin, uk, 64);
	expect(poll_one(cqe, "uc write after local_inv"), 87, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE,
	       "uc write after local_inv (the sender cannot know)");
	/* A later WRITE with immediate through the region itself proves the dropped one was
	   processed before it (UC delivers in order). */
	post_recv(uf, 133, bufb + 10240, 256, mrb->lkey);
	ibv_wr_start(xe);
	next(xe, 88);
	ibv_wr_rdma_write_imm(xe, mrb->rkey, (uintptr_t)(bufb + 15360), htobe32(88));
	ibv_wr_set_sge(xe, mra->lkey, (uintptr_t)bufa, 8);
	if ((rc = ibv_wr_complete(xe)))
		FAIL("uc write_imm after: %s", strerror(rc));
	expect(poll_one(cqe, "uc write_imm after"), 88, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "uc write_imm after");
	expect(poll_one(cqf, "uc recv after"), 133, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, "uc recv after");
	if (memcmp(before, uwin, 512))
		FAIL("a UC write after LOCAL_INV changed the memory");
	if (ibv_dealloc_mw(umw))
		FAIL("dealloc_mw (uc)");
	printf("PASS uc_mw\n");

	/* ---- UD: SEND and SEND with immediate with ibv_wr_set_ud_addr. ---- */
	struct ibv_qp *ug = create_qp(IBV_QPT_UD, cqe, UD_OPS, 16);
	struct ibv_qp *uh = create_qp(IBV_QPT_UD, cqf, UD_OPS, 16);
	connect_qp(ug, 0);
	connect_qp(uh, 0);
	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof aa);
	aa.is_global = 1;
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 64;
	aa.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		FAIL("create_ah");
	struct ibv_qp_ex *xg = to_ex(ug);
	post_recv(uh, 140, bufb + 12288, 40 + 256, mrb->lkey);
	post_recv(uh, 141, bufb + 12800, 40 + 256, mrb->lkey);
	ibv_wr_start(xg);
	next(xg, 90);
	ibv_wr_send(xg);
	ibv_wr_set_ud_addr(xg, ah, uh->qp_num, QKEY);
	ibv_wr_set_sge(xg, mra->lkey, (uintptr_t)bufa, 200);
	next(xg, 91);
	ibv_wr_send_imm(xg, htobe32(0x0badcafe));
	ibv_wr_set_ud_addr(xg, ah, uh->qp_num, QKEY);
	ibv_wr_set_inline_data(xg, (void *)inl, 12);
	if ((rc = ibv_wr_complete(xg)))
		FAIL("ud list: %s", strerror(rc));
	expect(poll_one(cqe, "ud send"), 90, IBV_WC_SUCCESS, IBV_WC_SEND, "ud send");
	expect(poll_one(cqe, "ud send_imm"), 91, IBV_WC_SUCCESS, IBV_WC_SEND, "ud send_imm");
	wc = poll_one(cqf, "ud recv");
	expect(wc, 140, IBV_WC_SUCCESS, IBV_WC_RECV, "ud recv");
	if (wc.byte_len != 40 + 200 || wc.src_qp != ug->qp_num || memcmp(bufb + 12288 + 40, bufa, 200))
		FAIL("ud send: byte_len %u src_qp %u or data differs", wc.byte_len, wc.src_qp);
	wc = poll_one(cqf, "ud recv imm");
	expect(wc, 141, IBV_WC_SUCCESS, IBV_WC_RECV, "ud recv imm");
	if (wc.byte_len != 40 + 12 || be32toh(wc.imm_data) != 0x0badcafe || memcmp(bufb + 12800 + 40, inl, 12))
		FAIL("ud send_imm: byte_len %u imm %#x or data differs", wc.byte_len, be32toh(wc.imm_data));
	printf("PASS ud\n");

	/* ---- XRC: SEND with ibv_wr_set_xrc_srqn to an XRC SRQ. ---- */
	struct ibv_xrcd_init_attr xa_attr = { IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS, -1, O_CREAT };
	struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &xa_attr);
	if (!xrcd)
		FAIL("open_xrcd: %s", strerror(errno));
	struct ibv_srq_init_attr_ex sa;
	memset(&sa, 0, sizeof sa);
	sa.attr.max_wr = 8;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
	sa.srq_type = IBV_SRQT_XRC;
	sa.xrcd = xrcd;
	sa.cq = cqf;
	sa.pd = pd;
	struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
	if (!srq)
		FAIL("create_srq_ex: %s", strerror(errno));
	uint32_t srqn;
	if (ibv_get_srq_num(srq, &srqn))
		FAIL("get_srq_num");
	struct ibv_qp_init_attr_ex ta;
	memset(&ta, 0, sizeof ta);
	ta.qp_type = IBV_QPT_XRC_RECV;
	ta.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	ta.xrcd = xrcd;
	struct ibv_qp *tq = ibv_create_qp_ex(ctx, &ta);
	if (!tq)
		FAIL("create XRC_RECV: %s", strerror(errno));
	struct ibv_qp *sq = create_qp(IBV_QPT_XRC_SEND, cqe, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, 16);
	connect_qp(tq, sq->qp_num);
	connect_qp(sq, tq->qp_num);
	struct ibv_sge rs = { (uintptr_t)(bufb + 13312), 256, mrb->lkey };
	struct ibv_recv_wr rw, *rbad;
	memset(&rw, 0, sizeof rw);
	rw.wr_id = 150;
	rw.sg_list = &rs;
	rw.num_sge = 1;
	if (ibv_post_srq_recv(srq, &rw, &rbad))
		FAIL("post_srq_recv");
	struct ibv_qp_ex *xq = to_ex(sq);
	for (int i = 0; i < 128; i++)
		bufa[i] = (char)(i * 17 + 9);
	ibv_wr_start(xq);
	next(xq, 95);
	ibv_wr_send_imm(xq, htobe32(0x600d));
	ibv_wr_set_xrc_srqn(xq, srqn);
	ibv_wr_set_sge(xq, mra->lkey, (uintptr_t)bufa, 128);
	if ((rc = ibv_wr_complete(xq)))
		FAIL("xrc list: %s", strerror(rc));
	expect(poll_one(cqe, "xrc send"), 95, IBV_WC_SUCCESS, IBV_WC_SEND, "xrc send");
	wc = poll_one(cqf, "xrc recv");
	expect(wc, 150, IBV_WC_SUCCESS, IBV_WC_RECV, "xrc recv");
	if (wc.byte_len != 128 || be32toh(wc.imm_data) != 0x600d || memcmp(bufb + 13312, bufa, 128))
		FAIL("xrc send: byte_len %u imm %#x or data differs", wc.byte_len, be32toh(wc.imm_data));
	printf("PASS xrc\n");

	/* Teardown. */
	if (ibv_destroy_qp(sq) || ibv_destroy_qp(tq) || ibv_destroy_srq(srq) || ibv_close_xrcd(xrcd))
		FAIL("xrc teardown");
	if (ibv_destroy_ah(ah) || ibv_destroy_qp(ug) || ibv_destroy_qp(uh) || ibv_destroy_qp(ue) ||
	    ibv_destroy_qp(uf))
		FAIL("uc/ud teardown");
	if (ibv_dealloc_mw(mw))
		FAIL("dealloc_mw");
	if (ibv_destroy_qp(qa) || ibv_destroy_qp(qb) || ibv_destroy_qp(qc) || ibv_destroy_qp(qd))
		FAIL("destroy_qp");
	if (ibv_dereg_mr(mrb) || ibv_dereg_mr(mra))
		FAIL("dereg_mr");
	if (ibv_destroy_cq(cqa) || ibv_destroy_cq(cqb) || ibv_destroy_cq(cqc) || ibv_destroy_cq(cqd) ||
	    ibv_destroy_cq(cqe) || ibv_destroy_cq(cqf) || ibv_dealloc_pd(pd))
		FAIL("teardown");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("PASS teardown\n");
	return 0;
}
