// kernels_bwalk_mma.cpp: kernels_all.cpp (the fp32 forward and backward, whose l2norm, prep and
// dV'_local make the walks' inputs) plus the staged tensor-core backward walks of
// ptx/src/gdn_bwalk_mma.cu (which includes the staged forward walks, gdn_walk_mma.cu, for their
// Walker and helpers), for TestMMABackwardWalksOnCPU (bwalk_mma_test.go), and the tape walk on the walk
// planes (ptx/src/gdn_tape_planes.cu) with test_walk_planes to make its planes, for TestTapePlanesOnCPU
// (tape_planes_test.go). The staged files include
// ../src/gdn_fwd.cu and ../src/mma.cuh themselves: they build against ptx/src, never CPUEMU_SRC.
#include "kernels_all.cpp"

#include "gdn_bwalk_mma.cu"
#include "gdn_tape_planes.cu"
#include "walk_planes_ref.h"

// No second EMU_DYNAMIC_SMEM: the walks declare `extern __shared__ float smem[]` in their extern "C"
// entries, which gives it C language linkage: it is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar bwalk_mma_kernels(
    {
        EMU_KERNEL(gdnkcp::bwalkmma, gdn_offset_walk_mma),
        EMU_KERNEL(gdnkcp::bwalkmma, gdn_tape_walk_mma),
        EMU_KERNEL(gdnkcp::tapep, gdn_tape_walk_planes),
        EMU_KERNEL(gdnkcp::tapep, gdn_tape_walk_planes_w128),
        EMU_KERNEL(gdnkcp::tapep, gdn_tape_walk_planes_h),
        EMU_KERNEL(gdnkcp::tapep, gdn_tape_walk_planes_w128_h),
        EMU_KERNEL(gdnkcp::tapep, gdn_offset_walk_planes),
        EMU_KERNEL(gdnkcp::tapep, gdn_offset_walk_planes_h),
        EMU_KERNEL(gdnkcp::planesref, test_walk_planes),
    },
    {
        {"bwalk_mma_smem(64)", gdnkcp::bwalkmma::bwalk_mma_smem(64)},
        {"bwalk_mma_smem(128)", gdnkcp::bwalkmma::bwalk_mma_smem(128)},
        {"tape_planes_smem(64)", gdnkcp::tapep::tape_planes_smem(64)},
        {"tape_planes_smem(128)", gdnkcp::tapep::tape_planes_smem(128)},
    });
}  // namespace

// The tape walk's dV'_local former (gdn_tape_walk_planes_hf) and its kernel (gdn_dvlocal_form), where the sources
// hold them (ptx/staging/tape_dvl_former.patch applied): TestTapeFormerOnCPU (tape_former_test.go) skips without.
#if __has_include("dvl_former.cuh")
namespace {
emu::Registrar tape_former_kernels(
    {
        EMU_KERNEL(gdnkcp::tapep, gdn_tape_walk_planes_hf),
        EMU_KERNEL(gdnkcp::tapep, gdn_offset_walk_planes_hf),
        EMU_KERNEL(gdnkcp::tapep, gdn_tape_walk_planes_f),
        EMU_KERNEL(gdnkcp::tapep, gdn_offset_walk_planes_f),
        EMU_KERNEL(gdnkcp::tapep, gdn_dvlocal_form),
    },
    {
        {"kDvlFormSmem", gdnkcp::tapep::kDvlFormSmem},
    });
}  // namespace
#endif
