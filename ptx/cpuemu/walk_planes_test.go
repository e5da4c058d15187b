package cpuemu

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// The plane walks of ptx/src/gdn_walk_planes.cu (gdn_state_walk_planes,
// gdn_summary_walk_planes): WGWalker's state, products and stores on the
// walk planes (ptx/src/walk_planes.cuh) copied as they lie, in place of the
// fp32 W and kn rows that its converters turn into those planes every chunk.

// outPlanes adds the poisoned outputs "wp"+sfx and "wk"+sfx: the -W and K^T
// walk planes of NC chunks (32 KB a chunk and value head, a chunk and QK
// head).
func outPlanes(j *job, sfx string, NC, HQK, HV int) {
	j.out("wp"+sfx, NC*HV*32768)
	j.poison("wp"+sfx, poisonBF16x2)
	j.out("wk"+sfx, NC*HQK*32768)
	j.poison("wk"+sfx, poisonBF16x2)
}

// planeWalkOuts are a state walk's outputs, in gdn_state_walk_mma16's order.
var planeWalkOuts = []string{"h", "vnew", "final", "h16", "vnew16"}

// The plane state walks' V' token slots (their vnewp output) are a buffer
// of its own, beside planeWalkOuts: the reference walk has none.

// addPlaneWalks adds the fp32 l2norm and prep (the walks' fp32 inputs),
// test_walk_planes (the planes from the prep's W, kn and gcum), the
// reference gdn_state_walk_mma16 and gdn_summary_walk_mma16 at vh 128
// ("ref_", on W and kn) and the plane walks at vh 64 and 128 ("p64_",
// "p128_"), every output poisoned first.
func addPlaneWalks(j *job, d *gdnData, start []float32) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	addInputs(j, d)
	j.f32("start", start)
	sum := addSumList(j, d)
	for _, o := range prepOuts(d) {
		j.out(o.name, 4*o.elems)
		j.poison(o.name, poisonF32)
	}
	outPlanes(j, "", l.NC, HQK, HV)
	for _, p := range []string{"ref_", "p64_", "p128_", "psplit_"} {
		for _, o := range []bufSpec{{"h", 4 * l.NC * HV * dHead * dHead}, {"vnew", 4 * T * HV * dHead},
			{"final", 4 * l.NS * HV * dHead * dHead}, {"h16", 2 * l.NC * HV * dHead * dHead},
			{"vnew16", 2 * l.NC * HV * dHead * chunk}, {"out_p", 4 * len(sum) * HV * dHead * dHead},
			{"out_q", 4 * len(sum) * HV * dHead * dHead}} {
			j.out(p+o.name, o.elems)
			j.poison(p+o.name, poisonF32)
		}
	}
	for _, p := range []string{"p64_", "p128_", "psplit_"} {
		j.out(p+"vnewp", l.NC*HV*tokenSlotBlock)
		j.poison(p+"vnewp", poisonF32)
	}
	launchL2NormPrep(j, d)
	tabs := []string{buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"), buf("seg_nchunk")}
	j.launch("planes", "test_walk_planes", grid3(l.NC, HV, 1), 256, "0", buf("w"), buf("kn"), tabs[0], tabs[1],
		buf("wp"), buf("wk"), i32a(HQK), i32a(HV))
	outs := func(p string) []string {
		var a []string
		for _, n := range planeWalkOuts {
			a = append(a, buf(p+n))
		}
		return a
	}
	j.launch("ref_state", "gdn_state_walk_mma16", grid3(1, l.NS, HV), 256, smemOf("walk_mma_smem", 128),
		slices.Concat([]string{buf("w"), buf("u"), buf("kn"), buf("gcum")}, tabs, []string{buf("start")}, outs("ref_"),
			[]string{i32a(HQK), i32a(HV), i32a(128)})...)
	j.launch("ref_summary", "gdn_summary_walk_mma16", grid3(2, len(sum), HV), 256, smemOf("walk_mma_smem", 128),
		slices.Concat([]string{buf("w"), buf("u"), buf("kn"), buf("gcum")}, tabs, []string{buf("sum_list"), buf("ref_out_p"),
			buf("ref_out_q"), i32a(HQK), i32a(HV), i32a(128)})...)
	// The state and summary walks at vh 64 run their CTAs in reverse launch order (a dispatch order,
	// dispatch_cta), at vh 128 in launch order (order null): the outputs must still be equal bit for bit.
	j.i32("order_rev", reverseOrder(dHead/64*l.NS*HV))
	j.i32("sum_order_rev", reverseOrder(2*dHead/64*len(sum)*HV))
	// The plane walks' inputs: -W's planes, k's bf16 rows (in qkv) and gdn_l2norm_fwd's k_rstd.
	kIn := []string{buf("wp"), bufAt("qkv", 2*d.kOff), i32a(d.qStride), buf("k_rstd")}
	for _, vh := range []int{64, 128} {
		p := "p" + vhName(vh) + "_"
		order, sumOrder := nullBuf(), nullBuf()
		if vh == 64 {
			order, sumOrder = buf("order_rev"), buf("sum_order_rev")
		}
		j.launch(p+"state", "gdn_state_walk_planes", grid3(dHead/vh, l.NS, HV), 256, smemOf("walk_planes_smem", vh),
			slices.Concat(kIn, []string{buf("u"), buf("gcum")}, tabs, []string{buf("start")}, outs(p),
				[]string{i32a(HQK), i32a(HV), i32a(vh), buf(p + "vnewp"), order})...)
		j.launch(p+"summary", "gdn_summary_walk_planes", grid3(2*dHead/vh, len(sum), HV), 256,
			smemOf("walk_planes_smem", vh), slices.Concat(kIn, []string{buf("u"), buf("gcum")}, tabs,
				[]string{buf("sum_list"), buf(p + "out_p"), buf(p + "out_q"), i32a(HQK), i32a(HV), i32a(vh), sumOrder})...)
	}
	// The state and summary walks split between the widths as kcp launches
	// them (GPUOptions.SplitHeads): one entry each, at vh 128 on some
	// (segment, head) walks and at vh 64 on the others, each a partial grid.
	m := addSplit(j, listChunks(l, nil), HV, 1, "state")
	ms := addSplit(j, listChunks(l, sum), HV, 2, "summary")
	for _, vh := range []int{128, 64} {
		if m == nil {
			break
		}
		g, order, sg, sOrder := m.Grid128(), buf("state_order128"), ms.Grid128(), buf("summary_order128")
		if vh == 64 {
			g, order, sg, sOrder = m.Grid64(), buf("state_order64"), ms.Grid64(), buf("summary_order64")
		}
		j.launch("psplit_state"+vhName(vh), "gdn_state_walk_planes", g, 256, smemOf("walk_planes_smem", vh),
			slices.Concat(kIn, []string{buf("u"), buf("gcum")}, tabs, []string{buf("start")}, outs("psplit_"),
				[]string{i32a(HQK), i32a(HV), i32a(vh), buf("psplit_vnewp"), order})...)
		j.launch("psplit_summary"+vhName(vh), "gdn_summary_walk_planes", sg, 256, smemOf("walk_planes_smem", vh),
			slices.Concat(kIn, []string{buf("u"), buf("gcum")}, tabs, []string{buf("sum_list"), buf("psplit_out_p"),
				buf("psplit_out_q"), i32a(HQK), i32a(HV), i32a(vh), sOrder})...)
	}
}

// TestPlaneWalksOnCPU runs the plane walks at vh 64 and 128 on planes made by
// test_walk_planes from the fp32 prep's W and kn, beside gdn_state_walk_mma16
// and gdn_summary_walk_mma16 on that W and kn (which form Kt_i = k_i e_i and
// split it, where the plane walks scale V'^T's columns by e_i and split
// those), on mma16Cases ("core" with copies and wgmma results at issue,
// "gva" with EMU_CP_ASYNC=deferred and, on wgmma, EMU_WGMMA=deferred), in two
// runners: runner_mma16_wg (the sm_90a bodies on the emulator's wgmma) and
// runner_mma16 (the portable products of wgmma.cuh on mma.sync). On wgmma,
// H, V', the final states, P and Q are within wgmmaWalkTol of the
// reference's, the bf16 H^T and V'^T bitwise the tiles of the walk's own fp32
// H and V', both widths bitwise equal, and the log shows wgmma for every plane
// walk; the portable runner's plane walks write the wgmma ones' bits (the
// emulator's wgmma adds in mma.sync's k order: this holds the portable
// products' B addressing to the descriptors') and run no wgmma; the state
// and summary walks split between the widths (addSplit: partial grids whose
// dispatch orders name CTAs of the full launches) write vh 64's bits. Every
// output is written.
func TestPlaneWalksOnCPU(t *testing.T) {
	if !haveEmuWGMMA() {
		t.Skipf("%s/wgmma.cuh does not route wgmma to the emulator (no GDNKCP_EMU_WGMMA)", srcDir())
	}
	wgBin := built(t, "runner_mma16_wg")
	ptBin := built(t, "runner_mma16")
	for _, rn := range []struct {
		name     string
		c        *gdnCase
		deferred bool
	}{
		{"core/immediate", &mma16Cases[0], false},
		{"gva/deferred", &mma16Cases[1], true},
	} {
		t.Run(rn.name, func(t *testing.T) {
			t.Parallel()
			d := newData(t, rn.c)
			start := randomStates(d.l.NS*rn.c.hv, 17)
			run := func(bin string, env []string) *result {
				j := newJob(t)
				j.env = env
				addPlaneWalks(j, d, start)
				return j.run(bin)
			}
			var wgEnv, ptEnv []string
			if rn.deferred {
				wgEnv, ptEnv = []string{cpAsyncDeferred, wgmmaDeferred}, []string{cpAsyncDeferred}
			}
			rw, rp := run(wgBin, wgEnv), run(ptBin, ptEnv)
			t.Logf("wgmma runner:\n%s\nportable runner:\n%s", rw.log, rp.log)
			et := &errTable{}
			names := append(append([]string{}, planeWalkOuts...), "out_p", "out_q")
			for _, vh := range []int{64, 128} {
				p := "p" + vhName(vh) + "_"
				for _, l := range []string{p + "state", p + "summary"} {
					require.Contains(t, logLine(rw.log, l), "wgmma (warp)", "%s ran no wgmma in runner_mma16_wg", l)
					require.NotContains(t, logLine(rp.log, l), "wgmma", "%s ran wgmma in runner_mma16", l)
				}
				for _, n := range []string{"h", "vnew", "final", "out_p", "out_q"} {
					requireRel(t, et, p+n, widen(rw.f32s(p+n)), widen(rw.f32s("ref_"+n)), wgmmaWalkTol)
				}
				want16 := bf16Tiles(d.l, rn.c.hv, rw.f32s(p+"h"), rw.f32s(p+"vnew"))
				for _, n := range []string{"h16", "vnew16"} {
					requireSameBF16(t, want16[n], rw.raw[p+n], p+n)
				}
				// V' as token slots: the walk's own fp32 V', bit for bit.
				require.Equal(t, tokenSlots(rw.f32s(p+"vnew"), d.l.chunkTok0, d.l.chunkLen, rn.c.hv), rw.raw[p+"vnewp"],
					"%svnewp: not the token slots of the walk's own V'", p)
				for _, n := range append(names, "vnewp") {
					require.NotEmpty(t, rw.raw[p+n], p+n)
					require.Equal(t, rw.raw["p64_"+n], rw.raw[p+n], "%s: vh 64 and vh %d differ", n, vh)
					require.Equal(t, rw.raw[p+n], rp.raw[p+n], "%s: the portable products differ from wgmma's", p+n)
				}
			}
			// The state and summary walks split between the widths (addSplit)
			// write vh 64's bits into every element of their outputs (where
			// HV >= 2 lets them split).
			for _, n := range append(slices.Clone(planeWalkOuts), "vnewp", "out_p", "out_q") {
				if rn.c.hv < 2 {
					break
				}
				for _, r := range []*result{rw, rp} {
					require.NotEmpty(t, r.raw["psplit_"+n], "psplit_"+n)
					require.Equal(t, rw.raw["p64_"+n], r.raw["psplit_"+n], "psplit_%s: the split state walk differs from vh 64", n)
				}
			}
			et.log(t)
		})
	}
}
