/* rt_internal.h: what libibverbs' files share beyond rdmatap_core.h. */
#ifndef RT_INTERNAL_H
#define RT_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "rdmatap_core.h"

#define RT_VISIBLE __attribute__((visibility("default")))

/* Protocol constants (docs/service-protocol.md). */
#define RT_MAGIC 0x72646d6174617000ULL
#define RT_VERSION_NUM 2
#define RT_FEATURE_QUERY_DEVICE 1ULL
#define RT_FEATURE_INLINE_DATA 2ULL
#define RT_FEATURE_LINK 4ULL
#define RT_FEATURE_CM 8ULL
#define RT_FEATURES (RT_FEATURE_QUERY_DEVICE | RT_FEATURE_INLINE_DATA | RT_FEATURE_LINK | RT_FEATURE_CM)

/* The session's control page and doorbell (8.1, 8.4). */
uint32_t *rt_session_ctl(struct rt_session *s);
int rt_session_doorbell(struct rt_session *s);
/* The QUERY_DEVICE reply's arguments (RT_QD_ARGS), or the defaults of
 * the service's limits (protocol 6.1) when it does not offer it. */
const uint64_t *rt_session_limits(struct rt_session *s);
/* One of them: the limits libibverbs' checks are made against. */
uint64_t rt_limit(struct rt_session *s, enum rt_query_device_arg i);
/* HELLO's flags (bit 0: extensions off). */
uint64_t rt_session_flags(struct rt_session *s);

/* rt_ring_doorbell wakes the service's ring poller if it sleeps. */
void rt_ring_doorbell(struct rt_session *s);

/* rt_quiesce_begin and _end bracket a move of program memory: the
 * session's reader thread handles no message meanwhile (on the reader
 * thread itself they do nothing). */
void rt_quiesce_begin(void);
void rt_quiesce_end(void);
/* rt_quiesce_reset makes the lock anew in a child after fork(). */
void rt_quiesce_reset(void);

/* Debug output when RDMATAP_DEBUG is set. */
void rt_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline uint32_t rt_load32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
static inline void rt_store32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }

#endif
