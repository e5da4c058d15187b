// kernels_walk_mma.cpp: kernels_fwd.cpp (the fp32 forward, whose l2norm and prep make the walks'
// inputs) plus the staged tensor-core walks of ptx/src/gdn_walk_mma.cu (mma.sync, ldmatrix,
// cp.async through ptx/src/mma.cuh), for TestMMAWalksOnCPU (walk_mma_test.go). The staged file
// includes ../src/gdn_fwd.cu and ../src/mma.cuh itself: it builds against ptx/src, never CPUEMU_SRC.
#include "kernels_fwd.cpp"

#include "gdn_walk_mma.cu"

// No second EMU_DYNAMIC_SMEM: the walks declare `extern __shared__ float smem[]` in their extern "C"
// entries, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar walk_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::walkmma, gdn_summary_walk_mma),
        EMU_KERNEL(gdnkcp::walkmma, gdn_state_walk_mma),
    },
    {
        {"walk_mma_smem(64)", gdnkcp::walkmma::walk_mma_smem(64)},
        {"walk_mma_smem(128)", gdnkcp::walkmma::walk_mma_smem(128)},
    });
}  // namespace
