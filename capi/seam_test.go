package capi_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"go/constant"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/capi"
)

// The headers whose protocol constants TestHeaderConstants checks.
var protocolHeaders = []string{"include/rdmatap_core.h", "core/rt_internal.h", "ibverbs/ibv_rt.h"}

// goConstants names, for each constant of the C headers, the Go constant
// of the protocol it must equal (package svc's, iwarp's or verbs').
var goConstants = map[string]string{
	// Wire limits and HELLO.
	"RT_MAX_MSG": "svc.MaxMessage", "RT_MAX_ARGS": "svc.MaxArgs", "RT_MAX_FDS": "svc.MaxFDs", "RT_HDR_SIZE": "svc.HeaderSize",
	"RT_MAGIC": "svc.Magic", "RT_VERSION_NUM": "svc.Version",
	"RT_FEATURE_QUERY_DEVICE": "svc.FeatureQueryDevice", "RT_FEATURE_INLINE_DATA": "svc.FeatureInlineData",
	"RT_FEATURE_LINK": "svc.FeatureLink", "RT_FEATURE_LINK_BIT": "svc.FeatureLink", "RT_FEATURE_CM": "svc.FeatureCM", "RT_FEATURE_CM_BIT": "svc.FeatureCM",
	"RT_HELLO_VERSION": "svc.HelloVersion", "RT_HELLO_FLAGS": "svc.HelloFlags", "RT_HELLO_ID": "svc.HelloID",
	"RT_HELLO_FEATURES": "svc.HelloFeatures", "RT_HELLO_ARGS": "svc.HelloArgs",
	// Message types.
	"RT_HELLO": "svc.THello", "RT_ALLOC_PD": "svc.TAllocPD", "RT_DEALLOC_PD": "svc.TDeallocPD", "RT_CREATE_CQ": "svc.TCreateCQ",
	"RT_DESTROY_CQ": "svc.TDestroyCQ", "RT_REG_MR": "svc.TRegMR", "RT_DEREG_MR": "svc.TDeregMR", "RT_CREATE_SRQ": "svc.TCreateSRQ",
	"RT_DESTROY_SRQ": "svc.TDestroySRQ", "RT_SRQ_LIMIT": "svc.TSRQLimit", "RT_CREATE_QP": "svc.TCreateQP",
	"RT_DESTROY_QP": "svc.TDestroyQP", "RT_QUERY_QP": "svc.TQueryQP", "RT_DISCONNECT": "svc.TDisconnect", "RT_DIAL": "svc.TDial",
	"RT_LISTEN": "svc.TListen", "RT_CLOSE_LISTENER": "svc.TCloseListener", "RT_GET_REQUEST": "svc.TGetRequest",
	"RT_ACCEPT": "svc.TAccept", "RT_REJECT": "svc.TReject", "RT_CANCEL": "svc.TCancel", "RT_EVENT": "svc.TEvent",
	"RT_QP_DONE": "svc.TQPDone", "RT_ERROR": "svc.TError", "RT_ALLOC_MR": "svc.TAllocMR", "RT_MAP_MR": "svc.TMapMR",
	"RT_SET_IOVA": "svc.TSetIOVA", "RT_ALLOC_MW": "svc.TAllocMW", "RT_DEALLOC_MW": "svc.TDeallocMW", "RT_BIND_MW": "svc.TBindMW",
	"RT_QUERY_MEM": "svc.TQueryMem", "RT_STATS": "svc.TStats", "RT_QUERY_DEVICE": "svc.TQueryDevice",
	"RT_QUERY_PORT": "svc.TQueryPort", "RT_QP_ERROR": "svc.TQPError",
	// Statuses.
	"RT_OK": "svc.StatusOK", "RT_INVALID_ARGUMENT": "svc.StatusInvalidArgument", "RT_INVALID_STATE": "svc.StatusInvalidState",
	"RT_BUSY": "svc.StatusBusy", "RT_CLOSED": "svc.StatusClosed", "RT_QUEUE_FULL": "svc.StatusQueueFull",
	"RT_REJECTED": "svc.StatusRejected", "RT_LIMIT": "svc.StatusLimit", "RT_PERMISSION": "svc.StatusPermission",
	"RT_CANCELED": "svc.StatusCanceled", "RT_VERSION": "svc.StatusVersion", "RT_GENERAL": "svc.StatusGeneral",
	"RT_TOO_MANY_SGE": "svc.StatusTooManySGE", "RT_MARKERS": "svc.StatusMarkers", "RT_NO_MATCHING_RTR": "svc.StatusNoMatchingRTR",
	"RT_TIMEOUT": "svc.StatusTimeout", "RT_INVALID_WR": "svc.StatusInvalidWR", "RT_INVALID_ARG_WR": "svc.StatusInvalidArgWR",
	"RT_ERRNO": "svc.StatusErrno",
	// EVENT: its arguments, types, Terminate layers and reasons.
	"RT_EVA_TYPE": "svc.EventArgType", "RT_EVA_QPN": "svc.EventArgQPN", "RT_EVA_SRQ": "svc.EventArgSRQ",
	"RT_EVA_TERM_LAYER": "svc.EventArgTermLayer", "RT_EVA_TERM_TYPE": "svc.EventArgTermType",
	"RT_EVA_TERM_CODE": "svc.EventArgTermCode", "RT_EVA_REASON": "svc.EventArgReason",
	"RT_EV_ESTABLISHED": "verbs.EventEstablished", "RT_EV_DISCONNECTED": "verbs.EventDisconnected",
	"RT_EV_TERMINATE_SENT": "verbs.EventTerminateSent", "RT_EV_TERMINATE_RECEIVED": "verbs.EventTerminateReceived",
	"RT_EV_QP_FATAL": "verbs.EventQPFatal", "RT_EV_SRQ_LIMIT_REACHED": "verbs.EventSRQLimitReached",
	"RT_EV_SRQ_ERR": "verbs.EventSRQErr",
	"RT_TERM_RDMAP": "iwarp.LayerRDMAP", "RT_TERM_DDP": "iwarp.LayerDDP", "RT_TERM_LLP": "iwarp.LayerLLP",
	"RT_DISC_LOCAL": "svc.DisconnectLocal", "RT_DISC_PEER": "svc.DisconnectPeer", "RT_DISC_ERROR": "svc.DisconnectError",
	// Values.
	"RT_TRI_UNSET": "svc.TriUnset", "RT_TRI_FALSE": "svc.TriFalse", "RT_TRI_TRUE": "svc.TriTrue",
	"RT_QPS_IDLE": "iwarp.StateIdle", "RT_QPS_RTS": "iwarp.StateRTS", "RT_QPS_CLOSING": "iwarp.StateClosing",
	"RT_QPS_TERMINATE": "iwarp.StateTerminate", "RT_QPS_ERROR": "iwarp.StateError",
	// QUERY_DEVICE and QUERY_PORT replies.
	"RT_QD_MAX_QP": "svc.QueryMaxQP", "RT_QD_MAX_QP_WR": "svc.QueryMaxQPWR", "RT_QD_MAX_SGE": "svc.QueryMaxSGE",
	"RT_QD_MAX_SGE_RD": "svc.QueryMaxSGERd", "RT_QD_MAX_CQ": "svc.QueryMaxCQ", "RT_QD_MAX_CQE": "svc.QueryMaxCQE",
	"RT_QD_MAX_MR": "svc.QueryMaxMR", "RT_QD_MAX_MR_SIZE": "svc.QueryMaxMRSize", "RT_QD_MAX_PD": "svc.QueryMaxPD",
	"RT_QD_MAX_QP_RD_ATOM": "svc.QueryMaxQPRdAtom", "RT_QD_MAX_QP_INIT_RD": "svc.QueryMaxQPInitRd",
	"RT_QD_MAX_SRQ": "svc.QueryMaxSRQ", "RT_QD_MAX_SRQ_WR": "svc.QueryMaxSRQWR", "RT_QD_MAX_SRQ_SGE": "svc.QueryMaxSRQSGE",
	"RT_QD_MAX_INLINE": "svc.QueryMaxInline", "RT_QD_MAX_PRIV_DATA": "svc.QueryMaxPrivData",
	"RT_QD_MAX_MSG_SIZE": "svc.QueryMaxMsgSize", "RT_QD_ATOMIC_CAP": "svc.QueryAtomicCap",
	"RT_QD_PAGE_SIZE_CAP": "svc.QueryPageSizeCap", "RT_QD_MAX_MW": "svc.QueryMaxMW", "RT_QD_MAX_FR_PAGES": "svc.QueryMaxFRPages",
	"RT_QD_VENDOR_PART_ID": "svc.QueryVendorPartID", "RT_QD_VENDOR_ID": "svc.QueryVendorID", "RT_QD_ARGS": "svc.QueryArgs",
	"RT_PORT_STATE": "svc.PortState", "RT_PORT_PHYS_STATE": "svc.PortPhysState", "RT_PORT_LINK_MTU": "svc.PortLinkMTU",
	"RT_PORT_ACTIVE_MTU": "svc.PortActiveMTU", "RT_PORT_ACTIVE_WIDTH": "svc.PortActiveWidth",
	"RT_PORT_ACTIVE_SPEED": "svc.PortActiveSpeed", "RT_PORT_ARGS": "svc.PortArgs",
	"RT_PORT_FIELD_IPV4": "svc.PortFieldIPv4", "RT_PORT_FIELD_MAC": "svc.PortFieldMAC", "RT_PORT_FIELD_GID": "svc.PortFieldGID",
	"RT_PORT_FIELD_GUID": "svc.PortFieldGUID", "RT_PORT_FIELDS": "svc.PortFields",
	// Connections: DIAL and ACCEPT, LISTEN and GET_REQUEST replies.
	"RT_NEG_MPA_REVISION": "svc.NegMPARevision", "RT_NEG_CRC": "svc.NegCRC", "RT_NEG_IRD": "svc.NegIRD", "RT_NEG_ORD": "svc.NegORD",
	"RT_NEG_PEER_TO_PEER": "svc.NegPeerToPeer", "RT_NEG_RTR": "svc.NegRTR", "RT_NEG_MARKERS_TX": "svc.NegMarkersTx",
	"RT_NEG_MARKERS_RX": "svc.NegMarkersRx", "RT_NEG_ARGS": "svc.NegArgs",
	"RT_CONN_FIELD_LOCAL": "svc.ConnFieldLocal", "RT_CONN_FIELD_REMOTE": "svc.ConnFieldRemote",
	"RT_CONN_FIELD_PRIVATE_DATA": "svc.ConnFieldPrivateData", "RT_CONN_FIELDS": "svc.ConnFields",
	"RT_LISTEN_HANDLE": "svc.ListenHandle", "RT_LISTEN_PORT": "svc.ListenPort", "RT_LISTEN_ARGS": "svc.ListenArgs",
	"RT_REQ_HANDLE": "svc.ReqHandle", "RT_REQ_MPA_REVISION": "svc.ReqMPARevision", "RT_REQ_CRC": "svc.ReqCRC",
	"RT_REQ_IRD": "svc.ReqIRD", "RT_REQ_ORD": "svc.ReqORD", "RT_REQ_PEER_TO_PEER": "svc.ReqPeerToPeer", "RT_REQ_RTR": "svc.ReqRTR",
	"RT_REQ_MARKERS": "svc.ReqMarkers", "RT_REQ_ARGS": "svc.ReqArgs",
	"RT_REQ_FIELD_ADDR": "svc.ReqFieldAddr", "RT_REQ_FIELD_PRIVATE_DATA": "svc.ReqFieldPrivateData", "RT_REQ_FIELDS": "svc.ReqFields",
	// Rings: send opcodes and flags, completion flags, arm states.
	"RING_ENTRIES": "svc.RingHeader",
	"RT_OP_SEND":   "iwarp.WRSend", "RT_OP_SEND_WITH_INV": "iwarp.WRSendInvalidate", "RT_OP_RDMA_WRITE": "iwarp.WRWrite",
	"RT_OP_RDMA_READ": "iwarp.WRRead", "RT_OP_RDMA_WRITE_WITH_IMM": "iwarp.WRWriteImm", "RT_OP_SEND_WITH_IMM": "iwarp.WRSendImm",
	"RT_OP_CMP_SWP": "iwarp.WRAtomicCmpSwap", "RT_OP_FETCH_ADD": "iwarp.WRAtomicFetchAdd", "RT_OP_LOCAL_INV": "iwarp.WRLocalInv",
	"RT_OP_BIND_MW":  "iwarp.WRBindMW",
	"RT_SF_SIGNALED": "iwarp.FlagSignaled", "RT_SF_INLINE": "iwarp.FlagInline", "RT_SF_SOLICITED": "iwarp.FlagSolicited",
	"RT_SF_FENCE": "iwarp.FlagFence", "RT_SF_INLINE_DATA": "svc.FlagInlineData",
	"RT_WCF_WITH_INV": "iwarp.CompWithInvalidate", "RT_WCF_SOLICITED": "iwarp.CompSolicited", "RT_WCF_WITH_IMM": "iwarp.CompWithImm",
	"RT_ARM_NONE": "svc.ArmNone", "RT_ARM_ANY": "svc.ArmAny", "RT_ARM_SOLICITED": "svc.ArmSolicited",
}

// cOnly are the headers' constants with no exported Go counterpart, and why.
var cOnly = map[string]string{
	"RT_FEATURES": "the features the C library knows (a subset of svc.Features)",
	// The ring header's offsets are unexported in package svc; the
	// protocol's checked tables pin both sides.
	"RING_PROD": "", "RING_CONS": "", "RING_WAITING": "", "RING_ARM": "", "RING_EVENTS": "", "RING_OVERFLOW": "",
	"RING_CAPACITY": "", "RING_ESIZE": "",
}

var (
	cComment = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	cEnum    = regexp.MustCompile(`(?s)\benum\s*\w*\s*\{([^}]*)\}`)
	cDefine  = regexp.MustCompile(`(?m)^#define[ \t]+((?:RT|RING)_[A-Z0-9_]+)[ \t]+([^\n]+)$`)
	cIdent   = regexp.MustCompile(`^\s*([A-Za-z_]\w*)`)
)

// headerConstants lists the enumerators and object-like macros of the
// protocol headers, whose values are numbers.
func headerConstants(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	var names []string
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	for _, h := range protocolHeaders {
		b, err := os.ReadFile(h)
		if err != nil {
			t.Fatal(err)
		}
		text := cComment.ReplaceAllString(string(b), "")
		for _, m := range cEnum.FindAllStringSubmatch(text, -1) {
			for _, item := range strings.Split(m[1], ",") {
				if id := cIdent.FindStringSubmatch(item); id != nil {
					add(id[1])
				}
			}
		}
		for _, m := range cDefine.FindAllStringSubmatch(text, -1) {
			if !strings.Contains(m[2], "__attribute__") {
				add(m[1])
			}
		}
	}
	return names
}

// cValues compiles a program that prints each of names as the headers
// define it, runs it and returns the values.
func cValues(t *testing.T, names []string) map[string]uint64 {
	t.Helper()
	var src bytes.Buffer
	src.WriteString("#include <stdio.h>\n#include \"ibv_rt.h\"\nint main(void)\n{\n")
	for _, n := range names {
		fmt.Fprintf(&src, "\tprintf(\"%%s %%llu\\n\", \"%s\", (unsigned long long)(%s));\n", n, n)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	cfile, prog := filepath.Join(dir, "consts.c"), filepath.Join(dir, "consts")
	if err := os.WriteFile(cfile, src.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, capi.CFlags...), "-I", "include", "-I", "core", "-I", "ibverbs", "-o", prog, cfile)
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	out, err := exec.Command(prog).Output()
	if err != nil {
		t.Fatalf("%s: %v", prog, err)
	}
	vals := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		n, err := strconv.ParseUint(v, 10, 64)
		if !ok || err != nil {
			t.Fatalf("the program printed %q", sc.Text())
		}
		vals[name] = n
	}
	return vals
}

// goPackages loads the packages at paths from their export data (which
// go list builds); internal packages too.
func goPackages(t *testing.T, paths ...string) map[string]*types.Package {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Export"}, paths...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(p string) (io.ReadCloser, error) { return os.Open(exports[p]) })
	pkgs := map[string]*types.Package{}
	for _, p := range paths {
		pkg, err := imp.Import(p)
		if err != nil {
			t.Fatal(err)
		}
		pkgs[pkg.Name()] = pkg
	}
	return pkgs
}

// TestHeaderConstants checks that every constant of the C libraries'
// protocol headers (message types, statuses, argument indexes, values,
// ring opcodes and flags) equals the Go constant of the protocol it
// stands for, and that every constant listed here is still in the headers.
func TestHeaderConstants(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler (cc)")
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("skipping: no libibverbs headers (Debian package libibverbs-dev)")
	}
	names := headerConstants(t)
	if len(names) < len(goConstants) {
		t.Fatalf("found %d constants in the headers, fewer than the %d listed", len(names), len(goConstants))
	}
	vals := cValues(t, names)
	pkgs := goPackages(t, "github.com/rdmatap/rdmatap/verbs/internal/svc", "github.com/rdmatap/rdmatap/iwarp",
		"github.com/rdmatap/rdmatap/verbs")
	inHeaders := map[string]bool{}
	for _, n := range names {
		inHeaders[n] = true
		v, ok := vals[n]
		if !ok {
			t.Errorf("%s: not printed", n)
			continue
		}
		goName, ok := goConstants[n]
		if !ok {
			if _, ok := cOnly[n]; !ok {
				t.Errorf("%s = %d: no Go constant is named for it", n, v)
			}
			continue
		}
		pkg, obj, _ := strings.Cut(goName, ".")
		p := pkgs[pkg]
		if p == nil {
			t.Errorf("%s: package %s not loaded", n, pkg)
			continue
		}
		c, ok := p.Scope().Lookup(obj).(*types.Const)
		if !ok {
			t.Errorf("%s: %s is not a constant", n, goName)
			continue
		}
		gv, exact := constant.Uint64Val(constant.ToInt(c.Val()))
		if !exact {
			t.Errorf("%s: %s = %v is not a uint64", n, goName, c.Val())
			continue
		}
		if gv != v {
			t.Errorf("%s = %d, but %s = %d", n, v, goName, gv)
		}
	}
	for _, m := range []map[string]string{goConstants, cOnly} {
		for n := range m {
			if !inHeaders[n] {
				t.Errorf("%s is listed but not in the headers", n)
			}
		}
	}
}

// TestNoTwoWayCalls checks the C libraries' structure: of any two C files
// of a library, at most one uses (calls, or takes the address of) the
// other's functions and data.
func TestNoTwoWayCalls(t *testing.T) {
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skip("skipping: no C compiler (cc)")
	}
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("skipping: no libibverbs headers (Debian package libibverbs-dev)")
	}
	dir := t.TempDir()
	for _, lib := range [][]string{{"ibverbs", "core"}, {"rdmacm"}} {
		defined := map[string]string{} // symbol → the file defining it
		used := map[string][]string{}  // file → the symbols it needs
		for _, d := range lib {
			srcs, _ := filepath.Glob(filepath.Join(d, "*.c"))
			for _, src := range srcs {
				obj := filepath.Join(dir, strings.ReplaceAll(src, "/", "_")+".o")
				args := append(append([]string{}, capi.CFlags...), "-O2", "-c", "-I", "include", "-I", lib[0], "-I", "core", "-o", obj, src)
				if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
					t.Fatalf("cc %s: %v\n%s", src, err, out)
				}
				f, err := elf.Open(obj)
				if err != nil {
					t.Fatal(err)
				}
				syms, err := f.Symbols()
				f.Close()
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range syms {
					if elf.ST_BIND(s.Info) != elf.STB_GLOBAL || s.Name == "" {
						continue
					}
					if s.Section == elf.SHN_UNDEF {
						used[src] = append(used[src], s.Name)
					} else {
						defined[s.Name] = src
					}
				}
			}
		}
		uses := map[[2]string][]string{} // (user, definer) → symbols
		for user, syms := range used {
			for _, s := range syms {
				if def, ok := defined[s]; ok && def != user {
					uses[[2]string{user, def}] = append(uses[[2]string{user, def}], s)
				}
			}
		}
		var pairs []string
		for k, a := range uses {
			if b, ok := uses[[2]string{k[1], k[0]}]; ok && k[0] < k[1] {
				sort.Strings(a)
				sort.Strings(b)
				pairs = append(pairs, fmt.Sprintf("%s uses %s's %v, and %s uses %s's %v", k[0], k[1], a, k[1], k[0], b))
			}
		}
		sort.Strings(pairs)
		for _, p := range pairs {
			t.Error(p)
		}
	}
}
