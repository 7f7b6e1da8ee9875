package capi_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestVersionMismatch: a service of another protocol version refuses the
// library's HELLO with a text naming both versions, and the library says
// so on standard error (the program sees no device).
func TestVersionMismatch(t *testing.T) {
	installed(t, "ibv_devices", "ibverbs-utils")
	dir := libs(t, false)
	sock := filepath.Join(world(t), "other.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chmod(sock, 0o666)
	const text = "protocol version mismatch: service speaks 3, client 2"
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			n, _, _, _, err := c.ReadMsgUnix(buf, make([]byte, 128))
			// A HELLO (type 1) of version 2 (argument 1).
			if err == nil && n >= 32 && binary.LittleEndian.Uint16(buf) == 1 && binary.LittleEndian.Uint64(buf[24:]) == 2 {
				m := binary.LittleEndian.AppendUint16(nil, 1) // HELLO
				m = append(m, 1, 0)                           // one argument
				m = binary.LittleEndian.AppendUint32(m, 0)    // seq
				m = binary.LittleEndian.AppendUint32(m, 10)   // status VERSION
				m = binary.LittleEndian.AppendUint32(m, uint32(2+len(text)))
				m = binary.LittleEndian.AppendUint64(m, 3) // the service's version
				m = binary.LittleEndian.AppendUint16(m, uint16(len(text)))
				m = append(m, text...)
				c.Write(m)
			}
			c.Close()
		}
	}()
	out, err := command(t, dir, sock, "ibv_devices").CombinedOutput()
	if !bytes.Contains(out, []byte("rdmatap: the service refused the session: "+text)) {
		t.Fatalf("ibv_devices on a service of version 3: %v\n%s", err, out)
	}
}
