//go:build amd64 && !purego

#include "textflag.h"

// func prefetch(p *byte, n int)
// PREFETCHT0 on every 64-byte line of p[:n] (n > 0).
TEXT ·prefetch(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	LEAQ (SI)(CX*1), DX
	ANDQ $~63, SI
loop:
	PREFETCHT0 (SI)
	ADDQ $64, SI
	CMPQ SI, DX
	JB   loop
	RET

