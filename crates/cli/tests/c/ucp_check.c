/*
 * ucp_check: two processes exchange data through UCX's UCP API and check every byte.
 *
 *   ucp_check server PORT
 *   ucp_check client HOST PORT
 *
 * The worker addresses are exchanged over TCP (HOST:PORT); everything else goes through
 * UCX, over whatever transports UCX_TLS / UCX_NET_DEVICES select. In order:
 *   1. tagged messages both ways at sizes from 1 byte to 3 MiB (eager and rendezvous; the
 *      rendezvous protocol moves the data with RDMA GET/PUT on rc_verbs);
 *   2. RMA PUT from the client into a region the server mapped, then a flush; the server
 *      checks the region and answers;
 *   3. RMA GET by the client of a region the server filled;
 *   4. active messages of 1 byte to 300 000 bytes (eager and rendezvous) checked by the
 *      server's handler.
 * Each step has a deadline; the first wrong byte, a failed operation or a step past its
 * deadline ends the program with status 1 and one line saying what. On success each side
 * prints the endpoint's lanes (ucp_ep_print_info) and "ucp_check: ok".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define DEADLINE_S 60
#define REGION (4u << 20)
#define AM_ID 7

static const size_t TAG_SIZES[] = {1, 63, 4096, 9000, 65536, 1u << 20, (3u << 20) + 7};
static const size_t AM_SIZES[] = {1, 100, 8000, 300000};
static const struct { size_t off, len; } RMA_SPANS[] = {
	{0, 8}, {13, 1000}, {4096, 65536}, {200000, 1u << 20}, {REGION - 3000, 3000},
};
#define N(a) (sizeof(a) / sizeof((a)[0]))

enum { T_PING = 1, T_PONG, T_RKEY, T_PUT_DONE, T_PUT_RESULT, T_GET_READY, T_GET_DONE, T_AM_RESULT };

static ucp_context_h ctx;
static ucp_worker_h worker;
static ucp_ep_h ep;
static const char *side = "?";

static void die(const char *what, const char *detail)
{
	printf("ucp_check %s: FAILED: %s%s%s\n", side, what, detail ? ": " : "", detail ? detail : "");
	fflush(stdout);
	exit(1);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The byte at absolute position i of a buffer filled for seed s. */
static uint8_t pattern(uint64_t s, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ (s + 1) * 0xc2b2ae3d27d4eb4full;
	x ^= x >> 29;
	return (uint8_t)(x * 0xbf58476d1ce4e5b9ull >> 56);
}

static void fill(uint8_t *b, uint64_t seed, uint64_t base, size_t len)
{
	for (size_t i = 0; i < len; i++)
		b[i] = pattern(seed, base + i);
}

static void check(const char *what, const uint8_t *b, uint64_t seed, uint64_t base, size_t len)
{
	for (size_t i = 0; i < len; i++) {
		if (b[i] != pattern(seed, base + i)) {
			char d[160];
			snprintf(d, sizeof d, "byte %zu of %zu is 0x%02x, want 0x%02x", i, len, b[i],
				 pattern(seed, base + i));
			die(what, d);
		}
	}
}

/* Progresses the worker until the request is done; NULL means done at once. */
static void wait_req(const char *what, void *req)
{
	if (req == NULL)
		return;
	if (UCS_PTR_IS_ERR(req))
		die(what, ucs_status_string(UCS_PTR_STATUS(req)));
	double end = now_s() + DEADLINE_S;
	ucs_status_t st;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		ucp_worker_progress(worker);
		if (now_s() > end)
			die(what, "no completion within the deadline");
	}
	ucp_request_free(req);
	if (st != UCS_OK)
		die(what, ucs_status_string(st));
}

static void tag_send(const char *what, uint64_t tag, const void *buf, size_t len)
{
	ucp_request_param_t p = {.op_attr_mask = 0};
	wait_req(what, ucp_tag_send_nbx(ep, buf, len, tag, &p));
}

/* Receives exactly the message of `tag` into buf (capacity cap); returns its length. */
static size_t tag_recv(const char *what, uint64_t tag, void *buf, size_t cap)
{
	ucp_tag_recv_info_t info = {0};
	ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO,
				 .recv_info.tag_info = &info};
	void *req = ucp_tag_recv_nbx(worker, buf, cap, tag, (ucp_tag_t)-1, &p);
	if (req == NULL)
		return info.length;
	if (UCS_PTR_IS_ERR(req))
		die(what, ucs_status_string(UCS_PTR_STATUS(req)));
	double end = now_s() + DEADLINE_S;
	ucs_status_t st;
	while ((st = ucp_tag_recv_request_test(req, &info)) == UCS_INPROGRESS) {
		ucp_worker_progress(worker);
		if (now_s() > end)
			die(what, "no message within the deadline");
	}
	ucp_request_free(req);
	if (st != UCS_OK)
		die(what, ucs_status_string(st));
	return info.length;
}

static void flush_ep(void)
{
	ucp_request_param_t p = {.op_attr_mask = 0};
	wait_req("ucp_ep_flush_nbx", ucp_ep_flush_nbx(ep, &p));
}

/* --- active messages (server side) --- */
struct am_state {
	unsigned received;
	unsigned pending;       /* rendezvous data still arriving */
	void *rndv_req[N(AM_SIZES)];
	uint8_t *rndv_buf[N(AM_SIZES)];
	size_t rndv_len[N(AM_SIZES)];
	uint64_t rndv_seed[N(AM_SIZES)];
};
static struct am_state am;

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
			  size_t length, const ucp_am_recv_param_t *param)
{
	(void)arg;
	uint64_t seed;
	if (header_length != sizeof seed)
		die("active message", "header of the wrong length");
	memcpy(&seed, header, sizeof seed);
	if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		unsigned k = am.pending++;
		if (k >= N(AM_SIZES))
			die("active message", "more rendezvous messages than sent");
		am.rndv_buf[k] = malloc(length);
		am.rndv_len[k] = length;
		am.rndv_seed[k] = seed;
		ucp_request_param_t p = {.op_attr_mask = 0};
		void *req = ucp_am_recv_data_nbx(worker, data, am.rndv_buf[k], length, &p);
		if (UCS_PTR_IS_ERR(req))
			die("ucp_am_recv_data_nbx", ucs_status_string(UCS_PTR_STATUS(req)));
		if (req == NULL) {
			/* Done at once. */
			check("active message (rendezvous)", am.rndv_buf[k], seed, 0, length);
			am.pending--;
			am.received++;
			free(am.rndv_buf[k]);
			return UCS_OK;
		}
		am.rndv_req[k] = req;
		return UCS_OK;
	}
	check("active message (eager)", data, seed, 0, length);
	am.received++;
	return UCS_OK;
}

/* --- the two sides --- */
static void server(void)
{
	uint8_t *buf = malloc(TAG_SIZES[N(TAG_SIZES) - 1]);
	/* 1. tagged messages */
	for (size_t k = 0; k < N(TAG_SIZES); k++) {
		size_t n = tag_recv("tag recv", T_PING, buf, TAG_SIZES[N(TAG_SIZES) - 1]);
		if (n != TAG_SIZES[k])
			die("tag recv", "wrong length");
		check("tagged message from the client", buf, k, 0, n);
		fill(buf, 100 + k, 0, n);
		tag_send("tag send", T_PONG, buf, n);
	}
	/* 2. PUT into a mapped region */
	uint8_t *region = aligned_alloc(4096, REGION);
	memset(region, 0, REGION);
	ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
						 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
				   .address = region, .length = REGION};
	ucp_mem_h memh;
	if (ucp_mem_map(ctx, &mp, &memh) != UCS_OK)
		die("ucp_mem_map", NULL);
	void *rkey_buf;
	size_t rkey_size;
	if (ucp_rkey_pack(ctx, memh, &rkey_buf, &rkey_size) != UCS_OK)
		die("ucp_rkey_pack", NULL);
	size_t msg_len = 16 + rkey_size;
	uint8_t *msg = malloc(msg_len);
	uint64_t addr = (uintptr_t)region;
	memcpy(msg, &addr, 8);
	memcpy(msg + 8, &rkey_size, 8);
	memcpy(msg + 16, rkey_buf, rkey_size);
	tag_send("send rkey", T_RKEY, msg, msg_len);
	uint64_t word;
	tag_recv("put done", T_PUT_DONE, &word, sizeof word);
	for (size_t k = 0; k < N(RMA_SPANS); k++)
		check("region written by PUT", region + RMA_SPANS[k].off, 200 + k, RMA_SPANS[k].off,
		      RMA_SPANS[k].len);
	word = 0;
	tag_send("put result", T_PUT_RESULT, &word, sizeof word);
	/* 3. GET of a filled region */
	fill(region, 300, 0, REGION);
	tag_send("get ready", T_GET_READY, &word, sizeof word);
	tag_recv("get done", T_GET_DONE, &word, sizeof word);
	/* 4. active messages */
	double end = now_s() + DEADLINE_S;
	for (;;) {
		ucp_worker_progress(worker);
		unsigned done = am.received;
		for (unsigned k = 0; k < am.pending; k++) {
			if (am.rndv_req[k] == NULL) {
				done++; /* checked below, on an earlier pass */
				continue;
			}
			ucs_status_t st = ucp_request_check_status(am.rndv_req[k]);
			if (st == UCS_INPROGRESS)
				continue;
			if (st != UCS_OK)
				die("active message data", ucs_status_string(st));
			ucp_request_free(am.rndv_req[k]);
			am.rndv_req[k] = NULL;
			check("active message (rendezvous)", am.rndv_buf[k], am.rndv_seed[k], 0,
			      am.rndv_len[k]);
			done++;
		}
		if (done == N(AM_SIZES))
			break;
		if (now_s() > end)
			die("active messages", "not all arrived within the deadline");
	}
	word = 0;
	tag_send("am result", T_AM_RESULT, &word, sizeof word);
	ucp_rkey_buffer_release(rkey_buf);
	ucp_mem_unmap(ctx, memh);
	free(region);
	free(msg);
	free(buf);
}

static void client(void)
{
	uint8_t *buf = malloc(TAG_SIZES[N(TAG_SIZES) - 1]);
	/* 1. tagged messages */
	for (size_t k = 0; k < N(TAG_SIZES); k++) {
		fill(buf, k, 0, TAG_SIZES[k]);
		tag_send("tag send", T_PING, buf, TAG_SIZES[k]);
		memset(buf, 0, TAG_SIZES[k]);
		size_t n = tag_recv("tag recv", T_PONG, buf, TAG_SIZES[N(TAG_SIZES) - 1]);
		if (n != TAG_SIZES[k])
			die("tag recv", "wrong length");
		check("tagged message from the server", buf, 100 + k, 0, n);
	}
	/* 2. PUT */
	uint8_t msg[4096];
	size_t msg_len = tag_recv("receive rkey", T_RKEY, msg, sizeof msg);
	uint64_t raddr, rkey_size;
	memcpy(&raddr, msg, 8);
	memcpy(&rkey_size, msg + 8, 8);
	if (msg_len != 16 + rkey_size)
		die("receive rkey", "wrong length");
	ucp_rkey_h rkey;
	if (ucp_ep_rkey_unpack(ep, msg + 16, &rkey) != UCS_OK)
		die("ucp_ep_rkey_unpack", NULL);
	uint8_t *local = malloc(REGION);
	ucp_request_param_t p = {.op_attr_mask = 0};
	for (size_t k = 0; k < N(RMA_SPANS); k++) {
		fill(local + RMA_SPANS[k].off, 200 + k, RMA_SPANS[k].off, RMA_SPANS[k].len);
		wait_req("ucp_put_nbx", ucp_put_nbx(ep, local + RMA_SPANS[k].off, RMA_SPANS[k].len,
						    raddr + RMA_SPANS[k].off, rkey, &p));
	}
	flush_ep();
	uint64_t word = 0;
	tag_send("put done", T_PUT_DONE, &word, sizeof word);
	tag_recv("put result", T_PUT_RESULT, &word, sizeof word);
	if (word != 0)
		die("put", "the server found wrong data");
	/* 3. GET */
	tag_recv("get ready", T_GET_READY, &word, sizeof word);
	memset(local, 0, REGION);
	for (size_t k = 0; k < N(RMA_SPANS); k++) {
		wait_req("ucp_get_nbx", ucp_get_nbx(ep, local + RMA_SPANS[k].off, RMA_SPANS[k].len,
						    raddr + RMA_SPANS[k].off, rkey, &p));
	}
	flush_ep();
	for (size_t k = 0; k < N(RMA_SPANS); k++)
		check("region read by GET", local + RMA_SPANS[k].off, 300, RMA_SPANS[k].off,
		      RMA_SPANS[k].len);
	tag_send("get done", T_GET_DONE, &word, sizeof word);
	/* 4. active messages */
	for (size_t k = 0; k < N(AM_SIZES); k++) {
		uint64_t seed = 400 + k;
		fill(local, seed, 0, AM_SIZES[k]);
		wait_req("ucp_am_send_nbx",
			 ucp_am_send_nbx(ep, AM_ID, &seed, sizeof seed, local, AM_SIZES[k], &p));
	}
	tag_recv("am result", T_AM_RESULT, &word, sizeof word);
	ucp_rkey_destroy(rkey);
	free(local);
	free(buf);
}

/* --- set-up --- */
static int tcp_pair(const char *host, const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
	if (host == NULL)
		hints.ai_flags = AI_PASSIVE;
	if (getaddrinfo(host, port, &hints, &ai) != 0)
		die("getaddrinfo", port);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (host == NULL) {
		if (bind(s, ai->ai_addr, ai->ai_addrlen) || listen(s, 1))
			die("listen", port);
		int c = accept(s, NULL, NULL);
		if (c < 0)
			die("accept", NULL);
		close(s);
		s = c;
	} else {
		double end = now_s() + DEADLINE_S;
		while (connect(s, ai->ai_addr, ai->ai_addrlen)) {
			if (now_s() > end)
				die("connect", port);
			usleep(50000);
			close(s);
			s = socket(AF_INET, SOCK_STREAM, 0);
		}
	}
	freeaddrinfo(ai);
	return s;
}

static void xfer(int s, void *buf, size_t len, int out)
{
	uint8_t *b = buf;
	while (len > 0) {
		ssize_t n = out ? write(s, b, len) : read(s, b, len);
		if (n <= 0)
			die(out ? "write to the peer" : "read from the peer", NULL);
		b += n;
		len -= (size_t)n;
	}
}

int main(int argc, char **argv)
{
	const char *host = NULL, *port;
	if (argc == 3 && strcmp(argv[1], "server") == 0) {
		side = "server";
		port = argv[2];
	} else if (argc == 4 && strcmp(argv[1], "client") == 0) {
		side = "client";
		host = argv[2];
		port = argv[3];
	} else {
		fprintf(stderr, "usage: ucp_check server PORT | client HOST PORT\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	ucp_config_t *config;
	if (ucp_config_read(NULL, NULL, &config) != UCS_OK)
		die("ucp_config_read", NULL);
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
			       .features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM};
	if (ucp_init(&params, config, &ctx) != UCS_OK)
		die("ucp_init", NULL);
	ucp_config_release(config);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				  .thread_mode = UCS_THREAD_MODE_SINGLE};
	if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK)
		die("ucp_worker_create", NULL);
	if (host == NULL) {
		ucp_am_handler_param_t hp = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
							   UCP_AM_HANDLER_PARAM_FIELD_CB |
							   UCP_AM_HANDLER_PARAM_FIELD_ARG,
					     .id = AM_ID, .cb = am_cb, .arg = NULL};
		if (ucp_worker_set_am_recv_handler(worker, &hp) != UCS_OK)
			die("ucp_worker_set_am_recv_handler", NULL);
	}
	ucp_address_t *addr;
	size_t addr_len;
	if (ucp_worker_get_address(worker, &addr, &addr_len) != UCS_OK)
		die("ucp_worker_get_address", NULL);
	int s = tcp_pair(host, port);
	uint64_t mine = addr_len, theirs;
	xfer(s, &mine, 8, 1);
	xfer(s, addr, addr_len, 1);
	xfer(s, &theirs, 8, 0);
	if (theirs == 0 || theirs > (1u << 20))
		die("peer address", "bad length");
	void *peer = malloc(theirs);
	xfer(s, peer, theirs, 0);
	ucp_worker_release_address(worker, addr);
	ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
				     .address = peer};
	if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK)
		die("ucp_ep_create", NULL);
	if (host == NULL)
		server();
	else
		client();
	ucp_ep_print_info(ep, stdout);
	/* Both sides are done before either closes: the close flushes. */
	char done = 1;
	xfer(s, &done, 1, 1);
	xfer(s, &done, 1, 0);
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
				  .flags = UCP_EP_CLOSE_FLAG_FORCE};
	void *req = ucp_ep_close_nbx(ep, &cp);
	if (req != NULL && !UCS_PTR_IS_ERR(req)) {
		double end = now_s() + 5;
		while (ucp_request_check_status(req) == UCS_INPROGRESS && now_s() < end)
			ucp_worker_progress(worker);
		ucp_request_free(req);
	}
	close(s);
	free(peer);
	ucp_worker_destroy(worker);
	ucp_cleanup(ctx);
	printf("ucp_check %s: ok (%zu tagged sizes up to %zu B both ways, %zu PUT and GET spans, "
	       "%zu active messages)\n",
	       side, N(TAG_SIZES), TAG_SIZES[N(TAG_SIZES) - 1], N(RMA_SPANS), N(AM_SIZES));
	return 0;
}
