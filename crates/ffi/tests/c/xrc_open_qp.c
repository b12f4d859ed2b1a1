/* ibv_open_qp through the C API, in one process with two contexts of the one device:
   context A opens an XRC domain on a file, creates an XRC SRQ and an XRC_RECV (target) QP
   in it; context B opens the same domain (the same file) and then the target QP by its
   number (ibv_open_qp). The expectations are the verbs API's:
   - the opened handle is a new ibv_qp of context B with the target's QP number and type;
   - ibv_open_qp with a number the domain has no target QP for fails;
   - the target QP moved to INIT and RTR through B's handle receives: an XRC_SEND QP of
     context A that names the SRQ's number delivers its SEND into the SRQ, completing on
     the SRQ's CQ with the target QP's number and the bytes sent;
   - ibv_destroy_qp on one of the target's two handles closes just that handle: the QP
     keeps receiving (a second SEND arrives, with the target's number) and the other
     handle stays usable; the destroy of the last handle destroys the QP (ibv_open_qp of
     its number fails and a SEND to it ends in a retry-exceeded error). Two rounds, each
     with a new target QP and initiator: round 1 destroys the created handle first, round
     2 the opened one.
   Prints "PASS <name>" (round 2: "PASS <name>_2") per check; exits non-zero at the first
   failure.
   Usage: xrc_open_qp DOMAIN-FILE */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fprintf(stderr, " (errno %d)\n", errno); exit(1); } while (0)
#define MSG "through the opened target QP"
#define MSG2 "after one handle was destroyed"

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

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

static void init_rtr(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *gid, int extra)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | extra))
		FAIL("RTR");
}

struct env {
	struct ibv_context *ca, *cb;
	struct ibv_xrcd *xrcd_a, *xrcd_b;
	struct ibv_pd *pd;
	struct ibv_cq *srq_cq, *send_cq;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	union ibv_gid gid;
	uint32_t srqn;
	char *buf;
};

static const char *suffix;

static void pass(const char *name)
{
	printf("PASS %s%s\n", name, suffix);
	fflush(stdout);
}

/* One SEND of `msg` from `ini` to the SRQ, with a receive posted first if `recv`;
   returns the send completion's status, and for a successful one checks the receive
   completion on the SRQ's CQ (target QP `qpn`). */
static enum ibv_wc_status send_one(struct env *e, struct ibv_qp *ini, uint32_t qpn,
				   const char *msg, uint64_t id, int recv)
{
	struct ibv_sge sge = { (uintptr_t)(e->buf + 128), 128, e->mr->lkey };
	struct ibv_sge ssge = { (uintptr_t)e->buf, (uint32_t)strlen(msg) + 1, e->mr->lkey };
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_send_wr swr, *bad_s;
	struct ibv_wc wc;

	memset(e->buf + 128, 0, 128);
	memset(&rwr, 0, sizeof rwr);
	rwr.wr_id = id;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	if (recv && ibv_post_srq_recv(e->srq, &rwr, &bad_r))
		FAIL("post_srq_recv");
	strcpy(e->buf, msg);
	memset(&swr, 0, sizeof swr);
	swr.wr_id = id + 1;
	swr.sg_list = &ssge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.qp_type.xrc.remote_srqn = e->srqn;
	if (ibv_post_send(ini, &swr, &bad_s))
		FAIL("post_send");
	wc = poll_one(e->send_cq, "send");
	if (wc.wr_id != id + 1)
		FAIL("send completion for wr %llu", (unsigned long long)wc.wr_id);
	if (wc.status != IBV_WC_SUCCESS)
		return wc.status;
	wc = poll_one(e->srq_cq, "receive");
	if (wc.wr_id != id || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV ||
	    wc.byte_len != strlen(msg) + 1 || wc.qp_num != qpn || strcmp(e->buf + 128, msg))
		FAIL("receive completion: wr_id %llu status %s qp %u len %u",
		     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.qp_num,
		     wc.byte_len);
	return IBV_WC_SUCCESS;
}

/* A new XRC_SEND QP of context A (in RESET). */
static struct ibv_qp *initiator(struct env *e)
{
	struct ibv_qp_init_attr_ex qa;
	struct ibv_qp *ini;

	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.send_cq = e->send_cq;
	qa.recv_cq = e->send_cq;
	qa.cap.max_send_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = e->pd;
	ini = ibv_create_qp_ex(e->ca, &qa);
	if (!ini)
		FAIL("XRC_SEND QP");
	return ini;
}

/* Moves initiator `ini` to RTS towards target `qpn`; `timeout` is the local ACK timeout
   exponent, `retry` the retry count. */
static void initiator_rts(struct env *e, struct ibv_qp *ini, uint32_t qpn, uint8_t timeout,
			  uint8_t retry)
{
	struct ibv_qp_attr a;

	init_rtr(ini, qpn, &e->gid, 0);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = 7;
	a.sq_psn = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(ini, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("initiator RTS");
}

/* One round: a target QP created through context A, opened through context B, moved
   through B's handle only; then the handle named by `opened_first` (B's, else A's) is
   destroyed, the QP still receives, and the other handle's destroy destroys it. */
static void round_trip(struct env *e, int opened_first)
{
	struct ibv_qp_init_attr_ex qa;
	struct ibv_qp_open_attr oa;
	struct ibv_qp *tgt, *opened, *ini, *first, *last;
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	uint32_t qpn;

	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_XRC_RECV;
	qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	qa.xrcd = e->xrcd_a;
	tgt = ibv_create_qp_ex(e->ca, &qa);
	if (!tgt)
		FAIL("XRC_RECV QP");
	qpn = tgt->qp_num;

	memset(&oa, 0, sizeof oa);
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = qpn ^ 0x800000;
	oa.xrcd = e->xrcd_b;
	oa.qp_type = IBV_QPT_XRC_RECV;
	errno = 0;
	if (ibv_open_qp(e->cb, &oa) != NULL)
		FAIL("ibv_open_qp of a number the domain has no QP for");
	pass("open_unknown_number");
	oa.qp_num = qpn;
	opened = ibv_open_qp(e->cb, &oa);
	if (!opened)
		FAIL("ibv_open_qp");
	if (opened == tgt || opened->qp_num != qpn || opened->context != e->cb ||
	    opened->qp_type != IBV_QPT_XRC_RECV)
		FAIL("opened handle: qpn %u context %p type %d", opened->qp_num,
		     (void *)opened->context, opened->qp_type);
	pass("open_by_number");

	/* The target moves through the handle of context B only. */
	ini = initiator(e);
	init_rtr(opened, ini->qp_num, &e->gid, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	initiator_rts(e, ini, qpn, 14, 7);
	pass("modify_through_opened");

	if (send_one(e, ini, qpn, MSG, 10, 1) != IBV_WC_SUCCESS)
		FAIL("send to the target QP");
	pass("receive_through_opened");

	first = opened_first ? opened : tgt;
	last = opened_first ? tgt : opened;
	if (ibv_destroy_qp(first))
		FAIL("destroy the %s handle", opened_first ? "opened" : "created");
	pass("destroy_one_handle");
	if (send_one(e, ini, qpn, MSG2, 20, 1) != IBV_WC_SUCCESS)
		FAIL("send after one handle was destroyed");
	if (ibv_query_qp(last, &qattr, IBV_QP_STATE, &qinit) || qattr.qp_state != IBV_QPS_RTR)
		FAIL("query through the remaining handle");
	pass("receive_after_one_destroyed");
	/* The domain still has the QP: it can be opened again (and that handle closed). */
	oa.xrcd = e->xrcd_a;
	{
		struct ibv_qp *again = ibv_open_qp(e->ca, &oa);
		if (!again || again->qp_num != qpn || ibv_destroy_qp(again))
			FAIL("open the QP again while a handle lives");
	}
	if (send_one(e, ini, qpn, MSG, 30, 1) != IBV_WC_SUCCESS)
		FAIL("send after the re-opened handle was destroyed");
	pass("reopen_and_close");

	if (ibv_destroy_qp(last))
		FAIL("destroy the last handle");
	errno = 0;
	if (ibv_open_qp(e->cb, &oa) != NULL)
		FAIL("ibv_open_qp of the destroyed QP succeeded");
	pass("destroy_last_handle");
	if (ibv_destroy_qp(ini))
		FAIL("destroy the initiator");
	/* A new initiator with a short ACK timeout and one retry: nothing answers now. */
	ini = initiator(e);
	initiator_rts(e, ini, qpn, 8, 1);
	/* No receive posted: a target that answered would RNR-NAK, not stay silent. */
	if (send_one(e, ini, qpn, MSG, 40, 0) != IBV_WC_RETRY_EXC_ERR)
		FAIL("a SEND to the destroyed QP did not end in a retry-exceeded error");
	if (ibv_destroy_qp(ini))
		FAIL("destroy the initiator");
	pass("gone_after_last");
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_xrcd_init_attr xa;
	struct ibv_srq_init_attr_ex sa;
	struct env e;
	int fd;

	if (argc != 2)
		return 2;
	memset(&e, 0, sizeof e);
	list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		FAIL("no device");
	e.ca = ibv_open_device(list[0]);
	e.cb = ibv_open_device(list[0]);
	if (!e.ca || !e.cb || e.ca == e.cb)
		FAIL("two contexts");
	if (ibv_query_gid(e.ca, 1, 0, &e.gid))
		FAIL("query_gid");

	fd = open(argv[1], O_CREAT | O_RDWR, 0600);
	if (fd < 0)
		FAIL("open %s", argv[1]);
	memset(&xa, 0, sizeof xa);
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = fd;
	xa.oflags = O_CREAT;
	e.xrcd_a = ibv_open_xrcd(e.ca, &xa);
	xa.oflags = 0;
	e.xrcd_b = ibv_open_xrcd(e.cb, &xa);
	if (!e.xrcd_a || !e.xrcd_b)
		FAIL("ibv_open_xrcd");

	e.pd = ibv_alloc_pd(e.ca);
	e.srq_cq = ibv_create_cq(e.ca, 8, NULL, NULL, 0);
	e.send_cq = ibv_create_cq(e.ca, 8, NULL, NULL, 0);
	if (!e.pd || !e.srq_cq || !e.send_cq)
		FAIL("pd/cq");
	memset(&sa, 0, sizeof sa);
	sa.attr.max_wr = 4;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
		       IBV_SRQ_INIT_ATTR_CQ;
	sa.srq_type = IBV_SRQT_XRC;
	sa.pd = e.pd;
	sa.xrcd = e.xrcd_a;
	sa.cq = e.srq_cq;
	e.srq = ibv_create_srq_ex(e.ca, &sa);
	if (!e.srq || ibv_get_srq_num(e.srq, &e.srqn))
		FAIL("XRC SRQ");
	e.buf = calloc(1, 256);
	e.mr = e.buf ? ibv_reg_mr(e.pd, e.buf, 256, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!e.mr)
		FAIL("reg_mr");

	suffix = "";
	round_trip(&e, 0);
	suffix = "_2";
	round_trip(&e, 1);

	/* Everything goes; the domain's last close succeeds now that no target QP has a
	   handle. */
	if (ibv_dereg_mr(e.mr) || ibv_destroy_srq(e.srq) || ibv_destroy_cq(e.srq_cq) ||
	    ibv_destroy_cq(e.send_cq) || ibv_dealloc_pd(e.pd) || ibv_close_xrcd(e.xrcd_b) ||
	    ibv_close_xrcd(e.xrcd_a))
		FAIL("teardown");
	close(fd);
	free(e.buf);
	if (ibv_close_device(e.ca) || ibv_close_device(e.cb))
		FAIL("close devices");
	ibv_free_device_list(list);
	suffix = "";
	pass("teardown");
	return 0;
}
