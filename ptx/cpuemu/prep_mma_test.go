package cpuemu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// The tensor-core chunk prep of ptx/src/gdn_prep_mma.cu
// (gdn_prep_mma: mma.sync with hi/lo splits, a blocked (I + L)^-1, cp.async
// stages) on the emulator, against internal/gdnref.Prep fed the very fp32
// kn, g, beta and bf16 v the kernel reads, and beside the fp32 gdn_prep_fwd
// run on the same buffers.

// prepMMATol bounds the normwise relative error of gcum, W, U and Kt against
// float64 from the same inputs. Every product of two fp32 quantities (K K^T,
// the inverse's block products, A diag(coef) K) runs as ah bh + ah bl + al bh,
// each term off by at most ~3 * 2^-16 = 4.6e-5 of |a||b| with random signs;
// sums of 16..128 such terms land a few 1e-6 off, and the unit lower
// triangular (I + L)^-1 of a chunk (|L_ij| < 1, decays < 1) amplifies that
// by a small factor (measured: W 4.8e-6, U 2.3e-6; Kt 4.8e-7 and gcum 1.1e-7
// are fp32 elementwise, as gdn_prep_fwd's). 1.5e-5 is ~3x the worst, within
// the ~1e-5 class the walks need of their inputs, and below what dropping any
// one lo part gives (the inverse's: 3.0e-5..4.8e-5; the others 2e-4..2e-3) or
// a wrong row of a chunk (~1/64). (requireRel prints it rounded, as 2e-05.)
const prepMMATol = 1.5e-5

// prepMMAGap tokens follow each chunk in the test's buffers: no chunk owns
// them, their inputs are NaN and their outputs poisoned, so a read past a
// short chunk's end computes NaN and a write past it shows as a changed
// poison.
const prepMMAGap = 3

type prepMMACase struct {
	name       string
	lens       []int // segment lengths (chunks of 64 from each start)
	hqk, hv    int
	vPad, vOff int // v row stride = HV*128 + vPad elements; v starts vOff elements into its buffer
	deferred   bool
	nokt       bool // also run gdn_prep_mma with kt null: gcum, w, u must be the same bits
	twin       bool // the second segment's inputs are the first's: its outputs must be the first's bits
	seed       uint64
	gMin       float32 // g drawn in (gMin, 0] instead of [-0.3, -0.01) (0: the default)
	keyNoise   float64 // > 0: every key of a QK head is base + keyNoise n (normalised), base shared: correlated keys
	betaMin    float64 // > 0: beta drawn in (betaMin, 1) instead of (0.02, 0.98)
	tol        float64 // > 0: W's and U's bound instead of prepMMATol
}

// prepMMACases: chunks of 1, 8, 63 and 64 rows (segments 1, 63, 64, 65, 200)
// with cp.async landing at issue; grouped heads (HQK 2, HV 4; chunks of 64,
// 1, 3 and 40 rows) with cp.async landing only at its wait
// (EMU_CP_ASYNC=deferred), run a second time with kt null (the v5 forward,
// whose walks rebuild Kt); a v that is not 16-byte aligned (the kernel's
// plain-load path for v); ten value heads over one QK head (more than the
// grouped preps stage at once). Emulating gdn_prep_mma costs ~0.15 s of CPU a
// block, so the cases stay at a few dozen blocks (each mode once) to run
// within seconds on 2 cores.
var prepMMACases = []prepMMACase{
	{name: "hv2_immediate", lens: []int{1, 63, 64, 65, 200}, hqk: 1, hv: 2, vPad: 8, seed: 21},
	{name: "hv4_deferred", lens: []int{65, 3, 40}, hqk: 2, hv: 4, vPad: 0, deferred: true, nokt: true, seed: 22},
	{name: "v_unaligned", lens: []int{40}, hqk: 1, hv: 2, vPad: 4, vOff: 4, seed: 23},
	{name: "hv6_deferred", lens: []int{64, 17}, hqk: 2, hv: 6, vPad: 0, deferred: true, nokt: true, seed: 24},
	// ten value heads a QK head: more than the grouped preps stage at once (their per-head path)
	{name: "hv10_one_qk", lens: []int{37}, hqk: 1, hv: 10, vPad: 0, nokt: true, seed: 25},
	// two chunks of equal inputs in neighbouring blocks, which the emulator runs in opposite thread orders:
	// a missing barrier between warps (P4's named barriers, say) gives them different bits
	{name: "twin_chunks", lens: []int{64, 64}, hqk: 1, hv: 3, vPad: 0, nokt: true, twin: true, seed: 26},
	// strong decay: g in (-5, 0] on every token, a chunk's gamma down to ~-160, where gcum's fp32 ulp (~1.5e-5)
	// is the decays' relative error; it holds prepMMATol. (Probed, 2026-12-05: one token in five at g in
	// [-160, 0) put Kt at 1.5e-5, at [-1000, 0) 7.5e-5: the in-chunk cumsum's fp32 differences, not a kernel
	// slip; such a token zeroes the state before it anyway.)
	{name: "strong_decay", lens: []int{64, 40}, hqk: 1, hv: 2, seed: 27, gMin: -5},
	// correlated keys (thirty-ninth session): k.k' ~ 0.8 and ~ 0.99 over the whole chunk with beta near 1 and weak
	// decay, where the inverse's cancellation amplifies the split products' 2^-16: measured W 1.4e-5 and 5.0e-5, U
	// 6.8e-6 and 1.2e-5 (gdn_prep_fwd's fp32: W 5.8e-7 and 1.1e-6), as gdnref's TestInverseForms models the
	// blocked form (9e-6 and 4e-5); the bounds pin those, ~4x over
	{name: "correlated_keys", lens: []int{64}, hqk: 1, hv: 2, seed: 28, gMin: -0.05, keyNoise: 0.5, betaMin: 0.5, tol: 5e-5},
	{name: "near_equal_keys", lens: []int{64}, hqk: 1, hv: 2, seed: 29, gMin: -0.01, keyNoise: 0.1, betaMin: 0.5, tol: 2e-4},
}

// TestMMAPrepOnCPU runs gdn_prep_mma and gdn_prep_fwd on the cases above:
// every output row of a chunk written (poison gone, no NaN/Inf), the gap rows
// neither read (NaN inputs) nor written (poison intact), gcum and Kt bitwise
// equal to gdn_prep_fwd's, and gcum, W, U, Kt within prepMMATol of gdnref;
// with kt null (nokt cases), gcum, W and U bitwise those of the run with kt
// (gap rows included). The walk planes (walk_planes.cuh: -W a value head,
// K^T a QK head) of gdn_prep_mma and gdn_prep_mma_g are bitwise
// test_walk_planes' from gdn_prep_mma's own W and the kn it read; with kt and
// w null (nokt cases) gdn_prep_mma_g writes the same planes, gcum and U, and
// leaves w untouched.
func TestMMAPrepOnCPU(t *testing.T) {
	built(t, "runner_prep_mma")
	for i := range prepMMACases {
		c := &prepMMACases[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runPrepMMA(t, c)
		})
	}
}

func runPrepMMA(t *testing.T, c *prepMMACase) {
	bin := built(t, "runner_prep_mma")
	rng := rand.New(rand.NewPCG(c.seed, 5))
	tok0, clen, T, owned := prepChunks(c.lens)
	HQK, HV := c.hqk, c.hv
	nan32 := float32(math.NaN())
	// kn: l2-normalised random rows in fp32 (as gdn_l2norm_fwd writes them); with keyNoise, base + keyNoise n.
	kn := make([]float32, T*HQK*dHead)
	base := make([]float64, HQK*dHead)
	for x := range base {
		base[x] = rng.NormFloat64()
	}
	for r := 0; r < T*HQK; r++ {
		row := kn[r*dHead : (r+1)*dHead]
		if !owned[r/HQK] {
			for x := range row {
				row[x] = nan32
			}
			continue
		}
		var ss float64
		raw := make([]float64, dHead)
		for x := range raw {
			raw[x] = rng.NormFloat64()
			if c.keyNoise > 0 {
				raw[x] = base[(r%HQK)*dHead+x] + c.keyNoise*raw[x]
			}
			ss += raw[x] * raw[x]
		}
		for x := range row {
			row[x] = float32(raw[x] / math.Sqrt(ss))
		}
	}
	vStride := HV*dHead + c.vPad
	vbuf := make([]bf16.BF16, c.vOff+T*vStride)
	for i := range vbuf {
		vbuf[i] = bf16.BF16(poisonBF16) // NaN
	}
	g, beta := make([]float32, T*HV), make([]float32, T*HV)
	for tk := 0; tk < T; tk++ {
		for h := 0; h < HV; h++ {
			if !owned[tk] {
				g[tk*HV+h], beta[tk*HV+h] = nan32, nan32
				continue
			}
			g[tk*HV+h] = float32(-0.01 - 0.29*rng.Float64())
			if c.gMin != 0 {
				g[tk*HV+h] = c.gMin * float32(rng.Float64())
			}
			beta[tk*HV+h] = float32(0.02 + 0.96*rng.Float64())
			if c.betaMin > 0 {
				beta[tk*HV+h] = float32(c.betaMin + (1-c.betaMin)*rng.Float64())
			}
			for x := 0; x < dHead; x++ {
				vbuf[c.vOff+tk*vStride+h*dHead+x] = bf16.Float32ToBF16(float32(rng.NormFloat64()))
			}
		}
	}

	if c.twin { // segment 1's tokens take segment 0's inputs
		require.Len(t, tok0, 2)
		require.Equal(t, clen[0], clen[1])
		for i := 0; i < int(clen[0]); i++ {
			a, b := int(tok0[0])+i, int(tok0[1])+i
			copy(kn[b*HQK*dHead:(b+1)*HQK*dHead], kn[a*HQK*dHead:(a+1)*HQK*dHead])
			copy(vbuf[c.vOff+b*vStride:c.vOff+(b+1)*vStride], vbuf[c.vOff+a*vStride:c.vOff+(a+1)*vStride])
			copy(g[b*HV:(b+1)*HV], g[a*HV:(a+1)*HV])
			copy(beta[b*HV:(b+1)*HV], beta[a*HV:(a+1)*HV])
		}
	}

	j := newJob(t)
	if c.deferred {
		j.env = []string{cpAsyncDeferred}
	}
	j.i32("chunk_tok0", tok0)
	j.i32("chunk_len", clen)
	j.f32("kn", kn)
	j.bf16("v", vbuf)
	j.f32("g", g)
	j.f32("beta", beta)
	outs := []bufSpec{{"gcum", T * HV}, {"w", T * HV * dHead}, {"u", T * HV * dHead}, {"kt", T * HV * dHead}}
	for _, sfx := range []string{"", "_fp32"} {
		for _, o := range outs {
			j.out(o.name+sfx, 4*o.elems)
			j.poison(o.name+sfx, poisonF32)
		}
	}
	NC := len(tok0)
	args := func(sfx string) []string {
		return []string{buf("kn"), bufAt("v", 2*c.vOff), i32a(vStride), buf("g"), buf("beta"), buf("chunk_tok0"),
			buf("chunk_len"), buf("gcum" + sfx), buf("w" + sfx), buf("u" + sfx), buf("kt" + sfx), i32a(HQK), i32a(HV)}
	}
	// The mma entries take the walk planes wp (-W) and wk (K^T) after kt (null: none written).
	mmaArgs := func(a []string, sfx string) []string {
		return append(append(append([]string{}, a[:11]...), buf("wp"+sfx), buf("wk"+sfx)), a[11:]...)
	}
	for _, sfx := range []string{"", "_g", "_gnokt", "_ref"} {
		outPlanes(j, sfx, NC, HQK, HV)
	}
	j.launch("prep_mma", "gdn_prep_mma", grid3(NC, HV, 1), 256, "kPrepMMASmem", mmaArgs(args(""), "")...)
	j.launch("prep_fp32", "gdn_prep_fwd", grid3(NC, HV, 1), 256, "kPrepSmem", args("_fp32")...)
	// The planes from gdn_prep_mma's own W and the kn it read.
	j.launch("planes_ref", "test_walk_planes", grid3(NC, HV, 1), 256, "0", buf("w"), buf("kn"),
		buf("chunk_tok0"), buf("chunk_len"), buf("wp_ref"), buf("wk_ref"), i32a(HQK), i32a(HV))
	// The grouped form (a CTA a chunk and QK head: k, its split and K K^T once) must write gdn_prep_mma's bits.
	for _, o := range outs {
		j.out(o.name+"_g", 4*o.elems)
		j.poison(o.name+"_g", poisonF32)
	}
	j.launch("prep_mma_g", "gdn_prep_mma_g", grid3(NC, HQK, 1), 256, "kPrepMMAGSmem", mmaArgs(args("_g"), "_g")...)
	if c.nokt {
		for _, o := range outs[:3] {
			j.out(o.name+"_nokt", 4*o.elems)
			j.poison(o.name+"_nokt", poisonF32)
		}
		j.launch("prep_mma_nokt", "gdn_prep_mma_nokt", grid3(NC, HV, 1), 256, "kPrepMMASmem",
			append(args("_nokt")[:10], i32a(HQK), i32a(HV))...)
	}
	if c.nokt { // and with kt null, gdn_prep_mma_nokt's
		for _, o := range outs[:3] {
			j.out(o.name+"_gnokt", 4*o.elems)
			j.poison(o.name+"_gnokt", poisonF32)
		}
		// kt null and w null (the v5 forward alone: the walks read the planes), planes written.
		a := args("_gnokt")
		a[8], a[10] = nullBuf(), nullBuf()
		j.launch("prep_mma_g_nokt", "gdn_prep_mma_g", grid3(NC, HQK, 1), 256, "kPrepMMAGSmem", mmaArgs(a, "_gnokt")...)
	}
	r := j.run(bin)
	t.Logf("runner:\n%s", r.log)
	if c.twin {
		requireTwinChunks(t, r.raw, tok0, clen, HQK, HV)
	}
	// The walk planes: -W's and K^T's splits, from either entry, with or without kt and w.
	for _, n := range []string{"wp", "wk"} {
		require.Equal(t, r.raw[n+"_ref"], r.raw[n], "gdn_prep_mma's %s planes are not test_walk_planes'", n)
		require.Equal(t, r.raw[n], r.raw[n+"_g"], "gdn_prep_mma_g's %s planes differ from gdn_prep_mma's", n)
		if c.nokt {
			require.Equal(t, r.raw[n], r.raw[n+"_gnokt"], "gdn_prep_mma_g's %s planes with kt and w null differ", n)
		} else {
			requireAllPoison(t, r.raw[n+"_gnokt"], n+"_gnokt (not launched)")
		}
	}
	if c.nokt {
		requireAllPoison(t, r.raw["w_gnokt"], "w_gnokt (w null)")
	}
	for _, o := range outs {
		require.Equal(t, r.raw[o.name], r.raw[o.name+"_g"], "%s: gdn_prep_mma_g differs from gdn_prep_mma", o.name)
	}
	if c.nokt {
		for _, o := range []bufSpec{outs[0], outs[2]} {
			require.Equal(t, r.raw[o.name+"_nokt"], r.raw[o.name+"_gnokt"], "%s: gdn_prep_mma_g with kt null differs",
				o.name)
		}
	}
	if c.nokt {
		for _, o := range outs[:3] {
			require.Equal(t, r.raw[o.name], r.raw[o.name+"_nokt"], "%s: gdn_prep_mma with kt null differs from its run with kt",
				o.name)
		}
	}

	// Owned rows: written, finite; gap rows: still poisoned.
	got := map[string][]float64{}
	for _, sfx := range []string{"", "_fp32"} {
		for _, o := range outs {
			b := r.raw[o.name+sfx]
			require.Len(t, b, 4*o.elems)
			per := o.elems / T
			vals := make([]float64, 0, o.elems)
			for tk := 0; tk < T; tk++ {
				for e := 0; e < per; e++ {
					u := binary.LittleEndian.Uint32(b[4*(tk*per+e):])
					x := math.Float32frombits(u)
					if !owned[tk] {
						require.Equalf(t, poisonF32, u, "%s%s: token %d past a chunk's end written", o.name, sfx, tk)
						continue
					}
					require.NotEqualf(t, poisonF32, u, "%s%s: token %d element %d never written", o.name, sfx, tk, e)
					require.Falsef(t, math.IsNaN(float64(x)) || math.IsInf(float64(x), 0),
						"%s%s: token %d element %d is %g", o.name, sfx, tk, e, x)
					vals = append(vals, float64(x))
				}
			}
			got[o.name+sfx] = vals
		}
	}
	require.Equal(t, got["gcum_fp32"], got["gcum"], "gcum differs from gdn_prep_fwd's bits")
	require.Equal(t, got["kt_fp32"], got["kt"], "kt differs from gdn_prep_fwd's bits")

	// The float64 reference, chunk by chunk, from the same fp32 / bf16 inputs,
	// gathered in the order of got (token, head, column).
	want := map[string][]float64{}
	refs := make([][]*gdnref.Chunk, len(tok0))
	for ci := range tok0 {
		t0, n := int(tok0[ci]), int(clen[ci])
		for h := 0; h < HV; h++ {
			qh := h / (HV / HQK)
			K, V := mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil)
			G, B := make([]float64, n), make([]float64, n)
			for i := 0; i < n; i++ {
				for x := 0; x < dHead; x++ {
					K.Set(i, x, float64(kn[((t0+i)*HQK+qh)*dHead+x]))
					V.Set(i, x, float64(vbuf[c.vOff+(t0+i)*vStride+h*dHead+x].Float32()))
				}
				G[i], B[i] = float64(g[(t0+i)*HV+h]), float64(beta[(t0+i)*HV+h])
			}
			seg, err := gdnref.Prep(gdnref.Head{Q: K, K: K, V: V, G: G, Beta: B}, gdnref.Options{NoL2Norm: true})
			require.NoError(t, err)
			require.Len(t, seg.Chunks, 1)
			refs[ci] = append(refs[ci], &seg.Chunks[0])
		}
	}
	for ci := range tok0 {
		n := int(clen[ci])
		for i := 0; i < n; i++ {
			for h := 0; h < HV; h++ {
				ch := refs[ci][h]
				want["gcum"] = append(want["gcum"], ch.Gamma[i])
				want["w"] = append(want["w"], ch.W.RawRowView(i)...)
				want["u"] = append(want["u"], ch.U.RawRowView(i)...)
				want["kt"] = append(want["kt"], ch.Kt.RawRowView(i)...)
			}
		}
	}
	et := &errTable{}
	for _, o := range []string{"gcum", "w", "u", "kt"} {
		tol := prepMMATol
		if c.tol > 0 && (o == "w" || o == "u") {
			tol = c.tol
		}
		requireRel(t, et, "prep_mma "+o, got[o], want[o], tol)
		et.note("prep_fp32 "+o, relErr(got[o+"_fp32"], want[o]))
	}
	et.log(t)
}

// requireTwinChunks: with chunk 1's inputs chunk 0's, every output of chunk 1
// (gcum, w, u, kt rows; the -W planes of each value head and the K^T planes of
// each QK head) is chunk 0's, bit for bit, for every entry the case ran.
func requireTwinChunks(t *testing.T, raw map[string][]byte, tok0, clen []int32, HQK, HV int) {
	t.Helper()
	n := int(clen[0])
	rows := map[string]int{"gcum": 4 * HV, "w": 4 * HV * dHead, "u": 4 * HV * dHead, "kt": 4 * HV * dHead}
	checked := 0
	for name, b := range raw {
		base := name
		if i := strings.IndexByte(name, '_'); i >= 0 {
			base = name[:i]
		}
		var a0, a1, size int
		switch base {
		case "gcum", "w", "u", "kt":
			size = n * rows[base]
			a0, a1 = int(tok0[0])*rows[base], int(tok0[1])*rows[base]
		case "wp":
			size = HV * 32768
			a0, a1 = 0, size
		case "wk":
			size = HQK * 32768
			a0, a1 = 0, size
		default:
			continue
		}
		if len(b) < a1+size {
			continue
		}
		require.Equalf(t, b[a0:a0+size], b[a1:a1+size], "%s: chunk 1 (inputs equal to chunk 0's, the other thread order) differs", name)
		checked++
	}
	require.Greater(t, checked, 10, "twin check: too few outputs compared")
}

// prepNormCases: gdn_prep_mma_gn against gdn_l2norm_fwd + gdn_prep_mma_g.
// Chunks of 1, 63, 64 and 1..64 rows, grouped heads, l2norm on and off, a
// padded k row stride, cp.async at issue and deferred, and k rows that are
// not 8-byte aligned (both kernels' 2-byte load path).
var prepNormCases = []struct {
	name     string
	lens     []int
	hqk, hv  int
	l2norm   bool
	kPad     int // k row stride = HQK*128 + kPad elements
	kOff     int // k starts kOff elements into its buffer (odd: rows not 8-byte aligned, 2-byte loads)
	deferred bool
	seed     uint64
}{
	{name: "hv1_l2norm", lens: []int{1, 63, 130}, hqk: 1, hv: 1, l2norm: true, kPad: 0, seed: 31},
	{name: "hv4_deferred", lens: []int{65, 3}, hqk: 2, hv: 4, l2norm: true, kPad: 8, deferred: true, seed: 32},
	{name: "hv2_no_l2norm", lens: []int{40}, hqk: 1, hv: 2, l2norm: false, kPad: 16, seed: 33},
	{name: "k_unaligned", lens: []int{64, 9}, hqk: 1, hv: 3, l2norm: true, kPad: 1, kOff: 1, seed: 34},
}

// TestMMAPrepNormOnCPU: gdn_prep_mma_gn, which normalises the chunk's k rows
// itself from the bf16 k (fwd::l2norm_lane), writes gdn_prep_mma_g's bits
// (gcum, w, u, the walk planes) fed the kn that gdn_l2norm_fwd wrote from
// the same k, with w given and with w null (left untouched), and nothing
// past a chunk's end (the gap rows' k are NaN, their outputs poisoned).
func TestMMAPrepNormOnCPU(t *testing.T) {
	bin := built(t, "runner_prep_mma")
	for _, c := range prepNormCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(c.seed, 9))
			tok0, clen, T, owned := prepChunks(c.lens)
			HQK, HV := c.hqk, c.hv
			ks := HQK*dHead + c.kPad
			k := make([]bf16.BF16, c.kOff+T*ks)
			for x := range k {
				k[x] = bf16.BF16(poisonBF16) // NaN: gap rows, padding, the offset
			}
			for tk := 0; tk < T; tk++ {
				for x := 0; owned[tk] && x < HQK*dHead; x++ {
					k[c.kOff+tk*ks+x] = bf16.Float32ToBF16(float32(0.7 * rng.NormFloat64()))
				}
			}
			vs := HV * dHead
			v := make([]bf16.BF16, T*vs)
			g, beta := make([]float32, T*HV), make([]float32, T*HV)
			nan32 := float32(math.NaN())
			for tk := 0; tk < T; tk++ {
				for h := 0; h < HV; h++ {
					g[tk*HV+h], beta[tk*HV+h] = nan32, nan32
					if owned[tk] {
						g[tk*HV+h] = float32(-0.01 - 0.29*rng.Float64())
						beta[tk*HV+h] = float32(0.02 + 0.96*rng.Float64())
					}
					for x := 0; x < dHead; x++ {
						v[tk*vs+h*dHead+x] = bf16.BF16(poisonBF16)
						if owned[tk] {
							v[tk*vs+h*dHead+x] = bf16.Float32ToBF16(float32(rng.NormFloat64()))
						}
					}
				}
			}
			l2 := 0
			if c.l2norm {
				l2 = 1
			}
			NC := len(tok0)
			j := newJob(t)
			if c.deferred {
				j.env = []string{cpAsyncDeferred}
			}
			j.i32("chunk_tok0", tok0)
			j.i32("chunk_len", clen)
			j.bf16("k", k)
			j.bf16("v", v)
			j.f32("g", g)
			j.f32("beta", beta)
			for _, n := range []string{"qn", "kn"} {
				j.out(n, 4*T*HQK*dHead)
				j.poison(n, poisonF32)
			}
			j.out("q_rstd", 4*T*HQK)
			j.out("k_rstd", 4*T*HQK)
			// gdn_l2norm_fwd's kn (k given as q too: qn is not used).
			kb := bufAt("k", 2*c.kOff)
			j.launch("l2norm", "gdn_l2norm_fwd", grid1(ceilDiv(T*HQK*2, 8)), 256, "0", kb, kb, i32a(ks),
				i32a(ks), buf("qn"), buf("kn"), buf("q_rstd"), buf("k_rstd"), i32a(T), i32a(HQK), i32a(l2))
			// outs: one prep's poisoned outputs, named with sfx (and Kt where kt is set).
			outs := func(sfx string, kt bool) {
				specs := []bufSpec{{"gcum", T * HV}, {"w", T * HV * dHead}, {"u", T * HV * dHead}}
				if kt {
					specs = append(specs, bufSpec{"kt", T * HV * dHead})
				}
				for _, o := range specs {
					j.out(o.name+sfx, 4*o.elems)
					j.poison(o.name+sfx, poisonF32)
				}
				outPlanes(j, sfx, NC, HQK, HV)
			}
			for _, sfx := range []string{"_g", "_gn", "_gw", "_gnw"} {
				outs(sfx, false)
			}
			tail := func(sfx string, w bool) []string {
				wb := nullBuf()
				if w {
					wb = buf("w" + sfx)
				}
				return []string{buf("g"), buf("beta"), buf("chunk_tok0"), buf("chunk_len"), buf("gcum" + sfx), wb,
					buf("u" + sfx)}
			}
			for _, r := range []struct {
				sfx string
				w   bool
			}{{"", false}, {"w", true}} {
				a := append(append([]string{buf("kn"), buf("v"), i32a(vs)}, tail("_g"+r.sfx, r.w)...), nullBuf(),
					buf("wp_g"+r.sfx), buf("wk_g"+r.sfx), i32a(HQK), i32a(HV))
				j.launch("prep_mma_g"+r.sfx, "gdn_prep_mma_g", grid3(NC, HQK, 1), 256, "kPrepMMAGSmem", a...)
				j.out("k_rstd_gn"+r.sfx, 4*T*HQK)
				j.poison("k_rstd_gn"+r.sfx, poisonF32)
				b := append(append([]string{kb, i32a(ks), i32a(l2), buf("v"), i32a(vs)}, tail("_gn"+r.sfx, r.w)...),
					buf("wp_gn"+r.sfx), buf("wk_gn"+r.sfx), i32a(HQK), i32a(HV), buf("k_rstd_gn"+r.sfx))
				j.launch("prep_mma_gn"+r.sfx, "gdn_prep_mma_gn", grid3(NC, HQK, 1), 256, "kPrepMMAGSmem", b...)
			}
			// Kept for a backward: gdn_prep_mma_g with Kt and w on gdn_l2norm_fwd's kn ("_gk"), and
			// gdn_prep_mma_gnk with Kt and w writing the normalised k rows and their rstd ("_gnk"): every
			// output the same bits, kn_out and k_rstd gdn_l2norm_fwd's.
			outs("_gk", true)
			outs("_gnk", true)
			j.out("kn_out", 4*T*HQK*dHead)
			j.poison("kn_out", poisonF32)
			j.out("k_rstd_out", 4*T*HQK)
			j.poison("k_rstd_out", poisonF32)
			j.launch("prep_mma_gk", "gdn_prep_mma_g", grid3(NC, HQK, 1), 256, "kPrepMMAGSmem",
				append(append([]string{buf("kn"), buf("v"), i32a(vs)}, tail("_gk", true)...), buf("kt_gk"),
					buf("wp_gk"), buf("wk_gk"), i32a(HQK), i32a(HV))...)
			j.launch("prep_mma_gnk", "gdn_prep_mma_gnk", grid3(NC, HQK, 1), 256, "kPrepMMAGSmem",
				append(append([]string{kb, i32a(ks), i32a(l2), buf("v"), i32a(vs)}, tail("_gnk", true)...),
					buf("wp_gnk"), buf("wk_gnk"), i32a(HQK), i32a(HV), buf("kt_gnk"), buf("kn_out"), buf("k_rstd_out"))...)
			res := j.run(bin)
			t.Logf("runner:\n%s", res.log)
			for _, sfx := range []string{"", "w"} {
				for _, n := range []string{"gcum", "w", "u", "wp", "wk"} {
					a, b := res.raw[n+"_g"+sfx], res.raw[n+"_gn"+sfx]
					if n == "w" && sfx == "" {
						requireAllPoison(t, b, "w_gn (w null)")
						continue
					}
					require.Equal(t, a, b, "%s: gdn_prep_mma_gn differs from gdn_prep_mma_g on gdn_l2norm_fwd's kn (w %v)",
						n, sfx != "")
				}
			}
			for _, n := range []string{"gcum", "w", "u", "kt", "wp", "wk"} {
				require.Equal(t, res.raw[n+"_gk"], res.raw[n+"_gnk"], "%s: gdn_prep_mma_gnk differs from gdn_prep_mma_g", n)
			}
			// kn_out and k_rstd: gdn_l2norm_fwd's kn and k_rstd on the owned rows, bit for bit; the gap
			// rows not written.
			for _, p := range []struct {
				got, want string
				per       int
			}{{"kn_out", "kn", HQK * dHead}, {"k_rstd_out", "k_rstd", HQK}, {"k_rstd_gn", "k_rstd", HQK}, {"k_rstd_gnw", "k_rstd", HQK}} {
				got, want := res.raw[p.got], res.raw[p.want]
				for tk := 0; tk < T; tk++ {
					for e := 0; e < p.per; e++ {
						a, b := binary.LittleEndian.Uint32(got[4*(tk*p.per+e):]), binary.LittleEndian.Uint32(want[4*(tk*p.per+e):])
						if owned[tk] {
							require.Equalf(t, b, a, "%s: token %d element %d is not gdn_l2norm_fwd's %s", p.got, tk, e, p.want)
						} else {
							require.Equalf(t, poisonF32, a, "%s: token %d past a chunk's end written", p.got, tk)
						}
					}
				}
			}
			// The reference run wrote every owned row (so the equality above is not poison against poison)
			// and nothing past a chunk's end.
			u := res.raw["u_gw"]
			per := HV * dHead
			for tk := 0; tk < T; tk++ {
				for e := 0; e < per; e++ {
					word := binary.LittleEndian.Uint32(u[4*(tk*per+e):])
					if owned[tk] {
						require.NotEqualf(t, poisonF32, word, "u: token %d element %d never written", tk, e)
					} else {
						require.Equalf(t, poisonF32, word, "u: token %d past a chunk's end written", tk)
					}
				}
			}
		})
	}
}

// prepChunks lays out segments of the given lengths as chunks of up to 64
// tokens (newGappedChunks, prepMMAGap tokens after each): the chunks' first
// tokens and lengths, the tokens in all, and which tokens are owned.
func prepChunks(segs []int) (tok0, clen []int32, T int, owned []bool) {
	var lens []int
	for _, n := range segs {
		for s := 0; s < n; s += chunk {
			lens = append(lens, min(chunk, n-s))
		}
	}
	c := newGappedChunks(lens, prepMMAGap)
	return c.tok0, c.clen, c.T, c.owned
}
