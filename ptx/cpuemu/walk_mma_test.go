package cpuemu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// The tensor-core walks of ptx/src/gdn_walk_mma.cu
// (gdn_summary_walk_mma, gdn_state_walk_mma: mma.sync with hi/lo splits,
// cp.async stages) on the emulator, against internal/gdnref fed the very fp32
// W, U, Kt and gamma the walks read (made by the fp32 l2norm and prep of
// gdn_fwd.cu in the same job).

// mmaWalkTol bounds the normwise relative error of V', P, Q and the states
// against float64 from the same inputs. Each product of two fp32 values runs
// as ah bh + ah bl + al bh: hi + lo keeps ~16 bits (residual <= 2^-16 of the
// value), so a product term is off by at most ~3 * 2^-16 = 4.6e-5 of |a||b|,
// with random signs, which leaves the sums a few 1e-6 off (measured: final
// states 2.1e-6, chunk states 8.4e-7, V' 6.0e-7, P 2.8e-7, Q 4.6e-6); over the
// 1-4 chunks of a segment the recurrence (decays <= 1) does not amplify it
// much. 3e-5 is ~6x the largest of them and still 25x below what dropping
// the lo parts of either operand gives (measured 7.7e-4 final, 1.7e-3 Q),
// and far below a wrong row of a chunk (~1/64) or state element (~1/128).
// A single element is held to 10x that against the states' rms.
const mmaWalkTol = 3e-5

// TestMMAWalksOnCPU runs the tensor-core walks on the "core" case of
// TestForwardKernelsOnCPU (segments of 1, 63, 64, 65 and 200 tokens: chunks
// of 1, 8, 63 and 64 rows; HQK 1, HV 2; random non-zero start states), vh 64
// and 128, with cp.async landing at once and deferred to its wait: every
// output poisoned first and fully written, vh 64 and 128 bitwise equal, V',
// the chunk states, the final states, P and Q within mmaWalkTol of gdnref.
func TestMMAWalksOnCPU(t *testing.T) {
	bin := built(t, "runner_walk_mma")
	c := &fwdCases[0]
	require.Equal(t, "core", c.name)
	for _, mode := range []struct {
		name string
		env  []string
	}{{"cp_async_immediate", nil}, {"cp_async_deferred", []string{cpAsyncDeferred}}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			d := newData(t, c)
			start := randomStates(d.l.NS*c.hv, 11)
			j := newJob(t)
			j.env = mode.env
			addWalksMMA(j, d, start)
			r := j.run(bin)
			t.Logf("runner:\n%s", r.log)
			et := &errTable{}
			checkWalksMMA(t, et, d, r, widen(start))
			et.log(t)
		})
	}
}

// randomStates returns n random fp32 states (128 x 128), entries N(0, 0.5^2):
// the size of the states the walks reach on the case's inputs.
func randomStates(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 3))
	out := make([]float32, n*dHead*dHead)
	for i := range out {
		out[i] = float32(0.5 * rng.NormFloat64())
	}
	return out
}

// addWalksMMA adds the fp32 l2norm and prep (the walks' inputs) and the
// tensor-core summary and state walks at vh 64 and 128, every output poisoned
// before its launch; the state walks start from start ([NS, HV, 128, 128]).
func addWalksMMA(j *job, d *gdnData, start []float32) {
	c, l := d.c, d.l
	T, HV := l.T, c.hv
	addInputs(j, d)
	j.f32("start", start)
	sum := addSumList(j, d)
	outs := prepOuts(d)
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		outs = append(outs, bufSpec{"out_p" + sfx, len(sum) * HV * dHead * dHead},
			bufSpec{"out_q" + sfx, len(sum) * HV * dHead * dHead}, bufSpec{"h" + sfx, l.NC * HV * dHead * dHead},
			bufSpec{"vnew" + sfx, T * HV * dHead}, bufSpec{"final" + sfx, l.NS * HV * dHead * dHead})
	}
	for _, o := range outs {
		j.out(o.name, 4*o.elems)
		j.poison(o.name, poisonF32)
	}
	launchL2NormPrep(j, d)
	for _, vh := range []int{64, 128} {
		sfx := vhName(vh)
		j.launch("summary_mma"+sfx, "gdn_summary_walk_mma", grid3(2*dHead/vh, len(sum), HV), 256, smemOf("walk_mma_smem", vh),
			buf("w"), buf("u"), buf("kt"), buf("gcum"), buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"),
			buf("seg_nchunk"), buf("sum_list"), buf("out_p"+sfx), buf("out_q"+sfx), i32a(HV), i32a(vh))
		j.launch("state_mma"+sfx, "gdn_state_walk_mma", grid3(dHead/vh, l.NS, HV), 256, smemOf("walk_mma_smem", vh),
			buf("w"), buf("u"), buf("kt"), buf("gcum"), buf("chunk_tok0"), buf("chunk_len"), buf("seg_chunk0"),
			buf("seg_nchunk"), buf("start"), buf("h"+sfx), buf("vnew"+sfx), buf("final"+sfx), i32a(HV), i32a(vh))
	}
}

// checkWalksMMA checks the walks' outputs: all written, vh 64 = vh 128 bit
// for bit, and each within mmaWalkTol of gdnref's walks over the kernels' own
// W, U, Kt and gamma (kernelSegment) from the same start states.
func checkWalksMMA(t *testing.T, et *errTable, d *gdnData, r *result, start []float64) {
	c, l := d.c, d.l
	HV := c.hv
	for _, n := range []string{"out_p", "out_q", "h", "vnew", "final"} {
		for _, vh := range []string{"64", "128"} {
			r.f32s(n + vh) // fully written, no NaN or Inf
		}
		require.Equal(t, r.raw[n+"64"], r.raw[n+"128"], "%s: the vh 64 and vh 128 walks differ", n)
	}
	segs := kernelSegments(t, d, r)

	p, q := make([]float64, len(c.sumList)*HV*dHead*dHead), make([]float64, len(c.sumList)*HV*dHead*dHead)
	for li, s := range c.sumList {
		for h := 0; h < HV; h++ {
			sum, err := gdnref.SummaryWalk(segs[s][h], 128)
			require.NoError(t, err)
			putState(p, sum.P, li, h, HV)
			putState(q, sum.Q, li, h, HV)
		}
	}
	requireRel(t, et, "summary P", widen(r.f32s("out_p128")), p, mmaWalkTol)
	requireRel(t, et, "summary Q", widen(r.f32s("out_q128")), q, mmaWalkTol)

	hs := make([]float64, l.NC*HV*dHead*dHead)
	vnew := make([]float64, l.T*HV*dHead)
	final := make([]float64, l.NS*HV*dHead*dHead)
	for s := 0; s < l.NS; s++ {
		c0, _ := l.chunks(s)
		for h := 0; h < HV; h++ {
			st, err := gdnref.StateWalk(segs[s][h], state(start, s, h, HV), 128)
			require.NoError(t, err)
			for ci, m := range st.H {
				putState(hs, m, c0+ci, h, HV)
			}
			putRows(vnew, st.VNew, int(l.segStart[s]), h, HV)
			putState(final, st.Final, s, h, HV)
		}
	}
	requireRel(t, et, "state h", widen(r.f32s("h128")), hs, mmaWalkTol)
	requireRel(t, et, "state vnew", widen(r.f32s("vnew128")), vnew, mmaWalkTol)
	requireRel(t, et, "state final", widen(r.f32s("final128")), final, mmaWalkTol)
	// The worst element of the final states, relative to the states' rms: no
	// single column or key may hide in the norm.
	worst := maxOverRMS(widen(r.f32s("final128")), final)
	et.note("state final (max/rms)", worst)
	require.Less(t, worst, 10*mmaWalkTol, "final states: an element is %.3g of the rms off", worst)
}

// maxOverRMS is the largest |got - want| over the rms of want.
func maxOverRMS(got, want []float64) float64 {
	var ss, worst float64
	for _, x := range want {
		ss += x * x
	}
	rms := math.Sqrt(ss / float64(len(want)))
	for i := range want {
		worst = max(worst, math.Abs(got[i]-want[i])/rms)
	}
	return worst
}

// kernelSegments are gdnref's segments of every (segment, value head) over
// the fp32 l2norm and prep outputs a job's kernels wrote (qn, kn, gcum, w, u,
// kt in r): the walks' own inputs (kernelSegment).
func kernelSegments(t *testing.T, d *gdnData, r *result) [][]*gdnref.Segment {
	f := &fwdOut{}
	for _, p := range []struct {
		dst  *[]float64
		name string
	}{{&f.qn, "qn"}, {&f.kn, "kn"}, {&f.gcum, "gcum"}, {&f.w, "w"}, {&f.u, "u"}, {&f.kt, "kt"}} {
		*p.dst = widen(r.f32s(p.name))
	}
	segs := make([][]*gdnref.Segment, d.l.NS)
	for s := range segs {
		for h := 0; h < d.c.hv; h++ {
			segs[s] = append(segs[s], kernelSegment(t, d, f, s, h, true))
		}
	}
	return segs
}
