// kernels_all.cpp: kernels_fwd.cpp plus the fp32 GDN backward (gdn_bwd.cu),
// in one translation unit as in ptx/src/gdnkcp.cu (the backward shares
// device functions with the forward). Registered under the names and with the
// shared memory constants of docs/gpu-backward.md.
#include "kernels_fwd.cpp"

#include "gdn_bwd.cu"

// No second EMU_DYNAMIC_SMEM: the first `extern __shared__ float smem[]` of
// each namespace sits in an extern "C" kernel, which gives the name C language
// linkage, so gdnkcp::bwd::smem is kernels_fwd.cpp's gdnkcp::fwd::smem.

namespace {
emu::Registrar bwd_kernels(
    {
        EMU_KERNEL(gdnkcp::bwd, gdn_dvlocal_bwd),
        EMU_KERNEL(gdnkcp::bwd, gdn_offset_walk),
        EMU_KERNEL(gdnkcp::bwd, gdn_tape_walk),
        EMU_KERNEL(gdnkcp::bwd, gdn_chunk_grads),
        EMU_KERNEL(gdnkcp::bwd, gdn_qk_bwd),
        EMU_KERNEL(gdnkcp::bwd, gdn_conv1d_silu_bwd),
        EMU_KERNEL(gdnkcp::bwd, gdn_dw_reduce),
        EMU_KERNEL(gdnkcp::bwd, gdn_add_rows),
        EMU_KERNEL(gdnkcp::bwd, gdn_f32_to_bf16),
    },
    {
        {"kDvlSmem", gdnkcp::bwd::kDvlSmem},
        {"kGradSmem", gdnkcp::bwd::kGradSmem},
        {"bwd_walk_smem(64)", gdnkcp::bwd::bwd_walk_smem(64)},
        {"bwd_walk_smem(128)", gdnkcp::bwd::bwd_walk_smem(128)},
    });
}  // namespace
