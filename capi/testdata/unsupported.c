/*
 * unsupported.c: the verbs rdmatap's device lacks, called on a real device
 * of a service: each gets the answer rdma-core's libibverbs gives for a
 * provider without the operation (siw's case), and libmlx5's and libefa's
 * stand-ins answer as the real libraries do for a device not theirs (the
 * man page of each call says how it reports an error). NULL objects get
 * EINVAL, not a crash; the objects a refused call named go on working.
 *
 * Prints one line per failed case and "unsupported: N cases ok" when all
 * passed; exits 1 when any failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <infiniband/efadv.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

static int cases, failed;

#define CASE(name, cond) case_at(__LINE__, name, (cond))
static void case_at(int line, const char *name, int ok)
{
	cases++;
	if (!ok) {
		failed++;
		fprintf(stderr, "unsupported:%d: %s: FAILED (errno %d: %s)\n", line, name, errno, strerror(errno));
	}
}

#define MUST(c)                                                                                        \
	do {                                                                                           \
		if (!(c)) {                                                                            \
			fprintf(stderr, "unsupported:%d: %s failed (errno %d: %s)\n", __LINE__, #c, errno, \
				strerror(errno));                                                      \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

/* NULL_ERRNO: a constructor returned NULL with errno e. */
#define NULL_ERRNO(name, call, e)                       \
	do {                                            \
		errno = 0;                              \
		void *p_ = (void *)(call);              \
		CASE(name, p_ == NULL && errno == (e)); \
	} while (0)

/* RET: a call returned r (an errno value, or 0). */
#define RET(name, call, r)                   \
	do {                                 \
		errno = 0;                   \
		int r_ = (call);             \
		CASE(name, r_ == (r));       \
	} while (0)

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	MUST(list && n == 1);
	struct ibv_device *dev = list[0];
	struct ibv_context *ctx = ibv_open_device(dev);
	MUST(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	MUST(pd);
	static char buf[8192];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	MUST(mr);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	MUST(cq);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	MUST(qp);

	/* ---- imports (ibv_import_device(3), ibv_import_pd(3), ibv_import_dm(3)) ---- */

	/* ref: rdma-core's ibv_import_device: a descriptor fstat refuses, or
	 * not a character device, is EINVAL; a device whose provider has no
	 * import_context (siw's) is EOPNOTSUPP. */
	NULL_ERRNO("ibv_import_device(-1)", ibv_import_device(-1), EINVAL);
	int pfd[2];
	MUST(pipe(pfd) == 0);
	NULL_ERRNO("ibv_import_device(a pipe)", ibv_import_device(pfd[0]), EINVAL);
	close(pfd[0]);
	close(pfd[1]);
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	MUST(null >= 0);
	NULL_ERRNO("ibv_import_device(a character device)", ibv_import_device(null), EOPNOTSUPP);
	close(null);
	/* ref: the dummy import_pd/import_mr/import_dm ops. */
	NULL_ERRNO("ibv_import_pd", ibv_import_pd(ctx, pd->handle), EOPNOTSUPP);
	NULL_ERRNO("ibv_import_pd(NULL context)", ibv_import_pd(NULL, pd->handle), EINVAL);
	NULL_ERRNO("ibv_import_mr", ibv_import_mr(pd, mr->handle), EOPNOTSUPP);
	NULL_ERRNO("ibv_import_mr(NULL pd)", ibv_import_mr(NULL, mr->handle), EINVAL);
	NULL_ERRNO("ibv_import_dm", ibv_import_dm(ctx, 1), EOPNOTSUPP);
	NULL_ERRNO("ibv_import_dm(NULL context)", ibv_import_dm(NULL, 1), EINVAL);
	/* ref: the dummy unimport ops do nothing; the objects stay whole. */
	ibv_unimport_pd(NULL);
	ibv_unimport_mr(NULL);
	ibv_unimport_dm(NULL);
	ibv_unimport_mr(mr);
	ibv_unimport_pd(pd);
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CASE("the PD after ibv_unimport_pd registers memory", mr2 != NULL);
	if (mr2)
		RET("ibv_dereg_mr after ibv_unimport_pd", ibv_dereg_mr(mr2), 0);

	/* ---- ECE (ibv_set_ece(3), ibv_query_ece(3)): the errno value ---- */

	struct ibv_ece ece = {0};
	RET("ibv_query_ece", ibv_query_ece(qp, &ece), EOPNOTSUPP);
	RET("ibv_set_ece vendor 0", ibv_set_ece(qp, &ece), EOPNOTSUPP);
	CASE("ibv_set_ece sets errno", errno == EOPNOTSUPP);
	ece.vendor_id = 0x15b3;
	ece.options = 1;
	RET("ibv_set_ece vendor 0x15b3", ibv_set_ece(qp, &ece), EOPNOTSUPP);
	RET("ibv_query_ece(NULL ece)", ibv_query_ece(qp, NULL), EINVAL);
	RET("ibv_set_ece(NULL qp)", ibv_set_ece(NULL, &ece), EINVAL);

	/* ---- dma-buf (ibv_reg_dmabuf_mr(3)): siw's driver imports none ---- */

	int mfd = memfd_create("unsupported", MFD_CLOEXEC);
	MUST(mfd >= 0);
	MUST(ftruncate(mfd, 4096) == 0);
	NULL_ERRNO("ibv_reg_dmabuf_mr", ibv_reg_dmabuf_mr(pd, 0, 4096, 0, mfd, IBV_ACCESS_LOCAL_WRITE), EOPNOTSUPP);
	NULL_ERRNO("ibv_reg_dmabuf_mr(NULL pd)", ibv_reg_dmabuf_mr(NULL, 0, 4096, 0, mfd, 0), EINVAL);
	close(mfd);

	/* ---- ibv_query_qp_data_in_order(3): not guaranteed, 0 ---- */

	/* The flags rdma-core 44's header has none of (it says 0); later
	 * ones name 1 RETURN_CAPS (a capability vector: 0, none) and 2
	 * DEVICE_ONLY; an unknown flag is 0 too. */
	enum ibv_wr_opcode ops[] = {IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ};
	uint32_t flags[] = {0, 1, 2, 3, 1u << 31};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		for (size_t j = 0; j < sizeof(flags) / sizeof(flags[0]); j++)
			RET("ibv_query_qp_data_in_order", ibv_query_qp_data_in_order(qp, ops[i], flags[j]), 0);
	RET("ibv_query_qp_data_in_order(NULL qp)", ibv_query_qp_data_in_order(NULL, IBV_WR_SEND, 0), 0);

	/* ---- libmlx5 for a device not its own (mlx5dv(7)) ---- */

	CASE("mlx5dv_is_supported", !mlx5dv_is_supported(dev));
	CASE("mlx5dv_is_supported(NULL)", !mlx5dv_is_supported(NULL));
	struct mlx5dv_context_attr mattr = {0};
	NULL_ERRNO("mlx5dv_open_device", mlx5dv_open_device(dev, &mattr), EOPNOTSUPP);
	struct mlx5dv_context mctx = {0};
	RET("mlx5dv_query_device", mlx5dv_query_device(ctx, &mctx), EOPNOTSUPP);
	struct mlx5dv_port mport;
	RET("mlx5dv_query_port", mlx5dv_query_port(ctx, 1, &mport), EOPNOTSUPP);
	struct mlx5dv_obj obj = {0};
	struct mlx5dv_qp mqp;
	obj.qp.in = qp;
	obj.qp.out = &mqp;
	RET("mlx5dv_init_obj", mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP), EOPNOTSUPP);
	uint32_t in[4] = {0}, out[4];
	NULL_ERRNO("mlx5dv_devx_obj_create", mlx5dv_devx_obj_create(ctx, in, sizeof(in), out, sizeof(out)), EOPNOTSUPP);
	RET("mlx5dv_devx_general_cmd", mlx5dv_devx_general_cmd(ctx, in, sizeof(in), out, sizeof(out)), EOPNOTSUPP);
	NULL_ERRNO("mlx5dv_devx_umem_reg", mlx5dv_devx_umem_reg(ctx, buf, sizeof(buf), 0), EOPNOTSUPP);
	NULL_ERRNO("mlx5dv_dr_domain_create", mlx5dv_dr_domain_create(ctx, MLX5DV_DR_DOMAIN_TYPE_NIC_RX), EOPNOTSUPP);
	NULL_ERRNO("mlx5dv_dr_action_create_drop", mlx5dv_dr_action_create_drop(), EOPNOTSUPP);
	NULL_ERRNO("mlx5dv_alloc_var", mlx5dv_alloc_var(ctx, 0), EOPNOTSUPP);
	NULL_ERRNO("mlx5dv_sched_node_create", mlx5dv_sched_node_create(ctx, NULL), EOPNOTSUPP);
	RET("mlx5dv_crypto_logout", mlx5dv_crypto_logout(ctx), EOPNOTSUPP);
	RET("mlx5dv_qp_cancel_posted_send_wrs (-errno)", mlx5dv_qp_cancel_posted_send_wrs(NULL, 1), -EOPNOTSUPP);
	RET("mlx5dv_vfio_get_events_fd", mlx5dv_vfio_get_events_fd(ctx), -1);
	CASE("mlx5dv_vfio_get_events_fd's errno", errno == EOPNOTSUPP);
	struct mlx5dv_vfio_context_attr vattr = {.pci_name = "0000:00:00.0"};
	NULL_ERRNO("mlx5dv_get_vfio_device_list", mlx5dv_get_vfio_device_list(&vattr), EOPNOTSUPP);
	struct mlx5dv_clock_info clock;
	RET("mlx5dv_get_clock_info", mlx5dv_get_clock_info(ctx, &clock), EOPNOTSUPP);
	RET("mlx5dv_modify_qp_udp_sport", mlx5dv_modify_qp_udp_sport(qp, 4791), EOPNOTSUPP);
	mlx5dv_free_var(NULL);
	mlx5dv_pp_free(NULL);
	mlx5dv_devx_free_uar(NULL);

	/* ---- libefa for a device not its own (efadv(7)) ---- */

	struct efadv_device_attr eattr;
	RET("efadv_query_device", efadv_query_device(ctx, &eattr, sizeof(eattr)), EOPNOTSUPP);
	struct ibv_cq_init_attr_ex cqa = {.cqe = 16};
	struct efadv_cq_init_attr ecqa = {0};
	NULL_ERRNO("efadv_create_cq", efadv_create_cq(ctx, &cqa, &ecqa, sizeof(ecqa)), EOPNOTSUPP);
	struct ibv_qp_init_attr_ex qax = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_DRIVER, .pd = pd,
					  .comp_mask = IBV_QP_INIT_ATTR_PD};
	struct efadv_qp_init_attr eqa = {.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD};
	NULL_ERRNO("efadv_create_qp_ex", efadv_create_qp_ex(ctx, &qax, &eqa, sizeof(eqa)), EOPNOTSUPP);
	NULL_ERRNO("efadv_create_driver_qp", efadv_create_driver_qp(pd, &qa, EFADV_QP_DRIVER_TYPE_SRD), EOPNOTSUPP);
	struct efadv_ah_attr ahattr;
	RET("efadv_query_ah", efadv_query_ah(NULL, &ahattr, sizeof(ahattr)), EOPNOTSUPP);
	NULL_ERRNO("efadv_cq_from_ibv_cq_ex", efadv_cq_from_ibv_cq_ex(NULL), EOPNOTSUPP);

	/* ---- the objects the refused calls named still work ---- */

	RET("ibv_destroy_qp", ibv_destroy_qp(qp), 0);
	RET("ibv_destroy_cq", ibv_destroy_cq(cq), 0);
	RET("ibv_dereg_mr", ibv_dereg_mr(mr), 0);
	RET("ibv_dealloc_pd", ibv_dealloc_pd(pd), 0);
	RET("ibv_close_device", ibv_close_device(ctx), 0);
	ibv_free_device_list(list);

	if (failed) {
		fprintf(stderr, "unsupported: %d of %d cases failed\n", failed, cases);
		return 1;
	}
	printf("unsupported: %d cases ok\n", cases);
	return 0;
}
