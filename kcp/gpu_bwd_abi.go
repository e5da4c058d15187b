package kcp

// The kernel entries of ptx/src/gdn_bwd.cu that the GPU backward launches
// (docs/gpu-backward.md is the contract; every entry runs 256-thread blocks).
// The reverse compose between the two walks is entryCompose, and the poison
// of the outputs entryPoison.
const (
	// entryDVLocal is gdn_dvlocal_bwd: dV'_local of every chunk and value
	// head through the in-chunk output term; grid (NC, HV), dvlocalSmem.
	entryDVLocal = "gdn_dvlocal_bwd"
	// entryOffset is gdn_offset_walk: the Pᵀ and R tiles of the segments of
	// the offset list, chunks in reverse; grid (2*128/vh, nlist, HV),
	// bwdWalkSmem(vh).
	entryOffset = "gdn_offset_walk"
	// entryTape is gdn_tape_walk: every segment from its terminal adjoint,
	// writing D at each chunk's end, dV' and the start adjoint; grid
	// (128/vh, NS, HV), bwdWalkSmem(vh).
	entryTape = "gdn_tape_walk"
	// entryChunkGrads is gdn_chunk_grads: the chunk-parallel gradients dq,
	// dk (per value head, w.r.t. the normalised q, k), dv, dg and dbeta;
	// grid (NC, HV), chunkGradSmem.
	entryChunkGrads = "gdn_chunk_grads"
	// entryQKBwd is gdn_qk_bwd: the sum of dq, dk over each QK head's value
	// heads and the l2norm backward, one warp a row; grid
	// ceil(T*HQK*2 / 8), no shared memory.
	entryQKBwd = "gdn_qk_bwd"
	// entryConvBwd is gdn_conv1d_silu_bwd: the conv1d + SiLU backward, one
	// thread per (chunk, channel), writing dx, the halo gradients and each
	// chunk's part of dw; grid (NC, ceil(C/256)), no shared memory.
	entryConvBwd = "gdn_conv1d_silu_bwd"
	// entryDWReduce is gdn_dw_reduce: the sum of the chunks' dw parts in
	// chunk order; grid ceil(n/256), no shared memory.
	entryDWReduce = "gdn_dw_reduce"
	// entryAddRows is gdn_add_rows: adds received halo-gradient rows into dx
	// rows in a fixed order; grid (ndst, ceil(C/256)), no shared memory.
	entryAddRows = "gdn_add_rows"
	// entryF32ToBF16 is gdn_f32_to_bf16: fp32 to bf16, round to nearest
	// even; any grid (grid-stride), no shared memory.
	entryF32ToBF16 = "gdn_f32_to_bf16"
)

// dvlocalSmem is the dynamic shared memory of gdn_dvlocal_bwd in bytes
// (kDvlSmem in gdn_bwd.cu): the chunk's q (later dO) and k rows padded to
// 129 floats, the 64 x 64 in-chunk attention and gamma: 82688.
const dvlocalSmem = 4 * (2*ChunkSize*(gpuD+1) + ChunkSize*ChunkSize + ChunkSize)

// chunkGradSmem is the dynamic shared memory of gdn_chunk_grads in bytes
// (kGradSmem in gdn_bwd.cu): four [64][129] tiles (k and three staged
// operands), A [64][64], two [64][65] tiles (with the third operand tile
// they also hold the whole state H) and 18 per-row arrays: 186368.
const chunkGradSmem = 4 * (4*ChunkSize*(gpuD+1) + ChunkSize*ChunkSize + 2*ChunkSize*(ChunkSize+1) + 18*ChunkSize)

// bwdWalkSmem is the dynamic shared memory in bytes of an offset or tape
// walk CTA at width vh (bwd_walk_smem in gdn_bwd.cu): the adjoint columns
// D [128][vh], dV' and dO [64][vh], one [64][128] slot for Kt, W and the
// scaled q in turn, and two arrays of 64: 98816 at vh 64 (two CTAs fit an
// SM), 164352 at vh 128.
func bwdWalkSmem(vh int) int {
	return 4 * (gpuD*vh + 2*ChunkSize*vh + ChunkSize*gpuD + 2*ChunkSize)
}
