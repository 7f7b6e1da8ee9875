/*
 * libefa.so.1 for rdmatap: Debian's perftest links Amazon's EFA provider
 * library, whose real build needs libibverbs' private provider interface.
 * rdmatap has no EFA devices, so each function answers as libefa does for
 * a device that is not its own: EOPNOTSUPP. perftest calls them only for
 * EFA vendor part IDs.
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
