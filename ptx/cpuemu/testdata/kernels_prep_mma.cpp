// kernels_prep_mma.cpp: kernels_fwd.cpp (the fp32 forward, whose gdn_prep_fwd runs beside the staged
// kernel for its gcum and Kt bits) plus the staged tensor-core prep of ptx/staging/gdn_prep_mma.cu
// (mma.sync, ldmatrix, cp.async through ptx/src/mma.cuh), for TestMMAPrepOnCPU (prep_mma_test.go).
// The staged file includes ../src/gdn_fwd.cu and ../src/mma.cuh itself: it builds against ptx/src.
#include "kernels_fwd.cpp"

#include "../../staging/gdn_prep_mma.cu"

// No second EMU_DYNAMIC_SMEM: gdn_prep_mma declares `extern __shared__ float smem[]` in its extern "C"
// entry, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar prep_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::prepmma, gdn_prep_mma),
    },
    {
        {"kPrepMMASmem", gdnkcp::prepmma::kPrepMMASmem},
    });
}  // namespace
