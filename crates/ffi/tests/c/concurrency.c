/* Multi-threaded use of the verbs API in one process, on one device: RC QP pairs connected
   to each other, all sharing one send CQ and one receive CQ, as rping, UCX and libfabric
   use them (a CQ thread collecting completions while other threads post; several QPs per
   CQ; objects torn down while other threads still wait on or poll the CQs).

   Streams: a stream is one poster thread sending numbered messages on one QP (two streams
   may share a QP: ibv_post_send must be thread safe). Message `seq` of stream `s` is
   msg_len(s, seq) bytes (8..3007, so some span several 1024-byte MTU packets): a header
   {s, seq} and a pattern derived from (s, seq, offset). A single CQ thread checks every
   completion: send completions of a stream arrive in posting order (a QP's send queue
   completes in order), receive completions consume the receive queue in posting order,
   every message arrives exactly once, in order per stream, with the right length and
   bytes.

   1. event_mode: 4 pairs, 4 posters, CQ thread in event mode (ibv_req_notify_cq,
      ibv_get_cq_event, ibv_ack_cq_events, re-arm, drain).
   2. busy_poll: 4 pairs, 5 posters (two on pair 0), CQ thread busy-polling.
   3. destroy under load: posters post without end, one thread polls the CQs, another runs
      an rping-style event loop and is cancelled (pthread_cancel) while traffic flows; pair
      0's receiver is moved to ERR and destroyed while its sender still sends to it (the
      sender's WR in progress then fails once retries are exhausted and the rest are
      flushed), then the sender is destroyed while the other pairs carry on; ibv_destroy_cq gives EBUSY while QPs still use the CQs (and the poller is
      not disturbed); then the other pairs go to ERR under their posters. Every WR posted
      completes exactly once (IBV_WC_SUCCESS or IBV_WC_WR_FLUSH_ERR), the remaining
      receives are flushed, and once the QPs are gone the CQs and the channel are destroyed.

   4. refused_destroy: while QPs use a CQ, an SRQ and a PD, one thread calls ibv_destroy_cq,
      ibv_destroy_srq and ibv_dealloc_pd in a loop (each must give EBUSY) while another
      polls the CQ, queries the SRQ and registers memory in the PD: a refused destroy must
      not disturb those users (they never find the object missing).

   Prints "PASS <name> ..." per check; exits non-zero at the first failure. An alarm turns
   a hang into a failure. Argument: messages per stream (default 1000). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define FAIL(...)                                                 \
	do {                                                      \
		fflush(stdout);                                   \
		fprintf(stderr, "FAIL: " __VA_ARGS__);            \
		fprintf(stderr, "\n");                            \
		_exit(1);                                         \
	} while (0)

#define NPAIR 4
#define MAXSTREAM 5
#define SLOT 4096     /* bytes per buffer slot */
#define MAXMSG 3000   /* message lengths are 8 .. 8 + MAXMSG - 1 */
#define WIN 16        /* send WRs in flight per stream */
#define RQ 128        /* receive WRs per receiving QP */
#define PHASE_LIMIT 20 /* seconds before the alarm declares a hang */

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void sleep_ms(long ms)
{
	struct timespec d = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&d, NULL);
}

static const char *phase = "setup";

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "FAIL: timed out (hang) in phase ";
	if (write(2, msg, sizeof msg - 1) < 0 || write(2, phase, strlen(phase)) < 0 ||
	    write(2, "\n", 1) < 0)
		_exit(3);
	_exit(3);
}

static void start_phase(const char *name)
{
	phase = name;
	alarm(PHASE_LIMIT);
}

/* ---- shared state ------------------------------------------------------------------- */

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char *arena;         /* all buffers: per stream WIN send slots, per pair RQ slots */
static struct ibv_mr *mr;
static struct ibv_comp_channel *ch;
static struct ibv_cq *scq, *rcq;
static int scq_tag, rcq_tag; /* cq_context of scq / rcq */

struct pair {
	struct ibv_qp *qa, *qb;      /* qa sends to qb */
	uint32_t qa_num, qb_num;     /* their numbers (checked after the QPs are gone) */
	atomic_int err_ok;           /* a send may complete in error (its peer is gone) */
	pthread_mutex_t lock;        /* held while reposting a receive on qb */
	int alive;                   /* receives may be reposted (under lock) */
	unsigned next_slot;          /* CQ thread: receive slot expected next */
	atomic_long rx_posted, rx_flush;
	atomic_long rx_post_err;
};

struct stream {
	int id, pair;
	long count;                  /* messages to send; < 0: until stopped */
	atomic_int stop;             /* posters stop at the next message */
	atomic_int err_ok;           /* a refused post ends the poster instead of failing */
	atomic_long posted, done_ok, done_flush, done_err;
	long next_rx;                /* CQ thread: seq expected next at the receiver */
	atomic_long rx_ok;
	int post_errno;              /* the errno of the refused post, if any */
};

static struct pair pairs[NPAIR];
static struct stream streams[MAXSTREAM];
static int nstream;
static atomic_int flush_ok;      /* IBV_WC_WR_FLUSH_ERR completions are expected */
static atomic_int stop_poller;
static atomic_long poll_calls;

static char *send_slot(int s, long seq)
{
	return arena + ((size_t)s * WIN + (size_t)(seq % WIN)) * SLOT;
}

static char *recv_slot(int p, unsigned slot)
{
	return arena + ((size_t)MAXSTREAM * WIN + (size_t)p * RQ + slot) * SLOT;
}

static size_t arena_size(void)
{
	return ((size_t)MAXSTREAM * WIN + (size_t)NPAIR * RQ) * SLOT;
}

static uint32_t msg_len(int s, long seq)
{
	return 8 + (uint32_t)((seq * 131 + s * 17) % MAXMSG);
}

static unsigned char pattern(int s, long seq, uint32_t j)
{
	return (unsigned char)(s * 31 + seq * 7 + j * 13 + (j >> 8));
}

static void fill(char *buf, int s, long seq)
{
	uint32_t len = msg_len(s, seq);
	uint32_t hdr[2] = { (uint32_t)s, (uint32_t)seq };
	memcpy(buf, hdr, sizeof hdr);
	for (uint32_t j = 8; j < len; j++)
		buf[j] = (char)pattern(s, seq, j);
}

/* ---- QP setup ------------------------------------------------------------------------ */

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	int r = ibv_modify_qp(qp, a, mask);
	if (r)
		FAIL("ibv_modify_qp %s: %s", what, strerror(r));
}

static void connect_qp(struct ibv_qp *qp, uint32_t dqpn)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
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
	modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC, "RTS");
}

static void to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	modify(qp, &a, IBV_QP_STATE, "ERR");
}

/* Posts receive `slot` on pair p's receiving QP; the caller holds the pair's lock or is the
   only thread touching the pair. */
static int post_recv_slot(int p, unsigned slot)
{
	struct ibv_sge sge = { (uintptr_t)recv_slot(p, slot), SLOT, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (1ULL << 62) | ((uint64_t)p << 32) | slot,
				  .sg_list = &sge, .num_sge = 1 }, *bad;
	int r = ibv_post_recv(pairs[p].qb, &wr, &bad);
	if (r == 0)
		atomic_fetch_add(&pairs[p].rx_posted, 1);
	return r;
}

/* Creates the CQs (on channel `with_channel`), NPAIR connected pairs and streams: stream
   i < NPAIR on pair i, stream NPAIR (when nstreams > NPAIR) on pair 0 as well. */
static void setup(int with_channel, int nstreams, long count)
{
	ch = NULL;
	if (with_channel) {
		ch = ibv_create_comp_channel(ctx);
		if (!ch)
			FAIL("ibv_create_comp_channel: %s", strerror(errno));
	}
	scq = ibv_create_cq(ctx, 2 * NPAIR * (RQ + 2 * WIN), &scq_tag, ch, 0);
	rcq = ibv_create_cq(ctx, 2 * NPAIR * (RQ + 2 * WIN), &rcq_tag, ch, 0);
	if (!scq || !rcq)
		FAIL("ibv_create_cq: %s", strerror(errno));
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = scq;
	ia.recv_cq = rcq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 2 * WIN;
	ia.cap.max_recv_wr = RQ;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	for (int p = 0; p < NPAIR; p++) {
		struct pair *pp = &pairs[p];
		pp->qa = ibv_create_qp(pd, &ia);
		pp->qb = ibv_create_qp(pd, &ia);
		if (!pp->qa || !pp->qb)
			FAIL("ibv_create_qp: %s", strerror(errno));
		connect_qp(pp->qa, pp->qb->qp_num);
		connect_qp(pp->qb, pp->qa->qp_num);
		pp->qa_num = pp->qa->qp_num;
		pp->qb_num = pp->qb->qp_num;
		atomic_store(&pp->err_ok, 0);
		pthread_mutex_init(&pp->lock, NULL);
		pp->alive = 1;
		pp->next_slot = 0;
		atomic_store(&pp->rx_posted, 0);
		atomic_store(&pp->rx_flush, 0);
		atomic_store(&pp->rx_post_err, 0);
		for (unsigned k = 0; k < RQ; k++)
			if (post_recv_slot(p, k))
				FAIL("ibv_post_recv (initial)");
	}
	nstream = nstreams;
	for (int s = 0; s < nstreams; s++) {
		struct stream *st = &streams[s];
		memset(st, 0, sizeof *st);
		st->id = s;
		st->pair = s < NPAIR ? s : 0;
		st->count = count;
	}
	atomic_store(&flush_ok, 0);
}

static void destroy_pair(int p)
{
	struct pair *pp = &pairs[p];
	int r = ibv_destroy_qp(pp->qa);
	if (r)
		FAIL("ibv_destroy_qp (pair %d, sender): %s", p, strerror(r));
	r = ibv_destroy_qp(pp->qb);
	if (r)
		FAIL("ibv_destroy_qp (pair %d, receiver): %s", p, strerror(r));
	pthread_mutex_destroy(&pp->lock);
}

static void teardown_cqs(void)
{
	int r = ibv_destroy_cq(scq);
	if (r)
		FAIL("ibv_destroy_cq (send CQ): %s", strerror(r));
	r = ibv_destroy_cq(rcq);
	if (r)
		FAIL("ibv_destroy_cq (recv CQ): %s", strerror(r));
	if (ch && (r = ibv_destroy_comp_channel(ch)))
		FAIL("ibv_destroy_comp_channel: %s", strerror(r));
}

/* ---- completions ---------------------------------------------------------------------- */

static void send_completion(const struct ibv_wc *wc)
{
	if (wc->wr_id >> 62)
		FAIL("send CQ: a receive wr_id %#llx", (unsigned long long)wc->wr_id);
	int s = (int)(wc->wr_id >> 32);
	long seq = (long)(wc->wr_id & 0xffffffffu);
	if (s < 0 || s >= nstream)
		FAIL("send CQ: wr_id %#llx names no stream", (unsigned long long)wc->wr_id);
	struct stream *st = &streams[s];
	if (wc->qp_num != pairs[st->pair].qa_num)
		FAIL("send CQ: stream %d completion names QP %u, not %u", s, wc->qp_num,
		     pairs[st->pair].qa_num);
	long done = atomic_load(&st->done_ok) + atomic_load(&st->done_flush);
	if (seq != done)
		FAIL("send CQ: stream %d completed seq %ld, expected %ld (lost, duplicated or "
		     "reordered)", s, seq, done);
	if (seq >= atomic_load(&st->posted))
		FAIL("send CQ: stream %d completed seq %ld before it was posted", s, seq);
	if (wc->status == IBV_WC_SUCCESS) {
		if (wc->opcode != IBV_WC_SEND)
			FAIL("send CQ: opcode %d, not IBV_WC_SEND", wc->opcode);
		atomic_fetch_add(&st->done_ok, 1);
	} else if (wc->status == IBV_WC_WR_FLUSH_ERR && atomic_load(&flush_ok)) {
		atomic_fetch_add(&st->done_flush, 1);
	} else if (atomic_load(&pairs[st->pair].err_ok)) {
		/* The peer is gone: the WR in progress fails (retries exhausted), the QP goes
		   to ERR and the rest are flushed. Counted with the flushed ones. */
		atomic_fetch_add(&st->done_err, 1);
		atomic_fetch_add(&st->done_flush, 1);
	} else {
		FAIL("send CQ: stream %d seq %ld status %s", s, seq, ibv_wc_status_str(wc->status));
	}
}

static void check_message(int p, unsigned slot, const struct ibv_wc *wc)
{
	const char *buf = recv_slot(p, slot);
	uint32_t hdr[2];
	memcpy(hdr, buf, sizeof hdr);
	int s = (int)hdr[0];
	if (s < 0 || s >= nstream || streams[s].pair != p)
		FAIL("pair %d slot %u: message names stream %d", p, slot, s);
	struct stream *st = &streams[s];
	long seq = hdr[1];
	if (seq != st->next_rx)
		FAIL("stream %d: received seq %ld, expected %ld (lost, duplicated or reordered)", s,
		     seq, st->next_rx);
	uint32_t len = msg_len(s, seq);
	if (wc->byte_len != len)
		FAIL("stream %d seq %ld: byte_len %u, sent %u", s, seq, wc->byte_len, len);
	for (uint32_t j = 8; j < len; j++)
		if ((unsigned char)buf[j] != pattern(s, seq, j))
			FAIL("stream %d seq %ld: byte %u is %#x, sent %#x", s, seq, j,
			     (unsigned char)buf[j], pattern(s, seq, j));
	st->next_rx++;
	atomic_fetch_add(&st->rx_ok, 1);
}

static void recv_completion(const struct ibv_wc *wc)
{
	if (wc->wr_id >> 62 != 1)
		FAIL("recv CQ: a send wr_id %#llx", (unsigned long long)wc->wr_id);
	int p = (int)((wc->wr_id >> 32) & 0xff);
	unsigned slot = (unsigned)(wc->wr_id & 0xffffffffu);
	if (p >= NPAIR || slot >= RQ)
		FAIL("recv CQ: bad wr_id %#llx", (unsigned long long)wc->wr_id);
	struct pair *pp = &pairs[p];
	if (wc->qp_num != pp->qb_num)
		FAIL("recv CQ: pair %d completion names QP %u, not %u", p, wc->qp_num,
		     pp->qb_num);
	if (slot != pp->next_slot)
		FAIL("recv CQ: pair %d completed slot %u, expected %u (receive queue order)", p,
		     slot, pp->next_slot);
	pp->next_slot = (pp->next_slot + 1) % RQ;
	if (wc->status == IBV_WC_SUCCESS) {
		if (wc->opcode != IBV_WC_RECV)
			FAIL("recv CQ: opcode %d, not IBV_WC_RECV", wc->opcode);
		check_message(p, slot, wc);
		pthread_mutex_lock(&pp->lock);
		if (pp->alive && post_recv_slot(p, slot)) {
			if (!atomic_load(&flush_ok))
				FAIL("ibv_post_recv (repost) pair %d", p);
			atomic_fetch_add(&pp->rx_post_err, 1);
		}
		pthread_mutex_unlock(&pp->lock);
	} else if (wc->status == IBV_WC_WR_FLUSH_ERR && atomic_load(&flush_ok)) {
		atomic_fetch_add(&pp->rx_flush, 1);
	} else {
		FAIL("recv CQ: pair %d slot %u status %s", p, slot, ibv_wc_status_str(wc->status));
	}
}

/* Polls `cq` until it is empty; returns the number of completions. */
static int drain(struct ibv_cq *cq)
{
	struct ibv_wc wc[16];
	int total = 0;
	for (;;) {
		int n = ibv_poll_cq(cq, 16, wc);
		atomic_fetch_add(&poll_calls, 1);
		if (n < 0)
			FAIL("ibv_poll_cq returned %d", n);
		for (int i = 0; i < n; i++) {
			if (cq == scq)
				send_completion(&wc[i]);
			else
				recv_completion(&wc[i]);
		}
		total += n;
		if (n < 16)
			return total;
	}
}

static int all_done(void)
{
	for (int s = 0; s < nstream; s++) {
		struct stream *st = &streams[s];
		if (atomic_load(&st->done_ok) < st->count || atomic_load(&st->rx_ok) < st->count)
			return 0;
	}
	return 1;
}

/* ---- threads ------------------------------------------------------------------------- */

static void *poster(void *arg)
{
	struct stream *st = arg;
	struct ibv_qp *qp = pairs[st->pair].qa;
	double deadline = now() + PHASE_LIMIT;
	for (long seq = 0; st->count < 0 || seq < st->count; seq++) {
		/* Slot seq % WIN is free once seq - WIN has completed. */
		while (seq - (atomic_load(&st->done_ok) + atomic_load(&st->done_flush)) >= WIN) {
			if (atomic_load(&st->stop))
				return NULL;
			if (now() > deadline)
				FAIL("stream %d: send completions stopped at %ld", st->id, seq);
			sched_yield();
		}
		if (atomic_load(&st->stop))
			return NULL;
		char *buf = send_slot(st->id, seq);
		fill(buf, st->id, seq);
		struct ibv_sge sge = { (uintptr_t)buf, msg_len(st->id, seq), mr->lkey };
		struct ibv_send_wr wr = { .wr_id = ((uint64_t)st->id << 32) | (uint64_t)seq,
					  .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		/* Counted before the post: the completion may be polled before post returns. */
		atomic_fetch_add(&st->posted, 1);
		int r = ibv_post_send(qp, &wr, &bad);
		if (r) {
			atomic_fetch_sub(&st->posted, 1);
			if (!atomic_load(&st->err_ok))
				FAIL("stream %d: ibv_post_send seq %ld: %s", st->id, seq, strerror(r));
			if (bad != &wr)
				FAIL("stream %d: bad_wr does not name the refused WR", st->id);
			st->post_errno = r;
			return NULL;
		}
	}
	return NULL;
}

static void *event_cq_thread(void *arg)
{
	(void)arg;
	if (ibv_req_notify_cq(scq, 0) || ibv_req_notify_cq(rcq, 0))
		FAIL("ibv_req_notify_cq");
	long events = 0;
	for (;;) {
		drain(scq);
		drain(rcq);
		if (all_done())
			break;
		struct ibv_cq *cq;
		void *cq_ctx;
		if (ibv_get_cq_event(ch, &cq, &cq_ctx))
			FAIL("ibv_get_cq_event: %s", strerror(errno));
		if (!((cq == scq && cq_ctx == &scq_tag) || (cq == rcq && cq_ctx == &rcq_tag)))
			FAIL("ibv_get_cq_event: cq %p context %p are neither CQ's", (void *)cq, cq_ctx);
		events++;
		ibv_ack_cq_events(cq, 1);
		if (ibv_req_notify_cq(cq, 0))
			FAIL("ibv_req_notify_cq (re-arm)");
	}
	return (void *)events;
}

static void *busy_cq_thread(void *arg)
{
	(void)arg;
	double deadline = now() + PHASE_LIMIT;
	while (!all_done()) {
		if (drain(scq) + drain(rcq) == 0 && now() > deadline)
			FAIL("busy poll: completions stopped");
	}
	return NULL;
}

/* Polls both CQs until told to stop. */
static void *poller(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop_poller)) {
		drain(scq);
		drain(rcq);
	}
	return NULL;
}

static atomic_long waiter_events;

/* rping's CQ thread, less the polling (the poller does that): wait, acknowledge, re-arm. */
static void *waiter(void *arg)
{
	(void)arg;
	for (;;) {
		struct ibv_cq *cq;
		void *cq_ctx;
		if (ibv_get_cq_event(ch, &cq, &cq_ctx))
			FAIL("waiter: ibv_get_cq_event: %s", strerror(errno));
		if (cq != scq && cq != rcq)
			FAIL("waiter: an event for an unknown CQ");
		atomic_fetch_add(&waiter_events, 1);
		ibv_ack_cq_events(cq, 1);
		if (ibv_req_notify_cq(cq, 0))
			FAIL("waiter: ibv_req_notify_cq");
	}
	return NULL;
}

static void join_within(pthread_t t, int secs, const char *what, void **res)
{
	struct timespec limit;
	clock_gettime(CLOCK_REALTIME, &limit);
	limit.tv_sec += secs;
	if (pthread_timedjoin_np(t, res, &limit))
		FAIL("%s did not end within %d s", what, secs);
}

/* ---- scenarios ------------------------------------------------------------------------ */

static void traffic(const char *name, int event_mode, int nstreams, long count)
{
	start_phase(name);
	double t0 = now();
	setup(event_mode, nstreams, count);
	pthread_t cq_t, post_t[MAXSTREAM];
	if (pthread_create(&cq_t, NULL, event_mode ? event_cq_thread : busy_cq_thread, NULL))
		FAIL("pthread_create");
	for (int s = 0; s < nstreams; s++)
		if (pthread_create(&post_t[s], NULL, poster, &streams[s]))
			FAIL("pthread_create");
	for (int s = 0; s < nstreams; s++)
		join_within(post_t[s], PHASE_LIMIT, "a poster", NULL);
	void *events;
	join_within(cq_t, PHASE_LIMIT, "the CQ thread", &events);
	for (int s = 0; s < nstreams; s++) {
		struct stream *st = &streams[s];
		if (st->posted != count || st->done_ok != count || st->rx_ok != count ||
		    st->next_rx != count || st->done_flush != 0)
			FAIL("%s stream %d: posted %ld, sent %ld, received %ld of %ld", name, s,
			     (long)st->posted, (long)st->done_ok, (long)st->rx_ok, count);
	}
	/* Nothing beyond the messages: both CQs are empty. */
	struct ibv_wc wc;
	if (ibv_poll_cq(scq, 1, &wc) != 0 || ibv_poll_cq(rcq, 1, &wc) != 0)
		FAIL("%s: a completion beyond the messages sent", name);
	for (int p = 0; p < NPAIR; p++)
		destroy_pair(p);
	teardown_cqs();
	double dt = now() - t0;
	if (event_mode)
		printf("PASS %s %d streams x %ld messages, %ld CQ events, %.2f s\n", name, nstreams,
		       count, (long)(intptr_t)events, dt);
	else
		printf("PASS %s %d streams (two on one QP) x %ld messages, %.2f s\n", name, nstreams,
		       count, dt);
	fflush(stdout);
}

/* Waits until every receive posted on pair p (sends too, with `sends`) has completed. */
static void wait_accounted(int p, int sends)
{
	double deadline = now() + 5;
	for (;;) {
		int open = 0;
		long rx = 0;
		for (int s = 0; s < nstream; s++) {
			struct stream *st = &streams[s];
			if (st->pair != p)
				continue;
			if (sends && st->done_ok + st->done_flush != st->posted)
				open = 1;
			rx += st->rx_ok;
		}
		if (rx + pairs[p].rx_flush != pairs[p].rx_posted)
			open = 1;
		if (!open)
			break;
		if (now() > deadline)
			FAIL("pair %d: WRs never completed after the move to ERR (rx posted %ld, "
			     "received %ld, flushed %ld)", p, (long)pairs[p].rx_posted, rx,
			     (long)pairs[p].rx_flush);
		sleep_ms(1);
	}
	if (pairs[p].rx_flush == 0)
		FAIL("pair %d: no posted receive was flushed by the move to ERR", p);
	if (!sends)
		return;
	/* Every message whose send succeeded was received; nothing received was not sent. */
	for (int s = 0; s < nstream; s++) {
		struct stream *st = &streams[s];
		if (st->pair != p)
			continue;
		if (st->rx_ok < st->done_ok || st->rx_ok > st->posted)
			FAIL("stream %d: sent %ld (acked), received %ld, posted %ld", s,
			     (long)st->done_ok, (long)st->rx_ok, (long)st->posted);
	}
}

/* Moves both QPs of pair p to ERR while its posters run; receives reposted meanwhile (by
   the poller) are flushed too. Then stops reposting. */
static void kill_pair(int p)
{
	for (int s = 0; s < nstream; s++)
		if (streams[s].pair == p)
			atomic_store(&streams[s].err_ok, 1);
	to_err(pairs[p].qa);
	to_err(pairs[p].qb);
	pthread_mutex_lock(&pairs[p].lock);
	pairs[p].alive = 0;
	pthread_mutex_unlock(&pairs[p].lock);
}

static void stop_posters_of(int p, pthread_t *post_t)
{
	for (int s = 0; s < nstream; s++)
		if (streams[s].pair == p) {
			atomic_store(&streams[s].stop, 1);
			join_within(post_t[s], 5, "a poster", NULL);
		}
}

static void destroy_under_load(void)
{
	start_phase("destroy_under_load");
	double t0 = now();
	setup(1, MAXSTREAM, -1);
	atomic_store(&flush_ok, 1);
	atomic_store(&stop_poller, 0);
	atomic_store(&waiter_events, 0);
	if (ibv_req_notify_cq(scq, 0) || ibv_req_notify_cq(rcq, 0))
		FAIL("ibv_req_notify_cq");
	pthread_t poll_t, wait_t, post_t[MAXSTREAM];
	if (pthread_create(&poll_t, NULL, poller, NULL) ||
	    pthread_create(&wait_t, NULL, waiter, NULL))
		FAIL("pthread_create");
	for (int s = 0; s < nstream; s++)
		if (pthread_create(&post_t[s], NULL, poster, &streams[s]))
			FAIL("pthread_create");

	/* Traffic flows on every stream. */
	double deadline = now() + 5;
	for (int s = 0; s < nstream; s++)
		while (streams[s].rx_ok < 50) {
			if (now() > deadline)
				FAIL("stream %d: only %ld messages in 5 s", s, (long)streams[s].rx_ok);
			sleep_ms(1);
		}
	/* The event thread is cancelled wherever it is (in ibv_get_cq_event, normally). */
	if (pthread_cancel(wait_t))
		FAIL("pthread_cancel");
	void *res;
	join_within(wait_t, 5, "the cancelled event thread", &res);
	if (res != PTHREAD_CANCELED)
		FAIL("the event thread returned instead of being cancelled");
	if (waiter_events == 0)
		FAIL("the event thread saw no CQ event while traffic flowed");
	printf("PASS cancel_under_load after %ld CQ events\n", (long)waiter_events);
	fflush(stdout);

	/* Pair 0 (two streams): its receiver goes to ERR and is destroyed while the sender
	   still sends to it in RTS (packets for a QP being destroyed); the sender's WR in
	   progress then fails (retries exhausted), the rest are flushed. The other pairs
	   carry on and the poller polls. */
	for (int s = 0; s < nstream; s++)
		if (streams[s].pair == 0)
			atomic_store(&streams[s].err_ok, 1);
	atomic_store(&pairs[0].err_ok, 1);
	to_err(pairs[0].qb);
	pthread_mutex_lock(&pairs[0].lock);
	pairs[0].alive = 0;
	pthread_mutex_unlock(&pairs[0].lock);
	wait_accounted(0, 0);
	int r = ibv_destroy_qp(pairs[0].qb);
	if (r)
		FAIL("ibv_destroy_qp (pair 0 receiver, sender live): %s", strerror(r));
	deadline = now() + 10;
	while (streams[0].done_err + streams[MAXSTREAM - 1].done_err == 0) {
		if (now() > deadline)
			FAIL("pair 0: no send failed within 10 s of its receiver's destruction");
		sleep_ms(1);
	}
	if (streams[0].done_err + streams[MAXSTREAM - 1].done_err != 1)
		FAIL("pair 0: %ld sends failed, not one (the others are flushed)",
		     (long)(streams[0].done_err + streams[MAXSTREAM - 1].done_err));
	stop_posters_of(0, post_t);
	wait_accounted(0, 1);
	long flushed = pairs[0].rx_flush;
	if ((r = ibv_destroy_qp(pairs[0].qa)))
		FAIL("ibv_destroy_qp (pair 0 sender): %s", strerror(r));
	pthread_mutex_destroy(&pairs[0].lock);
	long before = streams[1].rx_ok;
	deadline = now() + 5;
	while (streams[1].rx_ok < before + 50) {
		if (now() > deadline)
			FAIL("pair 1 stalled after pair 0 was destroyed");
		sleep_ms(1);
	}
	printf("PASS destroy_qp_under_load (pair 0: %ld + %ld sends completed, %ld receives "
	       "flushed)\n", (long)(streams[0].done_ok + streams[MAXSTREAM - 1].done_ok),
	       (long)(streams[0].done_flush + streams[MAXSTREAM - 1].done_flush), flushed);
	fflush(stdout);

	/* The CQs are still used: EBUSY, and the poller is not disturbed. */
	r = ibv_destroy_cq(scq);
	if (r != EBUSY)
		FAIL("ibv_destroy_cq of a CQ QPs use returned %d (%s), not EBUSY", r, strerror(r));
	r = ibv_destroy_cq(rcq);
	if (r != EBUSY)
		FAIL("ibv_destroy_cq of a CQ QPs use returned %d (%s), not EBUSY", r, strerror(r));
	r = ibv_destroy_comp_channel(ch);
	if (r != EBUSY)
		FAIL("ibv_destroy_comp_channel of a channel CQs use returned %d, not EBUSY", r);
	before = streams[2].rx_ok;
	deadline = now() + 5;
	while (streams[2].rx_ok < before + 50) {
		if (now() > deadline)
			FAIL("traffic stalled after the refused ibv_destroy_cq");
		sleep_ms(1);
	}
	printf("PASS destroy_cq_busy\n");
	fflush(stdout);

	/* The other pairs go to ERR while their posters post. */
	int refused = 0;
	for (int p = 1; p < NPAIR; p++)
		kill_pair(p);
	for (int p = 1; p < NPAIR; p++)
		stop_posters_of(p, post_t);
	for (int p = 1; p < NPAIR; p++)
		wait_accounted(p, 1);
	for (int s = 0; s < nstream; s++)
		refused += streams[s].post_errno != 0;
	long ok = 0, fl = 0, rxf = 0;
	for (int s = 0; s < nstream; s++) {
		ok += streams[s].done_ok;
		fl += streams[s].done_flush;
	}
	for (int p = 0; p < NPAIR; p++)
		rxf += pairs[p].rx_flush;
	printf("PASS flush_under_load (%ld sends completed, %ld flushed, %ld receives flushed, "
	       "%d posters refused in ERR)\n", ok, fl, rxf, refused);
	fflush(stdout);

	for (int p = 1; p < NPAIR; p++)
		destroy_pair(p);
	/* The poller polled the CQs while their QPs were destroyed. */
	long calls = poll_calls;
	sleep_ms(10);
	if (poll_calls == calls)
		FAIL("the poller stopped");
	atomic_store(&stop_poller, 1);
	join_within(poll_t, 5, "the poller", NULL);
	teardown_cqs();
	printf("PASS destroy_after_load %.2f s\n", now() - t0);
	fflush(stdout);
}

static struct ibv_cq *busy_cq;
static struct ibv_srq *busy_srq;
static atomic_int stop_user;

/* Uses the CQ, the SRQ and the PD that the main thread keeps trying to destroy. */
static void *busy_user(void *arg)
{
	long *rounds = arg;
	static char block[64];
	while (!atomic_load(&stop_user)) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(busy_cq, 1, &wc);
		if (n != 0)
			FAIL("ibv_poll_cq of an idle CQ during a refused destroy returned %d", n);
		struct ibv_srq_attr sa;
		int r = ibv_query_srq(busy_srq, &sa);
		if (r)
			FAIL("ibv_query_srq during a refused destroy: %s", strerror(r));
		struct ibv_mr *m = ibv_reg_mr(pd, block, sizeof block, IBV_ACCESS_LOCAL_WRITE);
		if (!m)
			FAIL("ibv_reg_mr during a refused ibv_dealloc_pd: %s", strerror(errno));
		if ((r = ibv_dereg_mr(m)))
			FAIL("ibv_dereg_mr: %s", strerror(r));
		(*rounds)++;
	}
	return NULL;
}

static void refused_destroy(void)
{
	start_phase("refused_destroy");
	busy_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_srq_init_attr sia;
	memset(&sia, 0, sizeof sia);
	sia.attr.max_wr = 16;
	sia.attr.max_sge = 1;
	busy_srq = ibv_create_srq(pd, &sia);
	if (!busy_cq || !busy_srq)
		FAIL("ibv_create_cq/ibv_create_srq: %s", strerror(errno));
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = busy_cq;
	ia.recv_cq = busy_cq;
	ia.srq = busy_srq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_send_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		FAIL("ibv_create_qp: %s", strerror(errno));
	long rounds = 0, tries = 0;
	atomic_store(&stop_user, 0);
	pthread_t t;
	if (pthread_create(&t, NULL, busy_user, &rounds))
		FAIL("pthread_create");
	double end = now() + 0.3;
	while (now() < end) {
		int r = ibv_destroy_cq(busy_cq);
		if (r != EBUSY)
			FAIL("ibv_destroy_cq of a CQ a QP uses: %d (%s), not EBUSY", r, strerror(r));
		r = ibv_destroy_srq(busy_srq);
		if (r != EBUSY)
			FAIL("ibv_destroy_srq of an SRQ a QP uses: %d (%s), not EBUSY", r, strerror(r));
		r = ibv_dealloc_pd(pd);
		if (r != EBUSY)
			FAIL("ibv_dealloc_pd of a PD in use: %d (%s), not EBUSY", r, strerror(r));
		tries++;
	}
	atomic_store(&stop_user, 1);
	join_within(t, 5, "the CQ/SRQ/PD user", NULL);
	if (rounds == 0)
		FAIL("the CQ/SRQ/PD user never ran");
	int r = ibv_destroy_qp(qp);
	if (r || (r = ibv_destroy_srq(busy_srq)) || (r = ibv_destroy_cq(busy_cq)))
		FAIL("refused_destroy teardown: %s", strerror(r));
	printf("PASS refused_destroy (%ld refused rounds beside %ld user rounds)\n", tries,
	       rounds);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	long count = argc > 1 ? atol(argv[1]) : 1000;
	if (count < 1 || count > 0x7fffffff)
		FAIL("bad message count");
	signal(SIGALRM, on_alarm);
	start_phase("open");
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("ibv_open_device");
	if (ibv_query_gid(ctx, 1, 0, &gid))
		FAIL("ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		FAIL("ibv_alloc_pd");
	arena = aligned_alloc(4096, arena_size());
	if (!arena)
		FAIL("aligned_alloc");
	memset(arena, 0, arena_size());
	mr = ibv_reg_mr(pd, arena, arena_size(), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		FAIL("ibv_reg_mr");

	traffic("event_mode", 1, NPAIR, count);
	traffic("busy_poll", 0, MAXSTREAM, count);
	destroy_under_load();
	refused_destroy();

	start_phase("teardown");
	if (ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		FAIL("teardown");
	ibv_free_device_list(list);
	free(arena);
	alarm(0);
	printf("PASS teardown\n");
	return 0;
}
