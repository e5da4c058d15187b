// kernels_dvlocal_mma.cpp: kernels_all.cpp (the fp32 forward and backward: gdn_poison_u32 for the poisoned
// outputs, and gdn_dvlocal_bwd, which runs beside the staged kernel on the same buffers) plus the staged
// tensor-core dV'_local of ptx/src/gdn_dvlocal_mma.cu (and its grouped form gdn_dvlocal_mma_g; mma.sync, ldmatrix, cp.async through
// ptx/src/mma.cuh), for TestMMADvLocalOnCPU (dvlocal_mma_test.go). The staged file includes
// ../src/gdn_fwd.cu and ../src/mma.cuh itself: it builds against ptx/src, never CPUEMU_SRC.
#include "kernels_all.cpp"

#include "gdn_dvlocal_mma.cu"

// No second EMU_DYNAMIC_SMEM: gdn_dvlocal_mma declares `extern __shared__ float smem[]` in its extern "C"
// entry, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar dvlocal_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::dvlmma, gdn_dvlocal_mma),
        EMU_KERNEL(gdnkcp::dvlmma, gdn_dvlocal_mma_g),
    },
    {
        {"kDvlMMASmem", gdnkcp::dvlmma::kDvlMMASmem},
        {"kDvlMMAGSmem", gdnkcp::dvlmma::kDvlMMAGSmem},
    });
}  // namespace
