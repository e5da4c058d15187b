// kernels_fwd.cpp: the barrier-synchronous kernels of ptx/src that the CPU
// emulation test runs through runner.cpp: the conv forward, the poison
// helper and the fp32 GDN forward (gdn_fwd.cu). kernels_all.cpp adds the
// backward.
#include "conv1d.cu"
#include "gdn_fwd.cu"
#include "util.cu"
#include "registry.h"

namespace gdnkcp {
namespace fwd {
EMU_DYNAMIC_SMEM(smem);
}  // namespace fwd
}  // namespace gdnkcp

namespace {
emu::Registrar fwd_kernels(
    {
        {"gdn_conv1d_silu_fwd", emu::make_kernel(&gdn_conv1d_silu_fwd)},
        {"gdn_poison_u32", emu::make_kernel(&gdn_poison_u32)},
        EMU_KERNEL(gdnkcp::fwd, gdn_l2norm_fwd),
        EMU_KERNEL(gdnkcp::fwd, gdn_prep_fwd),
        EMU_KERNEL(gdnkcp::fwd, gdn_summary_walk),
        EMU_KERNEL(gdnkcp::fwd, gdn_compose_fwd),
        EMU_KERNEL(gdnkcp::fwd, gdn_state_walk),
        EMU_KERNEL(gdnkcp::fwd, gdn_output_fwd),
    },
    {
        {"kPrepSmem", gdnkcp::fwd::kPrepSmem},
        {"kComposeSmem", gdnkcp::fwd::kComposeSmem},
        {"kOutputSmem", gdnkcp::fwd::kOutputSmem},
        {"walk_smem(64)", gdnkcp::fwd::walk_smem(64)},
        {"walk_smem(128)", gdnkcp::fwd::walk_smem(128)},
    });
}  // namespace
