// kernels_output_mma.cpp: kernels_fwd.cpp (for gdn_poison_u32) plus the staged tensor-core output of
// ptx/src/gdn_output_mma.cu (mma.sync, ldmatrix, cp.async through ptx/src/mma.cuh), for
// TestMMAOutputOnCPU (output_mma_test.go), and precision probes that exist only here: the same kernel
// body with fp32 output (no bf16 rounding of O, so the kernel's own error shows) at a chosen operand
// precision. The staged file includes ../src/gdn_fwd.cu and ../src/mma.cuh itself: it builds against
// ptx/src, never CPUEMU_SRC.
#include "kernels_fwd.cpp"  // gdn_poison_u32 for the poisoned outputs, and the dynamic shared memory

#include "gdn_output_mma.cu"

// No second EMU_DYNAMIC_SMEM: the entries declare `extern __shared__ float smem[]` in extern "C"
// functions, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace gdnkcp {
namespace outmma {

// gdn_output_mma_probe: gdn_output_mma's body with fp32 output o32 and the operand precision prec
// (a combination of the kSplit* bits; the ones the test measures).
extern "C" __global__ void gdn_output_mma_probe(const float* __restrict__ qn, const float* __restrict__ kn,
                                                const float* __restrict__ gcum, const float* __restrict__ vnew,
                                                const float* __restrict__ h_state, const int* __restrict__ chunk_tok0,
                                                const int* __restrict__ chunk_len, float* __restrict__ o32, int HQK,
                                                int HV, float scale, int prec) {
	extern __shared__ float smem[];
	switch (prec) {
	case 0:
		output_mma<0>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o32, HQK, HV, scale);
		break;
	case kSplitQ | kSplitH:
		output_mma<kSplitQ | kSplitH>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o32, HQK, HV, scale);
		break;
	case kSplitH | kSplitV | kSplitP:
		output_mma<kSplitH | kSplitV | kSplitP>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o32, HQK, HV,
		                                        scale);
		break;
	case kSplitAll & ~kSplitP:
		output_mma<kSplitAll & ~kSplitP>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o32, HQK, HV, scale);
		break;
	case kSplitAll & ~kSplitV:
		output_mma<kSplitAll & ~kSplitV>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o32, HQK, HV, scale);
		break;
	case kSplitAll & ~kSplitK:
		output_mma<kSplitAll & ~kSplitK>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o32, HQK, HV, scale);
		break;
	case kSplitAll:
		output_mma<kSplitAll>(smem, qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o32, HQK, HV, scale);
		break;
	default:
		emu::fail("gdn_output_mma_probe: precision " + std::to_string(prec) + " not instantiated");
	}
}

}  // namespace outmma
}  // namespace gdnkcp

namespace {
emu::Registrar output_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma_probe),
    },
    {
        {"kOutputMMASmem", gdnkcp::outmma::kOutputMMASmem},
    });
}  // namespace
