// Package pcapread is test support for the iwarp package: a minimal reader
// for classic libpcap files with Ethernet link type, an IPv4/IPv6 + TCP
// decoder, and a TCP stream reassembler. It is deliberately small and only
// handles what packet captures of iWARP traffic need.
package pcapread
