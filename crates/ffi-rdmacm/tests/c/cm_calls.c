/* librdmacm calls beyond the connect/accept path, between two processes:
     cm_calls server ADDR PORT   cm_calls client ADDR PORT
   Server: the connection request's id is moved to a second channel (rdma_migrate_id); its
   QP is made by rdma_create_qp_ex on the program's PD with the CQs left to the library;
   after rdma_accept, rdma_notify(IBV_EVENT_COMM_EST) establishes (or finds established)
   the connection; ESTABLISHED and DISCONNECTED arrive on the second channel and none on
   the first; a second COMM_EST notify is EISCONN, another event EINVAL; the client's
   message arrives. Client: a QP the program owns (ibv_create_qp, not given to the id),
   moved to INIT, RTR and RTS with rdma_init_qp_attr (RTR names the QPN of the REP),
   connected with conn_param.qp_num, CONNECT_RESPONSE then rdma_establish; one SEND.
   Each side prints one line per check and exits 0 when all pass. Every wait is bounded. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define MSG "uroce-cm-calls"

static int fail(const char *what)
{
	printf("FAIL: %s (errno %d)\n", what, errno);
	return 1;
}

static void pause_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* The next event on ch within 20 s (the descriptor is made non-blocking). */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev;
	int i;

	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	for (i = 0; i < 20000; i++) {
		if (rdma_get_cm_event(ch, &ev) == 0)
			return ev;
		if (errno != EAGAIN)
			return NULL;
		pause_ms(1);
	}
	errno = ETIMEDOUT;
	return NULL;
}

static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type t,
		  struct rdma_cm_event **out)
{
	struct rdma_cm_event *ev = next_event(ch);

	if (!ev) {
		printf("FAIL: no %s (errno %d)\n", rdma_event_str(t), errno);
		return 1;
	}
	if (ev->event != t) {
		printf("FAIL: %s instead of %s\n", rdma_event_str(ev->event), rdma_event_str(t));
		return 1;
	}
	if (out)
		*out = ev;
	else
		rdma_ack_cm_event(ev);
	return 0;
}

/* One completion of cq within 10 s. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	int i, n;

	for (i = 0; i < 10000; i++) {
		n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n == 1 && wc->status == IBV_WC_SUCCESS ? 0 : 1;
		pause_ms(1);
	}
	return 1;
}

static int server(struct sockaddr_in *sin)
{
	struct rdma_event_channel *ch1, *ch2;
	struct rdma_cm_id *listen, *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param param;
	struct ibv_qp_init_attr_ex qa;
	struct ibv_recv_wr rwr, *bad;
	struct ibv_sge sge;
	struct ibv_wc wc;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	char buf[64];
	int rc;

	ch1 = rdma_create_event_channel();
	ch2 = rdma_create_event_channel();
	if (!ch1 || !ch2)
		return fail("rdma_create_event_channel");
	if (rdma_create_id(ch1, &listen, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen, (struct sockaddr *)sin) || rdma_listen(listen, 1))
		return fail("listen");
	printf("server: listening\n");
	fflush(stdout);
	if (expect(ch1, RDMA_CM_EVENT_CONNECT_REQUEST, &ev))
		return 1;
	id = ev->id;
	rdma_ack_cm_event(ev);

	if (rdma_migrate_id(id, ch2) || id->channel != ch2)
		return fail("rdma_migrate_id");
	printf("server: migrated\n");

	pd = ibv_alloc_pd(id->verbs);
	if (!pd)
		return fail("ibv_alloc_pd");
	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 4;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	qa.pd = pd;
	if (rdma_create_qp_ex(id, &qa))
		return fail("rdma_create_qp_ex");
	if (!id->qp || id->qp->pd != pd || id->pd != pd || !id->recv_cq || !id->send_cq ||
	    qa.recv_cq != id->recv_cq || qa.send_cq != id->send_cq)
		return fail("rdma_create_qp_ex: id fields");
	errno = 0;
	if (rdma_create_qp_ex(id, &qa) != -1 || errno != EINVAL)
		return fail("rdma_create_qp_ex on an id with a QP");
	printf("server: create_qp_ex\n");

	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		return fail("ibv_reg_mr");
	memset(buf, 0, sizeof buf);
	sge.addr = (uintptr_t)buf;
	sge.length = sizeof buf;
	sge.lkey = mr->lkey;
	memset(&rwr, 0, sizeof rwr);
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	if (ibv_post_recv(id->qp, &rwr, &bad))
		return fail("ibv_post_recv");

	memset(&param, 0, sizeof param);
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.rnr_retry_count = 7;
	if (rdma_accept(id, &param))
		return fail("rdma_accept");
	/* Data may arrive before the RTU: COMM_EST establishes the connection; if the RTU
	   came first, it is established already. */
	errno = 0;
	rc = rdma_notify(id, IBV_EVENT_COMM_EST);
	if (rc != 0 && errno != EISCONN)
		return fail("rdma_notify(COMM_EST) after the accept");
	printf("server: notify after accept\n");

	if (expect(ch2, RDMA_CM_EVENT_ESTABLISHED, NULL))
		return 1;
	errno = 0;
	if (rdma_get_cm_event(ch1, &ev) != -1 || errno != EAGAIN)
		return fail("an event on the channel the id left");
	printf("server: established on the new channel\n");
	errno = 0;
	if (rdma_notify(id, IBV_EVENT_COMM_EST) != -1 || errno != EISCONN)
		return fail("rdma_notify(COMM_EST) when established");
	errno = 0;
	if (rdma_notify(id, IBV_EVENT_PATH_MIG) != -1 || errno != EINVAL)
		return fail("rdma_notify(PATH_MIG)");
	printf("server: notify EISCONN, EINVAL\n");

	if (poll_one(id->recv_cq, &wc) || wc.byte_len != sizeof MSG || strcmp(buf, MSG))
		return fail("receive");
	printf("server: received %s\n", buf);
	fflush(stdout);

	if (expect(ch2, RDMA_CM_EVENT_DISCONNECTED, NULL))
		return 1;
	printf("server: disconnected\n");
	rdma_destroy_qp(id);
	ibv_dereg_mr(mr);
	if (rdma_destroy_id(id) || rdma_destroy_id(listen))
		return fail("rdma_destroy_id");
	ibv_dealloc_pd(pd);
	rdma_destroy_event_channel(ch1);
	rdma_destroy_event_channel(ch2);
	return 0;
}

/* Moves qp to state s with the attributes rdma_init_qp_attr gives. */
static int to_state(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state s,
		    struct ibv_qp_attr *a, int *mask)
{
	memset(a, 0, sizeof *a);
	a->qp_state = s;
	if (rdma_init_qp_attr(id, a, mask))
		return fail("rdma_init_qp_attr");
	if (!(*mask & IBV_QP_STATE) || a->qp_state != s)
		return fail("rdma_init_qp_attr: state");
	if (ibv_modify_qp(qp, a, *mask))
		return fail("ibv_modify_qp");
	return 0;
}

static int client(struct sockaddr_in *sin)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	struct rdma_conn_param param;
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;
	struct ibv_send_wr swr, *bad;
	struct ibv_sge sge;
	struct ibv_wc wc;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[64] = MSG;
	uint32_t peer_qpn;
	int mask;

	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return fail("rdma_create_id");
	errno = 0;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	if (rdma_init_qp_attr(id, &a, &mask) != -1 || errno != EINVAL)
		return fail("rdma_init_qp_attr before the address is resolved");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)sin, 2000) ||
	    expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL) || rdma_resolve_route(id, 2000) ||
	    expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL))
		return fail("resolve");

	pd = ibv_alloc_pd(id->verbs);
	cq = pd ? ibv_create_cq(id->verbs, 8, NULL, NULL, 0) : NULL;
	if (!cq)
		return fail("pd/cq");
	memset(&ia, 0, sizeof ia);
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &ia);
	if (!qp)
		return fail("ibv_create_qp");
	if (to_state(id, qp, IBV_QPS_INIT, &a, &mask))
		return 1;
	printf("client: INIT\n");

	memset(&param, 0, sizeof param);
	param.responder_resources = 1;
	param.initiator_depth = 1;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	param.qp_num = qp->qp_num;
	if (rdma_connect(id, &param))
		return fail("rdma_connect");
	if (expect(ch, RDMA_CM_EVENT_CONNECT_RESPONSE, &ev))
		return 1;
	peer_qpn = ev->param.conn.qp_num;
	rdma_ack_cm_event(ev);
	printf("client: connect response\n");

	if (to_state(id, qp, IBV_QPS_RTR, &a, &mask))
		return 1;
	if (!(mask & IBV_QP_DEST_QPN) || a.dest_qp_num != peer_qpn || !(mask & IBV_QP_RQ_PSN) ||
	    !(mask & IBV_QP_AV))
		return fail("RTR attributes");
	printf("client: RTR to the REP's QPN\n");
	if (to_state(id, qp, IBV_QPS_RTS, &a, &mask))
		return 1;
	if (!(mask & IBV_QP_SQ_PSN))
		return fail("RTS attributes");
	printf("client: RTS\n");
	if (rdma_establish(id))
		return fail("rdma_establish");

	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		return fail("ibv_reg_mr");
	sge.addr = (uintptr_t)buf;
	sge.length = sizeof MSG;
	sge.lkey = mr->lkey;
	memset(&swr, 0, sizeof swr);
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	if (ibv_post_send(qp, &swr, &bad))
		return fail("ibv_post_send");
	if (poll_one(cq, &wc) || wc.opcode != IBV_WC_SEND)
		return fail("send completion");
	printf("client: sent\n");

	if (rdma_disconnect(id) || expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL))
		return fail("rdma_disconnect");
	printf("client: disconnected\n");
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sin;

	if (argc != 4)
		return 2;
	memset(&sin, 0, sizeof sin);
	sin.sin_family = AF_INET;
	sin.sin_port = htons((unsigned short)atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &sin.sin_addr) != 1)
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	return strcmp(argv[1], "server") == 0 ? server(&sin) : client(&sin);
}
