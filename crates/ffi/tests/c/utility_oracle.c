/* Prints what the library's device-independent helpers return, one value per line, so
   that the output under rdma-core's libibverbs.so.1 and under uroce's can be compared.
   Then calls a few unsupported functions (current and IBVERBS_1.0 compatibility
   versions, the latter through dlvsym) and prints what they return and errno. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

static void strings(void)
{
	for (int i = -2; i < 12; i++)
		printf("node_type_str %d %s\n", i, ibv_node_type_str((enum ibv_node_type)i));
	for (int i = -1; i < 8; i++)
		printf("port_state_str %d %s\n", i, ibv_port_state_str((enum ibv_port_state)i));
	for (int i = -1; i < 23; i++)
		printf("event_type_str %d %s\n", i, ibv_event_type_str((enum ibv_event_type)i));
	for (int i = -1; i < 25; i++)
		printf("wc_status_str %d %s\n", i, ibv_wc_status_str((enum ibv_wc_status)i));
}

static void rates(void)
{
	for (int r = -1; r < 27; r++) {
		printf("rate_to_mult %d %d\n", r, ibv_rate_to_mult((enum ibv_rate)r));
		printf("rate_to_mbps %d %d\n", r, ibv_rate_to_mbps((enum ibv_rate)r));
		int mbps = ibv_rate_to_mbps((enum ibv_rate)r);
		printf("mbps_to_rate %d %d\n", mbps, (int)mbps_to_ibv_rate(mbps));
		printf("mbps_to_rate %d %d\n", mbps + 1, (int)mbps_to_ibv_rate(mbps + 1));
	}
	for (int m = -1; m < 500; m++)
		printf("mult_to_rate %d %d\n", m, (int)mult_to_ibv_rate(m));
}

/* Only under uroce: the unsupported entry points (and a NULL PD) fail cleanly. */
static void unsupported(void)
{
	struct ibv_wc wc;
	memset(&wc, 0, sizeof wc);
	errno = 0;
	struct ibv_ah *a = ibv_create_ah_from_wc(NULL, &wc, NULL, 1);
	printf("create_ah_from_wc %s %s\n", a ? "non-NULL" : "NULL", strerror(errno));
	errno = 0;
	int r = ibv_resize_cq(NULL, 10);
	printf("resize_cq %d %s\n", r, strerror(errno));
	errno = 0;
	r = ibv_query_ece(NULL, NULL);
	printf("query_ece %d %s\n", r, strerror(errno));
	printf("fork_init %d\n", ibv_fork_init());
	printf("is_fork_initialized %d\n", (int)ibv_is_fork_initialized());

	void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!lib) {
		printf("dlopen failed\n");
		return;
	}
	struct ibv_device **(*old_list)(int *) = dlvsym(lib, "ibv_get_device_list", "IBVERBS_1.0");
	struct ibv_device **(*new_list)(int *) = dlvsym(lib, "ibv_get_device_list", "IBVERBS_1.1");
	int (*cmd_alloc_pd)(void) = dlvsym(lib, "ibv_cmd_alloc_pd", "IBVERBS_PRIVATE_34");
	void (*reg34)(const void *) = dlvsym(lib, "verbs_register_driver_34", "IBVERBS_PRIVATE_34");
	printf("versions %s %s %s %s\n", old_list ? "1.0" : "-", new_list ? "1.1" : "-",
	       cmd_alloc_pd ? "cmd" : "-", reg34 ? "reg34" : "-");
	if (old_list && new_list && old_list != new_list) {
		int n = -1;
		errno = 0;
		struct ibv_device **l = old_list(&n);
		printf("get_device_list_1_0 %s %d %s\n", l ? "non-NULL" : "NULL", n, strerror(errno));
	}
	if (cmd_alloc_pd) {
		errno = 0;
		r = cmd_alloc_pd();
		printf("cmd_alloc_pd %d %s\n", r, strerror(errno));
	}
	if (reg34) {
		reg34(NULL);
		printf("register_driver_34 returned\n");
	}
}

int main(int argc, char **argv)
{
	strings();
	rates();
	if (argc > 1 && strcmp(argv[1], "unsupported") == 0)
		unsupported();
	return 0;
}
