package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"rdmatap/iwarp"
	"rdmatap/verbs"
)

func init() {
	register(command{"up", "run a standalone endpoint on a TAP device; serves a control socket", upCmd})
	register(command{"devinfo", "device attributes of a running endpoint (like ibv_devinfo)", devinfoCmd})
	register(command{"stat", "counters of a running endpoint (like rdma statistic)", statCmd})
}

// defaultCtl is the control socket of device name.
func defaultCtl(name string) string {
	if os.Geteuid() == 0 {
		return filepath.Join("/run/rdmatap", name+".sock")
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "rdmatap", name+".sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("rdmatap-%d", os.Getuid()), name+".sock")
}

func upCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var ef endpointFlags
	ef.register(fs)
	ctl := fs.String("ctl", "", "control socket path (default /run/rdmatap/NAME.sock)")
	if err := parseFlags(fs, args, stderr, "up", "Bring up an endpoint on a TAP device and keep it running until SIGINT/SIGTERM."); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if _, _, _, err := ef.check(); err != nil {
		return err
	}
	if *ctl == "" {
		*ctl = defaultCtl(ef.name)
	}
	e, err := ef.open()
	if err != nil {
		return err
	}
	defer e.Close()
	logger := log.New(stdout, "", log.LstdFlags|log.Lmicroseconds)
	srv, err := serveControl(*ctl, e)
	if err != nil {
		return err
	}
	defer srv.Close()
	created := "attached to"
	if e.Tap.Created() {
		created = "created"
	}
	logger.Printf("up: device %s on TAP %s (%s), address %s, MTU %d, offload %v, control socket %s",
		e.Dev.Name(), ef.tap, created, ef.addr, ef.mtu, e.Tap.Offload(), *ctl)

	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	for {
		select {
		case s := <-sig:
			logger.Printf("up: %v: closing connections", s)
			if e.Tap.Created() {
				logger.Printf("up: removing TAP %s", ef.tap)
			}
			return nil
		case ev := <-e.Dev.Events():
			logger.Print(formatEvent(ev))
		}
	}
}

func formatEvent(ev verbs.AsyncEvent) string {
	s := fmt.Sprintf("event: %v qp %d", ev.Type, ev.QPNum)
	if ev.Term != (iwarp.TermCode{}) {
		s += fmt.Sprintf(" terminate %v", ev.Term)
	}
	if ev.Err != nil {
		s += fmt.Sprintf(" (%v)", ev.Err)
	}
	return s
}

// parseFlags parses with one-line errors and a -h text.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, name, what string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "usage: rdmatap %s [flags]\n\n%s\n\n", name, what)
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return err
		}
		return fmt.Errorf("%w: %v (see rdmatap %s -h)", errUsage, err, name)
	}
	return nil
}

// The control socket speaks one JSON request line and one JSON reply line
// per connection: {"cmd":"devinfo"} or {"cmd":"stat"}.
type ctlRequest struct {
	Cmd string `json:"cmd"`
}

type ctlReply struct {
	Error   string   `json:"error,omitempty"`
	DevInfo *devInfo `json:"devinfo,omitempty"`
	Stat    *statSet `json:"stat,omitempty"`
}

type ctlServer struct {
	ln   net.Listener
	path string
	e    *endpoint
	wg   sync.WaitGroup
}

func serveControl(path string, e *endpoint) (*ctlServer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// A socket left by a crashed endpoint is removed; a live one is not.
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("control socket %s is already in use by another running endpoint", path)
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	s := &ctlServer{ln: ln, path: path, e: e}
	s.wg.Add(1)
	go s.loop()
	return s, nil
}

func (s *ctlServer) loop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadBytes('\n')
			if err != nil && len(line) == 0 {
				return
			}
			var req ctlRequest
			var rep ctlReply
			if err := json.Unmarshal(line, &req); err != nil {
				rep.Error = "bad request: " + err.Error()
			} else {
				switch req.Cmd {
				case "devinfo":
					d := getDevInfo(s.e)
					rep.DevInfo = &d
				case "stat":
					st := getStats(s.e)
					rep.Stat = &st
				default:
					rep.Error = fmt.Sprintf("unknown command %q", req.Cmd)
				}
			}
			b, _ := json.Marshal(rep)
			c.Write(append(b, '\n'))
		}()
	}
}

func (s *ctlServer) Close() {
	s.ln.Close()
	s.wg.Wait()
	os.Remove(s.path)
}

// ctlCall sends one request to a running endpoint.
func ctlCall(ctx context.Context, path, cmd string) (ctlReply, error) {
	var rep ctlReply
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return rep, fmt.Errorf("no endpoint is running with control socket %s (start one with rdmatap up)", path)
		}
		if errors.Is(err, os.ErrPermission) {
			return rep, fmt.Errorf("control socket %s: permission denied", path)
		}
		return rep, fmt.Errorf("control socket %s: %w", path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	b, _ := json.Marshal(ctlRequest{Cmd: cmd})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return rep, fmt.Errorf("control socket %s: %w", path, err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return rep, fmt.Errorf("control socket %s: no reply: %w", path, err)
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("control socket %s: bad reply: %w", path, err)
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// devInfo is what devinfo prints (the ibv_devinfo field names).
type devInfo struct {
	HCAID        string           `json:"hca_id"`
	Transport    string           `json:"transport"`
	FWVer        string           `json:"fw_ver"`
	NodeGUID     string           `json:"node_guid"`
	SysImageGUID string           `json:"sys_image_guid"`
	VendorID     string           `json:"vendor_id"`
	VendorPartID uint32           `json:"vendor_part_id"`
	HWVer        string           `json:"hw_ver"`
	PhysPortCnt  int              `json:"phys_port_cnt"`
	Attr         verbs.DeviceAttr `json:"attr"`
	Port         portInfo         `json:"port"`
}

type portInfo struct {
	State      string `json:"state"`
	ActiveMTU  int    `json:"active_mtu"`
	LinkLayer  string `json:"link_layer"`
	Netdev     string `json:"netdev"`
	MAC        string `json:"mac"`
	Address    string `json:"address"`
	Offload    bool   `json:"offload"`
	TAPCreated bool   `json:"tap_created"`
}

// nodeGUID derives the node GUID from the MAC as EUI-64, as siw does
// (52:54:00:4d:00:02 -> 5054:00ff:fe4d:0002).
func nodeGUID(mac net.HardwareAddr) string {
	if len(mac) != 6 {
		return "0000:0000:0000:0000"
	}
	g := []byte{mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
	return fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7])
}

func getDevInfo(e *endpoint) devInfo {
	var mac net.HardwareAddr
	d := devInfo{HCAID: e.Dev.Name(), Transport: "iWARP (1)", FWVer: "0.0.0", VendorID: "0x0", HWVer: "0x0",
		PhysPortCnt: 1, Attr: e.Dev.Query()}
	p := portInfo{State: "PORT_ACTIVE (4)", LinkLayer: "Ethernet", Address: e.Addr.String()}
	if e.Tap != nil {
		mac = e.Tap.MAC()
		p.Netdev, p.MAC, p.Offload, p.TAPCreated = e.Tap.Name(), mac.String(), e.Tap.Offload(), e.Tap.Created()
		p.ActiveMTU = int(e.Tap.LinkEndpoint().MTU())
	}
	d.NodeGUID = nodeGUID(mac)
	d.SysImageGUID = d.NodeGUID
	d.Port = p
	return d
}

// statSet is what stat prints.
type statSet struct {
	Device string            `json:"device"`
	Verbs  verbs.Stats       `json:"verbs"`
	Link   any               `json:"link,omitempty"`
	Ops    map[string]uint64 `json:"ops"`
}

func getStats(e *endpoint) statSet {
	s := statSet{Device: e.Dev.Name(), Verbs: e.Dev.Stats(), Ops: map[string]uint64{}}
	for i := 0; i < 12; i++ {
		name := strings.ReplaceAll(strings.ToLower(iwarp.Opcode(i).String()), " ", "_")
		if v := s.Verbs.RxOps[i]; v != 0 {
			s.Ops["rx_"+name] = v
		}
		if v := s.Verbs.TxOps[i]; v != 0 {
			s.Ops["tx_"+name] = v
		}
	}
	if e.Tap != nil {
		s.Link = e.Tap.Stats()
	}
	return s
}

func ctlFlags(name string, args []string, stderr io.Writer, what string) (path string, jsonOut, verbose bool, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ctl := fs.String("ctl", "", "control socket of the endpoint (default /run/rdmatap/DEV.sock)")
	dev := fs.String("d", "rt0", "device name")
	j := fs.Bool("j", false, "JSON output")
	v := fs.Bool("v", false, "verbose")
	if err := parseFlags(fs, args, stderr, name, what); err != nil {
		return "", false, false, err
	}
	if fs.NArg() > 0 {
		return "", false, false, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *ctl == "" {
		*ctl = defaultCtl(*dev)
	}
	return *ctl, *j, *v, nil
}

func devinfoCmd(args []string, stdout, stderr io.Writer) error {
	path, jsonOut, verbose, err := ctlFlags("devinfo", args, stderr, "Print the attributes of a running endpoint's device, as ibv_devinfo does.")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := ctlCall(ctx, path, "devinfo")
	if err != nil {
		return err
	}
	if jsonOut {
		return json.NewEncoder(stdout).Encode(rep.DevInfo)
	}
	d := rep.DevInfo
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	fmt.Fprintf(w, "hca_id:\t%s\n", d.HCAID)
	fmt.Fprintf(w, "\ttransport:\t\t\t%s\n", d.Transport)
	fmt.Fprintf(w, "\tfw_ver:\t\t\t\t%s\n", d.FWVer)
	fmt.Fprintf(w, "\tnode_guid:\t\t\t%s\n", d.NodeGUID)
	fmt.Fprintf(w, "\tsys_image_guid:\t\t\t%s\n", d.SysImageGUID)
	fmt.Fprintf(w, "\tvendor_id:\t\t\t%s\n", d.VendorID)
	fmt.Fprintf(w, "\tvendor_part_id:\t\t\t%d\n", d.VendorPartID)
	fmt.Fprintf(w, "\thw_ver:\t\t\t\t%s\n", d.HWVer)
	fmt.Fprintf(w, "\tphys_port_cnt:\t\t\t%d\n", d.PhysPortCnt)
	if verbose {
		a := d.Attr
		fmt.Fprintf(w, "\tmax_mr_size:\t\t\t%#x\n", a.MaxMRSize)
		fmt.Fprintf(w, "\tpage_size_cap:\t\t\t%#x\n", a.PageSizeCap)
		fmt.Fprintf(w, "\tmax_qp:\t\t\t\t%d\n", a.MaxQP)
		fmt.Fprintf(w, "\tmax_qp_wr:\t\t\t%d\n", a.MaxQPWR)
		fmt.Fprintf(w, "\tmax_sge:\t\t\t%d\n", a.MaxSGE)
		fmt.Fprintf(w, "\tmax_sge_rd:\t\t\t%d\n", a.MaxSGERd)
		fmt.Fprintf(w, "\tmax_cq:\t\t\t\t%d\n", a.MaxCQ)
		fmt.Fprintf(w, "\tmax_cqe:\t\t\t%d\n", a.MaxCQE)
		fmt.Fprintf(w, "\tmax_mr:\t\t\t\t%d\n", a.MaxMR)
		fmt.Fprintf(w, "\tmax_pd:\t\t\t\t%d\n", a.MaxPD)
		fmt.Fprintf(w, "\tmax_qp_rd_atom:\t\t\t%d\n", a.MaxQPRdAtom)
		fmt.Fprintf(w, "\tmax_qp_init_rd_atom:\t\t%d\n", a.MaxQPInitRd)
		fmt.Fprintf(w, "\tatomic_cap:\t\t\t%s (0)\n", a.AtomicCap)
		fmt.Fprintf(w, "\tmax_srq:\t\t\t%d\n", a.MaxSRQ)
		fmt.Fprintf(w, "\tmax_srq_wr:\t\t\t%d\n", a.MaxSRQWR)
		fmt.Fprintf(w, "\tmax_srq_sge:\t\t\t%d\n", a.MaxSRQSGE)
		fmt.Fprintf(w, "\tmax_inline_data:\t\t%d\n", a.MaxInline)
		fmt.Fprintf(w, "\tmax_private_data:\t\t%d\n", a.MaxPrivData)
	}
	p := d.Port
	fmt.Fprintf(w, "\t\tport:\t1\n")
	fmt.Fprintf(w, "\t\t\tstate:\t\t\t%s\n", p.State)
	fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%d\n", p.ActiveMTU)
	fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", p.LinkLayer)
	fmt.Fprintf(w, "\t\t\tnetdev:\t\t\t%s\n", p.Netdev)
	fmt.Fprintf(w, "\t\t\tmac:\t\t\t%s\n", p.MAC)
	fmt.Fprintf(w, "\t\t\taddress:\t\t%s\n", p.Address)
	fmt.Fprintf(w, "\t\t\toffload:\t\t%v\n", p.Offload)
	return nil
}

func statCmd(args []string, stdout, stderr io.Writer) error {
	path, jsonOut, _, err := ctlFlags("stat", args, stderr, "Print the counters of a running endpoint.")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rep, err := ctlCall(ctx, path, "stat")
	if err != nil {
		return err
	}
	if jsonOut {
		return json.NewEncoder(stdout).Encode(rep.Stat)
	}
	s := rep.Stat
	v := s.Verbs
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	fmt.Fprintf(w, "link %s/1", s.Device)
	for _, kv := range []struct {
		k string
		v uint64
	}{
		{"tx_fpdus", v.TxFPDUs}, {"rx_fpdus", v.RxFPDUs}, {"tx_bytes", v.TxBytes}, {"rx_bytes", v.RxBytes},
		{"placed_bytes", v.PlacedBytes}, {"placement_copies", v.PlacementCopies}, {"crc_errors", v.CRCErrors},
		{"terminates_sent", v.TerminatesSent}, {"terminates_received", v.TerminatesReceived},
	} {
		fmt.Fprintf(w, " %s %d", kv.k, kv.v)
	}
	for _, k := range sortedKeys(s.Ops) {
		fmt.Fprintf(w, " %s %d", k, s.Ops[k])
	}
	if m, ok := s.Link.(map[string]any); ok {
		for _, k := range sortedKeys(m) {
			fmt.Fprintf(w, " link_%s %v", strings.ToLower(k), m[k])
		}
	}
	fmt.Fprintln(w)
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}
