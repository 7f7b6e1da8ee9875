// Kvstore is a small key-value store whose clients GET with one-sided RDMA
// Reads: the server's hash table lives in a registered memory region, the
// client hashes the key, reads the slot straight out of the server's memory
// and checks it; the server's CPU does nothing per GET. PUTs go to the
// server as Sends, so it alone writes the table.
//
//	go run ./examples/kvstore [-keys 2000] [-gets 20000] [-crc]
package main
