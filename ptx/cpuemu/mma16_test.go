package cpuemu

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// The v5 walks and the bf16 hand-over between the state walk and the
// output: gdn_state_walk_mma16 (ptx/src/gdn_walk_mma.cu:
// gdn_state_walk_mma reading kn and gcum in place of the prep's Kt, which it
// rebuilds, plus bf16 copies of each chunk's start state H^T and of V'^T),
// gdn_summary_walk_mma16 (gdn_summary_walk_mma with the same Kt rebuild) and
// gdn_output_mma16 (ptx/src/gdn_output_mma.cu: the output reading the
// bf16 copies). The walks are held bit for bit to gdn_state_walk_mma and
// gdn_summary_walk_mma run beside them on the prep's Kt; the output to
// gdnref.Output fed the walk's own fp32 H and V', rounded to bf16 as the
// output reads them (its own error) and not rounded (what the bf16 hand-over
// costs).

// mma16Cases: "core", the segments of TestForwardKernelsOnCPU's "core" case
// (1, 63, 64, 65 and 200 tokens: chunks of 1, 8, 63 and 64 rows, random
// non-zero start states) at one head (HQK 1 / HV 1, half the emulation of
// its two heads; summaries of the 63-, 65- and 200-token segments), and
// "gva", grouped heads (HQK 2 / HV 4) on one segment of 65 tokens (chunks of
// 64 and 1 rows), which checks the QK head the v5 walks read kn from, the
// head indexing of the walk's bf16 stores and the output's head-fastest
// block order and qh.
var mma16Cases = []gdnCase{
	{name: "core", lens: []int{1, 63, 64, 65, 200}, sumList: []int{4, 1, 3}, hqk: 1, hv: 1, l2norm: true, seed: 24},
	{name: "gva", lens: []int{65}, sumList: []int{0}, hqk: 2, hv: 4, l2norm: true, seed: 23},
}

// mma16Walk is one gdn_state_walk_mma16 launch: its width and the outputs
// passed as null (gdn_state_walk_mma16_drop's bits: 1 h_out, 2 vnew, 4 h16,
// 8 vnew16; 0 launches the entry itself).
type mma16Walk struct {
	vh, drop int
}

func (w mma16Walk) name() string { return "w16_" + vhName(w.vh) + "_" + string(rune('a'+w.drop)) }

// mma16Sums are the summary walks of a run: the reference
// gdn_summary_walk_mma on the prep's Kt at vh ref ("ref_out_p", "ref_out_q")
// and gdn_summary_walk_mma16 on kn at each of vhs ("s16_<vh>_out_p", ...).
type mma16Sums struct {
	ref int
	vhs []int
}

func sum16Name(vh int) string { return "s16_" + vhName(vh) + "_" }

// Bounds of the output's error against gdnref.Output fed the walk's fp32 H
// and V' (normwise): the bf16 hand-over (each of H and V' rounded, 2^-9
// relative, ~1.1e-3 apiece on these inputs) before O's rounding, and with
// O rounded to bf16 as well. Measured: 1.69e-3 and 2.36e-3 (TestMMA16OnCPU's
// log; the table in gdn_output_mma16's header comment); the bounds leave
// ~1.5x and stay under the forward's 5e-3 budget.
const (
	mma16HandOverTol = 2.5e-3
	mma16TotalTol    = 3.5e-3
)

// gapRows is the number of rows that no chunk owns after each chunk in the
// output's buffers: their q, k, gamma are NaN (never to be read), their
// outputs poisoned (never to be written).
const gapRows = 3

// TestMMA16OnCPU runs gdn_state_walk_mma16 and gdn_summary_walk_mma16 (fed
// kn and gcum) beside gdn_state_walk_mma and gdn_summary_walk_mma (fed the
// prep's Kt) on the same inputs (made by the fp32 l2norm and prep, whose Kt
// and gcum are gdn_prep_mma's bits; random non-zero start states) and
// gdn_output_mma16 on the h16 and vnew16 it wrote, on mma16Cases: "core"
// with cp.async landing at issue (state walks at vh 128 with every output
// and at vh 64 with h_out and vnew null, the forward's use; the summary at
// vh 64 against the reference's vh 128), "gva" with EMU_CP_ASYNC=deferred
// (vh 64 with every output, vh 128 with h16 and vnew16 null; the summary
// at vh 128 against the reference's vh 64). The walks: every output
// poisoned first; h_out, vnew and the final states bitwise gdn_state_walk_mma's
// (vh 128), P and Q bitwise gdn_summary_walk_mma's; h16 and vnew16 bitwise
// the bf16 rounding of that H (transposed) and V' (transposed, 0 past a
// chunk's end), fully written; a null output left untouched. The output,
// on a buffer with gapRows NaN rows after every chunk: every chunk row
// written, no gap row written, no NaN; the fp32 probe (core) within
// outMMATol of gdnref.Output from the bf16-rounded H and V' (its own error);
// the bf16 entry bit for bit the probe's rounding (core), and within bf16
// rounding of the same reference; both within mma16HandOverTol /
// mma16TotalTol of gdnref.Output from the unrounded fp32 H and V'. The
// output job runs again in runner_mma16_wg, where the grouped outputs take
// their sm_90a products on the emulator's wgmma (deferred in the gva case):
// the same checks, wgmma ran there, and every output the portable runner's
// bits.
func TestMMA16OnCPU(t *testing.T) {
	bin, wgBin := built(t, "runner_mma16"), built(t, "runner_mma16_wg")
	for _, rn := range []struct {
		name  string
		c     *gdnCase
		env   []string
		walks []mma16Walk
		sums  mma16Sums
		probe bool
	}{
		{"core/cp_async_immediate", &mma16Cases[0], nil, []mma16Walk{{128, 0}, {64, 1 | 2}},
			mma16Sums{128, []int{64}}, true},
		{"gva/cp_async_deferred", &mma16Cases[1], []string{cpAsyncDeferred}, []mma16Walk{{64, 0}, {128, 4 | 8}},
			mma16Sums{64, []int{128}}, false},
	} {
		t.Run(rn.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, 0, rn.walks[0].drop, "the first walk feeds the output: it must write everything")
			d := newData(t, rn.c)
			start := randomStates(d.l.NS*rn.c.hv, 17)
			j := newJob(t)
			j.env = rn.env
			addWalks16(j, d, start, rn.walks, rn.sums)
			r := j.run(bin)
			t.Logf("walks:\n%s", r.log)
			et := &errTable{}
			in := checkWalks16(t, d, r, rn.walks, rn.sums)

			j = newJob(t)
			j.env = rn.env
			g := addOutput16(j, d, in, r.raw[rn.walks[0].name()+"h16"], r.raw[rn.walks[0].name()+"vnew16"], rn.probe)
			ro := j.run(bin)
			t.Logf("output:\n%s", ro.log)
			checkOutput16(t, et, d, in, g, ro, rn.probe)

			// The same output job in runner_mma16_wg, where the grouped outputs run their products on the
			// emulator's wgmma (gdn_output_mma.cu, GDNKCP_OUT_WGMMA; deferred there with the copies): every
			// check above again, wgmma ran for each grouped launch and not for gdn_output_mma16, and every
			// output is the portable runner's bits (the emulator's wgmma is mma.sync's arithmetic, and the
			// wgmma path adds only exact zeros past the causal blocks).
			jw := *j
			if rn.env != nil {
				jw.env = append(append([]string{}, rn.env...), wgmmaDeferred)
			}
			rw := jw.run(wgBin)
			t.Logf("output (runner_mma16_wg):\n%s", rw.log)
			checkOutput16(t, et, d, in, g, rw, rn.probe)
			for _, l := range []string{"output_mma16g", "output_mma16gn", "output_mma16gn_u8", "output_mma16gnk",
				"output_mma16gnk_u8"} {
				require.Contains(t, logLine(rw.log, l), "wgmma (warp)", "%s ran no wgmma in runner_mma16_wg", l)
				require.NotContains(t, logLine(ro.log, l), "wgmma", "%s ran wgmma in runner_mma16", l)
			}
			require.NotContains(t, logLine(rw.log, "output_mma16"), "wgmma", "gdn_output_mma16 ran wgmma")
			for name, b := range ro.raw {
				require.Equal(t, b, rw.raw[name], "%s: runner_mma16_wg's output is not runner_mma16's bits", name)
			}
			et.log(t)
		})
	}
}

// addWalks16 adds the fp32 l2norm and prep (the walks' inputs),
// gdn_state_walk_mma at vh 128 ("ref_" outputs) and the launches of walks
// (on kn), gdn_summary_walk_mma at vh sums.ref and gdn_summary_walk_mma16
// at each of sums.vhs, every output poisoned first.
func addWalks16(j *job, d *gdnData, start []float32, walks []mma16Walk, sums mma16Sums) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv
	addInputs(j, d)
	j.f32("start", start)
	sum := addSumList(j, d)
	outs := prepOuts(d)
	for _, p := range append([]string{"ref_"}, walkNames(walks)...) {
		outs = append(outs, bufSpec{p + "h", l.NC * HV * dHead * dHead}, bufSpec{p + "vnew", T * HV * dHead},
			bufSpec{p + "final", l.NS * HV * dHead * dHead})
	}
	sumPrefixes := []string{"ref_"}
	for _, vh := range sums.vhs {
		sumPrefixes = append(sumPrefixes, sum16Name(vh))
	}
	for _, p := range sumPrefixes {
		outs = append(outs, bufSpec{p + "out_p", len(sum) * HV * dHead * dHead},
			bufSpec{p + "out_q", len(sum) * HV * dHead * dHead})
	}
	for _, o := range outs {
		j.out(o.name, 4*o.elems)
		j.poison(o.name, poisonF32)
	}
	for _, p := range walkNames(walks) {
		j.out(p+"h16", 2*l.NC*HV*dHead*dHead)
		j.poison(p+"h16", poisonBF16x2)
		j.out(p+"vnew16", 2*l.NC*HV*dHead*chunk)
		j.poison(p+"vnew16", poisonBF16x2)
	}
	launchL2NormPrep(j, d)
	in := []string{buf("w"), buf("u"), buf("kt"), buf("gcum"), buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"),
		buf("seg_nchunk"), buf("start")}
	j.launch("ref_state_mma128", "gdn_state_walk_mma", grid3(1, l.NS, HV), 256, smemOf("walk_mma_smem", 128),
		append(in, buf("ref_h"), buf("ref_vnew"), buf("ref_final"), i32a(HV), i32a(128))...)
	sumArgs := func(kt, p string) []string {
		return []string{buf("w"), buf("u"), buf(kt), buf("gcum"), buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"),
			buf("seg_nchunk"), buf("sum_list"), buf(p + "out_p"), buf(p + "out_q")}
	}
	j.launch("ref_summary_mma"+vhName(sums.ref), "gdn_summary_walk_mma", grid3(2*dHead/sums.ref, len(sum), HV), 256,
		smemOf("walk_mma_smem", sums.ref), append(sumArgs("kt", "ref_"), i32a(HV), i32a(sums.ref))...)
	for _, vh := range sums.vhs {
		j.launch(sum16Name(vh)+"summary", "gdn_summary_walk_mma16", grid3(2*dHead/vh, len(sum), HV), 256,
			smemOf("walk_mma_smem", vh), append(sumArgs("kn", sum16Name(vh)), i32a(HQK), i32a(HV), i32a(vh))...)
	}
	// The v5 walks read kn (QK heads) where the reference reads kt.
	in16 := append([]string{}, in...)
	in16[2] = buf("kn")
	for _, w := range walks {
		p := w.name()
		args := append(append([]string{}, in16...), buf(p+"h"), buf(p+"vnew"), buf(p+"final"), buf(p+"h16"),
			buf(p+"vnew16"), i32a(HQK), i32a(HV), i32a(w.vh))
		if w.drop == 0 {
			j.launch(p, "gdn_state_walk_mma16", grid3(dHead/w.vh, l.NS, HV), 256, smemOf("walk_mma_smem", w.vh), args...)
		} else {
			j.launch(p, "gdn_state_walk_mma16_drop", grid3(dHead/w.vh, l.NS, HV), 256, smemOf("walk_mma_smem", w.vh),
				append(args, i32a(w.drop))...)
		}
	}
}

func walkNames(walks []mma16Walk) []string {
	var out []string
	for _, w := range walks {
		out = append(out, w.name())
	}
	return out
}

// checkWalks16 checks the walks (see TestMMA16OnCPU) and returns the
// output's fp32 inputs: qn, kn, gcum and the reference walk's H and V'.
func checkWalks16(t *testing.T, d *gdnData, r *result, walks []mma16Walk, sums mma16Sums) *outInputs {
	l, HV := d.l, d.c.hv
	for _, n := range []string{"ref_h", "ref_vnew", "ref_final", "ref_out_p", "ref_out_q"} {
		r.f32s(n) // fully written, no NaN or Inf
	}
	for _, vh := range sums.vhs {
		for _, n := range []string{"out_p", "out_q"} {
			p := sum16Name(vh) + n
			r.f32s(p)
			require.Equal(t, r.raw["ref_"+n], r.raw[p], "%s: not gdn_summary_walk_mma's bits (vh %d) on the prep's Kt",
				p, sums.ref)
		}
	}
	in := &outInputs{qn: r.f32s("qn"), kn: r.f32s("kn"), gcum: r.f32s("gcum"), vnew: r.f32s("ref_vnew"),
		h: r.f32s("ref_h"), qRstd: r.f32s("q_rstd")}
	// The bf16 tiles the walk must write: H^T and V'^T of the fp32 reference.
	want16 := bf16Tiles(l, HV, in.h, in.vnew)
	for _, w := range walks {
		p := w.name()
		for bit, n := range []string{"h", "vnew", "h16", "vnew16"} {
			if w.drop&(1<<bit) != 0 {
				requireAllPoison(t, r.raw[p+n], p+n)
				continue
			}
			if bit < 2 {
				r.f32s(p + n)
				require.Equal(t, r.raw["ref_"+n], r.raw[p+n], "%s: not gdn_state_walk_mma's bits", p+n)
			} else {
				r.bf16s(p + n) // fully written, no NaN or Inf
				requireSameBF16(t, want16[n], r.raw[p+n], p+n)
			}
		}
		r.f32s(p + "final")
		require.Equal(t, r.raw["ref_final"], r.raw[p+"final"], "%s: the final states are not gdn_state_walk_mma's bits", p)
	}
	return in
}

// bf16Tiles returns the bf16 tiles gdn_state_walk_mma16 writes for the fp32 chunk states h and V'
// vnew of a walk ("h16": each chunk's H transposed; "vnew16": V' transposed, 0 past a chunk's end).
func bf16Tiles(l *layout, HV int, h, vnew []float32) map[string][]byte {
	h16 := make([]bf16.BF16, l.NC*HV*dHead*dHead)
	v16 := make([]bf16.BF16, l.NC*HV*dHead*chunk)
	for ci := 0; ci < l.NC; ci++ {
		t0, n := int(l.chunkTok0[ci]), int(l.chunkLen[ci])
		for hv := 0; hv < HV; hv++ {
			blk := ci*HV + hv
			for key := 0; key < dHead; key++ {
				for col := 0; col < dHead; col++ {
					h16[(blk*dHead+col)*dHead+key] = bf16.Float32ToBF16(h[(blk*dHead+key)*dHead+col])
				}
			}
			for col := 0; col < dHead; col++ {
				for i := 0; i < n; i++ {
					v16[(blk*dHead+col)*chunk+i] = bf16.Float32ToBF16(vnew[((t0+i)*HV+hv)*dHead+col])
				}
			}
		}
	}
	return map[string][]byte{"h16": bf16.Bytes(h16), "vnew16": bf16.Bytes(v16)}
}

// requireAllPoison checks that a buffer was never written.
func requireAllPoison(t *testing.T, b []byte, name string) {
	t.Helper()
	require.NotNil(t, b, "no output %s", name)
	for i := 0; i+4 <= len(b); i += 4 {
		u := binary.LittleEndian.Uint32(b[i:])
		if u != poisonF32 && u != poisonBF16x2 {
			require.Failf(t, "written", "%s: word %d is %#x: a null output was written", name, i/4, u)
		}
	}
}

// requireSameBF16 compares two bf16 buffers element by element.
func requireSameBF16(t *testing.T, want, got []byte, name string) {
	t.Helper()
	require.Equal(t, len(want), len(got), "%s: size", name)
	for e := 0; e < len(want)/2; e++ {
		if w, g := bf16Of(want, e), bf16Of(got, e); w != g {
			require.Failf(t, "bf16 mismatch", "%s[%d]: %#04x (%g), want %#04x (%g)", name, e, uint16(g), g.Float32(),
				uint16(w), w.Float32())
		}
	}
}

// gapped is the output job's token layout: chunk c's row i is token
// tok0[c] + i of the buffer, with gapRows rows after every chunk.
type gapped struct {
	T    int
	tok0 []int32
}

// addOutput16 adds gdn_output_mma16 (and, with probe, its fp32 probe) on
// the walk's h16 and vnew16, over a copy of qn, kn and gcum laid out with
// gapRows NaN rows after each chunk; the outputs are poisoned first.
func addOutput16(j *job, d *gdnData, in *outInputs, h16, vnew16 []byte, probe bool) *gapped {
	c, l := d.c, d.l
	HQK, HV := c.hqk, c.hv
	g := &gapped{T: l.T + gapRows*l.NC}
	nan := math.Float32frombits(poisonF32)
	qn, kn := fill(g.T*HQK*dHead, nan), fill(g.T*HQK*dHead, nan)
	gcum := fill(g.T*HV, nan)
	for ci := 0; ci < l.NC; ci++ {
		t0, n := int(l.chunkTok0[ci]), int(l.chunkLen[ci])
		tg := t0 + gapRows*ci
		g.tok0 = append(g.tok0, int32(tg))
		copy(qn[tg*HQK*dHead:], in.qn[t0*HQK*dHead:(t0+n)*HQK*dHead])
		copy(kn[tg*HQK*dHead:], in.kn[t0*HQK*dHead:(t0+n)*HQK*dHead])
		copy(gcum[tg*HV:], in.gcum[t0*HV:(t0+n)*HV])
	}
	j.f32("qn", qn)
	j.f32("kn", kn)
	j.f32("gcum", gcum)
	j.load("h16", h16)
	j.load("vnew16", vnew16)
	j.i32("chunk_tok0", g.tok0)
	j.i32("chunk_len", l.chunkLen)
	args := []string{buf("qn"), buf("kn"), buf("gcum"), buf("vnew16"), buf("h16"), buf("chunk_tok0"), buf("chunk_len")}
	tail := func(o string) []string {
		return append(append([]string{}, args...), buf(o), i32a(HQK), i32a(HV), f32a(d.scale))
	}
	j.out("o", 2*g.T*HV*dHead)
	j.poison("o", poisonBF16x2)
	j.launch("output_mma16", "gdn_output_mma16", grid3(l.NC, HV, 1), 256, "kOutputMMA16Smem", tail("o")...)
	// The grouped form: a CTA a (chunk, QK head); checkOutput16 requires its bits to be gdn_output_mma16's.
	j.out("og", 2*g.T*HV*dHead)
	j.poison("og", poisonBF16x2)
	j.launch("output_mma16g", "gdn_output_mma16g", grid3(l.NC, HQK, 1), 256, "kOutputMMA16Smem", tail("og")...)
	// The normalising form: the raw bf16 q rows (the l2norm's input, laid out like qn but with a padded row
	// stride), normalised in the kernel, and K from the walk planes; checkOutput16 requires
	// gdn_output_mma16g's bits.
	// Twice: rows 16-byte aligned (stride + 8: staged by cp.async) and only 8-byte aligned (stride + 4:
	// loaded from global memory).
	l2 := 0
	if c.l2norm {
		l2 = 1
	}
	// The normalising forms read K as the prep's K^T walk planes: test_walk_planes' from the gapped kn (its
	// -W planes, from zeros, unused).
	j.f32("w0", make([]float32, g.T*HV*dHead))
	outPlanes(j, "", l.NC, HQK, HV)
	j.launch("planes", "test_walk_planes", grid3(l.NC, HV, 1), 256, "0", buf("w0"), buf("kn"), buf("chunk_tok0"),
		buf("chunk_len"), buf("wp"), buf("wk"), i32a(HQK), i32a(HV))
	for _, v := range []struct{ sfx, pad int }{{0, 8}, {1, 4}} {
		qs := HQK*dHead + v.pad
		qraw := make([]bf16.BF16, g.T*qs)
		for i := range qraw {
			qraw[i] = bf16.BF16(poisonBF16) // NaN: gap rows and padding never read
		}
		for ci := 0; ci < l.NC; ci++ {
			t0, n := int(l.chunkTok0[ci]), int(l.chunkLen[ci])
			tg := t0 + gapRows*ci
			for i := 0; i < n; i++ {
				copy(qraw[(tg+i)*qs:(tg+i)*qs+HQK*dHead], d.qkv[d.qOff+(t0+i)*d.qStride:])
			}
		}
		sfx := []string{"", "_u8"}[v.sfx]
		j.bf16("qraw"+sfx, qraw)
		j.out("ogn"+sfx, 2*g.T*HV*dHead)
		j.poison("ogn"+sfx, poisonBF16x2)
		j.launch("output_mma16gn"+sfx, "gdn_output_mma16gn", grid3(l.NC, HQK, 1), 256, "kOutputMMA16Smem",
			buf("qraw"+sfx), buf("wk"), i32a(qs), i32a(l2), buf("gcum"), buf("vnew16"), buf("h16"),
			buf("chunk_tok0"), buf("chunk_len"), buf("ogn"+sfx), i32a(HQK), i32a(HV), f32a(d.scale))
		// Kept for a backward: gdn_output_mma16gnk also writes the normalised q rows and their rstd, where
		// gdn_l2norm_fwd writes qn and q_rstd (checkOutput16 compares them with the l2norm's).
		j.out("ognk"+sfx, 2*g.T*HV*dHead)
		j.poison("ognk"+sfx, poisonBF16x2)
		j.out("qn_out"+sfx, 4*g.T*HQK*dHead)
		j.poison("qn_out"+sfx, poisonF32)
		j.out("q_rstd_out"+sfx, 4*g.T*HQK)
		j.poison("q_rstd_out"+sfx, poisonF32)
		j.launch("output_mma16gnk"+sfx, "gdn_output_mma16gnk", grid3(l.NC, HQK, 1), 256, "kOutputMMA16Smem",
			buf("qraw"+sfx), buf("wk"), i32a(qs), i32a(l2), buf("gcum"), buf("vnew16"), buf("h16"),
			buf("chunk_tok0"), buf("chunk_len"), buf("ognk"+sfx), i32a(HQK), i32a(HV), f32a(d.scale), buf("qn_out"+sfx),
			buf("q_rstd_out"+sfx))
		// For a backward on q's raw rows (kcp's RawQK): qn_out null, q_rstd alone.
		j.out("ognr"+sfx, 2*g.T*HV*dHead)
		j.poison("ognr"+sfx, poisonBF16x2)
		j.out("q_rstd_only"+sfx, 4*g.T*HQK)
		j.poison("q_rstd_only"+sfx, poisonF32)
		j.launch("output_mma16gnr"+sfx, "gdn_output_mma16gnk", grid3(l.NC, HQK, 1), 256, "kOutputMMA16Smem",
			buf("qraw"+sfx), buf("wk"), i32a(qs), i32a(l2), buf("gcum"), buf("vnew16"), buf("h16"),
			buf("chunk_tok0"), buf("chunk_len"), buf("ognr"+sfx), i32a(HQK), i32a(HV), f32a(d.scale), nullBuf(),
			buf("q_rstd_only"+sfx))
	}
	if probe {
		j.out("o32", 4*g.T*HV*dHead)
		j.poison("o32", poisonF32)
		j.launch("output_mma16_probe", "gdn_output_mma16_probe", grid3(l.NC, HV, 1), 256, "kOutputMMA16Smem",
			tail("o32")...)
	}
	return g
}

func fill(n int, v float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// ungap returns the chunk rows of a gapped [g.T, HV, 128] output in token
// order ([T, HV, 128]) and checks that every gap row still holds the poison
// word of its type (4-byte words: fp32, or two bf16).
func ungap(t *testing.T, d *gdnData, g *gapped, raw []byte, elemBytes int, poison uint32, name string) []byte {
	return ungapRows(t, d, g, raw, d.c.hv*dHead*elemBytes, poison, name)
}

// ungapRows is ungap for rows of row bytes a token (a per-QK-head array, say).
func ungapRows(t *testing.T, d *gdnData, g *gapped, raw []byte, row int, poison uint32, name string) []byte {
	l := d.l
	out := make([]byte, 0, l.T*row)
	for ci := 0; ci < l.NC; ci++ {
		tg, n := int(g.tok0[ci]), int(l.chunkLen[ci])
		out = append(out, raw[tg*row:(tg+n)*row]...)
		for r := tg + n; r < tg+n+gapRows; r++ {
			for b := r * row; b < (r+1)*row; b += 4 {
				require.Equal(t, poison, binary.LittleEndian.Uint32(raw[b:]), "%s: gap row %d (after chunk %d) written", name, r, ci)
			}
		}
	}
	return out
}

// roundedBF16 returns v rounded to bf16 (nearest even), as float32.
func roundedBF16(v []float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = bf16.Round(x)
	}
	return out
}

// checkOutput16 checks the output job (see TestMMA16OnCPU) and notes the
// errors: against gdnref.Output from H and V' as the kernel reads them
// (bf16) and from the walk's fp32 H and V' (what the hand-over costs), and
// the parts of the latter that H's and V”s rounding cause alone.
func checkOutput16(t *testing.T, et *errTable, d *gdnData, in *outInputs, g *gapped, r *result, probe bool) {
	rounded := func(h, v bool) []float64 {
		x := *in
		if h {
			x.h = roundedBF16(in.h)
		}
		if v {
			x.vnew = roundedBF16(in.vnew)
		}
		return outputRef(t, d, &x)
	}
	want := rounded(false, false) // the fp32 hand-over
	wantBF := rounded(true, true) // what the kernel reads
	et.note("ref: H bf16 alone", relErr(rounded(true, false), want))
	et.note("ref: V' bf16 alone", relErr(rounded(false, true), want))
	et.note("ref: H, V' bf16", relErr(wantBF, want))

	res := &result{t: t, raw: map[string][]byte{"o": ungap(t, d, g, r.raw["o"], 2, poisonBF16x2, "o")}}
	// gdn_output_mma16g (a CTA a QK head, Q, K and the scores once) writes the same rows, bit for bit,
	// and nothing in the gaps.
	require.Equal(t, res.raw["o"], ungap(t, d, g, r.raw["og"], 2, poisonBF16x2, "og"),
		"gdn_output_mma16g: not gdn_output_mma16's bits")
	// gdn_output_mma16gn (q normalised in the kernel from its bf16 rows, K from the walk planes) writes the same rows too,
	// whether its rows are staged by cp.async (16-byte aligned) or loaded from global memory.
	require.Equal(t, res.raw["o"], ungap(t, d, g, r.raw["ogn"], 2, poisonBF16x2, "ogn"),
		"gdn_output_mma16gn: not gdn_output_mma16g's bits")
	require.Equal(t, res.raw["o"], ungap(t, d, g, r.raw["ogn_u8"], 2, poisonBF16x2, "ogn_u8"),
		"gdn_output_mma16gn (8-byte aligned rows): not gdn_output_mma16g's bits")
	// Kept for a backward (gdn_output_mma16gnk, qn_out and q_rstd given): the same output, and the q rows and rstd of
	// gdn_l2norm_fwd bit for bit (its qn, q_rstd: in.qn, in.qRstd), nothing in the gaps.
	for _, sfx := range []string{"", "_u8"} {
		require.Equal(t, res.raw["o"], ungap(t, d, g, r.raw["ognk"+sfx], 2, poisonBF16x2, "ognk"+sfx),
			"gdn_output_mma16gnk%s: not gdn_output_mma16g's bits", sfx)
		HQK := d.c.hqk
		require.Equal(t, f32Bytes(in.qn), ungapRows(t, d, g, r.raw["qn_out"+sfx], 4*HQK*dHead, poisonF32, "qn_out"+sfx),
			"gdn_output_mma16gnk%s: qn is not gdn_l2norm_fwd's", sfx)
		require.Equal(t, f32Bytes(in.qRstd), ungapRows(t, d, g, r.raw["q_rstd_out"+sfx], 4*HQK, poisonF32, "q_rstd_out"+sfx),
			"gdn_output_mma16gnk%s: q_rstd is not gdn_l2norm_fwd's", sfx)
		require.Equal(t, res.raw["o"], ungap(t, d, g, r.raw["ognr"+sfx], 2, poisonBF16x2, "ognr"+sfx),
			"gdn_output_mma16gnk%s with q_rstd alone: not gdn_output_mma16g's bits", sfx)
		require.Equal(t, f32Bytes(in.qRstd), ungapRows(t, d, g, r.raw["q_rstd_only"+sfx], 4*HQK, poisonF32, "q_rstd_only"+sfx),
			"gdn_output_mma16gnk%s with qn_out null: q_rstd is not gdn_l2norm_fwd's", sfx)
	}
	var o32 []float32
	if probe { // first: its fp32 shows the kernel's own error
		res.raw["o32"] = ungap(t, d, g, r.raw["o32"], 4, poisonF32, "o32")
		o32 = res.f32s("o32")
		requireOutClose(t, et, "probe o32 vs bf16 H, V'", widen(o32), wantBF, outMMATol, 0)
		requireRel(t, et, "probe o32 vs fp32 H, V'", widen(o32), want, mma16HandOverTol)
	}
	o := bf16Widen(res.bf16s("o")) // every chunk row written, no NaN or Inf
	requireOutClose(t, et, "entry o vs bf16 H, V'", o, wantBF, math.Ldexp(1, -9)+2e-5, 1)
	requireRel(t, et, "entry o vs fp32 H, V'", o, want, mma16TotalTol)
	// The entry is the probe's body: its bf16 output is the probe's fp32, rounded.
	for e := range o32 {
		require.Equal(t, bf16.Float32ToBF16(o32[e]), bf16Of(res.raw["o"], e), "o[%d] is not the bf16 of the fp32 probe %g",
			e, o32[e])
	}
}
