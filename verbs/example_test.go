package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/rdmatap/rdmatap/netstack"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/verbs/service"
)

// Two endpoints in one process, on an in-memory link (no TAP, no root): a
// server that listens and accepts, handing the client the descriptor of a
// buffer it may write as private data, and a client that connects and
// RDMA-Writes into that buffer, then Sends to say it is done.
func Example() {
	ctx := context.Background()
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer na.Close()
	defer nb.Close()

	// The server.
	server, err := verbs.Open(nb, verbs.DeviceConfig{Name: "rt1"})
	if err != nil {
		log.Fatal(err)
	}
	defer server.Close()
	spd, _ := server.AllocPD()
	scq, _ := server.CreateCQ(16)
	sbuf, _ := server.AllocBuffer(4096)
	smr, err := spd.RegMR(sbuf.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		log.Fatal(err)
	}
	sqp, _ := spd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: scq})
	// A receive for the client's Send, in the buffer's last bytes.
	sqp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{smr.SGE(4000, 96)}})
	l, err := server.Listen(netip.AddrPortFrom(netip.Addr{}, 7471), verbs.ListenConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.GetRequest(ctx)
		if err != nil {
			accepted <- err
			return
		}
		pdata, _ := smr.Remote().MarshalBinary() // address, length, STag
		_, err = req.Accept(ctx, sqp, verbs.ConnParams{PrivateData: pdata})
		accepted <- err
	}()

	// The client.
	client, err := verbs.Open(na, verbs.DeviceConfig{Name: "rt0"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	cpd, _ := client.AllocPD()
	ccq, _ := client.CreateCQ(16)
	cbuf, _ := client.AllocBuffer(64)
	n := copy(cbuf.Bytes(), "hello, RDMA")
	cmr, _ := cpd.RegMR(cbuf.Bytes(), verbs.AccessLocalWrite)
	cqp, _ := cpd.CreateQP(verbs.QPConfig{SendCQ: ccq, RecvCQ: ccq})
	conn, err := client.Dial(ctx, cqp, netip.AddrPortFrom(nb.Addrs()[0].Addr(), 7471), verbs.ConnParams{})
	if err != nil {
		log.Fatal(err)
	}
	if err := <-accepted; err != nil {
		log.Fatal(err)
	}
	var peer verbs.RemoteBuf
	if err := peer.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		log.Fatal(err)
	}
	// The Write, then a Send: the Send's arrival means the Write is placed.
	err = cqp.PostSend(
		verbs.SendWR{ID: 1, Op: verbs.OpWrite, SGL: []verbs.SGE{cmr.SGE(0, n)}, RemoteAddr: peer.Addr, RKey: peer.RKey},
		verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{cmr.SGE(0, 5)}})
	if err != nil {
		log.Fatal(err)
	}
	wc := make([]verbs.WC, 1)
	if _, err := scq.Wait(ctx, wc); err != nil || wc[0].Status != verbs.StatusSuccess {
		log.Fatal(err, wc[0].Status)
	}
	fmt.Printf("server received a %d-byte %v; its buffer holds %q\n", wc[0].ByteLen, wc[0].Op, sbuf.Bytes()[:n])
	if _, err := ccq.Wait(ctx, wc); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("client's %v completed: %v\n", wc[0].Op, wc[0].Status)
	// Output:
	// server received a 5-byte RECV; its buffer holds "hello, RDMA"
	// client's SEND completed: success
}

// The same application through a service: a device served on a unix
// socket (what `rdmatap up --socket` does) is opened with verbs.Connect in
// another process (here the same one) and used as an embedded device is.
// Its buffers must come from AllocBuffer (or zerocopy.AllocShared): the
// service maps the same pages.
func ExampleConnect() {
	ctx := context.Background()
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer na.Close()
	defer nb.Close()
	dev, err := verbs.Open(na, verbs.DeviceConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	dir, _ := os.MkdirTemp("", "rdmatap-example")
	defer os.RemoveAll(dir)
	ln, err := service.ListenSocket(filepath.Join(dir, "rt0.sock"), -1)
	if err != nil {
		log.Fatal(err)
	}
	srv, err := service.Serve(dev, ln, service.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	// A client of the service.
	d, err := verbs.Connect(ctx, filepath.Join(dir, "rt0.sock"))
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	pd, _ := d.AllocPD()
	buf, _ := d.AllocBuffer(1 << 20)
	defer buf.Close()
	mr, err := pd.RegMR(buf.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Dereg()
	fmt.Println("registered", len(mr.Bytes()), "bytes through the service; clients served:", srv.Clients())
	// Output:
	// registered 1048576 bytes through the service; clients served: 1
}

// Listening and accepting: GetRequest returns each connection request with
// the peer's private data; Accept answers it on a QP of the listener's
// device, Reject refuses it with private data of its own.
func ExampleListener_GetRequest() {
	ctx := context.Background()
	na, nb, err := netstack.NewPair(netstack.PairConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer na.Close()
	defer nb.Close()
	server, _ := verbs.Open(nb, verbs.DeviceConfig{})
	defer server.Close()
	client, _ := verbs.Open(na, verbs.DeviceConfig{})
	defer client.Close()
	l, err := server.Listen(netip.AddrPortFrom(netip.Addr{}, 7472), verbs.ListenConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	go func() {
		req, err := l.GetRequest(ctx)
		if err != nil {
			return
		}
		req.Reject([]byte("busy, try later"))
	}()
	pd, _ := client.AllocPD()
	cq, _ := client.CreateCQ(4)
	qp, _ := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	_, err = client.Dial(ctx, qp, netip.AddrPortFrom(nb.Addrs()[0].Addr(), 7472), verbs.ConnParams{PrivateData: []byte("hi")})
	var rej *verbs.RejectedError
	if errors.As(err, &rej) {
		fmt.Printf("rejected (%v): %q\n", errors.Is(err, verbs.ErrRejected), rej.PrivateData)
	}
	// Output:
	// rejected (true): "busy, try later"
}
