// Command probepeer is rdmatap's side of test/interop's probe (probe/probe.c,
// which runs against it in the siw VM): the verbs that rping and perftest
// never use, one rdma_cm connection a cell, in the order given.
//
//	probepeer -tap T -addr A/24 [-crc] client SERVER:PORT CELL...
//	probepeer -tap T -addr A/24 [-crc] server PORT CELL...
//
// It prints "PEER <cell> PASS|FAIL|SKIP <details>" for each cell, and the
// cells rdmatap cannot take part in with SKIP and the reason; the exit
// status is 1 if a cell failed. The cells are described in probe.c (in
// and out are seen from siw: in is what rdmatap does to siw).
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/rdmatap/rdmatap/iwarp"
	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/tap"
	"github.com/rdmatap/rdmatap/verbs"
)

var cellNum = map[string]uint8{"sendinv_in": 1, "sendinv_out": 2, "srq": 3, "solicited_in": 4, "solicited_out": 5, "atomic": 6,
	"fastreg": 7, "read_inv": 8, "solicited_notify": 9, "imm_write": 10, "imm_send": 11}

const (
	dataSize = 4096
	slot     = 64
	nslot    = 8
	hello    = nslot - 2 // the receive slot of the client's hello
)

func main() {
	tapName := flag.String("tap", "", "TAP device")
	addr := flag.String("addr", "", "address/prefix")
	crc := flag.Bool("crc", false, "ask for MPA CRC")
	flag.Parse()
	a := flag.Args()
	if len(a) < 3 || (a[0] != "client" && a[0] != "server") {
		fmt.Fprintln(os.Stderr, "usage: probepeer -tap T -addr A/24 client HOST:PORT CELL... | server PORT CELL...")
		os.Exit(2)
	}
	pfx, err := netip.ParsePrefix(*addr)
	if err != nil {
		fatal(err)
	}
	// The same MAC in both roles (a process each), as rdmatap's own
	// endpoint commands do: with a fresh one, siw's neighbour entry for
	// our address went stale at the switch of roles and its first connect
	// timed out.
	a4 := pfx.Addr().As16()
	mac := net.HardwareAddr{0x02, 0x72, a4[12], a4[13], a4[14], a4[15]}
	td, err := tap.Open(tap.Config{Name: *tapName, MTU: 1500, MAC: mac})
	if err != nil {
		fatal(err)
	}
	defer td.Close()
	ns, err := netstack.New(netstack.Config{Link: td.LinkEndpoint(), Addrs: []netip.Prefix{pfx}})
	if err != nil {
		fatal(err)
	}
	dev, err := verbs.Open(ns, verbs.DeviceConfig{Name: "rt0", CRC: *crc})
	if err != nil {
		fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		fatal(err)
	}
	p := &peer{dev: dev, pd: pd}
	if a[0] == "client" {
		if p.raddr, err = netip.ParseAddrPort(a[1]); err != nil {
			fatal(err)
		}
	} else {
		port, err := strconv.Atoi(a[1])
		if err != nil {
			fatal(err)
		}
		if p.l, err = dev.Listen(netip.AddrPortFrom(netip.Addr{}, uint16(port)), verbs.ListenConfig{}); err != nil {
			fatal(err)
		}
		defer p.l.Close()
		fmt.Println("LISTENING", p.l.Addr())
	}
	failed := false
	for _, cell := range a[2:] {
		detail, err := p.run(cell)
		st := "PASS"
		var skip skipError
		switch {
		case errors.As(err, &skip):
			st, detail = "SKIP", skip.Error()
		case err != nil:
			st, detail, failed = "FAIL", err.Error(), true
		}
		fmt.Printf("PEER %s %s %s\n", cell, st, detail)
	}
	if failed {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "probepeer:", err)
	os.Exit(2)
}

type skipError string

func (s skipError) Error() string { return string(s) }

type peer struct {
	dev   *verbs.Device
	pd    *verbs.PD
	l     *verbs.Listener
	raddr netip.AddrPort
}

// conn is one cell's connection and memory.
type conn struct {
	qp         *verbs.QP
	c          *verbs.Conn
	scq, rcq   *verbs.CQ
	srq        *verbs.SRQ
	data, ctl  *verbs.MR
	dbuf, cbuf []byte
	rkey       uint32 // the peer's data region
	raddr      uint64
}

func (p *peer) run(cell string) (string, error) {
	num, ok := cellNum[cell]
	if !ok {
		return "", fmt.Errorf("unknown cell %q", cell)
	}
	c, err := p.open(cell == "srq")
	if err != nil {
		return "", err
	}
	defer c.close()
	nrecv := 2
	switch cell {
	case "srq", "solicited_out", "solicited_notify", "fastreg":
		nrecv = 4
	}
	if cell == "solicited_notify" {
		// Armed before the hello exchange, so that no completion can
		// come before the arming: the hello (a plain Send) must raise
		// no event either.
		if err := c.rcq.ReqNotify(true); err != nil {
			return "", err
		}
	}
	if p.l != nil { // first: receives complete in the order they were posted
		if err := c.postRecv(hello); err != nil {
			return "", err
		}
	}
	for i := 0; i < nrecv; i++ {
		if err := c.postRecv(i); err != nil {
			return "", err
		}
	}
	if err := p.connect(c, num); err != nil {
		return "", err
	}
	// The initiator speaks first (iWARP: a responder sends nothing
	// before), so every cell opens with the client's "hello".
	if p.l != nil {
		wc, msg, err := c.recv()
		if err != nil {
			return "", fmt.Errorf("waiting for hello: %w", err)
		}
		if wc.ID != hello || msg != "hello" {
			return "", fmt.Errorf("first message %q in slot %d, want hello", msg, wc.ID)
		}
	} else {
		if err := c.send("hello", verbs.OpSend, 0, 0); err != nil {
			return "", err
		}
		if err := c.sent(); err != nil {
			return "", fmt.Errorf("hello: %w", err)
		}
	}
	switch cell {
	case "sendinv_in":
		return c.sendInvIn()
	case "sendinv_out":
		return c.sendInvOut()
	case "srq":
		return c.srqCell()
	case "solicited_in":
		return c.solicitedIn()
	case "solicited_out":
		return c.solicitedOut()
	case "atomic":
		return c.atomic()
	case "imm_write":
		return c.immediate(verbs.OpWriteImm)
	case "imm_send":
		return c.immediate(verbs.OpSendImm)
	case "fastreg":
		return c.fastReg(p.pd)
	case "read_inv":
		return c.readInv(p.pd)
	case "solicited_notify":
		return c.solicitedNotify()
	}
	return "", nil
}

func (p *peer) open(useSRQ bool) (*conn, error) {
	c := &conn{dbuf: make([]byte, dataSize), cbuf: make([]byte, nslot*slot)}
	var err error
	if c.scq, err = p.dev.CreateCQ(64); err != nil {
		return nil, err
	}
	if c.rcq, err = p.dev.CreateCQ(64); err != nil {
		return nil, err
	}
	if useSRQ {
		if c.srq, err = p.pd.CreateSRQ(16, 1); err != nil {
			return nil, err
		}
	}
	for i := range c.dbuf {
		c.dbuf[i] = byte(i*5 + 3)
	}
	if c.data, err = p.pd.RegMR(c.dbuf, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite); err != nil {
		return nil, err
	}
	if c.ctl, err = p.pd.RegMR(c.cbuf, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	c.qp, err = p.pd.CreateQP(verbs.QPConfig{SendCQ: c.scq, RecvCQ: c.rcq, SRQ: c.srq, MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1})
	return c, err
}

func (c *conn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c.c != nil && c.c.Disconnect(ctx) != nil {
		c.c.Close()
	} else if c.c == nil && c.qp != nil {
		c.qp.Close()
	}
	for _, mr := range []*verbs.MR{c.data, c.ctl} {
		if mr != nil {
			mr.Dereg()
		}
	}
	c.scq.Close()
	c.rcq.Close()
}

// pdata is probe.c's struct pdata: cell, pad[3], be32 rkey, be64 addr.
func (c *conn) pdata(cell uint8) []byte {
	b := make([]byte, 16)
	b[0] = cell
	binary.BigEndian.PutUint32(b[4:], c.data.RKey())
	binary.BigEndian.PutUint64(b[8:], c.data.Addr())
	return b
}

func (c *conn) peerData(b []byte, cell uint8) error {
	if len(b) < 16 {
		return fmt.Errorf("peer's private data has %d bytes, want 16", len(b))
	}
	if b[0] != cell {
		return fmt.Errorf("the peer runs cell %d, we run %d", b[0], cell)
	}
	c.rkey, c.raddr = binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint64(b[8:])
	return nil
}

func (p *peer) connect(c *conn, cell uint8) error {
	params := verbs.ConnParams{PrivateData: c.pdata(cell), IRD: 1, ORD: 1}
	if p.l != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		req, err := p.l.GetRequest(ctx)
		if err != nil {
			return err
		}
		if err := c.peerData(req.PrivateData(), cell); err != nil {
			req.Reject(nil)
			return err
		}
		c.c, err = req.Accept(ctx, c.qp, params)
		return err
	}
	// The probe's server may not listen yet: retry a refused connect.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		c.c, err = p.dev.Dial(ctx, c.qp, p.raddr, params)
		cancel()
		if err == nil {
			return c.peerData(c.c.PeerPrivateData(), cell)
		}
		if time.Now().After(deadline) || c.qp.State() != verbs.QPIdle {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (c *conn) postRecv(i int) error {
	wr := verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{c.ctl.SGE(i*slot, slot)}}
	if c.srq != nil {
		return c.srq.PostRecv(wr)
	}
	return c.qp.PostRecv(wr)
}

func (c *conn) send(msg string, op verbs.Opcode, flags verbs.SendFlags, inv uint32) error {
	off := (nslot - 1) * slot
	n := copy(c.cbuf[off:off+slot], msg)
	return c.qp.PostSend(verbs.SendWR{ID: 100, Op: op, Flags: verbs.Signaled | flags,
		SGL: []verbs.SGE{c.ctl.SGE(off, n)}, InvalidateRKey: inv})
}

func wait(cq *verbs.CQ, d time.Duration) (verbs.WC, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	wc := make([]verbs.WC, 1)
	if _, err := cq.Wait(ctx, wc); err != nil {
		return verbs.WC{}, fmt.Errorf("no completion within %v", d)
	}
	return wc[0], nil
}

// recv waits for a receive and returns its message.
func (c *conn) recv() (verbs.WC, string, error) {
	wc, err := wait(c.rcq, 10*time.Second)
	if err != nil {
		return wc, "", err
	}
	if err := wc.Err(); err != nil {
		return wc, "", err
	}
	return wc, string(c.cbuf[int(wc.ID)*slot : int(wc.ID)*slot+int(wc.ByteLen)]), nil
}

func (c *conn) sent() error {
	wc, err := wait(c.scq, 10*time.Second)
	if err != nil {
		return err
	}
	return wc.Err()
}

// sendInvIn: our Send with Invalidate names siw's STag; siw says whether
// its receive reported the invalidation; our Read of the STag must fail.
func (c *conn) sendInvIn() (string, error) {
	if err := c.send("inv", verbs.OpSendInvalidate, 0, c.rkey); err != nil {
		return "", err
	}
	if err := c.sent(); err != nil {
		return "", err
	}
	_, verdict, err := c.recv()
	if err != nil {
		return "", err
	}
	if err := c.qp.PostSend(verbs.SendWR{ID: 200, Op: verbs.OpRead, Flags: verbs.Signaled,
		SGL: []verbs.SGE{c.data.SGE(0, 8)}, RemoteAddr: c.raddr, RKey: c.rkey}); err != nil {
		return "", err
	}
	wc, err := wait(c.scq, 10*time.Second)
	if err != nil {
		return "", fmt.Errorf("Read of the invalidated STag: %w", err)
	}
	detail := fmt.Sprintf("siw's verdict: %s; our Read of the invalidated STag %#x: %v (terminate %v)", verdict, c.rkey, wc.Status, wc.Term)
	if verdict != "ok" || wc.Status != verbs.StatusRemoteAccess || wc.Term != (verbs.TermCode{Layer: verbs.TermRDMAP, EType: iwarp.ETypeRemoteProtection, Code: iwarp.CodeInvalidSTag}) {
		return "", errors.New(detail)
	}
	return detail, nil
}

// sendInvOut: siw's Send with Invalidate names our STag.
func (c *conn) sendInvOut() (string, error) {
	wc, msg, err := c.recv()
	if err != nil {
		return "", err
	}
	ok := wc.Flags&verbs.WCWithInvalidate != 0 && wc.InvalidatedRKey == c.data.RKey() && !c.data.Valid()
	detail := fmt.Sprintf("received %q, flags %v, invalidated rkey %#x (ours %#x), MR valid %v", msg, wc.Flags, wc.InvalidatedRKey, c.data.RKey(), c.data.Valid())
	v := "ok"
	if !ok {
		v = "bad"
	}
	if err := c.send(v, verbs.OpSend, 0, 0); err != nil {
		return "", err
	}
	// siw now Reads the invalidated STag: we must refuse it with a
	// Terminate (RDMAP Remote Protection, Invalid STag).
	select {
	case <-c.qp.Done():
		detail += fmt.Sprintf("; after siw's Read: %v", c.qp.Err())
	case <-time.After(10 * time.Second):
		return "", errors.New(detail + "; siw's Read of the invalidated STag did not end the connection")
	}
	var term *verbs.TerminateError
	if !errors.As(c.qp.Err(), &term) || term.Received {
		return "", errors.New(detail + "; want a Terminate sent for siw's Read")
	}
	if !ok {
		return "", errors.New(detail)
	}
	return detail, nil
}

func (c *conn) srqCell() (string, error) {
	for i := 0; i < 4; i++ {
		if err := c.send(fmt.Sprintf("srq-%d", i), verbs.OpSend, 0, 0); err != nil {
			return "", err
		}
		if err := c.sent(); err != nil {
			return "", err
		}
	}
	seen := 0
	for i := 0; i < 4; i++ {
		wc, msg, err := c.recv()
		if err != nil {
			return "", fmt.Errorf("receive %d through the SRQ: %w", i, err)
		}
		if len(msg) < 4 || msg[:4] != "srq-" {
			return "", fmt.Errorf("received %q", msg)
		}
		seen |= 1 << wc.ID
	}
	if seen != 0xf {
		return "", fmt.Errorf("SRQ slots %#x", seen)
	}
	return "4 Sends each way, received in SRQ slots 0xf", nil
}

// solicitedIn: two Sends, a pause, a Send with Solicited Event; siw's
// probe judges its CQ event.
func (c *conn) solicitedIn() (string, error) {
	for i, f := range []verbs.SendFlags{0, 0, verbs.Solicited} {
		if i == 2 {
			time.Sleep(700 * time.Millisecond)
		}
		if err := c.send([]string{"plain-1", "plain-2", "solicited"}[i], verbs.OpSend, f, 0); err != nil {
			return "", err
		}
		if err := c.sent(); err != nil {
			return "", err
		}
	}
	return "sent two Sends and a Send with Solicited Event", nil
}

// solicitedOut: of siw's three Sends only the last has Solicited Event.
func (c *conn) solicitedOut() (string, error) {
	var flags []bool
	for i := 0; i < 3; i++ {
		wc, _, err := c.recv()
		if err != nil {
			return "", err
		}
		flags = append(flags, wc.Flags&verbs.WCSolicited != 0)
	}
	ok := !flags[0] && !flags[1] && flags[2]
	v := "ok"
	if !ok {
		v = "bad"
	}
	if err := c.send(v, verbs.OpSend, 0, 0); err != nil {
		return "", err
	}
	detail := fmt.Sprintf("WCSolicited on the three receives: %v", flags)
	if !ok {
		return "", errors.New(detail)
	}
	return detail, c.sent()
}

// atomic: siw has no atomics (RFC 7306); it must answer with a Terminate.
func (c *conn) atomic() (string, error) {
	return c.extRefused(verbs.SendWR{ID: 300, Op: verbs.OpAtomicFetchAdd, Flags: verbs.Signaled,
		SGL: []verbs.SGE{c.data.SGE(0, 8)}, RemoteAddr: c.raddr, RKey: c.rkey, CompareAdd: 1})
}

// immediate: siw has no Immediate Data (RFC 7306) either; it answers the
// Immediate Data message with a Terminate. The WR must complete with an
// error status, never success (rdmatap holds its completion for the
// zero-length Read it sends behind it). The Write part of a Write with
// Immediate lands (64 bytes at offset 64 of siw's data region, clear of
// the word siw checks).
func (c *conn) immediate(op verbs.Opcode) (string, error) {
	return c.extRefused(verbs.SendWR{ID: 301, Op: op, Flags: verbs.Signaled,
		SGL: []verbs.SGE{c.data.SGE(0, 64)}, RemoteAddr: c.raddr + 64, RKey: c.rkey, Imm: 0x1234})
}

// extRefused posts wr, an RFC 7306 operation siw lacks: it must complete with
// an error status naming siw's Terminate (not success, not a flush), and
// the QP fail with that Terminate received.
func (c *conn) extRefused(wr verbs.SendWR) (string, error) {
	if err := c.qp.PostSend(wr); err != nil {
		return "", err
	}
	wc, err := wait(c.scq, 10*time.Second)
	if err != nil {
		return "", err
	}
	select {
	case <-c.qp.Done():
	case <-time.After(5 * time.Second):
	}
	detail := fmt.Sprintf("%v completed: %v (terminate %v); QP %v: %v", wr.Op, wc.Status, wc.Term, c.qp.State(), c.qp.Err())
	// siw means RDMAP / Remote Operation / Unexpected OpCode, in its
	// nibble-swapped layout without header flags, which reads as LLP /
	// MPA / 0x06 in the RFC's: the bytes are ambiguous, and rdmatap's
	// lenient decoder prefers the RFC reading (an error status either way).
	var term *verbs.TerminateError
	if wc.ID != wr.ID || wc.Status == verbs.StatusSuccess || wc.Status == verbs.StatusWRFlush || wc.Term == (verbs.WC{}).Term ||
		c.qp.State() != verbs.QPError || !errors.As(c.qp.Err(), &term) || !term.Received {
		return "", errors.New(detail)
	}
	return detail, nil
}

// The fast-registration cells map a fast-register MR onto pages of
// frPage bytes.
const frPage = 4096

// frPages returns n pages of frPage bytes, zeroed, each its own
// allocation: the fast-register MR maps them as a page list, so siw's
// accesses across a page boundary go through it.
func frPages(n int) [][]byte {
	pgs := make([][]byte, n)
	for i := range pgs {
		pgs[i] = make([]byte, frPage)
	}
	return pgs
}

// pageBytes returns the n bytes at byte off of the page list (the pages
// in order), which may span pages.
func pageBytes(pgs [][]byte, off, n int) []byte {
	b := make([]byte, 0, n)
	for n > 0 {
		p := pgs[off/frPage][off%frPage:]
		k := min(n, len(p))
		b = append(b, p[:k]...)
		off, n = off+k, n-k
	}
	return b
}

// putPageBytes writes b at byte off of the page list.
func putPageBytes(pgs [][]byte, off int, b []byte) {
	for len(b) > 0 {
		k := copy(pgs[off/frPage][off%frPage:], b)
		off, b = off+k, b[k:]
	}
}

// siwPattern is probe.c's data region: byte i is i*7+1.
func siwPattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

// regMR fast-registers mr over pgs (length bytes from offset in the
// first) under the next key.
func (c *conn) regMR(mr *verbs.MR, pgs [][]byte, offset, length int, acc verbs.Access) error {
	if err := mr.MapPages(pgs, frPage, offset, length); err != nil {
		return err
	}
	if err := c.qp.PostSend(mr.RegWR(400, verbs.Signaled, verbs.IncRKey(mr.RKey()), acc)); err != nil {
		return err
	}
	wc, err := wait(c.scq, 10*time.Second)
	if err != nil {
		return fmt.Errorf("REG_MR: %w", err)
	}
	if wc.Status != verbs.StatusSuccess || wc.Op != verbs.WCRegMR || !mr.Valid() {
		return fmt.Errorf("REG_MR completed %v (op %v), MR valid %v", wc.Status, wc.Op, mr.Valid())
	}
	return nil
}

// sendSync sends msg and waits for its completion.
func (c *conn) sendSync(msg string) error {
	if err := c.send(msg, verbs.OpSend, 0, 0); err != nil {
		return err
	}
	return c.sent()
}

// expectMsg waits for a receive and checks its message starts with want.
func (c *conn) expectMsg(want string) (string, error) {
	_, msg, err := c.recv()
	if err != nil {
		return "", fmt.Errorf("waiting for %q: %w", want, err)
	}
	if len(msg) < len(want) || msg[:len(want)] != want {
		return msg, fmt.Errorf("received %q, want %q", msg, want)
	}
	return msg, nil
}

// refused waits for the QP to end with a Terminate we sent with code.
func (c *conn) refused(code verbs.TermCode) (string, error) {
	select {
	case <-c.qp.Done():
	case <-time.After(10 * time.Second):
		return "", errors.New("the peer's access did not end the connection")
	}
	var term *verbs.TerminateError
	if !errors.As(c.qp.Err(), &term) || term.Received || term.Code != code {
		return "", fmt.Errorf("QP ended with %v, want the Terminate %v sent", c.qp.Err(), code)
	}
	return fmt.Sprintf("Terminate sent: %v", term.Code), nil
}

var termDDPInvalidSTag = verbs.TermCode{Layer: verbs.TermDDP, EType: iwarp.ETypeTaggedBuffer, Code: iwarp.CodeDDPInvalidSTag}

// fastReg: a fast-register MR over a page list of separate buffers,
// registered VA-based with a REG_MR; siw Writes 3000 bytes into it across a page boundary (they
// must land in the right pages) and Reads back what we put there; Local
// Invalidate; a REG_MR under the next key (IncRKey), zero-based, over
// other pages, which siw Writes across a page boundary; then siw Writes
// with the old STag, which we must refuse (DDP / Tagged Buffer / Invalid
// STag).
func (c *conn) fastReg(pd *verbs.PD) (string, error) {
	mr, err := pd.AllocMR(4)
	if err != nil {
		return "", err
	}
	defer mr.Dereg()
	pgs := frPages(4)
	const off1 = 2048 // the first registration starts in the middle of page 0
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	if err := c.regMR(mr, pgs[:3], off1, 3*frPage-off1, acc); err != nil {
		return "", err
	}
	r1 := mr.Remote()
	if r1.Addr == 0 || r1.Len != 3*frPage-off1 || mr.Bytes() != nil {
		return "", fmt.Errorf("VA-based registration %+v", r1)
	}
	if err := c.sendSync(fmt.Sprintf("fr %x %x %d", r1.RKey, r1.Addr, r1.Len)); err != nil {
		return "", err
	}
	// siw: Write of its data region's first 3000 bytes at TO+1000.
	if _, err := c.expectMsg("written"); err != nil {
		return "", err
	}
	if got := pageBytes(pgs, off1+1000, 3000); !bytes.Equal(got, siwPattern(3000)) {
		return "", fmt.Errorf("siw's Write through STag %#x did not land in the pages", r1.RKey)
	}
	// siw Reads 3000 bytes from TO+1000: byte i is i*3+5.
	put := make([]byte, 3000)
	for i := range put {
		put[i] = byte(i*3 + 5)
	}
	putPageBytes(pgs, off1+1000, put)
	if err := c.sendSync("check"); err != nil {
		return "", err
	}
	if _, err := c.expectMsg("read ok"); err != nil {
		return "", fmt.Errorf("siw's Read through the fast-register MR: %w", err)
	}
	if err := c.qp.PostSend(verbs.SendWR{ID: 401, Op: verbs.OpLocalInv, Flags: verbs.Signaled, InvalidateRKey: r1.RKey}); err != nil {
		return "", err
	}
	wc, err := wait(c.scq, 10*time.Second)
	if err != nil {
		return "", fmt.Errorf("Local Invalidate: %w", err)
	}
	if wc.Status != verbs.StatusSuccess || wc.Op != verbs.WCLocalInv || mr.Valid() {
		return "", fmt.Errorf("Local Invalidate completed %v (op %v), MR valid %v", wc.Status, wc.Op, mr.Valid())
	}
	// Pages 2 and 3, zero-based, under the next key.
	if err := c.regMR(mr, pgs[2:], 0, 2*frPage, acc|verbs.AccessZeroBased); err != nil {
		return "", err
	}
	r2 := mr.Remote()
	if r2.Addr != 0 || r2.RKey != verbs.IncRKey(r1.RKey) {
		return "", fmt.Errorf("second registration %+v after STag %#x", r2, r1.RKey)
	}
	if err := c.sendSync(fmt.Sprintf("fr2 %x %x %d", r2.RKey, r2.Addr, r2.Len)); err != nil {
		return "", err
	}
	// siw: Write of 16 bytes at TO 4090, across pages 2 and 3; its data
	// region holds what it Read (i*3+5).
	if _, err := c.expectMsg("w2"); err != nil {
		return "", err
	}
	ok := bytes.Equal(pageBytes(pgs, 2*frPage+4090, 16), put[:16])
	v := "ok"
	if !ok {
		v = "bad"
	}
	if err := c.sendSync(v); err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("siw's Write through the zero-based STag %#x did not land in pages 2 and 3", r2.RKey)
	}
	// siw Writes with the old STag.
	term, err := c.refused(termDDPInvalidSTag)
	if err != nil {
		return "", err
	}
	for i, b := range pageBytes(pgs, off1, 2*frPage-off1) {
		if (i < 1000 || i >= 4000) && b != 0 {
			return "", fmt.Errorf("byte %d of the first registration changed", i)
		}
	}
	return fmt.Sprintf("REG_MR %#x (VA, 3 separate pages from offset %d): siw's Write landed, its Read got our bytes; Local Invalidate; REG_MR %#x (zero-based, pages 2-3): siw's Write across the page boundary landed; siw's Write with %#x refused: %s",
		r1.RKey, off1, r2.RKey, r1.RKey, term), nil
}

// readInv: an RDMA Read with local invalidate of siw's data region into a
// fast-register MR: the data lands, the sink's STag is invalid when the
// Read completes, and siw's Write to it afterwards is refused (DDP /
// Tagged Buffer / Invalid STag).
func (c *conn) readInv(pd *verbs.PD) (string, error) {
	mr, err := pd.AllocMR(2)
	if err != nil {
		return "", err
	}
	defer mr.Dereg()
	pgs := frPages(2)
	if err := c.regMR(mr, pgs, 512, 2*frPage-512, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return "", err
	}
	const n = 4000 // from 512 in page 0 across into page 1
	sink := mr.RKey()
	if err := c.qp.PostSend(verbs.SendWR{ID: 500, Op: verbs.OpReadInv, Flags: verbs.Signaled,
		SGL: []verbs.SGE{mr.SGE(0, n)}, RemoteAddr: c.raddr, RKey: c.rkey, InvalidateRKey: sink}); err != nil {
		return "", err
	}
	wc, err := wait(c.scq, 10*time.Second)
	if err != nil {
		return "", fmt.Errorf("Read with invalidate: %w", err)
	}
	valid := mr.Valid()
	if wc.Status != verbs.StatusSuccess || wc.Op != verbs.WCRead || wc.ByteLen != n || valid {
		return "", fmt.Errorf("Read with invalidate completed %v (op %v, %d bytes), sink valid %v", wc.Status, wc.Op, wc.ByteLen, valid)
	}
	if !bytes.Equal(pageBytes(pgs, 512, n), siwPattern(n)) {
		return "", errors.New("the Read's data did not land in the sink's pages")
	}
	if err := c.sendSync(fmt.Sprintf("ri %x %x", sink, mr.Addr())); err != nil {
		return "", err
	}
	term, err := c.refused(termDDPInvalidSTag)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("Read of %d bytes into STag %#x landed, the STag invalid at completion; siw's Write to it refused: %s", n, sink, term), nil
}

// solicitedNotify: our receive CQ is armed solicited-only before the
// connection; siw sends two Sends, pauses, and sends a Send with
// Solicited Event. The event must come once, with all three receives
// in the CQ (had it fired for a plain Send, the solicited one would not
// be there yet), and not again without a new arming.
func (c *conn) solicitedNotify() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.rcq.WaitEvent(ctx); err != nil {
		return "", fmt.Errorf("no completion event: %w", err)
	}
	wcs := make([]verbs.WC, 8)
	n := c.rcq.Poll(wcs)
	var got []string
	for _, wc := range wcs[:n] {
		got = append(got, fmt.Sprintf("%s(solicited %v)", c.cbuf[int(wc.ID)*slot:int(wc.ID)*slot+int(wc.ByteLen)], wc.Flags&verbs.WCSolicited != 0))
	}
	detail := fmt.Sprintf("at the event the CQ held %v", got)
	ok := n == 3
	for i, wc := range wcs[:min(n, 3)] {
		ok = ok && wc.Status == verbs.StatusSuccess && (wc.Flags&verbs.WCSolicited != 0) == (i == 2)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if err := c.rcq.WaitEvent(ctx2); err == nil {
		ok, detail = false, detail+"; a second event without arming again"
	}
	v := "ok"
	if !ok {
		v = "bad"
	}
	if err := c.sendSync(v); err != nil {
		return "", err
	}
	if !ok {
		return "", errors.New(detail)
	}
	return detail + "; one event", nil
}
