package svc

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmatap/rdmatap/iwarp"
)

// The protocol's specification (docs/service-protocol.md) is checked
// against this package, so that it cannot drift from the code:
//
//   - every ```hex block is decoded and checked: its first line is a title
//     that says what the bytes are and what they must decode to, e.g.
//     "# msg HELLO request seq=0 status=OK args=0x72646d6174617000,2" or
//     "# cq-entry id=42 status=0 op=RECV qp=17"; its other lines are hex
//     bytes, each line optionally led by its offset ("0010:") and
//     followed by a "# comment";
//   - every table after a "<!-- check: NAME -->" comment has rows whose
//     first two cells are a number and a name, which must agree with the
//     constant of that name here or in iwarp.
const protocolDoc = "../../../docs/service-protocol.md"

type docBlock struct {
	line  int // of the title
	title string
	data  []byte
}

type docTable struct {
	line int // of the marker
	name string
	rows [][2]string // number, name
	at   []int       // line of each row
	skip int         // rows read, the header's two included
}

// readProtocolDoc extracts the hex blocks and the checked tables.
func readProtocolDoc(t *testing.T) ([]docBlock, []docTable) {
	t.Helper()
	doc, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []docBlock
	var tables []docTable
	var blk *docBlock
	var tab *docTable
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trim := strings.TrimSpace(line)
		switch {
		case blk != nil && trim == "```":
			if blk.title == "" {
				t.Fatalf("%s:%d: hex block without a title", protocolDoc, blk.line)
			}
			blocks = append(blocks, *blk)
			blk = nil
		case blk != nil:
			if blk.title == "" {
				if !strings.HasPrefix(trim, "# ") {
					t.Fatalf("%s:%d: a hex block's first line must be its title (# ...), not %q", protocolDoc, n, line)
				}
				blk.title, blk.line = strings.TrimSpace(trim[2:]), n
				continue
			}
			if i := strings.IndexByte(trim, '#'); i >= 0 {
				trim = strings.TrimSpace(trim[:i])
			}
			if trim == "" {
				continue
			}
			if i := strings.IndexByte(trim, ':'); i >= 0 {
				off, err := strconv.ParseUint(trim[:i], 16, 32)
				if err != nil || int(off) != len(blk.data) {
					t.Fatalf("%s:%d: offset %q, but %d bytes precede the line", protocolDoc, n, trim[:i], len(blk.data))
				}
				trim = trim[i+1:]
			}
			for _, h := range strings.Fields(trim) {
				b, err := hex.DecodeString(h)
				if err != nil || len(b) != 1 {
					t.Fatalf("%s:%d: %q is not a hex byte", protocolDoc, n, h)
				}
				blk.data = append(blk.data, b[0])
			}
		case trim == "```hex":
			blk = &docBlock{line: n}
		case strings.HasPrefix(trim, "<!-- check: ") && strings.HasSuffix(trim, " -->"):
			tables = append(tables, docTable{line: n, name: strings.TrimSuffix(strings.TrimPrefix(trim, "<!-- check: "), " -->")})
			tab = &tables[len(tables)-1]
		case tab != nil && strings.HasPrefix(trim, "|"):
			cells := strings.Split(strings.Trim(trim, "|"), "|")
			if len(cells) < 2 {
				t.Fatalf("%s:%d: table row of one cell", protocolDoc, n)
			}
			if tab.skip++; tab.skip <= 2 {
				continue // the header and its separator
			}
			num := strings.Trim(strings.TrimSpace(cells[0]), "`")
			name := strings.Trim(strings.TrimSpace(cells[1]), "`")
			tab.rows = append(tab.rows, [2]string{num, name})
			tab.at = append(tab.at, n)
		case tab != nil && tab.skip > 0 && trim == "":
			tab = nil // the table has ended
		}
	}
	if blk != nil {
		t.Fatalf("%s:%d: unterminated hex block", protocolDoc, blk.line)
	}
	return blocks, tables
}

// titleKV is one key=value of a title; values may be Go-quoted strings.
type titleKV struct{ k, v string }

// parseTitle splits a title into its words (before the first key=value)
// and its keys.
func parseTitle(s string) (words []string, kvs []titleKV, err error) {
	for {
		s = strings.TrimLeft(s, " ")
		if s == "" {
			return words, kvs, nil
		}
		eq, sp := strings.IndexByte(s, '='), strings.IndexByte(s, ' ')
		if eq < 0 || (sp >= 0 && sp < eq) {
			if len(kvs) > 0 {
				return nil, nil, fmt.Errorf("word %q after the keys", s)
			}
			if sp < 0 {
				sp = len(s)
			}
			words = append(words, s[:sp])
			s = s[sp:]
			continue
		}
		k, rest := s[:eq], s[eq+1:]
		var v string
		if strings.HasPrefix(rest, `"`) {
			q, qerr := strconv.QuotedPrefix(rest)
			if qerr != nil {
				return nil, nil, fmt.Errorf("key %s: %v", k, qerr)
			}
			v, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			end := strings.IndexByte(rest, ' ')
			if end < 0 {
				end = len(rest)
			}
			v, rest = rest[:end], rest[end:]
		}
		kvs = append(kvs, titleKV{k, v})
		s = rest
	}
}

// statusByName names the reply statuses as the document does.
var statusByName = map[string]uint32{
	"OK": StatusOK, "INVALID_ARGUMENT": StatusInvalidArgument, "INVALID_STATE": StatusInvalidState, "BUSY": StatusBusy,
	"CLOSED": StatusClosed, "QUEUE_FULL": StatusQueueFull, "REJECTED": StatusRejected, "LIMIT": StatusLimit,
	"PERMISSION": StatusPermission, "CANCELED": StatusCanceled, "VERSION": StatusVersion, "GENERAL": StatusGeneral,
	"TOO_MANY_SGE": StatusTooManySGE, "MARKERS": StatusMarkers, "NO_MATCHING_RTR": StatusNoMatchingRTR,
	"TIMEOUT": StatusTimeout, "INVALID_WR": StatusInvalidWR, "INVALID_ARG_WR": StatusInvalidArgWR, "ERRNO": StatusErrno,
}

func parseU64(s string) (uint64, error) { return strconv.ParseUint(s, 0, 64) }

func parseList(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		v, err := parseU64(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func parseSGE(s string) (iwarp.SGE, error) {
	v, err := parseList(s)
	if err != nil || len(v) != 3 || v[1] > 1<<32-1 || v[2] > 1<<32-1 {
		return iwarp.SGE{}, fmt.Errorf("sge %q: want address,length,lkey", s)
	}
	return iwarp.SGE{Addr: v[0], Length: uint32(v[1]), LKey: uint32(v[2])}, nil
}

func wrOpByName(s string) (iwarp.WROp, bool) {
	for o := iwarp.WRSend; o <= iwarp.WRReadInv; o++ {
		if o.String() == s {
			return o, true
		}
	}
	return 0, false
}

func compOpByName(s string) (iwarp.CompletionOp, bool) {
	for o := 0; o < 256; o++ {
		if iwarp.CompletionOp(o).String() == s {
			return iwarp.CompletionOp(o), true
		}
	}
	return 0, false
}

// checkMsgBlock checks "# msg TYPE ROLE seq=N status=NAME [args=a,b,...]
// [field="..." | fieldhex=HEX]...": Check accepts the bytes, they decode
// to these values, and the Builder encodes these values to the same bytes.
func checkMsgBlock(words []string, kvs []titleKV, data []byte) error {
	if len(words) != 3 {
		return fmt.Errorf("want \"msg TYPE request|reply|event\", got %q", words)
	}
	m := Msg(data)
	if err := m.Check(); err != nil {
		return fmt.Errorf("Check: %v", err)
	}
	if m.Type().String() != words[1] {
		return fmt.Errorf("type %v (%d), title says %s", m.Type(), uint16(m.Type()), words[1])
	}
	var seq, status uint64
	var haveSeq, haveStatus bool
	var args []uint64
	var fields [][]byte
	for _, kv := range kvs {
		var err error
		switch kv.k {
		case "seq":
			seq, err = parseU64(kv.v)
			haveSeq = true
		case "status":
			st, ok := statusByName[kv.v]
			if !ok {
				return fmt.Errorf("unknown status %q", kv.v)
			}
			status, haveStatus = uint64(st), true
		case "args":
			args, err = parseList(kv.v)
		case "field":
			fields = append(fields, []byte(kv.v))
		case "fieldhex":
			var f []byte
			f, err = hex.DecodeString(kv.v)
			fields = append(fields, f)
		default:
			return fmt.Errorf("unknown key %q", kv.k)
		}
		if err != nil {
			return fmt.Errorf("%s=%s: %v", kv.k, kv.v, err)
		}
	}
	if !haveSeq || !haveStatus {
		return fmt.Errorf("the title needs seq= and status=")
	}
	switch words[2] {
	case "request":
		if status != uint64(StatusOK) {
			return fmt.Errorf("a request's status is 0")
		}
	case "event":
		if seq != 0 || status != uint64(StatusOK) || (m.Type() != TEvent && m.Type() != TQPDone) {
			return fmt.Errorf("an unsolicited message is EVENT or QP_DONE with seq 0 and status 0")
		}
	case "reply":
	default:
		return fmt.Errorf("role %q: want request, reply or event", words[2])
	}
	if uint64(m.Seq()) != seq || uint64(m.Status()) != status {
		return fmt.Errorf("seq %d status %d, title says %d and %d", m.Seq(), m.Status(), seq, status)
	}
	if m.NArgs() != len(args) {
		return fmt.Errorf("%d args, title says %d", m.NArgs(), len(args))
	}
	for i, a := range args {
		if m.Arg(i) != a {
			return fmt.Errorf("arg %d is %#x, title says %#x", i, m.Arg(i), a)
		}
	}
	got := make([][]byte, len(fields)+1)
	n, err := Fields(m.Payload(), got)
	if err != nil || n != len(fields) {
		return fmt.Errorf("payload holds %d fields (%v), title says %d", n, err, len(fields))
	}
	for i, f := range fields {
		if !bytes.Equal(got[i], f) {
			return fmt.Errorf("field %d is %q, title says %q", i, got[i], f)
		}
	}
	var b Builder
	b.Reset(m.Type(), uint32(seq), uint32(status)).Args(args...)
	for _, f := range fields {
		b.Bytes(f)
	}
	if want := b.Msg(); !bytes.Equal(want, m) {
		return fmt.Errorf("the Builder encodes the title's values as\n%x\nthe block holds\n%x", []byte(want), data)
	}
	return nil
}

// checkSendBlock checks "# send-entry maxsge=N id= op=NAME flags= remote=
// rkey= inv= imm= cmpadd= swap= access= addr= length= mr= obj= sge=a,l,k...":
// GetSend decodes the entry to the WR and handle, and PutSend encodes them
// to the same bytes.
func checkSendBlock(kvs []titleKV, data []byte) error {
	var wr iwarp.SendWR
	var obj, maxSGE, maxInline uint64
	haveOp := false
	for _, kv := range kvs {
		var v uint64
		var err error
		switch kv.k {
		case "data":
			if wr.Data, err = hex.DecodeString(kv.v); err != nil {
				return fmt.Errorf("data=%s: %v", kv.v, err)
			}
			continue
		case "op":
			op, ok := wrOpByName(kv.v)
			if !ok {
				return fmt.Errorf("unknown opcode %q", kv.v)
			}
			wr.Op, haveOp = op, true
			continue
		case "sge":
			s, err := parseSGE(kv.v)
			if err != nil {
				return err
			}
			wr.SGL = append(wr.SGL, s)
			continue
		}
		if v, err = parseU64(kv.v); err != nil {
			return fmt.Errorf("%s=%s: %v", kv.k, kv.v, err)
		}
		switch kv.k {
		case "maxsge":
			maxSGE = v
		case "maxinline":
			maxInline = v
		case "id":
			wr.ID = v
		case "flags":
			wr.Flags = iwarp.SendFlags(v)
		case "remote":
			wr.RemoteAddr = v
		case "rkey":
			wr.RKey = uint32(v)
		case "inv":
			wr.InvalidateRKey = uint32(v)
		case "imm":
			wr.Imm = uint32(v)
		case "cmpadd":
			wr.CompareAdd = v
		case "swap":
			wr.Swap = v
		case "access":
			wr.Access = iwarp.Access(v)
		case "addr":
			wr.Bind.Addr = v
		case "length":
			wr.Bind.Length = v
		case "mr":
			wr.Bind.MR = uint32(v)
		case "bindaccess":
			wr.Bind.Access = iwarp.Access(v)
		case "obj":
			obj = v
		default:
			return fmt.Errorf("unknown key %q", kv.k)
		}
	}
	if !haveOp || maxSGE == 0 {
		return fmt.Errorf("the title needs op= and maxsge=")
	}
	size := SendEntrySize(int(maxSGE))
	if maxInline != 0 {
		size = SendEntrySizeInline(int(maxSGE), int(maxInline))
	}
	if len(data) != size {
		return fmt.Errorf("%d bytes, an SQ entry with room for %d SGEs and %d inline bytes has %d", len(data), maxSGE, maxInline, size)
	}
	var got iwarp.SendWR
	gobj, err := GetSend(data, &got, make([]iwarp.SGE, 0, maxSGE))
	if err != nil {
		return fmt.Errorf("GetSend: %v", err)
	}
	if gobj != obj {
		return fmt.Errorf("handle %d, title says %d", gobj, obj)
	}
	if fmt.Sprint(got) != fmt.Sprint(wr) {
		return fmt.Errorf("GetSend decodes\n%+v\nthe title says\n%+v", got, wr)
	}
	want := make([]byte, len(data))
	if wr.Data != nil {
		PutSendData(want, &wr, wr.Data)
	} else {
		PutSend(want, &wr, obj)
	}
	if !bytes.Equal(want, data) {
		return fmt.Errorf("PutSend encodes the title's WR as\n%x\nthe block holds\n%x", want, data)
	}
	return nil
}

// checkRecvBlock checks "# recv-entry maxsge=N id= sge=a,l,k...".
func checkRecvBlock(kvs []titleKV, data []byte) error {
	var id, maxSGE uint64
	var sgl []iwarp.SGE
	for _, kv := range kvs {
		var err error
		switch kv.k {
		case "maxsge":
			maxSGE, err = parseU64(kv.v)
		case "id":
			id, err = parseU64(kv.v)
		case "sge":
			var s iwarp.SGE
			s, err = parseSGE(kv.v)
			sgl = append(sgl, s)
		default:
			return fmt.Errorf("unknown key %q", kv.k)
		}
		if err != nil {
			return fmt.Errorf("%s=%s: %v", kv.k, kv.v, err)
		}
	}
	if maxSGE == 0 || len(data) != RecvEntrySize(int(maxSGE)) {
		return fmt.Errorf("%d bytes, an RQ entry with room for %d SGEs has %d", len(data), maxSGE, RecvEntrySize(int(maxSGE)))
	}
	gid, gsgl, err := GetRecv(data, make([]iwarp.SGE, 0, maxSGE))
	if err != nil {
		return fmt.Errorf("GetRecv: %v", err)
	}
	if gid != id || fmt.Sprint(gsgl) != fmt.Sprint(sgl) {
		return fmt.Errorf("GetRecv decodes %d %v, the title says %d %v", gid, gsgl, id, sgl)
	}
	want := make([]byte, len(data))
	PutRecv(want, id, sgl)
	if !bytes.Equal(want, data) {
		return fmt.Errorf("PutRecv encodes the title's WR as\n%x\nthe block holds\n%x", want, data)
	}
	return nil
}

// checkCQBlock checks "# cq-entry id= status=N op=NAME flags= len= qp=
// inv= imm= term=layer,etype,code".
func checkCQBlock(kvs []titleKV, data []byte) error {
	var c iwarp.Completion
	for _, kv := range kvs {
		if kv.k == "op" {
			op, ok := compOpByName(kv.v)
			if !ok {
				return fmt.Errorf("unknown completion opcode %q", kv.v)
			}
			c.Op = op
			continue
		}
		if kv.k == "term" {
			v, err := parseList(kv.v)
			if err != nil || len(v) != 3 || v[0] > 255 || v[1] > 255 || v[2] > 255 {
				return fmt.Errorf("term=%s: want layer,etype,code", kv.v)
			}
			c.Term = iwarp.TermCode{Layer: iwarp.Layer(v[0]), EType: uint8(v[1]), Code: uint8(v[2])}
			continue
		}
		v, err := parseU64(kv.v)
		if err != nil {
			return fmt.Errorf("%s=%s: %v", kv.k, kv.v, err)
		}
		switch kv.k {
		case "id":
			c.ID = v
		case "status":
			c.Status = iwarp.Status(v)
		case "flags":
			c.Flags = iwarp.CompletionFlags(v)
		case "len":
			c.ByteLen = uint32(v)
		case "qp":
			c.QPNum = uint32(v)
		case "inv":
			c.InvalidatedRKey = uint32(v)
		case "imm":
			c.Imm = uint32(v)
		default:
			return fmt.Errorf("unknown key %q", kv.k)
		}
	}
	if len(data) != CQEntrySize {
		return fmt.Errorf("%d bytes, a CQ entry has %d", len(data), CQEntrySize)
	}
	var got iwarp.Completion
	GetCompletion(data, &got)
	if got != c {
		return fmt.Errorf("GetCompletion decodes\n%+v\nthe title says\n%+v", got, c)
	}
	want := make([]byte, CQEntrySize)
	PutCompletion(want, &c)
	if !bytes.Equal(want, data) {
		return fmt.Errorf("PutCompletion encodes the title's completion as\n%x\nthe block holds\n%x", want, data)
	}
	return nil
}

func TestProtocolDocExamples(t *testing.T) {
	blocks, _ := readProtocolDoc(t)
	count := map[string]int{}
	for _, b := range blocks {
		words, kvs, err := parseTitle(b.title)
		if err == nil && len(words) == 0 {
			err = fmt.Errorf("no kind")
		}
		if err == nil {
			switch words[0] {
			case "msg":
				err = checkMsgBlock(words, kvs, b.data)
			case "send-entry", "recv-entry", "cq-entry":
				if len(words) != 1 {
					err = fmt.Errorf("words %q after the kind", words[1:])
					break
				}
				switch words[0] {
				case "send-entry":
					err = checkSendBlock(kvs, b.data)
				case "recv-entry":
					err = checkRecvBlock(kvs, b.data)
				default:
					err = checkCQBlock(kvs, b.data)
				}
			default:
				err = fmt.Errorf("unknown kind %q (msg, send-entry, recv-entry, cq-entry)", words[0])
			}
		}
		if err != nil {
			t.Errorf("%s:%d: %s: %v", protocolDoc, b.line, b.title, err)
			continue
		}
		count[words[0]]++
	}
	if count["msg"] < 4 || count["send-entry"] < 1 || count["recv-entry"] < 1 || count["cq-entry"] < 1 {
		t.Errorf("the document's checked examples: %v; want at least 4 messages and one entry of each ring", count)
	}
}

// docConstants are the values the document's checked tables name.
var docConstants = map[string]func(name string) (uint64, bool){
	"message-types": func(s string) (uint64, bool) {
		for ty := Type(1); ty.Valid(); ty++ {
			if ty.String() == s {
				return uint64(ty), true
			}
		}
		return 0, false
	},
	"statuses": func(s string) (uint64, bool) { v, ok := statusByName[s]; return uint64(v), ok },
	"header": named(map[string]uint64{"Type": offType, "NArgs": offNArgs, "reserved": offNArgs + 1, "Seq": offSeq,
		"Status": offStatus, "PayloadLen": offPayloadLen, "args": HeaderSize}),
	"ring-header": named(map[string]uint64{"Prod": ringProd, "Cons": ringCons, "Waiting": ringWaiting, "Arm": ringArm,
		"Events": ringEvents, "Overflow": ringOverflow, "Capacity": ringCap, "EntrySize": ringEntrySize, "entries": RingHeader}),
	"send-entry": named(map[string]uint64{"ID": seID, "Opcode": seOp, "Flags": seFlags, "NSGE": seNSGE, "DataLen": seDataLen,
		"RemoteAddr": seRemoteAddr, "RKey": seRKey, "InvRKey": seInvRKey, "Imm": seImm, "CompareAdd": seCompareAdd,
		"Swap": seSwap, "SGEs": SendEntryBase}),
	"arm":       named(map[string]uint64{"NONE": ArmNone, "ANY": ArmAny, "SOLICITED": ArmSolicited}),
	"map-modes": named(map[string]uint64{"MAP_PAGES": MapPages, "MAP_SG": MapSG, "MAP_FIRST": MapFirst, "MAP_LAST": MapLast}),
	"access": named(map[string]uint64{"LOCAL_WRITE": uint64(iwarp.AccessLocalWrite), "REMOTE_WRITE": uint64(iwarp.AccessRemoteWrite),
		"REMOTE_READ": uint64(iwarp.AccessRemoteRead), "REMOTE_ATOMIC": uint64(iwarp.AccessRemoteAtomic),
		"MW_BIND": uint64(iwarp.AccessMWBind), "ZERO_BASED": uint64(iwarp.AccessZeroBased)}),
	"send-flags": named(map[string]uint64{"SIGNALED": uint64(iwarp.FlagSignaled), "INLINE": uint64(iwarp.FlagInline),
		"SOLICITED": uint64(iwarp.FlagSolicited), "FENCE": uint64(iwarp.FlagFence), "INLINE_DATA": FlagInlineData}),
	"wc-flags": named(map[string]uint64{"WITH_INV": uint64(iwarp.CompWithInvalidate), "SOLICITED": uint64(iwarp.CompSolicited),
		"WITH_IMM": uint64(iwarp.CompWithImm)}),
	"qp-states": func(s string) (uint64, bool) {
		for st := iwarp.StateIdle; st <= iwarp.StateError; st++ {
			if st.String() == s {
				return uint64(st), true
			}
		}
		return 0, false
	},
	"wr-opcodes": func(s string) (uint64, bool) {
		op, ok := wrOpByName(s)
		return uint64(op), ok && SendOpAllowed(op)
	},
	"wc-opcodes": func(s string) (uint64, bool) { op, ok := compOpByName(s); return uint64(op), ok },
	"wc-status": func(s string) (uint64, bool) {
		for st := iwarp.StatusSuccess; st <= iwarp.StatusGeneral; st++ {
			if st.String() == s {
				return uint64(st), true
			}
		}
		return 0, false
	},
	"events": func(s string) (uint64, bool) {
		// verbs' AsyncEventType: iwarp's QP events, then the SRQ's.
		for e := iwarp.EventEstablished; e <= iwarp.EventFatal; e++ {
			if e.String() == s {
				return uint64(e), true
			}
		}
		switch s {
		case "SRQ_LIMIT_REACHED":
			return uint64(iwarp.EventFatal) + 1, true
		case "SRQ_ERR":
			return uint64(iwarp.EventFatal) + 2, true
		}
		return 0, false
	},
	"mw-types": named(map[string]uint64{"TYPE_1": uint64(iwarp.MWType1), "TYPE_2": uint64(iwarp.MWType2)}),
	"rtr":      named(map[string]uint64{"SEND": uint64(iwarp.RTRSend), "WRITE": uint64(iwarp.RTRWrite), "READ": uint64(iwarp.RTRRead)}),
	"layers": named(map[string]uint64{"RDMAP": uint64(iwarp.LayerRDMAP), "DDP": uint64(iwarp.LayerDDP),
		"LLP": uint64(iwarp.LayerLLP)}),
	"features": named(map[string]uint64{"QUERY_DEVICE": uint64(bits.TrailingZeros64(FeatureQueryDevice)),
		"INLINE_DATA": uint64(bits.TrailingZeros64(FeatureInlineData)), "LINK": uint64(bits.TrailingZeros64(FeatureLink)),
		"CM": uint64(bits.TrailingZeros64(FeatureCM))}),
	"disconnect-reasons": named(map[string]uint64{"LOCAL": DisconnectLocal, "PEER": DisconnectPeer, "ERROR": DisconnectError}),
	"query-device": named(map[string]uint64{"max_qp": QueryMaxQP, "max_qp_wr": QueryMaxQPWR, "max_sge": QueryMaxSGE,
		"max_sge_rd": QueryMaxSGERd, "max_cq": QueryMaxCQ, "max_cqe": QueryMaxCQE, "max_mr": QueryMaxMR,
		"max_mr_size": QueryMaxMRSize, "max_pd": QueryMaxPD, "max_qp_rd_atom": QueryMaxQPRdAtom,
		"max_qp_init_rd_atom": QueryMaxQPInitRd, "max_srq": QueryMaxSRQ, "max_srq_wr": QueryMaxSRQWR,
		"max_srq_sge": QueryMaxSRQSGE, "max_inline_data": QueryMaxInline, "max_private_data": QueryMaxPrivData,
		"max_msg_sz": QueryMaxMsgSize, "atomic_cap": QueryAtomicCap, "page_size_cap": QueryPageSizeCap,
		"max_mw": QueryMaxMW, "max_fast_reg_page_list_len": QueryMaxFRPages, "vendor_part_id": QueryVendorPartID,
		"vendor_id": QueryVendorID}),
	"query-port": named(map[string]uint64{"state": PortState, "phys_state": PortPhysState, "link MTU": PortLinkMTU,
		"active_mtu": PortActiveMTU, "active_width": PortActiveWidth, "active_speed": PortActiveSpeed}),
	"tri": func(s string) (uint64, bool) {
		for _, v := range []uint64{0, 1, 2} {
			b := Untri(v)
			if (b == nil && s == "unset") || (b != nil && !*b && s == "false") || (b != nil && *b && s == "true") {
				return v, Tri(b) == v
			}
		}
		return 0, false
	},
}

func named(m map[string]uint64) func(string) (uint64, bool) {
	return func(s string) (uint64, bool) { v, ok := m[s]; return v, ok }
}

// tableComplete lists the tables that must name every value they check.
var tableComplete = map[string]int{
	"message-types":      int(tLast) - 1,
	"statuses":           len(statusByName),
	"ring-header":        9,
	"send-entry":         12,
	"header":             7,
	"wr-opcodes":         12,
	"wc-opcodes":         10,
	"wc-status":          int(iwarp.StatusGeneral) + 1,
	"events":             int(iwarp.EventFatal) + 3, // then SRQ_LIMIT_REACHED, SRQ_ERR
	"features":           bits.OnesCount64(Features),
	"query-device":       QueryArgs,
	"query-port":         PortArgs,
	"disconnect-reasons": 3,
}

func TestProtocolDocTables(t *testing.T) {
	_, tables := readProtocolDoc(t)
	seen := map[string]bool{}
	for _, tab := range tables {
		look := docConstants[tab.name]
		if look == nil {
			t.Errorf("%s:%d: unknown checked table %q", protocolDoc, tab.line, tab.name)
			continue
		}
		seen[tab.name] = true
		names := map[string]bool{}
		for i, r := range tab.rows {
			n, err := parseU64(r[0])
			want, ok := look(r[1])
			switch {
			case err != nil:
				t.Errorf("%s:%d: table %s: %q is not a number", protocolDoc, tab.at[i], tab.name, r[0])
			case !ok:
				t.Errorf("%s:%d: table %s: no %q", protocolDoc, tab.at[i], tab.name, r[1])
			case n != want:
				t.Errorf("%s:%d: table %s: %s is %d (%#x), the document says %s", protocolDoc, tab.at[i], tab.name, r[1], want, want, r[0])
			}
			names[r[1]] = true
		}
		if k, ok := tableComplete[tab.name]; ok && len(names) != k {
			t.Errorf("%s:%d: table %s names %d values, want all %d", protocolDoc, tab.line, tab.name, len(names), k)
		}
	}
	for name := range tableComplete {
		if !seen[name] {
			t.Errorf("%s: no checked table %q", protocolDoc, name)
		}
	}
}
