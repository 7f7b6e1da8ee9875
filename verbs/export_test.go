package verbs

// SetSiwReply makes d answer MPA Requests as Linux siw does as far as the
// first-FPDU hold goes: the initiator's early-FPDU query is left
// unanswered, so an rdmatap initiator holds its first FPDU.
func SetSiwReply(d *Device, on bool) { d.siwReply = on }

// PushWC adds a completion to cq as the engine does.
func PushWC(cq *CQ, wc WC) bool { return (*engineCQ)(cq).Push(*engineWC(&wc)) }
