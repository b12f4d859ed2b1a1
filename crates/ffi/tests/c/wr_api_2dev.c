/* The ibv_wr_* API between two processes, each with its own device (UROCE_ADDR), over
   loopback; the connection data travels over TCP 127.0.0.1:PORT.
     wr_api_2dev PORT          server: owns the target memory and a type 2 window
     wr_api_2dev PORT client   client: posts to it through ibv_wr_*
   - rc_all_opcodes (both sides): the client posts, in one ibv_wr_start .. ibv_wr_complete
     list, SEND (ibv_wr_set_sge), SEND with immediate (inline data), RDMA WRITE (SGE list),
     RDMA WRITE with immediate, RDMA READ, compare-and-swap, fetch-and-add and SEND with an
     inline data list; the server
     checks its receive completions, the bytes that landed and the atomics' new values, the
     client its send completions, the READ bytes and the atomics' old values;
   - mw_write (both): the server binds a type 2 window with ibv_wr_bind_mw; the client's
     RDMA WRITE through its key lands inside the window;
   - mw_after_local_inv (both): after the server's ibv_wr_local_inv, the client's WRITE
     with the key completes with IBV_WC_REM_ACCESS_ERR and the window is untouched.
   Prints "PASS <name>" per check; exits non-zero at the first failure. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define FAIL(...) do { fprintf(stderr, "FAIL %s: ", role); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

#define RC_OPS (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | \
		IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | \
		IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | \
		IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV)

static const char *role = "?";
static int sock = -1;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The byte at offset i of pattern `seed`. */
static char pat(int i, int seed)
{
	return (char)(i * 13 + seed * 7 + 1);
}

static void xfer(void *p, size_t n, int sending)
{
	char *c = p;
	while (n > 0) {
		ssize_t r = sending ? write(sock, c, n) : read(sock, c, n);
		if (r <= 0)
			FAIL("tcp %s: %s", sending ? "write" : "read", r == 0 ? "closed" : strerror(errno));
		c += r;
		n -= (size_t)r;
	}
}

static void put(const void *p, size_t n) { xfer((void *)p, n, 1); }
static void get(void *p, size_t n) { xfer(p, n, 0); }

static void set_timeouts(int fd)
{
	struct timeval tv = { 30, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int tcp_server(uint16_t port)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1))
		FAIL("listen on port %u: %s", port, strerror(errno));
	struct pollfd pfd = { .fd = l, .events = POLLIN };
	if (poll(&pfd, 1, 30000) != 1)
		FAIL("no client within 30 s");
	int s = accept(l, NULL, NULL);
	if (s < 0)
		FAIL("accept: %s", strerror(errno));
	close(l);
	set_timeouts(s);
	return s;
}

static int tcp_client(uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	double end = now() + 30;
	for (;;) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
			set_timeouts(s);
			return s;
		}
		if (s >= 0)
			close(s);
		if (now() > end)
			FAIL("cannot connect to port %u", port);
		usleep(20000);
	}
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

static void expect(struct ibv_wc wc, uint64_t wr_id, enum ibv_wc_status st, int opcode, const char *what)
{
	if (wc.wr_id != wr_id || wc.status != st || (opcode >= 0 && (int)wc.opcode != opcode))
		FAIL("%s: wr_id %llu status %s opcode %d (wanted %llu %s %d)", what,
		     (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), (int)wc.opcode,
		     (unsigned long long)wr_id, ibv_wc_status_str(st), opcode);
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	int rc = ibv_modify_qp(qp, a, mask);
	if (rc)
		FAIL("modify %s: %s", what, strerror(rc));
}

static void connect_rc(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *dgid)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 1;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 1;
	a.max_rd_atomic = 4;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC, "RTS");
}

static void post_recv(struct ibv_qp *qp, uint64_t wr_id, void *buf, uint32_t len, uint32_t lkey)
{
	struct ibv_sge s = { (uintptr_t)buf, len, lkey };
	struct ibv_recv_wr w, *bad;
	memset(&w, 0, sizeof w);
	w.wr_id = wr_id;
	w.sg_list = &s;
	w.num_sge = 1;
	if (ibv_post_recv(qp, &w, &bad))
		FAIL("post_recv");
}

/* What the two sides exchange. */
struct conn {
	uint32_t qpn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

struct window {
	uint32_t rkey;
	uint64_t addr;
};

static char buf[16384] __attribute__((aligned(64)));

/* Server layout of buf: receives at 0/256/512/768, WRITE target 1024, WRITE_IMM target
   2048, READ source 3072 (128 B), CAS word 4096, FAA word 4104, window 8192..9215. */
#define WIN 8192

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2 && !(argc == 3 && !strcmp(argv[2], "client")))
		FAIL("usage: %s PORT [client]", argv[0]);
	int client = argc == 3;
	role = client ? "client" : "server";
	uint16_t port = (uint16_t)atoi(argv[1]);
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		FAIL("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("open");
	struct conn me, peer;
	memset(&me, 0, sizeof me);
	if (ibv_query_gid(ctx, 1, 0, &me.gid))
		FAIL("gid");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof buf,
					    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
					    IBV_ACCESS_MW_BIND) : NULL;
	if (!pd || !cq || !mr)
		FAIL("pd/cq/mr");
	struct ibv_qp_init_attr_ex ia;
	memset(&ia, 0, sizeof ia);
	ia.qp_type = IBV_QPT_RC;
	ia.send_cq = ia.recv_cq = cq;
	ia.cap.max_send_wr = 16;
	ia.cap.max_recv_wr = 16;
	ia.cap.max_send_sge = 4;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = 64;
	ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ia.pd = pd;
	ia.send_ops_flags = RC_OPS;
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &ia);
	if (!qp)
		FAIL("create_qp_ex: %s", strerror(errno));
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
	if (!x)
		FAIL("qp_to_qp_ex");
	me.qpn = qp->qp_num;
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)buf;
	if (!client) {
		for (int i = 0; i < 128; i++)
			buf[3072 + i] = pat(i, 5);
		*(uint64_t *)(buf + 4096) = 7;
		*(uint64_t *)(buf + 4104) = 1000;
	}
	sock = client ? tcp_client(port) : tcp_server(port);
	put(&me, sizeof me);
	get(&peer, sizeof peer);
	connect_rc(qp, peer.qpn, &peer.gid);
	if (!client)
		for (int i = 0; i < 4; i++)
			post_recv(qp, 101 + i, buf + 256 * i, 256, mr->lkey);
	char sync = 0;
	put(&sync, 1); /* both sides in RTS */
	get(&sync, 1);
	int rc;

	if (!client) {
		/* Bind a window for the client, tell it the key. */
		struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		if (!mw)
			FAIL("alloc_mw");
		struct window w = { ibv_inc_rkey(mw->rkey), (uintptr_t)(buf + WIN) };
		struct ibv_mw_bind_info bi = { mr, (uintptr_t)(buf + WIN), 1024, IBV_ACCESS_REMOTE_WRITE };
		ibv_wr_start(x);
		x->wr_id = 60;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(x, mw, w.rkey, &bi);
		if ((rc = ibv_wr_complete(x)))
			FAIL("bind: %s", strerror(rc));
		expect(poll_one(cq, "bind"), 60, IBV_WC_SUCCESS, IBV_WC_BIND_MW, "bind");
		put(&w, sizeof w);
		/* The client's list arrives: four receives, then the data. */
		struct ibv_wc wc = poll_one(cq, "recv send");
		expect(wc, 101, IBV_WC_SUCCESS, IBV_WC_RECV, "recv send");
		for (int i = 0; i < 100; i++)
			if (wc.byte_len != 100 || buf[i] != pat(i, 1))
				FAIL("send: byte_len %u or byte %d differs", wc.byte_len, i);
		wc = poll_one(cq, "recv send_imm");
		expect(wc, 102, IBV_WC_SUCCESS, IBV_WC_RECV, "recv send_imm");
		if (wc.byte_len != 12 || be32toh(wc.imm_data) != 0x11223344 || memcmp(buf + 256, "inline hello", 12))
			FAIL("send_imm: byte_len %u imm %#x", wc.byte_len, be32toh(wc.imm_data));
		wc = poll_one(cq, "recv write_imm");
		expect(wc, 103, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, "recv write_imm");
		if (be32toh(wc.imm_data) != 0x55667788)
			FAIL("write_imm: imm %#x", be32toh(wc.imm_data));
		wc = poll_one(cq, "recv inline list");
		expect(wc, 104, IBV_WC_SUCCESS, IBV_WC_RECV, "recv inline list");
		if (wc.byte_len != 20 || memcmp(buf + 768, "gathered inline list", 20))
			FAIL("inline list: '%.20s'", buf + 768);
		for (int i = 0; i < 120; i++)
			if (buf[1024 + i] != pat(i, 2))
				FAIL("write with an SGE list: byte %d differs", i);
		for (int i = 0; i < 64; i++)
			if (buf[2048 + i] != pat(i, 3))
				FAIL("write_imm: byte %d differs", i);
		if (*(uint64_t *)(buf + 4096) != 99 || *(uint64_t *)(buf + 4104) != 1005)
			FAIL("atomics: %llu %llu", (unsigned long long)*(uint64_t *)(buf + 4096),
			     (unsigned long long)*(uint64_t *)(buf + 4104));
		printf("PASS rc_all_opcodes\n");
		get(&sync, 1); /* the client's WRITE through the window completed */
		for (int i = 0; i < 200; i++)
			if (buf[WIN + 10 + i] != pat(i, 4))
				FAIL("write through the window: byte %d differs", i);
		printf("PASS mw_write\n");
		ibv_wr_start(x);
		x->wr_id = 61;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(x, w.rkey);
		if ((rc = ibv_wr_complete(x)))
			FAIL("local_inv: %s", strerror(rc));
		expect(poll_one(cq, "local_inv"), 61, IBV_WC_SUCCESS, IBV_WC_LOCAL_INV, "local_inv");
		char before[1024];
		memcpy(before, buf + WIN, sizeof before);
		put(&sync, 1);
		get(&sync, 1); /* the client's WRITE after the invalidation failed */
		if (memcmp(before, buf + WIN, sizeof before))
			FAIL("a write after LOCAL_INV changed the window");
		printf("PASS mw_after_local_inv\n");
		if (ibv_dealloc_mw(mw))
			FAIL("dealloc_mw");
	} else {
		struct window w;
		get(&w, sizeof w);
		for (int i = 0; i < 1024; i++)
			buf[i] = pat(i, 1);
		for (int i = 0; i < 120; i++)
			buf[1024 + i] = pat(i, 2);
		for (int i = 0; i < 64; i++)
			buf[2048 + i] = pat(i, 3);
		static char part1[] = "gathered ", part2[] = "inline list";
		struct ibv_data_buf bufs[2] = { { part1, 9 }, { part2, 11 } };
		struct ibv_sge two[2] = { { (uintptr_t)(buf + 1024), 50, mr->lkey },
					  { (uintptr_t)(buf + 1074), 70, mr->lkey } };
		uint32_t rk = peer.rkey;
		uint64_t ra = peer.addr;
		ibv_wr_start(x);
		x->wr_flags = IBV_SEND_SIGNALED;
		x->wr_id = 1;
		ibv_wr_send(x);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 100);
		x->wr_id = 2;
		ibv_wr_send_imm(x, htobe32(0x11223344));
		ibv_wr_set_inline_data(x, (void *)"inline hello", 12);
		x->wr_id = 3;
		ibv_wr_rdma_write(x, rk, ra + 1024);
		ibv_wr_set_sge_list(x, 2, two);
		x->wr_id = 4;
		ibv_wr_rdma_write_imm(x, rk, ra + 2048, htobe32(0x55667788));
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)(buf + 2048), 64);
		x->wr_id = 5;
		ibv_wr_rdma_read(x, rk, ra + 3072);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)(buf + 8192), 128);
		x->wr_id = 6;
		ibv_wr_atomic_cmp_swp(x, rk, ra + 4096, 7, 99);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)(buf + 9000), 8);
		x->wr_id = 7;
		ibv_wr_atomic_fetch_add(x, rk, ra + 4104, 5);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)(buf + 9008), 8);
		x->wr_id = 8;
		ibv_wr_send(x);
		ibv_wr_set_inline_data_list(x, 2, bufs);
		if ((rc = ibv_wr_complete(x)))
			FAIL("ibv_wr_complete: %s", strerror(rc));
		static const int want[] = { IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE,
					    IBV_WC_RDMA_READ, IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD, IBV_WC_SEND };
		for (int i = 0; i < 8; i++)
			expect(poll_one(cq, "list"), i + 1, IBV_WC_SUCCESS, want[i], "list");
		for (int i = 0; i < 128; i++)
			if (buf[8192 + i] != pat(i, 5))
				FAIL("read: byte %d differs", i);
		if (*(uint64_t *)(buf + 9000) != 7 || *(uint64_t *)(buf + 9008) != 1000)
			FAIL("atomic old values %llu %llu", (unsigned long long)*(uint64_t *)(buf + 9000),
			     (unsigned long long)*(uint64_t *)(buf + 9008));
		printf("PASS rc_all_opcodes\n");
		for (int i = 0; i < 200; i++)
			buf[i] = pat(i, 4);
		ibv_wr_start(x);
		x->wr_id = 9;
		ibv_wr_rdma_write(x, w.rkey, w.addr + 10);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 200);
		if ((rc = ibv_wr_complete(x)))
			FAIL("write through window: %s", strerror(rc));
		expect(poll_one(cq, "write through window"), 9, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, "write through window");
		printf("PASS mw_write\n");
		put(&sync, 1);
		get(&sync, 1); /* the server invalidated the window */
		memset(buf, 0x5a, 64);
		ibv_wr_start(x);
		x->wr_id = 10;
		ibv_wr_rdma_write(x, w.rkey, w.addr);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 64);
		if ((rc = ibv_wr_complete(x)))
			FAIL("write after local_inv: %s", strerror(rc));
		expect(poll_one(cq, "write after local_inv"), 10, IBV_WC_REM_ACCESS_ERR, -1, "write after local_inv");
		printf("PASS mw_after_local_inv\n");
		put(&sync, 1);
	}
	if (ibv_destroy_qp(qp) || ibv_dereg_mr(mr) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd))
		FAIL("teardown");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	close(sock);
	printf("PASS teardown\n");
	return 0;
}
