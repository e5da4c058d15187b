// kernels_grads_mma.cpp: kernels_all.cpp (the fp32 forward and backward, whose gdn_chunk_grads runs beside
// the staged kernel on the same buffers) plus the staged tensor-core chunk gradients of
// ptx/src/gdn_chunk_grads_mma.cu (mma.sync, cp.async through ptx/src/mma.cuh), for
// TestMMAChunkGradsOnCPU (grads_mma_test.go). The staged file includes ../src/gdn_fwd.cu and
// ../src/mma.cuh itself: it builds against ptx/src, never CPUEMU_SRC.
#include "kernels_all.cpp"

#include "gdn_chunk_grads_mma.cu"

// No second EMU_DYNAMIC_SMEM: gdn_chunk_grads_mma declares `extern __shared__ float smem[]` in its
// extern "C" entry, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar grads_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::gradmma, gdn_chunk_grads_mma),
    },
    {
        {"kGradMMASmem", gdnkcp::gradmma::kGradMMASmem},
    });
}  // namespace
