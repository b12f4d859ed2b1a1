/* Memory windows through the C API, in one process: two RC QPs of the one device connected
   to each other; QP b owns the windows, QP a accesses them. The expectations are the verbs
   API's (ibv_alloc_mw, ibv_bind_mw, ibv_post_send with IBV_WR_BIND_MW, IBV_WR_LOCAL_INV and
   IBV_WR_SEND_WITH_INV) and IBA 10.6.7's:
   - a type 1 window bound with ibv_bind_mw completes with IBV_WC_BIND_MW, and an RDMA WRITE
     with its new mw->rkey lands inside the window;
   - a type 2 window bound with an IBV_WR_BIND_MW work request (new key from ibv_inc_rkey)
     accepts a WRITE with that key;
   - IBV_WR_LOCAL_INV completes with IBV_WC_LOCAL_INV;
   - ibv_dereg_mr of a region with a bound window fails with EBUSY;
   - a rebound type 2 window is invalidated by the peer's SEND with Invalidate: the receive
     completion carries IBV_WC_WITH_INV and the key in invalidated_rkey;
   - a WRITE with the invalidated key completes with IBV_WC_REM_ACCESS_ERR and leaves the
     target memory untouched;
   - ibv_dealloc_mw of a bound window succeeds, after which the region can be deregistered.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *gid)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		FAIL("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("RTS");
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

static void expect(struct ibv_wc wc, uint64_t wr_id, enum ibv_wc_status st, int opcode, const char *what)
{
	if (wc.wr_id != wr_id || wc.status != st || (opcode >= 0 && (int)wc.opcode != opcode))
		FAIL("%s: wr_id %llu status %s opcode %d (wanted %llu %s %d)", what,
		     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), (int)wc.opcode,
		     (unsigned long long)wr_id, ibv_wc_status_str(st), opcode);
}

static struct ibv_qp *qa, *qb;
static struct ibv_cq *cqa, *cqb;
static struct ibv_mr *mra, *mrb;
static char bufa[4096], bufb[4096];

static void write_to(uint64_t wr_id, char *dst, uint32_t rkey, uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)bufa, len, mra->lkey };
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = (uintptr_t)dst;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qa, &wr, &bad))
		FAIL("post write %llu", (unsigned long long)wr_id);
}

static void bind_type2(struct ibv_mw *mw, uint32_t rkey, char *addr, uint64_t wr_id)
{
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = rkey;
	wr.bind_mw.bind_info.mr = mrb;
	wr.bind_mw.bind_info.addr = (uintptr_t)addr;
	wr.bind_mw.bind_info.length = 1024;
	wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_post_send(qb, &wr, &bad))
		FAIL("post BIND_MW");
	expect(poll_one(cqb, "bind type 2"), wr_id, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "bind type 2");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("open");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cqa = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	cqb = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cqa || !cqb)
		FAIL("pd/cq");
	mra = ibv_reg_mr(pd, bufa, sizeof bufa, IBV_ACCESS_LOCAL_WRITE);
	mrb = ibv_reg_mr(pd, bufb, sizeof bufb,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			 IBV_ACCESS_MW_BIND);
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 8;
	ia.cap.max_recv_wr = 8;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.send_cq = ia.recv_cq = cqa;
	qa = ibv_create_qp(pd, &ia);
	ia.send_cq = ia.recv_cq = cqb;
	qb = ibv_create_qp(pd, &ia);
	if (!mra || !mrb || !qa || !qb)
		FAIL("mr/qp");
	connect_qp(qa, qb->qp_num, &gid);
	connect_qp(qb, qa->qp_num, &gid);

	/* Type 1: ibv_bind_mw, then a WRITE through the window. */
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	if (!mw1 || mw1->type != IBV_MW_TYPE_1)
		FAIL("alloc_mw type 1");
	uint32_t unbound = mw1->rkey;
	struct ibv_mw_bind b1;
	memset(&b1, 0, sizeof b1);
	b1.wr_id = 1;
	b1.send_flags = IBV_SEND_SIGNALED;
	b1.bind_info.mr = mrb;
	b1.bind_info.addr = (uintptr_t)(bufb + 1024);
	b1.bind_info.length = 1024;
	b1.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
	int rc = ibv_bind_mw(qb, mw1, &b1);
	if (rc)
		FAIL("ibv_bind_mw: %s", strerror(rc));
	expect(poll_one(cqb, "bind type 1"), 1, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "bind type 1");
	if (mw1->rkey == unbound)
		FAIL("ibv_bind_mw left mw->rkey unchanged");
	for (int i = 0; i < 512; i++)
		bufa[i] = (char)(i * 7 + 1);
	write_to(10, bufb + 1024 + 100, mw1->rkey, 512);
	expect(poll_one(cqa, "write type 1"), 10, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "write type 1");
	if (memcmp(bufb + 1024 + 100, bufa, 512))
		FAIL("write through the type 1 window: data differs");
	printf("PASS type1_bind_write\n");

	/* Type 2: an IBV_WR_BIND_MW work request with a new key, then a WRITE. */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	if (!mw2)
		FAIL("alloc_mw type 2");
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	bind_type2(mw2, k2, bufb + 2048, 2);
	for (int i = 0; i < 256; i++)
		bufa[i] = (char)(i * 3 + 5);
	write_to(11, bufb + 2048, k2, 256);
	expect(poll_one(cqa, "write type 2"), 11, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "write type 2");
	if (memcmp(bufb + 2048, bufa, 256))
		FAIL("write through the type 2 window: data differs");
	printf("PASS type2_bind_write\n");

	/* LOCAL_INV of the type 2 window. */
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = 3;
	wr.opcode = IBV_WR_LOCAL_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.invalidate_rkey = k2;
	if (ibv_post_send(qb, &wr, &bad))
		FAIL("post LOCAL_INV");
	expect(poll_one(cqb, "local inv"), 3, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, "local inv");
	printf("PASS local_inv\n");

	/* The region has bound windows: EBUSY. */
	rc = ibv_dereg_mr(mrb);
	if (rc != EBUSY)
		FAIL("dereg_mr with bound windows returned %d, wanted EBUSY", rc);
	printf("PASS dereg_busy\n");

	/* Rebind with the next key; the peer's SEND with Invalidate invalidates it. */
	uint32_t k3 = ibv_inc_rkey(k2);
	bind_type2(mw2, k3, bufb + 2048, 4);
	struct ibv_sge rs = { (uintptr_t)bufb, 256, mrb->lkey };
	struct ibv_recv_wr rwr, *rbad;
	memset(&rwr, 0, sizeof rwr);
	rwr.wr_id = 20;
	rwr.sg_list = &rs;
	rwr.num_sge = 1;
	if (ibv_post_recv(qb, &rwr, &rbad))
		FAIL("post recv");
	struct ibv_sge ss = { (uintptr_t)bufa, 16, mra->lkey };
	memset(&wr, 0, sizeof wr);
	wr.wr_id = 12;
	wr.opcode = IBV_WR_SEND_WITH_INV;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.sg_list = &ss;
	wr.num_sge = 1;
	wr.invalidate_rkey = k3;
	if (ibv_post_send(qa, &wr, &bad))
		FAIL("post SEND_WITH_INV");
	expect(poll_one(cqa, "send with inv"), 12, IBV_WC_SUCCESS, IBV_WC_SEND, "send with inv");
	struct ibv_wc wc = poll_one(cqb, "recv with inv");
	expect(wc, 20, IBV_WC_SUCCESS, IBV_WC_RECV, "recv with inv");
	if (!(wc.wc_flags & IBV_WC_WITH_INV) || wc.invalidated_rkey != k3)
		FAIL("recv: wc_flags %#x invalidated_rkey %#x, wanted WITH_INV and %#x",
		     wc.wc_flags, wc.invalidated_rkey, k3);
	printf("PASS send_with_inv\n");

	/* A WRITE with the invalidated key: REM_ACCESS_ERR, memory untouched. */
	char before[1024];
	memcpy(before, bufb + 2048, sizeof before);
	memset(bufa, 0x5a, 64);
	write_to(13, bufb + 2048, k3, 64);
	expect(poll_one(cqa, "write after invalidate"), 13, IBV_WC_REM_ACCESS_ERR, -1,
	       "write after invalidate");
	if (memcmp(before, bufb + 2048, sizeof before))
		FAIL("write after invalidate changed the memory");
	printf("PASS write_after_invalidate\n");

	/* Deallocating a bound window is allowed; then the region can go. */
	if (ibv_dealloc_mw(mw1) || ibv_dealloc_mw(mw2))
		FAIL("dealloc_mw");
	if (ibv_destroy_qp(qa) || ibv_destroy_qp(qb))
		FAIL("destroy_qp");
	if (ibv_dereg_mr(mrb) || ibv_dereg_mr(mra))
		FAIL("dereg_mr after dealloc_mw");
	if (ibv_destroy_cq(cqa) || ibv_destroy_cq(cqb) || ibv_dealloc_pd(pd))
		FAIL("teardown");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("PASS teardown\n");
	return 0;
}
