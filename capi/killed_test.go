package capi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net/netip"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// Sizes in testdata/killed.c.
const (
	kChunk         = 65536
	kDepth         = 16
	kBystanderLen  = 65536 + 123
	kBystanderSend = 4
)

// TestKilledProgram kills (SIGKILL) a C program in the middle of its RDMA
// Writes to a Go peer (testdata/killed.c: a connection, CQs, a completion
// channel, MRs), while a second C program, a bystander, holds a
// connection of its own. The service releases the killed program's
// session (its count of clients and the bystander's holdings are back to
// what they were), the peer's QP ends (its receive is flushed), and the
// bystander's RDMA Write and Send then arrive whole.
func TestKilledProgram(t *testing.T) {
	dir := libs(t, false)
	prog := compileCM(t, dir, "testdata/killed.c", false)
	s := startService(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pd, err := s.peer.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := s.peer.Listen(netip.MustParseAddrPort(s.peerAddr+":0"), verbs.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	// peerEnd is the Go side of one program's connection: a QP with a
	// receive posted and a buffer the program writes into.
	type peerEnd struct {
		scq, rcq *verbs.CQ
		qp       *verbs.QP
		buf      []byte
		rbuf     []byte
		conn     *verbs.Conn
	}
	accept := func(what string, size int) *peerEnd {
		t.Helper()
		e := &peerEnd{buf: make([]byte, size), rbuf: make([]byte, 4096)}
		if e.scq, err = s.peer.CreateCQ(8); err != nil {
			t.Fatal(err)
		}
		if e.rcq, err = s.peer.CreateCQ(8); err != nil {
			t.Fatal(err)
		}
		if e.qp, err = pd.CreateQP(verbs.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq}); err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(e.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		rmr, err := pd.RegMR(e.rbuf, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.qp.PostRecv(verbs.RecvWR{ID: 7, SGL: []verbs.SGE{rmr.SGE(0, len(e.rbuf))}}); err != nil {
			t.Fatal(err)
		}
		req, err := ln.GetRequest(ctx)
		if err != nil {
			t.Fatalf("%s: GetRequest: %v", what, err)
		}
		pdata := make([]byte, 16)
		binary.LittleEndian.PutUint64(pdata, mr.Addr())
		binary.LittleEndian.PutUint32(pdata[8:], uint32(mr.RKey()))
		binary.LittleEndian.PutUint32(pdata[12:], uint32(size))
		if e.conn, err = req.Accept(ctx, e.qp, verbs.ConnParams{PrivateData: pdata}); err != nil {
			t.Fatalf("%s: Accept: %v", what, err)
		}
		return e
	}
	// start runs the program in a mode and returns its stdout's lines.
	start := func(mode string) (*exec.Cmd, io.WriteCloser, *bufio.Reader, *bytes.Buffer) {
		t.Helper()
		c := command(t, dir, s.sock, prog, mode, ln.Addr().String())
		stdin, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		c.Stderr = &stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if c.ProcessState == nil {
				c.Process.Kill()
				c.Wait()
			}
		})
		return c, stdin, bufio.NewReader(stdout), &stderr
	}
	expectLine := func(what string, r *bufio.Reader, stderr *bytes.Buffer, want string) {
		t.Helper()
		line, err := r.ReadString('\n')
		if err != nil || line != want+"\n" {
			t.Fatalf("%s: %q, %v, want %q\n%s", what, line, err, want, stderr.String())
		}
	}

	// The bystander connects and waits.
	bc, bin, bout, berr := start("bystander")
	b := accept("the bystander", kBystanderLen)
	expectLine("the bystander", bout, berr, "connected")
	waitClients(t, s, 1)
	before := s.srv.ClientStats()

	// The stream connects and writes; then it is killed.
	kc, _, kout, kerr := start("stream")
	k := accept("the stream", kDepth*kChunk)
	expectLine("the stream", kout, kerr, "streaming")
	var killed service.ClientStat
	for _, st := range s.srv.ClientStats() {
		if st.ID != before[0].ID {
			killed = st
		}
	}
	if killed.QPs < 1 || killed.CQs < 2 || killed.MRs < 2 || killed.Conns < 1 {
		t.Fatalf("the streaming program holds %+v", killed)
	}
	t.Logf("the streaming program holds %+v", killed)
	if err := kc.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	kc.Wait()

	// The service lets the session go and what it held with it.
	waitClients(t, s, 1)
	after := s.srv.ClientStats()
	if len(after) != 1 || after[0] != before[0] {
		t.Fatalf("after the kill the service's clients are %+v, want %+v", after, before)
	}
	// The peer's QP ends: its connection is over, its receive flushed.
	select {
	case <-k.conn.Done():
	case <-ctx.Done():
		t.Fatal("the killed program's peer QP did not end")
	}
	var wc [1]verbs.WC
	if _, err := k.rcq.Wait(ctx, wc[:]); err != nil || wc[0].ID != 7 || wc[0].Status != verbs.StatusWRFlush {
		t.Fatalf("the killed program's peer's receive: %+v, %v", wc[0], err)
	}

	// The bystander goes on.
	if _, err := io.WriteString(bin, "go\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.rcq.Wait(ctx, wc[:]); err != nil || wc[0].Status != verbs.StatusSuccess || wc[0].ByteLen != kBystanderSend {
		t.Fatalf("the bystander's Send: %+v, %v\n%s", wc[0], err, berr.String())
	}
	if string(b.rbuf[:4]) != "done" {
		t.Fatalf("the bystander's Send carried %q", b.rbuf[:4])
	}
	for i := 0; i < kBystanderLen; i++ {
		if b.buf[i] != byte(i*7+11) {
			t.Fatalf("the bystander's RDMA Write: byte %d is %d, want %d", i, b.buf[i], byte(i*7+11))
		}
	}
	expectLine("the bystander", bout, berr, "bystander: ok")
	if err := bc.Wait(); err != nil {
		t.Fatalf("the bystander: %v\n%s", err, berr.String())
	}
	waitClients(t, s, 0)
	if out := kerr.String(); out != "" {
		t.Fatalf("the killed program failed before it was killed:\n%s", out)
	}
}
