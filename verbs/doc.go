// Package verbs is rdmatap's public RDMA API: device, protection domain,
// memory region (STag), completion queue, queue pair, shared receive queue,
// work requests and completions, and connection management (listen, dial,
// accept and reject with private data and IRD/ORD). It follows the libibverbs
// and librdmacm nouns, with Go idioms on top: every blocking call takes a
// context, errors are typed and work with errors.Is, and the data path
// allocates nothing per operation.
//
// A Device comes from Open (an embedded device on this process's netstack)
// or from Connect (a device a running service offers over a unix socket,
// `rdmatap up --socket`, usable without privileges); the API is the same.
// Package verbs/service is the service side. The split between the two
// (docs/service.md): the slow path goes over the socket, memory is the
// client's own memfd pages, and the queues are rings in shared memory.
package verbs
