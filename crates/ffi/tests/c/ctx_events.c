/* Per-context asynchronous events: two ibv_open_device handles of one device, each with
   its own PD, CQ and memory. QP a (context 1, RTS) sends to QP b (context 2, left in
   RTR): b's IBV_EVENT_COMM_EST (IBA 11.6.3) must make context 2's async_fd readable
   (poll(2), before any ibv_get_async_event), be returned by context 2 naming b, and never
   reach context 1 (its async_fd stays unreadable, a non-blocking get gives EAGAIN). Then
   the same in the other direction (QP d of context 2 sends to QP c of context 1).
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#include "rc_loopback.h"

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char buf[64];
};

static struct ibv_qp *qp_of(struct side *s)
{
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = ia.recv_cq = s->cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(s->pd, &ia);
	if (!qp)
		FAIL("create_qp");
	return qp;
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r = poll(&p, 1, ms);
	if (r < 0)
		FAIL("poll");
	return r == 1 && (p.revents & POLLIN);
}

/* `from` (in sender's context, RTS) sends to `to` (receiver's, RTR): the COMM_EST of `to`
   must reach the receiver's context only. */
static void check(const char *name, struct side *snd, struct ibv_qp *from, struct side *rcv,
		  struct ibv_qp *to, union ibv_gid *gid)
{
	connect_rc(from, to->qp_num, gid, 0, 1);
	connect_rc(to, from->qp_num, gid, 0, 0);
	struct ibv_sge rsge = { (uintptr_t)rcv->buf, 8, rcv->mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &rsge, .num_sge = 1 }, *bad_r;
	if (ibv_post_recv(to, &rwr, &bad_r))
		FAIL("post_recv");
	struct ibv_sge ssge = { (uintptr_t)snd->buf, 8, snd->mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = &ssge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad_s;
	if (ibv_post_send(from, &swr, &bad_s))
		FAIL("post_send");
	if (!readable(rcv->ctx->async_fd, 10000))
		FAIL("%s: the receiver's async_fd never became readable", name);
	struct ibv_async_event ev;
	if (ibv_get_async_event(rcv->ctx, &ev))
		FAIL("%s: get_async_event", name);
	if (ev.event_type != IBV_EVENT_COMM_EST || ev.element.qp != to)
		FAIL("%s: event %d naming %p, want COMM_EST naming %p", name, ev.event_type,
		     (void *)ev.element.qp, (void *)to);
	ibv_ack_async_event(&ev);
	if (readable(snd->ctx->async_fd, 200))
		FAIL("%s: the sender's context got an event", name);
	errno = 0;
	if (ibv_get_async_event(snd->ctx, &ev) != -1 || errno != EAGAIN)
		FAIL("%s: the sender's context: expected EAGAIN, errno %d (event %d)", name, errno,
		     ev.event_type);
	/* Drain the two completions. */
	int got = 0;
	for (int i = 0; i < 100000 && got < 2; i++) {
		struct ibv_wc wc;
		got += ibv_poll_cq(snd->cq, 1, &wc) == 1;
		got += ibv_poll_cq(rcv->cq, 1, &wc) == 1;
	}
	printf("PASS %s\n", name);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	static struct side s1, s2;
	struct side *sides[2] = { &s1, &s2 };
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		s->ctx = ibv_open_device(list[0]);
		if (!s->ctx)
			FAIL("open %d", i);
		s->pd = ibv_alloc_pd(s->ctx);
		s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
		s->mr = s->pd ? ibv_reg_mr(s->pd, s->buf, sizeof s->buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
		if (!s->pd || !s->cq || !s->mr)
			FAIL("pd/cq/mr %d", i);
		/* Non-blocking, so that an empty queue answers EAGAIN. */
		int fl = fcntl(s->ctx->async_fd, F_GETFL);
		if (fcntl(s->ctx->async_fd, F_SETFL, fl | O_NONBLOCK))
			FAIL("fcntl");
	}
	if (s1.ctx->async_fd == s2.ctx->async_fd || s1.ctx->async_fd < 0)
		FAIL("async_fd %d and %d", s1.ctx->async_fd, s2.ctx->async_fd);
	printf("PASS own_async_fd\n");
	union ibv_gid gid;
	if (ibv_query_gid(s1.ctx, 1, 0, &gid))
		FAIL("gid");
	struct ibv_qp *a = qp_of(&s1), *b = qp_of(&s2), *c = qp_of(&s1), *d = qp_of(&s2);
	check("first_to_second", &s1, a, &s2, b, &gid);
	check("second_to_first", &s2, d, &s1, c, &gid);
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_qp(c) || ibv_destroy_qp(d))
		FAIL("destroy qps");
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq) || ibv_dealloc_pd(s->pd) ||
		    ibv_close_device(s->ctx))
			FAIL("teardown %d", i);
	}
	ibv_free_device_list(list);
	printf("PASS teardown\n");
	return 0;
}
