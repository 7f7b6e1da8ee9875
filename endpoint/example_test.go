package endpoint_test

import (
	"fmt"
	"log"
	"net/netip"
	"os"

	"github.com/rdmatap/rdmatap/endpoint"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// An endpoint on TAP rt0 with the address 10.77.0.3/24, its frames
// captured to a pcap file, then a protection domain on its device. It
// needs CAP_NET_ADMIN, so it is compiled but not run by go test.
func Example() {
	capture, err := os.Create("rt0.pcap")
	if err != nil {
		log.Fatal(err)
	}
	defer capture.Close()
	ep, err := endpoint.Open(endpoint.Config{
		TAP:     "rt0",
		Addr:    netip.MustParsePrefix("10.77.0.3/24"),
		MTU:     9000,
		Capture: capture,
		Stack:   netstack.Config{CongestionControl: "cubic"},
		Device:  verbs.DeviceConfig{Name: "rt0", CRC: true},
	})
	if err != nil {
		log.Fatal(err) // a *endpoint.ConfigError, an *endpoint.TAPError, ...
	}
	defer ep.Close()
	pd, err := ep.Device().AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	defer pd.Close()
	fmt.Println(ep.Addr(), ep.Stats().Link.RxFrames)
}
