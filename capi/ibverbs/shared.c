/*
 * shared.c: the verbs of IBVERBS_1.10 to 1.14 that share kernel objects
 * or kernel features rdmatap's device does not have, answered as
 * rdma-core's libibverbs answers for a provider that lacks them (siw's
 * case, the kernel driver rdmatap stands in for):
 *
 *  - importing a context, PD, MR or device memory another process (or
 *    another context) holds works through the kernel's uverbs command fd;
 *    rdmatap's contexts have none (cmd_fd is -1), so ibv_import_* fail
 *    with EOPNOTSUPP and ibv_unimport_*, given only what ibv_import_*
 *    returned, have nothing to do;
 *  - enhanced connection establishment (ECE) is an InfiniBand/RoCE CM
 *    option: ibv_query_ece and ibv_set_ece return EOPNOTSUPP;
 *  - dma-buf registration needs a kernel driver that imports dma-bufs:
 *    ibv_reg_dmabuf_mr fails with EOPNOTSUPP;
 *  - ibv_query_qp_data_in_order(3): the service places a message's data
 *    with ordinary copies, whose byte order no one guarantees, so the
 *    answer is 0 (not in order) for every operation and flag, as for a
 *    provider without the query.
 *
 * NULL objects get EINVAL instead of a crash.
 */
#include <errno.h>
#include <sys/stat.h>

#include "ibv_rt.h"

/* ibv_import_device(3): as rdma-core, a descriptor that is not an open
 * character device is EINVAL. A character device cannot be the command fd
 * of an rdmatap context (there is none), and rdmatap can import no kernel
 * context: EOPNOTSUPP, the answer for a device whose provider cannot
 * import (siw's uverbs fd). */
RT_VISIBLE struct ibv_context *ibv_import_device(int cmd_fd)
{
	struct stat st;
	if (cmd_fd < 0 || fstat(cmd_fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
		errno = EINVAL;
		return NULL;
	}
	errno = EOPNOTSUPP;
	return NULL;
}

RT_VISIBLE struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle)
{
	(void)pd_handle;
	errno = context ? EOPNOTSUPP : EINVAL;
	return NULL;
}

RT_VISIBLE void ibv_unimport_pd(struct ibv_pd *pd) { (void)pd; }

RT_VISIBLE struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	(void)mr_handle;
	errno = pd ? EOPNOTSUPP : EINVAL;
	return NULL;
}

RT_VISIBLE void ibv_unimport_mr(struct ibv_mr *mr) { (void)mr; }

RT_VISIBLE struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle)
{
	(void)dm_handle;
	errno = context ? EOPNOTSUPP : EINVAL;
	return NULL;
}

RT_VISIBLE void ibv_unimport_dm(struct ibv_dm *dm) { (void)dm; }

/* ibv_set_ece(3) and ibv_query_ece(3) return the errno value (and
 * ibv_set_ece sets errno, as rdma-core does). */
RT_VISIBLE int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	errno = qp && ece ? EOPNOTSUPP : EINVAL;
	return errno;
}

RT_VISIBLE int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece) { return qp && ece ? EOPNOTSUPP : EINVAL; }

RT_VISIBLE struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
					    int access)
{
	(void)offset;
	(void)length;
	(void)iova;
	(void)fd;
	(void)access;
	errno = pd ? EOPNOTSUPP : EINVAL;
	return NULL;
}

RT_VISIBLE int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp;
	(void)op;
	(void)flags;
	return 0;
}
