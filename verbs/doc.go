// Package verbs is rdmatap's public RDMA API: device, protection domain,
// memory region (STag), completion queue, queue pair, shared receive queue,
// work requests and completions, and connection management (listen, dial,
// accept and reject with private data and IRD/ORD). It follows the libibverbs
// and librdmacm nouns, with Go idioms on top: every blocking call takes a
// context, errors are typed and work with errors.Is, and the data path
// allocates nothing per operation.
package verbs
