// kernels_prep_mma.cpp: kernels_fwd.cpp (the fp32 forward, whose gdn_prep_fwd runs beside the staged
// kernel for its gcum and Kt bits) plus the staged tensor-core prep of ptx/src/gdn_prep_mma.cu
// (mma.sync, ldmatrix, cp.async through ptx/src/mma.cuh), for TestMMAPrepOnCPU (prep_mma_test.go), with
// one test-only entry:
//   gdn_prep_mma_nokt   gdn_prep_mma with kt passed as null (the v5 forward's use; the runner has no
//                       null pointer argument; nor walk planes): gcum, w, u must be the bits of a run with kt;
// and walk_planes_ref.h's test_walk_planes, which the prep's walk planes are held to.
// The staged file includes ../src/gdn_fwd.cu and ../src/mma.cuh itself: it builds against ptx/src.
#include "kernels_fwd.cpp"

#include "gdn_prep_mma.cu"
#include "walk_planes_ref.h"

// No second EMU_DYNAMIC_SMEM: gdn_prep_mma declares `extern __shared__ float smem[]` in its extern "C"
// entry, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace gdnkcp {
namespace prepmma {

extern "C" __global__ void gdn_prep_mma_nokt(const float* __restrict__ kn, const bf16* __restrict__ v, int v_stride,
                                             const float* __restrict__ g, const float* __restrict__ beta,
                                             const int* __restrict__ chunk_tok0, const int* __restrict__ chunk_len,
                                             float* __restrict__ gcum, float* __restrict__ w, float* __restrict__ u,
                                             int HQK, int HV) {
	gdn_prep_mma(kn, v, v_stride, g, beta, chunk_tok0, chunk_len, gcum, w, u, nullptr, nullptr, nullptr, HQK, HV);
}

}  // namespace prepmma
}  // namespace gdnkcp

namespace {
emu::Registrar prep_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::prepmma, gdn_prep_mma),
        EMU_KERNEL(gdnkcp::prepmma, gdn_prep_mma_nokt),
        EMU_KERNEL(gdnkcp::prepmma, gdn_prep_mma_g),
        EMU_KERNEL(gdnkcp::prepmma, gdn_prep_mma_gn),
        EMU_KERNEL(gdnkcp::prepmma, gdn_prep_mma_gnk),
        EMU_KERNEL(gdnkcp::planesref, test_walk_planes),
    },
    {
        {"kPrepMMASmem", gdnkcp::prepmma::kPrepMMASmem},
        {"kPrepMMAGSmem", gdnkcp::prepmma::kPrepMMAGSmem},
    });
}  // namespace
