/* Refused verbs calls, one per section: each section starts with a "--- name" line on
 * stderr, and the call's result is printed on stdout as "name rc errno". Run by
 * tests/refusals.rs with and without UROCE_DEBUG=1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static void start(const char *name) {
    fprintf(stderr, "--- %s\n", name);
    fflush(stderr);
    errno = 0;
}

static void done(const char *name, long failed) {
    printf("%s %s %d\n", name, failed ? "refused" : "accepted", errno);
    fflush(stdout);
}

#define STEP(name, failed_expr)                                                                  \
    do {                                                                                       \
        start(name);                                                                           \
        done(name, (long)(failed_expr));                                                       \
    } while (0)

int main(void) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1)
        return 2;
    STEP("open_device", ibv_open_device(NULL) == NULL);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    if (!ctx)
        return 3;
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    if (!pd || !cq)
        return 4;
    STEP("create_cq", ibv_create_cq(ctx, 1 << 30, NULL, NULL, 0) == NULL);
    struct ibv_qp_init_attr qa = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 1 << 30, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    STEP("create_qp", ibv_create_qp(pd, &qa) == NULL);
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = 1 << 30, .max_sge = 1}};
    STEP("create_srq", ibv_create_srq(pd, &sa) == NULL);
    static char buf[4096];
    STEP("reg_mr", ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_REMOTE_WRITE) == NULL);
    qa.cap.max_send_wr = 1;
    struct ibv_qp *qp = ibv_create_qp(pd, &qa);
    if (!qp)
        return 5;
    struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTS};
    STEP("modify_qp", ibv_modify_qp(qp, &at, IBV_QP_STATE) != 0);
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return 6;
    /* Accepted: a GRH flow label with bits above the 20 is masked, as drivers do. */
    memset(&at, 0, sizeof at);
    at.qp_state = IBV_QPS_RTR;
    at.path_mtu = IBV_MTU_1024;
    at.dest_qp_num = qp->qp_num;
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 1;
    at.ah_attr.is_global = 1;
    at.ah_attr.port_num = 1;
    at.ah_attr.grh.flow_label = 0xfffffff;
    at.ah_attr.grh.hop_limit = 64;
    if (ibv_query_gid(ctx, 1, 0, &at.ah_attr.grh.dgid))
        return 7;
    STEP("flow_label", ibv_modify_qp(qp, &at,
                                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                         IBV_QP_MIN_RNR_TIMER) != 0);
    struct ibv_port_attr pa;
    STEP("query_port", ibv_query_port(ctx, 7, &pa) != 0);
    STEP("get_cq_event", ibv_get_cq_event(NULL, NULL, NULL) != 0);
    STEP("get_async_event", ibv_get_async_event(ctx, NULL) != 0);
    start("end");
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ibv_free_device_list(list);
    return 0;
}
