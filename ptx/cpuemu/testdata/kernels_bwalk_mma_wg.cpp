// kernels_bwalk_mma_wg.cpp: kernels_bwalk_mma.cpp with the wgmma path of ptx/src/wgmma.cuh emulated
// (GDNKCP_EMU_WGMMA), so that gdn_tape_walk_mma runs its sm_90a body (ptx/src/gdn_bwalk_wgmma.cu) on the
// emulator's wgmma; the offset walk is the same as in runner_bwalk_mma. For TestMMABackwardWalksOnCPU's
// wgmma runs (bwalk_mma_test.go).
#define GDNKCP_EMU_WGMMA 1
#include "kernels_bwalk_mma.cpp"
