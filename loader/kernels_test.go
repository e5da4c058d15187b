package loader

// Hand-written PTX for the GPU tests: portable sm_80 code that the driver
// JIT-compiles for whatever GPU is present.

const testPTX = `.version 8.0
.target sm_80
.address_size 64

.extern .shared .align 16 .b8 dsmem[];

// y[i] = a*x[i] + y[i] for i < n, rounded per operation (no FMA).
.visible .entry axpy(
	.param .u64 axpy_x,
	.param .u64 axpy_y,
	.param .f32 axpy_a,
	.param .u32 axpy_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<5>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [axpy_x];
	ld.param.u64 %rd2, [axpy_y];
	ld.param.f32 %f1, [axpy_a];
	ld.param.u32 %r1, [axpy_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra AXPY_DONE;
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mul.wide.u32 %rd5, %r5, 4;
	add.s64 %rd6, %rd3, %rd5;
	add.s64 %rd7, %rd4, %rd5;
	ld.global.f32 %f2, [%rd6];
	ld.global.f32 %f3, [%rd7];
	mul.rn.f32 %f4, %f1, %f2;
	add.rn.f32 %f4, %f4, %f3;
	st.global.f32 [%rd7], %f4;
AXPY_DONE:
	ret;
}

// One thread runs iters steps of a 32-bit LCG from 1 and stores the state.
.visible .entry spin(
	.param .u64 spin_out,
	.param .u32 spin_iters
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<4>;
	.reg .b64 %rd<3>;

	ld.param.u64 %rd1, [spin_out];
	ld.param.u32 %r1, [spin_iters];
	mov.u32 %r2, 0;
	mov.u32 %r3, 1;
SPIN_LOOP:
	setp.ge.u32 %p1, %r2, %r1;
	@%p1 bra SPIN_END;
	mad.lo.u32 %r3, %r3, 1664525, 1013904223;
	add.u32 %r2, %r2, 1;
	bra SPIN_LOOP;
SPIN_END:
	cvta.to.global.u64 %rd2, %rd1;
	st.global.u32 [%rd2], %r3;
	ret;
}

// One block: stage words 32-bit values of in through dynamic shared memory
// and write them reversed to out.
.visible .entry shrev(
	.param .u64 shrev_in,
	.param .u64 shrev_out,
	.param .u32 shrev_words
)
{
	.reg .pred %p<3>;
	.reg .b32 %r<11>;
	.reg .b64 %rd<7>;

	ld.param.u64 %rd1, [shrev_in];
	ld.param.u64 %rd2, [shrev_out];
	ld.param.u32 %r1, [shrev_words];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	mov.u32 %r2, %tid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, dsmem;
	mov.u32 %r5, %r2;
SHREV_LOAD:
	setp.ge.u32 %p1, %r5, %r1;
	@%p1 bra SHREV_SYNC;
	mul.wide.u32 %rd3, %r5, 4;
	add.s64 %rd4, %rd1, %rd3;
	ld.global.u32 %r6, [%rd4];
	shl.b32 %r7, %r5, 2;
	add.u32 %r7, %r4, %r7;
	st.shared.u32 [%r7], %r6;
	add.u32 %r5, %r5, %r3;
	bra SHREV_LOAD;
SHREV_SYNC:
	bar.sync 0;
	mov.u32 %r5, %r2;
SHREV_STORE:
	setp.ge.u32 %p2, %r5, %r1;
	@%p2 bra SHREV_END;
	sub.u32 %r8, %r1, 1;
	sub.u32 %r8, %r8, %r5;
	shl.b32 %r9, %r8, 2;
	add.u32 %r9, %r4, %r9;
	ld.shared.u32 %r10, [%r9];
	mul.wide.u32 %rd5, %r5, 4;
	add.s64 %rd6, %rd2, %rd5;
	st.global.u32 [%rd6], %r10;
	add.u32 %r5, %r5, %r3;
	bra SHREV_STORE;
SHREV_END:
	ret;
}
`

// badPTX uses a symbol it never declares; ptxas rejects it.
const badPTX = `.version 8.0
.target sm_80
.address_size 64

.visible .entry broken(.param .u64 broken_p)
{
	.reg .b32 %r<2>;
	mov.u32 %r1, gdnkcp_undeclared_symbol;
	ret;
}
`

var (
	axpyParams  = axpySig
	spinParams  = []ParamSpec{{"out", 8, 8, 0}, {"iters", 4, 4, 8}}
	shrevParams = []ParamSpec{{"in", 8, 8, 0}, {"out", 8, 8, 8}, {"words", 4, 4, 16}}
)

// lcg is the host version of the spin kernel.
func lcg(iters uint32) uint32 {
	s := uint32(1)
	for range iters {
		s = s*1664525 + 1013904223
	}
	return s
}
