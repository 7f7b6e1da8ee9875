/* cm.h: what librdmacm's files share. */
#ifndef RT_CM_H
#define RT_CM_H

#include <errno.h>

#include <rdma/rdma_cma.h>

/* cm_set_errno sets errno to e and returns -1 (librdmacm's convention). */
static inline int cm_set_errno(int e)
{
	errno = e;
	return -1;
}

/* cm_format_addr writes "IP:PORT" ("[IP]:PORT" for IPv6; ":PORT" for a
 * wildcard address when wildcard_empty) into buf; -1 for another family. */
int cm_format_addr(const struct sockaddr *sa, int wildcard_empty, char *buf, size_t len);

/* cm_parse_addr reads "IP:PORT" or "[IP]:PORT" of n bytes into *ss; -1 if
 * malformed. */
int cm_parse_addr(const uint8_t *s, size_t n, struct sockaddr_storage *ss);

/* cm_addr_len is the size of the sockaddr of sa's family (0: unknown). */
socklen_t cm_addr_len(const struct sockaddr *sa);

/* cm_map_addr applies the address map (RDMATAP_ADDR_MAP, "FROM=TO,..."
 * of IP addresses) to an address a program passes in: an IP that is a
 * FROM becomes its TO, the port kept. 0, or -1 with errno EINVAL when the
 * map is malformed (said once on standard error). */
int cm_map_addr(struct sockaddr_storage *ss);

#endif
