/*
 * mem.c: sharing program memory with the service.
 *
 * The service maps what a client registers from a memfd (protocol section
 * 9), but programs register whatever memory they have: heap, stack,
 * static data. The process keeps one sparse memfd, sealed against
 * shrinking, whose file offset equals the virtual address. Registering a
 * range copies its pages into the file at their own addresses and maps the
 * file over them in place (MAP_FIXED|MAP_SHARED, same protections): the
 * program sees the same bytes at the same addresses, neighbouring objects
 * on those pages included, and the service sees them too. Pages already
 * mapped from the file at their own address are left alone.
 *
 * A child made by fork() gets private copies of those pages (as of any
 * private memory), so parent and child never share the heap.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ibv_rt.h"

#define MEMFD_SIZE (1ULL << 47) /* covers the user address space */

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static int memfd = -1;
static ino_t memfd_ino;
static dev_t memfd_dev;

struct map_line {
	uintptr_t lo, hi;
	int prot;
	int shared;
	uint64_t off;
	unsigned maj, min;
	uint64_t ino;
};

/* read_maps reads /proc/self/maps whole (the caller frees *buf). */
static char *read_maps(void)
{
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		if (n + 4096 + 1 > cap) {
			char *b = realloc(buf, cap * 2);
			if (!b) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = b;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + n, cap - n - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r < 0) {
				free(buf);
				buf = NULL;
			}
			break;
		}
		n += (size_t)r;
	}
	close(fd);
	if (buf)
		buf[n] = 0;
	return buf;
}

static int parse_line(char **p, struct map_line *l)
{
	char perms[8];
	int used = 0;
	unsigned long long lo, hi, off, ino;
	if (!**p)
		return 0;
	if (sscanf(*p, "%llx-%llx %7s %llx %x:%x %llu%n", &lo, &hi, perms, &off, &l->maj, &l->min, &ino, &used) < 7)
		return -1;
	l->lo = (uintptr_t)lo;
	l->hi = (uintptr_t)hi;
	l->off = off;
	l->ino = ino;
	l->prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) | (perms[2] == 'x' ? PROT_EXEC : 0);
	l->shared = perms[3] == 's';
	char *nl = strchr(*p, '\n');
	*p = nl ? nl + 1 : *p + strlen(*p);
	return 1;
}

static int is_ours(const struct map_line *l)
{
	return memfd >= 0 && l->ino == (uint64_t)memfd_ino && l->maj == major(memfd_dev) && l->min == minor(memfd_dev);
}

/*
 * Whole pages are copied, bytes the program never allocated included (a
 * sanitizer's redzones around a malloc'd buffer): the raw system calls keep
 * sanitizers' interceptors from taking that for an overflow.
 */
static ssize_t raw_pwrite(int fd, const void *buf, size_t n, uintptr_t off)
{
	return (ssize_t)syscall(SYS_pwrite64, fd, buf, n, (off_t)off);
}

static int raw_pread(int fd, void *buf, size_t n, uintptr_t off)
{
	for (size_t done = 0; done < n;) {
		ssize_t r = (ssize_t)syscall(SYS_pread64, fd, (uint8_t *)buf + done, n - done, (off_t)(off + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		done += (size_t)r;
	}
	return 0;
}

/*
 * fork(): a child must get a copy of registered memory, as of any private
 * memory, but a MAP_SHARED mapping is inherited shared, and from the fork
 * until a handler in the child ran, both processes would run on shared
 * pages (a registered stack, the heap). So just before the fork the
 * registered ranges become private copies again (the service keeps seeing
 * the memfd); the child inherits those; the parent then copies them back
 * into the memfd and maps it again. What a peer places into the memory
 * during the fork itself is lost in the parent.
 */
struct range {
	uintptr_t lo, hi;
	int prot;
};
static struct range *fork_ranges;
static size_t fork_nranges;

static void *privatize(void *unused)
{
	(void)unused;
	char *maps = read_maps();
	if (!maps)
		return NULL;
	size_t cap = 0;
	char *p = maps;
	struct map_line l;
	while (parse_line(&p, &l) > 0) {
		if (!is_ours(&l))
			continue;
		if (fork_nranges == cap) {
			size_t ncap = cap ? 2 * cap : 16;
			struct range *r = realloc(fork_ranges, ncap * sizeof(*r));
			if (!r)
				break;
			fork_ranges = r;
			cap = ncap;
		}
		size_t len = l.hi - l.lo;
		void *tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (tmp == MAP_FAILED)
			continue;
		/* the file holds the pages' bytes at their addresses */
		if (raw_pread(memfd, tmp, len, l.lo) < 0 ||
		    mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)l.lo) == MAP_FAILED) {
			munmap(tmp, len);
			continue;
		}
		mprotect((void *)l.lo, len, l.prot);
		fork_ranges[fork_nranges++] = (struct range){l.lo, l.hi, l.prot};
	}
	free(maps);
	return NULL;
}

static int share_range(uintptr_t lo, uintptr_t hi, int prot);

static void *reshare(void *unused)
{
	(void)unused;
	for (size_t i = 0; i < fork_nranges; i++)
		if (share_range(fork_ranges[i].lo, fork_ranges[i].hi, fork_ranges[i].prot) < 0)
			rt_debug("fork: registered memory at %#lx is no longer shared: %s", (unsigned long)fork_ranges[i].lo,
				 strerror(errno));
	return NULL;
}

/* on_thread runs fn on another thread: the pages it moves may hold this
 * thread's stack, which must not change between the copy and the move. */
static void on_thread(void *(*fn)(void *))
{
	pthread_t t;
	if (pthread_create(&t, NULL, fn, NULL) == 0)
		pthread_join(t, NULL);
	else
		rt_debug("fork: no thread to move registered memory");
}

static void before_fork(void)
{
	rt_quiesce_begin();
	pthread_mutex_lock(&mem_mu);
	fork_nranges = 0;
	if (memfd >= 0)
		on_thread(privatize);
}

static void parent_after_fork(void)
{
	if (memfd >= 0 && fork_nranges)
		on_thread(reshare);
	fork_nranges = 0;
	pthread_mutex_unlock(&mem_mu);
	rt_quiesce_end();
}

static void child_after_fork(void)
{
	if (memfd >= 0)
		close(memfd);
	memfd = -1;
	fork_nranges = 0;
	pthread_mutex_init(&mem_mu, NULL);
	rt_quiesce_reset();
}

static int open_memfd(void)
{
	int fd = memfd_create("rdmatap-mem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	struct stat st;
	if (ftruncate(fd, (off_t)MEMFD_SIZE) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0 || fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	memfd_ino = st.st_ino;
	memfd_dev = st.st_dev;
	memfd = fd;
	static int atfork;
	if (!atfork) {
		pthread_atfork(before_fork, parent_after_fork, child_after_fork);
		atfork = 1;
	}
	return 0;
}

/* share_range maps the memfd over [lo, hi) (within one mapping with prot). */
static int share_range(uintptr_t lo, uintptr_t hi, int prot)
{
	if (!(prot & PROT_READ) && mprotect((void *)lo, hi - lo, prot | PROT_READ) < 0)
		return -1;
	for (uintptr_t a = lo; a < hi;) {
		ssize_t w = raw_pwrite(memfd, (void *)a, hi - a, a);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			if (w == 0)
				errno = EFAULT;
			if (!(prot & PROT_READ))
				mprotect((void *)lo, hi - lo, prot);
			return -1;
		}
		a += (uintptr_t)w;
	}
	void *m = mmap((void *)lo, hi - lo, prot, MAP_FIXED | MAP_SHARED, memfd, (off_t)lo);
	if (m == MAP_FAILED)
		return -1;
	return 0;
}

struct share_job {
	uintptr_t lo, hi;
	int prot, r, err;
};

static void *share_job_run(void *arg)
{
	struct share_job *j = arg;
	j->r = share_range(j->lo, j->hi, j->prot);
	j->err = errno;
	return NULL;
}

/* share_range_safe is share_range, run on another thread when the range
 * may hold this thread's own stack frames: between the copy and the
 * mapping, a call would write its return address into the page and the
 * mapping would take it away. The caller is blocked in pthread_join
 * meanwhile, touching none of its stack. */
static int share_range_safe(uintptr_t lo, uintptr_t hi, int prot)
{
	uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
	if (hi + (1u << 20) < sp || lo > sp + (64u << 20))
		return share_range(lo, hi, prot);
	struct share_job j = {.lo = lo, .hi = hi, .prot = prot};
	pthread_t t;
	int e = pthread_create(&t, NULL, share_job_run, &j);
	if (e) {
		errno = e;
		return -1;
	}
	pthread_join(t, NULL);
	errno = j.err;
	return j.r;
}

int rt_mem_share(void *addr, size_t len, int writable)
{
	uintptr_t a = (uintptr_t)addr;
	if (!addr || len == 0 || a + len < a || a + len > MEMFD_SIZE) {
		errno = EFAULT;
		return -1;
	}
	uintptr_t lo = a & ~(uintptr_t)4095, hi = (a + len + 4095) & ~(uintptr_t)4095;
	/* Lock order: the reader thread's dispatch (quiesce), then mem_mu. */
	rt_quiesce_begin();
	pthread_mutex_lock(&mem_mu);
	int r = -1;
	if (memfd < 0 && open_memfd() < 0)
		goto out;
	char *maps = read_maps();
	if (!maps)
		goto out;
	uintptr_t next = lo; /* the first byte not yet found mapped */
	char *p = maps;
	struct map_line l;
	int k;
	r = 0;
	while (next < hi && (k = parse_line(&p, &l)) > 0) {
		if (l.hi <= next)
			continue;
		if (l.lo > next) {
			errno = EFAULT; /* a hole */
			r = -1;
			break;
		}
		if (!(l.prot & PROT_READ) || (writable && !(l.prot & PROT_WRITE))) {
			errno = EFAULT; /* as get_user_pages (FOLL_WRITE for a writable MR) */
			r = -1;
			break;
		}
		uintptr_t s = next, e = l.hi < hi ? l.hi : hi;
		if (is_ours(&l) && l.off + (s - l.lo) == s) {
			next = e;
			continue; /* shared already */
		}
		if (l.shared) {
			errno = EINVAL; /* another shared mapping: it cannot be moved into the memfd */
			r = -1;
			break;
		}
		if (share_range_safe(s, e, l.prot) < 0) {
			r = -1;
			break;
		}
		next = e;
	}
	if (r == 0 && next < hi) {
		errno = EFAULT;
		r = -1;
	}
	free(maps);
out:;
	int e = errno;
	int fd = memfd;
	pthread_mutex_unlock(&mem_mu);
	rt_quiesce_end();
	errno = e;
	return r < 0 ? -1 : fd;
}
