/*
 * libefa.so.1 for rdmatap: Debian's perftest, libfabric1 and pyverbs' efa
 * module link Amazon's EFA provider library, whose real build needs
 * libibverbs' private provider interface. rdmatap has no EFA devices, so
 * each function answers as libefa does for a device that is not its own
 * (efadv(7)): constructors return NULL with errno EOPNOTSUPP, queries
 * return EOPNOTSUPP. perftest calls them only for EFA vendor part IDs,
 * libfabric's efa provider only for devices efadv_query_device accepted.
 */
#include <errno.h>
#include <stddef.h>

#include <infiniband/efadv.h>

struct ibv_qp *efadv_create_qp_ex(struct ibv_context *ibvctx, struct ibv_qp_init_attr_ex *attr_ex,
				  struct efadv_qp_init_attr *efa_attr, uint32_t inlen)
{
	(void)ibvctx;
	(void)attr_ex;
	(void)efa_attr;
	(void)inlen;
	errno = EOPNOTSUPP;
	return NULL;
}

int efadv_query_device(struct ibv_context *ibvctx, struct efadv_device_attr *attr, uint32_t inlen)
{
	(void)ibvctx;
	(void)attr;
	(void)inlen;
	return EOPNOTSUPP;
}

struct ibv_qp *efadv_create_driver_qp(struct ibv_pd *ibvpd, struct ibv_qp_init_attr *attr, uint32_t driver_qp_type)
{
	(void)ibvpd;
	(void)attr;
	(void)driver_qp_type;
	errno = EOPNOTSUPP;
	return NULL;
}

int efadv_query_ah(struct ibv_ah *ibvah, struct efadv_ah_attr *attr, uint32_t inlen)
{
	(void)ibvah;
	(void)attr;
	(void)inlen;
	return EOPNOTSUPP;
}

struct ibv_cq_ex *efadv_create_cq(struct ibv_context *ibvctx, struct ibv_cq_init_attr_ex *attr_ex,
				  struct efadv_cq_init_attr *efa_attr, uint32_t inlen)
{
	(void)ibvctx;
	(void)attr_ex;
	(void)efa_attr;
	(void)inlen;
	errno = EOPNOTSUPP;
	return NULL;
}

/* The EFA view of a CQ efadv_create_cq made; it made none. */
struct efadv_cq *efadv_cq_from_ibv_cq_ex(struct ibv_cq_ex *ibvcqx)
{
	(void)ibvcqx;
	errno = EOPNOTSUPP;
	return NULL;
}
