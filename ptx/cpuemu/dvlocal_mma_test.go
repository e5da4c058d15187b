package cpuemu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// The tensor-core dV'_local of ptx/src/gdn_dvlocal_mma.cu
// (gdn_dvlocal_mma: mma.sync with hi/lo splits, cp.async stages) on the
// emulator, against float64 computed here from the very fp32 q, k, gamma and
// bf16 dO the kernel reads, and beside the fp32 gdn_dvlocal_bwd run on the
// same buffers.

// dvlMMATol bounds the normwise relative error of dvl against float64 from
// the same inputs. S = K Qᵀ runs as kh qh + kh ql + kl qh (each term off by
// <= ~3 * 2^-16 of |k||q|, random in sign), P is split in registers and dO
// enters exact (ph dO + pl dO): sums of up to 64 x 128 such terms land a few
// 1e-6 off (measured: see the test's log and docs/mma-kernels.md).
// Dropping any one lo part gives ~1e-3, a wrong row of a chunk ~1/64.
const dvlMMATol = 3e-5

// dvlMMAElemTol bounds the worst element against the rms of dvl, so that
// no wrong row or column hides in the norm.
const dvlMMAElemTol = 3e-4

// dvlMMAGap tokens follow each chunk: no chunk owns them, their q, k, gamma
// and dO are NaN and their dvl rows poisoned (a read past a chunk's end
// computes NaN, a write past it changes the poison).
const dvlMMAGap = 3

type dvlMMACase struct {
	name     string
	lens     []int // chunk lengths (each chunk followed by a gap)
	hqk, hv  int
	deferred bool
	seed     uint64
}

// dvlMMACases: chunks of 1, 17, 40, 63 and 64 rows at HQK 1 / HV 2 with
// cp.async landing at issue, and chunks of 64, 17, 1 and 63 rows at grouped
// heads (HQK 2 / HV 4) with cp.async landing only at its wait
// (EMU_CP_ASYNC=deferred), and chunks of 64, 40 and 1 rows at HQK 2 / HV 6
// (three value heads a QK head: gdn_dvlocal_mma_g alternates its dO stages),
// deferred too.
var dvlMMACases = []dvlMMACase{
	{name: "hv2_immediate", lens: []int{1, 63, 64, 17, 40}, hqk: 1, hv: 2, seed: 41},
	{name: "hv4_deferred", lens: []int{64, 17, 1, 63}, hqk: 2, hv: 4, deferred: true, seed: 42},
	{name: "hv6_deferred", lens: []int{64, 40, 1}, hqk: 2, hv: 6, deferred: true, seed: 43},
}

// TestMMADvLocalOnCPU runs gdn_dvlocal_mma and gdn_dvlocal_bwd on the cases
// above: every element of a chunk's rows written (poison gone, no NaN/Inf),
// the gap rows still poisoned, and dvl within dvlMMATol (normwise) and
// dvlMMAElemTol (worst element over the rms) of the float64 formula
// dvl_j = scale sum_{i=j..n-1} (q_i . k_j) e^(gamma_i - gamma_j) dO_i.
func TestMMADvLocalOnCPU(t *testing.T) {
	built(t, "runner_dvlocal_mma")
	for i := range dvlMMACases {
		c := &dvlMMACases[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runDvLocalMMA(t, c)
		})
	}
}

func runDvLocalMMA(t *testing.T, c *dvlMMACase) {
	bin := built(t, "runner_dvlocal_mma")
	rng := rand.New(rand.NewPCG(c.seed, 11))
	ch := newGappedChunks(c.lens, dvlMMAGap)
	tok0, clen, T, owned := ch.tok0, ch.clen, ch.T, ch.owned
	NC, HQK, HV := len(tok0), c.hqk, c.hv
	nan32 := float32(math.NaN())
	scale := float32(1 / math.Sqrt(dHead))
	qn, kn := ch.unitRows(rng, T*HQK), ch.unitRows(rng, T*HQK)
	dout := make([]bf16.BF16, T*HV*dHead)
	for r := 0; r < T*HV; r++ {
		for x := 0; x < dHead; x++ {
			v := nan32
			if owned[r/HV] {
				v = float32(rng.NormFloat64())
			}
			dout[r*dHead+x] = bf16.Float32ToBF16(v) // NaN stays NaN
		}
	}
	gcum := make([]float32, T*HV)
	for i := range gcum {
		gcum[i] = nan32
	}
	for ci := range tok0 {
		t0, n := int(tok0[ci]), int(clen[ci])
		for h := 0; h < HV; h++ {
			var acc float32
			for i := 0; i < n; i++ {
				acc += float32(-0.01 - 0.29*rng.Float64())
				gcum[(t0+i)*HV+h] = acc
			}
		}
	}

	j := newJob(t)
	if c.deferred {
		j.env = []string{cpAsyncDeferred}
	}
	j.i32("chunk_tok0", tok0)
	j.i32("chunk_len", clen)
	j.f32("qn", qn)
	j.f32("kn", kn)
	j.f32("gcum", gcum)
	j.bf16("dout", dout)
	elems := T * HV * dHead
	// The raw rows of gdn_dvlocal_mma_gr: bf16 q and k ([T, HQK, 128]) with their l2norm factors (NaN on the
	// gap tokens, as their rows).
	rawRows := func() ([]bf16.BF16, []float32) {
		rows := make([]bf16.BF16, T*HQK*dHead)
		rstd := make([]float32, T*HQK)
		for r := 0; r < T*HQK; r++ {
			if !owned[r/HQK] {
				rstd[r] = nan32
				for x := 0; x < dHead; x++ {
					rows[r*dHead+x] = bf16.Float32ToBF16(nan32)
				}
				continue
			}
			var ss float64
			for x := 0; x < dHead; x++ {
				v := bf16.Float32ToBF16(float32(rng.NormFloat64()))
				rows[r*dHead+x] = v
				ss += float64(v.Float32()) * float64(v.Float32())
			}
			rstd[r] = float32(1 / math.Sqrt(ss))
		}
		return rows, rstd
	}
	qraw, qrstd := rawRows()
	kraw, krstd := rawRows()
	j.bf16("qraw", qraw)
	j.bf16("kraw", kraw)
	j.f32("qrstd", qrstd)
	j.f32("krstd", krstd)
	for _, o := range []string{"dvl", "dvl_fp32", "dvl_g", "dvl_gk", "dvl_gr"} {
		j.out(o, 4*elems)
		j.poison(o, poisonF32)
	}
	args := func(o string) []string {
		return []string{buf("qn"), buf("kn"), buf("gcum"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"), buf(o),
			i32a(HQK), i32a(HV), f32a(scale)}
	}
	j.launch("dvlocal_mma", "gdn_dvlocal_mma", grid3(NC, HV, 1), 256, "kDvlMMASmem", args("dvl")...)
	j.launch("dvlocal_fp32", "gdn_dvlocal_bwd", grid3(NC, HV, 1), 256, "kDvlSmem", args("dvl_fp32")...)
	// The grouped form: a CTA a (chunk, QK head), its bits gdn_dvlocal_mma's (gap rows included: both poisoned).
	j.launch("dvlocal_mma_g", "gdn_dvlocal_mma_g", grid3(NC, HQK, 1), 256, "kDvlMMAGSmem", args("dvl_g")...)
	// On K^T's walk planes (test_walk_planes from kn; its -W planes from zeros, unused): the same bits.
	j.f32("w0", make([]float32, T*HV*dHead))
	outPlanes(j, "", NC, HQK, HV)
	j.launch("planes", "test_walk_planes", grid3(NC, HV, 1), 256, "0", buf("w0"), buf("kn"), buf("chunk_tok0"),
		buf("chunk_len"), buf("wp"), buf("wk"), i32a(HQK), i32a(HV))
	argsK := args("dvl_gk")
	argsK[1] = buf("wk")
	j.launch("dvlocal_mma_gk", "gdn_dvlocal_mma_gk", grid3(NC, HQK, 1), 256, "kDvlMMAGSmem", argsK...)
	// On the raw bf16 rows and their factors (row stride HQK 128 elements).
	j.launch("dvlocal_mma_gr", "gdn_dvlocal_mma_gr", grid3(NC, HQK, 1), 256, "kDvlMMAGRSmem", buf("qraw"), i32a(HQK*dHead),
		buf("qrstd"), buf("kraw"), i32a(HQK*dHead), buf("krstd"), buf("gcum"), buf("dout"), buf("chunk_tok0"),
		buf("chunk_len"), buf("dvl_gr"), i32a(HQK), i32a(HV), f32a(scale))
	r := j.run(bin)
	t.Logf("runner:\n%s", r.log)
	require.Equal(t, r.raw["dvl"], r.raw["dvl_g"], "gdn_dvlocal_mma_g: not gdn_dvlocal_mma's bits")
	require.Equal(t, r.raw["dvl"], r.raw["dvl_gk"], "gdn_dvlocal_mma_gk (K^T's walk planes): not gdn_dvlocal_mma's bits")

	// Owned rows: written, finite; gap rows still poisoned. got gathers
	// (chunk, head, row, column) order.
	got := map[string][]float64{}
	for _, o := range []string{"dvl", "dvl_fp32", "dvl_gr"} {
		b := r.raw[o]
		require.Len(t, b, 4*elems)
		for e := 0; e < elems; e++ {
			tk := e / (HV * dHead)
			u := binary.LittleEndian.Uint32(b[4*e:])
			x := float64(math.Float32frombits(u))
			if !owned[tk] {
				require.Equalf(t, poisonF32, u, "%s: token %d element %d outside the chunks written", o, tk, e%(HV*dHead))
				continue
			}
			require.NotEqualf(t, poisonF32, u, "%s: token %d element %d never written", o, tk, e%(HV*dHead))
			require.Falsef(t, math.IsNaN(x) || math.IsInf(x, 0), "%s: token %d element %d is %g", o, tk, e%(HV*dHead), x)
		}
		var vals []float64
		for ci := range tok0 {
			for h := 0; h < HV; h++ {
				for i := 0; i < int(clen[ci]); i++ {
					for x := 0; x < dHead; x++ {
						vals = append(vals, float64(f32Of(b, ((int(tok0[ci])+i)*HV+h)*dHead+x)))
					}
				}
			}
		}
		got[o] = vals
	}

	// float64 from the same fp32 / bf16 inputs, in the order of got: dvl_j = scale sum_i (q_i . k_j) e^(..) dO_i
	// with q_i, k_j the normalised rows (qrow, krow of token i, QK head qh).
	wantOf := func(qrow, krow func(tk, qh int) []float64) []float64 {
		var want []float64
		for ci := range tok0 {
			t0, n := int(tok0[ci]), int(clen[ci])
			for h := 0; h < HV; h++ {
				qh := h / (HV / HQK)
				gam := func(i int) float64 { return float64(gcum[(t0+i)*HV+h]) }
				for jr := 0; jr < n; jr++ {
					acc := make([]float64, dHead)
					kj := krow(t0+jr, qh)
					for i := jr; i < n; i++ {
						qi := qrow(t0+i, qh)
						var dot float64
						for x := range dHead {
							dot += qi[x] * kj[x]
						}
						p := dot * math.Exp(gam(i)-gam(jr))
						for x := range dHead {
							acc[x] += p * float64(dout[((t0+i)*HV+h)*dHead+x].Float32())
						}
					}
					for x := range acc {
						want = append(want, float64(scale)*acc[x])
					}
				}
			}
		}
		return want
	}
	f32Row := func(v []float32) func(tk, qh int) []float64 {
		return func(tk, qh int) []float64 {
			out := make([]float64, dHead)
			for x, y := range v[(tk*HQK+qh)*dHead:][:dHead] {
				out[x] = float64(y)
			}
			return out
		}
	}
	rawRow := func(v []bf16.BF16, rstd []float32) func(tk, qh int) []float64 {
		return func(tk, qh int) []float64 {
			out := make([]float64, dHead)
			for x, y := range v[(tk*HQK+qh)*dHead:][:dHead] {
				out[x] = float64(y.Float32()) * float64(rstd[tk*HQK+qh])
			}
			return out
		}
	}
	want := wantOf(f32Row(qn), f32Row(kn))
	et := &errTable{}
	requireRel(t, et, "dvlocal_mma", got["dvl"], want, dvlMMATol)
	worst := maxOverRMS(got["dvl"], want)
	et.note("dvlocal_mma max/rms", worst)
	require.Lessf(t, worst, dvlMMAElemTol, "dvl: an element is %.3g of the rms off", worst)
	requireRel(t, et, "dvlocal_fp32", got["dvl_fp32"], want, dvlMMATol)
	et.note("dvlocal_fp32 max/rms", maxOverRMS(got["dvl_fp32"], want))
	// The raw rows' form, against float64 on its own inputs: S^T from exact bf16 products (one a term, fp32 sums),
	// P^T split as in the others.
	wantR := wantOf(rawRow(qraw, qrstd), rawRow(kraw, krstd))
	requireRel(t, et, "dvlocal_mma_gr", got["dvl_gr"], wantR, dvlMMATol)
	worstR := maxOverRMS(got["dvl_gr"], wantR)
	et.note("dvlocal_mma_gr max/rms", worstR)
	require.Lessf(t, worstR, dvlMMAElemTol, "dvl_gr: an element is %.3g of the rms off", worstR)
	et.log(t)
}
