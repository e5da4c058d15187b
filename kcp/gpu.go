package kcp

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/sched"
)

// gpuD is the only head dim the GPU kernels take (K = V = 128).
const gpuD = 128

// gpuBlock is the block size of every GDN kernel and of the conv launch.
const gpuBlock = 256

// PoisonBF16x2 is the 32-bit pattern the GPU backend fills its bf16 output
// with before the output kernel runs: two bf16 quiet NaNs (0x7fc1), a payload
// no kernel computes (a NaN result rounds to the canonical 0x7fff), so an
// element still holding it was never written.
const PoisonBF16x2 = 0x7fc17fc1

// poisonBF16 is one bf16 half of PoisonBF16x2.
const poisonBF16 = 0x7fc1

// The kernel entries of ptx/src the GPU forward launches.
const (
	entryConv    = "gdn_conv1d_silu_fwd"
	entryPoison  = "gdn_poison_u32"
	entryL2Norm  = "gdn_l2norm_fwd"
	entryPrep    = "gdn_prep_fwd"
	entrySummary = "gdn_summary_walk"
	entryCompose = "gdn_compose_fwd"
	entryState   = "gdn_state_walk"
	entryOutput  = "gdn_output_fwd"
)

// Dynamic shared memory of the GDN forward kernels in bytes, as
// ptx/src/gdn_fwd.cu lays it out (kPrepSmem, walk_smem, kComposeSmem,
// kOutputSmem).
const (
	prepSmem    = 4 * (ChunkSize*gpuD + ChunkSize*ChunkSize + 4*ChunkSize) // 50176
	composeSmem = 4 * 2 * gpuD * 64                                        // 65536
	outputSmem  = 4 * (2*ChunkSize*gpuD + ChunkSize*ChunkSize + gpuD*gpuD + ChunkSize)
)

// walkSmem is the dynamic shared memory of a summary or state walk CTA at
// width vh: 114944 bytes at vh 64, 164096 at vh 128.
func walkSmem(vh int) int {
	return 4 * (gpuD*vh + ChunkSize*vh + 2*ChunkSize*gpuD + ChunkSize)
}

// The tensor-core variants (ptx/src/gdn_walk_tc.cu, gdn_chunk_tc.cu): the
// same arguments and grids as the fp32 kernels, other shared memory.
const (
	entryPrepTC    = "gdn_prep_tc"
	entrySummaryTC = "gdn_summary_walk_tc"
	entryStateTC   = "gdn_state_walk_tc"
	entryOutputTC  = "gdn_output_tc"

	// The tensor-core kernels pad their bf16 rows by 8 elements (gdn_chunk_tc.cu).
	padD, padC   = gpuD + 8, ChunkSize + 8
	prepTCSmem   = 2*2*ChunkSize*padD + 4*2*ChunkSize*ChunkSize + 2*2*ChunkSize*padC + 2*ChunkSize*padD + 4*2*ChunkSize         // 103936
	outputTCSmem = 2*4*ChunkSize*padD + 2*gpuD*padD + 4*ChunkSize*ChunkSize + 2*ChunkSize*padC + 4*ChunkSize*gpuD + 4*ChunkSize // 163072
)

// walkTCSmem is walk_tc_smem(vh): 150544 bytes at vh 64, 216080 at vh 128.
func walkTCSmem(vh int) int { return 768*(vh+8) + 256*(vh+4) + 4*ChunkSize*padD*2 + 8*256*4 + 16 }

// The v4 kernels on mma.sync (hi/lo bf16 splits, fp32 accumulate): the
// same arguments and grids as the fp32 kernels, other shared memory. Their
// sources are in ptx/src and in the blobs (since 2026-12-01; design in
// docs/mma-kernels.md); with blobs that lack them, a backend asking for them
// fails with ErrMissingKernels.
const (
	entryPrepMMA = "gdn_prep_mma"
	// entryPrepMMAG is gdn_prep_mma a CTA a (chunk, QK head): the same
	// arguments and bits, grid (NC, HQK); the v5 set's prep where Kt is not
	// written (kernelSet.prepFor).
	entryPrepMMAG   = "gdn_prep_mma_g"
	entrySummaryMMA = "gdn_summary_walk_mma"
	entryStateMMA   = "gdn_state_walk_mma"
	entryOutputMMA  = "gdn_output_mma"
	entryOffsetMMA  = "gdn_offset_walk_mma"
	entryTapeMMA    = "gdn_tape_walk_mma"
	// entryTapePlanes: the tape walk on the walk planes and q's bf16 rows
	// (gdn_tape_planes.cu; kernelSet.bwalkPlanes).
	entryTapePlanes = "gdn_tape_walk_planes"
	// entryTapePlanes128: its vh 128 entry (one entry a width: kernelSet.tapeEntry).
	entryTapePlanes128 = "gdn_tape_walk_planes_w128"
	// entryTapePlanesH and entryTapePlanesH128: the tape walk on single bf16
	// products (the core stage's unless GPUOptions.SplitTape), the same
	// arguments; entryOffsetPlanesH the offset walk.
	entryTapePlanesH    = "gdn_tape_walk_planes_h"
	entryTapePlanesH128 = "gdn_tape_walk_planes_w128_h"
	entryOffsetPlanesH  = "gdn_offset_walk_planes_h"
	// entryTapePlanesHF: entryTapePlanesH (vh 64) forming dV'_local itself on
	// its copying warpgroup a chunk ahead, reading no dvl (GPUOptions.TapeFormer);
	// entryDVLocalForm: gdn_dvlocal_form, the same former's dvl in a kernel,
	// for the walks that read dvl beside it (vh 128, the offset walk): grid
	// (NC, HV), dvlocalFormSmem, gdn_dvlocal_mma_gr's arguments. Both in
	// ptx/staging/tape_dvl_former.patch until a blob build lands them.
	entryTapePlanesHF = "gdn_tape_walk_planes_hf"
	entryDVLocalForm  = "gdn_dvlocal_form"
	// entryOffsetPlanesHF: entryOffsetPlanesH at vh 64 forming its R columns'
	// dV'_local itself, as entryTapePlanesHF does (GPUOptions.TapeFormer);
	// entryTapePlanesF, entryOffsetPlanesF: the same formers in the split-product
	// walks (entryTapePlanes, entryOffsetPlanes: the module stage's, and the
	// core stage's with SplitTape or SplitGrads).
	entryOffsetPlanesHF = "gdn_offset_walk_planes_hf"
	entryTapePlanesF    = "gdn_tape_walk_planes_f"
	entryOffsetPlanesF  = "gdn_offset_walk_planes_f"
	// entryOffsetPlanes: the offset walk on them (the same file).
	entryOffsetPlanes = "gdn_offset_walk_planes"
	entryDVLocalMMA   = "gdn_dvlocal_mma"
	// entryDVLocalMMAG is gdn_dvlocal_mma a CTA a (chunk, QK head): the same
	// arguments and bits, grid (NC, HQK); the v5 set's dV'_local.
	entryDVLocalMMAG = "gdn_dvlocal_mma_g"
	// entryDVLocalMMAGK is gdn_dvlocal_mma_g reading K as the prep's K^T
	// walk planes (rk.wk) in place of kn: the same grid, shared memory and
	// bits (kernelSet.dvlocalKt: the v5 set, whose forward writes them).
	entryDVLocalMMAGK = "gdn_dvlocal_mma_gk"
	// entryDVLocalMMAGR is gdn_dvlocal_mma_g on q's and k's raw bf16 rows and
	// their l2norm factors, as the plane walks read them (the v5 set's unless
	// GPUOptions.SplitDvLocal).
	entryDVLocalMMAGR = "gdn_dvlocal_mma_gr"
	entryGradsMMA     = "gdn_chunk_grads_mma"
	// The v5 forward path (MMAForward5): walks that rebuild Kt from kn and
	// gcum (no per-value-head Kt from the prep), the state walk also
	// writing bf16 copies of H and V' (transposed), and the output that
	// reads those.
	entrySummaryMMA16 = "gdn_summary_walk_mma16"
	entryStateMMA16   = "gdn_state_walk_mma16"
	entryOutputMMA16  = "gdn_output_mma16"
	// entryOutputMMA16G is gdn_output_mma16 a CTA a (chunk, QK head): the same
	// arguments and bits, grid (NC, HQK); the v5 set's output.
	entryOutputMMA16G = "gdn_output_mma16g"
	// entryPrepMMAGN and entryOutputMMA16GN are gdn_prep_mma_g (kt null)
	// normalising k itself from its bf16 rows and gdn_output_mma16g
	// normalising q and reading K as the prep's K^T walk planes
	// (kernelSet.normQK): the forward alone skips the l2norm kernel.
	entryPrepMMAGN     = "gdn_prep_mma_gn"
	entryOutputMMA16GN = "gdn_output_mma16gn"
	// entryPrepMMAGNK and entryOutputMMA16GNK are the same for a forward
	// kept for a backward: they also write Kt and qn, kn and their rstd
	// where the l2norm kernel would, so that forward skips it too. Separate
	// entries, so the forward alone's code tests none of those pointers.
	entryPrepMMAGNK     = "gdn_prep_mma_gnk"
	entryOutputMMA16GNK = "gdn_output_mma16gnk"
	// The v5 walks on the prep's walk planes (gdn_walk_planes.cu): the
	// summary and state walks' arguments with the planes in place of w, kn
	// and HQK, the same outputs and bits (sm_90a) as the mma16 walks.
	entrySummaryPlanes = "gdn_summary_walk_planes"
	entryStatePlanes   = "gdn_state_walk_planes"
	// The v5 chunk gradients (MMAGroupedGrads): one CTA per chunk and QK
	// head, the value heads summed inside it and the l2norm backward fused.
	entryGradsMMA5 = "gdn_chunk_grads_mma5"
	// entryGradsMMA6 is gdn_chunk_grads_mma5 reading V' and dV' as the
	// token slots the plane state walk and the mma tape walk write
	// (kernelSet.tokenSlots): the same arguments, grid, shared memory and
	// bits.
	entryGradsMMA6 = "gdn_chunk_grads_mma6"
	// entryGradsMMA7 is gdn_chunk_grads_mma6 with every product on the
	// bf16 hi halves of its operands alone (one mma.sync where mma6 runs two
	// or three): the same arguments, grid and shared memory, gradients good
	// to ~3e-3 of float64 instead of ~5e-6 (GPUOptions.SplitGrads).
	entryGradsMMA7 = "gdn_chunk_grads_mma7"
	// entryGradsMMA8 is gdn_chunk_grads_mma7 reading the forward's bf16
	// H^T and V'^T (h16, vnew16: the state walk writes them for the output)
	// and the tape walk's bf16 D^T and dV'^T (d16, dvnew16) in place of
	// fp32 H, D and the V' and dV' token slots, which mma7 rounds to exactly
	// those values: mma7's arguments with h16, vnew16, d16 and dvnew16 in
	// h's, vnew's, d_chunk's and dvnew's places, mma7's bits except dg,
	// whose <D, H> term takes D and H as bf16 (kernelSet.statesBF16).
	entryGradsMMA8 = "gdn_chunk_grads_mma8"
	// entryGradsMMA8R and entryGradsMMA6R are mma8 and mma6 on q's and k's
	// raw bf16 rows with q_rstd and k_rstd (the v5 set's since v5.37; GPUOptions.FP32QKGrads
	// runs mma8 / mma6): their bits.
	entryGradsMMA8R = "gdn_chunk_grads_mma8r"
	entryGradsMMA6R = "gdn_chunk_grads_mma6r"

	// prepMMASmem is kPrepMMASmem (gdn_prep_mma.cu): k fp32, L / the
	// inverse fp32 [64][68], three bf16 hi/lo stages and the per-row
	// scalars: 100096 (two CTAs an SM).
	prepMMASmem = 4*ChunkSize*gpuD + 4*ChunkSize*(ChunkSize+4) + 3*2*ChunkSize*gpuD + 3*4*ChunkSize
	// prepMMAGSmem is kPrepMMAGSmem (gdn_prep_mma.cu): prepMMASmem and the
	// raw K K^T blocks (10 x 32 lanes x 8 values) and the gamma and beta of
	// up to 8 value heads (kMaxGB), 114432 (two CTAs an SM).
	prepMMAGSmem = prepMMASmem + 4*10*32*8 + 2*4*8*ChunkSize
	// outputMMASmem is kOutputMMASmem (gdn_output_mma.cu): 98560 (two CTAs
	// an SM).
	outputMMASmem = 98560
	// dvlocalMMASmem is kDvlMMASmem (gdn_dvlocal_mma.cu): q and k as bf16
	// hi/lo, dO bf16 and gamma: 82176 (two CTAs an SM).
	dvlocalMMASmem = 82176
	// dvlocalMMAGSmem is kDvlMMAGSmem (gdn_dvlocal_mma.cu): dvlocalMMASmem and
	// a second gamma stage, 82432 (two CTAs an SM).
	dvlocalMMAGSmem = 82432
	// dvlocalMMAGRSmem is kDvlMMAGRSmem: dvlocalMMAGSmem and the 64 l2norm
	// factors of q and of k, 82944 (two CTAs an SM).
	dvlocalMMAGRSmem = 82944
	// dvlocalFormSmem is kDvlFormSmem (gdn_tape_planes.cu with the former):
	// k's and q's rows, two dO halves, gamma and f, 1008 bytes of
	// alignment: 50672.
	dvlocalFormSmem = 50672
	// chunkGradMMASmem is kGradMMASmem (gdn_chunk_grads_mma.cu): 227136
	// (one CTA an SM).
	chunkGradMMASmem = 227136
	// chunkGradMMA5Smem is kGradMMA5Smem (gdn_chunk_grads_mma5.cu): 227136
	// (one CTA an SM).
	chunkGradMMA5Smem = 227136
	// outputMMA16Smem is kOutputMMA16Smem (gdn_output_mma.cu): 114944 (two
	// CTAs an SM).
	outputMMA16Smem = 114944
)

// walkMMASmem is walk_mma_smem(vh) of gdn_walk_mma.cu: 230400 bytes at vh
// 64 (with the 16384-byte key-split exchange) and at vh 128 (one CTA an SM).
func walkMMASmem(vh int) int {
	if vh == 64 {
		return 196608 + 256*(vh+4) + 16384
	}
	return 196608 + 256*(vh+4)
}

// walkWPlaneBytes and walkKPlaneBytes are walk_planes.cuh's kWBytes and
// kKBytes: the walk planes of -W a chunk and value head, of K^T a chunk and
// QK head (bf16 hi / lo).
const (
	walkWPlaneBytes = 32768
	walkKPlaneBytes = 32768
)

// walkPlanesSmem is walk_planes_smem(vh) of gdn_walk_planes.cu: two stages
// (a chunk's -W planes, k's bf16 rows, fp32 U rows and 64 factors, rounded
// up to 1024 bytes), at vh 64 two buffers of the bf16 H^T and V'^T tiles,
// and 1008 bytes of alignment: 183280 bytes at vh 64, 166896 at vh 128.
func walkPlanesSmem(vh int) int {
	stage := (walkWPlaneBytes + 2*ChunkSize*gpuD + 4*ChunkSize*vh + 4*ChunkSize + 1023) / 1024 * 1024
	out := 0
	if vh == 64 {
		out = 2 * (2*vh*gpuD + 2*vh*ChunkSize)
	}
	return 2*stage + out + 1008
}

// bwdWalkMMASmem is bwalk_mma_smem(vh) of gdn_bwalk_mma.cu: 231424 bytes at
// vh 64 (two dO stages and the key-split exchange), 214016 at vh 128.
func bwdWalkMMASmem(vh int) int {
	if vh == 64 {
		return 196608 + 2*128*(vh+8) + 16384
	}
	return 196608 + 128*(vh+8)
}

// tapePlanesSmem is tape_planes_smem(vh) of gdn_tape_planes.cu: two stages
// (a chunk's -W planes, k's and q's bf16 rows, dO and 128 factors, rounded
// up to 1024 bytes), two fp32 dV'_local buffers, at vh 64 two buffers of the
// bf16 D^T and dV'^T tiles, and 1008 bytes of alignment: 232432 bytes at
// both widths.
func tapePlanesSmem(vh int) int {
	stage := (walkWPlaneBytes + 2*2*ChunkSize*gpuD + 2*ChunkSize*vh + 8*ChunkSize + 1023) / 1024 * 1024
	out := 0
	if vh == 64 {
		out = 2 * (2*vh*gpuD + 2*vh*ChunkSize)
	}
	return 2*stage + 2*4*ChunkSize*vh + out + 1008
}

// KernelSets are the kernel sets by name, slowest first; SetKernels and
// GPUOptions.Kernels take them and KernelsAuto.
var KernelSets = []string{"fp32", "tc", "mma", "v5"}

// SetKernels selects a named kernel set and records its name in Kernels:
// "fp32" (every kernel on the CUDA cores), "tc" (the v3 tensor-core
// forward: TensorCoreWalks and TensorCoreChunk; fp32 backward) or "mma"
// (the v4 kernels: MMAWalks, MMAChunk, MMABackwardWalks and
// MMABackwardChunk) or "v5" (the v4 kernels with MMAForward5 and
// MMAGroupedGrads), or KernelsAuto (no switch: NewGPU chooses). It clears
// the other sets' switches; SplitGrads, which modifies v5, stays.
func (o *GPUOptions) SetKernels(name string) error {
	var set GPUOptions
	if err := set.setSwitches(name); err != nil {
		return err
	}
	o.TensorCoreWalks, o.TensorCoreChunk = set.TensorCoreWalks, set.TensorCoreChunk
	o.MMAWalks, o.MMAChunk, o.MMABackwardWalks, o.MMABackwardChunk = set.MMAWalks, set.MMAChunk, set.MMABackwardWalks, set.MMABackwardChunk
	o.MMAForward5, o.MMAGroupedGrads = set.MMAForward5, set.MMAGroupedGrads
	o.Kernels = name
	return nil
}

// setSwitches sets the switches of the set name on o, which has none set.
func (o *GPUOptions) setSwitches(name string) error {
	switch name {
	case KernelsAuto, "fp32":
	case "tc":
		o.TensorCoreWalks, o.TensorCoreChunk = true, true
	case "mma":
		o.MMAWalks, o.MMAChunk, o.MMABackwardWalks, o.MMABackwardChunk = true, true, true, true
	case "v5":
		o.MMAWalks, o.MMAChunk, o.MMABackwardWalks, o.MMABackwardChunk = true, true, true, true
		o.MMAForward5, o.MMAGroupedGrads = true, true
	default:
		return fmt.Errorf("kcp: kernel set %q: want one of %s or %s", name, strings.Join(KernelSets, ", "), KernelsAuto)
	}
	return nil
}

// kernelFlags are the kernel switches of o, for comparing choices.
func (o GPUOptions) kernelFlags() [13]bool {
	return [13]bool{o.TensorCoreWalks, o.TensorCoreChunk, o.MMAWalks, o.MMAChunk, o.MMABackwardWalks, o.MMABackwardChunk,
		o.MMAForward5, o.MMAGroupedGrads, o.SplitGrads, o.SplitTape, o.SplitDvLocal, o.FP32QKGrads, o.TapeFormer}
}

// gpuEntry is a kernel the backend resolves and the most dynamic shared
// memory it launches it with.
type gpuEntry struct {
	name string
	smem int
}

// kernelSet names the kernels of the stages that have variants and their
// shared memory.
type kernelSet struct {
	prep, summary, state, output string
	prepSmem, outputSmem         int
	walkSmem                     func(vh int) int
	offset, tape                 string           // the backward walks
	tape128                      string           // the tape walk's vh 128 entry where it has one a width (tapeEntry)
	bwdWalkSmem                  func(vh int) int // the offset walk's (the tape walk's: tapeSmem)
	tapeSmem                     func(vh int) int
	// tapeHi, tapeHi128, offsetHi: the core stage's tape and offset walk
	// entries where they are not tape, tape128 and offset
	// (GPUOptions.SplitTape unset: tapeEntryFor, offsetEntryFor).
	tapeHi, tapeHi128, offsetHi string
	// dvlocalForm, tapeForm, offsetForm, tapeFormSplit, offsetFormSplit
	// (GPUOptions.TapeFormer): the kernel that forms dV'_local for the walks
	// that read it (in dvlocal's place, on the pairs they read:
	// formerItems), and the vh 64 tape and offset walks that form it
	// themselves, on single products (in tapeHi's and offsetHi's places) and
	// on split ones (in tape's and offset's).
	dvlocalForm, tapeForm, offsetForm, tapeFormSplit, offsetFormSplit string
	// bwalkPlanes: the offset and tape walks are gdn_offset_walk_planes and
	// gdn_tape_walk_planes, which read the forward's -W and K^T walk planes
	// (rk.wp, rk.wk) and q's bf16 rows with q_rstd in place of fp32 W, Kt
	// and qn (the v5 set with the mma backward walks), so no kept forward
	// writes fp32 W or Kt.
	bwalkPlanes    bool
	dvlocal, grads string // the backward's chunk-parallel kernels
	// gradsModule: the module stage's chunk gradients where they are not
	// grads (gradsFor), with grads' shared memory and arguments.
	gradsModule            string
	dvlocalSmem, gradsSmem int // theirs
	// out16: summary and state are the v5 walks (kn and HQK in place of
	// kt; the state walk also takes bf16 H^T and V'^T) and output
	// gdn_output_mma16 (or its grouped form), which reads those.
	out16 bool
	// outputQK: the output runs a CTA a (chunk, QK head), grid (NC, HQK)
	// (gdn_output_mma16g), not a CTA a (chunk, value head).
	outputQK bool
	// grads5: grads is gdn_chunk_grads_mma5 (grid (NC, HQK), dq and dk
	// summed over value heads and through the l2norm backward inside it),
	// and the l2norm backward kernel does not run.
	grads5 bool
	// prepQK: the prep runs a CTA a (chunk, QK head), grid (NC, HQK)
	// (gdn_prep_mma_g), not a CTA a (chunk, value head), where it does not
	// write Kt (prepFor).
	prepQK bool
	// dvlocalQK: dV'_local runs a CTA a (chunk, QK head), grid (NC, HQK)
	// (gdn_dvlocal_mma_g), not a CTA a (chunk, value head).
	dvlocalQK bool
	// dvlocalKt: dV'_local reads K as the K^T walk planes (rk.wk), not kn
	// (gdn_dvlocal_mma_gk).
	dvlocalKt bool
	// rawQKDvLocal: dV'_local reads q's and k's raw bf16 rows with q_rstd
	// and k_rstd (gdn_dvlocal_mma_gr: GPUOptions.SplitDvLocal unset).
	// rawQKGrads: the chunk gradients read them (gdn_chunk_grads_mma8r,
	// mma6r; not with GPUOptions.FP32QKGrads). With both, a kept forward writes no
	// fp32 qn, kn (noNormRows).
	rawQKDvLocal, rawQKGrads bool
	// planes: the prep (gdn_prep_mma or gdn_prep_mma_g) writes the walk
	// planes and summary and state are the plane walks, which read them in
	// place of w and kn; fp32 w is then written only where a backward
	// reads it.
	planes bool
	// tokenSlots: V' (the state walk's vnew) and dV' (the tape walk's
	// dvnew) are kept as token slots (V'^T in fp32, a 32 KB block a (chunk,
	// value head), its 32-byte slots permuted: docs/gpu-backward.md), not
	// as fp32 rows, and grads is gdn_chunk_grads_mma6, which copies them
	// whole (the v5 set: plane walks, the mma tape walk and the grouped
	// chunk gradients).
	tokenSlots bool
	// statesBF16: the core stage's chunk gradients (gdn_chunk_grads_mma8)
	// read the forward's bf16 H^T and V'^T (h16, vnew16) and the tape walk's
	// bf16 D^T and dV'^T (d16, dvnew16), so a forward kept for a core-stage
	// backward writes neither fp32 H nor V' token slots (fp32States) and the
	// tape walk writes D and dV' as bf16 only (bf16States); the module
	// stage's (gdn_chunk_grads_mma6) still reads the fp32 ones.
	statesBF16 bool
	// normQK: a forward that keeps nothing for a backward (no Kt written)
	// runs gdn_prep_mma_gn and gdn_output_mma16gn, which normalise k (the
	// prep, into the K^T walk planes the output reads) and q (the output)
	// from their bf16 rows with gdn_l2norm_fwd's arithmetic (the same bits),
	// and not the l2norm kernel: no fp32 qn, kn written or read (the v5
	// set: grouped prep and output on the walk planes).
	normQK bool
}

// kernelSet returns the kernels the options select: the fp32 CUDA-core
// kernels of gdn_fwd.cu and gdn_bwd.cu, the v3 tensor-core forward
// variants, or the v4 mma variants (an MMA switch wins over the
// TensorCore one of the same stage).
func (o GPUOptions) kernelSet() kernelSet {
	ks := kernelSet{prep: entryPrep, summary: entrySummary, state: entryState, output: entryOutput,
		prepSmem: prepSmem, outputSmem: outputSmem, walkSmem: walkSmem,
		offset: entryOffset, tape: entryTape, bwdWalkSmem: bwdWalkSmem, tapeSmem: bwdWalkSmem,
		dvlocal: entryDVLocal, grads: entryChunkGrads, dvlocalSmem: dvlocalSmem, gradsSmem: chunkGradSmem}
	switch {
	case o.MMAWalks:
		ks.summary, ks.state, ks.walkSmem = entrySummaryMMA, entryStateMMA, walkMMASmem
	case o.TensorCoreWalks:
		ks.summary, ks.state, ks.walkSmem = entrySummaryTC, entryStateTC, walkTCSmem
	}
	switch {
	case o.MMAChunk:
		ks.prep, ks.output, ks.prepSmem, ks.outputSmem = entryPrepMMA, entryOutputMMA, prepMMASmem, outputMMASmem
	case o.TensorCoreChunk:
		ks.prep, ks.output, ks.prepSmem, ks.outputSmem = entryPrepTC, entryOutputTC, prepTCSmem, outputTCSmem
	}
	if o.MMABackwardWalks {
		ks.offset, ks.tape, ks.bwdWalkSmem, ks.tapeSmem = entryOffsetMMA, entryTapeMMA, bwdWalkMMASmem, bwdWalkMMASmem
	}
	if o.MMABackwardChunk {
		ks.dvlocal, ks.grads, ks.dvlocalSmem, ks.gradsSmem = entryDVLocalMMA, entryGradsMMA, dvlocalMMASmem, chunkGradMMASmem
	}
	if o.MMAForward5 {
		ks.summary, ks.state, ks.walkSmem = entrySummaryMMA16, entryStateMMA16, walkMMASmem
		ks.output, ks.outputSmem, ks.out16, ks.outputQK = entryOutputMMA16G, outputMMA16Smem, true, true
		if ks.prep == entryPrepMMA {
			ks.prep, ks.prepSmem, ks.prepQK = entryPrepMMAG, prepMMAGSmem, true
			// Only the mma preps write the walk planes.
			ks.summary, ks.state, ks.walkSmem, ks.planes = entrySummaryPlanes, entryStatePlanes, walkPlanesSmem, true
			ks.normQK = true
			if ks.tape == entryTapeMMA {
				ks.offset, ks.tape, ks.bwdWalkSmem, ks.tapeSmem = entryOffsetPlanes, entryTapePlanes, tapePlanesSmem, tapePlanesSmem
				ks.tape128 = entryTapePlanes128
				ks.bwalkPlanes = true
			}
		}
	}
	if o.MMAGroupedGrads {
		ks.grads, ks.gradsSmem, ks.grads5 = entryGradsMMA5, chunkGradMMA5Smem, true
		ks.dvlocal, ks.dvlocalSmem, ks.dvlocalQK = entryDVLocalMMAG, dvlocalMMAGSmem, true
		if ks.planes && (ks.tape == entryTapeMMA || ks.bwalkPlanes) {
			// The core stage's chunk gradients on bf16 products; the module
			// stage's keep hi / lo ones (GPUOptions.SplitGrads says why).
			ks.grads, ks.gradsModule, ks.tokenSlots, ks.statesBF16 = entryGradsMMA8, entryGradsMMA6, true, true
			ks.dvlocal, ks.dvlocalKt = entryDVLocalMMAGK, true
			if o.SplitGrads {
				ks.grads, ks.gradsModule, ks.statesBF16 = entryGradsMMA6, "", false
			}
			if !o.SplitTape && ks.statesBF16 && ks.bwalkPlanes {
				ks.tapeHi, ks.tapeHi128, ks.offsetHi = entryTapePlanesH, entryTapePlanesH128, entryOffsetPlanesH
			}
			if !o.SplitDvLocal && ks.bwalkPlanes {
				ks.dvlocal, ks.dvlocalSmem, ks.dvlocalKt, ks.rawQKDvLocal = entryDVLocalMMAGR, dvlocalMMAGRSmem, false, true
			}
			if o.TapeFormer && ks.bwalkPlanes && ks.rawQKDvLocal {
				ks.dvlocalForm, ks.tapeFormSplit, ks.offsetFormSplit = entryDVLocalForm, entryTapePlanesF, entryOffsetPlanesF
				if ks.tapeHi != "" {
					ks.tapeForm, ks.offsetForm = entryTapePlanesHF, entryOffsetPlanesHF
				}
			}
			if !o.FP32QKGrads && ks.bwalkPlanes {
				raw := map[string]string{entryGradsMMA8: entryGradsMMA8R, entryGradsMMA6: entryGradsMMA6R}
				ks.grads, ks.rawQKGrads = raw[ks.grads], true
				if ks.gradsModule != "" {
					ks.gradsModule = raw[ks.gradsModule]
				}
			}
		}
	}
	return ks
}

// fp32States reports whether a forward writes the fp32 per-chunk states
// and V' (rk.h, rk.vnew): where the output reads them (sets without out16),
// and where a backward of stage will (keep: KeepDevice, or a recompute)
// unless its chunk gradients read the bf16 copies instead (bf16States).
func (ks kernelSet) fp32States(keep bool, stage Stage) bool {
	if !ks.out16 {
		return true
	}
	return keep && !ks.bf16States(stage)
}

// bf16States reports whether stage's chunk gradients are
// gdn_chunk_grads_mma8, which read the forward's bf16 H^T and V'^T (h16,
// vnew16) and the tape walk's bf16 D^T and dV'^T (d16, dvnew16) in place of
// fp32 H, D and the V' and dV' token slots.
func (ks kernelSet) bf16States(stage Stage) bool { return ks.statesBF16 && stage == StageCore }

// prepFor returns the prep entry, its shared memory and whether it runs a
// CTA a QK head, for a forward that writes Kt (writesKt: a backward or a
// recompute reads it) or not, with group = HV / HQK value heads a QK head.
// The grouped prep (prepQK) writes every head's Kt in its first head's pass
// when it stages every head's gamma (group <= prepMaxGroup); past that each
// later head reads its k rows again from global memory for Kt, which
// measured slower than the ungrouped prep on the H200 (32,768 tokens,
// 2026-12-02: 1.347 -> 1.412 ms), so there the set's ungrouped gdn_prep_mma
// runs. Without Kt the grouped prep was faster (1.276 -> 1.108 ms). Both
// write the same bits.
func (ks kernelSet) prepFor(writesKt bool, group int) (entry string, smem int, qk bool) {
	if ks.prepQK && writesKt && group > prepMaxGroup {
		return entryPrepMMA, prepMMASmem, false
	}
	return ks.prep, ks.prepSmem, ks.prepQK
}

// prepMaxGroup is kMaxGB (gdn_prep_mma.cu): the most value heads a QK head
// whose gamma and beta the grouped prep stages at once.
const prepMaxGroup = 8

// entries lists every kernel a forward with this set launches, with the
// most dynamic shared memory it takes (walks at vh 128).
func (ks kernelSet) entries() []gpuEntry {
	es := []gpuEntry{
		{entryConv, 0},
		{entryPoison, 0},
		{entryL2Norm, 0},
		{ks.prep, ks.prepSmem},
		{ks.summary, max(ks.walkSmem(64), ks.walkSmem(128))},
		{entryCompose, composeSmem},
		{ks.state, max(ks.walkSmem(64), ks.walkSmem(128))},
		{ks.output, ks.outputSmem},
	}
	if e, smem, _ := ks.prepFor(true, prepMaxGroup+1); e != ks.prep { // Kt past kMaxGB heads a QK head
		es = append(es, gpuEntry{e, smem})
	}
	if ks.normQK {
		es = append(es, gpuEntry{entryPrepMMAGN, ks.prepSmem}, gpuEntry{entryOutputMMA16GN, ks.outputSmem},
			gpuEntry{entryPrepMMAGNK, ks.prepSmem}, gpuEntry{entryOutputMMA16GNK, ks.outputSmem})
	}
	return es
}

// GPUForwardEntries returns the kernel entries the GPU forward needs in a
// blob with the default (fp32) kernels, in launch order of a module-stage
// forward.
func GPUForwardEntries() []string {
	var out []string
	for _, e := range (GPUOptions{}).kernelSet().entries() {
		out = append(out, e.name)
	}
	return out
}

// missingEntries lists the entries of es that blob b lacks.
func missingEntries(b *ptx.Blob, es []gpuEntry) []string {
	var miss []string
	for _, e := range es {
		if _, ok := b.Entry(e.name); !ok {
			miss = append(miss, e.name)
		}
	}
	return miss
}

// ErrMissingKernels is wrapped by the error of ProbeGPU and NewGPU when the
// chosen blob lacks kernel entries the backend launches (blobs built before
// the kernels were added).
var ErrMissingKernels = errors.New("kcp: gpu: the blob lacks kernel entries")

// ProbeGPU reports whether GPU device can run the GPU backend without loading
// anything: it detects the device (archdetect.Detect with the given blob
// override; empty: GDNKCP_BLOB or the automatic choice) and checks that the
// chosen blob has every entry of GPUForwardEntries and GPUBackwardEntries.
// It returns the profile, or an error that wraps loader.ErrNoDriver when
// there is no driver, and one that wraps ErrMissingKernels and names the
// entries when the blob predates the GDN kernels (forward or backward).
func ProbeGPU(device int, blob string) (*archdetect.Profile, error) {
	return probeGPU(device, blob, GPUOptions{}.kernelSet().allEntries())
}

func probeGPU(device int, blob string, es []gpuEntry) (*archdetect.Profile, error) {
	p, err := archdetect.Detect(device, archdetect.Options{Blob: blob})
	if err != nil {
		return nil, fmt.Errorf("kcp: gpu: %w", err)
	}
	if miss := missingEntries(p.Blob, es); len(miss) > 0 {
		return nil, missingKernelsError(p.Target, p.Blob.File, miss)
	}
	return p, nil
}

// stagedEntries are kernel entries whose sources wait in ptx/staging (the
// patch named) until a blob build lands them in ptx/src.
var stagedEntries = map[string]string{
	entryTapePlanesHF:   "tape_dvl_former.patch",
	entryOffsetPlanesHF: "tape_dvl_former.patch",
	entryTapePlanesF:    "tape_dvl_former.patch",
	entryOffsetPlanesF:  "tape_dvl_former.patch",
	entryDVLocalForm:    "tape_dvl_former.patch",
}

// missingKernelsError is probeGPU's error for blob file of target lacking the
// entries miss: it names where the blobs came from (the embedded ones, or
// GDNKCP_BLOB_DIR's directory, as ptx.Default reads them), and the staged
// patches the build needs first where a missing entry is staged.
func missingKernelsError(target, file string, miss []string) error {
	which := "the embedded blobs predate"
	if d := os.Getenv(ptx.EnvBlobDir); d != "" {
		which = fmt.Sprintf("the blobs in %s (%s) predate", d, ptx.EnvBlobDir)
	}
	var patches []string
	for _, m := range miss {
		if p := stagedEntries[m]; p != "" && !slices.Contains(patches, p) {
			patches = append(patches, p)
		}
	}
	staged := ""
	if len(patches) > 0 {
		staged = fmt.Sprintf(" after applying ptx/staging/%s (scripts/land-v4.sh)", strings.Join(patches, ", ptx/staging/"))
	}
	return fmt.Errorf("%w: blob %s (%s) lacks %s: %s these kernels; rebuild them from ptx/src%s with tools/ptxgen",
		ErrMissingKernels, target, file, strings.Join(miss, ", "), which, staged)
}

// GPUOptions configure the GPU backend. The zero value runs Options' defaults
// (the core stage) on device 0 with the fastest kernel set the device and its blob
// allow (Kernels, KernelsAuto: v5 on an H200, ~3.2 ms for the 32K core
// forward against ~60 ms for the fp32 CUDA-core set); Kernels or
// SetKernels name another set.
type GPUOptions struct {
	// Options are the backend options shared with the CPU backend. A zero
	// Options.Profile takes the width profile of the detected GPU
	// (sched.NewProfile(variant, SMs)) rather than DefaultProfile.
	Options
	// Device is the CUDA device ordinal of a backend on one device (Devices
	// empty), and the device of the one rank a backend with a Communicator
	// runs.
	Device int
	// Blob forces a blob slot, e.g. "compute_80" to run the portable PTX
	// path; empty: GDNKCP_BLOB, else the automatic choice.
	Blob string
	// Kernels names the kernel set: one of KernelSets, or KernelsAuto.
	// Left empty with every kernel switch below unset it means KernelsAuto:
	// NewGPU runs the fastest set the first device and its blob allow
	// (ChooseKernels: v5 on an H200), and GPU.Kernels says which and why. A
	// name with the switches unset runs that set (SetKernels sets the name
	// and its switches together); switches set by hand with Kernels empty
	// run as they are (GPU.Kernels reports KernelsCustom where they are
	// not a named set). A name whose switches differ from those set is an
	// error from NewGPU.
	Kernels string
	// KeepDevice keeps every rank's device buffers after Forward, in the
	// returned GPUForward (for GPUForward.Backward, and for inspection);
	// the caller then frees them with GPUForward.Close. Unset, Forward frees
	// them before it returns. ForwardCheckpoint ignores it (it keeps
	// nothing on the device).
	KeepDevice bool
	// TensorCoreWalks launches the tensor-core summary and state walks
	// (gdn_summary_walk_tc, gdn_state_walk_tc) instead of the fp32 ones.
	// This and TensorCoreChunk select the forward's (and the recompute's)
	// kernels of the tc set (SetKernels("tc")); its backward is the fp32
	// set's.
	TensorCoreWalks bool
	// TensorCoreChunk launches the tensor-core chunk prep and output
	// (gdn_prep_tc, gdn_output_tc) instead of the fp32 ones.
	TensorCoreChunk bool
	// MMAWalks launches the v4 summary and state walks on mma.sync
	// (gdn_summary_walk_mma, gdn_state_walk_mma), MMAChunk the v4 chunk
	// prep and output (gdn_prep_mma, gdn_output_mma), MMABackwardWalks the
	// v4 offset and tape walks (gdn_offset_walk_mma, gdn_tape_walk_mma),
	// MMABackwardChunk the backward's dV'_local and chunk gradients
	// (gdn_dvlocal_mma, gdn_chunk_grads_mma); each wins over the TensorCore
	// switch of the same stage. SetKernels("mma") sets all four. Blobs built
	// before these kernels lack them: NewGPU then fails with
	// ErrMissingKernels.
	MMAWalks, MMAChunk, MMABackwardWalks, MMABackwardChunk bool
	// MMAForward5 runs the v5 forward path (whatever MMAWalks says): the
	// summary and state walks rebuild Kt from kn and gcum, bit for bit the
	// prep's (gdn_summary_walk_mma16, gdn_state_walk_mma16), so the prep
	// writes Kt only for a backward; the state walk also writes H and V' as
	// bf16, transposed, and the output (gdn_output_mma16) reads those, H
	// and V' as plain bf16 operands: half the bytes between the two, an
	// output error of ~2.4e-3 of float64 instead of ~1.7e-3 (the 5e-3 budget
	// allows it). Kt and the fp32 H and V' are written only when a backward
	// needs them (KeepDevice, Recompute), so a forward and its recompute
	// compute the output from the same bits.
	// SetKernels("v5") sets it with the "mma" switches and MMAGroupedGrads.
	MMAForward5 bool
	// MMAGroupedGrads runs the v5 chunk gradients (gdn_chunk_grads_mma5,
	// whatever MMABackwardChunk says for dV'_local): one CTA per chunk and
	// QK head loops over the QK head's value heads, sums dq and dk inside
	// it and applies the l2norm backward itself, so the per-value-head
	// dq / dk buffers and the l2norm backward kernel (stage "qk backward",
	// then empty) go away.
	MMAGroupedGrads bool
	// SplitGrads keeps the v5 core stage's chunk gradients on hi / lo
	// products (gdn_chunk_grads_mma6: each fp32 operand split into two bf16
	// halves, three mma.sync a product; the kernel's own error ~5e-6 of
	// float64). Unset, the v5 core stage runs gdn_chunk_grads_mma8
	// (gdn_chunk_grads_mma7 on the forward's bf16 H^T and V'^T), whose
	// products take the bf16 hi halves alone: ~3e-3 of float64 (core
	// gradients end to end on the H200: dq, dk ~3.4e-3, dg ~2.9e-3, inside
	// the 1e-2 and 5e-3 they are held to) and 1.55 ms faster at 32,768
	// tokens. The module stage runs mma6 either way: its bf16 conv output
	// already costs dg and dbeta ~2.3e-3 of their 5e-3, and mma7 on top
	// measured up to 4.0e-3. With it the forward kept for a core-stage
	// backward writes fp32 H and V' again (mma6 reads them). Other kernel
	// sets ignore it. Both kernels are
	// deterministic; they give different bits.
	SplitGrads bool
	// SplitTape keeps the v5 core stage's tape and offset walks on hi / lo
	// split products (gdn_tape_walk_planes and _w128, gdn_offset_walk_planes:
	// each fp32 operand split into two bf16 halves, ~16 bits, 2.3 times the
	// tensor work, the splits on the walk's chain). Unset, the core stage
	// runs them on single bf16 products (gdn_tape_walk_planes_h and
	// _w128_h, gdn_offset_walk_planes_h: D^T, dV'^T and dO^T diag(f) enter
	// the tensor cores as their bf16 roundings, -W as its hi plane): the
	// core stage's chunk gradients (gdn_chunk_grads_mma8) read D and dV' in
	// bf16 and take bf16 products, so the splits bought them little.
	// gdnref's model (TestTapeBF16Model) puts the gradients within 5% of
	// those from an exact tape with kcp's test gates, up to 1.4x with a long
	// memory (g in [-0.02, -0.001]), where building the kernels with
	// GDNKCP_TAPE_H_SPLIT_DOF=1 and _D=1 takes it back to 5%. Measured on an
	// H100 (docs/perf-notes.md, "The tape walk on single bf16 products"):
	// the tape walk 8% faster at 32,768 tokens, 19% at 120,908. The same
	// bits at both widths, split or not, and in B1, B3 and replay; other
	// bits than the split walk's. The module stage (mma6's hi / lo chunk
	// gradients), SplitGrads and the other kernel sets run the split walks
	// whatever it says.
	SplitTape bool
	// SplitDvLocal keeps the v5 backward's dV'_local on the forward's fp32
	// normalised q and k (gdn_dvlocal_mma_gk: S^T = K Q^T as three products
	// of ~16-bit splits a term). Unset, it runs gdn_dvlocal_mma_gr on q's
	// and k's raw bf16 rows and their l2norm factors, as the plane walks
	// read them: S^T as one exact bf16 product a term, scaled by the rstd
	// in fp32; as close to float64 or closer (2.5e-6 against 5e-6 on the
	// emulator), other bits, and 8% faster on an H100 (0.644 -> 0.591 ms at
	// 32,768 tokens). Both stages; other kernel sets ignore it.
	SplitDvLocal bool
	// TapeFormer (opt-in; needs blobs built with
	// ptx/staging/tape_dvl_former.patch) has the v5 core stage's vh 64 tape
	// walk form dV'_local itself (gdn_tape_walk_planes_hf): its copying
	// warpgroup forms each chunk's dvl a chunk ahead of the state chain from
	// the q, k and dO rows it copies anyway, so no dV'_local kernel runs and
	// the walk reads no dvl from memory; the offset walk at vh 64 does the
	// same (gdn_offset_walk_planes_hf). Where a walk that reads dvl runs
	// beside them (a tape or offset walk at vh 128, alone or in a launch
	// split between the widths), gdn_dvlocal_form gives it the same bits in
	// memory, for the (chunk, value head) pairs it reads. Other
	// bits than the default's (gdn_dvlocal_mma_gr's dvl; the same precision,
	// within 2.6e-6 of fp32 on the emulator), the same at both widths and in
	// B1, B3 and replay. Both stages: the split-product walks (the module
	// stage's, SplitTape's, SplitGrads') have the same former
	// (gdn_tape_walk_planes_f, gdn_offset_walk_planes_f). Measured: not yet
	// (docs/perf-notes.md, "dV'_local beside the tape walk"). It needs the v5
	// set's plane walks and raw-row dV'_local: NewGPU refuses it with
	// SplitDvLocal or another kernel set.
	TapeFormer bool
	// FP32QKGrads runs the v5 backward's chunk gradients on the forward's
	// fp32 normalised q and k (gdn_chunk_grads_mma8, mma6), which a forward
	// kept for a backward then writes. Unset, they read q's and k's raw
	// bf16 rows and their l2norm factors (gdn_chunk_grads_mma8r, mma6r:
	// they stage fp32(x rstd), the values gdn_l2norm_fwd writes, so the
	// same bits), and with the default dV'_local (not SplitDvLocal) the
	// kept forward writes no fp32 qn or kn: 2 T HQK 512 bytes less device
	// memory (0.54 GB at 32,768 tokens and 16 QK heads, 2.0 GB at
	// 120,908). On an H100 (docs/perf-notes.md, "v5.37") core + bwd took
	// 9.325 ms at 32,768 tokens by default against 9.318 with this set,
	// 35.514 against 35.635 at 120,908 (the raw rows' chunk gradients
	// 0.5-1.7% slower, the kept forward's prep and output faster by as
	// much), and peak device memory 6.79 against 7.29 GiB, 25.08 against
	// 26.92. The same gradient bits either way. Other kernel sets ignore
	// it.
	FP32QKGrads bool
	// LaunchOrder runs the v5 walks' CTAs in launch order (the column tile
	// fastest, then the segment, then the head) instead of the dispatch
	// order kcp computes for them (sched.DispatchOrder: the order that
	// finishes the walk earliest when the GPU hands CTAs out by block index to
	// the first free SM). Both give the same bits; it exists to measure the
	// difference. A walk split by SplitHeads keeps its split's order.
	LaunchOrder bool
	// SingleWidth runs every walk at the width rule's one width. Unset, the
	// v5 plane walks split between the two widths where the width rule's
	// cost model puts a split at least sched.MixedMarginPercent below the
	// better single width (sched.MixedWalk with sched.CostRule.SplitFor's
	// costs: the offset and tape walks, and the state walk of the core
	// stage): some (segment, value head) walks at vh = 128, the rest at vh =
	// 64, as two launches side by side, the vh = 128 one first. Both widths
	// write the same bits, so neither the outputs nor the gradients change;
	// GPUForward.Split and GPUGrads.Split say where a walk split. It fills
	// the SMs where one width packs a walk badly: on an H100 at issue 6's
	// 120,908 tokens in 3 documents the state walk took 4.47 ms split against
	// 5.46 at vh = 64, the tape walk 4.82 against 5.52 (docs/perf-notes.md,
	// "Walks split between the widths, measured"); one document of 32K
	// tokens never splits (its vh = 64 walks fit the SMs). ForceVH and
	// LaunchOrder also keep every walk at one width, and so do kernel sets
	// whose walks cannot split (SplitHeads). A split walk's dispatch orders
	// (4 T (2 S HV - W) bytes: S segments, W walks at vh = 128, T column
	// sets) go in the table every walk reserves at its vh = 64 size, so the
	// peak device memory is the same split or not.
	SingleWidth bool
	// SplitHeads[k], where not 0, runs walk k of every rank split between
	// the widths with that many value heads of every chain at vh = 128 and
	// the rest at vh = 64, whatever the width rule or SingleWidth say: for
	// measuring splits. Only the v5 plane walks split (another kernel set
	// is an error from NewGPU and ForPlan); 0 < SplitHeads[k] < HV, and not
	// with ForceVH. The bits are those of either width.
	SplitHeads [sched.NumWalkKinds]int
	// SplitPriority launches a split walk's two halves on two side streams
	// that wait for the same event, the vh = 128 half's at the context's
	// greatest stream priority, so that where both pend the GPU hands out
	// the vh = 128 CTAs first; unset, the vh = 128 half runs on the rank's
	// stream and the vh = 64 half on a side stream. Which of the two keeps
	// the model's order on the GPU is for the measurement to say.
	SplitPriority bool
	// SerialRanks runs the ranks that share a device one rank at a time: a
	// rank holds its device's turn from its start to its end (its
	// allocations, uploads, kernels, downloads and frees) and gives it back,
	// its stream synchronized, only while it waits for the others in a
	// collective. So every stage but the exchanges times one rank's work
	// alone on the device, as it would run with a device of their own,
	// where unset the ranks' streams run side by side, each stage's time
	// holds the others' work too, and one rank's host calls (a download of
	// hundreds of MB) can stall another's launches inside a stage. The
	// exchange stages then include the waits for the turn, and the totals
	// are longer; the bits do not change. For measuring a CP plan's walks
	// on one GPU (kcp run --serial-ranks); ranks on devices of their own are
	// not affected.
	SerialRanks bool

	// Devices are the CUDA devices the ranks run on: rank r of an R-rank
	// plan runs on Devices[r*len(Devices)/R], in contiguous blocks (R = 4 on
	// two devices puts ranks 0 and 1 on the first, 2 and 3 on the second;
	// with fewer ranks than devices some stay idle). Empty means
	// []int{Device}. Every device gets its own loaded blob, chosen by the
	// same rules (Blob, GDNKCP_BLOB, the automatic choice); devices of
	// different architectures are an error, and so are a device listed
	// twice and an ordinal the driver does not show. The width profile is
	// the first device's.
	Devices []int
	// Comm says how the ranks exchange: CommAuto (the default, also "")
	// takes NCCL when the plan has more than one rank and they run on as
	// many distinct devices as there are ranks, else the loopback;
	// CommLoopback exchanges through host memory, across devices too
	// (several ranks per GPU); CommNCCL through an NCCL communicator over
	// the ranks' devices, and is an error when two ranks share a device.
	// The NCCL communicator is made on the first run that needs it and kept
	// for every later run of this backend and of the backends ForPlan
	// derives from it with the same rank devices (their runs on it are
	// serialized); it is closed with the last of them. A failed run (a rank
	// error, a timeout, a cancelled context) aborts and closes it, and the
	// backends then report ErrReopen. Both kinds carry the same bytes
	// through the same code, so the results are bitwise identical.
	Comm CommKind
	// Communicator, when set, makes the backend run one rank of the plan:
	// rank Communicator.Rank(), on Device, exchanging through the
	// communicator (one process per rank, as under torchrun or `kcp
	// launch`). Its Size must equal the plan's rank count, Comm must be
	// left empty and Devices hold at most Device. The caller owns it: the
	// backend never closes it, but aborts it when the rank fails (also in a
	// recompute, so that the peers stop waiting). Forward, Backward,
	// ForwardCheckpoint and Recompute then fill only that rank's tokens of
	// the output and the gradients (the others stay zero) and that rank's
	// entries of the per-rank slices (the results' Ranks list it); the conv
	// weight gradient, summed over all ranks by the exchange, is complete.
	// Runs of one backend are serialized.
	Communicator comm.Communicator
	// HostExchange sends the state summaries (forward) and adjoint offsets
	// (backward) through host memory even where the communicator can
	// all-gather device memory: device -> host -> all-gather -> host ->
	// device, as the loopback always does. By default an NCCL communicator
	// (CommNCCL, or a Communicator that is a *comm.NCCLComm) all-gathers
	// the device buffers on the rank's stream. Both carry the same bits;
	// this is for comparing the two.
	HostExchange bool
	// Timeout bounds every exchange wait of a run (through the collective's
	// context, for the loopback, NCCL and a given Communicator alike); a
	// rank that waits longer fails with an error wrapping comm.ErrTimeout
	// and aborts the run. 0 keeps comm's defaults: no bound on the
	// loopback, comm.DefaultNCCLTimeout on NCCL.
	Timeout time.Duration
	// StageHook, when set, is called on each local rank's goroutine before
	// each of its stages (the names of GPUForwardStages,
	// GPURecomputeStages, GPUBackwardStages; a rank holding no tokens passes
	// through them all too); an error it returns fails the rank at that
	// stage and aborts the run like any rank error. For fault tests (a CLI
	// making its process exit at a stage); it must be safe for concurrent
	// use.
	StageHook func(rank int, stage string) error

	// fault is the tests' stage hook, called after StageHook.
	fault func(rank int, stage string) error
}

// gpuDevice is a loaded blob on one device, shared by the GPU values made
// from one NewGPU through ForPlan and released when the last is closed.
type gpuDevice struct {
	mu      sync.Mutex
	refs    int
	profile *archdetect.Profile
	ks      kernelSet
	ctx     *loader.Context
	kernels *archdetect.Kernels
	fn      map[string]*loader.Function
	stage   *stagerPool // pinned upload chunks, lent to runs (gpu_staging.go)
}

// openGPUDevice detects device, loads the blob and resolves every entry the
// forward and the backward launch (kernelSet.allEntries) with its
// shared-memory limit. On error everything it made is released.
func openGPUDevice(device int, blob string, ks kernelSet) (d *gpuDevice, err error) {
	prof, err := probeGPU(device, blob, ks.allEntries())
	if err != nil {
		return nil, err
	}
	ctx, err := loader.Primary(prof.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("kcp: gpu: device %d: %w", prof.Ordinal, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ctx.Close())
		}
	}()
	k, err := archdetect.Load(ctx, ptx.Default(), prof)
	if err != nil {
		return nil, fmt.Errorf("kcp: gpu: %w", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, k.Close())
		}
	}()
	d = &gpuDevice{refs: 1, profile: prof, ks: ks, ctx: ctx, kernels: k, fn: map[string]*loader.Function{},
		stage: &stagerPool{ctx: ctx}}
	for _, e := range ks.allEntries() {
		f, err := k.Function(e.name)
		if err != nil {
			return nil, fmt.Errorf("kcp: gpu: blob %s: entry %s: %w", prof.Target, e.name, err)
		}
		if e.smem > 0 {
			if prof.SharedOptin > 0 && e.smem > prof.SharedOptin {
				return nil, fmt.Errorf("kcp: gpu: %s needs %d bytes of shared memory per block, device %d (%s) allows %d",
					e.name, e.smem, prof.Ordinal, prof.Name, prof.SharedOptin)
			}
			if err := f.SetMaxDynamicSharedMemory(e.smem); err != nil {
				return nil, fmt.Errorf("kcp: gpu: %s: allow %d bytes of dynamic shared memory: %w", e.name, e.smem, err)
			}
		}
		d.fn[e.name] = f
	}
	return d, nil
}

// release drops a reference and unloads the blob and the context with the
// last one.
func (d *gpuDevice) release() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refs == 0 {
		return nil
	}
	if d.refs--; d.refs > 0 {
		return nil
	}
	return errors.Join(d.stage.close(), d.kernels.Close(), d.ctx.Close())
}

// GPU is the CUDA backend of one plan: every rank of the plan runs on its own
// goroutine and stream, on one GPU or spread over several
// (GPUOptions.Devices), exchanging through host memory over the in-process
// loopback communicator or through NCCL (GPUOptions.Comm); or the backend
// runs one rank of the plan over a caller's communicator
// (GPUOptions.Communicator, one process per rank) (DESIGN.md §3). It
// launches the embedded kernels of ptx/src (gdn_fwd.cu, conv1d.cu,
// gdn_bwd.cu) with the widths the plan's memo decides for the detected GPU:
// Forward (with GPUForward.Backward on what it keeps), and
// ForwardCheckpoint with GPUCheckpoint.Recompute.
//
// A GPU is safe for concurrent use: each Forward allocates its own buffers
// and streams (runs over an NCCL group or a given Communicator are
// serialized). Close releases it; a GPU made by ForPlan shares the loaded
// blobs and NCCL groups, which go when the last of them is closed.
type GPU struct {
	plan   *Plan
	opts   Options
	gopts  GPUOptions
	dev    *gpuDevice // the first device: the profile, the kernel set
	fleet  *gpuFleet
	layout rankLayout
	runMu  sync.Mutex // serializes runs over a given Communicator
	orders sync.Map   // the walks' dispatch orders ([]int32, nil for launch order) by fmt.Sprint(hv, tiles, chains)
	mixed  sync.Map   // the walks' model splits (*sched.Mixed, nil for none) by fmt.Sprint(kind, hv, profile, chains)

	mu     sync.Mutex
	closed bool
}

// NewGPU loads the GPU backend for plan: it checks the plan (head dims
// DK = DV = 128) and the options, detects the device (archdetect.Detect),
// settles the kernel set (GPUOptions.Kernels: where the options choose
// none, ChooseKernels' fastest set for the first device; GPU.Kernels
// reports it), loads the embedded blob (archdetect.Load), resolves every kernel of
// GPUForwardEntries (or the tensor-core variants the options select) and of
// GPUBackwardEntries (an error wrapping ErrMissingKernels names a missing
// one, as when the blobs predate the kernels) and allows each its dynamic
// shared memory, on every device of GPUOptions.Devices. It checks the
// devices and the communicator options against each other and against the
// plan before touching the driver (a device listed twice, CommNCCL with two
// ranks on one device, a Communicator of another size). Without a driver
// the error wraps loader.ErrNoDriver. Everything made is released on error.
func NewGPU(plan *Plan, opts GPUOptions) (*GPU, error) {
	if err := checkGPUPlan(plan); err != nil {
		return nil, err
	}
	if _, err := opts.Options.normalize(); err != nil {
		return nil, err
	}
	if err := opts.checkSplitHeads(plan.Config.HV); err != nil {
		return nil, err
	}
	devs, err := opts.deviceList()
	if err != nil {
		return nil, err
	}
	if _, err := resolveRanks(len(plan.Ranks), opts, devs); err != nil {
		return nil, err
	}
	if _, err := opts.kernelChoice(); err != nil {
		return nil, err
	}
	fleet, opts, err := openFleet(devs, opts)
	if err != nil {
		return nil, err
	}
	g, err := newGPU(plan, opts, fleet)
	if err != nil {
		return nil, errors.Join(err, fleet.release())
	}
	return g, nil
}

// openFleet checks that devs exist, settles opts' kernel choice on the
// first (resolveKernels), checks that they share one architecture, then
// loads the blob opts.Blob chooses on each (openGPUDevice). It returns opts
// with the kernel set's switches; on error everything made is released.
func openFleet(devs []int, opts GPUOptions) (*gpuFleet, GPUOptions, error) {
	n, err := loader.DeviceCount()
	if err != nil {
		return nil, opts, fmt.Errorf("kcp: gpu: %w", err)
	}
	if err := checkOrdinals(devs, n); err != nil {
		return nil, opts, err
	}
	opts, why, err := opts.resolveKernels(devs[0])
	if err != nil {
		return nil, opts, err
	}
	blob, ks := opts.Blob, opts.kernelSet()
	if opts.TapeFormer && ks.dvlocalForm == "" {
		return nil, opts, fmt.Errorf("kcp: gpu: TapeFormer needs the v5 kernel set's plane walks and dV'_local on the raw rows (kernels %s; SplitDvLocal leaves no room for it)", opts.switchesName())
	}
	if len(devs) > 1 {
		var first *archdetect.Profile
		for _, d := range devs {
			p, err := probeGPU(d, blob, ks.allEntries())
			if err != nil {
				return nil, opts, err
			}
			if first == nil {
				first = p
				continue
			}
			if p.Major != first.Major || p.Minor != first.Minor || p.Target != first.Target {
				return nil, opts, fmt.Errorf("kcp: gpu: devices %d (%s, CC %d.%d, blob %s) and %d (%s, CC %d.%d, blob %s) differ in architecture: the ranks of one plan run the same kernels on one architecture",
					first.Ordinal, first.Name, first.Major, first.Minor, first.Target, p.Ordinal, p.Name, p.Major, p.Minor, p.Target)
			}
		}
	}
	var opened []*gpuDevice
	for _, d := range devs {
		dev, err := openGPUDevice(d, blob, ks)
		if err != nil {
			for i := len(opened) - 1; i >= 0; i-- {
				err = errors.Join(err, opened[i].release())
			}
			return nil, opts, err
		}
		opened = append(opened, dev)
	}
	f := newFleet(opened)
	f.kernels, f.kernelsWhy = opts.switchesName(), why
	return f, opts, nil
}

// ForPlan returns a GPU backend for another plan and options on the same
// devices, blobs and kernels (no reload, no JIT). opts.Device, opts.Devices,
// opts.Blob and the kernel choice must be left zero or equal g's (Kernels
// may also be KernelsAuto: g's choice); Options,
// KeepDevice, HostExchange, LaunchOrder, SingleWidth, SplitHeads, SplitPriority and SerialRanks are opts'; Comm, Communicator, Timeout and StageHook are
// opts' when set, else g's. The ranks of the new plan are placed on the
// devices anew (a plan of another rank count spreads differently), and an
// NCCL group is shared with every backend of the family whose ranks run on
// the same devices. The returned GPU must be closed too; the blobs are
// unloaded when the last GPU sharing them is closed.
func (g *GPU) ForPlan(plan *Plan, opts GPUOptions) (*GPU, error) {
	if err := g.alive(); err != nil {
		return nil, err
	}
	if err := checkGPUPlan(plan); err != nil {
		return nil, err
	}
	if (opts.Device != 0 && opts.Device != g.gopts.Device) || (opts.Blob != "" && opts.Blob != g.gopts.Blob) ||
		(len(opts.Devices) > 0 && !slices.Equal(opts.Devices, g.fleet.order)) ||
		(opts.kernelFlags() != [13]bool{} && opts.kernelFlags() != g.gopts.kernelFlags()) ||
		(opts.Kernels != "" && opts.Kernels != KernelsAuto && opts.Kernels != g.fleet.kernels) {
		return nil, errors.New("kcp: gpu: ForPlan keeps the devices, blob and kernels; make a new backend with NewGPU to change them")
	}
	if _, err := opts.Options.normalize(); err != nil {
		return nil, err
	}
	gopts := g.gopts
	gopts.Options, gopts.KeepDevice, gopts.HostExchange = opts.Options, opts.KeepDevice, opts.HostExchange
	gopts.LaunchOrder, gopts.SingleWidth, gopts.SplitHeads, gopts.SplitPriority = opts.LaunchOrder, opts.SingleWidth, opts.SplitHeads,
		opts.SplitPriority
	gopts.SerialRanks = opts.SerialRanks
	if err := gopts.checkSplitHeads(plan.Config.HV); err != nil {
		return nil, err
	}
	if opts.Comm != "" {
		gopts.Comm = opts.Comm
	}
	if opts.Communicator != nil {
		gopts.Communicator = opts.Communicator
	}
	if opts.Timeout != 0 {
		gopts.Timeout = opts.Timeout
	}
	if opts.StageHook != nil {
		gopts.StageHook = opts.StageHook
	}
	if opts.fault != nil {
		gopts.fault = opts.fault
	}
	if _, err := resolveRanks(len(plan.Ranks), gopts, g.fleet.order); err != nil {
		return nil, err
	}
	if err := g.fleet.retain(); err != nil {
		return nil, err
	}
	ng, err := newGPU(plan, gopts, g.fleet)
	if err != nil {
		return nil, errors.Join(err, g.fleet.release())
	}
	return ng, nil
}

// maxRankSegments is the most segments a rank's walks take: they launch a
// grid row a segment, and a grid's y extent is at most 65,535.
const maxRankSegments = 65535

// checkGPUPlan reports a nil plan, head dims the kernels do not take, and a
// rank with more segments than a walk's grid has rows.
func checkGPUPlan(plan *Plan) error {
	if plan == nil {
		return errors.New("kcp: gpu: plan is nil")
	}
	for r, rp := range plan.Ranks {
		if n := len(rp.Segments); n > maxRankSegments {
			return fmt.Errorf("kcp: gpu: rank %d holds %d segments; the GPU walks launch a grid row a segment, at most %d a rank: "+
				"fewer documents a rank (more ranks, or longer documents)", r, n, maxRankSegments)
		}
	}
	if c := plan.Config; c.DK != gpuD || c.DV != gpuD {
		return fmt.Errorf("kcp: gpu: head dims DK = %d, DV = %d: the GPU kernels need DK = DV = %d (smaller dims run on the CPU backend)",
			c.DK, c.DV, gpuD)
	}
	if plan.Tokens > maxInt32 {
		return fmt.Errorf("kcp: gpu: %d tokens exceed the kernels' int32 range", plan.Tokens)
	}
	return nil
}

// newGPU fills in the options (the width profile of the first device when
// none is given), places the plan's ranks on the fleet's devices and binds
// plan to them. It takes over one reference of fleet only on success.
func newGPU(plan *Plan, gopts GPUOptions, fleet *gpuFleet) (*GPU, error) {
	layout, err := resolveRanks(len(plan.Ranks), gopts, fleet.order)
	if err != nil {
		return nil, err
	}
	dev := fleet.device(fleet.order[0])
	for k, n := range gopts.SplitHeads {
		if kind := sched.WalkKind(k); n > 0 && !splitSupported(dev.ks, kind) {
			return nil, fmt.Errorf("kcp: gpu: GPUOptions.SplitHeads[%s] = %d: these kernels' %s walk runs at one width only (the v5 plane walks split: SetKernels(\"v5\"))",
				kind, n, kind)
		}
	}
	o := gopts.Options
	if o.Profile == (sched.Profile{}) {
		prof, err := sched.NewProfile(dev.profile.Variant, dev.profile.SMs)
		if err != nil {
			return nil, fmt.Errorf("kcp: gpu: width profile of %s: %w", dev.profile.Name, err)
		}
		o.Profile = prof
	}
	o, err = o.normalize()
	if err != nil {
		return nil, err
	}
	// A v5 core stage keeps only bf16 H and V' (kernelSet.bf16States): its
	// forward walks store no fp32 states, where the sm_90a rule measured a
	// wide walk relatively cheaper (sched.CostRule.ForwardLean). Every forward,
	// recompute and backward of this GPU reads its widths through this one
	// profile, so they agree.
	o.Profile.LeanForward = dev.ks.bf16States(o.Stage)
	perDev := map[int]int{}
	for _, r := range layout.local {
		perDev[layout.devices[r]]++
	}
	for d, n := range perDev {
		if err := fleet.device(d).stage.reserve(n); err != nil {
			return nil, fmt.Errorf("kcp: gpu: device %d: pinned upload buffers for %d ranks: %w", d, n, err)
		}
	}
	return &GPU{plan: plan, opts: o, gopts: gopts, dev: dev, fleet: fleet, layout: layout}, nil
}

// Plan returns the backend's plan.
func (g *GPU) Plan() *Plan {
	if g == nil {
		return nil
	}
	return g.plan
}

// Options returns the backend's options with defaults filled in (the width
// profile is the detected GPU's unless one was given).
func (g *GPU) Options() Options {
	if g == nil {
		return Options{}
	}
	return g.opts
}

// Profile returns the detected device and the blob loaded on it: the first
// of Devices.
func (g *GPU) Profile() *archdetect.Profile {
	if g == nil || g.dev == nil {
		return nil
	}
	return g.dev.profile
}

// Kernels returns the kernel set g runs (one of KernelSets, or
// KernelsCustom for switches set by hand that are no named set) and why:
// ChooseKernels' reason where GPUOptions chose none (KernelsAuto), else
// "GPUOptions: " and the set. A GPU made by ForPlan runs its base's.
func (g *GPU) Kernels() (set, why string) {
	if g == nil || g.fleet == nil {
		return "", ""
	}
	return g.fleet.kernels, g.fleet.kernelsWhy
}

// Close releases the backend's reference to its devices; the blobs, the
// contexts and the NCCL groups go with the last reference (a GPUForward
// keeping device memory holds one until its Close). Close is idempotent.
func (g *GPU) Close() error {
	if g == nil || g.dev == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	if g.fleet == nil {
		return g.dev.release()
	}
	return g.fleet.release()
}

// alive reports a closed backend.
func (g *GPU) alive() error {
	if g == nil || g.dev == nil {
		return errors.New("kcp: gpu: nil backend")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return errors.New("kcp: gpu: the backend is closed")
	}
	return nil
}
