/*
 * memory.c: registering program memory, for capi's tests.
 *
 * Registers heap, stack and static memory (which the library moves into
 * its shared memfd in place) and checks that contents stay; forks and
 * checks that the child gets its own copy of registered memory (as of
 * anonymous memory) and can open the device with a session of its own;
 * checks the errors of bad registrations. Prints "memory: ok" and exits 0
 * when all went right.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static uint8_t statbuf[3 * 4096 + 100];

static void fail(const char *what, int err)
{
	fprintf(stderr, "memory: %s: %s\n", what, strerror(err));
	exit(1);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 13 + seed);
}

static void check(const char *what, const uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(i * 13 + seed)) {
			fprintf(stderr, "memory: %s: byte %zu is %u, want %u\n", what, i, p[i], (uint8_t)(i * 13 + seed));
			exit(1);
		}
}

static struct ibv_pd *open_pd(struct ibv_context **ctxp)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || n != 1)
		fail("ibv_get_device_list: want one device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);
	*ctxp = ctx;
	return pd;
}

/* stack registers a buffer in its own frame, next to live locals and the
 * return address, and returns through it. */
static __attribute__((noinline)) unsigned stack(struct ibv_pd *pd, unsigned seed)
{
	volatile uint8_t buf[10000];
	volatile unsigned guard = 0xfeedbeef;
	fill((uint8_t *)buf, sizeof(buf), seed);
	struct ibv_mr *mr = ibv_reg_mr(pd, (void *)buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fail("ibv_reg_mr of the stack", errno);
	check("stack buffer", (uint8_t *)buf, sizeof(buf), seed);
	if (guard != 0xfeedbeef)
		fail("stack guard", EFAULT);
	int r = ibv_dereg_mr(mr);
	if (r)
		fail("ibv_dereg_mr of the stack", r);
	return buf[17] + guard;
}

int main(void)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd = open_pd(&ctx);

	size_t hlen = 200000;
	uint8_t *heap = malloc(hlen);
	uint8_t *small = malloc(100); /* likely on a page of the big one's neighbours */
	if (!heap || !small)
		fail("malloc", ENOMEM);
	fill(heap, hlen, 1);
	fill(small, 100, 9);
	struct ibv_mr *hmr = ibv_reg_mr(pd, heap, hlen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!hmr)
		fail("ibv_reg_mr of the heap", errno);
	/* the same memory again, and a part of it */
	struct ibv_mr *hmr2 = ibv_reg_mr(pd, heap + 5000, 10000, IBV_ACCESS_LOCAL_WRITE);
	if (!hmr2 || hmr2->lkey == hmr->lkey)
		fail("a second registration of the heap", errno);
	check("heap", heap, hlen, 1);
	check("small heap object", small, 100, 9);

	fill(statbuf, sizeof(statbuf), 3);
	struct ibv_mr *smr = ibv_reg_mr(pd, statbuf + 50, sizeof(statbuf) - 50, IBV_ACCESS_LOCAL_WRITE);
	if (!smr)
		fail("ibv_reg_mr of static memory", errno);
	check("static memory", statbuf, sizeof(statbuf), 3);

	unsigned v = stack(pd, 4);
	if (v != (uint8_t)(17 * 13 + 4) + 0xfeedbeefu)
		fail("the stack function's result", EFAULT);

	/* malloc and free go on working around registered memory */
	for (int i = 0; i < 1000; i++) {
		void *p = malloc((size_t)(i * 37 % 5000) + 1);
		if (!p)
			fail("malloc", ENOMEM);
		memset(p, i, (size_t)(i * 37 % 5000) + 1);
		free(p);
	}

	/* Bad registrations. */
	errno = 0;
	if (ibv_reg_mr(pd, heap, 0, IBV_ACCESS_LOCAL_WRITE) || errno != EINVAL)
		fail("ibv_reg_mr of 0 bytes: want EINVAL", errno);
	errno = 0;
	if (ibv_reg_mr(pd, heap, 100, IBV_ACCESS_REMOTE_WRITE) || errno != EINVAL)
		fail("ibv_reg_mr of REMOTE_WRITE without LOCAL_WRITE: want EINVAL", errno);
	void *hole = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (hole == MAP_FAILED)
		fail("mmap", errno);
	munmap((uint8_t *)hole + 4096, 4096);
	errno = 0;
	if (ibv_reg_mr(pd, hole, 3 * 4096, IBV_ACCESS_LOCAL_WRITE) || errno != EFAULT)
		fail("ibv_reg_mr over unmapped memory: want EFAULT", errno);

	/* fork: the child gets a copy of registered memory, not the parent's pages */
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork", errno);
	if (pid == 0) {
		check("heap in the child", heap, hlen, 1);
		fill(heap, hlen, 5);
		fill(statbuf, sizeof(statbuf), 6);
		struct ibv_context *cctx;
		struct ibv_pd *cpd = open_pd(&cctx);
		struct ibv_mr *cmr = ibv_reg_mr(cpd, heap, hlen, IBV_ACCESS_LOCAL_WRITE);
		if (!cmr)
			fail("ibv_reg_mr in the child", errno);
		check("heap in the child after registering", heap, hlen, 5);
		if (ibv_dereg_mr(cmr) || ibv_dealloc_pd(cpd) || ibv_close_device(cctx))
			fail("the child's teardown", EIO);
		_exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fail("the child failed", ECHILD);
	check("heap in the parent after the child wrote its copy", heap, hlen, 1);
	check("static memory in the parent after the child wrote its copy", statbuf, sizeof(statbuf), 3);

	int r;
	if ((r = ibv_dereg_mr(hmr2)) || (r = ibv_dereg_mr(hmr)) || (r = ibv_dereg_mr(smr)))
		fail("ibv_dereg_mr", r);
	check("heap after deregistration", heap, hlen, 1);
	free(heap);
	free(small);
	if ((r = ibv_dealloc_pd(pd)) || (r = ibv_close_device(ctx)))
		fail("teardown", r);
	printf("memory: ok\n");
	return 0;
}
