//go:build tools

// Package tools pins gVisor's checklocks analyzer (and golang.org/x/tools,
// which it needs) outside rdmatap's own module, at the gVisor version
// go.mod names. .ci/run builds it and runs it over ./...
package tools

import _ "gvisor.dev/gvisor/tools/checklocks/cmd/checklocks"
