// Filetransfer is the RNIC file transfer: the receiver registers a buffer
// and sends its STag to the sender; the sender registers the file's buffer
// and RDMA Writes it across in one go; the receiver checks a SHA-256
// checksum the sender sends behind the data. No receiver CPU touches the
// data on its way in: DDP places it straight into the registered buffer.
//
//	go run ./examples/filetransfer [-file PATH] [-size 64M] [-crc] [-service]
//
// With -service the sender is a client of its endpoint's service (the
// endpoint served on a unix socket, as `rdmatap up --socket` serves it):
// the same code, with its queues in shared memory.
package main
