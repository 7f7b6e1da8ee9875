/*
 * mpipingpong.c: an MPI ping-pong and bandwidth sweep between two ranks,
 * every byte of every message checked.
 *
 * Usage: mpirun -np 2 mpipingpong [-n ITERS] [-w WINDOW] [-m MAXSIZE]
 *
 * Latency: for each size from 0 bytes, then 1 and doubling to MAXSIZE
 * (default 1 MiB), rank 0 sends a message to rank 1, which checks it and
 * answers with one of its own, which rank 0 checks; ITERS (default 1000,
 * a tenth of that from 64 KiB, at least 10) round trips after ITERS/10
 * warm-up ones. Prints "lat SIZE USEC": half the mean round trip.
 *
 * Bandwidth: for each size from 1 byte, doubling to MAXSIZE, rank 0
 * posts WINDOW (default 16) MPI_Isends of distinct contents, rank 1 as
 * many MPI_Irecvs, checks every message and answers with a 4-byte
 * acknowledgement once the window is complete; ITERS/10 windows (at
 * least 10) after warm-up ones. Prints "bw SIZE MBPS" (10^6 bytes per
 * second) from the first Isend of the timed windows to the last
 * acknowledgement.
 *
 * A message whose bytes differ from what its sender wrote, or an
 * acknowledgement that does not name its window, makes the rank print
 * what differs and end the job with MPI_Abort (exit status 1). Bad
 * arguments: a usage line and exit status 2.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#define TAG_PING 1
#define TAG_PONG 2
#define TAG_DATA 3
#define TAG_ACK 4

static int rank;

/* The contents of a message: 8-byte words, an arithmetic run from a
 * start mixed out of its seed, so that each message of a run differs from
 * every other (a stale buffer or a message placed in the wrong one shows
 * as wrong bytes), cheap enough to write and check at memory speed. */
static uint64_t start(uint64_t seed)
{
	uint64_t x = seed + 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t word(uint64_t h, size_t i) { return h + (uint64_t)i * 0x9e3779b97f4a7c15ULL; }

static void fill(unsigned char *b, size_t n, uint64_t seed)
{
	uint64_t h = start(seed);
	size_t w = n / 8;
	for (size_t i = 0; i < w; i++) {
		uint64_t v = word(h, i);
		memcpy(b + 8 * i, &v, 8);
	}
	if (n % 8) {
		uint64_t v = word(h, w);
		memcpy(b + 8 * w, &v, n % 8);
	}
}

static void check(const unsigned char *b, size_t n, uint64_t seed, const char *what, size_t size, long iter)
{
	uint64_t h = start(seed);
	size_t w = n / 8, bad = w;
	for (size_t i = 0; i < w; i++) { /* no early exit: the compiler vectorizes it */
		uint64_t v;
		memcpy(&v, b + 8 * i, 8);
		if (v != word(h, i) && bad == w)
			bad = i;
	}
	for (size_t i = bad; i <= w; i++) {
		size_t len = i < w ? 8 : n % 8;
		if (len == 0)
			break;
		uint64_t v = word(h, i);
		if (memcmp(b + 8 * i, &v, len) == 0)
			continue;
		const unsigned char *want = (const unsigned char *)&v;
		for (size_t j = 0; j < len; j++) {
			if (b[8 * i + j] != want[j]) {
				fprintf(stderr,
					"mpipingpong: rank %d: %s of %zu bytes, iteration %ld: byte %zu is 0x%02x, want 0x%02x\n",
					rank, what, size, iter, 8 * i + j, b[8 * i + j], want[j]);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
		}
	}
}

static void usage(void)
{
	if (rank == 0)
		fprintf(stderr, "usage: mpirun -np 2 mpipingpong [-n ITERS] [-w WINDOW] [-m MAXSIZE]\n");
	MPI_Finalize();
	exit(2);
}

static long number(const char *s, long lo, long hi)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v < lo || v > hi)
		return -1;
	return v;
}

static long iters_for(long iters, size_t size)
{
	long n = size >= 65536 ? iters / 10 : iters;
	return n < 10 ? 10 : n;
}

static void mpi_check(int rc, const char *what)
{
	if (rc != MPI_SUCCESS) {
		char s[MPI_MAX_ERROR_STRING];
		int len = 0;
		MPI_Error_string(rc, s, &len);
		fprintf(stderr, "mpipingpong: rank %d: %s: %s\n", rank, what, s);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
}

/* One round trip of size bytes, its contents seeded by it. */
static void round_trip(unsigned char *tx, unsigned char *rx, size_t size, long it)
{
	uint64_t ping = ((uint64_t)size << 32) ^ (uint64_t)it * 2, pong = ping + 1;
	if (rank == 0) {
		fill(tx, size, ping);
		mpi_check(MPI_Send(tx, (int)size, MPI_BYTE, 1, TAG_PING, MPI_COMM_WORLD), "MPI_Send");
		mpi_check(MPI_Recv(rx, (int)size, MPI_BYTE, 1, TAG_PONG, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
		check(rx, size, pong, "answer", size, it);
	} else {
		mpi_check(MPI_Recv(rx, (int)size, MPI_BYTE, 0, TAG_PING, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
		check(rx, size, ping, "ping", size, it);
		fill(tx, size, pong);
		mpi_check(MPI_Send(tx, (int)size, MPI_BYTE, 0, TAG_PONG, MPI_COMM_WORLD), "MPI_Send");
	}
}

/* One window of w messages of size bytes, seeded by the window's number;
 * on rank 0 it returns the seconds from the first MPI_Isend to the
 * acknowledgement (its writing of the messages not counted; rank 1's
 * checking of them is). */
static double window(unsigned char **bufs, MPI_Request *req, int w, size_t size, long win)
{
	uint32_t ack = (uint32_t)win;
	for (int i = 0; i < w; i++) {
		uint64_t seed = ((uint64_t)size << 40) ^ ((uint64_t)win << 8) ^ (uint64_t)i ^ (1ULL << 63);
		if (rank == 0)
			fill(bufs[i], size, seed);
	}
	double t0 = MPI_Wtime();
	for (int i = 0; i < w; i++) {
		if (rank == 0)
			mpi_check(MPI_Isend(bufs[i], (int)size, MPI_BYTE, 1, TAG_DATA, MPI_COMM_WORLD, &req[i]), "MPI_Isend");
		else
			mpi_check(MPI_Irecv(bufs[i], (int)size, MPI_BYTE, 0, TAG_DATA, MPI_COMM_WORLD, &req[i]), "MPI_Irecv");
	}
	mpi_check(MPI_Waitall(w, req, MPI_STATUSES_IGNORE), "MPI_Waitall");
	if (rank == 0) {
		uint32_t got = 0;
		mpi_check(MPI_Recv(&got, 4, MPI_BYTE, 1, TAG_ACK, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
		if (got != ack) {
			fprintf(stderr, "mpipingpong: rank 0: window %ld acknowledged as %" PRIu32 "\n", win, got);
			MPI_Abort(MPI_COMM_WORLD, 1);
		}
		return MPI_Wtime() - t0;
	}
	for (int i = 0; i < w; i++) {
		uint64_t seed = ((uint64_t)size << 40) ^ ((uint64_t)win << 8) ^ (uint64_t)i ^ (1ULL << 63);
		check(bufs[i], size, seed, "message", size, win);
	}
	mpi_check(MPI_Send(&ack, 4, MPI_BYTE, 0, TAG_ACK, MPI_COMM_WORLD), "MPI_Send");
	return 0;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	long iters = 1000, w = 16, max = 1 << 20;
	for (int i = 1; i < argc; i++) {
		long *p = strcmp(argv[i], "-n") == 0 ? &iters : strcmp(argv[i], "-w") == 0 ? &w : strcmp(argv[i], "-m") == 0 ? &max : NULL;
		if (!p || i + 1 >= argc)
			usage();
		*p = number(argv[++i], 1, p == &max ? 1L << 30 : p == &w ? 1024 : 100000000);
		if (*p < 0)
			usage();
	}
	if (size != 2) {
		if (rank == 0)
			fprintf(stderr, "mpipingpong: %d ranks; it runs with 2\n", size);
		MPI_Finalize();
		return 2;
	}
	unsigned char *tx = malloc((size_t)max), *rx = malloc((size_t)max);
	unsigned char **bufs = calloc((size_t)w, sizeof(*bufs));
	MPI_Request *req = calloc((size_t)w, sizeof(*req));
	if (!tx || !rx || !bufs || !req) {
		fprintf(stderr, "mpipingpong: rank %d: out of memory\n", rank);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	for (long i = 0; i < w; i++)
		if (!(bufs[i] = malloc((size_t)max))) {
			fprintf(stderr, "mpipingpong: rank %d: out of memory\n", rank);
			MPI_Abort(MPI_COMM_WORLD, 1);
		}

	for (size_t s = 0; s <= (size_t)max; s = s ? s * 2 : 1) {
		long n = iters_for(iters, s), warm = n / 10 + 1, it = 0;
		for (; it < warm; it++)
			round_trip(tx, rx, s, it);
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		for (long k = 0; k < n; k++, it++)
			round_trip(tx, rx, s, it);
		double t = MPI_Wtime() - t0;
		if (rank == 0) {
			printf("lat %zu %.2f\n", s, t / (double)n / 2 * 1e6);
			fflush(stdout);
		}
	}
	for (size_t s = 1; s <= (size_t)max; s *= 2) {
		long n = iters_for(iters / 10, s), warm = n / 10 + 1, win = 0;
		for (; win < warm; win++)
			window(bufs, req, (int)w, s, win);
		MPI_Barrier(MPI_COMM_WORLD);
		double t = 0;
		for (long k = 0; k < n; k++, win++)
			t += window(bufs, req, (int)w, s, win);
		if (rank == 0) {
			printf("bw %zu %.2f\n", s, (double)s * (double)w * (double)n / t / 1e6);
			fflush(stdout);
		}
	}
	if (rank == 0)
		printf("mpipingpong: every byte checked\n");
	MPI_Finalize();
	return 0;
}
