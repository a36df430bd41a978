//go:build amd64 && !noasm

#include "textflag.h"

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv() (eax, edx uint32)
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET

// func adamBCAVX2(theta, m, v, grad *float32, n int, k *adamConsts, acc *lanes) (floors int)
//
// Per coordinate, in float64 lanes, exactly the operations of adamBCGo:
//   mi = b1*m + c1*g;  vi = b2*v + c2*(g*g);  store float32(mi), float32(vi)
//   vh = invV*vi;  den = vh - phi;  d = den - gp
//   floors += sign(d);  den = sign(d) ? gp : den
//   u = (lrM*mi) / sqrt(den);  theta = float32(float64(theta) - u)
//   acc.vHat[lane] += vh;  acc.u2[lane] += u*u
// No FMA: every multiply and add is a separate, correctly rounded IEEE op.
TEXT ·adamBCAVX2(SB), NOSPLIT, $0-64
	MOVQ theta+0(FP), DI
	MOVQ m+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ grad+24(FP), R8
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), AX
	MOVQ acc+48(FP), BX
	VBROADCASTSD 0(AX), Y8   // b1
	VBROADCASTSD 8(AX), Y9   // c1
	VBROADCASTSD 16(AX), Y10 // b2
	VBROADCASTSD 24(AX), Y11 // c2
	VBROADCASTSD 32(AX), Y12 // lrM
	VBROADCASTSD 40(AX), Y13 // invV
	VBROADCASTSD 48(AX), Y14 // phi
	VBROADCASTSD 56(AX), Y15 // gp
	VMOVUPD 0(BX), Y6        // acc.vHat
	VMOVUPD 32(BX), Y7       // acc.u2
	XORQ R9, R9              // i
	XORQ R10, R10            // floors

loop:
	CMPQ R9, CX
	JGE  done
	VCVTPS2PD (R8)(R9*4), Y0 // g
	VCVTPS2PD (SI)(R9*4), Y1 // m
	VMULPD    Y8, Y1, Y1     // b1*m
	VMULPD    Y9, Y0, Y2     // c1*g
	VADDPD    Y2, Y1, Y1     // mi
	VCVTPS2PD (DX)(R9*4), Y2 // v
	VMULPD    Y10, Y2, Y2    // b2*v
	VMULPD    Y0, Y0, Y3     // g*g
	VMULPD    Y11, Y3, Y3    // c2*g²
	VADDPD    Y3, Y2, Y2     // vi
	VCVTPD2PSY Y1, X3
	VMOVUPS   X3, (SI)(R9*4) // m = float32(mi)
	VCVTPD2PSY Y2, X3
	VMOVUPS   X3, (DX)(R9*4) // v = float32(vi)
	VMULPD    Y13, Y2, Y2    // vh = invV*vi
	VADDPD    Y2, Y6, Y6     // acc.vHat += vh
	VSUBPD    Y14, Y2, Y3    // den = vh - phi
	VSUBPD    Y15, Y3, Y4    // d = den - gp
	VMOVMSKPD Y4, R11
	POPCNTL   R11, R11
	ADDQ      R11, R10       // floors += number of negative d
	VBLENDVPD Y4, Y15, Y3, Y3 // den = sign(d) ? gp : den
	VSQRTPD   Y3, Y3
	VMULPD    Y12, Y1, Y1    // lrM*mi
	VDIVPD    Y3, Y1, Y1     // u
	VCVTPS2PD (DI)(R9*4), Y0 // theta
	VSUBPD    Y1, Y0, Y0     // theta - u
	VCVTPD2PSY Y0, X0
	VMOVUPS   X0, (DI)(R9*4)
	VMULPD    Y1, Y1, Y1     // u*u
	VADDPD    Y1, Y7, Y7     // acc.u2 += u*u
	ADDQ      $4, R9
	JMP       loop

done:
	VMOVUPD Y6, 0(BX)
	VMOVUPD Y7, 32(BX)
	VZEROUPPER
	MOVQ R10, floors+56(FP)
	RET

// func anyNonFiniteAVX2(x *float32, n int) bool
//
// Reports whether any of the n float32s at x (n a multiple of 8) has a
// biased exponent ≥ 190, i.e. is NaN, ±Inf or of magnitude ≥ 2^63: the
// masked exponent bits, compared as signed int32, exceed 189<<23.
TEXT ·anyNonFiniteAVX2(SB), NOSPLIT, $0-17
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ $0x7f800000, AX
	MOVQ AX, X1
	VPBROADCASTD X1, Y1      // exponent mask
	MOVQ $0x5e800000, AX     // 189<<23
	MOVQ AX, X2
	VPBROADCASTD X2, Y2
	VPXOR Y0, Y0, Y0         // any lane ever above the limit
	XORQ R9, R9

scan:
	CMPQ R9, CX
	JGE  scanned
	VPAND    (SI)(R9*4), Y1, Y3
	VPCMPGTD Y2, Y3, Y3
	VPOR     Y3, Y0, Y0
	ADDQ     $8, R9
	JMP      scan

scanned:
	VPTEST Y0, Y0
	SETNE  ret+16(FP)
	VZEROUPPER
	RET
