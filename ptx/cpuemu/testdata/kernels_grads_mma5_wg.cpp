// kernels_grads_mma5_wg.cpp: kernels_grads_mma5.cpp with the wgmma path of ptx/src/wgmma.cuh emulated
// (GDNKCP_EMU_WGMMA), so that gdn_chunk_grads_mma8 runs its state products (dKt = V' D^T, dQg = dO H^T,
// dV' H^T) as the sm_90a build does, on the emulator's wgmma. For TestMMA5ChunkGradsOnCPU's second runner.
#define GDNKCP_EMU_WGMMA 1
#include "kernels_grads_mma5.cpp"
