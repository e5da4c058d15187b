// gdnkcp.cu: the one translation unit that tools/ptxgen compiles for every
// target (sm_90a, sm_100a, sm_103a cubins, the sm_107a slot, compute_80 PTX).
// Every other .cu file of ptx/src is #included here, so that every blob holds
// every entry; ptxgen refuses to build when one is missing from this list.
// Only standard CUDA C++ is used; the blobs are built without --use_fast_math.

#include "conv1d.cu"
#include "gdn_fwd.cu"
#include "gdn_bwd.cu"
#include "gdn_walk_tc.cu"
#include "gdn_chunk_tc.cu"
#include "gdn_walk_wgmma.cu"
#include "gdn_walk_mma.cu"
#include "gdn_walk_planes.cu"
#include "gdn_bwalk_wgmma.cu"
#include "gdn_bwalk_mma.cu"
#include "gdn_tape_planes.cu"
#include "gdn_prep_mma.cu"
#include "gdn_output_mma.cu"
#include "gdn_dvlocal_mma.cu"
#include "gdn_chunk_grads_mma.cu"
#include "gdn_chunk_grads_mma5.cu"
#include "util.cu"
