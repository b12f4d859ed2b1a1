/* rdma_get_cm_event on uroce's librdmacm: a channel descriptor made O_NONBLOCK gives
   EAGAIN at once; a thread blocked in the call is cancelled by pthread_cancel; a pending
   event (ADDR_RESOLVED) is returned by the blocking call; a multicast join's
   MULTICAST_JOIN event carries the join's context as param.ud.private_data, for
   rdma_join_multicast and rdma_join_multicast_ex. Prints one line per check and exits 0
   when all pass. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static struct rdma_event_channel *ch;

static void *waiter(void *arg)
{
	struct rdma_cm_event *ev;
	(void)arg;
	rdma_get_cm_event(ch, &ev); /* cancelled while blocked */
	return NULL;
}

/* Joins 239.77.9.1 (rdma_join_multicast) and 239.77.9.2 (rdma_join_multicast_ex) on a
   UDP id and checks each MULTICAST_JOIN event's context; leaves both. */
static int join_reports_context(void)
{
	static int ctx_a, ctx_b;
	struct rdma_cm_join_mc_attr_ex attr;
	struct sockaddr_in g[2];
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	void *want[2] = { &ctx_a, &ctx_b };
	int i;

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_UDP)) {
		perror("rdma_create_id udp");
		return 1;
	}
	for (i = 0; i < 2; i++) {
		memset(&g[i], 0, sizeof g[i]);
		g[i].sin_family = AF_INET;
		inet_pton(AF_INET, i ? "239.77.9.2" : "239.77.9.1", &g[i].sin_addr);
	}
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&g[0], 2000) ||
	    rdma_get_cm_event(ch, &ev)) {
		perror("rdma_resolve_addr mcast");
		return 1;
	}
	rdma_ack_cm_event(ev);
	if (rdma_join_multicast(id, (struct sockaddr *)&g[0], want[0])) {
		perror("rdma_join_multicast");
		return 1;
	}
	memset(&attr, 0, sizeof attr);
	attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	attr.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
	attr.addr = (struct sockaddr *)&g[1];
	if (rdma_join_multicast_ex(id, &attr, want[1])) {
		perror("rdma_join_multicast_ex");
		return 1;
	}
	for (i = 0; i < 2; i++) {
		if (rdma_get_cm_event(ch, &ev)) {
			perror("rdma_get_cm_event join");
			return 1;
		}
		if (ev->event != RDMA_CM_EVENT_MULTICAST_JOIN ||
		    ev->param.ud.private_data != want[i] || ev->param.ud.private_data_len) {
			printf("mcast: FAIL (%s, context %p, want %p)\n", rdma_event_str(ev->event),
			       ev->param.ud.private_data, want[i]);
			return 1;
		}
		rdma_ack_cm_event(ev);
	}
	printf("mcast: both joins report their context\n");
	if (rdma_leave_multicast(id, (struct sockaddr *)&g[0]) ||
	    rdma_leave_multicast(id, (struct sockaddr *)&g[1]) || rdma_destroy_id(id)) {
		perror("leave");
		return 1;
	}
	return 0;
}

int main(void)
{
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	struct sockaddr_in dst;
	pthread_t t;
	void *res;
	int flags;

	ch = rdma_create_event_channel();
	if (!ch) {
		perror("rdma_create_event_channel");
		return 1;
	}
	flags = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	errno = 0;
	if (rdma_get_cm_event(ch, &ev) != -1 || errno != EAGAIN) {
		printf("nonblock: FAIL (errno %d)\n", errno);
		return 1;
	}
	printf("nonblock: EAGAIN\n");
	fcntl(ch->fd, F_SETFL, flags);

	if (pthread_create(&t, NULL, waiter, NULL))
		return 1;
	{
		struct timespec ts = { 0, 200 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	pthread_cancel(t);
	pthread_join(t, &res);
	if (res != PTHREAD_CANCELED) {
		printf("cancel: FAIL\n");
		return 1;
	}
	printf("cancel: cancelled\n");

	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		perror("rdma_create_id");
		return 1;
	}
	memset(&dst, 0, sizeof dst);
	dst.sin_family = AF_INET;
	dst.sin_port = htons(7999);
	inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000)) {
		perror("rdma_resolve_addr");
		return 1;
	}
	if (rdma_get_cm_event(ch, &ev)) {
		perror("rdma_get_cm_event");
		return 1;
	}
	if (ev->event != RDMA_CM_EVENT_ADDR_RESOLVED || ev->id != id || !id->verbs) {
		printf("event: FAIL (%s)\n", rdma_event_str(ev->event));
		return 1;
	}
	printf("event: %s\n", rdma_event_str(ev->event));
	rdma_ack_cm_event(ev);
	if (rdma_destroy_id(id))
		return 1;

	if (join_reports_context())
		return 1;
	rdma_destroy_event_channel(ch);
	return 0;
}
