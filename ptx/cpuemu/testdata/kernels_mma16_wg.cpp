// kernels_mma16_wg.cpp: kernels_mma16.cpp with the wgmma path of ptx/src/wgmma.cuh emulated
// (GDNKCP_EMU_WGMMA), so that gdn_state_walk_mma16 runs its sm_90a body (ptx/src/gdn_walk_wgmma.cu)
// on the emulator's wgmma; every other kernel is the same as in runner_mma16. For
// TestWGMMAStateWalkOnCPU (wgmma_walk_test.go).
#define GDNKCP_EMU_WGMMA 1
#include "kernels_mma16.cpp"
