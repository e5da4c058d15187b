// kernels_mma16.cpp: kernels_fwd.cpp (the fp32 l2norm and prep make the walks' inputs; gdn_poison_u32)
// plus the staged walks of ptx/src/gdn_walk_mma.cu (the v4 gdn_state_walk_mma and
// gdn_summary_walk_mma reading kt; the v5 gdn_state_walk_mma16 with bf16 outputs and
// gdn_summary_walk_mma16, both rebuilding Kt from kn and gcum; the plane walks of gdn_walk_planes.cu
// with walk_planes_ref.h's test_walk_planes making their planes) and the staged bf16-input output
// gdn_output_mma16 (and its grouped form gdn_output_mma16g) of ptx/src/gdn_output_mma.cu, for TestMMA16OnCPU (mma16_test.go), with two
// test-only entries:
//   gdn_state_walk_mma16_drop   gdn_state_walk_mma16 with the outputs named by the bits of `drop`
//                               passed as null (1 h_out, 2 vnew, 4 h16, 8 vnew16): the runner has
//                               no null pointer argument;
//   gdn_output_mma16_probe      gdn_output_mma16's body with fp32 output (O before its bf16 rounding).
// The staged files include ../src/gdn_fwd.cu and ../src/mma.cuh themselves: they build against ptx/src,
// never CPUEMU_SRC.
#include "kernels_fwd.cpp"

#include "gdn_output_mma.cu"
#include "gdn_walk_mma.cu"
#include "gdn_walk_planes.cu"
#include "walk_planes_ref.h"

// No second EMU_DYNAMIC_SMEM: the entries declare `extern __shared__ float smem[]` in extern "C"
// functions, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace gdnkcp {
namespace walkmma {

extern "C" __global__ void gdn_state_walk_mma16_drop(
    const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kn,
    const float* __restrict__ gcum, const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
    const int* __restrict__ seg_chunk0, const int* __restrict__ seg_nchunk, const float* __restrict__ start,
    float* __restrict__ h_out, float* __restrict__ vnew, float* __restrict__ final_state,
    __nv_bfloat16* __restrict__ h16, __nv_bfloat16* __restrict__ vnew16, int HQK, int HV, int vh, int drop) {
	gdn_state_walk_mma16(w, u, kn, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start,
	                     (drop & 1) ? nullptr : h_out, (drop & 2) ? nullptr : vnew, final_state,
	                     (drop & 4) ? nullptr : h16, (drop & 8) ? nullptr : vnew16, HQK, HV, vh);
}

}  // namespace walkmma

namespace outmma {

extern "C" __global__ void gdn_output_mma16_probe(const float* __restrict__ qn, const float* __restrict__ kn,
                                                  const float* __restrict__ gcum,
                                                  const __nv_bfloat16* __restrict__ vnew16,
                                                  const __nv_bfloat16* __restrict__ h16,
                                                  const int* __restrict__ chunk_tok0,
                                                  const int* __restrict__ chunk_len, float* __restrict__ o32, int HQK,
                                                  int HV, float scale) {
	extern __shared__ float smem[];
	output_mma16(smem, qn, kn, gcum, vnew16, h16, chunk_tok0, chunk_len, o32, HQK, HV, scale);
}

}  // namespace outmma
}  // namespace gdnkcp

namespace {
emu::Registrar mma16_kernels(
    {
        EMU_KERNEL(gdnkcp::walkmma, gdn_state_walk_mma),
        EMU_KERNEL(gdnkcp::walkmma, gdn_state_walk_mma16),
        EMU_KERNEL(gdnkcp::walkmma, gdn_state_walk_mma16_drop),
        EMU_KERNEL(gdnkcp::walkmma, gdn_summary_walk_mma),
        EMU_KERNEL(gdnkcp::walkmma, gdn_summary_walk_mma16),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16g),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16gn),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16gnk),
        EMU_KERNEL(gdnkcp::outmma, gdn_output_mma16_probe),
        EMU_KERNEL(gdnkcp::walkp, gdn_state_walk_planes),
        EMU_KERNEL(gdnkcp::walkp, gdn_summary_walk_planes),
        EMU_KERNEL(gdnkcp::planesref, test_walk_planes),
    },
    {
        {"walk_mma_smem(64)", gdnkcp::walkmma::walk_mma_smem(64)},
        {"walk_mma_smem(128)", gdnkcp::walkmma::walk_mma_smem(128)},
        {"kOutputMMA16Smem", gdnkcp::outmma::kOutputMMA16Smem},
        {"walk_planes_smem(64)", gdnkcp::walkp::walk_planes_smem(64)},
        {"walk_planes_smem(128)", gdnkcp::walkp::walk_planes_smem(128)},
    });
}  // namespace
