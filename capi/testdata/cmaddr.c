/*
 * cmaddr.c: librdmacm's parser of the addresses the service sends
 * (cm_parse_addr, rdmacm/addr.c) on the bytes of stdin. A parsed address
 * must format back to text that parses to the same address.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cm.h"

int main(void)
{
	static uint8_t buf[70000];
	size_t n = fread(buf, 1, sizeof(buf), stdin);
	/* Exactly n bytes on the heap, so that ASan sees any read past them. */
	uint8_t *in = malloc(n ? n : 1);
	if (!in)
		return 1;
	memcpy(in, buf, n);
	struct sockaddr_storage ss, again;
	if (cm_parse_addr(in, n, &ss) == 0) {
		char text[80];
		int len = cm_format_addr((struct sockaddr *)&ss, 0, text, sizeof(text));
		if (len < 0 || cm_parse_addr((const uint8_t *)text, (size_t)len, &again) != 0 ||
		    memcmp(&ss, &again, cm_addr_len((struct sockaddr *)&ss)) != 0) {
			fprintf(stderr, "%.*s does not round-trip (%s)\n", (int)n, (const char *)in, text);
			return 1;
		}
	}
	free(in);
	return 0;
}
