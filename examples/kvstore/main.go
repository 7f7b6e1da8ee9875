package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"sync/atomic"
	"time"

	"github.com/rdmatap/rdmatap/examples/internal/embed"
	"github.com/rdmatap/rdmatap/verbs"
	"github.com/rdmatap/rdmatap/zerocopy"
)

// A slot: crc32c(slot[4:]) | used | keyLen | valLen(2) | key[32] | value[216].
const (
	slotSize = 256
	nslots   = 8192
	maxKey   = 32
	maxVal   = 216
	offUsed  = 4
	offKLen  = 5
	offVLen  = 6
	offKey   = 8
	offVal   = 40
)

func slotOf(key []byte) int {
	h := fnv.New64a()
	h.Write(key)
	return int(h.Sum64() % nslots)
}

func main() {
	keys := flag.Int("keys", 2000, "keys to PUT")
	gets := flag.Int("gets", 20000, "GETs by RDMA Read")
	crc := flag.Bool("crc", false, "negotiate MPA CRC32c")
	flag.Parse()
	if *keys <= 0 || *keys > nslots/2 || *gets < 0 {
		fmt.Fprintf(os.Stderr, "kvstore: -keys must be 1..%d and -gets >= 0\n", nslots/2)
		os.Exit(2)
	}
	if err := run(*keys, *gets, *crc); err != nil {
		fmt.Fprintln(os.Stderr, "kvstore:", err)
		os.Exit(1)
	}
}

// server owns the table and applies PUTs.
type server struct {
	table []byte
	puts  atomic.Int64
	recvs atomic.Int64
}

func (s *server) put(key, val []byte) error {
	if len(key) == 0 || len(key) > maxKey || len(val) > maxVal {
		return errors.New("bad key or value size")
	}
	for i, j := 0, slotOf(key); i < nslots; i, j = i+1, (j+1)%nslots {
		sl := s.table[j*slotSize : (j+1)*slotSize]
		if sl[offUsed] == 1 && string(sl[offKey:offKey+int(sl[offKLen])]) != string(key) {
			continue
		}
		// Invalidate the checksum first so a concurrent reader retries
		// instead of seeing half an update.
		binary.BigEndian.PutUint32(sl, 0)
		sl[offUsed], sl[offKLen] = 1, byte(len(key))
		binary.BigEndian.PutUint16(sl[offVLen:], uint16(len(val)))
		clear(sl[offKey:])
		copy(sl[offKey:], key)
		copy(sl[offVal:], val)
		binary.BigEndian.PutUint32(sl, zerocopy.CRC32C(sl[4:]))
		s.puts.Add(1)
		return nil
	}
	return errors.New("table full")
}

func run(nkeys, ngets int, crc bool) error {
	cl, sv, err := embed.Pair(crc)
	if err != nil {
		return err
	}
	defer cl.Close()
	defer sv.Close()

	srv := &server{table: make([]byte, nslots*slotSize)}
	tableMR, err := sv.PD.RegMR(srv.table, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	// PUT requests land in 16 receive buffers; the reply is one byte.
	const nrecv = 16
	reqBuf := make([]byte, nrecv*512)
	reqMR, err := sv.PD.RegMR(reqBuf, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	ackBuf := make([]byte, 1)
	ackMR, err := sv.PD.RegMR(ackBuf, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	sqp, err := sv.QP(verbs.QPConfig{MaxRecvWR: nrecv})
	if err != nil {
		return err
	}
	for i := 0; i < nrecv; i++ {
		if err := sqp.PostRecv(verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{reqMR.SGE(i*512, 512)}}); err != nil {
			return err
		}
	}
	cqp, err := cl.QP(verbs.QPConfig{})
	if err != nil {
		return err
	}
	l, err := sv.Dev.Listen(sv.Addr(0), verbs.ListenConfig{})
	if err != nil {
		return err
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		desc, _ := tableMR.Remote().MarshalBinary()
		_, err := l.Accept(ctx, sqp, verbs.ConnParams{PrivateData: desc})
		accepted <- err
	}()
	conn, err := cl.Dev.Dial(ctx, cqp, sv.Addr(l.Addr().Port()), verbs.ConnParams{})
	if err != nil {
		return err
	}
	if err := <-accepted; err != nil {
		return err
	}
	var table verbs.RemoteBuf
	if err := table.UnmarshalBinary(conn.PeerPrivateData()); err != nil {
		return err
	}

	// The server loop: one receive completion per PUT.
	go func() {
		var wc [8]verbs.WC
		for {
			n, err := sv.RCQ.Wait(ctx, wc[:])
			if err != nil {
				return
			}
			for _, c := range wc[:n] {
				if c.Status != verbs.StatusSuccess {
					return
				}
				srv.recvs.Add(1)
				req := reqBuf[c.ID*512 : c.ID*512+uint64(c.ByteLen)]
				ack := byte(0)
				if len(req) < 3 || int(req[0])+3 > len(req) {
					ack = 1
				} else {
					k := int(req[0])
					vl := int(binary.BigEndian.Uint16(req[1+k:]))
					if 3+k+vl != len(req) || srv.put(req[1:1+k], req[3+k:]) != nil {
						ack = 1
					}
				}
				sqp.PostRecv(verbs.RecvWR{ID: c.ID, SGL: []verbs.SGE{reqMR.SGE(int(c.ID)*512, 512)}})
				ackBuf[0] = ack
				sqp.PostSend(verbs.SendWR{Op: verbs.OpSend, Flags: verbs.Inline, SGL: []verbs.SGE{ackMR.SGE(0, 1)}})
			}
		}
	}()

	// The client: PUT by Send, GET by RDMA Read.
	cbuf := make([]byte, 512+slotSize+1)
	cmr, err := cl.PD.RegMR(cbuf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return err
	}
	keyOf := func(i int) []byte { return []byte(fmt.Sprintf("key-%06d", i)) }
	valOf := func(i int) []byte { return []byte(fmt.Sprintf("value of key %d: %x", i, i*i)) }
	for i := 0; i < nkeys; i++ {
		k, v := keyOf(i), valOf(i)
		req := cbuf[:0]
		req = append(req, byte(len(k)))
		req = append(req, k...)
		req = binary.BigEndian.AppendUint16(req, uint16(len(v)))
		req = append(req, v...)
		if err := cqp.PostRecv(verbs.RecvWR{ID: 1, SGL: []verbs.SGE{cmr.SGE(512+slotSize, 1)}}); err != nil {
			return err
		}
		if err := cqp.PostSend(verbs.SendWR{ID: 2, Op: verbs.OpSend, SGL: []verbs.SGE{cmr.SGE(0, len(req))}}); err != nil {
			return err
		}
		if _, err := embed.Wait(cl.RCQ); err != nil {
			return err
		}
		if cbuf[512+slotSize] != 0 {
			return fmt.Errorf("PUT %q refused", k)
		}
	}
	recvsBefore := srv.recvs.Load()
	slotMem := cbuf[512 : 512+slotSize]
	get := func(key []byte) ([]byte, bool, error) {
		for i, j := 0, slotOf(key); i < nslots; i, j = i+1, (j+1)%nslots {
			for tries := 0; ; tries++ {
				if err := cqp.PostSend(verbs.SendWR{ID: 3, Op: verbs.OpRead, Flags: verbs.Signaled,
					SGL: []verbs.SGE{cmr.SGE(512, slotSize)}, RemoteAddr: table.Addr + uint64(j*slotSize), RKey: table.RKey}); err != nil {
					return nil, false, err
				}
				if _, err := embed.Wait(cl.SCQ); err != nil {
					return nil, false, err
				}
				if slotMem[offUsed] == 0 {
					return nil, false, nil
				}
				if binary.BigEndian.Uint32(slotMem) == zerocopy.CRC32C(slotMem[4:]) {
					break
				}
				if tries > 100 {
					return nil, false, fmt.Errorf("slot %d never consistent", j)
				}
			}
			// The slot is the server's: lengths beyond the layout are an
			// error, not an index out of range.
			kl, vl := int(slotMem[offKLen]), int(binary.BigEndian.Uint16(slotMem[offVLen:]))
			if kl > maxKey || vl > maxVal {
				return nil, false, fmt.Errorf("slot %d: key of %d bytes, value of %d: not this table's layout", j, kl, vl)
			}
			if string(slotMem[offKey:offKey+kl]) == string(key) {
				return append([]byte(nil), slotMem[offVal:offVal+vl]...), true, nil
			}
		}
		return nil, false, nil
	}
	start := time.Now()
	for g := 0; g < ngets; g++ {
		i := (g * 7919) % (nkeys + nkeys/10) // about 9% misses
		v, ok, err := get(keyOf(i))
		if err != nil {
			return err
		}
		if i < nkeys && (!ok || string(v) != string(valOf(i))) {
			return fmt.Errorf("GET %q = %q, %v; want %q", keyOf(i), v, ok, valOf(i))
		}
		if i >= nkeys && ok {
			return fmt.Errorf("GET %q found a key never PUT", keyOf(i))
		}
	}
	el := time.Since(start)
	fmt.Printf("PUT %d keys by Send (the server applied %d)\n", nkeys, srv.puts.Load())
	if ngets > 0 {
		fmt.Printf("GET %d keys by one-sided RDMA Read in %v: %.1f µs per GET, every value checked\n",
			ngets, el.Round(time.Millisecond), float64(el.Microseconds())/float64(ngets))
	}
	fmt.Printf("server receive completions during the GETs: %d (no server CPU per GET)\n", srv.recvs.Load()-recvsBefore)
	if srv.recvs.Load() != recvsBefore {
		return errors.New("the server handled messages during the GET phase")
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer dcancel()
	return conn.Disconnect(dctx)
}
