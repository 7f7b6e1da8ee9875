/*
 * eintr.c: signals and the event waits, for capi's tests.
 *
 * rdma-core's ibv_get_cq_event and ibv_get_async_event read() a file
 * descriptor, so a signal whose handler was installed without SA_RESTART
 * ends the wait with -1 and EINTR (qperf ends its tests so), and one with
 * SA_RESTART lets it go on. With SIGALRM every 20 ms: without SA_RESTART
 * both waits must fail with EINTR; with SA_RESTART ibv_get_cq_event must
 * go on waiting through the signals and return the event that a thread
 * raises after the third (it destroys a QP, whose posted receive then
 * completes flushed into the armed CQ). Prints "eintr: ok" and exits 0
 * when all went right.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <infiniband/verbs.h>

static int alarms;
static struct ibv_qp *qp;

static void fail(const char *what, int err)
{
	fprintf(stderr, "eintr: %s: %s\n", what, strerror(err));
	exit(1);
}

static void on_alarm(int sig)
{
	(void)sig;
	__atomic_add_fetch(&alarms, 1, __ATOMIC_SEQ_CST);
}

static void timer(long us)
{
	struct itimerval it = {{0, us}, {0, us}};
	if (setitimer(ITIMER_REAL, &it, NULL))
		fail("setitimer", errno);
}

static void handler(int flags)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = flags;
	if (sigaction(SIGALRM, &sa, NULL))
		fail("sigaction", errno);
}

/* trigger destroys the QP once three signals have been handled. */
static void *trigger(void *arg)
{
	(void)arg;
	struct timespec ms = {0, 1000000};
	while (__atomic_load_n(&alarms, __ATOMIC_SEQ_CST) < 3)
		nanosleep(&ms, NULL);
	if (ibv_destroy_qp(qp))
		fail("ibv_destroy_qp", errno);
	return NULL;
}

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		fail("no device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	if (!ctx)
		fail("ibv_open_device", errno);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 4, NULL, ch, 0) : NULL;
	if (!pd || !cq || ibv_req_notify_cq(cq, 0))
		fail("the CQ", errno);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	qp = ibv_create_qp(pd, &qa);
	if (!qp)
		fail("ibv_create_qp", errno);
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fail("ibv_reg_mr", errno);

	/* Without SA_RESTART: EINTR. */
	handler(0);
	timer(20000);
	struct ibv_cq *ecq;
	void *ectx;
	int r = ibv_get_cq_event(ch, &ecq, &ectx);
	int e = errno;
	timer(0);
	if (r != -1 || e != EINTR)
		fail("ibv_get_cq_event under SIGALRM without SA_RESTART: want -1, EINTR", r ? e : 0);
	struct ibv_async_event ev;
	timer(20000);
	r = ibv_get_async_event(ctx, &ev);
	e = errno;
	timer(0);
	if (r != -1 || e != EINTR)
		fail("ibv_get_async_event under SIGALRM without SA_RESTART: want -1, EINTR", r ? e : 0);

	/* With SA_RESTART: the wait goes on until the event. */
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof(buf), .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 42, .sg_list = &sge, .num_sge = 1}, *bad;
	if (ibv_post_recv(qp, &wr, &bad))
		fail("ibv_post_recv", errno);
	handler(SA_RESTART);
	__atomic_store_n(&alarms, 0, __ATOMIC_SEQ_CST);
	sigset_t alrm, old;
	sigemptyset(&alrm);
	sigaddset(&alrm, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &alrm, &old); /* the trigger takes none */
	pthread_t t;
	if ((e = pthread_create(&t, NULL, trigger, NULL)))
		fail("pthread_create", e);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	timer(20000);
	r = ibv_get_cq_event(ch, &ecq, &ectx);
	e = errno;
	timer(0);
	if (r != 0)
		fail("ibv_get_cq_event under SIGALRM with SA_RESTART", e);
	if (ecq != cq)
		fail("ibv_get_cq_event: another CQ", EINVAL);
	if (__atomic_load_n(&alarms, __ATOMIC_SEQ_CST) < 3)
		fail("the event came before the third signal", EINVAL);
	pthread_join(t, NULL);
	ibv_ack_cq_events(cq, 1);
	struct ibv_wc wc;
	if (ibv_poll_cq(cq, 1, &wc) != 1 || wc.wr_id != 42 || wc.status != IBV_WC_WR_FLUSH_ERR)
		fail("the flushed receive", EINVAL);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	printf("eintr: ok\n");
	return 0;
}
