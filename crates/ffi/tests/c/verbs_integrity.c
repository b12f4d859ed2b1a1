/*
 * verbs_integrity: data-integrity checks of an RC connection through the public libibverbs
 * C API only (<infiniband/verbs.h>: the exported functions and the header's inline data
 * path, ibv_post_send / ibv_post_recv / ibv_poll_cq through ibv_context.ops).
 *
 * Two processes, like ibv_rc_pingpong:
 *     verbs_integrity [-d] [-n ROUNDS] PORT           server: listens on 127.0.0.1:PORT
 *     verbs_integrity [-d] [-n ROUNDS] PORT HOST      client: connects to HOST:PORT
 * -n repeats the data checks ROUNDS times (default 1, new patterns each round); -d leaves
 * out the error checks (for runs with injected packet loss, where a lost NAK legitimately
 * ends in a retry-exceeded error instead). Both processes must get the same options.
 * They exchange QP numbers, PSNs, GIDs, R_Keys and addresses over that TCP connection and
 * keep it as a barrier between steps. Each uses the first device, port 1, GID index 0, RC
 * QPs with a global route to the peer's GID and the port's active MTU.
 *
 * Every check runs twice, first with the client as requester, then with the server, so
 * each process prints every "PASS <name>" line exactly once (a data check once per
 * round); the last line is "ALL <n> CHECKS PASSED". A failed check prints
 * "FAIL <what>" and exits 1. Every wait is bounded (completion polls, QP state polls and
 * the TCP barrier all time out).
 *
 * The expected behaviour comes from the verbs API and the InfiniBand transport:
 *   - SEND / SEND_WITH_IMM deliver the bytes in order into the receive SGEs, byte_len is
 *     the message length, opcode IBV_WC_RECV, imm_data (network order) with
 *     IBV_WC_WITH_IMM; bytes beyond the message stay untouched.
 *   - RDMA WRITE places the bytes at the remote address and nothing else; WRITE_WITH_IMM
 *     also consumes a receive: IBV_WC_RECV_RDMA_WITH_IMM, byte_len = the RDMA length (also
 *     0), the receive buffer itself untouched. An unsignaled WR produces no completion.
 *   - IBV_SEND_INLINE data is copied by ibv_post_send: the source may change right after.
 *   - RDMA READ returns the peer's bytes (multi-packet, scattered over several SGEs).
 *   - FETCH_AND_ADD / CMP_AND_SWP return the original 64-bit value (host order) and
 *     leave the peer word at old+add / swap (compare matched) / old (no match).
 *   - An R_Key violation (wrong key, or a range outside the region) is answered with a NAK
 *     Remote Access Error: the requester's WR completes IBV_WC_REM_ACCESS_ERR (even when
 *     unsignaled), its QP goes to ERR and later WRs complete IBV_WC_WR_FLUSH_ERR (also
 *     those posted in ERR). The responder's QP goes to ERR: a receive the request had
 *     consumed (WRITE_WITH_IMM) completes IBV_WC_REM_ACCESS_ERR, the other posted receives
 *     complete IBV_WC_WR_FLUSH_ERR; the targeted memory is not modified. WRs before the
 *     faulty one complete normally.
 *   - A SEND longer than the receive buffer is answered with a NAK Invalid Request: the
 *     requester sees IBV_WC_REM_INV_REQ_ERR, the responder's receive completes in error
 *     (IBV_WC_LOC_LEN_ERR per IBA, IBV_WC_REM_INV_REQ_ERR as rxe reports it), both QPs go
 *     to ERR, and no byte lands beyond the receive buffer.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- limits ---------------------------------------------------------------------- */

#define POLL_LIMIT_MS 5000      /* one completion / QP-state wait */
#define QUIET_MS 50             /* "no further completion" wait */
#define TCP_LIMIT_S 30          /* one TCP read, accept or connect attempt series */

/* ---- memory layout ----------------------------------------------------------------
 * One main region (MAIN_MR_LEN bytes registered, followed by SLACK unregistered bytes
 * that must never change) and one auxiliary region (for SGE lists spanning two MRs). */

#define REGION 16384u
#define OFF_SEND_SRC 0u
#define OFF_RECV (1 * REGION)
#define OFF_WRITE_DST (2 * REGION)
#define OFF_READ_SRC (3 * REGION)
#define OFF_READ_DST (4 * REGION)
#define OFF_ATOM (5 * REGION)              /* 32 words the peer's atomics target */
#define OFF_ATOM_RES (5 * REGION + 256u)   /* 32 words for local atomic results */
#define OFF_TAIL (5 * REGION + 4096u)      /* last 4 KiB of the region */
#define MAIN_MR_LEN (5 * REGION + 8192u)
#define SLACK 4096u
#define AUX_LEN 16384u
#define AUX_SEND 0u
#define AUX_RECV 4096u
#define AUX_READ 8192u

#define SENTINEL 0xEE
#define INLINE_LEN 256u /* inline payload of the INLINE checks (max_inline_data asked) */
#define SENTINEL64 0xEEEEEEEEEEEEEEEEull

/* ---- QPs -------------------------------------------------------------------------- */

enum err_case {
    ERR_WRITE_BAD_RKEY,
    ERR_READ_BAD_RKEY,
    ERR_WRITE_IMM_BAD_RKEY,
    ERR_ATOMIC_BAD_RKEY,
    ERR_WRITE_OUT_OF_RANGE,
    ERR_SEND_TOO_LONG,
    NUM_ERR_CASES
};

static const char *const err_name[NUM_ERR_CASES] = {
    "bad_rkey_write", "bad_rkey_read", "bad_rkey_write_with_imm", "bad_rkey_fetch_add",
    "write_beyond_mr", "send_longer_than_receive",
};

/* QP 0 carries the data checks; QP 1 + dir * NUM_ERR_CASES + case one error case. */
#define NQP (1 + 2 * NUM_ERR_CASES)

struct qp_set {
    struct ibv_qp *qp;
    struct ibv_cq *scq;
    struct ibv_cq *rcq;
};

/* What the processes exchange (same host: native layout and byte order). */
struct wire_info {
    uint32_t magic;
    uint32_t qpn[NQP];
    uint32_t psn[NQP];
    uint32_t rkey;
    uint32_t aux_rkey;
    uint64_t addr;
    uint64_t aux_addr;
    uint8_t gid[16];
    uint32_t mtu;
};
#define WIRE_MAGIC 0x75524331u

struct ctx {
    bool is_client;
    int sock;
    struct ibv_context *dev;
    struct ibv_pd *pd;
    uint8_t *buf;
    uint8_t *aux;
    struct ibv_mr *mr;
    struct ibv_mr *aux_mr;
    struct qp_set q[NQP];
    struct wire_info me;
    struct wire_info peer;
    enum ibv_mtu mtu;
    uint32_t mtu_bytes;
    int checks;
};

/* ---- reporting -------------------------------------------------------------------- */

static const char *role_name = "?";

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;
    printf("FAIL [%s] ", role_name);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    exit(1);
}

static void pass(struct ctx *c, const char *name)
{
    printf("PASS %s\n", name);
    fflush(stdout);
    c->checks++;
}

static const char *status_str(int s)
{
    return ibv_wc_status_str((enum ibv_wc_status)s);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- patterns --------------------------------------------------------------------- */

/* Byte i of the stream named by seed: position dependent, so a shifted, reordered or
 * duplicated packet shows. */
static uint8_t pat(uint32_t seed, size_t i)
{
    uint32_t x = (uint32_t)i * 0x9E3779B1u ^ (seed * 0x85EBCA77u + 0x2545F491u);
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return (uint8_t)x;
}

struct seg {
    uint8_t *p;
    uint32_t len;
};

/* Writes the stream `seed` consecutively over the segments. */
static void fill_stream(uint32_t seed, const struct seg *s, int n)
{
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (uint32_t j = 0; j < s[i].len; j++)
            s[i].p[j] = pat(seed, k++);
}

/* Checks that the segments, read consecutively, hold the first `total` bytes of stream
 * `seed`, and that the rest of the segments still holds SENTINEL. */
static void check_stream(const char *what, uint32_t seed, const struct seg *s, int n,
                         size_t total)
{
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        for (uint32_t j = 0; j < s[i].len; j++, k++) {
            if (k < total) {
                uint8_t want = pat(seed, k);
                if (s[i].p[j] != want)
                    fail("%s: byte %zu of the message (segment %d offset %u) is 0x%02x, "
                         "want 0x%02x",
                         what, k, i, j, s[i].p[j], want);
            } else if (s[i].p[j] != SENTINEL) {
                fail("%s: segment %d offset %u beyond the %zu-byte message was changed "
                     "(0x%02x)",
                     what, i, j, total, s[i].p[j]);
            }
        }
    }
    if (k < total)
        fail("%s: segments hold %zu bytes, fewer than %zu", what, k, total);
}

/* Checks that [p, p+len) still holds SENTINEL. */
static void check_untouched(const char *what, const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != SENTINEL)
            fail("%s: byte %zu was changed to 0x%02x", what, i, p[i]);
}

/* ---- TCP -------------------------------------------------------------------------- */

static void write_full(int fd, const void *p, size_t len)
{
    const uint8_t *b = p;
    size_t done = 0;
    while (done < len) {
        ssize_t n = send(fd, b + done, len - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail("TCP send: %s", n < 0 ? strerror(errno) : "closed");
        done += (size_t)n;
    }
}

/* Reads exactly len bytes; the socket's receive timeout bounds each read. */
static void read_full(int fd, void *p, size_t len)
{
    uint8_t *b = p;
    size_t done = 0;
    while (done < len) {
        ssize_t n = recv(fd, b + done, len - done, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail("TCP recv: %s", errno == EAGAIN || errno == EWOULDBLOCK
                                     ? "timed out (peer stuck?)"
                                     : strerror(errno));
        if (n == 0)
            fail("TCP recv: the peer closed the connection (it failed?)");
        done += (size_t)n;
    }
}

/* Both processes reach the same named point; a different name means they lost step. */
static void barrier(struct ctx *c, const char *tag)
{
    char mine[48] = {0}, theirs[48];
    snprintf(mine, sizeof(mine), "%s", tag);
    write_full(c->sock, mine, sizeof(mine));
    read_full(c->sock, theirs, sizeof(theirs));
    theirs[sizeof(theirs) - 1] = 0;
    if (strcmp(mine, theirs) != 0)
        fail("barrier: at \"%s\", the peer at \"%s\"", mine, theirs);
}

static void set_timeouts(int fd)
{
    struct timeval tv = {.tv_sec = TCP_LIMIT_S, .tv_usec = 0};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
        fail("setsockopt: %s", strerror(errno));
}

static int tcp_server(uint16_t port)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0)
        fail("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1))
        fail("bind/listen on 127.0.0.1:%u: %s", port, strerror(errno));
    struct pollfd pfd = {.fd = l, .events = POLLIN};
    int r = poll(&pfd, 1, TCP_LIMIT_S * 1000);
    if (r != 1)
        fail("no client connected within %d s", TCP_LIMIT_S);
    int s = accept(l, NULL, NULL);
    if (s < 0)
        fail("accept: %s", strerror(errno));
    close(l);
    set_timeouts(s);
    return s;
}

static int tcp_client(const char *host, uint16_t port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        fail("not an IPv4 address: %s", host);
    uint64_t deadline = now_ms() + TCP_LIMIT_S * 1000u;
    for (;;) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0)
            fail("socket: %s", strerror(errno));
        if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
            set_timeouts(s);
            return s;
        }
        int e = errno;
        close(s);
        if (now_ms() > deadline)
            fail("cannot connect to %s:%u: %s", host, port, strerror(e));
        usleep(20000);
    }
}

/* ---- completions ------------------------------------------------------------------ */

/* Polls exactly n completions from cq (fails after POLL_LIMIT_MS). */
static void poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, const char *what)
{
    int got = 0, idle = 0;
    uint64_t deadline = now_ms() + POLL_LIMIT_MS;
    while (got < n) {
        int r = ibv_poll_cq(cq, n - got, wc + got);
        if (r < 0)
            fail("%s: ibv_poll_cq returned %d", what, r);
        got += r;
        if (got < n && now_ms() > deadline)
            fail("%s: %d of %d completions after %d ms", what, got, n, POLL_LIMIT_MS);
        /* Busy-poll briefly, then leave the CPU to the library's progress thread. */
        idle = r ? 0 : idle + 1;
        if (idle > 64)
            usleep(20);
    }
}

/* Fails if a completion shows up on cq within QUIET_MS. */
static void expect_quiet(struct ibv_cq *cq, const char *what)
{
    struct ibv_wc wc;
    uint64_t deadline = now_ms() + QUIET_MS;
    do {
        int r = ibv_poll_cq(cq, 1, &wc);
        if (r < 0)
            fail("%s: ibv_poll_cq returned %d", what, r);
        if (r > 0)
            fail("%s: unexpected completion wr_id %llu status %s opcode %d", what,
                 (unsigned long long)wc.wr_id, status_str(wc.status), wc.opcode);
        usleep(1000);
    } while (now_ms() < deadline);
}

/* A successful completion of wr_id with the given opcode on qp. */
static void expect_ok(const struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_opcode op,
                      struct ibv_qp *qp, const char *what)
{
    if (wc->status != IBV_WC_SUCCESS)
        fail("%s: wr_id %llu completed with status %s (%d), vendor_err %u", what,
             (unsigned long long)wc->wr_id, status_str(wc->status), wc->status,
             wc->vendor_err);
    if (wc->wr_id != wr_id)
        fail("%s: completion for wr_id %llu, expected %llu", what,
             (unsigned long long)wc->wr_id, (unsigned long long)wr_id);
    if (wc->opcode != op)
        fail("%s: opcode %d, expected %d", what, wc->opcode, op);
    if (wc->qp_num != qp->qp_num)
        fail("%s: qp_num %u, expected %u", what, wc->qp_num, qp->qp_num);
}

/* An error completion of wr_id with the given status on qp. */
static void expect_status(const struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_status st,
                          struct ibv_qp *qp, const char *what)
{
    if (wc->wr_id != wr_id)
        fail("%s: completion for wr_id %llu (status %s), expected wr_id %llu", what,
             (unsigned long long)wc->wr_id, status_str(wc->status),
             (unsigned long long)wr_id);
    if (wc->status != st)
        fail("%s: wr_id %llu completed with %s (%d), expected %s (%d)", what,
             (unsigned long long)wr_id, status_str(wc->status), wc->status, status_str(st),
             st);
    if (wc->qp_num != qp->qp_num)
        fail("%s: qp_num %u, expected %u", what, wc->qp_num, qp->qp_num);
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    memset(&a, 0, sizeof(a));
    int r = ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
    if (r)
        fail("ibv_query_qp: %s", strerror(r));
    /* libibverbs refreshes qp->state from a query that asks for the state. */
    if (qp->state != a.qp_state)
        fail("ibv_query_qp(IBV_QP_STATE) returned state %d, qp->state is %d", a.qp_state,
             qp->state);
    return a.qp_state;
}

/* Waits (bounded) until qp reports state s. */
static void wait_state(struct ibv_qp *qp, enum ibv_qp_state s, const char *what)
{
    uint64_t deadline = now_ms() + POLL_LIMIT_MS;
    enum ibv_qp_state cur;
    while ((cur = qp_state(qp)) != s) {
        if (now_ms() > deadline)
            fail("%s: QP %u in state %d after %d ms, expected %d", what, qp->qp_num, cur,
                 POLL_LIMIT_MS, s);
        usleep(1000);
    }
}

/* ---- posting ---------------------------------------------------------------------- */

static struct ibv_sge sge_of(struct ibv_mr *mr, const void *p, uint32_t len)
{
    struct ibv_sge s = {.addr = (uintptr_t)p, .length = len, .lkey = mr->lkey};
    return s;
}

static void post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, const char *what)
{
    struct ibv_send_wr *bad = NULL;
    int r = ibv_post_send(qp, wr, &bad);
    if (r)
        fail("%s: ibv_post_send: %s (bad_wr wr_id %llu)", what, strerror(r),
             bad ? (unsigned long long)bad->wr_id : 0ull);
}

static void post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sg, int n,
                      const char *what)
{
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = sg;
    wr.num_sge = n;
    int r = ibv_post_recv(qp, &wr, &bad);
    if (r)
        fail("%s: ibv_post_recv: %s", what, strerror(r));
}

/* ---- setup ------------------------------------------------------------------------ */

static uint32_t mtu_bytes(enum ibv_mtu m)
{
    switch (m) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
    }
    fail("unknown MTU enum %d", (int)m);
}

static void create_qp_set(struct ctx *c, int i)
{
    struct qp_set *q = &c->q[i];
    q->scq = ibv_create_cq(c->dev, 32, NULL, NULL, 0);
    q->rcq = ibv_create_cq(c->dev, 32, NULL, NULL, 0);
    if (!q->scq || !q->rcq)
        fail("ibv_create_cq: %s", strerror(errno));
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = q->scq;
    ia.recv_cq = q->rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.sq_sig_all = 0;
    ia.cap.max_send_wr = 16;
    ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = 4;
    ia.cap.max_recv_sge = 4;
    ia.cap.max_inline_data = INLINE_LEN;
    q->qp = ibv_create_qp(c->pd, &ia);
    if (!q->qp)
        fail("ibv_create_qp: %s", strerror(errno));
    if (ia.cap.max_send_sge < 3 || ia.cap.max_recv_sge < 2 ||
        ia.cap.max_inline_data < INLINE_LEN)
        fail("ibv_create_qp granted %u send / %u recv SGEs, %u bytes inline",
             ia.cap.max_send_sge, ia.cap.max_recv_sge, ia.cap.max_inline_data);
    c->me.qpn[i] = q->qp->qp_num;
    /* QP 0 starts just below the 24-bit wrap, so multi-packet messages cross it. */
    c->me.psn[i] = i == 0 ? (c->is_client ? 0xFFFFF8u : 0xFFFFFDu)
                          : ((uint32_t)getpid() * 7919u + (uint32_t)i * 104729u) & 0xFFFFFFu;
}

static void connect_qp(struct ctx *c, int i, uint8_t rd_atomic)
{
    struct ibv_qp *qp = c->q[i].qp;
    struct ibv_qp_attr a;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                        IBV_ACCESS_REMOTE_ATOMIC;
    int r = ibv_modify_qp(qp, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                              IBV_QP_ACCESS_FLAGS);
    if (r)
        fail("modify QP %d to INIT: %s", i, strerror(r));

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = c->mtu;
    a.dest_qp_num = c->peer.qpn[i];
    a.rq_psn = c->peer.psn[i];
    a.max_dest_rd_atomic = rd_atomic;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, c->peer.gid, 16);
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.port_num = 1;
    r = ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (r)
        fail("modify QP %d to RTR: %s", i, strerror(r));

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = c->me.psn[i];
    a.max_rd_atomic = rd_atomic;
    r = ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (r)
        fail("modify QP %d to RTS: %s", i, strerror(r));
    if (qp_state(qp) != IBV_QPS_RTS)
        fail("QP %d is not in RTS after the transitions", i);
}

static void setup(struct ctx *c)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n < 1)
        fail("ibv_get_device_list: no device (%s)", strerror(errno));
    c->dev = ibv_open_device(list[0]);
    if (!c->dev)
        fail("ibv_open_device(%s): %s", ibv_get_device_name(list[0]), strerror(errno));
    ibv_free_device_list(list);

    struct ibv_device_attr da;
    if (ibv_query_device(c->dev, &da))
        fail("ibv_query_device failed");
    if (da.atomic_cap == IBV_ATOMIC_NONE)
        fail("the device reports no atomic support");
    if (da.max_qp_rd_atom < 1 || da.max_qp_init_rd_atom < 1)
        fail("the device allows no outstanding READ/atomic");

    struct ibv_port_attr pa;
    if (ibv_query_port(c->dev, 1, &pa))
        fail("ibv_query_port failed");
    if (pa.state != IBV_PORT_ACTIVE)
        fail("port 1 is not active (%d)", pa.state);
    c->me.mtu = pa.active_mtu;

    union ibv_gid gid;
    if (ibv_query_gid(c->dev, 1, 0, &gid))
        fail("ibv_query_gid failed");
    memcpy(c->me.gid, gid.raw, 16);

    c->pd = ibv_alloc_pd(c->dev);
    if (!c->pd)
        fail("ibv_alloc_pd: %s", strerror(errno));
    if (posix_memalign((void **)&c->buf, 4096, MAIN_MR_LEN + SLACK) ||
        posix_memalign((void **)&c->aux, 4096, AUX_LEN))
        fail("out of memory");
    memset(c->buf, SENTINEL, MAIN_MR_LEN + SLACK);
    memset(c->aux, SENTINEL, AUX_LEN);
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                 IBV_ACCESS_REMOTE_ATOMIC;
    c->mr = ibv_reg_mr(c->pd, c->buf, MAIN_MR_LEN, access);
    c->aux_mr = ibv_reg_mr(c->pd, c->aux, AUX_LEN, access);
    if (!c->mr || !c->aux_mr)
        fail("ibv_reg_mr: %s", strerror(errno));
    c->me.rkey = c->mr->rkey;
    c->me.aux_rkey = c->aux_mr->rkey;
    c->me.addr = (uintptr_t)c->buf;
    c->me.aux_addr = (uintptr_t)c->aux;
    c->me.magic = WIRE_MAGIC;

    for (int i = 0; i < NQP; i++)
        create_qp_set(c, i);

    write_full(c->sock, &c->me, sizeof(c->me));
    read_full(c->sock, &c->peer, sizeof(c->peer));
    if (c->peer.magic != WIRE_MAGIC)
        fail("peer sent a malformed connection record");
    c->mtu = c->me.mtu < c->peer.mtu ? c->me.mtu : (enum ibv_mtu)c->peer.mtu;
    c->mtu_bytes = mtu_bytes(c->mtu);

    uint8_t rd = da.max_qp_rd_atom < 4 ? (uint8_t)da.max_qp_rd_atom : 4;
    if (da.max_qp_init_rd_atom < rd)
        rd = (uint8_t)da.max_qp_init_rd_atom;
    for (int i = 0; i < NQP; i++)
        connect_qp(c, i, rd);
    printf("connected: %d QPs, MTU %u, main QPN 0x%06x PSN 0x%06x, peer QPN 0x%06x "
           "PSN 0x%06x, outstanding READ/atomic %u\n",
           NQP, c->mtu_bytes, c->me.qpn[0], c->me.psn[0], c->peer.qpn[0], c->peer.psn[0],
           rd);
    barrier(c, "connected");
}

static void teardown(struct ctx *c)
{
    for (int i = 0; i < NQP; i++) {
        int r = ibv_destroy_qp(c->q[i].qp);
        if (r)
            fail("ibv_destroy_qp(%d): %s", i, strerror(r));
        if ((r = ibv_destroy_cq(c->q[i].scq)) || (r = ibv_destroy_cq(c->q[i].rcq)))
            fail("ibv_destroy_cq(%d): %s", i, strerror(r));
    }
    if (ibv_dereg_mr(c->mr) || ibv_dereg_mr(c->aux_mr))
        fail("ibv_dereg_mr failed");
    if (ibv_dealloc_pd(c->pd))
        fail("ibv_dealloc_pd failed");
    if (ibv_close_device(c->dev))
        fail("ibv_close_device failed");
    check_untouched("unregistered memory after the region", c->buf + MAIN_MR_LEN, SLACK);
    free(c->buf);
    free(c->aux);
}

/* ---- data checks ------------------------------------------------------------------ */

/* The current round of the data checks (part of every pattern seed). */
static uint32_t round_no;

/* Seeds: one per round, direction and step, known to both processes. */
static uint32_t seed_of(int dir, int step)
{
    return round_no << 20 | (uint32_t)dir << 16 | (uint32_t)step;
}

/* send_case options. */
#define OPT_IMM 1u    /* SEND_WITH_IMM */
#define OPT_INLINE 2u /* IBV_SEND_INLINE */

/* One SEND (optionally WITH_IMM and/or INLINE) of the stream over the sender's segments into the
 * receiver's segments; the receiver verifies. */
static void send_case(struct ctx *c, bool req, int dir, int step, const char *name,
                      struct ibv_mr **smr, struct seg *ss, int ns, struct ibv_mr **rmr,
                      struct seg *rs, int nr, unsigned opts)
{
    struct qp_set *q = &c->q[0];
    uint32_t seed = seed_of(dir, step);
    const bool with_imm = opts & OPT_IMM;
    uint32_t total = 0;
    for (int i = 0; i < ns; i++)
        total += ss[i].len;
    const uint32_t imm =
        0xA5000000u | (round_no & 0xFF) << 16 | (uint32_t)step << 8 | (uint32_t)dir;

    if (!req) {
        struct ibv_sge sg[4];
        for (int i = 0; i < nr; i++) {
            memset(rs[i].p, SENTINEL, rs[i].len);
            sg[i] = sge_of(rmr[i], rs[i].p, rs[i].len);
        }
        post_recv(q->qp, 1000 + step, sg, nr, name);
    }
    barrier(c, name);
    if (req) {
        struct ibv_sge sg[4];
        fill_stream(seed, ss, ns);
        for (int i = 0; i < ns; i++)
            sg[i] = sge_of(smr[i], ss[i].p, ss[i].len);
        struct ibv_send_wr wr;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = 2000 + step;
        wr.sg_list = ns ? sg : NULL;
        wr.num_sge = ns;
        wr.opcode = with_imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED | (opts & OPT_INLINE ? IBV_SEND_INLINE : 0);
        wr.imm_data = htonl(imm);
        post_send(q->qp, &wr, name);
        if (opts & OPT_INLINE)
            /* The verbs contract: inline data is copied by the post. */
            for (int i = 0; i < ns; i++)
                memset(ss[i].p, 0, ss[i].len);
        struct ibv_wc wc;
        poll_n(q->scq, &wc, 1, name);
        expect_ok(&wc, 2000 + step, IBV_WC_SEND, q->qp, name);
    } else {
        struct ibv_wc wc;
        poll_n(q->rcq, &wc, 1, name);
        expect_ok(&wc, 1000 + step, IBV_WC_RECV, q->qp, name);
        if (wc.byte_len != total)
            fail("%s: byte_len %u, sent %u", name, wc.byte_len, total);
        if (with_imm) {
            if (!(wc.wc_flags & IBV_WC_WITH_IMM))
                fail("%s: IBV_WC_WITH_IMM not set (wc_flags 0x%x)", name, wc.wc_flags);
            if (ntohl(wc.imm_data) != imm)
                fail("%s: imm_data 0x%08x (host order), sent 0x%08x", name,
                     ntohl(wc.imm_data), imm);
        } else if (wc.wc_flags & IBV_WC_WITH_IMM) {
            fail("%s: IBV_WC_WITH_IMM set on a plain SEND", name);
        }
        check_stream(name, seed, rs, nr, total);
        pass(c, name);
    }
    barrier(c, name);
}

static void check_sends(struct ctx *c, bool req, int dir)
{
    uint8_t *src = c->buf + OFF_SEND_SRC, *rcv = c->buf + OFF_RECV;
    struct ibv_mr *m1[1] = {c->mr};
    struct {
        const char *name;
        uint32_t len;
    } sizes[] = {
        {"send_0B", 0},
        {"send_1B", 1},
        {"send_mtu", c->mtu_bytes},
        {"send_mtu_plus_1", c->mtu_bytes + 1},
        {"send_10000B", 10000},
    };
    int step = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++, step++) {
        struct seg ss = {src, sizes[i].len};
        struct seg rs = {rcv, REGION};
        send_case(c, req, dir, step, sizes[i].name, m1, &ss, sizes[i].len ? 1 : 0, m1, &rs,
                  1, 0);
    }

    /* Gather from three SGEs over two MRs, scatter into two SGEs over two MRs; the
     * boundaries fall inside packets. */
    struct ibv_mr *sm[3] = {c->mr, c->aux_mr, c->mr};
    struct seg ss[3] = {{src, 100}, {c->aux + AUX_SEND, 1500}, {src + 8000, 3000}};
    struct ibv_mr *rm[2] = {c->mr, c->aux_mr};
    struct seg rs[2] = {{rcv, 2500}, {c->aux + AUX_RECV, 3000}};
    send_case(c, req, dir, step++, "send_multi_sge", sm, ss, 3, rm, rs, 2, 0);

    struct seg s1 = {src, 300}, r1 = {rcv, REGION};
    send_case(c, req, dir, step++, "send_with_imm", m1, &s1, 1, m1, &r1, 1, OPT_IMM);

    /* Inline, gathered from two MRs. */
    struct ibv_mr *im[2] = {c->mr, c->aux_mr};
    struct seg is[2] = {{src + 500, 77}, {c->aux + AUX_SEND + 100, INLINE_LEN - 77}};
    send_case(c, req, dir, step++, "send_inline", im, is, 2, m1, &r1, 1, OPT_INLINE);
}

static void check_writes(struct ctx *c, bool req, int dir)
{
    struct qp_set *q = &c->q[0];
    uint8_t *dst = c->buf + OFF_WRITE_DST;
    uint64_t rdst = c->peer.addr + OFF_WRITE_DST;
    uint32_t s_small = seed_of(dir, 20), s_big = seed_of(dir, 21), s_multi = seed_of(dir, 22);

    /* An unsignaled small WRITE at an odd offset, a signaled multi-packet WRITE, and a
     * signaled WRITE gathering from two MRs, in one chain. */
    if (!req)
        memset(dst, SENTINEL, REGION);
    barrier(c, "write");
    if (req) {
        uint8_t *src = c->buf + OFF_SEND_SRC;
        struct seg a = {src, 13}, b = {src + 64, 10000};
        struct seg m[2] = {{src + 10240, 700}, {c->aux + AUX_SEND, 900}};
        fill_stream(s_small, &a, 1);
        fill_stream(s_big, &b, 1);
        fill_stream(s_multi, m, 2);
        struct ibv_sge sa = sge_of(c->mr, a.p, a.len), sb = sge_of(c->mr, b.p, b.len);
        struct ibv_sge sm[2] = {sge_of(c->mr, m[0].p, m[0].len),
                                sge_of(c->aux_mr, m[1].p, m[1].len)};
        struct ibv_send_wr w[3];
        memset(w, 0, sizeof(w));
        w[0].wr_id = 3000;
        w[0].sg_list = &sa;
        w[0].num_sge = 1;
        w[0].opcode = IBV_WR_RDMA_WRITE;
        w[0].wr.rdma.remote_addr = rdst + 3;
        w[0].wr.rdma.rkey = c->peer.rkey;
        w[0].next = &w[1];
        w[1].wr_id = 3001;
        w[1].sg_list = &sb;
        w[1].num_sge = 1;
        w[1].opcode = IBV_WR_RDMA_WRITE;
        w[1].send_flags = IBV_SEND_SIGNALED;
        w[1].wr.rdma.remote_addr = rdst + 1024;
        w[1].wr.rdma.rkey = c->peer.rkey;
        w[1].next = &w[2];
        w[2].wr_id = 3002;
        w[2].sg_list = sm;
        w[2].num_sge = 2;
        w[2].opcode = IBV_WR_RDMA_WRITE;
        w[2].send_flags = IBV_SEND_SIGNALED;
        w[2].wr.rdma.remote_addr = rdst + 12000;
        w[2].wr.rdma.rkey = c->peer.rkey;
        post_send(q->qp, w, "write");
        struct ibv_wc wc[2];
        poll_n(q->scq, wc, 2, "write");
        expect_ok(&wc[0], 3001, IBV_WC_RDMA_WRITE, q->qp, "write (10000 B)");
        expect_ok(&wc[1], 3002, IBV_WC_RDMA_WRITE, q->qp, "write (multi-SGE)");
        expect_quiet(q->scq, "unsignaled write");
        pass(c, "write_unsignaled_no_completion");
    }
    barrier(c, "write done");
    if (!req) {
        struct seg a = {dst + 3, 13}, b = {dst + 1024, 10000}, m = {dst + 12000, 1600};
        check_untouched("write: before the small write", dst, 3);
        check_stream("write_13B_unaligned", s_small, &a, 1, 13);
        pass(c, "write_13B_unaligned");
        check_untouched("write: between", dst + 16, 1024 - 16);
        check_stream("write_10000B", s_big, &b, 1, 10000);
        pass(c, "write_10000B");
        check_untouched("write: between", dst + 11024, 12000 - 11024);
        check_stream("write_multi_sge", s_multi, &m, 1, 1600);
        check_untouched("write: after", dst + 13600, REGION - 13600);
        pass(c, "write_multi_sge");
    }

    /* In one chain: an unsignaled inline WRITE (its source overwritten right after the
     * post), a WRITE_WITH_IMM of 5000 bytes and a zero-length WRITE_WITH_IMM. Each
     * WRITE_WITH_IMM consumes a receive and places nothing in its buffer; in-order
     * delivery means the first receive completion finds the inline WRITE's bytes too. */
    const uint32_t imm = 0xC0DE0000u | (round_no & 0xFF) << 8 | (uint32_t)dir;
    const uint32_t imm0 = 0x0E000000u | (round_no & 0xFF) << 8 | (uint32_t)dir;
    uint32_t s_imm = seed_of(dir, 23), s_inl = seed_of(dir, 24);
    uint8_t *rcv = c->buf + OFF_RECV;
    if (!req) {
        memset(dst, SENTINEL, REGION);
        memset(rcv, SENTINEL, REGION);
        struct ibv_sge sg0 = sge_of(c->mr, rcv, 64), sg1 = sge_of(c->mr, rcv + 64, 64);
        post_recv(q->qp, 3100, &sg0, 1, "write_with_imm");
        post_recv(q->qp, 3102, &sg1, 1, "write_with_imm");
    }
    barrier(c, "write_with_imm");
    if (req) {
        struct seg a = {c->buf + OFF_SEND_SRC, 5000};
        struct seg inl = {c->buf + OFF_SEND_SRC + 8192, INLINE_LEN};
        fill_stream(s_imm, &a, 1);
        fill_stream(s_inl, &inl, 1);
        struct ibv_sge sg = sge_of(c->mr, a.p, a.len), sgi = sge_of(c->mr, inl.p, inl.len);
        struct ibv_send_wr w[3];
        memset(w, 0, sizeof(w));
        w[0].wr_id = 3103;
        w[0].sg_list = &sgi;
        w[0].num_sge = 1;
        w[0].opcode = IBV_WR_RDMA_WRITE;
        w[0].send_flags = IBV_SEND_INLINE;
        w[0].wr.rdma.remote_addr = rdst + 6000;
        w[0].wr.rdma.rkey = c->peer.rkey;
        w[0].next = &w[1];
        w[1].wr_id = 3101;
        w[1].sg_list = &sg;
        w[1].num_sge = 1;
        w[1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w[1].send_flags = IBV_SEND_SIGNALED;
        w[1].imm_data = htonl(imm);
        w[1].wr.rdma.remote_addr = rdst + 100;
        w[1].wr.rdma.rkey = c->peer.rkey;
        w[1].next = &w[2];
        w[2].wr_id = 3104;
        w[2].sg_list = NULL;
        w[2].num_sge = 0;
        w[2].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w[2].send_flags = IBV_SEND_SIGNALED;
        w[2].imm_data = htonl(imm0);
        w[2].wr.rdma.remote_addr = rdst + 10000;
        w[2].wr.rdma.rkey = c->peer.rkey;
        post_send(q->qp, w, "write_with_imm");
        /* The verbs contract: inline data is copied by the post. */
        memset(inl.p, 0, inl.len);
        struct ibv_wc wc[2];
        poll_n(q->scq, wc, 2, "write_with_imm");
        expect_ok(&wc[0], 3101, IBV_WC_RDMA_WRITE, q->qp, "write_with_imm");
        expect_ok(&wc[1], 3104, IBV_WC_RDMA_WRITE, q->qp, "write_with_imm (0 bytes)");
        expect_quiet(q->scq, "unsignaled inline write");
    } else {
        struct ibv_wc wc[2];
        poll_n(q->rcq, wc, 2, "write_with_imm");
        expect_ok(&wc[0], 3100, IBV_WC_RECV_RDMA_WITH_IMM, q->qp, "write_with_imm");
        expect_ok(&wc[1], 3102, IBV_WC_RECV_RDMA_WITH_IMM, q->qp, "write_with_imm_0B");
        if (!(wc[0].wc_flags & IBV_WC_WITH_IMM) || !(wc[1].wc_flags & IBV_WC_WITH_IMM))
            fail("write_with_imm: IBV_WC_WITH_IMM not set (wc_flags 0x%x, 0x%x)",
                 wc[0].wc_flags, wc[1].wc_flags);
        if (ntohl(wc[0].imm_data) != imm)
            fail("write_with_imm: imm_data 0x%08x, sent 0x%08x", ntohl(wc[0].imm_data), imm);
        if (ntohl(wc[1].imm_data) != imm0)
            fail("write_with_imm_0B: imm_data 0x%08x, sent 0x%08x", ntohl(wc[1].imm_data),
                 imm0);
        if (wc[0].byte_len != 5000)
            fail("write_with_imm: byte_len %u, expected the RDMA length 5000",
                 wc[0].byte_len);
        if (wc[1].byte_len != 0)
            fail("write_with_imm_0B: byte_len %u, expected 0", wc[1].byte_len);
        struct seg a = {dst + 100, 5000}, inl = {dst + 6000, INLINE_LEN};
        check_untouched("write_with_imm: before", dst, 100);
        check_stream("write_with_imm", s_imm, &a, 1, 5000);
        check_untouched("write_with_imm: after", dst + 5100, 6000 - 5100);
        check_untouched("write_with_imm: the receive buffers", rcv, REGION);
        pass(c, "write_with_imm");
        check_stream("write_inline", s_inl, &inl, 1, INLINE_LEN);
        check_untouched("write_inline: after", dst + 6000 + INLINE_LEN,
                        REGION - 6000 - INLINE_LEN);
        pass(c, "write_inline");
        pass(c, "write_with_imm_0B");
    }
    barrier(c, "write_with_imm done");
}

static void check_reads(struct ctx *c, bool req, int dir)
{
    struct qp_set *q = &c->q[0];
    uint32_t seed = seed_of(dir, 30);
    if (!req) {
        struct seg s = {c->buf + OFF_READ_SRC, REGION};
        fill_stream(seed, &s, 1);
    }
    barrier(c, "read");
    if (req) {
        uint8_t *dst = c->buf + OFF_READ_DST;
        memset(dst, SENTINEL, REGION);
        memset(c->aux + AUX_READ, SENTINEL, 4096);
        uint64_t rsrc = c->peer.addr + OFF_READ_SRC;
        /* 10000 bytes from offset 7, 1 byte (the last of the peer's area), 3000 bytes
         * from offset 11000 scattered over two MRs. */
        struct ibv_sge s0 = sge_of(c->mr, dst, 10000);
        struct ibv_sge s1 = sge_of(c->mr, dst + 12288, 1);
        struct ibv_sge s2[2] = {sge_of(c->mr, dst + 10240, 1000),
                                sge_of(c->aux_mr, c->aux + AUX_READ, 2000)};
        struct ibv_send_wr w[3];
        memset(w, 0, sizeof(w));
        for (int i = 0; i < 3; i++) {
            w[i].wr_id = 4000 + i;
            w[i].opcode = IBV_WR_RDMA_READ;
            w[i].send_flags = IBV_SEND_SIGNALED;
            w[i].wr.rdma.rkey = c->peer.rkey;
            w[i].next = i < 2 ? &w[i + 1] : NULL;
        }
        w[0].sg_list = &s0;
        w[0].num_sge = 1;
        w[0].wr.rdma.remote_addr = rsrc + 7;
        w[1].sg_list = &s1;
        w[1].num_sge = 1;
        w[1].wr.rdma.remote_addr = rsrc + REGION - 1;
        w[2].sg_list = s2;
        w[2].num_sge = 2;
        w[2].wr.rdma.remote_addr = rsrc + 11000;
        post_send(q->qp, w, "read");
        struct ibv_wc wc[3];
        poll_n(q->scq, wc, 3, "read");
        for (int i = 0; i < 3; i++)
            expect_ok(&wc[i], 4000 + i, IBV_WC_RDMA_READ, q->qp, "read");
        for (uint32_t i = 0; i < 10000; i++)
            if (dst[i] != pat(seed, 7 + i))
                fail("read_10000B: byte %u is 0x%02x, want 0x%02x", i, dst[i],
                     pat(seed, 7 + i));
        check_untouched("read_10000B: after", dst + 10000, 240);
        pass(c, "read_10000B");
        if (dst[12288] != pat(seed, REGION - 1))
            fail("read_1B: got 0x%02x, want 0x%02x", dst[12288], pat(seed, REGION - 1));
        check_untouched("read_1B: after", dst + 12289, REGION - 12289);
        pass(c, "read_1B");
        for (uint32_t i = 0; i < 3000; i++) {
            uint8_t got = i < 1000 ? dst[10240 + i] : c->aux[AUX_READ + i - 1000];
            if (got != pat(seed, 11000 + i))
                fail("read_multi_sge: byte %u is 0x%02x, want 0x%02x", i, got,
                     pat(seed, 11000 + i));
        }
        check_untouched("read_multi_sge: between", dst + 11240, 12288 - 11240);
        check_untouched("read_multi_sge: after", c->aux + AUX_READ + 2000, 4096 - 2000);
        pass(c, "read_multi_sge");
    }
    barrier(c, "read done");
}

static void check_atomics(struct ctx *c, bool req, int dir)
{
    struct qp_set *q = &c->q[0];
    /* Original peer words (the high half differs per direction). */
    const uint64_t d = (uint64_t)dir << 60 | (uint64_t)(round_no & 0xFFF) << 40;
    const uint64_t orig[5] = {
        0x0102030405060708ull ^ d, /* fetch_add 0x10 */
        0x00000000FFFFFFFFull,     /* fetch_add 1: carry into the high half */
        0x1122334455667788ull ^ d, /* cmp_swp, compare matches */
        0x8877665544332211ull ^ d, /* cmp_swp, compare does not match */
        100,                       /* fetch_add 1, twice */
    };
    const uint64_t swap_val = 0xCAFEBABEDEADBEEFull;
    volatile uint64_t *words = (volatile uint64_t *)(c->buf + OFF_ATOM);
    volatile uint64_t *res = (volatile uint64_t *)(c->buf + OFF_ATOM_RES);

    if (!req)
        for (int i = 0; i < 5; i++)
            words[i] = orig[i];
    barrier(c, "atomics");
    if (req) {
        for (int i = 0; i < 6; i++)
            res[i] = SENTINEL64;
        uint64_t raddr = c->peer.addr + OFF_ATOM;
        struct ibv_sge sg[6];
        struct ibv_send_wr w[6];
        memset(w, 0, sizeof(w));
        /* word index, opcode, compare_add, swap for each WR */
        const int word[6] = {0, 1, 2, 3, 4, 4};
        for (int i = 0; i < 6; i++) {
            sg[i] = sge_of(c->mr, (void *)&res[i], 8);
            w[i].wr_id = 5000 + i;
            w[i].sg_list = &sg[i];
            w[i].num_sge = 1;
            w[i].send_flags = IBV_SEND_SIGNALED;
            w[i].wr.atomic.remote_addr = raddr + 8 * (uint64_t)word[i];
            w[i].wr.atomic.rkey = c->peer.rkey;
            w[i].next = i < 5 ? &w[i + 1] : NULL;
        }
        w[0].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        w[0].wr.atomic.compare_add = 0x10;
        w[1].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        w[1].wr.atomic.compare_add = 1;
        w[2].opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        w[2].wr.atomic.compare_add = orig[2];
        w[2].wr.atomic.swap = swap_val;
        w[3].opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        w[3].wr.atomic.compare_add = orig[3] ^ 1;
        w[3].wr.atomic.swap = swap_val;
        w[4].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        w[4].wr.atomic.compare_add = 1;
        w[5].opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        w[5].wr.atomic.compare_add = 1;
        post_send(q->qp, w, "atomics");
        struct ibv_wc wc[6];
        poll_n(q->scq, wc, 6, "atomics");
        const enum ibv_wc_opcode op[6] = {IBV_WC_FETCH_ADD, IBV_WC_FETCH_ADD,
                                          IBV_WC_COMP_SWAP, IBV_WC_COMP_SWAP,
                                          IBV_WC_FETCH_ADD, IBV_WC_FETCH_ADD};
        for (int i = 0; i < 6; i++)
            expect_ok(&wc[i], 5000 + i, op[i], q->qp, "atomics");
        const uint64_t want[6] = {orig[0], orig[1], orig[2], orig[3], 100, 101};
        const char *what[6] = {"fetch_add", "fetch_add with carry", "cmp_swp (match)",
                               "cmp_swp (no match)", "first fetch_add", "second fetch_add"};
        for (int i = 0; i < 6; i++)
            if (res[i] != want[i])
                fail("%s returned 0x%016llx, the original value was 0x%016llx", what[i],
                     (unsigned long long)res[i], (unsigned long long)want[i]);
        for (int i = 6; i < 32; i++)
            if (res[i] != SENTINEL64)
                fail("atomics: result word %d beyond the results was changed", i);
        pass(c, "atomic_fetch_add_returns_original");
        pass(c, "atomic_cmp_swp_returns_original");
    }
    barrier(c, "atomics done");
    if (!req) {
        const uint64_t want[5] = {orig[0] + 0x10, 0x0000000100000000ull, swap_val, orig[3],
                                  102};
        const char *what[5] = {"fetch_add", "fetch_add with carry", "cmp_swp (match)",
                               "cmp_swp (no match)", "two fetch_adds"};
        for (int i = 0; i < 5; i++)
            if (words[i] != want[i])
                fail("atomic peer memory after %s: 0x%016llx, expected 0x%016llx", what[i],
                     (unsigned long long)words[i], (unsigned long long)want[i]);
        for (int i = 5; i < 32; i++)
            if (words[i] != SENTINEL64)
                fail("atomics: peer word %d next to the targets was changed", i);
        pass(c, "atomic_fetch_add_peer_memory");
        pass(c, "atomic_cmp_swp_peer_memory");
    }
    barrier(c, "atomics checked");
}

/* ---- error checks ----------------------------------------------------------------- */

static void check_error_case(struct ctx *c, bool req, int dir, enum err_case ec)
{
    struct qp_set *q = &c->q[1 + dir * NUM_ERR_CASES + ec];
    const char *name = err_name[ec];
    char tag[64];
    /* A key matching neither of the peer's regions. */
    uint32_t bad_rkey = c->peer.rkey ^ 0x5Au;
    if (bad_rkey == c->peer.aux_rkey || bad_rkey == c->peer.rkey)
        fail("%s: cannot make a wrong key", name);
    /* NAK Remote Access Error, except for the receive overflow: NAK Invalid Request. */
    const enum ibv_wc_status want =
        ec == ERR_SEND_TOO_LONG ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_ACCESS_ERR;

    uint8_t *wdst = c->buf + OFF_WRITE_DST, *tail = c->buf + OFF_TAIL;
    uint8_t *rcv = c->buf + OFF_RECV;
    volatile uint64_t *word = (volatile uint64_t *)(c->buf + OFF_ATOM + 8 * 16);
    volatile uint64_t *res = (volatile uint64_t *)(c->buf + OFF_ATOM_RES + 8 * 16);
    const uint64_t word_val = 0x0BADC0DE00000000ull | (uint64_t)dir;

    if (!req) {
        memset(wdst, SENTINEL, REGION);
        memset(rcv, SENTINEL, REGION);
        memset(tail, SENTINEL, MAIN_MR_LEN - OFF_TAIL);
        *word = word_val;
        struct ibv_sge s0 = sge_of(c->mr, rcv, 256), s1 = sge_of(c->mr, rcv + 256, 256);
        post_recv(q->qp, 6000, &s0, 1, name);
        post_recv(q->qp, 6001, &s1, 1, name);
    }
    snprintf(tag, sizeof(tag), "%s", name);
    barrier(c, tag);

    if (req) {
        uint8_t *src = c->buf + OFF_SEND_SRC;
        uint8_t *rdst = c->buf + OFF_READ_DST;
        memset(rdst, SENTINEL, 256);
        *res = SENTINEL64;
        struct ibv_sge sg = sge_of(c->mr, src, 64);
        struct ibv_sge sg_read = sge_of(c->mr, rdst, 64);
        struct ibv_sge sg_atomic = sge_of(c->mr, (void *)res, 8);
        struct ibv_sge sg_range = sge_of(c->mr, src, 200);
        struct ibv_sge sg_long = sge_of(c->mr, src, 2000);
        struct ibv_send_wr w[3];
        memset(w, 0, sizeof(w));
        /* A valid WRITE first (beyond the 8 KiB the responder checks): it succeeds. */
        w[0].wr_id = 6999;
        w[0].sg_list = &sg;
        w[0].num_sge = 1;
        w[0].opcode = IBV_WR_RDMA_WRITE;
        w[0].send_flags = IBV_SEND_SIGNALED;
        w[0].wr.rdma.remote_addr = c->peer.addr + OFF_WRITE_DST + 12288;
        w[0].wr.rdma.rkey = c->peer.rkey;
        w[0].next = &w[1];
        /* The faulty WR, unsignaled: its error completion must appear all the same. */
        struct ibv_send_wr *e = &w[1];
        e->wr_id = 7000;
        e->num_sge = 1;
        e->next = &w[2];
        switch (ec) {
        case ERR_WRITE_BAD_RKEY:
            e->opcode = IBV_WR_RDMA_WRITE;
            e->sg_list = &sg;
            e->wr.rdma.remote_addr = c->peer.addr + OFF_WRITE_DST;
            e->wr.rdma.rkey = bad_rkey;
            break;
        case ERR_WRITE_IMM_BAD_RKEY:
            e->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            e->imm_data = htonl(0x0BAD0BADu);
            e->sg_list = &sg;
            e->wr.rdma.remote_addr = c->peer.addr + OFF_WRITE_DST;
            e->wr.rdma.rkey = bad_rkey;
            break;
        case ERR_READ_BAD_RKEY:
            e->opcode = IBV_WR_RDMA_READ;
            e->sg_list = &sg_read;
            e->wr.rdma.remote_addr = c->peer.addr + OFF_READ_SRC;
            e->wr.rdma.rkey = bad_rkey;
            break;
        case ERR_ATOMIC_BAD_RKEY:
            e->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
            e->sg_list = &sg_atomic;
            e->wr.atomic.remote_addr = c->peer.addr + OFF_ATOM + 8 * 16;
            e->wr.atomic.compare_add = 1;
            e->wr.atomic.rkey = bad_rkey;
            break;
        case ERR_WRITE_OUT_OF_RANGE:
            /* The right key, 200 bytes starting 100 bytes before the region's end. */
            e->opcode = IBV_WR_RDMA_WRITE;
            e->sg_list = &sg_range;
            e->wr.rdma.remote_addr = c->peer.addr + MAIN_MR_LEN - 100;
            e->wr.rdma.rkey = c->peer.rkey;
            break;
        case ERR_SEND_TOO_LONG:
            /* 2000 bytes (two packets) into a 256-byte receive. */
            e->opcode = IBV_WR_SEND;
            e->sg_list = &sg_long;
            break;
        default:
            fail("unknown error case");
        }
        /* A valid WRITE behind it (elsewhere in the peer's area): flushed. */
        w[2].wr_id = 7001;
        w[2].sg_list = &sg;
        w[2].num_sge = 1;
        w[2].opcode = IBV_WR_RDMA_WRITE;
        w[2].send_flags = IBV_SEND_SIGNALED;
        w[2].wr.rdma.remote_addr = c->peer.addr + OFF_WRITE_DST + 8192;
        w[2].wr.rdma.rkey = c->peer.rkey;
        post_send(q->qp, w, name);

        struct ibv_wc wc[3];
        poll_n(q->scq, wc, 3, name);
        expect_ok(&wc[0], 6999, IBV_WC_RDMA_WRITE, q->qp, name);
        expect_status(&wc[1], 7000, want, q->qp, name);
        expect_status(&wc[2], 7001, IBV_WC_WR_FLUSH_ERR, q->qp, name);
        wait_state(q->qp, IBV_QPS_ERR, name);
        /* A WR posted in ERR is accepted and flushed. */
        struct ibv_send_wr w2;
        memset(&w2, 0, sizeof(w2));
        w2.wr_id = 7002;
        w2.sg_list = &sg;
        w2.num_sge = 1;
        w2.opcode = IBV_WR_SEND;
        w2.send_flags = IBV_SEND_SIGNALED;
        post_send(q->qp, &w2, name);
        poll_n(q->scq, wc, 1, name);
        expect_status(&wc[0], 7002, IBV_WC_WR_FLUSH_ERR, q->qp, name);
        expect_quiet(q->scq, name);
        if (ec == ERR_READ_BAD_RKEY)
            check_untouched("bad_rkey_read: the local READ buffer", rdst, 256);
        if (ec == ERR_ATOMIC_BAD_RKEY && *res != SENTINEL64)
            fail("bad_rkey_fetch_add: the local result word was written (0x%016llx)",
                 (unsigned long long)*res);
        snprintf(tag, sizeof(tag), "%s_requester", name);
        pass(c, tag);
    }
    snprintf(tag, sizeof(tag), "%s done", name);
    barrier(c, tag);

    if (!req) {
        wait_state(q->qp, IBV_QPS_ERR, name);
        struct ibv_wc wc[2];
        poll_n(q->rcq, wc, 2, name);
        /* A request that consumes a receive (WRITE_WITH_IMM, SEND) takes it before the
         * R_Key / length checks: that receive completes in error (R_Key: remote access
         * error; overflow: IBA's local length error, or invalid request as rxe reports
         * it); the other receives are flushed. */
        if (ec == ERR_SEND_TOO_LONG) {
            if (wc[0].status != IBV_WC_LOC_LEN_ERR && wc[0].status != IBV_WC_REM_INV_REQ_ERR)
                fail("%s: the overflowed receive completed with %s (%d)", name,
                     status_str(wc[0].status), wc[0].status);
            expect_status(&wc[0], 6000, wc[0].status, q->qp, name);
        } else {
            expect_status(&wc[0], 6000,
                          ec == ERR_WRITE_IMM_BAD_RKEY ? IBV_WC_REM_ACCESS_ERR
                                                       : IBV_WC_WR_FLUSH_ERR,
                          q->qp, name);
        }
        expect_status(&wc[1], 6001, IBV_WC_WR_FLUSH_ERR, q->qp, name);
        expect_quiet(q->rcq, name);
        check_untouched("the WRITE target (first 8 KiB)", wdst, 8192);
        check_untouched("the region's tail", tail, MAIN_MR_LEN - OFF_TAIL);
        /* The overflowed receive's own 256 bytes are undefined after the error; nothing
         * beyond them may change (the next receive's buffer included). */
        check_untouched("the memory after the first receive buffer", rcv + 256,
                        REGION - 256);
        if (*word != word_val)
            fail("%s: the atomic target word changed to 0x%016llx", name,
                 (unsigned long long)*word);
        *word = SENTINEL64;
        snprintf(tag, sizeof(tag), "%s_responder", name);
        pass(c, tag);
    }
    snprintf(tag, sizeof(tag), "%s checked", name);
    barrier(c, tag);
}

/* ---- main ------------------------------------------------------------------------- */

static void usage(const char *prog)
{
    fprintf(stderr, "usage: %s [-d] [-n ROUNDS] PORT [SERVER-IPV4]\n", prog);
    exit(2);
}

int main(int argc, char **argv)
{
    bool data_only = false;
    long rounds = 1;
    int opt;
    while ((opt = getopt(argc, argv, "dn:")) != -1) {
        switch (opt) {
        case 'd':
            data_only = true;
            break;
        case 'n':
            rounds = strtol(optarg, NULL, 10);
            if (rounds < 1 || rounds > 1000)
                usage(argv[0]);
            break;
        default:
            usage(argv[0]);
        }
    }
    int rest = argc - optind;
    if (rest != 1 && rest != 2)
        usage(argv[0]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    long port = strtol(argv[optind], NULL, 10);
    if (port <= 0 || port > 65535)
        usage(argv[0]);
    struct ctx c;
    memset(&c, 0, sizeof(c));
    c.is_client = rest == 2;
    role_name = c.is_client ? "client" : "server";
    c.sock = c.is_client ? tcp_client(argv[optind + 1], (uint16_t)port)
                         : tcp_server((uint16_t)port);

    setup(&c);
    for (long r = 0; r < rounds; r++) {
        round_no = (uint32_t)r;
        for (int dir = 0; dir < 2; dir++) {
            /* Direction 0: the client is the requester; direction 1: the server. */
            bool req = (dir == 0) == c.is_client;
            check_sends(&c, req, dir);
            check_writes(&c, req, dir);
            check_reads(&c, req, dir);
            check_atomics(&c, req, dir);
        }
    }
    if (!data_only)
        for (int dir = 0; dir < 2; dir++) {
            bool req = (dir == 0) == c.is_client;
            for (int ec = 0; ec < NUM_ERR_CASES; ec++)
                check_error_case(&c, req, dir, (enum err_case)ec);
        }
    if (qp_state(c.q[0].qp) != IBV_QPS_RTS)
        fail("the data QP left RTS");
    barrier(&c, "end");
    teardown(&c);
    close(c.sock);
    printf("ALL %d CHECKS PASSED\n", c.checks);
    return 0;
}
