package cpuemu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// The tensor-core chunk gradients of ptx/src/gdn_chunk_grads_mma.cu
// (gdn_chunk_grads_mma: mma.sync with hi/lo splits, the inverse rebuilt on
// mma, cp.async stages) on the emulator, against internal/gdnref.ChunkGrads
// fed the very fp32 / bf16 inputs the kernel reads, and beside the fp32
// gdn_chunk_grads run on the same buffers.

// gradsMMATol bounds the normwise relative error of dq, dk, dv, dg and dbeta
// against float64 from the same inputs. Every fp32 x fp32 product runs as
// ah bh + ah bl + al bh (each term off by <= ~3 * 2^-16 of |a||b|, random in
// sign), dO and v enter exact; the sums of 64..128 terms land a few 1e-6 off
// and the chains through A (dL = -Aᵀ dA Aᵀ) and the sums of dgamma (terms of
// both signs) amplify that a little (measured: see the test's log and
// docs/mma-kernels.md). Dropping any lo part gives ~1e-4..1e-3, a wrong row
// of a chunk ~1/64.
const gradsMMATol = 3e-5

// gradsMMAElemTol bounds each output's worst element against the output's
// rms, so that no wrong row or column hides in the norm.
const gradsMMAElemTol = 3e-4

// gradsMMAGap tokens follow each chunk: no chunk owns them, their inputs are
// NaN and their outputs poisoned (a read past a chunk's end computes NaN, a
// write past it changes the poison).
const gradsMMAGap = 3

type gradsMMACase struct {
	name        string
	lens        []int // chunk lengths (each chunk followed by a gap)
	hqk, hv     int
	vPad, dvPad int // v and dv row strides = HV*128 + pad
	deferred    bool
	seed        uint64
}

// gradsMMACases: chunks of 1, 17, 40, 63 and 64 rows at HQK 1 / HV 2 with
// cp.async landing at issue, and chunks of 64 and 5 rows at grouped heads
// (HQK 2 / HV 4) with cp.async landing only at its wait
// (EMU_CP_ASYNC=deferred) and a v stride that is even but not a multiple of 8
// (v's pairs by 4-byte loads at a stride no 16-byte copy could use). An emulated CTA of gdn_chunk_grads_mma costs ~1 s
// of CPU (~10000 mma.sync), so the cases hold 18 CTAs.
var gradsMMACases = []gradsMMACase{
	{name: "hv2_immediate", lens: []int{1, 63, 64, 17, 40}, hqk: 1, hv: 2, vPad: 8, dvPad: 6, seed: 31},
	{name: "hv4_deferred", lens: []int{64, 5}, hqk: 2, hv: 4, vPad: 2, deferred: true, seed: 32},
}

// TestMMAChunkGradsOnCPU runs gdn_chunk_grads_mma and gdn_chunk_grads on the
// cases above: every output element of a chunk's rows written (poison gone,
// no NaN/Inf), the gap rows and the stride padding of dv still poisoned, and
// dq, dk, dv, dg, dbeta within gradsMMATol (normwise) and gradsMMAElemTol (worst
// element over the rms) of gdnref.ChunkGrads.
func TestMMAChunkGradsOnCPU(t *testing.T) {
	built(t, "runner_grads_mma")
	for i := range gradsMMACases {
		c := &gradsMMACases[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runGradsMMA(t, c)
		})
	}
}

func runGradsMMA(t *testing.T, c *gradsMMACase) {
	bin := built(t, "runner_grads_mma")
	rng := rand.New(rand.NewPCG(c.seed, 9))
	ch := newGappedChunks(c.lens, gradsMMAGap)
	tok0, clen, T, owned := ch.tok0, ch.clen, ch.T, ch.owned
	NC, HQK, HV := len(tok0), c.hqk, c.hv
	scale := float32(1 / math.Sqrt(dHead))
	qn, kn := ch.unitRows(rng, T*HQK), ch.unitRows(rng, T*HQK)
	gi := newGradsInputs(ch, rng, HV, c.vPad, c.seed)
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
	j.bf16("v", vbuf)
	j.f32("gcum", gcum)
	j.f32("beta", beta)
	j.f32("h", hst)
	j.f32("vnew", vnew)
	j.f32("d_chunk", dch)
	j.f32("dvnew", dvnew)
	j.bf16("dout", dout)
	dvStride := HV*dHead + c.dvPad
	outs := []bufSpec{{"dqv", T * HV * dHead}, {"dkv", T * HV * dHead}, {"dv", T * dvStride}, {"dg", T * HV}, {"dbeta", T * HV}}
	for _, sfx := range []string{"", "_fp32"} {
		for _, o := range outs {
			j.out(o.name+sfx, 4*o.elems)
			j.poison(o.name+sfx, poisonF32)
		}
	}
	args := func(sfx string) []string {
		return []string{buf("qn"), buf("kn"), buf("v"), i32a(vStride), buf("gcum"), buf("beta"), buf("h"), buf("vnew"),
			buf("d_chunk"), buf("dvnew"), buf("dout"), buf("chunk_tok0"), buf("chunk_len"), buf("dqv" + sfx),
			buf("dkv" + sfx), buf("dv" + sfx), i32a(dvStride), buf("dg" + sfx), buf("dbeta" + sfx), i32a(HQK), i32a(HV),
			f32a(scale)}
	}
	j.launch("grads_mma", "gdn_chunk_grads_mma", grid3(NC, HV, 1), 256, "kGradMMASmem", args("")...)
	j.launch("grads_fp32", "gdn_chunk_grads", grid3(NC, HV, 1), 256, "kGradSmem", args("_fp32")...)
	r := j.run(bin)
	t.Logf("runner:\n%s", r.log)

	// Owned rows (and, for dv, the head columns): written, finite; the rest
	// still poisoned. got gathers (chunk, head, row, column) order.
	got := map[string][]float64{}
	for _, sfx := range []string{"", "_fp32"} {
		for _, o := range outs {
			b := r.raw[o.name+sfx]
			require.Len(t, b, 4*o.elems)
			per, width := o.elems/T, dHead
			if o.name == "dg" || o.name == "dbeta" {
				width = 1
			}
			for tk := 0; tk < T; tk++ {
				for e := 0; e < per; e++ {
					u := binary.LittleEndian.Uint32(b[4*(tk*per+e):])
					x := float64(math.Float32frombits(u))
					if !owned[tk] || e >= HV*width {
						require.Equalf(t, poisonF32, u, "%s%s: token %d element %d outside the chunks written", o.name, sfx, tk, e)
						continue
					}
					require.NotEqualf(t, poisonF32, u, "%s%s: token %d element %d never written", o.name, sfx, tk, e)
					require.Falsef(t, math.IsNaN(x) || math.IsInf(x, 0), "%s%s: token %d element %d is %g", o.name, sfx, tk, e, x)
				}
			}
			got[o.name+sfx] = ch.rowValues(b, HV, width, per)
		}
	}

	// gdnref.ChunkGrads chunk by chunk (each chunk a segment of its own) from
	// the same fp32 / bf16 inputs, in the order of got.
	want := map[string][]float64{}
	for ci := range tok0 {
		t0, n := int(tok0[ci]), int(clen[ci])
		for h := 0; h < HV; h++ {
			qh := h / (HV / HQK)
			Q, K, V := mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil)
			VN, DVN, DO := mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil), mat.NewDense(n, dHead, nil)
			gam, B := make([]float64, n), make([]float64, n)
			for i := 0; i < n; i++ {
				for x := 0; x < dHead; x++ {
					Q.Set(i, x, float64(qn[((t0+i)*HQK+qh)*dHead+x]))
					K.Set(i, x, float64(kn[((t0+i)*HQK+qh)*dHead+x]))
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
			for i := 0; i < n; i++ {
				want["dqv"] = append(want["dqv"], gr.DQ.RawRowView(i)...)
				want["dkv"] = append(want["dkv"], gr.DK.RawRowView(i)...)
				want["dv"] = append(want["dv"], gr.DV.RawRowView(i)...)
			}
			want["dg"] = append(want["dg"], gr.DG...)
			want["dbeta"] = append(want["dbeta"], gr.DBeta...)
		}
	}
	et := &errTable{}
	for _, o := range outs {
		requireRel(t, et, "grads_mma "+o.name, got[o.name], want[o.name], gradsMMATol)
		worst := maxOverRMS(got[o.name], want[o.name])
		et.note("grads_mma "+o.name+" max/rms", worst)
		require.Lessf(t, worst, gradsMMAElemTol, "%s: an element is %.3g of the rms off", o.name, worst)
		et.note("grads_fp32 "+o.name, relErr(got[o.name+"_fp32"], want[o.name]))
	}
	et.log(t)
}
