package cpuemu

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// The tensor-core backward walks of ptx/src/gdn_bwalk_mma.cu
// (gdn_offset_walk_mma, gdn_tape_walk_mma: mma.sync with hi/lo splits,
// cp.async stages) on the emulator, against internal/gdnref fed the very fp32
// W, Kt, qn, gamma and dV'_local the walks read (made by the fp32 l2norm,
// prep and gdn_dvlocal_bwd in the same job), the bf16 dO and random terminal
// adjoints.

// bwalkMMATol bounds the normwise relative error of Pᵀ, R, the chunk
// adjoints, dV' and the start adjoints against float64 from the same inputs.
// As in the forward (mmaWalkTol): every product of two fp32 values runs as
// ah bh + ah bl + al bh (D with Kt, dV' with W), each term off by at most
// ~3 * 2^-16 = 4.6e-5 of |a||b| with random signs, and dO Qg (dO exact in
// bf16) as dO Qgh + dO Qgl, off by ~2^-16 |dO||Qg|; sums of 64..128 such
// terms land a few 1e-6 off (measured: see TestMMABackwardWalksOnCPU's log
// and docs/mma-kernels.md), and the 1-4 chunks of a segment (decays <= 1)
// do not amplify it much. 3e-5 is several times the largest and far below
// what dropping a lo part gives (~1e-3) or a wrong row of a chunk (~1/64).
const bwalkMMATol = 3e-5

// bwalkMMAElemTol bounds the worst element of the start adjoints against
// their rms, so that no single wrong column or key hides in the norm. The
// adjoints' elements spread far more than the forward states' (no_l2norm:
// k and W of norm ~11), so the legitimate worst is larger than the forward's:
// measured 1.1e-5 (l2norm) and 1.65e-4 (no_l2norm); 1e-3 leaves 6x.
const bwalkMMAElemTol = 1e-3

// TestMMABackwardWalksOnCPU runs the tensor-core backward walks on the cases of
// TestBackwardKernelsOnCPU (chunks of 1, 3, 6, 8, 40, 63, 64 rows; grouped
// heads; offset lists of one and two segments), vh 64 and 128: every
// output poisoned first and fully written, vh 64 and 128 bitwise equal, Pᵀ,
// R, D per chunk, dV' and DStart within bwalkMMATol of gdnref. cp.async lands
// at issue on every case and, on the "no_l2norm" case, deferred to its wait
// as well.
func TestMMABackwardWalksOnCPU(t *testing.T) {
	testBackwardWalks(t, "runner_bwalk_mma", false)
}

// TestWGMMABackwardWalksOnCPU runs TestMMABackwardWalksOnCPU's cases and
// checks on runner_bwalk_mma_wg, where gdn_tape_walk_mma and
// gdn_offset_walk_mma run their sm_90a bodies (ptx/src/gdn_bwalk_wgmma.cu) on
// the emulator's wgmma, and requires the runner to report wgmma for both
// walks at both widths. The no_l2norm case also runs with cp.async and wgmma
// deferred to their waits. It skips while the sources' wgmma.cuh does not
// route to the emulator.
func TestWGMMABackwardWalksOnCPU(t *testing.T) {
	if !haveEmuWGMMA() {
		t.Skipf("%s/wgmma.cuh does not route wgmma to the emulator (no GDNKCP_EMU_WGMMA)", srcDir())
	}
	testBackwardWalks(t, "runner_bwalk_mma_wg", true)
}

// testBackwardWalks is TestMMABackwardWalksOnCPU on runner bin; wgmma: the
// tape walks must report wgmma, and the deferred run defers wgmma too.
func testBackwardWalks(t *testing.T, name string, wgmma bool) {
	bin := built(t, name)
	// Every case with cp.async landing at issue; no_l2norm (a two-chunk
	// segment of 64 + 6 rows and a one-token one) also deferred to the wait.
	// To keep the added test time down (an emulated chunk of a CTA costs ~40
	// ms, ~77 ms with dO), core's offset list leaves out its four-chunk
	// segment 4 (its tape walk has it): {2, 3}, a one-chunk and a two-chunk
	// (64 + 1 rows) segment.
	type run struct {
		name string
		c    *gdnCase
		env  []string
	}
	var runs []run
	for i := range fwdCases {
		c := &fwdCases[i]
		runs = append(runs, run{c.name + "/cp_async_immediate", c, nil})
		if c.name == "no_l2norm" {
			env := []string{cpAsyncDeferred}
			if wgmma {
				env = append(env, wgmmaDeferred)
			}
			runs = append(runs, run{c.name + "/cp_async_deferred", c, env})
		}
	}
	require.Len(t, runs, len(fwdCases)+1)
	for _, rn := range runs {
		t.Run(rn.name, func(t *testing.T) {
			t.Parallel()
			c, off := rn.c, rn.c.offList
			if c.name == "core" {
				require.Equal(t, []int{2, 4, 3}, off)
				off = []int{2, 3}
			}
			d := newData(t, c)
			dend := randomStates(d.l.NS*c.hv, 13)
			j := newJob(t)
			j.env = rn.env
			addBWalksMMA(j, d, dend, off)
			r := j.run(bin)
			t.Logf("runner:\n%s", r.log)
			if wgmma {
				for _, vh := range []int{64, 128} {
					for _, l := range []string{"tape_mma", "offset_mma"} {
						require.Contains(t, logLine(r.log, l+vhName(vh)), "wgmma (warp)",
							"%s at vh %d ran no wgmma: the mma.sync body was built", l, vh)
					}
				}
			}
			et := &errTable{}
			checkBWalksMMA(t, et, d, r, widen(dend), off)
			et.log(t)
		})
	}
}

// addBWalksMMA adds the fp32 l2norm, prep and dV'_local (the walks' inputs)
// and the tensor-core offset and tape walks at vh 64 and 128, every output
// poisoned before its launch; the offset walks run over offList, the tape
// walks start from dend ([NS, HV, 128, 128]).
func addBWalksMMA(j *job, d *gdnData, dend []float32, offList []int) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	off := addBWalkInputs(j, d, dend, offList)
	outs := append(prepOuts(d), bufSpec{"dvl", T * HV * dHead})
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		outs = append(outs, bufSpec{"out_pt" + sfx, len(off) * HV * dHead * dHead},
			bufSpec{"out_r" + sfx, len(off) * HV * dHead * dHead}, bufSpec{"d_chunk" + sfx, l.NC * HV * dHead * dHead},
			bufSpec{"dvnew" + sfx, T * HV * dHead}, bufSpec{"dstart" + sfx, l.NS * HV * dHead * dHead})
	}
	for _, o := range outs {
		j.out(o.name, 4*o.elems)
		j.poison(o.name, poisonF32)
	}
	for _, vh := range []int{64, 128} {
		j.out("dvnewp"+vhName(vh), l.NC*HV*tokenSlotBlock)
		j.poison("dvnewp"+vhName(vh), poisonF32)
		j.out("dvnew16"+vhName(vh), l.NC*HV*tokenSlotBlock/2)
		j.poison("dvnew16"+vhName(vh), poisonBF16x2)
		j.out("d16"+vhName(vh), l.NC*HV*dHead*dHead*2)
		j.poison("d16"+vhName(vh), poisonBF16x2)
	}
	scale := f32a(d.scale)
	launchL2NormPrep(j, d)
	j.launch("dvlocal", "gdn_dvlocal_bwd", grid3(l.NC, HV, 1), 256, "kDvlSmem",
		buf("qn"), buf("kn"), buf("gcum"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"), buf("dvl"),
		i32a(HQK), i32a(HV), scale)
	// The offset and tape walks at vh 64 run their CTAs in reverse launch order (a dispatch order), at vh 128
	// in launch order: checkBWalksMMA requires the two widths' outputs bitwise equal.
	j.i32("tape_order_rev", reverseOrder(dHead/64*l.NS*HV))
	j.i32("offset_order_rev", reverseOrder(2*dHead/64*len(off)*HV))
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		order, offOrder := nullBuf(), nullBuf()
		if vh == 64 {
			order, offOrder = buf("tape_order_rev"), buf("offset_order_rev")
		}
		j.launch("offset_mma"+sfx, "gdn_offset_walk_mma", grid3(2*dHead/vh, len(off), HV), 256,
			smemOf("bwalk_mma_smem", vh),
			buf("w"), buf("kt"), buf("qn"), buf("gcum"), buf("dvl"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"),
			buf("seg_chunk0"), buf("seg_nchunk"), buf("off_list"), buf("out_pt"+sfx), buf("out_r"+sfx),
			i32a(HQK), i32a(HV), i32a(vh), scale, offOrder)
		j.launch("tape_mma"+sfx, "gdn_tape_walk_mma", grid3(dHead/vh, l.NS, HV), 256, smemOf("bwalk_mma_smem", vh),
			buf("w"), buf("kt"), buf("qn"), buf("gcum"), buf("dvl"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"),
			buf("seg_chunk0"), buf("seg_nchunk"), buf("dend"), buf("d_chunk"+sfx), buf("dvnew"+sfx), buf("dstart"+sfx),
			i32a(HQK), i32a(HV), i32a(vh), scale, buf("dvnewp"+sfx), buf("dvnew16"+sfx), buf("d16"+sfx), order)
	}
}

// checkBWalksMMA checks the walks' outputs: all written, vh 64 = vh 128 bit
// for bit, and each within bwalkMMATol of gdnref's walks over the kernels'
// own W, Kt, qn, gamma (kernelSegment) and dV'_local, the bf16 dO and dend.
func checkBWalksMMA(t *testing.T, et *errTable, d *gdnData, r *result, dend []float64, offList []int) {
	c, l := d.c, d.l
	HV := c.hv
	for _, n := range []string{"out_pt", "out_r", "d_chunk", "dvnew", "dstart"} {
		for _, vh := range []string{"64", "128"} {
			r.f32s(n + vh) // fully written, no NaN or Inf
		}
		require.Equal(t, r.raw[n+"64"], r.raw[n+"128"], "%s: the vh 64 and vh 128 walks differ", n)
	}
	// dV' as token slots (gdn_chunk_grads_mma6's input): the
	// walk's own fp32 dV', bit for bit, at both widths.
	// dV'^T as bf16 (gdn_chunk_grads_mma8's input): the walk's own fp32 dV'
	// rounded to nearest even, tokens past a chunk's end 0, every element
	// written, at both widths; D^T as bf16 (the same kernel's d16): the
	// walk's own fp32 D transposed and rounded, every element written.
	for _, vh := range []string{"64", "128"} {
		require.Equal(t, tokenSlots(r.f32s("dvnew"+vh), l.chunkTok0, l.chunkLen, HV), r.raw["dvnewp"+vh],
			"dvnewp%s: not the token slots of the walk's own dV'", vh)
		require.Equal(t, bf16.Bytes(vnewT16(r.f32s("dvnew"+vh), l.chunkTok0, l.chunkLen, HV)), r.raw["dvnew16"+vh],
			"dvnew16%s: not the walk's own dV'^T rounded to bf16", vh)
		require.Equal(t, bf16.Bytes(stateT16(r.f32s("d_chunk"+vh), l.NC, HV)), r.raw["d16"+vh],
			"d16%s: not the walk's own D^T rounded to bf16", vh)
	}
	dvl, dout := widen(r.f32s("dvl")), bf16Widen(d.dout)
	segs := kernelSegments(t, d, r)
	pt, rr := offsetRef(t, d, segs, dvl, dout, offList)
	requireRel(t, et, "offset PT", widen(r.f32s("out_pt128")), pt, bwalkMMATol)
	requireRel(t, et, "offset R", widen(r.f32s("out_r128")), rr, bwalkMMATol)

	dChunk, dvnew, dstart := tapeRef(t, d, segs, dvl, dout, dend)
	requireRel(t, et, "tape d_chunk", widen(r.f32s("d_chunk128")), dChunk, bwalkMMATol)
	requireRel(t, et, "tape dvnew", widen(r.f32s("dvnew128")), dvnew, bwalkMMATol)
	requireRel(t, et, "tape dstart", widen(r.f32s("dstart128")), dstart, bwalkMMATol)
	// The worst element of the start adjoints, relative to their rms: no
	// single column or key may hide in the norm.
	worst := maxOverRMS(widen(r.f32s("dstart128")), dstart)
	et.note("tape dstart (max/rms)", worst)
	require.Less(t, worst, bwalkMMAElemTol, "start adjoints: an element is %.3g of the rms off", worst)
}

// tapeRef is gdnref's tape walk of every segment and value head over segs
// (kernelSegment's), dV'_local dvl, dO dout and the terminal adjoints dend:
// the chunk adjoints, dV' and the start adjoints in the kernels' layouts.
func tapeRef(t *testing.T, d *gdnData, segs [][]*gdnref.Segment, dvl, dout, dend []float64) (dChunk, dvnew, dstart []float64) {
	l, HV := d.l, d.c.hv
	segRows := func(v []float64, s, h int) *mat.Dense {
		return rows(v, int(l.segStart[s]), int(l.segLen[s]), h, HV)
	}
	dChunk, dvnew = make([]float64, l.NC*HV*dHead*dHead), make([]float64, l.T*HV*dHead)
	dstart = make([]float64, l.NS*HV*dHead*dHead)
	for s := 0; s < l.NS; s++ {
		c0, _ := l.chunks(s)
		for h := 0; h < HV; h++ {
			tp, err := gdnref.TapeWalk(segs[s][h], segRows(dvl, s, h), segRows(dout, s, h), state(dend, s, h, HV), 128)
			require.NoError(t, err)
			for ci, m := range tp.D {
				putState(dChunk, m, c0+ci, h, HV)
			}
			putRows(dvnew, tp.DVNew, int(l.segStart[s]), h, HV)
			putState(dstart, tp.DStart, s, h, HV)
		}
	}
	return dChunk, dvnew, dstart
}

// offsetRef is gdnref's offset walk of the segments of offList and every
// value head over segs, dvl and dout: Pᵀ and R in the kernels' layouts.
func offsetRef(t *testing.T, d *gdnData, segs [][]*gdnref.Segment, dvl, dout []float64, offList []int) (pt, rr []float64) {
	l, HV := d.l, d.c.hv
	segRows := func(v []float64, s, h int) *mat.Dense {
		return rows(v, int(l.segStart[s]), int(l.segLen[s]), h, HV)
	}
	pt, rr = make([]float64, len(offList)*HV*dHead*dHead), make([]float64, len(offList)*HV*dHead*dHead)
	for li, s := range offList {
		for h := 0; h < HV; h++ {
			o, err := gdnref.OffsetWalk(segs[s][h], segRows(dvl, s, h), segRows(dout, s, h), 128)
			require.NoError(t, err)
			putState(pt, o.PT, li, h, HV)
			putState(rr, o.R, li, h, HV)
		}
	}
	return pt, rr
}

// addBWalkInputs adds the backward walks' inputs: the forward's (addInputs),
// dO, the terminal adjoints dend and the offset list offList ("off_list",
// which must not be empty), and returns that list as int32.
func addBWalkInputs(j *job, d *gdnData, dend []float32, offList []int) []int32 {
	addInputs(j, d)
	j.bf16("dout", d.dout)
	j.f32("dend", dend)
	off := make([]int32, len(offList))
	for i, s := range offList {
		off[i] = int32(s)
	}
	require.NotEmpty(j.t, off)
	j.i32("off_list", off)
	return off
}
