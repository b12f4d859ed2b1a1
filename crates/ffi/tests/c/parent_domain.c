/* Thread domains and parent domains (ibv_alloc_td, ibv_alloc_parent_domain with custom
   allocators and pd_context), used wherever a PD is: two RC QPs a -> b created on one
   parent domain, their MRs registered on it, their extended CQs created with
   IBV_CQ_INIT_ATTR_MASK_PD naming it; SEND and RDMA WRITE with the data checked.
   Then the lifetime rules: the protection domain and the thread domain are busy while the
   parent domain exists, the parent domain while objects made through it live; everything
   is freed in order. The allocators are counted: uroce keeps its queues in Rust and never
   calls them (as the documentation permits), which the output states.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "rc_loopback.h"

static struct ibv_context *ctx;

static int allocs, frees;

static void *count_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
			 uint64_t resource_type)
{
	(void)pd; (void)pd_context; (void)size; (void)alignment; (void)resource_type;
	allocs++;
	return IBV_ALLOCATOR_USE_DEFAULT;
}

static void count_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type)
{
	(void)pd; (void)pd_context; (void)ptr; (void)resource_type;
	frees++;
}

static void wait_one(struct ibv_cq_ex *cq, uint64_t wr_id, int opcode, const char *what)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	double end = now() + 10;
	for (;;) {
		int r = ibv_start_poll(cq, &attr);
		if (r == 0)
			break;
		if (r != ENOENT || now() > end)
			FAIL("%s: ibv_start_poll %d", what, r);
	}
	if (cq->status != IBV_WC_SUCCESS || cq->wr_id != wr_id ||
	    (int)ibv_wc_read_opcode(cq) != opcode)
		FAIL("%s: status %d wr_id %llu opcode %d", what, cq->status,
		     (unsigned long long)cq->wr_id, ibv_wc_read_opcode(cq));
	ibv_end_poll(cq);
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

	struct ibv_td_init_attr tda = { .comp_mask = 1 };
	errno = 0;
	if (ibv_alloc_td(ctx, &tda) || errno != EINVAL)
		FAIL("alloc_td with comp_mask 1: errno %d", errno);
	tda.comp_mask = 0;
	struct ibv_td *td = ibv_alloc_td(ctx, &tda);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!td || !pd || td->context != ctx)
		FAIL("td/pd: errno %d", errno);
	int cookie = 42;
	struct ibv_parent_domain_init_attr pda = {
		.pd = pd, .td = td,
		.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
		.alloc = count_alloc, .free = count_free, .pd_context = &cookie,
	};
	struct ibv_pd *par = ibv_alloc_parent_domain(ctx, &pda);
	if (!par || par == pd || par->context != ctx)
		FAIL("alloc_parent_domain: errno %d", errno);
	struct ibv_parent_domain_init_attr bad = pda;
	bad.pd = par;
	errno = 0;
	if (ibv_alloc_parent_domain(ctx, &bad) || errno != EINVAL)
		FAIL("parent domain of a parent domain: errno %d", errno);
	bad = pda;
	bad.free = NULL;
	errno = 0;
	if (ibv_alloc_parent_domain(ctx, &bad) || errno != EINVAL)
		FAIL("ALLOCATORS without free: errno %d", errno);
	printf("PASS alloc\n");

	struct ibv_cq_init_attr_ex cia;
	memset(&cia, 0, sizeof cia);
	cia.cqe = 16;
	cia.wc_flags = IBV_WC_STANDARD_FLAGS;
	cia.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	cia.parent_domain = pd;
	errno = 0;
	if (ibv_create_cq_ex(ctx, &cia) || errno != EINVAL)
		FAIL("CQ with a plain PD as parent domain: errno %d", errno);
	cia.parent_domain = par;
	struct ibv_cq_ex *acq = ibv_create_cq_ex(ctx, &cia), *bcq = ibv_create_cq_ex(ctx, &cia);
	if (!acq || !bcq)
		FAIL("CQ on the parent domain: errno %d", errno);

	static char abuf[8192], bbuf[8192], wbuf[8192];
	struct ibv_mr *amr = ibv_reg_mr(par, abuf, sizeof abuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *bmr = ibv_reg_mr(par, bbuf, sizeof bbuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *wmr = ibv_reg_mr(par, wbuf, sizeof wbuf,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!amr || !bmr || !wmr || amr->pd != par)
		FAIL("reg_mr on the parent domain: errno %d", errno);
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 8;
	ia.cap.max_recv_wr = 8;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(acq);
	struct ibv_qp *a = ibv_create_qp(par, &ia);
	ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(bcq);
	struct ibv_qp_init_attr_ex iax;
	memset(&iax, 0, sizeof iax);
	iax.qp_type = IBV_QPT_RC;
	iax.cap = ia.cap;
	iax.send_cq = iax.recv_cq = ibv_cq_ex_to_cq(bcq);
	iax.comp_mask = IBV_QP_INIT_ATTR_PD;
	iax.pd = par;
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &iax);
	if (!a || !b || a->pd != par || b->pd != par)
		FAIL("create_qp / create_qp_ex on the parent domain: errno %d", errno);
	to_rts(a, b->qp_num, &gid);
	to_rts(b, a->qp_num, &gid);
	printf("PASS objects\n");

	for (int i = 0; i < (int)sizeof abuf; i++)
		abuf[i] = (char)(i * 13 + 5);
	struct ibv_sge rsge = { (uintptr_t)bbuf, sizeof bbuf, bmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	struct ibv_sge ssge = { (uintptr_t)abuf, 5000, amr->lkey };
	struct ibv_send_wr swr = { .wr_id = 8, .sg_list = &ssge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
	if (ibv_post_recv(b, &rwr, &bad_r) || ibv_post_send(a, &swr, &bad_s))
		FAIL("post send");
	wait_one(acq, 8, IBV_WC_SEND, "send");
	wait_one(bcq, 7, IBV_WC_RECV, "recv");
	if (memcmp(abuf, bbuf, 5000))
		FAIL("send: data differs");
	struct ibv_sge wsge = { (uintptr_t)abuf + 100, 6000, amr->lkey };
	struct ibv_send_wr wwr = { .wr_id = 9, .sg_list = &wsge, .num_sge = 1,
				   .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED }, *bad_w;
	wwr.wr.rdma.remote_addr = (uintptr_t)wbuf + 64;
	wwr.wr.rdma.rkey = wmr->rkey;
	if (ibv_post_send(a, &wwr, &bad_w))
		FAIL("post write");
	wait_one(acq, 9, IBV_WC_RDMA_WRITE, "write");
	if (memcmp(abuf + 100, wbuf + 64, 6000))
		FAIL("write: data differs");
	printf("PASS traffic\n");

	if (ibv_dealloc_pd(pd) != EBUSY)
		FAIL("dealloc of the protection domain under a parent domain: EBUSY expected");
	if (ibv_dealloc_td(td) != EBUSY)
		FAIL("dealloc of a thread domain in use: EBUSY expected");
	if (ibv_dealloc_pd(par) != EBUSY)
		FAIL("dealloc of a parent domain with QPs and MRs: EBUSY expected");
	printf("PASS busy\n");

	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_dereg_mr(amr) || ibv_dereg_mr(bmr) ||
	    ibv_dereg_mr(wmr))
		FAIL("destroy QPs and MRs");
	if (ibv_dealloc_pd(par) != EBUSY)
		FAIL("dealloc of a parent domain with extended CQs: EBUSY expected");
	if (ibv_destroy_cq(ibv_cq_ex_to_cq(acq)) || ibv_destroy_cq(ibv_cq_ex_to_cq(bcq)))
		FAIL("destroy CQs");
	struct ibv_mw *mw = ibv_alloc_mw(par, IBV_MW_TYPE_2);
	if (!mw || mw->pd != par)
		FAIL("alloc_mw on the parent domain: errno %d", errno);
	if (ibv_dealloc_pd(par) != EBUSY)
		FAIL("dealloc of a parent domain with a memory window: EBUSY expected");
	if (ibv_dealloc_mw(mw))
		FAIL("dealloc_mw");
	printf("PASS busy_cq_mw\n");
	int r1 = ibv_dealloc_pd(par), r2 = ibv_dealloc_td(td), r3 = ibv_dealloc_pd(pd);
	if (r1 || r2 || r3)
		FAIL("dealloc parent %d td %d pd %d", r1, r2, r3);
	if (ibv_close_device(ctx))
		FAIL("close");
	ibv_free_device_list(list);
	printf("PASS teardown allocator calls %d/%d\n", allocs, frees);
	return 0;
}
