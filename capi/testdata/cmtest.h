/*
 * cmtest.h: what the CM test programs share: CHECK, the event channel and
 * its next event, and an end of a connection.
 */
#ifndef CMTEST_H
#define CMTEST_H

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rdma/rdma_cma.h>

#define CHECK(c)                                                                                   \
	do {                                                                                       \
		if (!(c)) {                                                                        \
			fprintf(stderr, "%s:%d: %s failed (errno %d: %s)\n", __FILE__, __LINE__, #c, \
				errno, strerror(errno));                                           \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static struct rdma_event_channel *ch;

/* next waits (poll) for the channel's next event, which must be want on id. */
#define next(want, id) next_at(__LINE__, want, id)
static struct rdma_cm_event *next_at(int line, enum rdma_cm_event_type want, struct rdma_cm_id *id)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct rdma_cm_event *e;
	if (poll(&p, 1, 10000) != 1 || rdma_get_cm_event(ch, &e) != 0) {
		fprintf(stderr, "line %d: no event (waiting for %s): %s\n", line, rdma_event_str(want), strerror(errno));
		exit(1);
	}
	if (e->event != want || (id && e->id != id)) {
		fprintf(stderr, "line %d: got %s (status %d) on %p, want %s on %p\n", line, rdma_event_str(e->event),
			e->status, (void *)e->id, rdma_event_str(want), (void *)id);
		exit(1);
	}
	return e;
}

static void ack(struct rdma_cm_event *e) { CHECK(rdma_ack_cm_event(e) == 0); }

struct end {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char buf[256];
};

#endif
