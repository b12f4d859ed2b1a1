/* ibv_attach_mcast / ibv_detach_mcast through the C API, on one device: the device
   advertises multicast (max_mcast_grp > 0); attach refuses an RC QP, a unicast GID and a
   detach of a QP not attached (EINVAL); a UD datagram to the multicast GID (remote QPN
   0xFFFFFF) reaches both attached QPs of the device, with the group as the GRH
   destination; after one QP detaches, the next datagram reaches only the other.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define QKEY 0x11223344
#define LEN 32
#define SLOT 256

static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static char buf[8 * SLOT];

static struct ibv_qp *ud_qp(void)
{
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		FAIL("create_qp");
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = QKEY;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		FAIL("INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		FAIL("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		FAIL("RTS");
	return qp;
}

static void post_recv(struct ibv_qp *qp, int slot)
{
	struct ibv_sge s = { (uintptr_t)(buf + slot * SLOT), SLOT, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)slot, .sg_list = &s, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &wr, &bad))
		FAIL("post_recv");
}

/* Up to `want` completions within `ms` milliseconds (bounded). */
static int poll_n(struct ibv_wc *wc, int want, int ms)
{
	int got = 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, want - got, wc + got);
		if (n < 0)
			FAIL("poll_cq");
		got += n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		long el = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
		if (got == want || el > ms)
			return got;
	}
}

static void send_group(struct ibv_qp *qp, struct ibv_ah *ah, char fill)
{
	memset(buf + 7 * SLOT, fill, LEN);
	struct ibv_sge s = { (uintptr_t)(buf + 7 * SLOT), LEN, mr->lkey };
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = 99;
	wr.sg_list = &s;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = 0xffffff;
	wr.wr.ud.remote_qkey = QKEY;
	if (ibv_post_send(qp, &wr, &bad))
		FAIL("post_send");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		FAIL("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("open");
	struct ibv_device_attr da;
	if (ibv_query_device(ctx, &da))
		FAIL("query_device");
	if (da.max_mcast_grp <= 0 || da.max_mcast_qp_attach <= 0)
		FAIL("max_mcast_grp %d max_mcast_qp_attach %d", da.max_mcast_grp, da.max_mcast_qp_attach);
	printf("PASS device_attr\n");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	if (!pd || !cq || !mr)
		FAIL("pd/cq/mr");
	struct ibv_qp *tx = ud_qp(), *r1 = ud_qp(), *r2 = ud_qp();

	union ibv_gid mgid, ucast;
	memset(&mgid, 0, sizeof mgid);
	mgid.raw[10] = mgid.raw[11] = 0xff;
	inet_pton(AF_INET, "239.41.5.9", &mgid.raw[12]);
	if (ibv_query_gid(ctx, 1, 0, &ucast))
		FAIL("query_gid");

	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof ia);
	ia.send_cq = ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
	struct ibv_qp *rc = ibv_create_qp(pd, &ia);
	if (!rc)
		FAIL("create rc");
	int rv;
	if ((rv = ibv_attach_mcast(rc, &mgid, 0)) != EINVAL)
		FAIL("attach RC QP gave %d", rv);
	if ((rv = ibv_attach_mcast(r1, &ucast, 0)) != EINVAL)
		FAIL("attach unicast GID gave %d", rv);
	if ((rv = ibv_detach_mcast(r1, &mgid, 0)) != EINVAL)
		FAIL("detach of a QP not attached gave %d", rv);
	printf("PASS refusals\n");

	if (ibv_attach_mcast(r1, &mgid, 0) || ibv_attach_mcast(r2, &mgid, 0))
		FAIL("attach: %s", strerror(errno));
	printf("PASS attach\n");

	struct ibv_ah_attr aa;
	memset(&aa, 0, sizeof aa);
	aa.is_global = 1;
	aa.grh.dgid = mgid;
	aa.grh.hop_limit = 1;
	aa.port_num = 1;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		FAIL("create_ah to the group: %s", strerror(errno));
	post_recv(r1, 1);
	post_recv(r2, 2);
	send_group(tx, ah, 'm');
	struct ibv_wc wc[8];
	int n = poll_n(wc, 3, 5000);
	int seen1 = 0, seen2 = 0, sent = 0;
	for (int i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			FAIL("wc status %d", wc[i].status);
		if (wc[i].opcode == IBV_WC_SEND) {
			sent++;
			continue;
		}
		char *p = buf + wc[i].wr_id * SLOT;
		if (wc[i].byte_len != 40 + LEN || p[40] != 'm' || p[40 + LEN - 1] != 'm')
			FAIL("received data");
		if (memcmp(p + 36, &mgid.raw[12], 4))
			FAIL("GRH destination is not the group");
		if (wc[i].src_qp != tx->qp_num || !(wc[i].wc_flags & IBV_WC_GRH))
			FAIL("src_qp / GRH flag");
		seen1 += wc[i].qp_num == r1->qp_num;
		seen2 += wc[i].qp_num == r2->qp_num;
	}
	if (sent != 1 || seen1 != 1 || seen2 != 1)
		FAIL("first datagram: sent %d r1 %d r2 %d", sent, seen1, seen2);
	printf("PASS both_members\n");

	if (ibv_detach_mcast(r2, &mgid, 0))
		FAIL("detach: %s", strerror(errno));
	post_recv(r1, 3);
	post_recv(r2, 4);
	send_group(tx, ah, 'n');
	n = poll_n(wc, 3, 500);
	seen1 = seen2 = sent = 0;
	for (int i = 0; i < n; i++) {
		if (wc[i].opcode == IBV_WC_SEND) {
			sent++;
			continue;
		}
		seen1 += wc[i].qp_num == r1->qp_num;
		seen2 += wc[i].qp_num == r2->qp_num;
	}
	if (sent != 1 || seen1 != 1 || seen2 != 0)
		FAIL("after detach: sent %d r1 %d r2 %d", sent, seen1, seen2);
	printf("PASS detach\n");

	if (ibv_detach_mcast(r1, &mgid, 0))
		FAIL("detach r1");
	if (ibv_destroy_ah(ah) || ibv_destroy_qp(rc) || ibv_destroy_qp(r2) || ibv_destroy_qp(r1) ||
	    ibv_destroy_qp(tx) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) ||
	    ibv_close_device(ctx))
		FAIL("teardown");
	ibv_free_device_list(list);
	printf("PASS teardown\n");
	return 0;
}
