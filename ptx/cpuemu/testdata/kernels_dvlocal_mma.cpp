// kernels_dvlocal_mma.cpp: kernels_all.cpp (the fp32 forward and backward: gdn_poison_u32 for the poisoned
// outputs, and gdn_dvlocal_bwd, which runs beside the staged kernel on the same buffers) plus the staged
// tensor-core dV'_local of ptx/src/gdn_dvlocal_mma.cu (and its grouped forms gdn_dvlocal_mma_g and, on K^T's
// walk planes from walk_planes_ref.h's test_walk_planes, gdn_dvlocal_mma_gk; mma.sync, ldmatrix, cp.async through
// ptx/src/mma.cuh), for TestMMADvLocalOnCPU (dvlocal_mma_test.go). The staged file includes
// ../src/gdn_fwd.cu and ../src/mma.cuh itself: it builds against ptx/src, never CPUEMU_SRC.
#include "kernels_all.cpp"

#include "gdn_dvlocal_mma.cu"
#include "walk_planes_ref.h"

// No second EMU_DYNAMIC_SMEM: gdn_dvlocal_mma declares `extern __shared__ float smem[]` in its extern "C"
// entry, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar dvlocal_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::dvlmma, gdn_dvlocal_mma),
        EMU_KERNEL(gdnkcp::dvlmma, gdn_dvlocal_mma_g),
        EMU_KERNEL(gdnkcp::dvlmma, gdn_dvlocal_mma_gk),
        EMU_KERNEL(gdnkcp::dvlmma, gdn_dvlocal_mma_gr),
        EMU_KERNEL(gdnkcp::planesref, test_walk_planes),
    },
    {
        {"kDvlMMASmem", gdnkcp::dvlmma::kDvlMMASmem},
        {"kDvlMMAGSmem", gdnkcp::dvlmma::kDvlMMAGSmem},
        {"kDvlMMAGRSmem", gdnkcp::dvlmma::kDvlMMAGRSmem},
    });
}  // namespace
