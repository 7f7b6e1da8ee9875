package verbs

import (
	"fmt"
	"net"
	"sync"

	"github.com/rdmatap/rdmatap/iwarp"
)

// Memory registration work requests (see iwarp/memobj.go for the keys):
// fast registration, Local Invalidate, RDMA Read with local invalidate,
// and memory windows of type 1 and 2.

// Memory registration operations (ibv_wr_opcode; the kernel verbs'
// IB_WR_REG_MR and IB_WR_RDMA_READ_WITH_INV for the two libibverbs lacks).
const (
	// OpLocalInv invalidates the local STag InvalidateRKey
	// (IBV_WR_LOCAL_INV): a fast-register MR, a type 2 window this QP
	// bound, or a regular MR of the QP's PD. It waits for the accesses to
	// it in progress; FlagFence makes it wait for outstanding Reads too.
	OpLocalInv Opcode = 8
	// OpRegMR registers a fast-register MR (IB_WR_REG_MR); see MR.RegWR.
	OpRegMR Opcode = 9
	// OpBindMW binds a type 2 window (IBV_WR_BIND_MW); see MW.BindWR.
	OpBindMW Opcode = 10
	// OpReadInv is an RDMA Read that invalidates the local STag
	// InvalidateRKey (usually the sink's) once the data has arrived and
	// before the Read completes (IB_WR_RDMA_READ_WITH_INV). The peer sees
	// an ordinary Read Request: RFC 5040 has no wire form for it.
	OpReadInv Opcode = 11
)

// Completion operations of memory registration WRs.
const (
	WCBindMW   WCOpcode = 5 // IBV_WC_BIND_MW
	WCLocalInv WCOpcode = 6 // IBV_WC_LOCAL_INV
	WCRegMR    WCOpcode = 8 // IB_WC_REG_MR
)

// StatusMWBind ("memory management operation error", IBV_WC_MW_BIND_ERR)
// completes a memory registration WR that failed: a window outside its MR
// or granting more than it, an MR without MW_BIND access, an object still
// valid, a key not changed, an STag that cannot be invalidated. As any
// error completion, it takes the QP to ERROR (a Terminate goes out:
// RDMAP, local catastrophic error).
const StatusMWBind Status = 6

// IncRKey returns k with its 8-bit key advanced by one (ibv_inc_rkey):
// the STag a fast-register MR or type 2 window takes at its next
// registration.
func IncRKey(k STag) STag { return k&^0xff | (k+1)&0xff }

// AllocMR allocates a fast-register MR that may map up to maxPages pages
// (ib_alloc_mr with IB_MR_TYPE_MEM_REG). It has an STag but no memory, and
// is invalid: MapPages or MapSG sets the memory, and a REG_MR work request
// (RegWR) registers it. Its first STag's key is drawn at random.
func (pd *PD) AllocMR(maxPages int) (*MR, error) { return pd.ops.allocMR(maxPages) }

func (e *enginePD) allocMR(maxPages int) (*MR, error) {
	pd := (*PD)(e)
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, net.ErrClosed
	}
	fr, err := iwarp.NewFastRegMR(pd.dev.mem, pd.id, maxPages)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	pd.mrs++
	m := &MR{pd: pd, fr: fr}
	m.ops = (*engineMR)(m)
	return m, nil
}

// MapPages sets the memory the MR's next REG_MR maps: length bytes from
// offset in the first of pages, each pageSize bytes (a power of two from
// 512), at most the MR's maxPages. The pages may be separate buffers: the
// registration's Tagged Offsets run through them in order (RFC 5040), so
// a Write or Read across a page boundary continues in the next page of
// the list, and nothing beyond the last mapped byte is reachable. Pages
// that follow one another in memory are mapped as one run. The IOVA (see
// SetIOVA) becomes the first byte's address. Call it before posting the
// REG_MR and not again until that has completed.
//
// On a device of a service the pages must lie in memory this process
// registered (regular MRs of the device): the service maps nothing else,
// and holds those pages until the fast-register MR is freed, even if
// their MRs are deregistered first.
func (m *MR) MapPages(pages [][]byte, pageSize, offset, length int) error {
	if m.fr == nil {
		return fmt.Errorf("%w: not a fast-register MR", ErrInvalidArgument)
	}
	return m.ops.mapPages(pages, pageSize, offset, length)
}

func (e *engineMR) mapPages(pages [][]byte, pageSize, offset, length int) error {
	if err := e.fr.MapPages(pages, pageSize, offset, length); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// MapSG sets the memory the MR's next REG_MR maps to the bytes the SGEs
// name (ib_map_mr_sg): SGEs in regular MRs of the MR's PD, spanning at
// most maxPages pages of pageSize. SGEs may leave gaps, as ib_map_mr_sg
// allows: where one does not follow the one before in memory, that one
// must end and this one start on a page boundary (an address that is a
// multiple of pageSize, such as zerocopy.Alloc memory gives). The
// mapping takes the bytes, not those MRs (a service keeps their pages
// mapped until the fast-register MR is freed).
func (m *MR) MapSG(sgl []SGE, pageSize int) error {
	if m.fr == nil {
		return fmt.Errorf("%w: not a fast-register MR", ErrInvalidArgument)
	}
	return m.ops.mapSG(sgl, pageSize)
}

func (e *engineMR) mapSG(sgl []SGE, pageSize int) error {
	if err := e.fr.MapSG(engineSGL(sgl), pageSize); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// SetIOVA sets the address the MR's next VA-based REG_MR gives its first
// mapped byte (the kernel verbs' mr->iova, set by ib_map_mr_sg and
// changeable before the REG_MR is posted): peers then address byte i of
// the mapping as iova+i, and local SGEs too. MapPages and MapSG reset it
// to the first byte's address; a zero-based registration
// (AccessZeroBased) starts at 0 whatever it is. Call it after mapping.
func (m *MR) SetIOVA(iova uint64) error {
	if m.fr == nil {
		return fmt.Errorf("%w: not a fast-register MR (RegMRIOVA sets a regular MR's)", ErrInvalidArgument)
	}
	return m.ops.setIOVA(iova)
}

func (e *engineMR) setIOVA(iova uint64) error {
	if err := e.fr.SetIOVA(iova); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// RegWR returns the REG_MR work request (ib_reg_wr) that registers the
// mapped memory of fast-register MR m under rkey (m's STag with a new
// key: IncRKey(m.RKey())) with access acc; AccessZeroBased makes its
// Tagged Offsets start at 0, else at the IOVA (the first byte's virtual
// address unless SetIOVA changed it).
// The MR must be invalid when it executes, and the key must change.
func (m *MR) RegWR(id uint64, flags SendFlags, rkey STag, acc Access) SendWR {
	return SendWR{ID: id, Op: OpRegMR, Flags: flags, mr: m.fr, RKey: rkey, Access: acc}
}

// MWType is a memory window's type.
type MWType uint8

// Memory window types.
const (
	// MWType1 is bound by QP.BindMW, which the QP executes in send queue
	// order; any QP of the window's PD may use it; it cannot be
	// invalidated (a zero-length bind unbinds it).
	MWType1 MWType = 1
	// MWType2 is bound by a BIND_MW work request with the key the
	// application chooses; only the QP that bound it may use it (type
	// 2B); Local Invalidate or a Send with Invalidate invalidates it.
	MWType2 MWType = 2
)

// MW is a memory window (ibv_mw): a remote-access STag for part of an MR
// registered with AccessMWBind, with at most the MR's remote rights. It
// starts unbound.
type MW struct {
	pd *PD
	w  *iwarp.Window // a device of a service: a token for work requests

	once sync.Once
	ops  mwOps // engineMW or remoteMW (remote_mw.go): what the window does
}

// mwOps is what a memory window does, one implementation per kind of
// device: an embedded device's (engineMW) or a service's (remoteMW,
// remote_mw.go).
type mwOps interface {
	mwType() MWType
	rkey() STag
	valid() bool
	binding() RemoteBuf
	dealloc(mw *MW)
}

// engineMW is a memory window of an embedded device.
type engineMW MW

func (e *engineMW) mwType() MWType { return MWType(e.w.Type()) }
func (e *engineMW) rkey() STag     { return e.w.STag() }
func (e *engineMW) valid() bool    { return e.w.Current().Valid() }
func (e *engineMW) dealloc(*MW)    { e.w.Release() }

func (e *engineMW) binding() RemoteBuf {
	r := e.w.Current()
	return RemoteBuf{Addr: r.Base, Len: r.Len(), RKey: r.STag()}
}

// AllocMW allocates a memory window (ibv_alloc_mw).
func (pd *PD) AllocMW(t MWType) (*MW, error) { return pd.ops.allocMW(t) }

func (e *enginePD) allocMW(t MWType) (*MW, error) {
	pd := (*PD)(e)
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return nil, net.ErrClosed
	}
	w, err := iwarp.NewWindow(pd.dev.mem, pd.id, iwarp.MWType(t))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	pd.mrs++
	mw := &MW{pd: pd, w: w}
	mw.ops = (*engineMW)(mw)
	return mw, nil
}

// Type returns the window's type.
func (mw *MW) Type() MWType { return mw.ops.mwType() }

// RKey returns the window's STag (of its current or last binding; on a
// device of a service, of the binding last posted).
func (mw *MW) RKey() STag { return mw.ops.rkey() }

// Valid reports whether the window is bound (on a device of a service,
// the service is asked).
func (mw *MW) Valid() bool { return mw.ops.valid() }

// Remote returns the descriptor a peer needs to access the bound window:
// its first byte's address (0 when zero-based), its length and its STag.
func (mw *MW) Remote() RemoteBuf { return mw.ops.binding() }

// Dealloc unbinds the window and frees its STag (ibv_dealloc_mw). It is
// idempotent.
func (mw *MW) Dealloc() error {
	mw.once.Do(func() {
		mw.ops.dealloc(mw)
		mw.pd.mu.Lock()
		mw.pd.mrs--
		mw.pd.mu.Unlock()
	})
	return nil
}

// BindInfo says where and how a window is bound (ibv_mw_bind_info):
// Length bytes from Addr (in the MR's address space, as its SGEs use) of
// MR, with Access: AccessRemoteRead, AccessRemoteWrite,
// AccessRemoteAtomic (each one the MR has too), and AccessZeroBased for a
// window whose first byte has address 0.
type BindInfo struct {
	MR     *MR
	Addr   uint64
	Length uint64
	Access Access
}

func (b BindInfo) iwarp() iwarp.MWBind {
	var lkey STag
	if b.MR != nil {
		lkey = b.MR.LKey()
	}
	return iwarp.MWBind{MR: lkey, Addr: b.Addr, Length: b.Length, Access: iwarp.Access(b.Access)}
}

// BindWR returns the BIND_MW work request (IBV_WR_BIND_MW) that binds
// type 2 window mw under rkey (mw's STag with a new key:
// IncRKey(mw.RKey())). The window must be unbound (invalid) when it
// executes; once bound, only the QP it was posted to may use it, until a
// Local Invalidate or a Send with Invalidate on that QP, or the QP's end,
// invalidates it.
func (mw *MW) BindWR(id uint64, flags SendFlags, rkey STag, b BindInfo) SendWR {
	return SendWR{ID: id, Op: OpBindMW, Flags: flags, mw: mw.w, RKey: rkey, bind: b.iwarp()}
}

// BindMW binds type 1 window mw (ibv_bind_mw): the bind is posted to the
// send queue, executes in order, and completes (WCBindMW) if flags has
// Signaled or it fails. It returns the STag the binding takes (the key
// advanced by one), which any QP of the PD may then use. A zero-length
// bind unbinds the window.
func (qp *QP) BindMW(mw *MW, id uint64, flags SendFlags, b BindInfo) (STag, error) {
	if mw == nil || b.MR == nil && b.Length > 0 {
		return 0, fmt.Errorf("%w: BindMW needs a window and an MR", ErrInvalidArgument)
	}
	return qp.ops.bindMW(mw, id, flags, b)
}

func (e engineQP) bindMW(mw *MW, id uint64, flags SendFlags, b BindInfo) (STag, error) {
	if _, ok := mw.ops.(*engineMW); !ok {
		return 0, &PostError{Err: fmt.Errorf("%w: BIND_MW of a window of another device", iwarp.ErrInvalidWR)}
	}
	stag, err := e.qp.iw.BindMW1(id, iwarp.SendFlags(flags), mw.w, b.iwarp())
	if err != nil {
		return 0, &PostError{Err: err}
	}
	return stag, nil
}
