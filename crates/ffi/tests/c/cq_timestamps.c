/* Completion timestamps of extended CQs (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP in device
   clock cycles, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK in ns of CLOCK_REALTIME),
   the device clock of ibv_query_device_ex (hca_core_clock, completion_timestamp_mask) and
   ibv_query_rt_values_ex, in one process: two RC QPs a -> b of one device.
   Checks: hca_core_clock and the mask are non-zero; the raw clock advances at
   hca_core_clock (cycles over a measured CLOCK_MONOTONIC interval, within 2%);
   each completion's cycle stamp lies between raw clock reads taken before the post and
   after the poll, and its wall-clock stamp between CLOCK_REALTIME reads taken the same
   way; stamps never decrease along a CQ, whether the completions before were taken with
   ibv_poll_cq or the extended API; a CQ created without the flags has no timestamp
   accessors. Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "rc_loopback.h"

#define N 32

static uint64_t ns_of(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static struct ibv_context *ctx;

/* The device's raw clock, in cycles. */
static uint64_t raw_cycles(void)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	int r = ibv_query_rt_values_ex(ctx, &v);
	if (r)
		FAIL("ibv_query_rt_values_ex: %d", r);
	if (!(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK))
		FAIL("ibv_query_rt_values_ex: RAW_CLOCK not returned");
	return (uint64_t)v.raw_clock.tv_sec * 1000000000ull + (uint64_t)v.raw_clock.tv_nsec;
}

struct stamp {
	uint64_t wr_id, cycles, wall;
	int status;
};

/* Waits for one completion through the extended API and returns its stamps. */
static void poll_ex(struct ibv_cq_ex *cq, struct stamp *s, const char *what)
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
			FAIL("%s: no completion", what);
	}
	s->wr_id = cq->wr_id;
	s->status = cq->status;
	s->cycles = ibv_wc_read_completion_ts(cq);
	s->wall = ibv_wc_read_completion_wallclock_ns(cq);
	ibv_end_poll(cq);
}

static void poll_legacy(struct ibv_cq_ex *cq, uint64_t wr_id, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 10;
	for (;;) {
		int r = ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc);
		if (r == 1)
			break;
		if (r < 0 || now() > end)
			FAIL("%s: ibv_poll_cq %d", what, r);
	}
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != wr_id)
		FAIL("%s: status %d wr_id %llu", what, wc.status, (unsigned long long)wc.wr_id);
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

	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(ctx, NULL, &dx))
		FAIL("ibv_query_device_ex");
	if (!dx.hca_core_clock || !dx.completion_timestamp_mask)
		FAIL("hca_core_clock %llu mask %#llx", (unsigned long long)dx.hca_core_clock,
		     (unsigned long long)dx.completion_timestamp_mask);
	/* The raw clock runs at hca_core_clock (kHz). */
	double t0 = now();
	uint64_t c0 = raw_cycles();
	struct timespec nap = { 0, 50 * 1000 * 1000 };
	nanosleep(&nap, NULL);
	uint64_t c1 = raw_cycles();
	double t1 = now();
	double ms = (t1 - t0) * 1e3, dev_ms = (double)(c1 - c0) / (double)dx.hca_core_clock;
	if (c1 <= c0 || dev_ms < ms * 0.98 || dev_ms > ms * 1.02)
		FAIL("raw clock: %.3f ms of device clock over %.3f ms", dev_ms, ms);
	printf("PASS core_clock %llu kHz mask %#llx: %.3f ms of device clock over %.3f ms\n",
	       (unsigned long long)dx.hca_core_clock,
	       (unsigned long long)dx.completion_timestamp_mask, dev_ms, ms);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq_init_attr_ex cia;
	memset(&cia, 0, sizeof cia);
	cia.cqe = 2 * N;
	cia.wc_flags = IBV_WC_STANDARD_FLAGS;
	struct ibv_cq_ex *plain = ibv_create_cq_ex(ctx, &cia);
	if (!pd || !plain)
		FAIL("pd / plain CQ");
	if (plain->read_completion_ts || plain->read_completion_wallclock_ns)
		FAIL("a CQ without timestamp flags has timestamp accessors");
	ibv_destroy_cq(ibv_cq_ex_to_cq(plain));
	cia.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
		       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
	struct ibv_cq_ex *acq = ibv_create_cq_ex(ctx, &cia), *bcq = ibv_create_cq_ex(ctx, &cia);
	if (!acq || !bcq)
		FAIL("create_cq_ex with timestamps: errno %d", errno);
	printf("PASS create\n");

	static char abuf[4096], bbuf[N][64];
	struct ibv_mr *amr = ibv_reg_mr(pd, abuf, sizeof abuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *bmr = ibv_reg_mr(pd, bbuf, sizeof bbuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = N;
	ia.cap.max_recv_wr = N;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(acq);
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	ia.send_cq = ia.recv_cq = ibv_cq_ex_to_cq(bcq);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	if (!amr || !bmr || !a || !b)
		FAIL("mr/qp");
	to_rts(a, b->qp_num, &gid);
	to_rts(b, a->qp_num, &gid);

	/* N sends, one at a time: the stamps of each lie within its own window. Every
	   fourth completion is taken with ibv_poll_cq (no stamp read) to check that the
	   stamps stay with their completions. */
	struct stamp prev_s = { 0 }, prev_r = { 0 };
	int stamped = 0;
	for (int i = 0; i < N; i++) {
		for (int k = 0; k < 64; k++)
			abuf[k] = (char)(i * 7 + k);
		struct ibv_sge rsge = { (uintptr_t)bbuf[i], 64, bmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 1000 + i, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
		struct ibv_sge ssge = { (uintptr_t)abuf, 64, amr->lkey };
		struct ibv_send_wr swr = { .wr_id = 2000 + i, .sg_list = &ssge, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
		if (ibv_post_recv(b, &rwr, &bad_r))
			FAIL("post_recv");
		uint64_t c_before = raw_cycles(), w_before = ns_of(CLOCK_REALTIME);
		if (ibv_post_send(a, &swr, &bad_s))
			FAIL("post_send");
		if (i % 4 == 3) {
			poll_legacy(acq, 2000 + i, "send (ibv_poll_cq)");
			poll_legacy(bcq, 1000 + i, "recv (ibv_poll_cq)");
		} else {
			struct stamp s, r;
			poll_ex(acq, &s, "send");
			poll_ex(bcq, &r, "recv");
			uint64_t c_after = raw_cycles(), w_after = ns_of(CLOCK_REALTIME);
			if (s.status || r.status || s.wr_id != 2000u + i || r.wr_id != 1000u + i)
				FAIL("completion %d: status %d/%d wr_id %llu/%llu", i, s.status,
				     r.status, (unsigned long long)s.wr_id, (unsigned long long)r.wr_id);
			struct stamp *both[2] = { &s, &r };
			for (int j = 0; j < 2; j++) {
				struct stamp *x = both[j];
				if (x->cycles < c_before || x->cycles > c_after)
					FAIL("completion %d/%d: cycles %llu outside [%llu, %llu]", i, j,
					     (unsigned long long)x->cycles,
					     (unsigned long long)c_before,
					     (unsigned long long)c_after);
				if (x->wall < w_before || x->wall > w_after)
					FAIL("completion %d/%d: wallclock %llu outside [%llu, %llu]", i,
					     j, (unsigned long long)x->wall,
					     (unsigned long long)w_before,
					     (unsigned long long)w_after);
			}
			if (s.cycles < prev_s.cycles || r.cycles < prev_r.cycles ||
			    s.wall < prev_s.wall || r.wall < prev_r.wall)
				FAIL("completion %d: a stamp went back", i);
			prev_s = s;
			prev_r = r;
			stamped++;
		}
		if (memcmp(abuf, bbuf[i], 64))
			FAIL("completion %d: data differs", i);
	}
	printf("PASS window %d completions stamped\n", stamped);

	/* A burst: several completions queued before the poll, walked by one session. */
	for (int i = 0; i < 8; i++) {
		struct ibv_sge rsge = { (uintptr_t)bbuf[i], 64, bmr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 3000 + i, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
		struct ibv_sge ssge = { (uintptr_t)abuf, 64, amr->lkey };
		struct ibv_send_wr swr = { .wr_id = 4000 + i, .sg_list = &ssge, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
		if (ibv_post_recv(b, &rwr, &bad_r) || ibv_post_send(a, &swr, &bad_s))
			FAIL("post (burst)");
	}
	uint64_t last = prev_r.cycles;
	for (int i = 0; i < 8; i++) {
		struct stamp r;
		poll_ex(bcq, &r, "burst recv");
		if (r.wr_id != 3000u + i || r.cycles < last)
			FAIL("burst %d: wr_id %llu cycles %llu after %llu", i,
			     (unsigned long long)r.wr_id, (unsigned long long)r.cycles,
			     (unsigned long long)last);
		last = r.cycles;
	}
	for (int i = 0; i < 8; i++) {
		struct stamp s;
		poll_ex(acq, &s, "burst send");
		if (s.wr_id != 4000u + i)
			FAIL("burst send %d", i);
	}
	printf("PASS monotonic\n");

	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_dereg_mr(amr) || ibv_dereg_mr(bmr) ||
	    ibv_destroy_cq(ibv_cq_ex_to_cq(acq)) || ibv_destroy_cq(ibv_cq_ex_to_cq(bcq)) ||
	    ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		FAIL("teardown");
	ibv_free_device_list(list);
	printf("PASS teardown\n");
	return 0;
}
