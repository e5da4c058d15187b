package cpuemu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// The grouped chunk gradients of ptx/src/gdn_chunk_grads_mma5.cu
// (gdn_chunk_grads_mma5: one CTA per chunk and QK head, its value heads in
// ascending order, dq and dk summed in registers and put through the l2norm
// backward in the CTA) on the emulator, against internal/gdnref.ChunkGrads per
// value head, summed over the QK head's value heads and pushed through
// gdnref.L2NormBackward in float64; beside the fp32 gdn_chunk_grads +
// gdn_qk_bwd pair run on the same buffers.

// The bounds are gdn_chunk_grads_mma's (gradsMMATol, gradsMMAElemTol): the
// kernel runs the same products; the sum over value heads and the l2norm
// backward add fp32 roundings only.
//
// gdn_chunk_grads_mma7 (the same body with one bf16 product of the hi halves
// where mma5 runs two or three) is held to gradsMMA7Tol and gradsMMA7ElemTol:
// its operands lose their low 16 bits, so its errors are those of bf16 inputs
// (~2^-9 an operand), against the end-to-end 1e-2 (dq, dk, dv) and
// 5e-3 (dg, dbeta).
const (
	// gradsMMA7Tol bounds mma7's normwise relative error of every output
	// (measured worst of the cases on 2026-12-02: see the kernel's header).
	gradsMMA7Tol = 4e-3
	// gradsMMA7ElemTol bounds its worst element over the rms.
	gradsMMA7ElemTol = 0.1
)

type gradsMMA5Case struct {
	name               string
	lens               []int // chunk lengths (each chunk followed by gradsMMAGap tokens)
	hqk, hv            int
	vPad, dvPad, dqPad int // v, dv and dq / dk row strides = H*128 + pad
	deferred           bool
	l2norm             bool
	twin               bool // chunk 1's inputs are chunk 0's: its outputs must be chunk 0's bits
	seed               uint64
}

// gradsMMA5Cases: chunks of 1, 63, 64, 17 and 40 rows at HQK 1 / HV 2 with
// cp.async landing at issue; chunks of 64 and 5 rows at HQK 2 / HV 6 (three
// value heads a QK head) with cp.async landing only at its wait
// (EMU_CP_ASYNC=deferred); one chunk of 33 rows without the l2norm (q_rstd,
// k_rstd all NaN: never read) and with an odd v stride (v's bf16 pairs then
// take two 2-byte loads). v's rows: the first case's stride is even but not
// a multiple of 8 (one 4-byte load a pair), the second's a multiple of 8
// (16-byte units, four a thread loaded together). 24 value-head passes of
// ~0.7 s each.
var gradsMMA5Cases = []gradsMMA5Case{
	{name: "hqk1_hv2_immediate", lens: []int{1, 63, 64, 17, 40}, hqk: 1, hv: 2, vPad: 6, dvPad: 6, dqPad: 5, l2norm: true, seed: 51},
	{name: "hqk2_hv6_deferred", lens: []int{64, 5}, hqk: 2, hv: 6, dqPad: 3, deferred: true, l2norm: true, seed: 52},
	{name: "hqk1_hv2_nol2norm", lens: []int{33}, hqk: 1, hv: 2, vPad: 3, dvPad: 2, dqPad: 2, seed: 53},
	// two chunks of equal inputs in neighbouring blocks, which the emulator runs in opposite thread orders:
	// a missing barrier between warps gives them different bits (the tolerances may not see it)
	{name: "twin_hqk1_hv3", lens: []int{64, 64}, hqk: 1, hv: 3, l2norm: true, twin: true, seed: 54},
}

// TestMMA5ChunkGradsOnCPU runs gdn_chunk_grads_mma5 (and gdn_chunk_grads +
// gdn_qk_bwd) on the cases above: every element of a chunk's rows of dq, dk
// (columns < HQK*128), dv (columns < HV*128), dg, dbeta written (poison gone,
// no NaN/Inf), the gap rows and the stride padding still poisoned; dq, dk, dv,
// dg, dbeta within gradsMMATol (normwise) and gradsMMAElemTol (worst element
// over the rms) of float64.
func TestMMA5ChunkGradsOnCPU(t *testing.T) {
	built(t, "runner_grads_mma5")
	for i := range gradsMMA5Cases {
		c := &gradsMMA5Cases[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runGradsMMA5(t, c)
		})
	}
}

func runGradsMMA5(t *testing.T, c *gradsMMA5Case) {
	bin := built(t, "runner_grads_mma5")
	rng := rand.New(rand.NewPCG(c.seed, 11))
	ch := newGappedChunks(c.lens, gradsMMAGap)
	tok0, clen, T, owned := ch.tok0, ch.clen, ch.T, ch.owned
	NC, HQK, HV := len(tok0), c.hqk, c.hv
	grp := HV / HQK
	scale := float32(1 / math.Sqrt(dHead))

	// q, k: raw rows N(0, 1) times a row factor in [0.5, 2], normalised in
	// float64 (gdnref.L2Norm); the kernel reads the fp32 rows and inverse norms,
	// the reference the float64 ones. NaN in the gaps (and every rstd NaN
	// without the l2norm: the kernel must not read them).
	qY, kY := make([]float64, T*HQK*dHead), make([]float64, T*HQK*dHead)
	qInv, kInv := make([]float64, T*HQK), make([]float64, T*HQK)
	for i := range qY {
		qY[i], kY[i] = math.NaN(), math.NaN()
	}
	for i := range qInv {
		qInv[i], kInv[i] = math.NaN(), math.NaN()
	}
	for ci := range tok0 {
		t0, n := int(tok0[ci]), int(clen[ci])
		for qh := 0; qh < HQK; qh++ {
			for _, p := range []struct{ y, inv []float64 }{{qY, qInv}, {kY, kInv}} {
				raw := mat.NewDense(n, dHead, nil)
				for i := 0; i < n; i++ {
					f := 0.5 + 1.5*rng.Float64()
					for x := 0; x < dHead; x++ {
						raw.Set(i, x, f*rng.NormFloat64())
					}
				}
				y, inv := gdnref.L2Norm(raw)
				for i := 0; i < n; i++ {
					copy(p.y[((t0+i)*HQK+qh)*dHead:][:dHead], y.RawRowView(i))
					if c.l2norm {
						p.inv[(t0+i)*HQK+qh] = inv[i]
					}
				}
			}
		}
	}
	narrow := func(v []float64) []float32 {
		out := make([]float32, len(v))
		for i, x := range v {
			out[i] = float32(x)
		}
		return out
	}
	gi := newGradsInputs(ch, rng, HV, c.vPad, c.seed)
	if c.twin { // chunk 1's inputs are chunk 0's
		require.Len(t, tok0, 2)
		require.Equal(t, clen[0], clen[1])
		a, b := int(tok0[0]), int(tok0[1])
		rows := func(n, w int, cp func(dst, src, w int)) {
			for i := 0; i < n; i++ {
				cp((b+i)*w, (a+i)*w, w)
			}
		}
		n := int(clen[0])
		rows(n, HQK*dHead, func(d, s, w int) { copy(qY[d:d+w], qY[s:s+w]); copy(kY[d:d+w], kY[s:s+w]) })
		rows(n, HQK, func(d, s, w int) { copy(qInv[d:d+w], qInv[s:s+w]); copy(kInv[d:d+w], kInv[s:s+w]) })
		rows(n, HV*dHead, func(d, s, w int) {
			copy(gi.vnew[d:d+w], gi.vnew[s:s+w])
			copy(gi.dvnew[d:d+w], gi.dvnew[s:s+w])
			copy(gi.dout[d:d+w], gi.dout[s:s+w])
		})
		rows(n, gi.vStride, func(d, s, w int) { copy(gi.v[d:d+w], gi.v[s:s+w]) })
		rows(n, HV, func(d, s, w int) { copy(gi.gcum[d:d+w], gi.gcum[s:s+w]); copy(gi.beta[d:d+w], gi.beta[s:s+w]) })
		st := HV * dHead * dHead // one chunk's states, every value head
		copy(gi.h[st:2*st], gi.h[:st])
		copy(gi.dChunk[st:2*st], gi.dChunk[:st])
	}
	qn, kn, qRstd, kRstd := narrow(qY), narrow(kY), narrow(qInv), narrow(kInv)
	vnew, dvnew, dout, vStride, vbuf := gi.vnew, gi.dvnew, gi.dout, gi.vStride, gi.v
	gcum, beta, hst, dch := gi.gcum, gi.beta, gi.h, gi.dChunk

	j := newJob(t)
	if c.deferred {
		j.env = []string{cpAsyncDeferred}
	}
	j.i32("chunk_tok0", tok0)
	j.i32("chunk_len", clen)
	j.f32("qn", qn)
	j.f32("kn", kn)
	j.f32("q_rstd", qRstd)
	j.f32("k_rstd", kRstd)
	j.bf16("v", vbuf)
	j.f32("gcum", gcum)
	j.f32("beta", beta)
	j.f32("h", hst)
	j.f32("vnew", vnew)
	j.f32("d_chunk", dch)
	j.f32("dvnew", dvnew)
	j.bf16("dout", dout)
	dvStride, dqStride := HV*dHead+c.dvPad, HQK*dHead+c.dqPad
	l2 := 0
	if c.l2norm {
		l2 = 1
	}
	// out: every output, its elements and the columns of a token written
	// (the rest of a row is stride padding).
	type out struct {
		name         string
		elems, width int
	}
	outs := []out{{"dq", T * dqStride, HQK * dHead}, {"dk", T * dqStride, HQK * dHead}, {"dv", T * dvStride, HV * dHead},
		{"dg", T * HV, HV}, {"dbeta", T * HV, HV}}
	// launches declares, poisoned, the outputs of one kernel's two launches:
	// fp32 (every output, suffix f32), and bf16 dq, dk, dv (suffix b16; the
	// fp32 pointers null: written, they would fault) with dg, dbeta of their
	// own (suffix gates).
	launches := func(f32, b16, gates string) {
		for _, o := range outs {
			j.out(o.name+f32, 4*o.elems)
			j.poison(o.name+f32, poisonF32)
		}
		for _, o := range outs[:3] {
			j.out(o.name+b16, 2*o.elems+2*(o.elems%2))
			j.poison(o.name+b16, poisonBF16x2)
		}
		for _, o := range outs[3:] {
			j.out(o.name+gates, 4*o.elems)
			j.poison(o.name+gates, poisonF32)
		}
	}
	// gdn_chunk_grads_mma5: suffixes "" (fp32) and 16 / _b (bf16); the
	// ungrouped gdn_chunk_grads + gdn_qk_bwd: _fp32.
	launches("", "16", "_b")
	for _, o := range outs {
		j.out(o.name+"_fp32", 4*o.elems)
		j.poison(o.name+"_fp32", poisonF32)
	}
	// gdn_chunk_grads_mma6 on V' and dV' as token slots made here from the same
	// fp32 rows, both launches again: outputs with the suffixes _6 (fp32) and
	// 16_6 / _b6 (bf16), which must be the mma5 launches' bits.
	j.load("vnewp", tokenSlots(vnew, tok0, clen, HV))
	j.load("dvnewp", tokenSlots(dvnew, tok0, clen, HV))
	launches("_6", "16_6", "_b6")
	// gdn_chunk_grads_mma7 (bf16 hi products) on the same token slots, both
	// launches: suffixes _7 (fp32) and 16_7 / _b7 (bf16).
	launches("_7", "16_7", "_b7")
	// gdn_chunk_grads_mma8 (mma7 on bf16 H^T, D^T, V'^T and dV'^T, made here
	// as the state walk makes h16 and vnew16 and the tape walk d16 and
	// dvnew16), both launches: suffixes _8 and 16_8 / _b8.
	j.bf16("h16", stateT16(hst, NC, HV))
	j.bf16("d16", stateT16(dch, NC, HV))
	j.bf16("vnew16", vnewT16(vnew, tok0, clen, HV))
	j.bf16("dvnew16", vnewT16(dvnew, tok0, clen, HV))
	launches("_8", "16_8", "_b8")
	// gdn_chunk_grads_mma6r and mma8r on q's and k's raw bf16 rows (here bf16(qn), bf16(kn)) with q_rstd, k_rstd,
	// beside mma6 and mma8 on fp32(raw rstd) (1 without the l2norm), the rows gdn_l2norm_fwd would write from
	// them: the same bits (fp32 outputs, suffixes _6q / _6r and _8q / _8r).
	rawRows := func(y []float32, rstd []float32) (raw []bf16.BF16, yr []float32) {
		raw, yr = make([]bf16.BF16, len(y)), make([]float32, len(y))
		for i, x := range y {
			raw[i] = bf16.Float32ToBF16(x)
			f := float32(1)
			if c.l2norm {
				f = rstd[i/dHead]
			}
			yr[i] = raw[i].Float32() * f
		}
		return raw, yr
	}
	qRaw, qnRaw := rawRows(qn, qRstd)
	kRaw, knRaw := rawRows(kn, kRstd)
	j.bf16("q_raw", qRaw)
	j.bf16("k_raw", kRaw)
	j.f32("qn_raw", qnRaw)
	j.f32("kn_raw", knRaw)
	for _, sfx := range []string{"_6q", "_6r", "_8q", "_8r"} {
		for _, o := range outs {
			j.out(o.name+sfx, 4*o.elems)
			j.poison(o.name+sfx, poisonF32)
		}
	}
	j.out("dqv", 4*T*HV*dHead)
	j.out("dkv", 4*T*HV*dHead)
	common := []string{buf("qn"), buf("kn"), buf("v"), i32a(vStride), buf("gcum"), buf("beta"), buf("h"), buf("vnew"),
		buf("d_chunk"), buf("dvnew"), buf("dout"), buf("chunk_tok0"), buf("chunk_len")}
	j.launch("grads_mma5", "gdn_chunk_grads_mma5", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common...), buf("q_rstd"), buf("k_rstd"), buf("dq"), buf("dk"), i32a(dqStride),
			buf("dv"), i32a(dvStride), buf("dg"), buf("dbeta"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			nullBuf(), nullBuf(), nullBuf())...)
	j.launch("grads_mma5_bf16", "gdn_chunk_grads_mma5", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common...), buf("q_rstd"), buf("k_rstd"), nullBuf(), nullBuf(), i32a(dqStride),
			nullBuf(), i32a(dvStride), buf("dg_b"), buf("dbeta_b"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			buf("dq16"), buf("dk16"), buf("dv16"))...)
	common6 := append([]string{}, common...)
	common6[7], common6[9] = buf("vnewp"), buf("dvnewp")
	j.launch("grads_mma6", "gdn_chunk_grads_mma6", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common6...), buf("q_rstd"), buf("k_rstd"), buf("dq_6"), buf("dk_6"), i32a(dqStride),
			buf("dv_6"), i32a(dvStride), buf("dg_6"), buf("dbeta_6"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			nullBuf(), nullBuf(), nullBuf())...)
	j.launch("grads_mma6_bf16", "gdn_chunk_grads_mma6", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common6...), buf("q_rstd"), buf("k_rstd"), nullBuf(), nullBuf(), i32a(dqStride),
			nullBuf(), i32a(dvStride), buf("dg_b6"), buf("dbeta_b6"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			buf("dq16_6"), buf("dk16_6"), buf("dv16_6"))...)
	j.launch("grads_mma7", "gdn_chunk_grads_mma7", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common6...), buf("q_rstd"), buf("k_rstd"), buf("dq_7"), buf("dk_7"), i32a(dqStride),
			buf("dv_7"), i32a(dvStride), buf("dg_7"), buf("dbeta_7"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			nullBuf(), nullBuf(), nullBuf())...)
	j.launch("grads_mma7_bf16", "gdn_chunk_grads_mma7", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common6...), buf("q_rstd"), buf("k_rstd"), nullBuf(), nullBuf(), i32a(dqStride),
			nullBuf(), i32a(dvStride), buf("dg_b7"), buf("dbeta_b7"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			buf("dq16_7"), buf("dk16_7"), buf("dv16_7"))...)
	common8 := append([]string{}, common6...)
	common8[6], common8[7], common8[8], common8[9] = buf("h16"), buf("vnew16"), buf("d16"), buf("dvnew16")
	j.launch("grads_mma8", "gdn_chunk_grads_mma8", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common8...), buf("q_rstd"), buf("k_rstd"), buf("dq_8"), buf("dk_8"), i32a(dqStride),
			buf("dv_8"), i32a(dvStride), buf("dg_8"), buf("dbeta_8"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			nullBuf(), nullBuf(), nullBuf())...)
	j.launch("grads_mma8_bf16", "gdn_chunk_grads_mma8", grid3(NC, HQK, 1), 256, "kGradMMA5Smem",
		append(append([]string{}, common8...), buf("q_rstd"), buf("k_rstd"), nullBuf(), nullBuf(), i32a(dqStride),
			nullBuf(), i32a(dvStride), buf("dg_b8"), buf("dbeta_b8"), i32a(HQK), i32a(HV), f32a(scale), i32a(l2),
			buf("dq16_8"), buf("dk16_8"), buf("dv16_8"))...)
	rawLaunch := func(label, entry, sfx string, head []string, rest []string) {
		j.launch(label, entry, grid3(NC, HQK, 1), 256, "kGradMMA5Smem", slices.Concat(head, rest, []string{buf("q_rstd"),
			buf("k_rstd"), buf("dq" + sfx), buf("dk" + sfx), i32a(dqStride), buf("dv" + sfx), i32a(dvStride), buf("dg" + sfx),
			buf("dbeta" + sfx), i32a(HQK), i32a(HV), f32a(scale), i32a(l2), nullBuf(), nullBuf(), nullBuf()})...)
	}
	rawHead := []string{buf("q_raw"), buf("k_raw"), i32a(HQK * dHead)}
	rawLaunch("grads_mma6q", "gdn_chunk_grads_mma6", "_6q", []string{buf("qn_raw"), buf("kn_raw")}, common6[2:])
	rawLaunch("grads_mma6r", "gdn_chunk_grads_mma6r", "_6r", rawHead, common6[2:])
	rawLaunch("grads_mma8q", "gdn_chunk_grads_mma8", "_8q", []string{buf("qn_raw"), buf("kn_raw")}, common8[2:])
	rawLaunch("grads_mma8r", "gdn_chunk_grads_mma8r", "_8r", rawHead, common8[2:])
	j.launch("grads_fp32", "gdn_chunk_grads", grid3(NC, HV, 1), 256, "kGradSmem",
		append(append([]string{}, common...), buf("dqv"), buf("dkv"), buf("dv_fp32"), i32a(dvStride), buf("dg_fp32"),
			buf("dbeta_fp32"), i32a(HQK), i32a(HV), f32a(scale))...)
	j.launch("qk_bwd_fp32", "gdn_qk_bwd", grid1(ceilDiv(T*HQK*2, 8)), 256, "0",
		buf("dqv"), buf("dkv"), buf("qn"), buf("kn"), buf("q_rstd"), buf("k_rstd"), buf("dq_fp32"), buf("dk_fp32"),
		i32a(dqStride), i32a(T), i32a(HQK), i32a(HV), i32a(l2))
	r := j.run(bin)
	t.Logf("runner:\n%s", r.log)
	for _, o := range outs {
		for _, m := range []string{"6", "8"} {
			require.NotEmpty(t, r.raw[o.name+"_"+m+"r"], o.name+"_"+m+"r")
			require.Equal(t, r.raw[o.name+"_"+m+"q"], r.raw[o.name+"_"+m+"r"],
				"%s: gdn_chunk_grads_mma%sr on the raw rows is not mma%s on fp32(raw rstd)", o.name, m, m)
		}
	}
	if c.twin {
		n := int(clen[0])
		checked := 0
		for name, b := range r.raw {
			var width, size int // elements a token, bytes an element
			switch {
			case strings.HasPrefix(name, "dqv"), strings.HasPrefix(name, "dkv"):
				width, size = HV*dHead, 4
			case strings.HasPrefix(name, "dq"), strings.HasPrefix(name, "dk"):
				width, size = dqStride, 4
			case strings.HasPrefix(name, "dv"):
				width, size = dvStride, 4
			case strings.HasPrefix(name, "dg"), strings.HasPrefix(name, "dbeta"):
				width, size = HV, 4
			default:
				continue
			}
			if strings.Contains(name, "16") {
				size = 2
			}
			a0, a1, l := int(tok0[0])*width*size, int(tok0[1])*width*size, n*width*size
			require.GreaterOrEqualf(t, len(b), a1+l, "%s: shorter than two chunks", name)
			require.Equalf(t, b[a0:a0+l], b[a1:a1+l], "%s: chunk 1 (inputs equal to chunk 0's, the other thread order) differs", name)
			checked++
		}
		require.Greater(t, checked, 20, "twin check: too few outputs compared")
	}

	// The kernel's outputs: a chunk's rows written and finite in the
	// head columns, everything else still poisoned. got gathers (chunk, head,
	// row, column) order, the QK head for dq / dk and the value head for the
	// rest (the fp32 pair's too; its gdn_qk_bwd also writes the gap rows).
	got := map[string][]float64{}
	for _, sfx := range []string{"", "_fp32", "_7", "_8"} {
		for _, o := range outs {
			b := r.raw[o.name+sfx]
			require.Len(t, b, 4*o.elems)
			per := o.elems / T
			if sfx != "_fp32" {
				for tk := 0; tk < T; tk++ {
					for e := 0; e < per; e++ {
						u := binary.LittleEndian.Uint32(b[4*(tk*per+e):])
						x := float64(math.Float32frombits(u))
						if !owned[tk] || e >= o.width {
							require.Equalf(t, poisonF32, u, "%s: token %d element %d outside the chunks written", o.name, tk, e)
							continue
						}
						require.NotEqualf(t, poisonF32, u, "%s: token %d element %d never written", o.name, tk, e)
						require.Falsef(t, math.IsNaN(x) || math.IsInf(x, 0), "%s: token %d element %d is %g", o.name, tk, e, x)
					}
				}
			}
			heads, width := HV, dHead
			switch o.name {
			case "dq", "dk":
				heads = HQK
			case "dg", "dbeta":
				width = 1
			}
			got[o.name+sfx] = ch.rowValues(b, heads, width, per)
		}
	}

	// The bf16 launches (mma5's, and mma7's with suffix _7): dq16, dk16, dv16
	// are the fp32 launch's values rounded to nearest even, bit for bit (what
	// gdn_f32_to_bf16 makes of them), in the same places; everything else
	// still poisoned; dg, dbeta bitwise the fp32 launch's.
	for _, k := range []struct{ sfx, s16, sb, what string }{{"", "16", "_b", "mma5"}, {"_7", "16_7", "_b7", "mma7"},
		{"_8", "16_8", "_b8", "mma8"}} {
		for _, o := range outs[:3] {
			requireBF16OfF32(t, o.name+k.s16+" ("+k.what+")", r.raw[o.name+k.sfx], r.raw[o.name+k.s16], o.elems)
		}
		for _, o := range outs[3:] {
			require.Equal(t, r.raw[o.name+k.sfx], r.raw[o.name+k.sb], "%s (%s): the bf16 launch's differs from the fp32 launch's", o.name, k.what)
		}
	}
	// gdn_chunk_grads_mma6 on token slots: mma5's bits, every output of both
	// launches (poison included: it writes exactly where mma5 writes).
	for _, o := range outs {
		require.Equal(t, r.raw[o.name], r.raw[o.name+"_6"], "%s: gdn_chunk_grads_mma6 differs from gdn_chunk_grads_mma5", o.name)
	}
	for _, o := range outs[:3] {
		require.Equal(t, r.raw[o.name+"16"], r.raw[o.name+"16_6"], "%s16: gdn_chunk_grads_mma6 differs from gdn_chunk_grads_mma5", o.name)
	}
	for _, o := range outs[3:] {
		require.Equal(t, r.raw[o.name+"_b"], r.raw[o.name+"_b6"], "%s (bf16 launch): gdn_chunk_grads_mma6 differs from gdn_chunk_grads_mma5", o.name)
	}

	// gdn_chunk_grads_mma8: mma7's products on the same operand values (rn(H),
	// rn(D), rn(V') are mma7's hi halves), so every output but dg is mma7's,
	// bit for bit, poison included; dg differs only through <D, H> (D and H as
	// bf16, summed in another order), checked against float64 below.
	for _, o := range outs {
		if o.name != "dg" {
			require.Equal(t, r.raw[o.name+"_7"], r.raw[o.name+"_8"], "%s: gdn_chunk_grads_mma8 differs from gdn_chunk_grads_mma7", o.name)
		}
	}
	for _, o := range outs[:3] {
		require.Equal(t, r.raw[o.name+"16_7"], r.raw[o.name+"16_8"], "%s16: gdn_chunk_grads_mma8 differs from gdn_chunk_grads_mma7", o.name)
	}
	// Where the grouped gradients' source runs warpgroup products (wg::, as
	// ptx/staging/parked/grads_state_wgmma.patch does for mma8's state
	// products: wgmma on sm_90a, mma.sync elsewhere and in runner_grads_mma5),
	// runner_grads_mma5_wg runs mma8's launches again with the wgmma form on
	// the emulator's wgmma (deferred to its waits in the deferred case, which
	// also fails if shared memory under an in-flight wgmma changes): every
	// output must be the portable form's bits. Without wg:: products the two
	// runners build the same code, so the rerun is skipped.
	if haveEmuWGMMA() && gradsUseWG(t) {
		var names []string
		for _, o := range outs {
			names = append(names, o.name+"_8")
		}
		for _, o := range outs[:3] {
			names = append(names, o.name+"16_8")
		}
		for _, o := range outs[3:] {
			names = append(names, o.name+"_b8")
		}
		j8 := j.subset(func(label string) bool { return strings.HasPrefix(label, "grads_mma8") }, names)
		if c.deferred {
			j8.env = append(j8.env, wgmmaDeferred)
		}
		r8 := j8.run(built(t, "runner_grads_mma5_wg"))
		for _, name := range names {
			require.Equal(t, r.raw[name], r8.raw[name], "%s: gdn_chunk_grads_mma8's wgmma form differs from its portable form", name)
		}
	}

	// The reference: gdnref.ChunkGrads per chunk and value head (each chunk a
	// segment of its own) on the float64 q, k rows and the kernel's other
	// inputs; dq, dk summed over the QK head's value heads, then (l2norm)
	// gdnref.L2NormBackward with the float64 rows and inverse norms.
	want := map[string][]float64{}
	dvW, dgW, dbW := map[[2]int][]float64{}, map[[2]int][]float64{}, map[[2]int][]float64{}
	for ci := range tok0 {
		t0, n := int(tok0[ci]), int(clen[ci])
		for qh := 0; qh < HQK; qh++ {
			Q, K := mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil)
			qi, ki := make([]float64, n), make([]float64, n)
			for i := 0; i < n; i++ {
				copy(Q.RawRowView(i), qY[((t0+i)*HQK+qh)*dHead:][:dHead])
				copy(K.RawRowView(i), kY[((t0+i)*HQK+qh)*dHead:][:dHead])
				qi[i], ki[i] = qInv[(t0+i)*HQK+qh], kInv[(t0+i)*HQK+qh]
			}
			DYQ, DYK := mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil)
			for hj := 0; hj < grp; hj++ {
				h := qh*grp + hj
				V, VN, DVN, DO := mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil),
					mat.NewDense(n, dHead, nil)
				gam, B := make([]float64, n), make([]float64, n)
				for i := 0; i < n; i++ {
					for x := 0; x < dHead; x++ {
						V.Set(i, x, float64(vbuf[(t0+i)*vStride+h*dHead+x].Float32()))
						VN.Set(i, x, float64(vnew[((t0+i)*HV+h)*dHead+x]))
						DVN.Set(i, x, float64(dvnew[((t0+i)*HV+h)*dHead+x]))
						DO.Set(i, x, float64(dout[((t0+i)*HV+h)*dHead+x].Float32()))
					}
					gam[i], B[i] = float64(gcum[(t0+i)*HV+h]), float64(beta[(t0+i)*HV+h])
				}
				seg, err := gdnref.Prep(gdnref.Head{Q: Q, K: K, V: V, G: gFromGamma(gam, []int{n}), Beta: B},
					gdnref.Options{NoL2Norm: true, Scale: float64(scale)})
				require.NoError(t, err)
				require.Len(t, seg.Chunks, 1)
				require.Equal(t, gam, seg.Chunks[0].Gamma, "Prep's gamma is not the kernel's")
				st, tp := gdnref.NewStates(seg), gdnref.NewTape(seg)
				st.H[0] = state(widen(hst), ci, h, HV)
				st.VNew = VN
				tp.D[0] = state(widen(dch), ci, h, HV)
				tp.DVNew = DVN
				gr, err := gdnref.ChunkGrads(seg, st, tp, DO)
				require.NoError(t, err)
				DYQ.Add(DYQ, gr.DQ)
				DYK.Add(DYK, gr.DK)
				for i := 0; i < n; i++ {
					dvW[[2]int{ci, h}] = append(dvW[[2]int{ci, h}], gr.DV.RawRowView(i)...)
				}
				dgW[[2]int{ci, h}], dbW[[2]int{ci, h}] = gr.DG, gr.DBeta
			}
			if c.l2norm {
				DYQ, DYK = gdnref.L2NormBackward(Q, qi, DYQ), gdnref.L2NormBackward(K, ki, DYK)
			}
			for i := 0; i < n; i++ {
				want["dq"] = append(want["dq"], DYQ.RawRowView(i)...)
				want["dk"] = append(want["dk"], DYK.RawRowView(i)...)
			}
		}
		for h := 0; h < HV; h++ {
			want["dv"] = append(want["dv"], dvW[[2]int{ci, h}]...)
			want["dg"] = append(want["dg"], dgW[[2]int{ci, h}]...)
			want["dbeta"] = append(want["dbeta"], dbW[[2]int{ci, h}]...)
		}
	}
	et := &errTable{}
	for _, o := range outs {
		requireRel(t, et, "grads_mma5 "+o.name, got[o.name], want[o.name], gradsMMATol)
		worst := maxOverRMS(got[o.name], want[o.name])
		et.note("grads_mma5 "+o.name+" max/rms", worst)
		require.Lessf(t, worst, gradsMMAElemTol, "%s: an element is %.3g of the rms off", o.name, worst)
		et.note("fp32 pair "+o.name, relErr(got[o.name+"_fp32"], want[o.name]))
		requireRel(t, et, "grads_mma7 "+o.name, got[o.name+"_7"], want[o.name], gradsMMA7Tol)
		worst7 := maxOverRMS(got[o.name+"_7"], want[o.name])
		et.note("grads_mma7 "+o.name+" max/rms", worst7)
		require.Lessf(t, worst7, gradsMMA7ElemTol, "%s (mma7): an element is %.3g of the rms off", o.name, worst7)
		requireRel(t, et, "grads_mma8 "+o.name, got[o.name+"_8"], want[o.name], gradsMMA7Tol)
		worst8 := maxOverRMS(got[o.name+"_8"], want[o.name])
		et.note("grads_mma8 "+o.name+" max/rms", worst8)
		require.Lessf(t, worst8, gradsMMA7ElemTol, "%s (mma8): an element is %.3g of the rms off", o.name, worst8)
	}
	// What H as bf16 in <D, H> moved dg by, against mma7's.
	et.note("grads_mma8 dg vs mma7", relErr(got["dg_8"], got["dg_7"]))
	et.log(t)
}

// requireBF16OfF32 requires the first elems bf16 values of b16 to be rn() of
// the fp32 values of b32, bit for bit, and poisonBF16 wherever b32 holds
// poisonF32 (nothing written there).
func requireBF16OfF32(t *testing.T, name string, b32, b16 []byte, elems int) {
	t.Helper()
	for e := 0; e < elems; e++ {
		u := binary.LittleEndian.Uint32(b32[4*e:])
		h := binary.LittleEndian.Uint16(b16[2*e:])
		if u == poisonF32 {
			require.Equalf(t, poisonBF16, h, "%s: element %d written where the fp32 launch wrote nothing", name, e)
			continue
		}
		want := bf16.Float32ToBF16(math.Float32frombits(u))
		require.Equalf(t, uint16(want), h, "%s: element %d is %#04x, rn(%g) is %#04x", name, e, h, math.Float32frombits(u), uint16(want))
	}
}

// stateT16 is the state walk's h16 of fp32 states st ([NC, HV, 128 (key),
// 128 (column)]): each state transposed, [column][key], rounded to nearest
// even.
func stateT16(st []float32, NC, HV int) []bf16.BF16 {
	out := make([]bf16.BF16, len(st))
	for b := 0; b < NC*HV; b++ {
		src, dst := st[b*dHead*dHead:][:dHead*dHead], out[b*dHead*dHead:][:dHead*dHead]
		for key := 0; key < dHead; key++ {
			for col := 0; col < dHead; col++ {
				dst[col*dHead+key] = bf16.Float32ToBF16(src[key*dHead+col])
			}
		}
	}
	return out
}

// vnewT16 is the state walk's vnew16 of fp32 V' rows ([T, HV, 128]): a
// [128 (feature)][64 (token)] block a (chunk, value head), rounded to
// nearest even, tokens from the chunk's length on 0.
func vnewT16(rows []float32, tok0, clen []int32, HV int) []bf16.BF16 {
	out := make([]bf16.BF16, len(tok0)*HV*dHead*64)
	for ci := range tok0 {
		for h := 0; h < HV; h++ {
			blk := out[(ci*HV+h)*dHead*64:][:dHead*64]
			for f := 0; f < dHead; f++ {
				for i := 0; i < int(clen[ci]); i++ {
					blk[f*64+i] = bf16.Float32ToBF16(rows[((int(tok0[ci])+i)*HV+h)*dHead+f])
				}
			}
		}
	}
	return out
}

// gradsUseWG reports whether gdn_chunk_grads_mma5.cu runs warpgroup products.
func gradsUseWG(t *testing.T) bool {
	b, err := os.ReadFile(filepath.Join(srcDir(), "gdn_chunk_grads_mma5.cu"))
	require.NoError(t, err)
	return strings.Contains(string(b), "wg::mma_")
}
