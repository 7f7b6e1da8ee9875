/*
 * decode.c: the session's message decoder on bytes from stdin, for capi's
 * fuzz test. The bytes go as one datagram over a socketpair into
 * recv_msg; a message it takes has its fields walked and its status
 * mapped. Exits 0 unless a check fails (or a sanitizer finds a fault).
 */
#include "session.c"

int main(void)
{
	static uint8_t in[2 * RT_MAX_MSG];
	size_t n = fread(in, 1, sizeof(in), stdin);
	if (n == 0)
		return 0; /* an empty datagram is the end of the session */
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0)
		return 2;
	if (send(sv[0], in, n, 0) != (ssize_t)n)
		return 0; /* too long for the socket */
	static struct rt_msg m;
	if (recv_msg(sv[1], &m) < 0)
		return 0;
	if (m.nargs > RT_MAX_ARGS || m.payload_len > RT_MAX_MSG || m.nfds != 0 ||
	    (size_t)RT_HDR_SIZE + 8u * m.nargs + m.payload_len != n)
		return 1;
	for (unsigned i = 0;; i++) {
		const uint8_t *d;
		uint16_t l;
		if (rt_msg_field(&m, i, &d, &l) < 0)
			break;
		if (d < m.payload || d + l > m.payload + m.payload_len)
			return 1;
		volatile uint8_t sink = 0;
		for (uint16_t k = 0; k < l; k++)
			sink ^= d[k];
		(void)sink;
	}
	int e = rt_msg_errno(&m);
	if ((m.status == 0) != (e == 0))
		return 1;
	return 0;
}
