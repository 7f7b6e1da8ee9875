package service_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// A program that embeds a device serves it to other processes: a socket
// in a directory of its own (ListenSocket refuses one that others could
// replace), Serve with the limits each client gets, and Close when done,
// which ends the clients' sessions. A client opens the device with
// verbs.Connect (here in the same process) and uses it as its own; its
// memory for MRs comes from AllocBuffer (a memfd the service maps too).
func ExampleServe() {
	ns, peer, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer ns.Close()
	defer peer.Close()
	dev, err := verbs.Open(ns, verbs.DeviceConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	dir, err := os.MkdirTemp("", "rdmatap-service")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "rt0.sock")
	ln, err := service.ListenSocket(path, -1) // -1: no group of its own
	if err != nil {
		log.Fatal(err)
	}
	srv, err := service.Serve(dev, ln, service.Config{
		Limits:     service.Limits{QPs: 64, MRBytes: 64 << 20},
		MaxClients: 16,
		Logf:       func(string, ...any) {}, // or log.Printf
	})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	// A client.
	d, err := verbs.Connect(context.Background(), path)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	pd, _ := d.AllocPD()
	buf, _ := d.AllocBuffer(1 << 20)
	defer buf.Close()
	mr, err := pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Dereg()
	_, err = pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite)
	fmt.Println("Go memory:", err)

	for _, c := range srv.ClientStats() {
		fmt.Printf("client: %d PD, %d MiB registered (limit %d MiB)\n", c.PDs, c.MRBytes>>20, 64)
	}
	// Output:
	// Go memory: verbs: memory for a device of a service must come from zerocopy.AllocShared
	// client: 1 PD, 1 MiB registered (limit 64 MiB)
}
