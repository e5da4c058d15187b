package kcp

import "github.com/gdnkcp/gdnkcp/loader"

// The argument lists of the kernels the GPU backward launches, in the order
// of their extern "C" signatures in ptx/src/gdn_bwd.cu (docs/gpu-backward.md
// is the contract). Pointers are device addresses; int parameters are int32;
// loader.Launch checks every list against the blob manifest's layout. The
// reverse compose is gdn_compose_fwd (argsCompose) on the offsets, and the
// poison is gdn_poison_u32 (argsPoison).

// argsDVLocal: gdn_dvlocal_bwd(qn, kn, gcum, dout, chunk_tok0, chunk_len, dvl, HQK, HV, scale).
func argsDVLocal(qn, kn, gcum, dout, chunkTok0, chunkLen, dvl uintptr, HQK, HV int, scale float32) *loader.Args {
	return loader.NewArgs().DevicePtr(qn).DevicePtr(kn).DevicePtr(gcum).DevicePtr(dout).DevicePtr(chunkTok0).
		DevicePtr(chunkLen).DevicePtr(dvl).I32(int32(HQK)).I32(int32(HV)).F32(scale)
}

// argsDVLocalRaw: gdn_dvlocal_mma_gr(q, q_stride, q_rstd, k, k_stride,
// k_rstd, gcum, dout, chunk_tok0, chunk_len, dvl, HQK, HV, scale).
func argsDVLocalRaw(q uintptr, qStride int, qRstd, k uintptr, kStride int, kRstd, gcum, dout, chunkTok0, chunkLen, dvl uintptr,
	HQK, HV int, scale float32) *loader.Args {
	return loader.NewArgs().DevicePtr(q).I32(int32(qStride)).DevicePtr(qRstd).DevicePtr(k).I32(int32(kStride)).
		DevicePtr(kRstd).DevicePtr(gcum).DevicePtr(dout).DevicePtr(chunkTok0).DevicePtr(chunkLen).DevicePtr(dvl).
		I32(int32(HQK)).I32(int32(HV)).F32(scale)
}

// argsDVLocalForm is gdn_dvlocal_form's argument list: argsDVLocalRaw's and
// items, the (chunk, value head) pairs to form (0 for all of them).
func argsDVLocalForm(q uintptr, qStride int, qRstd, k uintptr, kStride int, kRstd, gcum, dout, chunkTok0, chunkLen, dvl uintptr,
	HQK, HV int, scale float32, items uintptr) *loader.Args {
	return argsDVLocalRaw(q, qStride, qRstd, k, kStride, kRstd, gcum, dout, chunkTok0, chunkLen, dvl, HQK, HV, scale).DevicePtr(items)
}

// bwdWalkArgs are the tensors and tables the offset and tape walks share.
type bwdWalkArgs struct {
	w, kt, qn, gcum, dvl, dout                uintptr
	chunkTok0, chunkLen, segChunk0, segNChunk uintptr
	HQK, HV, vh                               int
	scale                                     float32
}

// head appends the shared leading arguments: w, kt, qn, gcum, dvl, dout,
// chunk_tok0, chunk_len, seg_chunk0, seg_nchunk.
func (a bwdWalkArgs) head() *loader.Args {
	return loader.NewArgs().DevicePtr(a.w).DevicePtr(a.kt).DevicePtr(a.qn).DevicePtr(a.gcum).DevicePtr(a.dvl).
		DevicePtr(a.dout).DevicePtr(a.chunkTok0).DevicePtr(a.chunkLen).DevicePtr(a.segChunk0).DevicePtr(a.segNChunk)
}

// tail appends the shared trailing arguments: HQK, HV, vh, scale.
func (a bwdWalkArgs) tail(l *loader.Args) *loader.Args {
	return l.I32(int32(a.HQK)).I32(int32(a.HV)).I32(int32(a.vh)).F32(a.scale)
}

// argsOffset: gdn_offset_walk(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0,
// seg_nchunk, list, out_pt, out_r, HQK, HV, vh, scale).
func argsOffset(a bwdWalkArgs, list, outPT, outR uintptr) *loader.Args {
	return a.tail(a.head().DevicePtr(list).DevicePtr(outPT).DevicePtr(outR))
}

// argsOffsetMMA: gdn_offset_walk_mma(argsOffset's arguments, order): order,
// the CTAs' dispatch order (walkOrder; 0: launch order).
func argsOffsetMMA(a bwdWalkArgs, list, outPT, outR, order uintptr) *loader.Args {
	return argsOffset(a, list, outPT, outR).DevicePtr(order)
}

// argsTape: gdn_tape_walk(w, kt, qn, gcum, dvl, dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk,
// dend, d_chunk, dvnew, dstart, HQK, HV, vh, scale).
func argsTape(a bwdWalkArgs, dend, dChunk, dvnew, dstart uintptr) *loader.Args {
	return a.tail(a.head().DevicePtr(dend).DevicePtr(dChunk).DevicePtr(dvnew).DevicePtr(dstart))
}

// argsTapeMMA: gdn_tape_walk_mma(argsTape's arguments, dvnewp, dvnew16, d16,
// order): dV' also (or only, with dvnew 0) as token slots at dvnewp and as
// bf16 dV'^T blocks (the state walk's vnew16 layout) at dvnew16 (0: none);
// each chunk's D also (or only, with dChunk 0) as bf16 D^T (the state walk's
// h16 layout) at d16 (0: none); order: the CTAs' dispatch order (walkOrder;
// 0: launch order).
func argsTapeMMA(a bwdWalkArgs, dend, dChunk, dvnew, dstart, dvnewp, dvnew16, d16, order uintptr) *loader.Args {
	return argsTape(a, dend, dChunk, dvnew, dstart).DevicePtr(dvnewp).DevicePtr(dvnew16).DevicePtr(d16).DevicePtr(order)
}

// bwdPlaneArgs are the arguments of the offset and tape walks on the walk
// planes: the fp32 walks' tables, gcum, dvl and dout, with the -W planes
// (wp), k's and q's bf16 rows (kStride, qStride elements a token) and
// k_rstd, q_rstd in place of w, kt and qn (which are not passed).
type bwdPlaneArgs struct {
	bwdWalkArgs
	wp, k, kRstd, q  uintptr
	kStride, qStride int
	qRstd            uintptr
}

// head appends the shared leading arguments: wp, k, k_stride, k_rstd, q, q_stride, q_rstd, gcum, dvl,
// dout, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk.
func (a bwdPlaneArgs) head() *loader.Args {
	return loader.NewArgs().DevicePtr(a.wp).DevicePtr(a.k).I32(int32(a.kStride)).DevicePtr(a.kRstd).
		DevicePtr(a.q).I32(int32(a.qStride)).DevicePtr(a.qRstd).
		DevicePtr(a.gcum).DevicePtr(a.dvl).DevicePtr(a.dout).DevicePtr(a.chunkTok0).DevicePtr(a.chunkLen).
		DevicePtr(a.segChunk0).DevicePtr(a.segNChunk)
}

// argsTapePlanes: gdn_tape_walk_planes(wp, k, k_stride, k_rstd, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0,
// chunk_len, seg_chunk0, seg_nchunk, dend, d_chunk, dvnew, dstart, HQK, HV, vh, scale, dvnewp, dvnew16,
// d16, order): argsTapeMMA's outputs and order.
func argsTapePlanes(a bwdPlaneArgs, dend, dChunk, dvnew, dstart, dvnewp, dvnew16, d16, order uintptr) *loader.Args {
	l := a.head().DevicePtr(dend).DevicePtr(dChunk).DevicePtr(dvnew).DevicePtr(dstart)
	return a.tail(l).DevicePtr(dvnewp).DevicePtr(dvnew16).DevicePtr(d16).DevicePtr(order)
}

// argsOffsetPlanes: gdn_offset_walk_planes(wp, k, k_stride, k_rstd, q, q_stride, q_rstd, gcum, dvl, dout, chunk_tok0,
// chunk_len, seg_chunk0, seg_nchunk, list, out_pt, out_r, HQK, HV, vh, scale, order): argsOffsetMMA's
// list, outputs and order.
func argsOffsetPlanes(a bwdPlaneArgs, list, outPT, outR, order uintptr) *loader.Args {
	return a.tail(a.head().DevicePtr(list).DevicePtr(outPT).DevicePtr(outR)).DevicePtr(order)
}

// chunkGradArgs are the arguments of gdn_chunk_grads.
type chunkGradArgs struct {
	qn, kn, v                           uintptr
	vStride                             int
	gcum, beta, h, vnew, dChunk, dvnew  uintptr
	dout, chunkTok0, chunkLen, dqv, dkv uintptr
	dv                                  uintptr
	dvStride                            int
	dg, dbeta                           uintptr
	HQK, HV                             int
	scale                               float32
}

// argsChunkGrads: gdn_chunk_grads(qn, kn, v, v_stride, gcum, beta, h, vnew, d_chunk, dvnew, dout,
// chunk_tok0, chunk_len, dqv, dkv, dv, dv_stride, dg, dbeta, HQK, HV, scale).
func argsChunkGrads(a chunkGradArgs) *loader.Args {
	return loader.NewArgs().DevicePtr(a.qn).DevicePtr(a.kn).DevicePtr(a.v).I32(int32(a.vStride)).
		DevicePtr(a.gcum).DevicePtr(a.beta).DevicePtr(a.h).DevicePtr(a.vnew).DevicePtr(a.dChunk).DevicePtr(a.dvnew).
		DevicePtr(a.dout).DevicePtr(a.chunkTok0).DevicePtr(a.chunkLen).DevicePtr(a.dqv).DevicePtr(a.dkv).
		DevicePtr(a.dv).I32(int32(a.dvStride)).DevicePtr(a.dg).DevicePtr(a.dbeta).
		I32(int32(a.HQK)).I32(int32(a.HV)).F32(a.scale)
}

// chunkGrad5Args are gdn_chunk_grads_mma5's arguments: chunkGradArgs'
// without dqv, dkv, with the l2norm backward's inputs (q_rstd, k_rstd) and
// outputs (dq, dk at dq_stride, where gdn_qk_bwd writes them), and the
// optional bf16 outputs dq16, dk16, dv16 (0: none; given, they replace dq,
// dk and dv, which may then be 0).
type chunkGrad5Args struct {
	chunkGradArgs
	qRstd, kRstd, dq, dk uintptr
	dqStride             int
	l2norm               bool
	dq16, dk16, dv16     uintptr
}

// argsChunkGrads5: gdn_chunk_grads_mma5(qn, kn, v, v_stride, gcum, beta, h, vnew, d_chunk, dvnew, dout,
// chunk_tok0, chunk_len, q_rstd, k_rstd, dq, dk, dq_stride, dv, dv_stride, dg, dbeta, HQK, HV, scale,
// l2norm, dq16, dk16, dv16).
func argsChunkGrads5(a chunkGrad5Args) *loader.Args {
	return a.afterQK(loader.NewArgs().DevicePtr(a.qn).DevicePtr(a.kn))
}

// afterQK appends the chunk gradients' arguments from v on (v, v_stride,
// ..., dv16: every mma5-family entry's, after its q and k arguments) to args.
func (a chunkGrad5Args) afterQK(args *loader.Args) *loader.Args {
	l2 := int32(0)
	if a.l2norm {
		l2 = 1
	}
	return args.DevicePtr(a.v).I32(int32(a.vStride)).
		DevicePtr(a.gcum).DevicePtr(a.beta).DevicePtr(a.h).DevicePtr(a.vnew).DevicePtr(a.dChunk).DevicePtr(a.dvnew).
		DevicePtr(a.dout).DevicePtr(a.chunkTok0).DevicePtr(a.chunkLen).DevicePtr(a.qRstd).DevicePtr(a.kRstd).
		DevicePtr(a.dq).DevicePtr(a.dk).I32(int32(a.dqStride)).
		DevicePtr(a.dv).I32(int32(a.dvStride)).DevicePtr(a.dg).DevicePtr(a.dbeta).
		I32(int32(a.HQK)).I32(int32(a.HV)).F32(a.scale).I32(l2).DevicePtr(a.dq16).DevicePtr(a.dk16).DevicePtr(a.dv16)
}

// argsChunkGrads5Raw: gdn_chunk_grads_mma8r / mma6r(q, k, qk_stride, v, ...):
// argsChunkGrads5's arguments with q's and k's raw bf16 rows (qk_stride
// elements a token) in place of qn, kn.
func argsChunkGrads5Raw(a chunkGrad5Args, q, k uintptr, qkStride int) *loader.Args {
	return a.afterQK(loader.NewArgs().DevicePtr(q).DevicePtr(k).I32(int32(qkStride)))
}

// argsQKBwd: gdn_qk_bwd(dqv, dkv, qn, kn, q_rstd, k_rstd, dq, dk, dq_stride, T, HQK, HV, l2norm).
func argsQKBwd(dqv, dkv, qn, kn, qRstd, kRstd, dq, dk uintptr, dqStride, T, HQK, HV int, l2norm bool) *loader.Args {
	l2 := int32(0)
	if l2norm {
		l2 = 1
	}
	return loader.NewArgs().DevicePtr(dqv).DevicePtr(dkv).DevicePtr(qn).DevicePtr(kn).DevicePtr(qRstd).
		DevicePtr(kRstd).DevicePtr(dq).DevicePtr(dk).I32(int32(dqStride)).I32(int32(T)).I32(int32(HQK)).
		I32(int32(HV)).I32(l2)
}

// argsConvBwd: gdn_conv1d_silu_bwd(x, conv_w, halo, seg_start, seg_len, tok_seg, chunk_tok0, chunk_len,
// dy, dx, dhalo, dw_part, T, C, NS, NC).
func argsConvBwd(x, w, halo, segStart, segLen, tokSeg, chunkTok0, chunkLen, dy, dx, dhalo, dwPart uintptr, T, C, NS, NC int) *loader.Args {
	return loader.NewArgs().DevicePtr(x).DevicePtr(w).DevicePtr(halo).DevicePtr(segStart).DevicePtr(segLen).
		DevicePtr(tokSeg).DevicePtr(chunkTok0).DevicePtr(chunkLen).DevicePtr(dy).DevicePtr(dx).DevicePtr(dhalo).
		DevicePtr(dwPart).I32(int32(T)).I32(int32(C)).I32(int32(NS)).I32(int32(NC))
}

// argsDWReduce: gdn_dw_reduce(dw_part, NC, n, dw).
func argsDWReduce(dwPart uintptr, NC, n int, dw uintptr) *loader.Args {
	return loader.NewArgs().DevicePtr(dwPart).I32(int32(NC)).I32(int32(n)).DevicePtr(dw)
}

// argsAddRows: gdn_add_rows(dst, dst_stride, src, src_stride, dst_row, off, src_row, ndst, C).
func argsAddRows(dst uintptr, dstStride int, src uintptr, srcStride int, dstRow, off, srcRow uintptr, ndst, C int) *loader.Args {
	return loader.NewArgs().DevicePtr(dst).I32(int32(dstStride)).DevicePtr(src).I32(int32(srcStride)).
		DevicePtr(dstRow).DevicePtr(off).DevicePtr(srcRow).I32(int32(ndst)).I32(int32(C))
}

// argsF32ToBF16: gdn_f32_to_bf16(src, dst, n), n unsigned long long.
func argsF32ToBF16(src, dst uintptr, n uint64) *loader.Args {
	return loader.NewArgs().DevicePtr(src).DevicePtr(dst).U64(n)
}

// gpuBwdArgSamples returns every backward entry's argument list built with
// zero values, for checking the layouts against the sources and the
// manifest.
func gpuBwdArgSamples() map[string]*loader.Args {
	return map[string]*loader.Args{
		entryDVLocal:        argsDVLocal(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOffset:         argsOffset(bwdWalkArgs{}, 0, 0, 0),
		entryTape:           argsTape(bwdWalkArgs{}, 0, 0, 0, 0),
		entryOffsetMMA:      argsOffsetMMA(bwdWalkArgs{}, 0, 0, 0, 0),
		entryTapeMMA:        argsTapeMMA(bwdWalkArgs{}, 0, 0, 0, 0, 0, 0, 0, 0),
		entryTapePlanes:     argsTapePlanes(bwdPlaneArgs{}, 0, 0, 0, 0, 0, 0, 0, 0),
		entryTapePlanes128:  argsTapePlanes(bwdPlaneArgs{}, 0, 0, 0, 0, 0, 0, 0, 0),
		entryTapePlanesH:    argsTapePlanes(bwdPlaneArgs{}, 0, 0, 0, 0, 0, 0, 0, 0),
		entryTapePlanesH128: argsTapePlanes(bwdPlaneArgs{}, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOffsetPlanesH:  argsOffsetPlanes(bwdPlaneArgs{}, 0, 0, 0, 0),
		entryOffsetPlanes:   argsOffsetPlanes(bwdPlaneArgs{}, 0, 0, 0, 0),
		entryChunkGrads:     argsChunkGrads(chunkGradArgs{}),
		entryDVLocalMMA:     argsDVLocal(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryDVLocalMMAG:    argsDVLocal(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryDVLocalMMAGK:   argsDVLocal(0, 0, 0, 0, 0, 0, 0, 0, 0, 0), // wk in kn's place
		entryDVLocalMMAGR:   argsDVLocalRaw(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryDVLocalForm:    argsDVLocalForm(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryTapePlanesHF:   argsTapePlanes(bwdPlaneArgs{}, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOffsetPlanesHF: argsOffsetPlanes(bwdPlaneArgs{}, 0, 0, 0, 0),
		entryTapePlanesF:    argsTapePlanes(bwdPlaneArgs{}, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOffsetPlanesF:  argsOffsetPlanes(bwdPlaneArgs{}, 0, 0, 0, 0),
		entryGradsMMA8R:     argsChunkGrads5Raw(chunkGrad5Args{}, 0, 0, 0),
		entryGradsMMA6R:     argsChunkGrads5Raw(chunkGrad5Args{}, 0, 0, 0),
		entryGradsMMA:       argsChunkGrads(chunkGradArgs{}),
		entryGradsMMA5:      argsChunkGrads5(chunkGrad5Args{}),
		entryGradsMMA6:      argsChunkGrads5(chunkGrad5Args{}), // vnew, dvnew: token slots
		entryGradsMMA7:      argsChunkGrads5(chunkGrad5Args{}), // mma6's arguments
		entryGradsMMA8:      argsChunkGrads5(chunkGrad5Args{}), // h16, vnew16, d16, dvnew16 in h's, vnew's, d_chunk's, dvnew's places
		entryQKBwd:          argsQKBwd(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, true),
		entryConvBwd:        argsConvBwd(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryDWReduce:       argsDWReduce(0, 0, 0, 0),
		entryAddRows:        argsAddRows(0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryF32ToBF16:      argsF32ToBF16(0, 0, 0),
	}
}
