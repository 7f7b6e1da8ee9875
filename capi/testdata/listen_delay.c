/* listen_delay.c: an LD_PRELOAD wrapper that delays a program's second
 * rdma_listen by 400 ms, so that perftest's client connects its data QPs
 * before its server listens for them. */
#include <dlfcn.h>
#include <rdma/rdma_cma.h>
#include <time.h>

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	static int calls;
	int (*next)(struct rdma_cm_id *, int);
	*(void **)&next = dlsym(RTLD_NEXT, "rdma_listen");
	if (!next)
		return -1;
	if (calls++ == 1) {
		struct timespec d = {3, 0};
		nanosleep(&d, NULL);
	}
	return next(id, backlog);
}
