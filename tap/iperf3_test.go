package tap

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rtcp "github.com/rdmatap/rdmatap/netstack/tcp"
)

// iperf3's control states (one signed byte each on the control
// connection), as iperf 3.x speaks them.
const (
	ipTestStart       = 1
	ipTestRunning     = 2
	ipTestEnd         = 4
	ipParamExchange   = 9
	ipCreateStreams   = 10
	ipExchangeResults = 13
	ipDisplayResults  = 14
	ipDone            = 16
	ipCookieLen       = 37 // 36 characters and a NUL
)

// iperf3Served is what an iperf3 test served by iperf3Serve moved: the
// bytes each data stream received from the client, or sent to it in
// reverse mode.
type iperf3Served struct {
	streams  []int64
	duration time.Duration
}

// iperf3Conns are the connections iperf3Serve has, the control one
// first, for a test to look at (or abort) when the client hangs.
type iperf3Conns struct {
	mu sync.Mutex
	es []*rtcp.Endpoint
}

func (c *iperf3Conns) add(e *rtcp.Endpoint) {
	c.mu.Lock()
	c.es = append(c.es, e)
	c.mu.Unlock()
}

// abort reports each connection's state and aborts it.
func (c *iperf3Conns) abort() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for i, e := range c.es {
		fmt.Fprintf(&b, "conn %d: %+v\n", i, e.Info())
		e.Abort()
	}
	return b.String()
}

func (s iperf3Served) total() (n int64) {
	for _, b := range s.streams {
		n += b
	}
	return n
}

// iperf3Serve serves one iperf3 TCP test on l, as `iperf3 -s -1` would,
// for the kernel's iperf3 client: the cookie, the parameters, the data
// streams (any number, either direction), the end, and the exchange of
// results.
func iperf3Serve(ctx context.Context, l *rtcp.Listener, conns *iperf3Conns) (iperf3Served, error) {
	var res iperf3Served
	ctl, err := l.Accept(ctx)
	if err != nil {
		return res, fmt.Errorf("accepting the control connection: %w", err)
	}
	defer ctl.Close()
	conns.add(ctl)
	cookie := make([]byte, ipCookieLen)
	if _, err := io.ReadFull(ctl, cookie); err != nil {
		return res, fmt.Errorf("reading the cookie: %w", err)
	}
	state := func(s int8) error { _, err := ctl.Write([]byte{byte(s)}); return err }
	if err := state(ipParamExchange); err != nil {
		return res, err
	}
	var params struct {
		TCP      bool `json:"tcp"`
		Parallel int  `json:"parallel"`
		Reverse  bool `json:"reverse"`
		Len      int  `json:"len"`
	}
	if err := readJSON(ctl, &params); err != nil {
		return res, fmt.Errorf("reading the parameters: %w", err)
	}
	if !params.TCP || params.Parallel < 1 || params.Parallel > 16 || params.Len <= 0 || params.Len > 1<<20 {
		return res, fmt.Errorf("parameters not served here: %+v", params)
	}
	if err := state(ipCreateStreams); err != nil {
		return res, err
	}
	streams := make([]*rtcp.Endpoint, params.Parallel)
	for i := range streams {
		e, err := l.Accept(ctx)
		if err != nil {
			return res, fmt.Errorf("accepting data stream %d: %w", i+1, err)
		}
		defer e.Close()
		conns.add(e)
		got := make([]byte, ipCookieLen)
		if _, err := io.ReadFull(e, got); err != nil || !bytes.Equal(got, cookie) {
			return res, fmt.Errorf("data stream %d: cookie %q (%v), want the control connection's", i+1, got, err)
		}
		streams[i] = e
	}
	if err := state(ipTestStart); err != nil {
		return res, err
	}
	if err := state(ipTestRunning); err != nil {
		return res, err
	}
	start := time.Now()
	counts := make([]atomic.Int64, len(streams))
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i, e := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, params.Len)
			for !stop.Load() {
				var n int
				var err error
				if params.Reverse {
					n, err = e.Write(buf)
				} else {
					n, err = e.Read(buf)
				}
				counts[i].Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
	}
	// The client ends the test: TEST_END on the control connection.
	b := make([]byte, 1)
	if _, err := io.ReadFull(ctl, b); err != nil || b[0] != ipTestEnd {
		return res, fmt.Errorf("waiting for the test's end: state %d, %v", b[0], err)
	}
	res.duration = time.Since(start)
	// As iperf3's server does, the data streams close at the test's end:
	// a client draining them reads their end. The counts are taken once
	// the readers and writers are done (a write under way when the end
	// came is delivered, and counted).
	stop.Store(true)
	for _, e := range streams {
		e.Close()
	}
	wg.Wait()
	for i := range counts {
		res.streams = append(res.streams, counts[i].Load())
	}
	if err := state(ipExchangeResults); err != nil {
		return res, err
	}
	var theirs json.RawMessage
	if err := readJSON(ctl, &theirs); err != nil {
		return res, fmt.Errorf("reading the client's results: %w", err)
	}
	type stream struct {
		ID          int     `json:"id"`
		Bytes       int64   `json:"bytes"`
		Retransmits int     `json:"retransmits"`
		Jitter      float64 `json:"jitter"`
		Errors      int     `json:"errors"`
		Packets     int     `json:"packets"`
		StartTime   float64 `json:"start_time"`
		EndTime     float64 `json:"end_time"`
	}
	ours := struct {
		CPUTotal   float64  `json:"cpu_util_total"`
		CPUUser    float64  `json:"cpu_util_user"`
		CPUSystem  float64  `json:"cpu_util_system"`
		HasRetrans int      `json:"sender_has_retransmits"`
		Streams    []stream `json:"streams"`
	}{HasRetrans: -1}
	for i, n := range res.streams {
		// iperf3 numbers its streams 1, 3, 4, 5, ...
		id := 1
		if i > 0 {
			id = i + 2
		}
		ours.Streams = append(ours.Streams, stream{ID: id, Bytes: n, Retransmits: -1, EndTime: res.duration.Seconds()})
	}
	if err := writeJSON(ctl, ours); err != nil {
		return res, err
	}
	if err := state(ipDisplayResults); err != nil {
		return res, err
	}
	if _, err := io.ReadFull(ctl, b); err != nil || b[0] != ipDone {
		return res, fmt.Errorf("waiting for IPERF_DONE: state %d, %v", b[0], err)
	}
	return res, nil
}

func readJSON(r io.Reader, v any) error {
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return err
	}
	if n > 1<<20 {
		return fmt.Errorf("a JSON message of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	_, err = w.Write(append(out, b...))
	return err
}

// TestOwnTCPIperf3: Debian's iperf3 client (the kernel's TCP) against an
// iperf3 server on rdmatap's own TCP over a TAP, data both ways (-R: the
// server sends), one stream and four. The client's report must hold the
// byte counts the server moved; the rates are logged.
func TestOwnTCPIperf3(t *testing.T) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("skipping: iperf3 is missing (Debian package iperf3)")
	}
	ns := newNetns(t)
	d := openIn(t, ns, Config{Name: tapName})
	ns.mustRun(t, "ip", "addr", "add", kernelV4+"/24", "dev", tapName)
	ns.mustRun(t, "ip", "link", "set", tapName, "up")
	p := ownTCPStack(t, d)
	port := 5201
	for _, tc := range []struct {
		name    string
		reverse bool
		streams int
	}{{"kernel→ours", false, 1}, {"ours→kernel", true, 1}, {"kernel→ours -P 4", false, 4}, {"ours→kernel -P 4", true, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := p.Listen(uint16(port), 8)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			served := make(chan error, 1)
			var res iperf3Served
			var conns iperf3Conns
			go func() {
				var err error
				res, err = iperf3Serve(ctx, l, &conns)
				served <- err
			}()
			args := []string{"iperf3", "-c", gvisorV4, "-p", strconv.Itoa(port), "-t", "2", "-J", "-P", strconv.Itoa(tc.streams)}
			if tc.reverse {
				args = append(args, "-R")
			}
			cmd := exec.Command("ip", append([]string{"netns", "exec", ns.name}, args...)...)
			var outBuf bytes.Buffer
			cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err = <-exited:
			case <-time.After(30 * time.Second):
				// The client hangs: the kernel's sockets and ours as they
				// are, then the client is killed and ours aborted.
				kss, _ := ns.run("ss", "-tnio")
				t.Errorf("iperf3 hangs after 30 s; the kernel's sockets:\n%s\nours:\n%s", kss, conns.abort())
				cmd.Process.Kill()
				err = <-exited
			}
			if err != nil {
				conns.abort()
			}
			out := outBuf.String()
			var serr error
			select {
			case serr = <-served:
			case <-time.After(10 * time.Second):
				t.Fatalf("our server did not end; its connections:\n%s", conns.abort())
			}
			if serr != nil || err != nil {
				t.Fatalf("iperf3: %v; our server: %v\n%s", err, serr, out)
			}
			var rep struct {
				End struct {
					Sent struct {
						Bytes int64   `json:"bytes"`
						BPS   float64 `json:"bits_per_second"`
					} `json:"sum_sent"`
					Received struct {
						Bytes int64   `json:"bytes"`
						BPS   float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Error != "" {
				t.Fatalf("iperf3's report: %v %s\n%s", err, rep.Error, out)
			}
			sent, rcvd := rep.End.Sent.Bytes, rep.End.Received.Bytes
			t.Logf("iperf3 %s: sent %d bytes, received %d (%.2f Gbit/s); our server's streams %v", tc.name, sent, rcvd, rep.End.Received.BPS/1e9, res.streams)
			// The sender's count is the bytes written, the receiver's the
			// bytes read by the end: what was still in flight differs.
			ours := res.total()
			switch {
			case len(res.streams) != tc.streams:
				t.Errorf("%d streams served, want %d", len(res.streams), tc.streams)
			case !tc.reverse && rcvd != ours:
				t.Errorf("the client reports %d bytes received, our server read %d", rcvd, ours)
			case tc.reverse && sent != ours:
				t.Errorf("the client reports %d bytes sent, our server wrote %d", sent, ours)
			case rcvd < 10<<20 || rcvd > sent:
				t.Errorf("received %d of %d bytes sent in 2 s", rcvd, sent)
			}
		})
		port++
	}
}
