/*
 * fastpath.c: what ibv_post_send, ibv_post_recv and ibv_poll_cq cost the
 * process while the service's ring poller is awake, for capi's tests.
 *
 * Usage: fastpath IP:PORT ROUNDS
 *
 * Connects an RC QP to IP:PORT (an echo peer), warms up with a Send
 * ping-pong, then runs ROUNDS more rounds (post a Send, poll the receive
 * CQ, post a receive, poll the send CQ) on a thread whose every system
 * call but its own exit is trapped (seccomp, SIGSYS: the call is counted
 * and fails with ENOSYS), counting the allocator's calls meanwhile.
 * Prints "fastpath: N rounds, S system calls, A allocations" and, for
 * system calls, their numbers.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "rdmatap_core.h"

/* The allocator, counted on the measuring thread. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
static __thread int counting;
static long allocs;
void *malloc(size_t n)
{
	if (counting)
		allocs++;
	return __libc_malloc(n);
}
void *calloc(size_t n, size_t m)
{
	if (counting)
		allocs++;
	return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n)
{
	if (counting)
		allocs++;
	return __libc_realloc(p, n);
}
void free(void *p)
{
	if (counting && p)
		allocs++;
	__libc_free(p);
}

static volatile long syscalls;
static volatile int first[8];

static void on_sigsys(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	long n = syscalls++;
	if (n < 8)
		first[n] = si->si_syscall;
	((ucontext_t *)uc)->uc_mcontext.gregs[REG_RAX] = -ENOSYS;
}

static void fail(const char *what, int err)
{
	fprintf(stderr, "fastpath: %s: %s\n", what, strerror(err));
	exit(1);
}

static struct ibv_qp *qp;
static struct ibv_cq *scq, *rcq;
static struct ibv_send_wr swr;
static struct ibv_recv_wr rwr;
static long rounds;
static int bad;

static int poll1(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	return n == 1 && wc.status == IBV_WC_SUCCESS ? 0 : -1;
}

static int round1(void)
{
	struct ibv_send_wr *bs;
	struct ibv_recv_wr *br;
	if (ibv_post_send(qp, &swr, &bs) || poll1(rcq) || ibv_post_recv(qp, &rwr, &br) || poll1(scq))
		return -1;
	return 0;
}

static void *measure(void *arg)
{
	(void)arg;
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		/* a thread's end: its signal mask, its stack, its exit */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigreturn, 5, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rt_sigprocmask, 4, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_madvise, 3, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_exit, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_futex, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog))
		fail("seccomp", errno);
	counting = 1;
	for (long i = 0; i < rounds; i++)
		if (round1()) {
			bad = 1;
			break;
		}
	counting = 0;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: fastpath IP:PORT ROUNDS\n");
		return 2;
	}
	rounds = atol(argv[2]);
	const size_t size = 64;
	struct ibv_device **devs = ibv_get_device_list(NULL);
	if (!devs || !devs[0])
		fail("no device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	ibv_free_device_list(devs);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !scq || !rcq)
		fail("setup", errno);
	struct ibv_qp_init_attr qa = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
	qp = ibv_create_qp(pd, &qa);
	static uint8_t buf[2 * 64 + 1];
	if (!qp)
		fail("ibv_create_qp", errno);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fail("ibv_reg_mr", errno);
	static struct ibv_sge rsge, ssge;
	rsge = (struct ibv_sge){.addr = (uintptr_t)buf + size, .length = (uint32_t)size + 1, .lkey = mr->lkey};
	rwr = (struct ibv_recv_wr){.sg_list = &rsge, .num_sge = 1};
	struct ibv_recv_wr *bad_r;
	for (int i = 0; i < 8; i++)
		if (ibv_post_recv(qp, &rwr, &bad_r))
			fail("ibv_post_recv", EIO);
	struct rt_session *s = rt_context_session(ctx);
	uint64_t args[8] = {rt_qp_handle(qp)};
	struct rt_field fl[2] = {{argv[1], (uint16_t)strlen(argv[1])}, {"", 0}};
	struct rt_request req = {.type = RT_DIAL, .nargs = 8, .args = args, .nfields = 2, .fields = fl};
	static struct rt_msg rep;
	if (rt_call(s, &req, &rep) < 0)
		fail("DIAL", errno);
	rt_qp_set_state(qp, IBV_QPS_RTS);
	ssge = (struct ibv_sge){.addr = (uintptr_t)buf, .length = (uint32_t)size, .lkey = mr->lkey};
	swr = (struct ibv_send_wr){.sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED};
	for (int i = 0; i < 500; i++)
		if (round1())
			fail("warm-up round", EIO);

	struct sigaction sa = {.sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO};
	sigaction(SIGSYS, &sa, NULL);
	pthread_t th;
	if (pthread_create(&th, NULL, measure, NULL) || pthread_join(th, NULL))
		fail("the measuring thread", EIO);
	if (bad)
		fail("a round under seccomp", EIO);
	printf("fastpath: %ld rounds, %ld system calls, %ld allocations", rounds, syscalls, allocs);
	for (long i = 0; i < syscalls && i < 8; i++)
		printf("%s%d", i ? " " : " (system calls ", first[i]);
	printf("%s\n", syscalls ? ")" : "");
	return 0;
}
