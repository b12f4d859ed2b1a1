/*
 * Shared by the C tests that connect two RC QPs of one device over loopback (cq_ex.c,
 * cq_timestamps.c, parent_domain.c, async_events.c, ctx_events.c, import.c): failure exit, a monotonic clock in seconds, and the
 * INIT -> RTR (-> RTS) transitions (PSN 1 both ways, path MTU 1024).
 */
#ifndef UROCE_TEST_RC_LOOPBACK_H
#define UROCE_TEST_RC_LOOPBACK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, "FAIL: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static inline double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* INIT (remote access `access`) -> RTR, and -> RTS when `rts`. */
static inline void connect_rc(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *gid,
			      unsigned int access, int rts)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		FAIL("RTR");
	if (!rts)
		return;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("RTS");
}

/* INIT -> RTR -> RTS with remote WRITE access. */
static inline void to_rts(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *gid)
{
	connect_rc(qp, dqpn, gid, IBV_ACCESS_REMOTE_WRITE, 1);
}

#endif
