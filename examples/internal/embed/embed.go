package embed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// Endpoint is one device with a PD and CQs.
type Endpoint struct {
	Net *netstack.Stack
	Dev *verbs.Device
	PD  *verbs.PD
	SCQ *verbs.CQ
	RCQ *verbs.CQ
}

// Pair returns two endpoints on an in-memory link.
func Pair(crc bool) (a, b *Endpoint, err error) {
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		return nil, nil, err
	}
	mk := func(ns *netstack.Stack, name string) (*Endpoint, error) {
		d, err := verbs.Open(ns, verbs.DeviceConfig{Name: name, CRC: crc})
		if err != nil {
			return nil, err
		}
		e := &Endpoint{Net: ns, Dev: d}
		if e.PD, err = d.AllocPD(); err != nil {
			return nil, err
		}
		if e.SCQ, err = d.CreateCQ(1024); err != nil {
			return nil, err
		}
		if e.RCQ, err = d.CreateCQ(1024); err != nil {
			return nil, err
		}
		return e, nil
	}
	if a, err = mk(na, "rt0"); err != nil {
		return nil, nil, err
	}
	if b, err = mk(nb, "rt1"); err != nil {
		return nil, nil, err
	}
	return a, b, nil
}

// Close releases the endpoint.
func (e *Endpoint) Close() {
	e.Dev.Close()
	if e.Net != nil {
		e.Net.Close()
	}
}

// Served serves e's device on a unix socket in a temporary directory, as
// `rdmatap up --socket` does, and returns an Endpoint whose device is this
// process's connection to that service (verbs.Connect): the same API, with
// its queues in shared memory and the work done by the service. Its
// addresses are e's. stop ends the service.
func Served(e *Endpoint) (client *Endpoint, stop func(), err error) {
	dir, err := os.MkdirTemp("", "rdmatap-example")
	if err != nil {
		return nil, nil, err
	}
	ln, err := service.ListenSocket(filepath.Join(dir, "rt0.sock"), -1)
	if err != nil {
		return nil, nil, err
	}
	srv, err := service.Serve(e.Dev, ln, service.Config{})
	if err != nil {
		return nil, nil, err
	}
	stop = func() { srv.Close(); os.RemoveAll(dir) }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := verbs.Connect(ctx, filepath.Join(dir, "rt0.sock"))
	if err != nil {
		stop()
		return nil, nil, err
	}
	c := &Endpoint{Dev: d}
	if c.PD, err = d.AllocPD(); err == nil {
		if c.SCQ, err = d.CreateCQ(1024); err == nil {
			c.RCQ, err = d.CreateCQ(1024)
		}
	}
	if err != nil {
		d.Close()
		stop()
		return nil, nil, err
	}
	return c, stop, nil
}

// QP makes a QP on the endpoint's CQs.
func (e *Endpoint) QP(cfg verbs.QPConfig) (*verbs.QP, error) {
	cfg.SendCQ, cfg.RecvCQ = e.SCQ, e.RCQ
	return e.PD.CreateQP(cfg)
}

// Addr returns the endpoint's address with port.
func (e *Endpoint) Addr(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(e.Net.Addrs()[0].Addr(), port)
}

// Wait waits for one completion on cq and fails on an error status.
func Wait(cq *verbs.CQ) (verbs.WC, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wc [1]verbs.WC
	if _, err := cq.Wait(ctx, wc[:]); err != nil {
		return verbs.WC{}, fmt.Errorf("waiting for a completion: %w", err)
	}
	return wc[0], wc[0].Err()
}
