package ping

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/cmd/rdmatap/internal/cli"
	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
)

// These are real rping (rdma-core 44.0) client lines against Linux siw,
// from testdata/siw-pcaps/logs/lo-stock-rping-client.log
// (rping -c -a 10.77.0.2 -v -C 5).
var rpingClientLog = []string{
	"ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr",
	"ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs",
	"ping data: rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst",
	"ping data: rdma-ping-3: DEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstu",
	"ping data: rdma-ping-4: EFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuv",
}

// expectedPing is rping's data for ping i of size bytes, written
// independently of rpingFill: the header, then characters from 'A'+i%58
// on, cycling through 'A'..'z', up to size-1 bytes.
func expectedPing(i, size int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rdma-ping-%d: ", i)
	for c := i % 58; b.Len() < size-1; c = (c + 1) % 58 {
		b.WriteByte(byte('A' + c))
	}
	return b.String()[:size-1]
}

// syncBuf is a bytes.Buffer safe for a writer and a later reader.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuf) lines() []string {
	t := strings.TrimSuffix(s.String(), "\n")
	if t == "" {
		return nil
	}
	return strings.Split(t, "\n")
}

func pingEnds(t *testing.T) (cl, sv *cli.Endpoint) {
	t.Helper()
	a, b, err := cli.EmbeddedPair(verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// opts parses rping-style arguments as the command does.
func opts(t *testing.T, args ...string) pingOpts {
	t.Helper()
	o, _, err := ParsePingFlags(args, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("%q: %v", args, err)
	}
	return o
}

type pingSide struct {
	out, errOut syncBuf
	done        chan error
}

// startServer runs a server on sv and returns once it listens.
func startServer(t *testing.T, ctx context.Context, sv *cli.Endpoint, o pingOpts) *pingSide {
	t.Helper()
	s := &pingSide{done: make(chan error, 1)}
	ready := make(chan struct{})
	o.listening = func(netip.AddrPort) { close(ready) }
	go func() { s.done <- runPing(ctx, sv.Dev, o, &s.out, &s.errOut) }()
	select {
	case <-ready:
	case err := <-s.done:
		t.Fatalf("server: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("server does not listen")
	}
	return s
}

func runClient(cl *cli.Endpoint, o pingOpts) (*pingSide, error) {
	s := &pingSide{}
	err := runPing(context.Background(), cl.Dev, o, &s.out, &s.errOut)
	return s, err
}

func waitServer(t *testing.T, s *pingSide) error {
	t.Helper()
	select {
	case err := <-s.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("server did not finish")
		return nil
	}
}

// TestPingOutputMatchesRping: 50 validated pings at several sizes; the
// client's and the server's -v lines and stderr lines are rping's.
func TestPingOutputMatchesRping(t *testing.T) {
	b, err := os.ReadFile("../../../../testdata/siw-pcaps/logs/lo-stock-rping-client.log")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), strings.Join(rpingClientLog, "\n")+"\n") {
		t.Fatalf("the siw log differs from the lines this test has:\n%s", b)
	}
	for _, size := range []string{"", "23", "4096", "16384", "65535"} {
		t.Run("S="+size, func(t *testing.T) {
			cl, sv := pingEnds(t)
			sargs, cargs := []string{"-s", "-v"}, []string{"-c", "-a", sv.Addr.String(), "-C", "50", "-V", "-v"}
			n := rpingDefaultSize
			if size != "" {
				sargs = append(sargs, "-S", size)
				cargs = append(cargs, "-S", size)
				fmt.Sscan(size, &n)
			}
			var negotiated []verbs.Negotiated
			var mu sync.Mutex
			so := opts(t, sargs...)
			so.connected = func(c *verbs.Conn) { mu.Lock(); negotiated = append(negotiated, c.Negotiated()); mu.Unlock() }
			srv := startServer(t, context.Background(), sv, so)
			co := opts(t, cargs...)
			co.connected = so.connected
			c, err := runClient(cl, co)
			if err != nil {
				t.Fatalf("client: %v\nstderr: %s", err, c.errOut.String())
			}
			if err := waitServer(t, srv); err != nil {
				t.Fatalf("server: %v", err)
			}
			got, sgot := c.out.lines(), srv.out.lines()
			if len(got) != 50 || len(sgot) != 50 {
				t.Fatalf("client printed %d lines, server %d, want 50", len(got), len(sgot))
			}
			for i := range got {
				want := "ping data: " + expectedPing(i, n)
				if got[i] != want {
					t.Fatalf("client line %d:\n got %q\nwant %q", i, got[i], want)
				}
				if sgot[i] != "server "+want {
					t.Fatalf("server line %d:\n got %q\nwant %q", i, sgot[i], "server "+want)
				}
				if n == rpingDefaultSize && i < len(rpingClientLog) && got[i] != rpingClientLog[i] {
					t.Fatalf("line %d differs from real rping:\n got %q\nwant %q", i, got[i], rpingClientLog[i])
				}
			}
			// rping's stderr lines (in the siw logs too).
			if e := c.errOut.String(); e != "client DISCONNECT EVENT...\n" {
				t.Errorf("client stderr %q", e)
			}
			if e := srv.errOut.String(); e != "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n" {
				t.Errorf("server stderr %q", e)
			}
			// IRD=1 ORD=1 on both ends, as rping over siw.
			for _, ng := range negotiated {
				if ng.IRD != 1 || ng.ORD != 1 {
					t.Errorf("negotiated IRD %d ORD %d, want 1/1", ng.IRD, ng.ORD)
				}
			}
			if len(negotiated) != 2 {
				t.Errorf("%d connections seen, want 2", len(negotiated))
			}
		})
	}
}

// TestPingWireSequence checks the RDMAP messages of each ping against the
// siw capture README: the client sends 2 Sends and a Read Response, and
// receives a Read Request, an RDMA Write and 2 Sends.
func TestPingWireSequence(t *testing.T) {
	cl, sv := pingEnds(t)
	srv := startServer(t, context.Background(), sv, opts(t, "-s"))
	const pings = 7
	c, err := runClient(cl, opts(t, "-c", "-a", sv.Addr.String(), "-C", fmt.Sprint(pings), "-V"))
	if err != nil {
		t.Fatalf("client: %v (%s)", err, c.errOut.String())
	}
	if err := waitServer(t, srv); err != nil {
		t.Fatal(err)
	}
	if len(c.out.lines()) != 0 || len(srv.out.lines()) != 0 {
		t.Fatalf("output without -v: %q %q", c.out.String(), srv.out.String())
	}
	type count struct {
		op     iwarp.Opcode
		tx, rx uint64
	}
	for _, side := range []struct {
		name string
		dev  *verbs.Device
		want []count
	}{
		{"client", cl.Dev, []count{{iwarp.OpSend, 2, 2}, {iwarp.OpReadRequest, 0, 1}, {iwarp.OpReadResponse, 1, 0}, {iwarp.OpWrite, 0, 1}}},
		{"server", sv.Dev, []count{{iwarp.OpSend, 2, 2}, {iwarp.OpReadRequest, 1, 0}, {iwarp.OpReadResponse, 0, 1}, {iwarp.OpWrite, 1, 0}}},
	} {
		st := side.dev.Stats()
		var tx, rx uint64
		for _, w := range side.want {
			if st.TxOps[w.op] != w.tx*pings || st.RxOps[w.op] != w.rx*pings {
				t.Errorf("%s %v: sent %d received %d, want %d and %d", side.name, w.op, st.TxOps[w.op], st.RxOps[w.op], w.tx*pings, w.rx*pings)
			}
			tx += w.tx * pings
			rx += w.rx * pings
		}
		var atx, arx uint64
		for i := range st.TxOps {
			atx += st.TxOps[i]
			arx += st.RxOps[i]
		}
		if atx != tx || arx != rx || st.TerminatesSent+st.TerminatesReceived != 0 {
			t.Errorf("%s: %d messages sent, %d received, %d+%d terminates; want %d and %d, none", side.name, atx, arx,
				st.TerminatesSent, st.TerminatesReceived, tx, rx)
		}
	}
}

// TestPingValidationFailure: a server that echoes wrong data makes a -V
// client fail with rping's "data mismatch!".
func TestPingValidationFailure(t *testing.T) {
	cl, sv := pingEnds(t)
	so := opts(t, "-s")
	so.corrupt = func(ping int, data []byte) {
		if ping == 3 {
			data[20] ^= 0x20
		}
	}
	srv := startServer(t, context.Background(), sv, so)
	c, err := runClient(cl, opts(t, "-c", "-a", sv.Addr.String(), "-C", "10", "-V", "-v"))
	if err == nil || !strings.Contains(err.Error(), "data mismatch!") || errors.Is(err, cli.ErrUsage) {
		t.Fatalf("client error %v, want data mismatch!", err)
	}
	if !strings.HasPrefix(err.Error(), "rping client failed: data mismatch! (ping 3: byte 20") || strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q", err)
	}
	if n := len(c.out.lines()); n != 3 {
		t.Errorf("client printed %d pings before the bad one, want 3", n)
	}
	if err := waitServer(t, srv); err != nil {
		t.Errorf("server: %v", err)
	}
	// Without -V the same corruption goes unnoticed, as in rping.
	cl2, sv2 := pingEnds(t)
	srv = startServer(t, context.Background(), sv2, so)
	c, err = runClient(cl2, opts(t, "-c", "-a", sv2.Addr.String(), "-C", "5", "-v"))
	if err != nil {
		t.Fatal(err)
	}
	if l := c.out.lines(); len(l) != 5 || l[3] == "ping data: "+expectedPing(3, 64) {
		t.Errorf("lines %q", l)
	}
	waitServer(t, srv)
}

// TestPingPersistentServer: -P serves clients one after another until
// killed; a non-persistent server serves one and exits.
func TestPingPersistentServer(t *testing.T) {
	cl, sv := pingEnds(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var finished []error
	so := opts(t, "-s", "-P", "-v")
	so.finished = func(_ *verbs.Conn, err error) { mu.Lock(); finished = append(finished, err); mu.Unlock() }
	srv := startServer(t, ctx, sv, so)
	for k := 0; k < 2; k++ {
		c, err := runClient(cl, opts(t, "-c", "-a", sv.Addr.String(), "-C", "5", "-V", "-v"))
		if err != nil {
			t.Fatalf("client %d: %v", k, err)
		}
		if n := len(c.out.lines()); n != 5 {
			t.Fatalf("client %d: %d lines", k, n)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := len(finished)
		mu.Unlock()
		if n == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-srv.done:
		t.Fatalf("persistent server ended: %v", err)
	default:
	}
	cancel()
	if err := waitServer(t, srv); err != nil {
		t.Fatalf("killed persistent server: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(finished) != 2 || finished[0] != nil || finished[1] != nil {
		t.Fatalf("connections ended with %v", finished)
	}
	if n := len(srv.out.lines()); n != 10 {
		t.Errorf("server printed %d lines, want 10", n)
	}
	if got := strings.Count(srv.errOut.String(), "server DISCONNECT EVENT...\n"); got != 2 {
		t.Errorf("server stderr %q", srv.errOut.String())
	}

	// Without -P the server exits after its client, and a second client
	// is refused.
	cl2, sv2 := pingEnds(t)
	srv = startServer(t, context.Background(), sv2, opts(t, "-s"))
	if _, err := runClient(cl2, opts(t, "-c", "-a", sv2.Addr.String(), "-C", "2")); err != nil {
		t.Fatal(err)
	}
	if err := waitServer(t, srv); err != nil {
		t.Fatal(err)
	}
	if _, err := runClient(cl2, opts(t, "-c", "-a", sv2.Addr.String(), "-C", "2")); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("second client: %v", err)
	}
}

// TestPingPeerErrors: no server, a server that never answers, and
// mismatched sizes give one-line errors naming the peer.
func TestPingPeerErrors(t *testing.T) {
	cl, sv := pingEnds(t)
	addr := sv.Addr.String()
	_, err := runClient(cl, opts(t, "-c", "-a", addr, "-C", "1"))
	want := "rdma_connect: connection refused by " + addr + ":7174"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("no server: %v, want %q...", err, want)
	}

	// A TCP listener that never sends an MPA Reply.
	l, err := sv.Net.Listen(netip.AddrPortFrom(netip.Addr{}, 7999), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = runClient(cl, opts(t, "-c", "-a", addr, "-p", "7999", "--timeout", "300ms"))
	want = "rdma_connect: timeout: no answer from " + addr + ":7999 within 300ms"
	if err == nil || err.Error() != want {
		t.Errorf("silent peer: %v, want %q", err, want)
	}

	// A client bigger than the server's -S: the server refuses to Read
	// past its buffer and the client hears the disconnect.
	srv := startServer(t, context.Background(), sv, opts(t, "-s"))
	_, err = runClient(cl, opts(t, "-c", "-a", addr, "-S", "100", "--timeout", "2s"))
	if err == nil || !strings.Contains(err.Error(), "server "+addr+":7174 disconnected") {
		t.Errorf("big client: %v", err)
	}
	if err := waitServer(t, srv); err == nil || !strings.Contains(err.Error(), "advertised 100 bytes, more than this server's -S 64") {
		t.Errorf("server with a big client: %v", err)
	}
}

func TestPingBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"ping"},
		{"ping", "-s", "-c"},
		{"ping", "-c"},
		{"ping", "-c", "-a", "rdma-server.example"},
		{"ping", "-c", "-a", "0.0.0.0"},
		{"ping", "-c", "-P", "-a", "192.0.2.2"},
		{"ping", "-s", "-S", "22"},
		{"ping", "-s", "-S", "65536"},
		{"ping", "-s", "-S", "big"},
		{"ping", "-s", "-C", "-1"},
		{"ping", "-s", "-p", "0"},
		{"ping", "-s", "-p", "70000"},
		{"ping", "-s", "--timeout", "0s"},
		{"ping", "-s", "-x"},
		{"ping", "-sx"},
		{"ping", "-s", "extra"},
		{"ping", "-s", "--bogus"},
		{"ping", "-s", "-vV"}, // valid ping flags, but no --tap
	} {
		var out, errOut bytes.Buffer
		if code := cli.Run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "rdmatap ping: ") || strings.Contains(errOut.String(), "goroutine") {
			t.Errorf("%v: want a one-line error, got %q", args, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := cli.Run([]string{"ping", "-h"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "-timeout") {
		t.Errorf("ping -h: exit %d, %q", code, errOut.String())
	}
}

// TestPingGetoptArgs: rping's getopt spellings parse like the long ones.
func TestPingGetoptArgs(t *testing.T) {
	o := opts(t, "-cvVd", "-a192.0.2.2", "-C5", "-S", "100", "-p7175", "-crc", "-tap", "rt0", "--addr=192.0.2.1/24")
	if o.server || !o.verbose || !o.validate || !o.debug || o.addr != netip.MustParseAddr("192.0.2.2") ||
		o.count != 5 || o.size != 100 || o.port != 7175 {
		t.Fatalf("%+v", o)
	}
	o = opts(t, "-sPvC", "3")
	if !o.server || !o.persistent || !o.verbose || o.count != 3 || o.port != 7174 || o.size != 64 || o.addr.IsValid() {
		t.Fatalf("%+v", o)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("a", "", "")
	fs.Bool("v", false, "")
	fs.Bool("V", false, "")
	if got := expandGetopt(fs, []string{"-a", "-vV", "-vV", "--", "-vV"}); strings.Join(got, " ") != "-a -vV -v -V -- -vV" {
		t.Fatalf("%q", got)
	}
}

func TestPingDataPattern(t *testing.T) {
	start := byte('A')
	for i := 0; i < 200; i++ {
		for _, size := range []int{23, 64, 1000} {
			buf := make([]byte, size)
			next := rpingFill(buf, i, start)
			if string(buf[:size-1]) != expectedPing(i, size) || buf[size-1] != 0 {
				t.Fatalf("ping %d size %d: %q", i, size, buf)
			}
			if size == 1000 {
				start = next
			}
		}
	}
	var b [rpingInfoSize]byte
	rpingInfo{Buf: 0x0102030405060708, RKey: 0x0a0b0c0d, Size: 64}.put(b[:])
	if fmt.Sprintf("% x", b) != "01 02 03 04 05 06 07 08 0a 0b 0c 0d 00 00 00 40" {
		t.Fatalf("rping_rdma_info encodes as % x", b)
	}
	if r, err := parseRpingInfo(b[:]); err != nil || r.Buf != 0x0102030405060708 || r.RKey != 0x0a0b0c0d || r.Size != 64 {
		t.Fatalf("%+v %v", r, err)
	}
}

// TestPingPcapWireSequence decodes a capture of a ping run: MPA Request
// and Reply carry only the IRD/ORD word, 1 and 1; each ping is client Send
// {start buf}, server Read Request for exactly that buffer, Read Response,
// server Send, client Send {sink buf}, server RDMA Write to exactly that
// buffer, server Send — the sequence of the siw capture README.
func TestPingPcapWireSequence(t *testing.T) {
	var capture bytes.Buffer
	na, nb, err := netstack.NewPair(netstack.PairConfig{PcapA: &capture})
	if err != nil {
		t.Fatal(err)
	}
	da, err := verbs.Open(na, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	db, err := verbs.Open(nb, verbs.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cl := &cli.Endpoint{Net: na, Dev: da, Addr: na.Addrs()[0].Addr()}
	sv := &cli.Endpoint{Net: nb, Dev: db, Addr: nb.Addrs()[0].Addr()}
	const pings = 3
	srv := startServer(t, context.Background(), sv, opts(t, "-s"))
	if _, err := runClient(cl, opts(t, "-c", "-a", sv.Addr.String(), "-C", fmt.Sprint(pings), "-V")); err != nil {
		t.Fatal(err)
	}
	if err := waitServer(t, srv); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	sv.Close()

	streams := tcpStreams(t, capture.Bytes())
	var c2s, s2c []byte
	for k, b := range streams {
		switch {
		case k&0xffff == rpingPort:
			c2s = b
		case k>>16 == rpingPort:
			s2c = b
		}
	}
	if len(c2s) == 0 || len(s2c) == 0 {
		t.Fatalf("no rping stream in the capture (%d streams)", len(streams))
	}
	type msg struct {
		op      iwarp.Opcode
		payload []byte // the message's (single-segment) ULPDU after its DDP/RDMAP header
		hdr     []byte
	}
	parse := func(name string, b []byte, wantKey string) []msg {
		if len(b) < 20 || string(b[:16]) != wantKey {
			t.Fatalf("%s: no %q", name, wantKey)
		}
		pdLen := int(b[18])<<8 | int(b[19])
		pd := b[20 : 20+pdLen]
		if pdLen != 4 || (int(pd[0])<<8|int(pd[1]))&0x3fff != 1 || (int(pd[2])<<8|int(pd[3]))&0x3fff != 1 {
			t.Errorf("%s: MPA private data % x, want IRD 1 ORD 1 and nothing else", name, pd)
		}
		b = b[20+pdLen:]
		var out []msg
		for len(b) >= 2 {
			n := int(b[0])<<8 | int(b[1])
			total := (2+n+3)&^3 + 4
			if total > len(b) {
				t.Fatalf("%s: truncated FPDU", name)
			}
			u := b[2 : 2+n]
			op := iwarp.Opcode(u[1] & 0xf)
			if u[0]&0x40 == 0 {
				t.Fatalf("%s: a %v of more than one segment", name, op)
			}
			hl := 18
			if u[0]&0x80 != 0 {
				hl = 14
			}
			out = append(out, msg{op: op, hdr: u[:hl], payload: u[hl:]})
			b = b[total:]
		}
		return out
	}
	cm := parse("client", c2s, "MPA ID Req Frame")
	sm := parse("server", s2c, "MPA ID Rep Frame")
	if len(cm) != 3*pings || len(sm) != 4*pings {
		t.Fatalf("client sent %d messages, server %d; want %d and %d", len(cm), len(sm), 3*pings, 4*pings)
	}
	be32 := func(b []byte) uint32 { return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) }
	be64 := func(b []byte) uint64 { return uint64(be32(b))<<32 | uint64(be32(b[4:])) }
	for i := 0; i < pings; i++ {
		c, s := cm[3*i:3*i+3], sm[4*i:4*i+4]
		ops := func(m []msg) (o []iwarp.Opcode) {
			for _, x := range m {
				o = append(o, x.op)
			}
			return o
		}
		if fmt.Sprint(ops(c)) != fmt.Sprint([]iwarp.Opcode{iwarp.OpSend, iwarp.OpReadResponse, iwarp.OpSend}) ||
			fmt.Sprint(ops(s)) != fmt.Sprint([]iwarp.Opcode{iwarp.OpReadRequest, iwarp.OpSend, iwarp.OpWrite, iwarp.OpSend}) {
			t.Fatalf("ping %d: client sent %v, server %v", i, ops(c), ops(s))
		}
		src, sink := c[0].payload, c[2].payload
		if len(src) != 16 || len(sink) != 16 || len(s[1].payload) != 16 || len(s[3].payload) != 16 {
			t.Fatalf("ping %d: Sends of %d, %d, %d, %d bytes, want 16", i, len(src), len(sink), len(s[1].payload), len(s[3].payload))
		}
		if !bytes.Equal(s[1].payload, make([]byte, 16)) || be32(src[12:]) != 64 || be32(sink[12:]) != 64 {
			t.Fatalf("ping %d: adverts % x, % x, go-ahead % x", i, src, sink, s[1].payload)
		}
		// Read Request: sink STag, sink TO, size, source STag, source TO.
		rr := s[0].payload
		if len(rr) != 28 || be32(rr[12:]) != 64 || be32(rr[16:]) != be32(src[8:]) || be64(rr[20:]) != be64(src) {
			t.Fatalf("ping %d: Read Request % x for advert % x", i, rr, src)
		}
		want := expectedPing(i, 64) + "\x00"
		if string(c[1].payload) != want || string(s[2].payload) != want {
			t.Fatalf("ping %d: Read Response %q, Write %q", i, c[1].payload, s[2].payload)
		}
		if w := s[2].hdr; be32(w[2:]) != be32(sink[8:]) || be64(w[6:]) != be64(sink) {
			t.Fatalf("ping %d: Write to % x for advert % x", i, w, sink)
		}
	}
}

// tcpStreams reassembles the TCP payload of a pcap by direction, keyed
// srcPort<<16|dstPort.
func tcpStreams(t *testing.T, b []byte) map[uint32][]byte {
	t.Helper()
	if len(b) < 24 {
		t.Fatal("empty capture")
	}
	le := b[0] == 0xd4
	u32 := func(b []byte) uint32 {
		if le {
			return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		}
		return uint32(b[3]) | uint32(b[2])<<8 | uint32(b[1])<<16 | uint32(b[0])<<24
	}
	link := u32(b[20:])
	out := map[uint32][]byte{}
	next := map[uint32]uint32{}
	for b = b[24:]; len(b) >= 16; {
		n := int(u32(b[8:]))
		p := b[16 : 16+n]
		b = b[16+n:]
		if link == netstack.LinkTypeEthernet {
			if len(p) < 14 || p[12] != 0x08 || p[13] != 0x00 {
				continue
			}
			p = p[14:]
		}
		if len(p) < 20 || p[0]>>4 != 4 || p[9] != 6 {
			continue
		}
		ip := p[:int(p[2])<<8|int(p[3])]
		tcp := ip[int(ip[0]&0xf)*4:]
		key := uint32(tcp[0])<<24 | uint32(tcp[1])<<16 | uint32(tcp[2])<<8 | uint32(tcp[3])
		seq := uint32(tcp[4])<<24 | uint32(tcp[5])<<16 | uint32(tcp[6])<<8 | uint32(tcp[7])
		payload := tcp[int(tcp[12]>>4)*4:]
		if tcp[13]&0x02 != 0 { // SYN
			next[key] = seq + 1
			continue
		}
		if len(payload) == 0 || seq != next[key] {
			continue // pure ACK, or a retransmission
		}
		out[key] = append(out[key], payload...)
		next[key] = seq + uint32(len(payload))
	}
	return out
}

// TestPingSizeSuffixes: -S takes K, M, G as every size flag does, and
// keeps rping's range.
func TestPingSizeSuffixes(t *testing.T) {
	if o := opts(t, "-c", "-a", "10.0.0.1", "-S", "1K"); o.size != 1024 {
		t.Fatalf("-S 1K: size %d", o.size)
	}
	if _, _, err := ParsePingFlags([]string{"-c", "-a", "10.0.0.1", "-S", "1G"}, &bytes.Buffer{}); err == nil {
		t.Fatal("-S 1G, beyond rping's largest size, was accepted")
	}
}
