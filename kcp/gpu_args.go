package kcp

import "github.com/gdnkcp/gdnkcp/loader"

// The argument lists of the kernels the GPU forward launches, in the order
// of their extern "C" signatures (ptx/src/gdn_fwd.cu, conv1d.cu, util.cu).
// Pointers are device addresses; int parameters are int32; loader.Launch
// checks every list against the blob manifest's layout.

// argsConv: gdn_conv1d_silu_fwd(x, w, halo, seg_start, seg_len, tok_seg, y, T, C, nseg).
func argsConv(x, w, halo, segStart, segLen, tokSeg, y uintptr, T, C, nseg int) *loader.Args {
	return loader.NewArgs().DevicePtr(x).DevicePtr(w).DevicePtr(halo).DevicePtr(segStart).DevicePtr(segLen).
		DevicePtr(tokSeg).DevicePtr(y).I32(int32(T)).I32(int32(C)).I32(int32(nseg))
}

// argsPoison: gdn_poison_u32(p, n, v).
func argsPoison(p uintptr, n uint64, v uint32) *loader.Args {
	return loader.NewArgs().DevicePtr(p).U64(n).U32(v)
}

// argsL2Norm: gdn_l2norm_fwd(q, k, q_stride, k_stride, qn, kn, q_rstd, k_rstd, T, HQK, l2norm).
func argsL2Norm(q, k uintptr, qStride, kStride int, qn, kn, qRstd, kRstd uintptr, T, HQK int, l2norm bool) *loader.Args {
	return loader.NewArgs().DevicePtr(q).DevicePtr(k).I32(int32(qStride)).I32(int32(kStride)).
		DevicePtr(qn).DevicePtr(kn).DevicePtr(qRstd).DevicePtr(kRstd).I32(int32(T)).I32(int32(HQK)).I32(b2i(l2norm))
}

// argsPrep: gdn_prep_fwd(kn, v, v_stride, g, beta, chunk_tok0, chunk_len, gcum, w, u, kt, HQK, HV).
func argsPrep(kn, v uintptr, vStride int, g, beta, chunkTok0, chunkLen, gcum, w, u, kt uintptr, HQK, HV int) *loader.Args {
	return loader.NewArgs().DevicePtr(kn).DevicePtr(v).I32(int32(vStride)).DevicePtr(g).DevicePtr(beta).
		DevicePtr(chunkTok0).DevicePtr(chunkLen).DevicePtr(gcum).DevicePtr(w).DevicePtr(u).DevicePtr(kt).
		I32(int32(HQK)).I32(int32(HV))
}

// argsPrepMMA: gdn_prep_mma and gdn_prep_mma_g: argsPrep's with the walk
// planes wp (-W) and wk (K^T) after kt (0: not written; w and kt may be 0
// too).
func argsPrepMMA(kn, v uintptr, vStride int, g, beta, chunkTok0, chunkLen, gcum, w, u, kt, wp, wk uintptr, HQK, HV int) *loader.Args {
	return loader.NewArgs().DevicePtr(kn).DevicePtr(v).I32(int32(vStride)).DevicePtr(g).DevicePtr(beta).
		DevicePtr(chunkTok0).DevicePtr(chunkLen).DevicePtr(gcum).DevicePtr(w).DevicePtr(u).DevicePtr(kt).
		DevicePtr(wp).DevicePtr(wk).I32(int32(HQK)).I32(int32(HV))
}

// argsPrepGNBase: the arguments gdn_prep_mma_gn and gdn_prep_mma_gnk
// begin with: (k, k_stride, l2norm, v, v_stride, g, beta, chunk_tok0,
// chunk_len, gcum, w, u, wp, wk, HQK, HV).
func argsPrepGNBase(k uintptr, kStride int, l2norm bool, v uintptr, vStride int, g, beta, chunkTok0, chunkLen, gcum, w, u,
	wp, wk uintptr, HQK, HV int) *loader.Args {
	return loader.NewArgs().DevicePtr(k).I32(int32(kStride)).I32(b2i(l2norm)).DevicePtr(v).I32(int32(vStride)).
		DevicePtr(g).DevicePtr(beta).DevicePtr(chunkTok0).DevicePtr(chunkLen).DevicePtr(gcum).DevicePtr(w).
		DevicePtr(u).DevicePtr(wp).DevicePtr(wk).I32(int32(HQK)).I32(int32(HV))
}

// argsPrepMMAGN: gdn_prep_mma_gn(argsPrepGNBase's arguments, k_rstd):
// gdn_prep_mma_g with kt null, normalising the bf16 k rows itself (the
// forward alone) and writing their rstd, which the plane walks read.
func argsPrepMMAGN(k uintptr, kStride int, l2norm bool, v uintptr, vStride int, g, beta, chunkTok0, chunkLen, gcum, w, u,
	wp, wk uintptr, HQK, HV int, kRstd uintptr) *loader.Args {
	return argsPrepGNBase(k, kStride, l2norm, v, vStride, g, beta, chunkTok0, chunkLen, gcum, w, u, wp, wk, HQK, HV).
		DevicePtr(kRstd)
}

// argsPrepMMAGNK: gdn_prep_mma_gnk(argsPrepGNBase's arguments, kt, kn_out,
// k_rstd): the forward kept for a backward, which also writes Kt and the
// normalised k rows and their rstd where gdn_l2norm_fwd writes kn and
// k_rstd.
func argsPrepMMAGNK(k uintptr, kStride int, l2norm bool, v uintptr, vStride int, g, beta, chunkTok0, chunkLen, gcum, w,
	u, wp, wk uintptr, HQK, HV int, kt, knOut, kRstd uintptr) *loader.Args {
	return argsPrepGNBase(k, kStride, l2norm, v, vStride, g, beta, chunkTok0, chunkLen, gcum, w, u, wp, wk, HQK, HV).
		DevicePtr(kt).DevicePtr(knOut).DevicePtr(kRstd)
}

// argsOutputGN: gdn_output_mma16gn(q, wk, q_stride, l2norm, gcum, vnew16,
// h16, chunk_tok0, chunk_len, o, HQK, HV, scale): gdn_output_mma16g on the
// raw bf16 q rows, normalised in the kernel, and K from the prep's K^T walk
// planes (wk).
func argsOutputGN(q, wk uintptr, qStride int, l2norm bool, gcum, vnew16, h16, chunkTok0, chunkLen, o uintptr,
	HQK, HV int, scale float32) *loader.Args {
	return loader.NewArgs().DevicePtr(q).DevicePtr(wk).I32(int32(qStride)).I32(b2i(l2norm)).
		DevicePtr(gcum).DevicePtr(vnew16).DevicePtr(h16).DevicePtr(chunkTok0).DevicePtr(chunkLen).DevicePtr(o).
		I32(int32(HQK)).I32(int32(HV)).F32(scale)
}

// argsOutputGNK: gdn_output_mma16gnk(gdn_output_mma16gn's arguments,
// qn_out, q_rstd): the forward kept for a backward, which also writes the
// normalised q rows and their rstd where gdn_l2norm_fwd writes qn and
// q_rstd.
func argsOutputGNK(q, wk uintptr, qStride int, l2norm bool, gcum, vnew16, h16, chunkTok0, chunkLen, o uintptr,
	HQK, HV int, scale float32, qnOut, qRstd uintptr) *loader.Args {
	return argsOutputGN(q, wk, qStride, l2norm, gcum, vnew16, h16, chunkTok0, chunkLen, o, HQK, HV, scale).
		DevicePtr(qnOut).DevicePtr(qRstd)
}

// argsSummaryPlanes: gdn_summary_walk_planes(wp, k, k_stride, k_rstd, u,
// gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q,
// HQK, HV, vh, order): -W's walk planes, k's bf16 rows (row stride in
// elements) and their rstd; order: the CTAs' dispatch order (walkOrder; 0:
// launch order).
func argsSummaryPlanes(wp, k uintptr, kStride int, kRstd, u, gcum, chunkTok0, chunkLen, segChunk0, segNChunk, list, outP,
	outQ uintptr, HQK, HV, vh int, order uintptr) *loader.Args {
	return loader.NewArgs().DevicePtr(wp).DevicePtr(k).I32(int32(kStride)).DevicePtr(kRstd).DevicePtr(u).DevicePtr(gcum).
		DevicePtr(chunkTok0).
		DevicePtr(chunkLen).DevicePtr(segChunk0).DevicePtr(segNChunk).DevicePtr(list).DevicePtr(outP).DevicePtr(outQ).
		I32(int32(HQK)).I32(int32(HV)).I32(int32(vh)).DevicePtr(order)
}

// argsStatePlanes: gdn_state_walk_planes(wp, k, k_stride, k_rstd, u, gcum,
// chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start, h_out, vnew,
// final_state, h16, vnew16, HQK, HV, vh, vnewp, order): argsSummaryPlanes'
// inputs, argsState16's outputs and V' as token slots at vnewp (any of
// h_out, vnew, h16, vnew16, vnewp may be 0); order: the CTAs' dispatch order
// (walkOrder; 0: launch order).
func argsStatePlanes(wp, k uintptr, kStride int, kRstd, u, gcum, chunkTok0, chunkLen, segChunk0, segNChunk, start, hOut, vnew,
	final, h16, vnew16 uintptr, HQK, HV, vh int, vnewp, order uintptr) *loader.Args {
	return loader.NewArgs().DevicePtr(wp).DevicePtr(k).I32(int32(kStride)).DevicePtr(kRstd).DevicePtr(u).DevicePtr(gcum).
		DevicePtr(chunkTok0).
		DevicePtr(chunkLen).DevicePtr(segChunk0).DevicePtr(segNChunk).DevicePtr(start).DevicePtr(hOut).DevicePtr(vnew).
		DevicePtr(final).DevicePtr(h16).DevicePtr(vnew16).I32(int32(HQK)).I32(int32(HV)).I32(int32(vh)).DevicePtr(vnewp).DevicePtr(order)
}

// argsSummary: gdn_summary_walk(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, list,
// out_p, out_q, HV, vh).
func argsSummary(w, u, kt, gcum, chunkTok0, chunkLen, segChunk0, segNChunk, list, outP, outQ uintptr, HV, vh int) *loader.Args {
	return loader.NewArgs().DevicePtr(w).DevicePtr(u).DevicePtr(kt).DevicePtr(gcum).DevicePtr(chunkTok0).
		DevicePtr(chunkLen).DevicePtr(segChunk0).DevicePtr(segNChunk).DevicePtr(list).DevicePtr(outP).DevicePtr(outQ).
		I32(int32(HV)).I32(int32(vh))
}

// argsCompose: gdn_compose_fwd(all_p, all_q, comp_off, comp_idx, start, HV).
func argsCompose(allP, allQ, compOff, compIdx, start uintptr, HV int) *loader.Args {
	return loader.NewArgs().DevicePtr(allP).DevicePtr(allQ).DevicePtr(compOff).DevicePtr(compIdx).DevicePtr(start).
		I32(int32(HV))
}

// argsState: gdn_state_walk(w, u, kt, gcum, chunk_tok0, chunk_len, seg_chunk0, seg_nchunk, start,
// h_out, vnew, final_state, HV, vh).
func argsState(w, u, kt, gcum, chunkTok0, chunkLen, segChunk0, segNChunk, start, hOut, vnew, final uintptr, HV, vh int) *loader.Args {
	return loader.NewArgs().DevicePtr(w).DevicePtr(u).DevicePtr(kt).DevicePtr(gcum).DevicePtr(chunkTok0).
		DevicePtr(chunkLen).DevicePtr(segChunk0).DevicePtr(segNChunk).DevicePtr(start).DevicePtr(hOut).
		DevicePtr(vnew).DevicePtr(final).I32(int32(HV)).I32(int32(vh))
}

// argsSummary16: gdn_summary_walk_mma16(w, u, kn, gcum, chunk_tok0,
// chunk_len, seg_chunk0, seg_nchunk, list, out_p, out_q, HQK, HV, vh, order);
// order: the CTAs' dispatch order (walkOrder; 0: launch order).
// argsSummary's with kn (Kt rebuilt from it) and HQK.
func argsSummary16(w, u, kn, gcum, chunkTok0, chunkLen, segChunk0, segNChunk, list, outP, outQ uintptr, HQK, HV, vh int) *loader.Args {
	return loader.NewArgs().DevicePtr(w).DevicePtr(u).DevicePtr(kn).DevicePtr(gcum).DevicePtr(chunkTok0).
		DevicePtr(chunkLen).DevicePtr(segChunk0).DevicePtr(segNChunk).DevicePtr(list).DevicePtr(outP).DevicePtr(outQ).
		I32(int32(HQK)).I32(int32(HV)).I32(int32(vh))
}

// argsState16: gdn_state_walk_mma16(w, u, kn, gcum, chunk_tok0, chunk_len,
// seg_chunk0, seg_nchunk, start, h_out, vnew, final_state, h16, vnew16, HQK,
// HV, vh): argsState's with kn (Kt rebuilt from it), the bf16 H^T and V'^T
// after final_state and HQK; any of h_out, vnew, h16, vnew16 may be 0 (not
// written).
func argsState16(w, u, kn, gcum, chunkTok0, chunkLen, segChunk0, segNChunk, start, hOut, vnew, final, h16, vnew16 uintptr,
	HQK, HV, vh int) *loader.Args {
	return loader.NewArgs().DevicePtr(w).DevicePtr(u).DevicePtr(kn).DevicePtr(gcum).DevicePtr(chunkTok0).
		DevicePtr(chunkLen).DevicePtr(segChunk0).DevicePtr(segNChunk).DevicePtr(start).DevicePtr(hOut).
		DevicePtr(vnew).DevicePtr(final).DevicePtr(h16).DevicePtr(vnew16).I32(int32(HQK)).I32(int32(HV)).I32(int32(vh))
}

// argsOutput: gdn_output_fwd(qn, kn, gcum, vnew, h_state, chunk_tok0, chunk_len, o, HQK, HV, scale).
func argsOutput(qn, kn, gcum, vnew, h, chunkTok0, chunkLen, o uintptr, HQK, HV int, scale float32) *loader.Args {
	return loader.NewArgs().DevicePtr(qn).DevicePtr(kn).DevicePtr(gcum).DevicePtr(vnew).DevicePtr(h).
		DevicePtr(chunkTok0).DevicePtr(chunkLen).DevicePtr(o).I32(int32(HQK)).I32(int32(HV)).F32(scale)
}

// gpuArgSamples returns every entry's argument list built with zero values,
// for checking the layouts against the sources and the manifest.
func gpuArgSamples() map[string]*loader.Args {
	return map[string]*loader.Args{
		entryConv:    argsConv(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryPoison:  argsPoison(0, 0, 0),
		entryL2Norm:  argsL2Norm(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, true),
		entryPrep:    argsPrep(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entrySummary: argsSummary(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryCompose: argsCompose(0, 0, 0, 0, 0, 0),
		entryState:   argsState(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOutput:  argsOutput(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),

		entryPrepTC:    argsPrep(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entrySummaryTC: argsSummary(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryStateTC:   argsState(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOutputTC:  argsOutput(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),

		entryPrepMMA:    argsPrepMMA(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryPrepMMAG:   argsPrepMMA(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entrySummaryMMA: argsSummary(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryStateMMA:   argsState(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOutputMMA:  argsOutput(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),

		entrySummaryMMA16:   argsSummary16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryStateMMA16:     argsState16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOutputMMA16:    argsOutput(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), // vnew16, h16 in vnew's, h's places
		entryOutputMMA16G:   argsOutput(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), // gdn_output_mma16's
		entryPrepMMAGN:      argsPrepMMAGN(0, 0, true, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOutputMMA16GN:  argsOutputGN(0, 0, 0, true, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryPrepMMAGNK:     argsPrepMMAGNK(0, 0, true, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryOutputMMA16GNK: argsOutputGNK(0, 0, 0, true, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),

		entrySummaryPlanes: argsSummaryPlanes(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
		entryStatePlanes:   argsStatePlanes(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
	}
}

// b2i is a kernel's int flag.
func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
