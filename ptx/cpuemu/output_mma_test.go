package cpuemu

import (
	"math"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// The tensor-core output of ptx/src/gdn_output_mma.cu
// (gdn_output_mma: mma.sync, hi/lo splits, cp.async stages split in place)
// on the emulator, against gdnref.Output fed the very fp32 qn, kn, gamma,
// V' and chunk states the kernel reads.

// Operand precisions of gdn_output_mma_probe (the kSplit* bits of the
// kernel file): every operand split (the entry's kOutputPrec), plain bf16,
// Q and H split, and the fp32 state side (H, V', P) split.
const (
	precAll   = 31
	precPlain = 0
	precQH    = 1 | 4
	precState = 4 | 8 | 16
	precNoP   = 31 &^ 16
	precNoV   = 31 &^ 8
	precNoK   = 31 &^ 2
)

// outMMATol bounds the normwise relative error of the kernel's own fp32
// result (the probe at precAll, before the bf16 rounding) against float64
// from the same inputs. Every product runs as ah bh + ah bl + al bh: hi + lo
// keeps ~16 bits (residual <= 2^-16 of the value), so each product term is
// off by at most ~3 * 2^-16 = 4.6e-5 of |a||b| with random signs, and sums of
// 64..128 terms land a few 1e-6 off (measured: see the log and
// docs/mma-kernels.md); 3e-5 is several times that and 30x below what
// plain bf16 operands give (measured ~1e-3), and far below a wrong row of a
// chunk (~1/64).
const outMMATol = 3e-5

// outCases: chunks of 1, 8, 63 and 64 rows (segments of 1, 63, 64, 65 and
// 200 tokens) at HQK 1 / HV 2, and chunks of 64 and 1 rows (a segment of 65
// tokens) at grouped heads HQK 2 / HV 4.
// The fp32 probe runs on hv2 only (an emulated CTA costs ~0.2-0.3 s; the
// grouped-heads case checks the entry's indexing of qh and HV).
type outCase struct {
	gdnCase
	probe bool
}

var outCases = []outCase{
	{gdnCase{name: "hv2", lens: []int{1, 63, 64, 65, 200}, hqk: 1, hv: 2, l2norm: true, seed: 21}, true},
	{gdnCase{name: "gva", lens: []int{65}, hqk: 2, hv: 4, l2norm: true, seed: 22}, false},
}

// outInputs are the output kernel's fp32 inputs.
type outInputs struct {
	qn, kn, gcum, vnew, h []float32
	qRstd                 []float32 // gdn_l2norm_fwd's q_rstd where the inputs came from it (mma16_test), else nil
}

// newOutInputs makes the kernel's inputs: q, k of the case's random bf16
// inputs l2-normalised (in float64, stored fp32, as the l2norm kernel's
// output), gamma the fp32 in-chunk cumsums of g, V' N(0, 1) and the chunk
// states N(0, 0.5^2) (non-zero: the Q H term is exercised).
func newOutInputs(d *gdnData) *outInputs {
	c, l := d.c, d.l
	in := &outInputs{
		qn: make([]float32, l.T*c.hqk*dHead), kn: make([]float32, l.T*c.hqk*dHead),
		gcum: make([]float32, l.T*c.hv), vnew: make([]float32, l.T*c.hv*dHead),
		h: randomStates(l.NC*c.hv, uint64(c.seed)+100),
	}
	for which, dst := range [][]float32{in.qn, in.kn} {
		for t := 0; t < l.T; t++ {
			for hh := 0; hh < c.hqk; hh++ {
				var ss float64
				for x := 0; x < dHead; x++ {
					v := d.raw(which, t, hh*dHead+x)
					ss += v * v
				}
				r := 1 / math.Sqrt(ss+1e-6)
				for x := 0; x < dHead; x++ {
					dst[(t*c.hqk+hh)*dHead+x] = float32(d.raw(which, t, hh*dHead+x) * r)
				}
			}
		}
	}
	for ci := 0; ci < l.NC; ci++ {
		t0, n := int(l.chunkTok0[ci]), int(l.chunkLen[ci])
		for h := 0; h < c.hv; h++ {
			var acc float32
			for i := 0; i < n; i++ {
				acc += d.g[(t0+i)*c.hv+h]
				in.gcum[(t0+i)*c.hv+h] = acc
			}
		}
	}
	for i := range in.vnew {
		in.vnew[i] = float32(d.rng.NormFloat64())
	}
	return in
}

// outputRef is gdnref.Output of every segment and value head from the
// kernel's own inputs ([T, HV, 128]).
func outputRef(t *testing.T, d *gdnData, in *outInputs) []float64 {
	c, l := d.c, d.l
	f := &fwdOut{qn: widen(in.qn), kn: widen(in.kn), gcum: widen(in.gcum)}
	hs, vnew := widen(in.h), widen(in.vnew)
	o := make([]float64, l.T*c.hv*dHead)
	for s := 0; s < l.NS; s++ {
		c0, _ := l.chunks(s)
		t0 := int(l.segStart[s])
		for h := 0; h < c.hv; h++ {
			seg := kernelSegment(t, d, f, s, h, false)
			st := gdnref.NewStates(seg)
			for ci := range st.H {
				st.H[ci] = state(hs, c0+ci, h, c.hv)
			}
			st.VNew = rows(vnew, t0, int(l.segLen[s]), h, c.hv)
			out, err := gdnref.Output(seg, st)
			require.NoError(t, err)
			putRows(o, out, t0, h, c.hv)
		}
	}
	return o
}

// outProbesEnv, set to 1, adds the probes at plain bf16 and partial splits
// to the immediate runs (logged, not asserted: the measurement behind
// kOutputPrec; ~15 s more on 2 cores).
const outProbesEnv = "GDNKCP_OUTPUT_PROBES"

// TestMMAOutputOnCPU runs gdn_output_mma on outCases: the entry itself with
// cp.async deferred to its wait (EMU_CP_ASYNC=deferred), the fp32 probe of
// the same body (every operand split, fp32 output) with cp.async landing at
// issue. It checks: every output poisoned first and fully written, no NaN or
// Inf; the probe within outMMATol of gdnref.Output (normwise) and no element
// beyond outMMAElemTol of the rms; the entry's bf16 output within bf16 rounding
// of gdnref (normwise 2^-9, and per element 2^-8 of the value plus
// outMMAElemTol of the rms) and bit for bit the bf16 rounding of the probe's
// fp32 (so the two modes and the two output types agree).
func TestMMAOutputOnCPU(t *testing.T) {
	bin := built(t, "runner_output_mma")
	var mu sync.Mutex
	got := map[string][]byte{}
	t.Run("runs", func(t *testing.T) {
		for i := range outCases {
			c := &outCases[i]
			for _, mode := range []struct {
				name string
				env  []string
			}{{"probe_cp_async_immediate", nil}, {"entry_cp_async_deferred", []string{cpAsyncDeferred}}} {
				if mode.env == nil && !c.probe {
					continue
				}
				t.Run(c.name+"/"+mode.name, func(t *testing.T) {
					t.Parallel()
					d := newData(t, &c.gdnCase)
					in := newOutInputs(d)
					l := d.l
					T, HQK, HV := l.T, c.hqk, c.hv
					j := newJob(t)
					j.env = mode.env
					addTables(j, l)
					j.f32("qn", in.qn)
					j.f32("kn", in.kn)
					j.f32("gcum", in.gcum)
					j.f32("vnew", in.vnew)
					j.f32("h", in.h)
					args := []string{buf("qn"), buf("kn"), buf("gcum"), buf("vnew"), buf("h"), buf("chunk_tok0"),
						buf("chunk_len")}
					var probes []int
					if mode.env == nil {
						probes = []int{precAll}
						if os.Getenv(outProbesEnv) == "1" {
							probes = append(probes, precPlain, precQH, precState, precNoP, precNoV, precNoK)
						}
					} else {
						j.out("o", 2*T*HV*dHead)
						j.poison("o", poisonBF16x2)
						j.launch("output_mma", "gdn_output_mma", grid3(l.NC, HV, 1), 256, "kOutputMMASmem",
							append(args, buf("o"), i32a(HQK), i32a(HV), f32a(d.scale))...)
					}
					for _, p := range probes {
						name := probeName(p)
						j.out(name, 4*T*HV*dHead)
						j.poison(name, poisonF32)
						j.launch(name, "gdn_output_mma_probe", grid3(l.NC, HV, 1), 256, "kOutputMMASmem",
							append(args, buf(name), i32a(HQK), i32a(HV), f32a(d.scale), i32a(p))...)
					}
					r := j.run(bin)
					t.Logf("runner:\n%s", r.log)

					want := outputRef(t, d, in)
					et := &errTable{}
					if mode.env != nil {
						o := r.bf16s("o") // fully written, no NaN or Inf
						requireOutClose(t, et, "entry o (bf16)", bf16Widen(o), want, math.Ldexp(1, -9)+2e-5, 1)
					}
					for _, p := range probes {
						o32 := widen(r.f32s(probeName(p)))
						if p == precAll {
							requireOutClose(t, et, "probe o (fp32, all split)", o32, want, outMMATol, 0)
							continue
						}
						et.note(probeName(p)+" (logged)", relErr(o32, want))
					}
					et.log(t)
					mu.Lock()
					defer mu.Unlock()
					if mode.env != nil {
						got[c.name+"/o"] = r.raw["o"]
					} else {
						got[c.name+"/probe"] = r.raw[probeName(precAll)]
					}
				})
			}
		}
	})
	if t.Failed() {
		return
	}
	// The entry is the probe's body: its bf16 output is the probe's fp32, rounded.
	for i := range outCases {
		c := &outCases[i]
		o, p := got[c.name+"/o"], got[c.name+"/probe"]
		if o == nil || p == nil {
			continue // not probed, or filtered out by -run
		}
		require.Equal(t, len(o), len(p)/2, "%s: output sizes", c.name)
		for e := 0; e < len(o)/2; e++ {
			x := f32Of(p, e)
			require.Equal(t, bf16.Float32ToBF16(x), bf16Of(o, e), "%s: o[%d] is not the bf16 of the fp32 probe %g",
				c.name, e, x)
		}
	}
}

// outMMAElemTol bounds an element's error beyond its own rounding (2^-8 of
// it for the bf16 output, none for fp32), relative to the outputs' rms: the
// kernel's own error per element (measured: 4.9e-5 of the rms in the fp32
// probe, 1.7e-5 beyond the rounding in the bf16 entry; an output element
// near 0 carries as much absolute error as a large one). 2e-4 leaves 4x and
// still catches one element 0.1% off (~4e-3 of the rms).
const outMMAElemTol = 2e-4

// requireOutClose checks the normwise error against tol and every element
// within ulps * 2^-8 of its value plus outMMAElemTol of the rms.
func requireOutClose(t *testing.T, et *errTable, name string, got, want []float64, tol float64, ulps float64) {
	t.Helper()
	requireRel(t, et, name, got, want, tol)
	var ss float64
	for _, w := range want {
		ss += w * w
	}
	rms := math.Sqrt(ss / float64(len(want)))
	var worst float64
	for i, w := range want {
		excess := math.Abs(got[i]-w) - ulps*math.Ldexp(math.Abs(w), -8)
		worst = max(worst, excess/rms)
		require.LessOrEqualf(t, excess, outMMAElemTol*rms, "%s[%d]: %g, want %g", name, i, got[i], w)
	}
	et.note(name+" (elem/rms)", worst)
}

func probeName(p int) string {
	switch p {
	case precAll:
		return "probe_all"
	case precPlain:
		return "probe_plain"
	case precQH:
		return "probe_q_h"
	case precState:
		return "probe_h_v_p"
	case precNoP:
		return "probe_all_but_p"
	case precNoV:
		return "probe_all_but_v"
	case precNoK:
		return "probe_all_but_k"
	}
	return "probe_other"
}
