/* Shared contexts: ibv_import_device on a dup of a context's cmd_fd, ibv_import_pd and
   ibv_import_mr by handle, ibv_unimport_*.
   Two rounds, one per closing order. In each, context A allocates a PD and registers a
   target buffer; context B is imported from dup(A->cmd_fd) and imports the PD and the MR
   (same handle, keys, length; its own async_fd; the new context owns the descriptor).
   A QP is created on the imported PD with a CQ of B, and a buffer is registered on the
   imported PD; a sender (context S, opened separately) RDMA WRITEs into the target
   buffer with the imported MR's rkey, and B's QP RDMA WRITEs back from the target buffer
   (imported MR's lkey) and the buffer registered on the imported PD; the data is checked
   on both sides.
   - "original_first": A is closed while B works; traffic goes on, the device file is
     imported again from B's descriptor, and the PD and MR are destroyed through imported
     handles (the original handles then refuse with EINVAL and are unimported).
   - "imported_first": B's handles are unimported (the PD before the QP made on it is
     destroyed, as rdma-core's test does), B is closed (its descriptor with it), and A's
     PD and MR, unchanged, are freed as usual.
   Refusals: an unknown handle (ENOENT), an MR imported under another PD (EINVAL), a
   descriptor that is not a uroce context (a pipe, -1: EINVAL, the pipe left open), a
   context of another process (a forked child: EOPNOTSUPP); the very cmd_fd of a live
   context gets a descriptor of its own.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rc_loopback.h"

#define LEN 256
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static struct ibv_device *dev;
static union ibv_gid gid;

static struct ibv_wc poll_one(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	double end = now() + 10;
	for (;;) {
		int r = ibv_poll_cq(cq, 1, &wc);
		if (r == 1)
			return wc;
		if (r < 0 || now() > end)
			FAIL("%s: no completion (poll %d)", what, r);
	}
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 2;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		FAIL("create_qp: %s", strerror(errno));
	return qp;
}

/* RDMA WRITE of the SGEs to (raddr, rkey), signaled; the completion must succeed. */
static void write_to(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_sge *sge, int nsge,
		     void *raddr, uint32_t rkey, const char *what)
{
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = 7;
	wr.sg_list = sge;
	wr.num_sge = nsge;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = (uintptr_t)raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		FAIL("%s: post_send: %s", what, strerror(errno));
	struct ibv_wc wc = poll_one(cq, what);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 7)
		FAIL("%s: status %s", what, ibv_wc_status_str(wc.status));
}

/* The sender: a context of its own with a QP, CQ and buffer. */
struct sender {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[LEN];
};

static void sender_open(struct sender *s)
{
	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		FAIL("open sender");
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 16, NULL, NULL, 0);
	s->mr = s->pd ? ibv_reg_mr(s->pd, s->buf, LEN, ACCESS) : NULL;
	if (!s->pd || !s->cq || !s->mr)
		FAIL("sender pd/cq/mr");
	s->qp = rc_qp(s->pd, s->cq);
}

static void sender_close(struct sender *s)
{
	if (ibv_destroy_qp(s->qp) || ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq) ||
	    ibv_dealloc_pd(s->pd) || ibv_close_device(s->ctx))
		FAIL("sender teardown");
}

/* Whether `fd` is an open descriptor. */
static int is_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

/* One exchange: the sender writes `tag` bytes into the target buffer through the
   imported rkey; the imported side's QP writes its target buffer (imported lkey) and
   `extra` (an MR registered on the imported PD) back into the sender's buffer. */
static void exchange(struct sender *s, struct ibv_qp *qp, struct ibv_cq *cq,
		     struct ibv_mr *imported, struct ibv_mr *extra, char *target, char *extra_buf,
		     char tag, const char *what)
{
	memset(s->buf, tag, LEN);
	memset(target, 0, LEN);
	struct ibv_sge sge = { (uintptr_t)s->buf, LEN, s->mr->lkey };
	write_to(s->qp, s->cq, &sge, 1, target, imported->rkey, what);
	for (int i = 0; i < LEN; i++)
		if (target[i] != tag)
			FAIL("%s: target byte %d is %d, want %d", what, i, target[i], tag);
	memset(s->buf, 0, LEN);
	memset(extra_buf, tag + 1, LEN / 2);
	struct ibv_sge back[2] = {
		{ (uintptr_t)target, LEN / 2, imported->lkey },
		{ (uintptr_t)extra_buf, LEN / 2, extra->lkey },
	};
	write_to(qp, cq, back, 2, s->buf, s->mr->rkey, what);
	for (int i = 0; i < LEN; i++)
		if (s->buf[i] != (i < LEN / 2 ? tag : tag + 1))
			FAIL("%s: returned byte %d is %d", what, i, s->buf[i]);
}

static void round_trip(int original_first)
{
	const char *name = original_first ? "original_first" : "imported_first";
	static char target[LEN], extra_buf[LEN];
	struct sender s;
	sender_open(&s);

	struct ibv_context *a = ibv_open_device(dev);
	if (!a)
		FAIL("open A");
	struct ibv_pd *pd_a = ibv_alloc_pd(a);
	struct ibv_mr *mr_a = pd_a ? ibv_reg_mr(pd_a, target, LEN, ACCESS) : NULL;
	if (!pd_a || !mr_a)
		FAIL("A pd/mr");
	if (a->cmd_fd < 0 || a->cmd_fd == a->async_fd)
		FAIL("A: cmd_fd %d, async_fd %d", a->cmd_fd, a->async_fd);

	int fd = dup(a->cmd_fd);
	struct ibv_context *b = ibv_import_device(fd);
	if (!b)
		FAIL("%s: import_device: %s", name, strerror(errno));
	if (b == a || b->cmd_fd != fd || b->device != a->device || b->async_fd < 0 ||
	    b->async_fd == a->async_fd)
		FAIL("%s: imported context: cmd_fd %d (gave %d), async_fd %d (A %d)", name,
		     b->cmd_fd, fd, b->async_fd, a->async_fd);
	struct ibv_pd *pd_b = ibv_import_pd(b, pd_a->handle);
	if (!pd_b)
		FAIL("%s: import_pd: %s", name, strerror(errno));
	if (pd_b == pd_a || pd_b->handle != pd_a->handle || pd_b->context != b)
		FAIL("%s: imported PD handle %u (want %u)", name, pd_b->handle, pd_a->handle);
	struct ibv_mr *mr_b = ibv_import_mr(pd_b, mr_a->handle);
	if (!mr_b)
		FAIL("%s: import_mr: %s", name, strerror(errno));
	if (mr_b == mr_a || mr_b->handle != mr_a->handle || mr_b->lkey != mr_a->lkey ||
	    mr_b->rkey != mr_a->rkey || mr_b->length != mr_a->length || mr_b->pd != pd_b ||
	    mr_b->context != b)
		FAIL("%s: imported MR: handle %u/%u lkey %#x/%#x rkey %#x/%#x length %zu/%zu",
		     name, mr_b->handle, mr_a->handle, mr_b->lkey, mr_a->lkey, mr_b->rkey,
		     mr_a->rkey, mr_b->length, mr_a->length);
	printf("PASS %s_import\n", name);

	/* Objects on the imported PD and context. */
	struct ibv_cq *cq_b = ibv_create_cq(b, 16, NULL, NULL, 0);
	if (!cq_b)
		FAIL("%s: cq on B", name);
	struct ibv_qp *qp_b = rc_qp(pd_b, cq_b);
	struct ibv_mr *extra = ibv_reg_mr(pd_b, extra_buf, LEN, ACCESS);
	if (!extra)
		FAIL("%s: reg_mr on the imported PD: %s", name, strerror(errno));
	to_rts(s.qp, qp_b->qp_num, &gid);
	to_rts(qp_b, s.qp->qp_num, &gid);
	exchange(&s, qp_b, cq_b, mr_b, extra, target, extra_buf, 'a', name);
	/* The PD is one object: busy through the original handle too. */
	if (ibv_dealloc_pd(pd_a) != EBUSY)
		FAIL("%s: dealloc_pd of the original while the QP lives: not EBUSY", name);
	printf("PASS %s_traffic\n", name);

	if (original_first) {
		if (ibv_close_device(a))
			FAIL("close A");
		exchange(&s, qp_b, cq_b, mr_b, extra, target, extra_buf, 'c', name);
		/* The device file lives on with B: imported again from B's descriptor. */
		struct ibv_context *c = ibv_import_device(dup(b->cmd_fd));
		struct ibv_pd *pd_c = c ? ibv_import_pd(c, pd_a->handle) : NULL;
		if (!pd_c)
			FAIL("%s: import again after A closed: %s", name, strerror(errno));
		ibv_unimport_pd(pd_c);
		if (ibv_close_device(c))
			FAIL("close C");
		printf("PASS %s_after_close\n", name);
		/* Destroyed through the imported handles, for every handle. */
		if (ibv_destroy_qp(qp_b) || ibv_dereg_mr(extra) || ibv_destroy_cq(cq_b))
			FAIL("%s: B objects", name);
		if (ibv_dereg_mr(mr_b))
			FAIL("%s: dereg_mr through the imported handle", name);
		if (ibv_dereg_mr(mr_a) != EINVAL)
			FAIL("%s: dereg_mr of the original after the object was destroyed", name);
		ibv_unimport_mr(mr_a);
		if (ibv_dealloc_pd(pd_b))
			FAIL("%s: dealloc_pd through the imported handle", name);
		if (ibv_dealloc_pd(pd_a) != EINVAL)
			FAIL("%s: dealloc_pd of the original after the object was destroyed", name);
		errno = 0;
		if (ibv_import_pd(b, pd_a->handle) || errno != ENOENT)
			FAIL("%s: import of a deallocated PD: errno %d", name, errno);
		ibv_unimport_pd(pd_a);
		if (ibv_close_device(b))
			FAIL("close B");
		if (is_open(fd))
			FAIL("%s: B's cmd_fd %d still open after close", name, fd);
	} else {
		/* rdma-core's order: unimport the MR and the PD, then destroy what was made on
		   the imported PD, then close the imported context. */
		ibv_unimport_mr(mr_b);
		ibv_unimport_pd(pd_b);
		if (ibv_destroy_qp(qp_b) || ibv_dereg_mr(extra) || ibv_destroy_cq(cq_b))
			FAIL("%s: B objects", name);
		if (ibv_close_device(b))
			FAIL("close B");
		if (is_open(fd))
			FAIL("%s: B's cmd_fd %d still open after close", name, fd);
		/* A's handles are untouched: the PD and MR still work and import. */
		struct ibv_pd *again = ibv_import_pd(a, pd_a->handle);
		if (!again)
			FAIL("%s: import through A after B closed: %s", name, strerror(errno));
		ibv_unimport_pd(again);
		if (ibv_dereg_mr(mr_a) || ibv_dealloc_pd(pd_a) || ibv_close_device(a))
			FAIL("%s: A teardown", name);
	}
	sender_close(&s);
	printf("PASS %s_teardown\n", name);
}

static void refusals(void)
{
	struct ibv_context *a = ibv_open_device(dev);
	struct ibv_pd *pd = a ? ibv_alloc_pd(a) : NULL;
	struct ibv_pd *other = a ? ibv_alloc_pd(a) : NULL;
	static char buf[LEN];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, LEN, ACCESS) : NULL;
	if (!mr || !other)
		FAIL("refusals: setup");
	errno = 0;
	if (ibv_import_pd(a, 0x7fffff00) || errno != ENOENT)
		FAIL("import_pd of an unknown handle: errno %d", errno);
	errno = 0;
	if (ibv_import_mr(pd, 0x7fffff00) || errno != ENOENT)
		FAIL("import_mr of an unknown handle: errno %d", errno);
	errno = 0;
	if (ibv_import_mr(other, mr->handle) || errno != EINVAL)
		FAIL("import_mr under another PD: errno %d", errno);
	errno = 0;
	if (ibv_import_pd(NULL, pd->handle) || errno != EINVAL)
		FAIL("import_pd on a NULL context: errno %d", errno);
	printf("PASS unknown_handle\n");

	int p[2];
	if (pipe(p))
		FAIL("pipe");
	errno = 0;
	if (ibv_import_device(p[0]) || errno != EINVAL)
		FAIL("import_device of a pipe: errno %d", errno);
	if (!is_open(p[0]))
		FAIL("the refused pipe descriptor was closed");
	errno = 0;
	if (ibv_import_device(-1) || errno != EINVAL)
		FAIL("import_device of -1: errno %d", errno);
	close(p[0]);
	close(p[1]);
	printf("PASS not_a_context\n");

	/* Another process: a forked child holds the descriptor but not the objects. */
	int fd = dup(a->cmd_fd);
	pid_t child = fork();
	if (child < 0)
		FAIL("fork");
	if (child == 0) {
		errno = 0;
		struct ibv_context *c = ibv_import_device(fd);
		_exit(c == NULL && errno == EOPNOTSUPP ? 0 : 1);
	}
	int status;
	if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status))
		FAIL("import_device in a forked child: not EOPNOTSUPP (status %#x)", status);
	close(fd);
	printf("PASS other_process\n");

	/* The very descriptor of a live context (not a dup): the new context gets its own. */
	struct ibv_context *same = ibv_import_device(a->cmd_fd);
	if (!same || same->cmd_fd == a->cmd_fd || same->cmd_fd < 0)
		FAIL("import_device of A's own cmd_fd: %s", same ? "same descriptor" : strerror(errno));
	int own = same->cmd_fd;
	if (ibv_close_device(same))
		FAIL("close the import of A's own cmd_fd");
	if (!is_open(a->cmd_fd))
		FAIL("closing the import closed A's cmd_fd");
	if (is_open(own))
		FAIL("the import's own descriptor %d was not closed", own);
	printf("PASS same_descriptor\n");

	if (ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) || ibv_dealloc_pd(other) || ibv_close_device(a))
		FAIL("refusals: teardown");
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	dev = list[0];
	struct ibv_context *probe = ibv_open_device(dev);
	if (!probe || ibv_query_gid(probe, 1, 0, &gid) || ibv_close_device(probe))
		FAIL("gid");
	round_trip(1);
	round_trip(0);
	refusals();
	ibv_free_device_list(list);
	printf("PASS done\n");
	return 0;
}
