/* Multi-threaded post/poll scaling benchmark for a verbs library (built against
   <infiniband/verbs.h>, run against uroce's libibverbs.so.1 through LD_LIBRARY_PATH).

   usage: mt_post_poll THREADS MESSAGES_PER_THREAD send|write|wr_send|wr_write [SIZE]
          mt_post_poll THREADS ITERATIONS_PER_THREAD poll_empty|notify|recv_flush|wr_abort

   One device context; each thread owns one RC QP pair a -> b on it (loopback), one CQ
   that is the send CQ of a and the receive CQ of b, and its buffers. A thread keeps up to
   DEPTH signaled work requests of SIZE bytes outstanding on a (SENDs, or RDMA WRITEs) and
   polls its own CQ, reposting receives on b for SENDs, until MESSAGES_PER_THREAD sends have
   completed. send/write post with ibv_post_send, one work request per call; wr_send and
   wr_write post through the extended QP's ibv_wr_* API (QPs from ibv_create_qp_ex with
   send_ops_flags SEND | RDMA_WRITE): each refill of the window is one ibv_wr_start …
   ibv_wr_complete list, one ibv_wr_send / ibv_wr_rdma_write + ibv_wr_set_sge per message. Every message carries (thread, sequence); SENDs are checked on arrival (in
   order, length and bytes), WRITEs at the end (the last RING slots hold the last
   sequences). Prints one line:
     threads=T op=OP size=S messages=N seconds=X msgs_per_s=R cpu_s=C msgs_per_cpu_s=Q
   (C: the process's user + system CPU time over the run, all its threads, the library's
   progress thread included; less sensitive than R to other load on a shared machine)
   then "CHECK ok" (exit 0) or "CHECK FAIL ..." (exit 1). Bounded: gives up after 120 s.

   The call modes take the network out: each thread repeats library calls on objects of
   its own that never send a packet, so that only the data-path calls themselves (and
   whatever lock they share) are measured; the device's progress thread stays idle.
     poll_empty  ibv_poll_cq(cq, 16) on the thread's empty CQ (1 call per iteration;
                 checked: every call returns 0)
     notify      ibv_req_notify_cq(cq, 0) on the thread's CQ (1 call; checked: returns 0)
     recv_flush  ibv_post_recv of one WR on the thread's RC QP in the Error state, which
                 completes it at once with a flush error, then ibv_poll_cq of that
                 non-empty CQ (2 calls; checked: one completion per iteration, status
                 IBV_WC_WR_FLUSH_ERR, wr_id = the iteration, the QP's number)
     wr_abort    ibv_wr_start, ibv_wr_send, ibv_wr_set_sge, ibv_wr_abort on the thread's
                 extended RC QP (4 calls; checked: nothing completes, and an empty
                 ibv_wr_start … ibv_wr_complete list afterwards returns 0)
   They print
     threads=T op=OP iterations=N calls=C seconds=X calls_per_s=R cpu_s=C calls_per_cpu_s=Q
       vol_cs=V
   (V: the process's voluntary context switches during the run, all threads: each time a
   thread blocks, e.g. waiting for a lock another thread holds; the progress thread's own
   waits add a few per run) and "CHECK ok" or "CHECK FAIL ...". */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <infiniband/verbs.h>

#define DEPTH 64
#define RING 128
#define SLOT 256
#define LIMIT_S 120.0

#define DIE(...) do { printf("CHECK FAIL " __VA_ARGS__); printf("\n"); exit(1); } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static int use_write;
static int use_wr_api;
/* Call modes (see the header): 0 = the message modes. */
enum { MSG_MODE, POLL_EMPTY, NOTIFY, RECV_FLUSH, WR_ABORT };
static int mode;
static const struct { const char *name; int mode, calls; } call_modes[] = {
	{ "poll_empty", POLL_EMPTY, 1 },
	{ "notify", NOTIFY, 1 },
	{ "recv_flush", RECV_FLUSH, 2 },
	{ "wr_abort", WR_ABORT, 4 },
};
static int calls_per_iter;
/* The workers and main start together (the clock starts when all are ready). */
static pthread_barrier_t start;
static uint32_t size;
static uint64_t per_thread;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Voluntary context switches of the process so far (all threads): a thread that blocks
   on a lock another thread holds (a futex wait) counts one; a lock-free call never does. */
static long vol_switches(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return u.ru_nvcsw;
}

static double cpu_now(void)
{
	struct rusage u;
	getrusage(RUSAGE_SELF, &u);
	return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
	       u.ru_stime.tv_usec / 1e6;
}

static void to_rts(struct ibv_qp *qp, uint32_t dqpn)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("RTS");
}

struct worker {
	int id;
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch; /* notify mode only */
	struct ibv_qp *a, *b;
	struct ibv_qp_ex *ax; /* a's extended QP (wr_* modes) */
	struct ibv_mr *smr, *rmr;
	char *sbuf, *rbuf; /* RING slots of SLOT bytes each */
	uint64_t sent_done, recv_seq;
	pthread_t t;
};

static void fill(char *p, int id, uint64_t seq)
{
	memcpy(p, &seq, 8);
	memcpy(p + 8, &id, 4);
	for (uint32_t i = 12; i < size; i++)
		p[i] = (char)(seq * 7 + i + id);
}

static int check(const char *p, int id, uint64_t seq)
{
	uint64_t s;
	int i2;
	memcpy(&s, p, 8);
	memcpy(&i2, p + 8, 4);
	if (s != seq || i2 != id)
		return 0;
	for (uint32_t i = 12; i < size; i++)
		if (p[i] != (char)(seq * 7 + i + id))
			return 0;
	return 1;
}

static void post_recv(struct worker *w, uint64_t slot)
{
	struct ibv_sge sge = { (uintptr_t)(w->rbuf + slot * SLOT), SLOT, w->rmr->lkey };
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(w->b, &wr, &bad))
		DIE("thread %d: post_recv", w->id);
}

/* The call modes (see the header): per_thread iterations of the mode's calls on this
   thread's own objects. */
static void *run_calls(struct worker *w)
{
	struct ibv_wc wc[16];
	char *p = w->sbuf;
	struct ibv_sge sge = { (uintptr_t)w->rbuf, SLOT, w->rmr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	for (uint64_t i = 0; i < per_thread; i++) {
		switch (mode) {
		case POLL_EMPTY: {
			int n = ibv_poll_cq(w->cq, 16, wc);
			if (n != 0)
				DIE("thread %d: poll_cq of an empty CQ gave %d", w->id, n);
			break;
		}
		case NOTIFY:
			if (ibv_req_notify_cq(w->cq, 0))
				DIE("thread %d: req_notify_cq", w->id);
			break;
		case RECV_FLUSH: {
			rwr.wr_id = i;
			if (ibv_post_recv(w->b, &rwr, &bad))
				DIE("thread %d: post_recv in the Error state", w->id);
			int n = ibv_poll_cq(w->cq, 16, wc);
			if (n != 1 || wc[0].status != IBV_WC_WR_FLUSH_ERR || wc[0].wr_id != i ||
			    wc[0].qp_num != w->b->qp_num)
				DIE("thread %d: iteration %" PRIu64 ": %d completions, status %s, "
				    "wr_id %" PRIu64, w->id, i, n,
				    n > 0 ? ibv_wc_status_str(wc[0].status) : "-",
				    n > 0 ? wc[0].wr_id : 0);
			break;
		}
		case WR_ABORT:
			ibv_wr_start(w->ax);
			w->ax->wr_id = i;
			w->ax->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_send(w->ax);
			ibv_wr_set_sge(w->ax, w->smr->lkey, (uintptr_t)p, size);
			ibv_wr_abort(w->ax);
			break;
		}
	}
	if (mode == WR_ABORT) {
		ibv_wr_start(w->ax);
		if (ibv_wr_complete(w->ax))
			DIE("thread %d: an empty list after the aborted ones", w->id);
	}
	if (ibv_poll_cq(w->cq, 16, wc) != 0)
		DIE("thread %d: completions left on the CQ", w->id);
	return NULL;
}

static void *run(void *arg)
{
	struct worker *w = arg;
	pthread_barrier_wait(&start);
	if (mode != MSG_MODE)
		return run_calls(w);
	uint64_t posted = 0;
	double end = now() + LIMIT_S;
	if (!use_write)
		for (uint64_t i = 0; i < RING; i++)
			post_recv(w, i);
	while (w->sent_done < per_thread || (!use_write && w->recv_seq < per_thread)) {
		if (use_wr_api && posted < per_thread && posted - w->sent_done < DEPTH) {
			/* The whole free window as one list: all of it is posted, or none. */
			uint64_t n = DEPTH - (posted - w->sent_done);
			if (n > per_thread - posted)
				n = per_thread - posted;
			ibv_wr_start(w->ax);
			for (uint64_t k = 0; k < n; k++) {
				uint64_t seq = posted + k, slot = seq % RING;
				char *p = w->sbuf + slot * SLOT;
				fill(p, w->id, seq);
				w->ax->wr_id = seq;
				w->ax->wr_flags = IBV_SEND_SIGNALED;
				if (use_write)
					ibv_wr_rdma_write(w->ax, w->rmr->rkey,
							  (uintptr_t)(w->rbuf + slot * SLOT));
				else
					ibv_wr_send(w->ax);
				ibv_wr_set_sge(w->ax, w->smr->lkey, (uintptr_t)p, size);
			}
			int r = ibv_wr_complete(w->ax);
			if (r && r != ENOMEM)
				DIE("thread %d: wr_complete %d", w->id, r);
			if (!r)
				posted += n;
		}
		while (!use_wr_api && posted < per_thread && posted - w->sent_done < DEPTH) {
			uint64_t slot = posted % RING;
			char *p = w->sbuf + slot * SLOT;
			fill(p, w->id, posted);
			struct ibv_sge sge = { (uintptr_t)p, size, w->smr->lkey };
			struct ibv_send_wr wr = { .wr_id = posted, .sg_list = &sge, .num_sge = 1,
						  .send_flags = IBV_SEND_SIGNALED }, *bad;
			if (use_write) {
				wr.opcode = IBV_WR_RDMA_WRITE;
				wr.wr.rdma.remote_addr = (uintptr_t)(w->rbuf + slot * SLOT);
				wr.wr.rdma.rkey = w->rmr->rkey;
			} else {
				wr.opcode = IBV_WR_SEND;
			}
			int r = ibv_post_send(w->a, &wr, &bad);
			if (r == ENOMEM)
				break; /* send queue full: poll first */
			if (r)
				DIE("thread %d: post_send %d", w->id, r);
			posted++;
		}
		struct ibv_wc wc[16];
		int n = ibv_poll_cq(w->cq, 16, wc);
		if (n < 0)
			DIE("thread %d: poll_cq", w->id);
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				DIE("thread %d: wr %" PRIu64 " status %s", w->id, wc[i].wr_id,
				    ibv_wc_status_str(wc[i].status));
			if (wc[i].opcode == IBV_WC_RECV) {
				const char *p = w->rbuf + wc[i].wr_id * SLOT;
				if (wc[i].byte_len != size || !check(p, w->id, w->recv_seq))
					DIE("thread %d: message %" PRIu64 " arrived wrong", w->id, w->recv_seq);
				w->recv_seq++;
				post_recv(w, wc[i].wr_id);
			} else {
				if (wc[i].wr_id != w->sent_done)
					DIE("thread %d: send %" PRIu64 " completed out of order", w->id,
					    wc[i].wr_id);
				w->sent_done++;
			}
		}
		if (n == 0 && now() > end)
			DIE("thread %d: stuck at %" PRIu64 " of %" PRIu64, w->id, w->sent_done, per_thread);
	}
	if (use_write)
		for (uint64_t s = per_thread > RING ? per_thread - RING : 0; s < per_thread; s++)
			if (!check(w->rbuf + (s % RING) * SLOT, w->id, s))
				DIE("thread %d: written message %" PRIu64 " wrong", w->id, s);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s THREADS MESSAGES_PER_THREAD send|write|wr_send|wr_write [SIZE]\n"
			"       %s THREADS ITERATIONS_PER_THREAD poll_empty|notify|recv_flush|wr_abort\n",
			argv[0], argv[0]);
		return 2;
	}
	const char *op = argv[3];
	for (size_t i = 0; i < sizeof call_modes / sizeof call_modes[0]; i++)
		if (!strcmp(op, call_modes[i].name)) {
			mode = call_modes[i].mode;
			calls_per_iter = call_modes[i].calls;
		}
	use_wr_api = mode == WR_ABORT || (mode == MSG_MODE && !strncmp(op, "wr_", 3));
	if (mode == MSG_MODE && use_wr_api)
		op += 3;
	if (mode == MSG_MODE && strcmp(op, "send") && strcmp(op, "write"))
		DIE("bad operation %s", argv[3]);
	int threads = atoi(argv[1]);
	per_thread = strtoull(argv[2], NULL, 10);
	use_write = !strcmp(op, "write");
	size = argc > 4 ? (uint32_t)atoi(argv[4]) : 64;
	if (threads < 1 || threads > 64 || size < 12 || size > SLOT || per_thread < 1)
		DIE("bad arguments");
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx || ibv_query_gid(ctx, 1, 0, &gid))
		DIE("open/gid");
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		DIE("pd");
	struct worker *w = calloc(threads, sizeof *w);
	for (int i = 0; i < threads; i++) {
		w[i].id = i;
		w[i].sbuf = calloc(RING, SLOT);
		w[i].rbuf = calloc(RING, SLOT);
		/* notify: the CQ has a completion channel to be armed for. */
		w[i].ch = mode == NOTIFY ? ibv_create_comp_channel(ctx) : NULL;
		if (mode == NOTIFY && !w[i].ch)
			DIE("comp channel");
		w[i].cq = ibv_create_cq(ctx, 2 * (DEPTH + RING), NULL, w[i].ch, 0);
		w[i].smr = ibv_reg_mr(pd, w[i].sbuf, RING * SLOT, IBV_ACCESS_LOCAL_WRITE);
		w[i].rmr = ibv_reg_mr(pd, w[i].rbuf, RING * SLOT,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		if (!w[i].cq || !w[i].smr || !w[i].rmr)
			DIE("cq/mr");
		struct ibv_qp_init_attr ia;
		memset(&ia, 0, sizeof ia);
		ia.send_cq = ia.recv_cq = w[i].cq;
		ia.qp_type = IBV_QPT_RC;
		ia.cap.max_send_wr = DEPTH;
		ia.cap.max_recv_wr = RING;
		ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
		if (use_wr_api) {
			struct ibv_qp_init_attr_ex ix;
			memset(&ix, 0, sizeof ix);
			ix.send_cq = ix.recv_cq = w[i].cq;
			ix.qp_type = IBV_QPT_RC;
			ix.cap = ia.cap;
			ix.pd = pd;
			ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
			ix.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
			w[i].a = ibv_create_qp_ex(ctx, &ix);
			w[i].ax = w[i].a ? ibv_qp_to_qp_ex(w[i].a) : NULL;
			if (!w[i].ax)
				DIE("extended QP (errno %d)", errno);
		} else {
			w[i].a = ibv_create_qp(pd, &ia);
		}
		w[i].b = ibv_create_qp(pd, &ia);
		if (!w[i].a || !w[i].b)
			DIE("qp");
		if (mode == RECV_FLUSH) {
			/* INIT -> Error: every receive posted completes at once, flushed. */
			struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
			if (ibv_modify_qp(w[i].b, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS))
				DIE("INIT");
			a.qp_state = IBV_QPS_ERR;
			if (ibv_modify_qp(w[i].b, &a, IBV_QP_STATE))
				DIE("to the Error state");
		} else if (mode == MSG_MODE) {
			to_rts(w[i].a, w[i].b->qp_num);
			to_rts(w[i].b, w[i].a->qp_num);
		}
	}
	if (pthread_barrier_init(&start, NULL, threads + 1))
		DIE("barrier");
	for (int i = 0; i < threads; i++)
		if (pthread_create(&w[i].t, NULL, run, &w[i]))
			DIE("pthread_create");
	pthread_barrier_wait(&start);
	double t0 = now(), c0 = cpu_now();
	long v0 = vol_switches();
	for (int i = 0; i < threads; i++)
		pthread_join(w[i].t, NULL);
	double secs = now() - t0, cpu = cpu_now() - c0;
	long vcs = vol_switches() - v0;
	uint64_t total = per_thread * (uint64_t)threads;
	if (mode != MSG_MODE) {
		uint64_t calls = total * (uint64_t)calls_per_iter;
		printf("threads=%d op=%s iterations=%" PRIu64 " calls=%" PRIu64 " seconds=%.3f "
		       "calls_per_s=%.0f cpu_s=%.3f calls_per_cpu_s=%.0f vol_cs=%ld\n",
		       threads, argv[3], total, calls, secs, calls / secs, cpu,
		       cpu > 0 ? calls / cpu : 0.0, vcs);
	} else {
		printf("threads=%d op=%s size=%u messages=%" PRIu64 " seconds=%.3f msgs_per_s=%.0f "
		       "cpu_s=%.3f msgs_per_cpu_s=%.0f\n",
		       threads, argv[3], size, total, secs, total / secs, cpu,
		       cpu > 0 ? total / cpu : 0.0);
	}
	for (int i = 0; i < threads; i++) {
		if (ibv_destroy_qp(w[i].a) || ibv_destroy_qp(w[i].b) || ibv_dereg_mr(w[i].smr) ||
		    ibv_dereg_mr(w[i].rmr) || ibv_destroy_cq(w[i].cq) ||
		    (w[i].ch && ibv_destroy_comp_channel(w[i].ch)))
			DIE("teardown");
		free(w[i].sbuf);
		free(w[i].rbuf);
	}
	free(w);
	if (ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		DIE("teardown");
	ibv_free_device_list(list);
	printf("CHECK ok\n");
	return 0;
}
