/* rdma_get_cm_event on uroce's librdmacm: a channel descriptor made O_NONBLOCK gives
   EAGAIN at once; a thread blocked in the call is cancelled by pthread_cancel; a pending
   event (ADDR_RESOLVED) is returned by the blocking call. Prints one line per check and
   exits 0 when all pass. */
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
	rdma_destroy_event_channel(ch);
	return 0;
}
