//go:build amd64 && !purego

#include "textflag.h"

// func kern4x8(k, nb int, p, b *float64, ldb int, c *float64, ldc int)
TEXT ·kern4x8(SB), NOSPLIT, $0-56
	MOVQ k+0(FP), CX
	MOVQ nb+8(FP), DX
	MOVQ p+16(FP), SI
	MOVQ b+24(FP), DI
	MOVQ ldb+32(FP), R8
	MOVQ c+40(FP), R9
	MOVQ ldc+48(FP), R10
	SHLQ $3, R8
	SHLQ $3, R10
	LEAQ (R10)(R10*2), R11

block8:
	VMOVUPD (R9), Y0
	VMOVUPD 32(R9), Y1
	VMOVUPD (R9)(R10*1), Y2
	VMOVUPD 32(R9)(R10*1), Y3
	VMOVUPD (R9)(R10*2), Y4
	VMOVUPD 32(R9)(R10*2), Y5
	VMOVUPD (R9)(R11*1), Y6
	VMOVUPD 32(R9)(R11*1), Y7
	MOVQ    SI, R12
	MOVQ    DI, R13
	MOVQ    CX, R14

loop8:
	VMOVUPD      (R13), Y8
	VMOVUPD      32(R13), Y9
	VBROADCASTSD (R12), Y10
	VMULPD       Y8, Y10, Y14
	VADDPD       Y14, Y0, Y0
	VMULPD       Y9, Y10, Y15
	VADDPD       Y15, Y1, Y1
	VBROADCASTSD 8(R12), Y11
	VMULPD       Y8, Y11, Y14
	VADDPD       Y14, Y2, Y2
	VMULPD       Y9, Y11, Y15
	VADDPD       Y15, Y3, Y3
	VBROADCASTSD 16(R12), Y12
	VMULPD       Y8, Y12, Y14
	VADDPD       Y14, Y4, Y4
	VMULPD       Y9, Y12, Y15
	VADDPD       Y15, Y5, Y5
	VBROADCASTSD 24(R12), Y13
	VMULPD       Y8, Y13, Y14
	VADDPD       Y14, Y6, Y6
	VMULPD       Y9, Y13, Y15
	VADDPD       Y15, Y7, Y7
	ADDQ         $32, R12
	ADDQ         R8, R13
	DECQ         R14
	JNZ          loop8

	VMOVUPD Y0, (R9)
	VMOVUPD Y1, 32(R9)
	VMOVUPD Y2, (R9)(R10*1)
	VMOVUPD Y3, 32(R9)(R10*1)
	VMOVUPD Y4, (R9)(R10*2)
	VMOVUPD Y5, 32(R9)(R10*2)
	VMOVUPD Y6, (R9)(R11*1)
	VMOVUPD Y7, 32(R9)(R11*1)
	ADDQ    $64, R9
	ADDQ    $64, DI
	DECQ    DX
	JNZ     block8
	VZEROUPPER
	RET

// func kern4x4(k int, p, b *float64, ldb int, c *float64, ldc int)
TEXT ·kern4x4(SB), NOSPLIT, $0-48
	MOVQ k+0(FP), CX
	MOVQ p+8(FP), SI
	MOVQ b+16(FP), DI
	MOVQ ldb+24(FP), R8
	MOVQ c+32(FP), R9
	MOVQ ldc+40(FP), R10
	SHLQ $3, R8
	SHLQ $3, R10
	LEAQ (R10)(R10*2), R11
	VMOVUPD (R9), Y0
	VMOVUPD (R9)(R10*1), Y2
	VMOVUPD (R9)(R10*2), Y4
	VMOVUPD (R9)(R11*1), Y6

loop4:
	VMOVUPD      (DI), Y8
	VBROADCASTSD (SI), Y10
	VMULPD       Y8, Y10, Y14
	VADDPD       Y14, Y0, Y0
	VBROADCASTSD 8(SI), Y11
	VMULPD       Y8, Y11, Y15
	VADDPD       Y15, Y2, Y2
	VBROADCASTSD 16(SI), Y12
	VMULPD       Y8, Y12, Y14
	VADDPD       Y14, Y4, Y4
	VBROADCASTSD 24(SI), Y13
	VMULPD       Y8, Y13, Y15
	VADDPD       Y15, Y6, Y6
	ADDQ         $32, SI
	ADDQ         R8, DI
	DECQ         CX
	JNZ          loop4

	VMOVUPD Y0, (R9)
	VMOVUPD Y2, (R9)(R10*1)
	VMOVUPD Y4, (R9)(R10*2)
	VMOVUPD Y6, (R9)(R11*1)
	VZEROUPPER
	RET

// func scaleAdd4(n int, dst, s *float64, a, t float64, y *float64)
TEXT ·scaleAdd4(SB), NOSPLIT, $0-48
	MOVQ         n+0(FP), CX
	MOVQ         dst+8(FP), DI
	MOVQ         s+16(FP), SI
	VBROADCASTSD a+24(FP), Y14
	VBROADCASTSD t+32(FP), Y15
	MOVQ         y+40(FP), DX
	SHRQ         $2, CX

loopsa:
	VMOVUPD (SI), Y0
	VMOVUPD (DX), Y1
	VMULPD  Y14, Y0, Y0
	VMULPD  Y15, Y1, Y1
	VADDPD  Y1, Y0, Y0
	VMOVUPD Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     loopsa
	VZEROUPPER
	RET

// func addScale4(n int, dst *float64, t float64, y *float64, a float64)
TEXT ·addScale4(SB), NOSPLIT, $0-40
	MOVQ         n+0(FP), CX
	MOVQ         dst+8(FP), DI
	VBROADCASTSD t+16(FP), Y15
	MOVQ         y+24(FP), DX
	VBROADCASTSD a+32(FP), Y14
	SHRQ         $2, CX

loopas:
	VMOVUPD (DI), Y0
	VMOVUPD (DX), Y1
	VMULPD  Y15, Y1, Y1
	VADDPD  Y1, Y0, Y0
	VMULPD  Y14, Y0, Y0
	VMOVUPD Y0, (DI)
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     loopas
	VZEROUPPER
	RET

// func kern1x16(k, nb int, p, b *float64, ldb int, c *float64)
TEXT ·kern1x16(SB), NOSPLIT, $0-48
	MOVQ k+0(FP), CX
	MOVQ nb+8(FP), DX
	MOVQ p+16(FP), SI
	MOVQ b+24(FP), DI
	MOVQ ldb+32(FP), R8
	MOVQ c+40(FP), R9
	SHLQ $3, R8

block16:
	VMOVUPD (R9), Y0
	VMOVUPD 32(R9), Y1
	VMOVUPD 64(R9), Y2
	VMOVUPD 96(R9), Y3
	MOVQ    SI, R12
	MOVQ    DI, R13
	MOVQ    CX, R14

loop16:
	VBROADCASTSD (R12), Y10
	VMULPD       (R13), Y10, Y4
	VMULPD       32(R13), Y10, Y5
	VMULPD       64(R13), Y10, Y6
	VMULPD       96(R13), Y10, Y7
	VADDPD       Y4, Y0, Y0
	VADDPD       Y5, Y1, Y1
	VADDPD       Y6, Y2, Y2
	VADDPD       Y7, Y3, Y3
	ADDQ         $32, R12
	ADDQ         R8, R13
	DECQ         R14
	JNZ          loop16

	VMOVUPD Y0, (R9)
	VMOVUPD Y1, 32(R9)
	VMOVUPD Y2, 64(R9)
	VMOVUPD Y3, 96(R9)
	ADDQ    $128, R9
	ADDQ    $128, DI
	DECQ    DX
	JNZ     block16
	VZEROUPPER
	RET
