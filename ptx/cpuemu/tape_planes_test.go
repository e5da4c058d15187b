package cpuemu

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/sched"
)

// The tape walk on the walk planes (ptx/src/gdn_tape_planes.cu,
// gdn_tape_walk_planes): gdn_tape_walk_mma's walk with the prep's -W and
// K^T planes read as they lie (B MN-major: wgmma's transposed B on sm_90a,
// ldmatrix.trans elsewhere) and q's bf16 rows with their rstd in place of
// fp32 W, Kt and qn.

// tapePlaneOuts are the tape walks' outputs, fp32 and bf16.
var tapePlaneOuts = []string{"d_chunk", "dvnew", "dstart", "dvnewp", "dvnew16", "d16", "out_pt", "out_r"}

// addSplit loads, as name+"_order128" and name+"_order64", the dispatch
// orders of a walk over chains (chunk counts, in list order) with tiles
// column sets split unevenly between the widths (sched.SplitWalk):
// len(chains)*(hv/2) walks at vh 128, filling chain 0's heads first, then
// chain 1's, ..., so that some chains run wholly at vh 128, one partly and
// the rest not at all. It returns the split (its grids), or nil for hv < 2,
// where no split exists (the vh 128 walks would be all or none of them).
func addSplit(j *job, chains []int, hv, tiles int, name string) *sched.Mixed {
	if hv < 2 {
		return nil
	}
	wide := make([]int, len(chains))
	left := len(chains) * (hv / 2)
	for s := range wide {
		wide[s] = min(hv, left)
		left -= wide[s]
	}
	m, err := sched.SplitWalk(chains, wide, hv, tiles, 3, sched.ChunkCost{Narrow: 3, Wide: 5})
	require.NoError(j.t, err)
	j.i32(name+"_order128", m.Order128)
	j.i32(name+"_order64", m.Order64)
	return m
}

// listChunks is the chunk counts of l's segments in list (all of them where
// list is nil).
func listChunks(l *layout, list []int32) []int {
	if list == nil {
		list = make([]int32, l.NS)
		for s := range list {
			list[s] = int32(s)
		}
	}
	c := make([]int, len(list))
	for i, s := range list {
		c[i] = int(l.segNChunk[s])
	}
	return c
}

// addTapePlanes adds the fp32 l2norm, prep and dV'_local (the walks'
// inputs), test_walk_planes (the planes from the prep's W and kn), the
// reference gdn_tape_walk_mma and gdn_offset_walk_mma at vh 128 ("ref_") and
// gdn_tape_walk_planes and gdn_offset_walk_planes at vh 64 (CTAs in reverse
// launch order) and 128 ("p64_", "p128_"), the offset walks over offList,
// every output poisoned first.
func addTapePlanes(j *job, d *gdnData, dend []float32, offList []int) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	off := addBWalkInputs(j, d, dend, offList)
	for _, o := range append(prepOuts(d), bufSpec{"dvl", T * HV * dHead}) {
		j.out(o.name, 4*o.elems)
		j.poison(o.name, poisonF32)
	}
	outPlanes(j, "", l.NC, HQK, HV)
	addTapeOuts(j, l, HV, len(off), "ref_", "p64_", "p128_", "pmix_", "h64_", "h128_")
	scale := f32a(d.scale)
	launchL2NormPrep(j, d)
	j.launch("dvlocal", "gdn_dvlocal_bwd", grid3(l.NC, HV, 1), 256, "kDvlSmem",
		buf("qn"), buf("kn"), buf("gcum"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"), buf("dvl"),
		i32a(HQK), i32a(HV), scale)
	j.launch("planes", "test_walk_planes", grid3(l.NC, HV, 1), 256, "0", buf("w"), buf("kn"), buf("chunk_tok0"),
		buf("chunk_len"), buf("wp"), buf("wk"), i32a(HQK), i32a(HV))
	tabs := []string{buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"), buf("seg_nchunk"), buf("dend")}
	outs := func(p string) []string {
		return []string{buf(p + "d_chunk"), buf(p + "dvnew"), buf(p + "dstart")}
	}
	extra := func(p string) []string {
		return []string{buf(p + "dvnewp"), buf(p + "dvnew16"), buf(p + "d16")}
	}
	j.launch("ref_tape", "gdn_tape_walk_mma", grid3(1, l.NS, HV), 256, smemOf("bwalk_mma_smem", 128),
		slices.Concat([]string{buf("w"), buf("kt"), buf("qn"), buf("gcum"), buf("dvl"), buf("dout")}, tabs, outs("ref_"),
			[]string{i32a(HQK), i32a(HV), i32a(128), scale}, extra("ref_"), []string{nullBuf()})...)
	offTabs := []string{buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"), buf("seg_nchunk"), buf("off_list")}
	j.launch("ref_offset", "gdn_offset_walk_mma", grid3(2, len(off), HV), 256, smemOf("bwalk_mma_smem", 128),
		slices.Concat([]string{buf("w"), buf("kt"), buf("qn"), buf("gcum"), buf("dvl"), buf("dout")}, offTabs,
			[]string{buf("ref_out_pt"), buf("ref_out_r"), i32a(HQK), i32a(HV), i32a(128), scale, nullBuf()})...)
	j.i32("tape_order_rev", reverseOrder(dHead/64*l.NS*HV))
	j.i32("offset_order_rev", reverseOrder(2*dHead/64*len(off)*HV))
	for _, vh := range []int{64, 128} {
		p := "p" + vhName(vh) + "_"
		order, offOrder, tape := nullBuf(), nullBuf(), "gdn_tape_walk_planes_w128" // one tape entry a width
		if vh == 64 {
			tape = "gdn_tape_walk_planes"
			order, offOrder = buf("tape_order_rev"), buf("offset_order_rev")
		}
		j.launch(p+"offset", "gdn_offset_walk_planes", grid3(2*dHead/vh, len(off), HV), 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp"), bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd"), bufAt("qkv", 2*d.qOff), i32a(d.qStride), buf("q_rstd"), buf("gcum"),
				buf("dvl"), buf("dout")}, offTabs, []string{buf(p + "out_pt"), buf(p + "out_r"), i32a(HQK), i32a(HV),
				i32a(vh), scale, offOrder})...)
		j.launch(p+"tape", tape, grid3(dHead/vh, l.NS, HV), 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp"), bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd"), bufAt("qkv", 2*d.qOff), i32a(d.qStride), buf("q_rstd"), buf("gcum"),
				buf("dvl"), buf("dout")}, tabs, outs(p), []string{i32a(HQK), i32a(HV), i32a(vh), scale}, extra(p),
				[]string{order})...)
		// The single-product tape and offset walks (gdn_tape_walk_planes_h, _w128_h, gdn_offset_walk_planes_h:
		// TapePlaneWalker's HI).
		h := "h" + vhName(vh) + "_"
		j.launch(h+"offset", "gdn_offset_walk_planes_h", grid3(2*dHead/vh, len(off), HV), 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp"), bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd"), bufAt("qkv", 2*d.qOff), i32a(d.qStride), buf("q_rstd"), buf("gcum"),
				buf("dvl"), buf("dout")}, offTabs, []string{buf(h + "out_pt"), buf(h + "out_r"), i32a(HQK), i32a(HV),
				i32a(vh), scale, offOrder})...)
		j.launch(h+"tape", tape+"_h", grid3(dHead/vh, l.NS, HV), 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp"), bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd"), bufAt("qkv", 2*d.qOff), i32a(d.qStride), buf("q_rstd"), buf("gcum"),
				buf("dvl"), buf("dout")}, tabs, outs(h), []string{i32a(HQK), i32a(HV), i32a(vh), scale}, extra(h),
				[]string{order})...)
	}
	// The tape and offset walks split between the widths as kcp launches them
	// (the width rule's model, GPUOptions.SplitHeads): the vh 128 entry (the offset
	// walk's one entry at vh 128) on some (segment, head) walks, the vh 64
	// entry on the others.
	m := addSplit(j, listChunks(l, nil), HV, 1, "tape")
	require.NotNil(j.t, m, "the tape walk cases have HV >= 2")
	mo := addSplit(j, listChunks(l, off), HV, 2, "offset")
	for _, vh := range []int{128, 64} {
		tape, g, order := "gdn_tape_walk_planes_w128", m.Grid128(), buf("tape_order128")
		og, oOrder := mo.Grid128(), buf("offset_order128")
		if vh == 64 {
			tape, g, order = "gdn_tape_walk_planes", m.Grid64(), buf("tape_order64")
			og, oOrder = mo.Grid64(), buf("offset_order64")
		}
		j.launch("pmix_tape"+vhName(vh), tape, g, 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp"), bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd"), bufAt("qkv", 2*d.qOff), i32a(d.qStride), buf("q_rstd"), buf("gcum"),
				buf("dvl"), buf("dout")}, tabs, outs("pmix_"), []string{i32a(HQK), i32a(HV), i32a(vh), scale}, extra("pmix_"),
				[]string{order})...)
		j.launch("pmix_offset"+vhName(vh), "gdn_offset_walk_planes", og, 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp"), bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd"), bufAt("qkv", 2*d.qOff), i32a(d.qStride), buf("q_rstd"), buf("gcum"),
				buf("dvl"), buf("dout")}, offTabs, []string{buf("pmix_out_pt"), buf("pmix_out_r"), i32a(HQK), i32a(HV),
				i32a(vh), scale, oOrder})...)
	}
}

// addTapeOuts adds, poisoned, the tape walk's outputs under each prefix (tapePlaneOuts' names; with nOff > 0 the
// offset walk's over nOff listed segments too), bytes sized for layout l and HV value heads.
func addTapeOuts(j *job, l *layout, HV, nOff int, prefixes ...string) {
	for _, p := range prefixes {
		outs := []bufSpec{{"d_chunk", 4 * l.NC * HV * dHead * dHead}, {"dvnew", 4 * l.T * HV * dHead},
			{"dstart", 4 * l.NS * HV * dHead * dHead}, {"dvnewp", l.NC * HV * tokenSlotBlock},
			{"dvnew16", l.NC * HV * tokenSlotBlock / 2}, {"d16", 2 * l.NC * HV * dHead * dHead}}
		if nOff > 0 {
			outs = append(outs, bufSpec{"out_pt", 4 * nOff * HV * dHead * dHead}, bufSpec{"out_r", 4 * nOff * HV * dHead * dHead})
		}
		for _, o := range outs {
			j.out(p+o.name, o.elems)
			if o.name == "dvnew16" || o.name == "d16" {
				j.poison(p+o.name, poisonBF16x2)
			} else {
				j.poison(p+o.name, poisonF32)
			}
		}
	}
}

// tapeHiTol bounds the single-product tape walk (gdn_tape_walk_planes_h)
// against float64: its operands' bf16 rounding, ~2^-9 a product, held in
// fp32 across the chunks.
const tapeHiTol = 5e-3

// TestTapePlanesOnCPU runs gdn_tape_walk_planes (vh 64) and _w128 (vh 128) on planes
// made by test_walk_planes from the fp32 prep's W and kn, beside
// gdn_tape_walk_mma on that W, Kt and qn, on fwdCases (grouped heads, short
// chunks, q in the module's strided conv rows; "no_l2norm" with copies and
// wgmma deferred to their waits), in two runners: runner_bwalk_mma_wg (the
// sm_90a products on the emulator's wgmma) and runner_bwalk_mma (wgmma.cuh's
// portable products on mma.sync). Every output is written; D per chunk, dV'
// and the start adjoints are within bwalkMMATol of gdnref's tape walk on the
// kernels' own W, Kt, qn, gamma, dV'_local; the start adjoints' worst
// element within bwalkMMAElemTol of their rms; the token slots and bf16
// tiles are the walk's own fp32 values; vh 64 and 128 and the two runners
// give the same bits, and so do the tape walk split between its two entries
// and the offset walk split between its widths (sched.SplitWalk, as kcp's
// walk splits launch them: partial grids whose dispatch orders
// name CTAs of the full launch); the log shows wgmma in the wgmma runner
// only.
func TestTapePlanesOnCPU(t *testing.T) {
	forTapeCases(t, func(j *job, d *gdnData, dend []float32) { addTapePlanes(j, d, dend, d.c.offList) },
		func(t *testing.T, c *gdnCase, d *gdnData, dend []float32, rw, rp *result) {
			t.Logf("wgmma runner:\n%s\nportable runner:\n%s", rw.log, rp.log)
			l, HV := d.l, c.hv
			for _, vh := range []int{64, 128} {
				p := "p" + vhName(vh) + "_"
				for _, k := range []string{"tape", "offset"} {
					require.Contains(t, logLine(rw.log, p+k), "wgmma (warp)", "%s%s ran no wgmma in runner_bwalk_mma_wg", p, k)
					require.NotContains(t, logLine(rp.log, p+k), "wgmma", "%s%s ran wgmma in runner_bwalk_mma", p, k)
				}
				for _, n := range []string{"d_chunk", "dvnew", "dstart", "out_pt", "out_r"} {
					rw.f32s(p + n) // fully written, no NaN or Inf
				}
				for _, n := range tapePlaneOuts {
					require.NotEmpty(t, rw.raw[p+n], p+n)
					require.Equal(t, rw.raw["p64_"+n], rw.raw[p+n], "%s: vh 64 and vh %d differ", n, vh)
					require.Equal(t, rw.raw[p+n], rp.raw[p+n], "%s: the portable products differ from wgmma's", p+n)
				}
				require.Equal(t, tokenSlots(rw.f32s(p+"dvnew"), l.chunkTok0, l.chunkLen, HV), rw.raw[p+"dvnewp"],
					"%sdvnewp: not the token slots of the walk's own dV'", p)
				require.Equal(t, bf16.Bytes(vnewT16(rw.f32s(p+"dvnew"), l.chunkTok0, l.chunkLen, HV)), rw.raw[p+"dvnew16"],
					"%sdvnew16: not the walk's own dV'^T rounded to bf16", p)
				require.Equal(t, bf16.Bytes(stateT16(rw.f32s(p+"d_chunk"), l.NC, HV)), rw.raw[p+"d16"],
					"%sd16: not the walk's own D^T rounded to bf16", p)
			}
			// The single-product tape and offset walks: the same bits at both widths and in both runners, the tape
			// walk's bf16 tiles and token slots its own values.
			for _, n := range tapePlaneOuts {
				for _, r := range []*result{rw, rp} {
					require.NotEmpty(t, r.raw["h64_"+n], "h64_"+n)
					require.Equal(t, rw.raw["h64_"+n], r.raw["h128_"+n], "h128_%s: not vh 64's bits", n)
					require.Equal(t, rw.raw["h64_"+n], r.raw["h64_"+n], "h64_%s: the runners differ", n)
				}
				require.NotEqual(t, rw.raw["p64_"+n], rw.raw["h64_"+n], "h64_%s: the split walk's bits", n)
			}
			for _, n := range []string{"d_chunk", "dvnew", "dstart", "out_pt", "out_r"} {
				rw.f32s("h64_" + n) // fully written, no NaN or Inf
			}
			require.Equal(t, tokenSlots(rw.f32s("h64_dvnew"), l.chunkTok0, l.chunkLen, HV), rw.raw["h64_dvnewp"],
				"h64_dvnewp: not the token slots of the walk's own dV'")
			require.Equal(t, bf16.Bytes(vnewT16(rw.f32s("h64_dvnew"), l.chunkTok0, l.chunkLen, HV)), rw.raw["h64_dvnew16"],
				"h64_dvnew16: not the walk's own dV'^T rounded to bf16")
			require.Equal(t, bf16.Bytes(stateT16(rw.f32s("h64_d_chunk"), l.NC, HV)), rw.raw["h64_d16"],
				"h64_d16: not the walk's own D^T rounded to bf16")
			// The walks split between the widths (addSplit) write vh 64's bits
			// into every element of every output (poison left over would differ).
			for _, n := range tapePlaneOuts {
				for _, r := range []*result{rw, rp} {
					require.NotEmpty(t, r.raw["pmix_"+n], "pmix_"+n)
					require.Equal(t, rw.raw["p64_"+n], r.raw["pmix_"+n], "pmix_%s: the split walk differs from vh 64", n)
				}
			}
			// Against float64 on the kernels' own inputs, and beside the fp32-operand walk.
			segs := kernelSegments(t, d, rw)
			dvl, dout := widen(rw.f32s("dvl")), bf16Widen(d.dout)
			dChunk, dvnew, dstart := tapeRef(t, d, segs, dvl, dout, widen(dend))
			pt, rr := offsetRef(t, d, segs, dvl, dout, c.offList)
			et := &errTable{}
			for _, p := range []string{"ref_", "p128_"} {
				requireRel(t, et, p+"out_pt", widen(rw.f32s(p+"out_pt")), pt, bwalkMMATol)
				requireRel(t, et, p+"out_r", widen(rw.f32s(p+"out_r")), rr, bwalkMMATol)
				requireRel(t, et, p+"d_chunk", widen(rw.f32s(p+"d_chunk")), dChunk, bwalkMMATol)
				requireRel(t, et, p+"dvnew", widen(rw.f32s(p+"dvnew")), dvnew, bwalkMMATol)
				requireRel(t, et, p+"dstart", widen(rw.f32s(p+"dstart")), dstart, bwalkMMATol)
				worst := maxOverRMS(widen(rw.f32s(p+"dstart")), dstart)
				et.note(p+"dstart (max/rms)", worst)
				require.Less(t, worst, bwalkMMAElemTol, "%sdstart: an element is %.3g of the rms off", p, worst)
			}
			// The single-product walk against float64: bf16 operands (gdnref's TestTapeBF16Model: ~1.8e-3 of D,
			// ~4.5e-4 of dV').
			requireRel(t, et, "h64_d_chunk", widen(rw.f32s("h64_d_chunk")), dChunk, tapeHiTol)
			requireRel(t, et, "h64_dvnew", widen(rw.f32s("h64_dvnew")), dvnew, tapeHiTol)
			requireRel(t, et, "h64_dstart", widen(rw.f32s("h64_dstart")), dstart, tapeHiTol)
			requireRel(t, et, "h64_out_pt", widen(rw.f32s("h64_out_pt")), pt, tapeHiTol)
			requireRel(t, et, "h64_out_r", widen(rw.f32s("h64_out_r")), rr, tapeHiTol)
			et.log(t)
		})
}

// forTapeCases runs, for every case of fwdCases in parallel, the job that add builds (on the case's data and
// random terminal adjoints dend) in runner_bwalk_mma_wg (wgmma emulated) and runner_bwalk_mma (wgmma.cuh's
// portable products), with cp.async and wgmma deferred to their waits in the "no_l2norm" case, and hands both
// results to check. It skips where the sources' wgmma.cuh cannot run on the emulator.
func forTapeCases(t *testing.T, add func(j *job, d *gdnData, dend []float32),
	check func(t *testing.T, c *gdnCase, d *gdnData, dend []float32, rw, rp *result)) {
	if !haveEmuWGMMA() {
		t.Skipf("%s/wgmma.cuh does not route wgmma to the emulator (no GDNKCP_EMU_WGMMA)", srcDir())
	}
	wgBin := built(t, "runner_bwalk_mma_wg")
	ptBin := built(t, "runner_bwalk_mma")
	for i := range fwdCases {
		c := &fwdCases[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newData(t, c)
			dend := randomStates(d.l.NS*c.hv, 13)
			run := func(bin string, env []string) *result {
				j := newJob(t)
				j.env = env
				add(j, d, dend)
				return j.run(bin)
			}
			var wgEnv, ptEnv []string
			if c.name == "no_l2norm" {
				wgEnv, ptEnv = []string{cpAsyncDeferred, wgmmaDeferred}, []string{cpAsyncDeferred}
			}
			check(t, c, d, dend, run(wgBin, wgEnv), run(ptBin, ptEnv))
		})
	}
}
