// Package service offers an embedded device (verbs.Open) to other
// processes on a unix socket: they open it with verbs.Connect and use it
// through the same verbs API as their own, without privileges, while this
// process owns the TAP device and the netstack. `rdmatap up --socket`
// runs it; a program that embeds the device serves it with Serve.
//
// Each client's objects are its own (handles of another client name
// nothing), bounded by Limits, and released when it goes, however it
// goes. The work requests and completions cross in rings of shared
// memory, and the client's memory is registered in place: nothing is
// copied between the processes. docs/service.md describes the design and
// docs/service-protocol.md the wire format.
package service
