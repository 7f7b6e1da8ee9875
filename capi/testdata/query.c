/*
 * query.c: the device and port queries of rdmatap's libibverbs, for capi's
 * tests.
 *
 * Usage: query
 *
 * Prints one line of what ibv_query_device, ibv_query_device_ex,
 * ibv_query_port, ibv_query_gid and ibv_get_device_guid report, for the test to compare with the
 * service's device, then checks that the GID table has one entry.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0]) {
		fprintf(stderr, "query: no device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(l[0]);
	if (!ctx) {
		fprintf(stderr, "query: ibv_open_device: %s\n", strerror(errno));
		return 1;
	}
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	if (ibv_query_device(ctx, &da) || ibv_query_port(ctx, 1, &pa) || ibv_query_gid(ctx, 1, 0, &gid)) {
		fprintf(stderr, "query: a query failed\n");
		return 1;
	}
	union ibv_gid other;
	if (ibv_query_gid(ctx, 1, 1, &other) == 0 || ibv_query_port(ctx, 2, &pa) == 0) {
		fprintf(stderr, "query: GID index 1 or port 2 answered\n");
		return 1;
	}
	struct ibv_device_attr_ex dx;
	if (ibv_query_device_ex(ctx, NULL, &dx)) {
		fprintf(stderr, "query: ibv_query_device_ex failed\n");
		return 1;
	}
	ibv_query_port(ctx, 1, &pa);
	const uint8_t *g = (const uint8_t *)&da.node_guid;
	const uint8_t *dg = (const uint8_t *)&(__be64){ibv_get_device_guid(l[0])};
	printf("vendor_id=%#x part_id=%u guid=", da.vendor_id, da.vendor_part_id);
	for (int i = 0; i < 8; i++)
		printf("%02x", g[i]);
	printf(" device_guid=");
	for (int i = 0; i < 8; i++)
		printf("%02x", dg[i]);
	printf(" gid=");
	for (int i = 0; i < 16; i++)
		printf("%02x", gid.raw[i]);
	printf(" state=%d phys_state=%d active_mtu=%d max_mtu=%d width=%d speed=%d atomic_cap=%d max_qp_rd_atom=%d", pa.state,
	       pa.phys_state, pa.active_mtu, pa.max_mtu, pa.active_width, pa.active_speed, da.atomic_cap, da.max_qp_rd_atom);
	printf(" phys_port_cnt=%d phys_port_cnt_ex=%u\n", da.phys_port_cnt, dx.phys_port_cnt_ex);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	return 0;
}
