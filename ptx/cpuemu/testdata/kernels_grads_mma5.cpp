// kernels_grads_mma5.cpp: kernels_all.cpp (the fp32 forward and backward, whose gdn_chunk_grads and
// gdn_qk_bwd run beside the staged kernel on the same buffers) plus the staged grouped chunk gradients of
// ptx/src/gdn_chunk_grads_mma5.cu (which includes gdn_chunk_grads_mma.cu, ../src/gdn_fwd.cu and
// ../src/mma.cuh itself), for TestMMA5ChunkGradsOnCPU (grads_mma5_test.go).
#include "kernels_all.cpp"

#include "gdn_chunk_grads_mma5.cu"

// No second EMU_DYNAMIC_SMEM: gdn_chunk_grads_mma5 declares `extern __shared__ float smem[]` in its
// extern "C" entry, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar grads_mma5_kernels(
    {
        EMU_KERNEL(gdnkcp::gradmma, gdn_chunk_grads_mma5),
        EMU_KERNEL(gdnkcp::gradmma, gdn_chunk_grads_mma6),
        EMU_KERNEL(gdnkcp::gradmma, gdn_chunk_grads_mma7),
        EMU_KERNEL(gdnkcp::gradmma, gdn_chunk_grads_mma8),
        EMU_KERNEL(gdnkcp::gradmma, gdn_chunk_grads_mma6r),
        EMU_KERNEL(gdnkcp::gradmma, gdn_chunk_grads_mma8r),
    },
    {
        {"kGradMMA5Smem", gdnkcp::gradmma::kGradMMA5Smem},
    });
}  // namespace
