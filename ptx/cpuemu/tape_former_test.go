package cpuemu

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// haveTapeFormer reports whether the sources hold the tape walk's dV'_local former (gdn_tape_walk_planes_hf,
// gdn_dvlocal_form: ptx/staging/tape_dvl_former.patch until it lands).
func haveTapeFormer() bool {
	b, err := os.ReadFile(filepath.Join(srcDir(), "gdn_tape_planes.cu"))
	return err == nil && strings.Contains(string(b), "gdn_tape_walk_planes_hf")
}

// tapeFormerOuts are the tape and offset walks' outputs the former's runs are compared on.
var tapeFormerOuts = []string{"d_chunk", "dvnew", "dstart", "dvnewp", "dvnew16", "d16", "out_pt", "out_r"}

// addTapeFormer adds, after addTapePlanes: gdn_dvlocal_form's dvl ("dvlf"), gdn_tape_walk_planes_hf at vh 64
// with no dvl (the former's, CTAs in reverse launch order: "f64_"), gdn_tape_walk_planes_w128_h on dvlf
// ("f128_"), and the two split between the widths as kcp would launch them, hf on the vh 64 walks and w128_h on
// dvlf on the others ("fmix_"); the offset walk likewise (gdn_offset_walk_planes_hf at vh 64, _h at vh 128 on dvlf,
// and split between them); every output poisoned first.
func addTapeFormer(j *job, d *gdnData) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	j.out("dvlf", 4*T*HV*dHead)
	j.poison("dvlf", poisonF32)
	off := make([]int32, len(c.offList))
	for i, s := range c.offList {
		off[i] = int32(s)
	}
	addTapeOuts(j, l, HV, len(off), "f64_", "f128_", "fmix_", "s64_", "s128_")
	scale := f32a(d.scale)
	rows := []string{bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd"), bufAt("qkv", 2*d.qOff), i32a(d.qStride),
		buf("q_rstd")}
	dvlArgs := func(out, items string) []string {
		return slices.Concat(rows[3:], rows[:3], []string{buf("gcum"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"), buf(out),
			i32a(HQK), i32a(HV), scale, items})
	}
	j.launch("dvlocal_form", "gdn_dvlocal_form", grid3(l.NC, HV, 1), 256, "kDvlFormSmem", dvlArgs("dvlf", nullBuf())...)
	// An item list: every third (chunk, value head) pair, into a buffer of its own.
	var items []int32
	for i := 0; i < l.NC*HV; i += 3 {
		items = append(items, int32(i))
	}
	j.i32("dvl_items", items)
	j.out("dvlf_items", 4*T*HV*dHead)
	j.poison("dvlf_items", poisonF32)
	j.launch("dvlocal_form_items", "gdn_dvlocal_form", grid3(len(items), 1, 1), 256, "kDvlFormSmem",
		dvlArgs("dvlf_items", buf("dvl_items"))...)
	tabs := []string{buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"), buf("seg_nchunk"), buf("dend")}
	tape := func(label, entry string, g [3]int, vh int, dvl, p, order string) {
		j.launch(label, entry, g, 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp")}, rows, []string{buf("gcum"), dvl, buf("dout")}, tabs,
				[]string{buf(p + "d_chunk"), buf(p + "dvnew"), buf(p + "dstart"), i32a(HQK), i32a(HV), i32a(vh), scale,
					buf(p + "dvnewp"), buf(p + "dvnew16"), buf(p + "d16"), order})...)
	}
	tape("f64_tape", "gdn_tape_walk_planes_hf", grid3(dHead/64, l.NS, HV), 64, nullBuf(), "f64_", buf("tape_order_rev"))
	tape("f128_tape", "gdn_tape_walk_planes_w128_h", grid3(1, l.NS, HV), 128, buf("dvlf"), "f128_", nullBuf())
	m := addSplit(j, listChunks(l, nil), HV, 1, "ftape")
	require.NotNil(j.t, m, "the tape walk cases have HV >= 2")
	tape("fmix_tape128", "gdn_tape_walk_planes_w128_h", m.Grid128(), 128, buf("dvlf"), "fmix_", buf("ftape_order128"))
	tape("fmix_tape64", "gdn_tape_walk_planes_hf", m.Grid64(), 64, nullBuf(), "fmix_", buf("ftape_order64"))
	offTabs := []string{buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"), buf("seg_nchunk"), buf("off_list")}
	offset := func(label, entry string, g [3]int, vh int, dvl, p, order string) {
		j.launch(label, entry, g, 256, smemOf("tape_planes_smem", vh),
			slices.Concat([]string{buf("wp")}, rows, []string{buf("gcum"), dvl, buf("dout")}, offTabs,
				[]string{buf(p + "out_pt"), buf(p + "out_r"), i32a(HQK), i32a(HV), i32a(vh), scale, order})...)
	}
	offset("f64_offset", "gdn_offset_walk_planes_hf", grid3(2*dHead/64, len(off), HV), 64, nullBuf(), "f64_",
		buf("offset_order_rev"))
	offset("f128_offset", "gdn_offset_walk_planes_h", grid3(2, len(off), HV), 128, buf("dvlf"), "f128_", nullBuf())
	mo := addSplit(j, listChunks(l, off), HV, 2, "foffset")
	offset("fmix_offset128", "gdn_offset_walk_planes_h", mo.Grid128(), 128, buf("dvlf"), "fmix_", buf("foffset_order128"))
	offset("fmix_offset64", "gdn_offset_walk_planes_hf", mo.Grid64(), 64, nullBuf(), "fmix_", buf("foffset_order64"))
	// The split-product walks (the module stage's) with the same former at vh 64 ("s64_") and on dvlf at vh 128.
	tape("s64_tape", "gdn_tape_walk_planes_f", grid3(dHead/64, l.NS, HV), 64, nullBuf(), "s64_", buf("tape_order_rev"))
	tape("s128_tape", "gdn_tape_walk_planes_w128", grid3(1, l.NS, HV), 128, buf("dvlf"), "s128_", nullBuf())
	offset("s64_offset", "gdn_offset_walk_planes_f", grid3(2*dHead/64, len(off), HV), 64, nullBuf(), "s64_",
		buf("offset_order_rev"))
	offset("s128_offset", "gdn_offset_walk_planes", grid3(2, len(off), HV), 128, buf("dvlf"), "s128_", nullBuf())
}

// TestTapeFormerOnCPU runs the tape walk's dV'_local former: gdn_dvlocal_form (dvlf::form in a kernel of its
// own) and gdn_tape_walk_planes_hf (the same former on the vh 64 walk's copying warpgroup, a chunk ahead of the
// state warps, no dvl read), on fwdCases, in runner_bwalk_mma_wg (wgmma emulated) and runner_bwalk_mma
// (wgmma.cuh's portable products), beside TestTapePlanesOnCPU's walks. dvlf is within dvlMMATol (normwise) and
// dvlMMAElemTol (worst element over the rms) of gdn_dvlocal_bwd's fp32 dvl, and leaves its gap rows as they were;
// the walk with the former gives the bits of gdn_tape_walk_planes_w128_h on dvlf (so vh 64 and 128 agree, and
// so does the walk split between the two entries as kcp launches splits), the same bits in both runners, its
// bf16 tiles and token slots its own values, and its D, dV' and start adjoints within tapeHiTol of float64; the
// log shows wgmma in the wgmma runner's former walk.
func TestTapeFormerOnCPU(t *testing.T) {
	if !haveTapeFormer() {
		t.Skipf("%s has no gdn_tape_walk_planes_hf (ptx/staging/tape_dvl_former.patch not applied)", srcDir())
	}
	add := func(j *job, d *gdnData, dend []float32) {
		addTapePlanes(j, d, dend, d.c.offList)
		addTapeFormer(j, d)
	}
	forTapeCases(t, add, func(t *testing.T, c *gdnCase, d *gdnData, dend []float32, rw, rp *result) {
		require.Contains(t, logLine(rw.log, "f64_tape"), "wgmma (warp)", "f64_tape ran no wgmma in runner_bwalk_mma_wg")
		require.Contains(t, logLine(rw.log, "f64_offset"), "wgmma (warp)", "f64_offset ran no wgmma in runner_bwalk_mma_wg")
		require.Contains(t, logLine(rw.log, "dvlocal_form"), "wgmma (warp)", "dvlocal_form ran no wgmma")
		require.NotContains(t, logLine(rp.log, "f64_tape"), "wgmma", "f64_tape ran wgmma in runner_bwalk_mma")

		// dvlf against the fp32 kernel's dvl: the same rows written (the gap rows' poison left as it was).
		want, got := rw.raw["dvl"], rw.raw["dvlf"]
		require.Equal(t, len(want), len(got))
		var wv, gv []float64
		for e := 0; e < len(want)/4; e++ {
			w, g := f32Of(want, e), f32Of(got, e)
			if math.Float32bits(w) == poisonF32 {
				require.Equal(t, poisonF32, math.Float32bits(g), "dvlf element %d: written where gdn_dvlocal_bwd writes nothing", e)
				continue
			}
			require.False(t, math.IsNaN(float64(g)) || math.IsInf(float64(g), 0), "dvlf element %d: %v", e, g)
			wv, gv = append(wv, float64(w)), append(gv, float64(g))
		}
		require.NotEmpty(t, wv)
		et := &errTable{}
		requireRel(t, et, "dvlocal_form", gv, wv, dvlMMATol)
		worst := maxOverRMS(gv, wv)
		et.note("dvlocal_form max/rms", worst)
		require.Lessf(t, worst, dvlMMAElemTol, "dvlf: an element is %.3g of the rms off", worst)
		require.Equal(t, rw.raw["dvlf"], rp.raw["dvlf"], "dvlf: the portable products differ from wgmma's")
		// The item list: the listed (chunk, value head) pairs' rows are the full grid's bits, the others untouched.
		l, HV := d.l, c.hv
		full, part := rw.raw["dvlf"], rw.raw["dvlf_items"]
		for ch := 0; ch < l.NC; ch++ {
			for h := 0; h < HV; h++ {
				listed := (ch*HV+h)%3 == 0
				for tk := int(l.chunkTok0[ch]); tk < int(l.chunkTok0[ch]+l.chunkLen[ch]); tk++ {
					lo, hi := 4*((tk*HV+h)*dHead), 4*((tk*HV+h+1)*dHead)
					if listed {
						require.Equal(t, full[lo:hi], part[lo:hi], "dvlf_items: chunk %d head %d token %d", ch, h, tk)
					} else {
						require.Equal(t, poisonF32, math.Float32bits(f32Of(part, lo/4)), "dvlf_items: chunk %d head %d token %d written", ch, h, tk)
					}
				}
			}
		}

		// The walks with the former (single products "f", split ones "s"): vh 128's bits on dvlf, the split
		// launch's (single products), both runners'.
		for _, n := range tapeFormerOuts {
			require.NotEmpty(t, rw.raw["f64_"+n], "f64_"+n)
			require.NotEmpty(t, rw.raw["s64_"+n], "s64_"+n)
			for _, r := range []*result{rw, rp} {
				require.Equal(t, rw.raw["f64_"+n], r.raw["f128_"+n], "f128_%s: not the former's bits", n)
				require.Equal(t, rw.raw["f64_"+n], r.raw["fmix_"+n], "fmix_%s: the split walk differs", n)
				require.Equal(t, rw.raw["f64_"+n], r.raw["f64_"+n], "f64_%s: the runners differ", n)
				require.Equal(t, rw.raw["s64_"+n], r.raw["s128_"+n], "s128_%s: not the split walk's former's bits", n)
				require.Equal(t, rw.raw["s64_"+n], r.raw["s64_"+n], "s64_%s: the runners differ", n)
			}
			require.NotEqual(t, rw.raw["s64_"+n], rw.raw["f64_"+n], "s64_%s: the single-product walk's bits", n)
		}
		for _, n := range []string{"d_chunk", "dvnew", "dstart", "out_pt", "out_r"} {
			rw.f32s("f64_" + n) // fully written, no NaN or Inf
		}
		require.Equal(t, tokenSlots(rw.f32s("f64_dvnew"), l.chunkTok0, l.chunkLen, HV), rw.raw["f64_dvnewp"],
			"f64_dvnewp: not the token slots of the walk's own dV'")
		segs := kernelSegments(t, d, rw)
		dChunk, dvnew, dstart := tapeRef(t, d, segs, widen(rw.f32s("dvl")), bf16Widen(d.dout), widen(dend))
		requireRel(t, et, "f64_d_chunk", widen(rw.f32s("f64_d_chunk")), dChunk, tapeHiTol)
		requireRel(t, et, "f64_dvnew", widen(rw.f32s("f64_dvnew")), dvnew, tapeHiTol)
		requireRel(t, et, "f64_dstart", widen(rw.f32s("f64_dstart")), dstart, tapeHiTol)
		requireRel(t, et, "s64_d_chunk", widen(rw.f32s("s64_d_chunk")), dChunk, bwalkMMATol)
		requireRel(t, et, "s64_dstart", widen(rw.f32s("s64_dstart")), dstart, bwalkMMATol)
		et.log(t)
	})
}
