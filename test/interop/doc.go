// Package interop runs rdmatap against the Linux kernel's SoftiWARP (siw)
// in a qemu VM: rping and perftest, both roles, each siw build
// (TestSiwInterop); the six perftest programs over perftest's whole size
// sweep, both roles, CRC off and on (TestSiwPerftest); and a C probe
// (probe/probe.c, built on the host against Debian's rdma-core and run in
// the VM) against rdmatap's probepeer for the verbs rping and perftest
// never use (TestSiwProbe); rdmatap's tools as an unprivileged client of
// `rdmatap up --socket` (TestSiwViaService); and Debian's RDMA programs,
// unmodified, on rdmatap's C libraries through such a service against the
// same programs on siw (TestSiwPrograms); and rdma-core's Python test
// suite on siw beside capi's run of it on rdmatap (TestSiwPyverbs).
// README.md has the tables of the last run.
//
//	sudo RDMATAP_INTEROP=1 go test -count=1 ./test/interop/ -v -timeout 40m
//
// The VM harness is siw-vm/ in this directory (siw-vm/README.md: build,
// boot, captures); guest/plan.sh is the guest side of the sweep and the probe (boot.sh
// --script). Everything runs inside a network namespace this test
// creates: the harness's bridge sibr0 (10.77.0.1), the VM (10.77.0.2) and
// rdmatap's TAP sitap0 (10.77.0.3); nothing leaves it.
//
// RDMATAP_INTEROP_OUT=DIR keeps each VM's results (logs, perftest output)
// there; RDMATAP_INTEROP_PCAP=1 adds header-only captures of each cell;
// RDMATAP_INTEROP_SWEEP=short runs one size instead of the sweep;
// RDMATAP_INTEROP_OURPCAP=1 has rdmatap capture its whole frames too
// (perftest cells, NAME.rdmatap.pcap); RDMATAP_INTEROP_ONLY=read_lat,...
// and RDMATAP_INTEROP_REPEAT=N run only the perftest cells named, each N
// times in one boot; RDMATAP_INTEROP_NICRESET=1 resets the VM's NIC
// before every perftest cell but the first, to check that reset (which
// the VM does by itself when its NIC stops transmitting);
// RDMATAP_INTEROP_PROGRAMS=rping,qperf-siw,... runs only the
// TestSiwPrograms cells whose names begin so.
package interop
