package verbs

// SetSiwReply makes d answer MPA Requests as Linux siw does as far as the
// first-FPDU hold goes: the initiator's early-FPDU query is left
// unanswered, so an rdmatap initiator holds its first FPDU.
func SetSiwReply(d *Device, on bool) { d.siwReply = on }

// PushWC adds a completion to cq as the engine does.
func PushWC(cq *CQ, wc WC) bool { return (*engineCQ)(cq).Push(*engineWC(&wc)) }

// LastSendEntryFlags returns the flags byte of the send ring entry a
// QP of a service's device wrote last.
func LastSendEntryFlags(qp *QP) byte {
	r := qp.remote()
	r.sqMu.Lock()
	defer r.sqMu.Unlock()
	return r.sq.Entry(r.sqProd - 1)[9]
}
