// Package interop runs rdmatap against the Linux kernel's SoftiWARP (siw)
// in a qemu VM: rping and perftest, both roles, each siw build.
//
//	sudo RDMATAP_INTEROP=1 go test ./test/interop/ -v -timeout 40m
//
// The VM harness is shared/interop/siw-vm (a sibling of the repository).
// Everything runs inside a network namespace this test creates: the
// harness's bridge sibr0 (10.77.0.1), the VM (10.77.0.2) and rdmatap's TAP
// sitap0 (10.77.0.3); nothing leaves it.
package interop
