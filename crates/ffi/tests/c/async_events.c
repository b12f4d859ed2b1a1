/* Asynchronous events and thread cancellation through the C API, in one process:
   two RC QPs on the one device, connected to each other. QP b is left in RTR; the first
   packet it receives must raise IBV_EVENT_COMM_EST naming b (IBA 11.6.3: communication
   established is raised when a QP in RTR receives its first packet).
   Then: the non-blocking async_fd reports EAGAIN when no event is pending; a thread blocked
   in ibv_get_async_event and one blocked in ibv_get_cq_event can both be cancelled
   (pthread_cancel + pthread_join return), as rping does with its CQ thread.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "rc_loopback.h"

static void *wait_async(void *arg)
{
	struct ibv_context *ctx = arg;
	struct ibv_async_event ev;
	ibv_get_async_event(ctx, &ev); /* blocks: nothing is pending */
	return NULL;
}

static void *wait_cq(void *arg)
{
	struct ibv_comp_channel *ch = arg;
	struct ibv_cq *cq;
	void *cq_ctx;
	ibv_get_cq_event(ch, &cq, &cq_ctx); /* blocks: the CQ is not armed */
	return NULL;
}

static void cancel_blocked(const char *name, void *(*fn)(void *), void *arg)
{
	pthread_t t;
	if (pthread_create(&t, NULL, fn, arg))
		FAIL("pthread_create");
	struct timespec d = { 0, 100 * 1000 * 1000 };
	nanosleep(&d, NULL);
	if (pthread_cancel(t))
		FAIL("pthread_cancel %s", name);
	/* A thread that is not at a cancellation point would never end: give up after 5 s. */
	struct timespec limit;
	clock_gettime(CLOCK_REALTIME, &limit);
	limit.tv_sec += 5;
	void *res;
	if (pthread_timedjoin_np(t, &res, &limit))
		FAIL("%s: the blocked thread was not cancelled", name);
	if (res != PTHREAD_CANCELED)
		FAIL("%s: the thread returned instead of being cancelled", name);
	printf("PASS cancel_%s\n", name);
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
	if (ctx->async_fd < 0)
		FAIL("async_fd is %d", ctx->async_fd);
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	if (!pd || !ch || !cq)
		FAIL("pd/channel/cq");
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	if (!mr || !a || !b)
		FAIL("mr/qp");

	/* Non-blocking descriptor, nothing pending: EAGAIN. */
	int fl = fcntl(ctx->async_fd, F_GETFL);
	if (fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK))
		FAIL("fcntl");
	struct ibv_async_event ev;
	errno = 0;
	if (ibv_get_async_event(ctx, &ev) != -1 || errno != EAGAIN)
		FAIL("expected -1/EAGAIN with nothing pending, errno %d", errno);
	printf("PASS nonblocking_empty\n");

	connect_rc(a, b->qp_num, &gid, 0, 1);
	connect_rc(b, a->qp_num, &gid, 0, 0);
	struct ibv_sge sge = { (uintptr_t)buf, 8, mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *bad_r;
	if (ibv_post_recv(b, &rwr, &bad_r))
		FAIL("post_recv");
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
	if (ibv_post_send(a, &swr, &bad_s))
		FAIL("post_send");
	int got = 0;
	double end = now() + 10;
	while (got < 2 && now() < end) {
		struct ibv_wc wc;
		int r = ibv_poll_cq(cq, 1, &wc);
		if (r < 0)
			FAIL("poll_cq");
		if (r == 1) {
			if (wc.status != IBV_WC_SUCCESS)
				FAIL("wc %llu status %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
			got++;
		}
	}
	if (got < 2)
		FAIL("completions: %d of 2", got);

	/* The event is pending now (raised before the receive completed). */
	int found = 0;
	for (int i = 0; i < 8 && !found; i++) {
		if (ibv_get_async_event(ctx, &ev))
			break;
		if (ev.event_type == IBV_EVENT_COMM_EST) {
			if (ev.element.qp != b)
				FAIL("COMM_EST names %p, not QP b %p", (void *)ev.element.qp, (void *)b);
			found = 1;
		}
		ibv_ack_async_event(&ev);
	}
	if (!found)
		FAIL("no IBV_EVENT_COMM_EST for QP b");
	printf("PASS comm_est %s\n", ibv_event_type_str(IBV_EVENT_COMM_EST));

	/* Blocking waits are cancellation points. */
	if (fcntl(ctx->async_fd, F_SETFL, fl))
		FAIL("fcntl");
	cancel_blocked("async_event", wait_async, ctx);
	cancel_blocked("cq_event", wait_cq, ch);

	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq) ||
	    ibv_destroy_comp_channel(ch) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		FAIL("teardown");
	ibv_free_device_list(list);
	printf("PASS teardown\n");
	return 0;
}
