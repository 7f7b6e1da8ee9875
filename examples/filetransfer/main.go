package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/rdmatap/rdmatap/examples/internal/embed"
	"github.com/rdmatap/rdmatap/internal/units"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/zerocopy"
)

func main() {
	file := flag.String("file", "", "file to send (default: random data of -size bytes)")
	size := units.Size{N: 64 << 20, Max: 16 << 30}
	flag.Var(&size, "size", "bytes of random data when no -file is given (K, M, G suffixes)")
	crc := flag.Bool("crc", false, "negotiate MPA CRC32c")
	service := flag.Bool("service", false, "run the sender as a client of a service of its endpoint (verbs.Connect), as a process using `rdmatap up --socket` does")
	flag.Parse()
	if err := run(*file, int(size.N), *crc, *service); err != nil {
		fmt.Fprintln(os.Stderr, "filetransfer:", err)
		os.Exit(1)
	}
}

// maxChunk keeps each RDMA Write under the 4 GiB message limit.
const maxChunk = 1 << 30

func run(file string, size int, crc, service bool) error {
	// The sender's buffer: registered memory holding the file (a memfd,
	// which a service can map as well).
	var data *zerocopy.Buffer
	var err error
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if len(b) == 0 {
			return errors.New("empty file")
		}
		if data, err = zerocopy.AllocShared("file", len(b)); err != nil {
			return err
		}
		copy(data.Bytes(), b)
	} else {
		if size <= 0 {
			return fmt.Errorf("-size must be positive")
		}
		if data, err = zerocopy.AllocShared("file", size); err != nil {
			return err
		}
		rand.Read(data.Bytes())
	}
	defer data.Close()
	n := len(data.Bytes())

	snd, rcv, err := embed.Pair(crc)
	if err != nil {
		return err
	}
	defer snd.Close()
	defer rcv.Close()
	if service {
		// The same sender code, on the endpoint's service.
		client, stop, err := embed.Served(snd)
		if err != nil {
			return err
		}
		defer stop()
		defer client.Close()
		snd = client
		fmt.Println("sender: a client of endpoint A's service")
	}

	// Receiver: a buffer for the file and a small one for messages.
	sink, err := zerocopy.Alloc(n)
	if err != nil {
		return err
	}
	defer sink.Close()
	sinkMR, err := rcv.PD.RegMR(sink.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return err
	}
	rmsg := make([]byte, 64)
	rmsgMR, err := rcv.PD.RegMR(rmsg, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	rqp, err := rcv.QP(verbs.QPConfig{})
	if err != nil {
		return err
	}
	// Sender.
	srcMR, err := snd.PD.RegMR(data.Bytes(), 0)
	if err != nil {
		return err
	}
	smsgBuf, err := zerocopy.AllocShared("msg", 64)
	if err != nil {
		return err
	}
	defer smsgBuf.Close()
	smsg := smsgBuf.Bytes()
	smsgMR, err := snd.PD.RegMR(smsg, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	sqp, err := snd.QP(verbs.QPConfig{})
	if err != nil {
		return err
	}

	// Connect: the receiver's buffer descriptor (its STag) travels in the
	// connection's private data, as rdma_cm applications do.
	l, err := rcv.Dev.Listen(rcv.Addr(0), verbs.ListenConfig{})
	if err != nil {
		return err
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		desc, _ := sinkMR.Remote().MarshalBinary()
		// The checksum message will land in rmsg.
		if err := rqp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{rmsgMR.SGE(0, len(rmsg))}}); err != nil {
			accepted <- err
			return
		}
		_, err := l.Accept(ctx, rqp, verbs.ConnParams{PrivateData: desc})
		accepted <- err
	}()
	conn, err := snd.Dev.Dial(ctx, sqp, rcv.Addr(l.Addr().Port()), verbs.ConnParams{})
	if err != nil {
		return err
	}
	if err := <-accepted; err != nil {
		return err
	}
	var dst verbs.RemoteBuf
	if err := dst.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		return err
	}
	if dst.Len < uint64(n) {
		return fmt.Errorf("receiver buffer %d bytes, file %d", dst.Len, n)
	}

	// Send: RDMA Write the file, then a Send with its SHA-256. RDMAP
	// delivers the Send after the Writes are placed.
	sum := sha256.Sum256(data.Bytes())
	start := time.Now()
	for off := 0; off < n; off += maxChunk {
		k := min(maxChunk, n-off)
		if err := sqp.PostSend(verbs.SendWR{ID: uint64(off), Op: verbs.OpWrite, SGL: []verbs.SGE{srcMR.SGE(off, k)},
			RemoteAddr: dst.Addr + uint64(off), RKey: dst.RKey}); err != nil {
			return err
		}
	}
	copy(smsg, sum[:])
	if err := sqp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpSend, Flags: verbs.Signaled, SGL: []verbs.SGE{smsgMR.SGE(0, len(sum))}}); err != nil {
		return err
	}
	if _, err := embed.Wait(snd.SCQ); err != nil {
		return err
	}
	wc, err := embed.Wait(rcv.RCQ)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	got := sha256.Sum256(sink.Bytes()[:n])
	if wc.ByteLen != uint32(len(sum)) || string(rmsg[:len(sum)]) != string(sum[:]) || got != sum {
		return fmt.Errorf("checksum mismatch: sender %x, receiver computed %x", sum, got)
	}
	fmt.Printf("sent %d bytes by RDMA Write in %v (%.2f Gbit/s); receiver's SHA-256 %x matches\n",
		n, elapsed.Round(time.Microsecond), float64(n)*8/elapsed.Seconds()/1e9, got)
	st := rcv.Dev.Stats()

	fmt.Printf("receiver: %d FPDUs placed with %d copies (%d bytes), %d CRC errors\n", st.RxFPDUs, st.PlacementCopies, st.PlacedBytes, st.CRCErrors)
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	return conn.Disconnect(dctx)
}
