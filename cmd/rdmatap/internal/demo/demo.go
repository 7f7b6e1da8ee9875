// Package demo is `rdmatap demo`: two endpoints in one process over an
// in-memory link, Send/Recv, RDMA Write and RDMA Read with every byte
// verified, and the placement lab's reports.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"text/tabwriter"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/internal/units"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

func init() {
	cli.Register("demo", "two endpoints in this process over an in-memory link (no root):\n"+
		"            Send/Recv, RDMA Write and RDMA Read, every byte verified", demoCmd)
}

// parseSize parses "4096", "64K", "1M", "1G" (binary units), at most 1G.
func parseSize(s string) (int, error) {
	n, err := units.ParseBytes(s, 1<<30)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", cli.ErrUsage, err)
	}
	return int(n), nil
}

type DemoOpts struct {
	Size, Iters int
	crc         bool
	markers     bool
	pcap        string
	mtu         int
	MpaRev      int
	p2p         string
	lab         cli.LabFlags
}

func demoCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o DemoOpts
	size := fs.String("size", "64K", "message size in bytes (K, M, G suffixes), 0 to 1G")
	fs.IntVar(&o.Iters, "iters", 1000, "iterations per operation")
	fs.BoolVar(&o.crc, "crc", false, "negotiate MPA CRC32c")
	fs.BoolVar(&o.markers, "markers", false, "negotiate MPA markers, both directions")
	fs.StringVar(&o.pcap, "pcap", "", "write the link's frames to this pcap file")
	fs.IntVar(&o.mtu, "mtu", 1500, "link MTU (the link carries 64 KB GSO super-segments)")
	fs.IntVar(&o.MpaRev, "mpa-rev", 2, "MPA revision, 1 or 2")
	fs.StringVar(&o.p2p, "p2p", "", "peer-to-peer mode with this RTR: write, read or send")
	o.lab.Register(fs, cli.DemoLabHelp)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "usage: rdmatap demo [flags]\n\nTwo endpoints in one process over an in-memory link; no root needed.\n\n")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return err
		}
		return fmt.Errorf("%w: %v (see rdmatap demo -h)", cli.ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", cli.ErrUsage, fs.Arg(0))
	}
	var err error
	if o.Size, err = parseSize(*size); err != nil {
		return err
	}
	if o.Iters < 1 || o.Iters > 100_000_000 {
		return fmt.Errorf("%w: --iters must be 1..100000000", cli.ErrUsage)
	}
	if o.mtu < 576 || o.mtu > 65535 {
		return fmt.Errorf("%w: --mtu must be 576..65535", cli.ErrUsage)
	}
	if o.MpaRev != 1 && o.MpaRev != 2 {
		return fmt.Errorf("%w: --mpa-rev must be 1 or 2", cli.ErrUsage)
	}
	var rtr verbs.RTR
	switch o.p2p {
	case "":
	case "write":
		rtr = verbs.RTRWrite
	case "read":
		rtr = verbs.RTRRead
	case "send":
		rtr = verbs.RTRSend
	default:
		return fmt.Errorf("%w: --p2p must be write, read or send", cli.ErrUsage)
	}
	if rtr != 0 && o.MpaRev != 2 {
		return fmt.Errorf("%w: --p2p needs --mpa-rev 2", cli.ErrUsage)
	}
	if err := o.lab.Check(); err != nil {
		return err
	}
	return runDemo(o, rtr, stdout)
}

// DemoEnds are the two endpoints of the demo.
type DemoEnds struct {
	qpA, qpB     *verbs.QP
	scqA, rcqA   *verbs.CQ
	scqB, rcqB   *verbs.CQ
	srcA, rdstA  *verbs.MR // A: source of Send/Write, destination of Read
	dstB, rsrcB  *verbs.MR // B: destination of Send/Write, source of Read
	remB         verbs.RemoteBuf
	Slots, Size  int
	Wc           []verbs.WC
	Posted       []time.Time
	latSum       time.Duration
	latN         int
	verifiedMsgs int
}

func runDemo(o DemoOpts, rtr verbs.RTR, stdout io.Writer) error {
	var capture *bufio.Writer
	var pcapFile *os.File
	var pcapA io.Writer
	if o.pcap != "" {
		f, err := os.Create(o.pcap)
		if err != nil {
			return fmt.Errorf("--pcap: %w", err)
		}
		pcapFile = f
		capture = bufio.NewWriterSize(f, 1<<20)
		pcapA = capture
	}
	na, nb, im, err := cli.LabPair(netstack.LinkConfig{MTU: uint32(o.mtu)}, pcapA, &o.lab)
	if err != nil {
		return err
	}
	defer func() {
		na.Close()
		nb.Close()
		if capture != nil {
			capture.Flush()
			pcapFile.Close()
		}
	}()
	devA, err := verbs.Open(na, verbs.DeviceConfig{Name: "rt0", Markers: o.markers, Placement: o.lab.Mode})
	if err != nil {
		return err
	}
	defer devA.Close()
	devB, err := verbs.Open(nb, verbs.DeviceConfig{Name: "rt1", Markers: o.markers, Placement: o.lab.Mode})
	if err != nil {
		return err
	}
	defer devB.Close()

	// Slots in flight per round: enough to fill the pipe, at most 16 MiB.
	slots := 16
	if o.Size > 0 {
		slots = min(16, max(1, (16<<20)/o.Size))
	}
	e := &DemoEnds{Slots: slots, Size: o.Size, Wc: make([]verbs.WC, 64), Posted: make([]time.Time, slots)}
	if err := e.Setup(devA, devB, o, rtr); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rdmatap demo: two endpoints in one process, in-memory link (MTU %d, 64 KB GSO segments)\n", o.mtu)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\tbytes\titerations\tGbit/s\tMiB/s\tavg latency (µs)\tverified\t")
	var tcpLines []string // with impairment: what TCP did during each operation
	for _, op := range []struct {
		name string
		run  func(int) error
	}{
		{"SEND/RECV", e.sendRound},
		{"RDMA WRITE", e.WriteRound},
		{"RDMA READ", e.readRound},
	} {
		e.latSum, e.latN, e.verifiedMsgs = 0, 0, 0
		tcpA, tcpB := devA.Stats().TCP, devB.Stats().TCP
		start := time.Now()
		for done := 0; done < o.Iters; {
			k := min(e.Slots, o.Iters-done)
			if err := op.run(k); err != nil {
				return fmt.Errorf("%s: %w", op.name, err)
			}
			done += k
		}
		el := time.Since(start).Seconds()
		bytesMoved := float64(o.Size) * float64(o.Iters)
		lat := 0.0
		if e.latN > 0 {
			lat = float64(e.latSum.Microseconds()) / float64(e.latN)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.1f\t%.1f\t%d/%d\t\n", op.name, o.Size, o.Iters,
			bytesMoved*8/el/1e9, bytesMoved/el/(1<<20), lat, e.verifiedMsgs, o.Iters)
		if im != nil {
			tcpLines = append(tcpLines, fmt.Sprintf("%s, A %s", op.name, cli.TCPReport(tcpA, devA.Stats().TCP)),
				fmt.Sprintf("%s, B %s", op.name, cli.TCPReport(tcpB, devB.Stats().TCP)))
		}
	}
	tw.Flush()
	for _, l := range tcpLines {
		fmt.Fprintln(stdout, l)
	}
	st := devA.Stats()
	fmt.Fprintf(stdout, "MPA rev %d, CRC %v, peer-to-peer %v; endpoint A sent %d FPDUs, received %d (%d placement copies, %d CRC errors)\n",
		o.MpaRev, o.crc, rtr != 0, st.TxFPDUs, st.RxFPDUs, st.PlacementCopies, st.CRCErrors)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.qpA.Disconnect(ctx); err != nil {
		return fmt.Errorf("disconnect: %w", err)
	}
	if im != nil {
		fmt.Fprintln(stdout, cli.ImpairReport(im, "A's transmit side", &o.lab))
	}
	fmt.Fprintln(stdout, cli.PlacementReport(o.lab.Mode, "endpoint B (receiver of Sends and Writes)", cli.SettledStats(devB)))
	if o.lab.Mode == verbs.PlacementSegment && im != nil && !o.crc && !o.markers {
		fmt.Fprintln(stdout, "  (FPDUs beyond a hole are framed by the MPA CRC or by markers: add --crc or --markers to place them out of order)")
	}
	if o.pcap != "" {
		fmt.Fprintf(stdout, "capture written to %s\n", o.pcap)
	}
	return nil
}

func (e *DemoEnds) Setup(devA, devB *verbs.Device, o DemoOpts, rtr verbs.RTR) error {
	pdA, err := devA.AllocPD()
	if err != nil {
		return err
	}
	pdB, err := devB.AllocPD()
	if err != nil {
		return err
	}
	mk := func(d *verbs.Device) (*verbs.CQ, error) { return d.CreateCQ(4 * e.Slots) }
	if e.scqA, err = mk(devA); err != nil {
		return err
	}
	if e.rcqA, err = mk(devA); err != nil {
		return err
	}
	if e.scqB, err = mk(devB); err != nil {
		return err
	}
	if e.rcqB, err = mk(devB); err != nil {
		return err
	}
	qc := verbs.QPConfig{MaxSendWR: 2 * e.Slots, MaxRecvWR: 2 * e.Slots}
	qc.SendCQ, qc.RecvCQ = e.scqA, e.rcqA
	if e.qpA, err = pdA.CreateQP(qc); err != nil {
		return err
	}
	qc.SendCQ, qc.RecvCQ = e.scqB, e.rcqB
	if e.qpB, err = pdB.CreateQP(qc); err != nil {
		return err
	}
	n := e.Slots * e.Size
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
	reg := func(pd *verbs.PD, seed uint64) (*verbs.MR, error) {
		b := make([]byte, n)
		if seed != 0 {
			r := rand.New(rand.NewPCG(seed, seed*7))
			for i := range b {
				b[i] = byte(r.Uint32())
			}
		} else {
			// Fault the pages in now, as registering memory pins it on
			// an RNIC: otherwise the first round of each operation pays
			// for them and few iterations understate its throughput.
			for i := 0; i < len(b); i += 4096 {
				b[i] = 0
			}
		}
		return pd.RegMR(b, acc)
	}
	if e.srcA, err = reg(pdA, 1); err != nil {
		return err
	}
	if e.rdstA, err = reg(pdA, 0); err != nil {
		return err
	}
	if e.dstB, err = reg(pdB, 0); err != nil {
		return err
	}
	if e.rsrcB, err = reg(pdB, 2); err != nil {
		return err
	}
	l, err := devB.Listen(netip.AddrPort{}, verbs.ListenConfig{})
	if err != nil {
		return err
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	params := verbs.ConnParams{CRC: &o.crc, Markers: &o.markers, MPARevision: uint8(o.MpaRev)}
	if rtr != 0 {
		yes := true
		params.PeerToPeer, params.RTR = &yes, rtr
	}
	type res struct {
		c   *verbs.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		sp := params
		sp.PrivateData, _ = e.rsrcB.Remote().MarshalBinary()
		c, err := l.Accept(ctx, e.qpB, sp)
		ch <- res{c, err}
	}()
	raddr := netip.AddrPortFrom(devB.Netstack().Addrs()[0].Addr(), l.Addr().Port())
	conn, err := devA.Dial(ctx, e.qpA, raddr, params)
	if err != nil {
		return err
	}
	r := <-ch
	if r.err != nil {
		return r.err
	}
	return e.remB.UnmarshalBinary(conn.PeerPrivateData())
}

func (e *DemoEnds) slot(mr *verbs.MR, i int) []byte { return mr.Bytes()[i*e.Size : (i+1)*e.Size] }

// waitN collects n completions from cq, calling fn for each.
func (e *DemoEnds) waitN(cq *verbs.CQ, n int, fn func(verbs.WC) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for n > 0 {
		k, err := cq.Wait(ctx, e.Wc[:min(n, len(e.Wc))])
		if err != nil {
			return fmt.Errorf("waiting for completions: %w", err)
		}
		for _, wc := range e.Wc[:k] {
			if wc.Status != verbs.StatusSuccess {
				return wc.Err()
			}
			if fn != nil {
				if err := fn(wc); err != nil {
					return err
				}
			}
		}
		n -= k
	}
	return nil
}

func (e *DemoEnds) verify(got, want []byte, what string, i int) error {
	if !bytes.Equal(got, want) {
		return fmt.Errorf("%s slot %d: data mismatch", what, i)
	}
	clear(got)
	e.verifiedMsgs++
	return nil
}

func (e *DemoEnds) lat(i int) {
	e.latSum += time.Since(e.Posted[i])
	e.latN++
}

// sendRound: B posts k receives, A sends k messages, B checks each.
func (e *DemoEnds) sendRound(k int) error {
	for i := 0; i < k; i++ {
		sg := []verbs.SGE{e.dstB.SGE(i*e.Size, e.Size)}
		if err := e.qpB.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: sg}); err != nil {
			return err
		}
	}
	for i := 0; i < k; i++ {
		e.Posted[i] = time.Now()
		sg := []verbs.SGE{e.srcA.SGE(i*e.Size, e.Size)}
		if err := e.qpA.PostSend(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Flags: verbs.Signaled, SGL: sg}); err != nil {
			return err
		}
	}
	if err := e.waitN(e.rcqB, k, func(wc verbs.WC) error {
		i := int(wc.ID)
		e.lat(i)
		if int(wc.ByteLen) != e.Size {
			return fmt.Errorf("received %d bytes, sent %d", wc.ByteLen, e.Size)
		}
		return e.verify(e.slot(e.dstB, i), e.slot(e.srcA, i), "send", i)
	}); err != nil {
		return err
	}
	return e.waitN(e.scqA, k, nil)
}

// WriteRound: A writes k slots into B and sends a marker; when B has the
// marker, RDMAP ordering guarantees the Writes were placed.
func (e *DemoEnds) WriteRound(k int) error {
	if err := e.qpB.PostRecv(verbs.RecvWR{ID: 1 << 32}); err != nil {
		return err
	}
	rem := e.dstB.Remote()
	for i := 0; i < k; i++ {
		e.Posted[i] = time.Now()
		sg := []verbs.SGE{e.srcA.SGE(i*e.Size, e.Size)}
		wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpWrite, Flags: verbs.Signaled, SGL: sg,
			RemoteAddr: rem.Addr + uint64(i*e.Size), RKey: rem.RKey}
		if err := e.qpA.PostSend(wr); err != nil {
			return err
		}
	}
	if err := e.qpA.PostSend(verbs.SendWR{ID: 1 << 32, Op: verbs.OpSend, Flags: verbs.Signaled}); err != nil {
		return err
	}
	if err := e.waitN(e.rcqB, 1, nil); err != nil {
		return err
	}
	for i := 0; i < k; i++ {
		e.lat(i)
		if err := e.verify(e.slot(e.dstB, i), e.slot(e.srcA, i), "write", i); err != nil {
			return err
		}
	}
	return e.waitN(e.scqA, k+1, nil)
}

// readRound: A reads k slots of B's read source into its own MR.
func (e *DemoEnds) readRound(k int) error {
	for i := 0; i < k; i++ {
		e.Posted[i] = time.Now()
		sg := []verbs.SGE{e.rdstA.SGE(i*e.Size, e.Size)}
		wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpRead, Flags: verbs.Signaled, SGL: sg,
			RemoteAddr: e.remB.Addr + uint64(i*e.Size), RKey: e.remB.RKey}
		if err := e.qpA.PostSend(wr); err != nil {
			return err
		}
	}
	return e.waitN(e.scqA, k, func(wc verbs.WC) error {
		i := int(wc.ID)
		e.lat(i)
		return e.verify(e.slot(e.rdstA, i), e.slot(e.rsrcB, i), "read", i)
	})
}
