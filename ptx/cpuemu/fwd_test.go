package cpuemu

import (
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/gdnref"
)

// fwdCases: chunks of every length class (1, 8, 63, 64) in segments of 1,
// 63, 64, 65 and 200 tokens, documents spanning several segments (compose
// lists of one and two summaries, summary lists out of buffer order), both
// input layouts, grouped heads, and l2norm on and off.
var fwdCases = []gdnCase{
	{name: "core", lens: []int{1, 63, 64, 65, 200}, chains: [][]int{{1, 3, 4}, {0, 2}},
		sumList: []int{3, 0, 1}, offList: []int{2, 4, 3}, hqk: 1, hv: 2, l2norm: true, seed: 1},
	{name: "module_gva", lens: []int{65, 3, 40}, chains: [][]int{{0, 2}}, sumList: []int{0},
		offList: []int{2}, hqk: 2, hv: 4, module: true, l2norm: true, seed: 2},
	{name: "no_l2norm", lens: []int{70, 1}, chains: [][]int{{0, 1}}, sumList: []int{0},
		offList: []int{1}, hqk: 1, hv: 2, l2norm: false, seed: 3},
}

// Tolerances (normwise relative error against float64 from the same
// inputs). fp32 has a unit roundoff of 6e-8; the longest reductions are 128
// fmas, the inverse (I + L)^-1 of the prep and the walks over up to four
// chunks amplify rounding by a small factor, so 1e-6..1e-5 is expected;
// 5e-5 leaves room while a single wrong row of a chunk (about 1/64 of its
// norm) or element of a state (1/128) is far above it.
const fwdTol = 5e-5

// TestForwardKernelsOnCPU runs the forward of gdn_fwd.cu on the emulator
// and checks each kernel's results against internal/gdnref fed the very
// inputs that kernel read (so each error is that kernel's own), and the
// end-to-end outputs and final states against the float64 forward of the raw
// inputs.
func TestForwardKernelsOnCPU(t *testing.T) {
	bin := built(t, "runner_fwd")
	for i := range fwdCases {
		c := &fwdCases[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := newData(t, c)
			j := newJob(t)
			addForward(j, d)
			r := j.run(bin)
			t.Logf("runner:\n%s", r.log)
			f := readForward(t, r, d)
			et := &errTable{}
			checkForward(t, et, d, f)
			et.log(t)
		})
	}
}

func checkForward(t *testing.T, et *errTable, d *gdnData, f *fwdOut) {
	c, l := d.c, d.l
	T, HQK, HV := l.T, c.hqk, c.hv

	// l2norm: the raw rows.
	qn, kn := make([]float64, len(f.qn)), make([]float64, len(f.kn))
	qr, kr := make([]float64, len(f.qRstd)), make([]float64, len(f.kRstd))
	for qh := 0; qh < HQK; qh++ {
		for which, dst := range [][2][]float64{{qn, qr}, {kn, kr}} {
			x := d.rawRows(which, 0, T, qh)
			y, inv := x, make([]float64, T)
			if c.l2norm {
				y, inv = gdnref.L2Norm(x)
			} else {
				for i := range inv {
					inv[i] = 1
				}
			}
			putRows(dst[0], y, 0, qh, HQK)
			putCol(dst[1], inv, 0, qh, HQK)
		}
	}
	requireRel(t, et, "l2norm qn", f.qn, qn, fwdTol)
	requireRel(t, et, "l2norm kn", f.kn, kn, fwdTol)
	requireRel(t, et, "l2norm q_rstd", f.qRstd, qr, fwdTol)
	requireRel(t, et, "l2norm k_rstd", f.kRstd, kr, fwdTol)

	// prep: the kernel's kn, v, g, beta.
	gcum, w, u, kt := make([]float64, len(f.gcum)), make([]float64, len(f.w)), make([]float64, len(f.u)), make([]float64, len(f.kt))
	for s := 0; s < l.NS; s++ {
		t0, n := int(l.segStart[s]), int(l.segLen[s])
		for h := 0; h < HV; h++ {
			qh := h / (HV / HQK)
			seg, err := gdnref.Prep(gdnref.Head{
				Q: rows(f.qn, t0, n, qh, HQK), K: rows(f.kn, t0, n, qh, HQK), V: d.rawRows(2, t0, n, h),
				G: col(widen(d.g), t0, n, h, HV), Beta: col(widen(d.beta), t0, n, h, HV),
			}, gdnref.Options{NoL2Norm: true})
			require.NoError(t, err)
			for _, ch := range seg.Chunks {
				putCol(gcum, ch.Gamma, t0+ch.Start, h, HV)
				putRows(w, ch.W, t0+ch.Start, h, HV)
				putRows(u, ch.U, t0+ch.Start, h, HV)
				putRows(kt, ch.Kt, t0+ch.Start, h, HV)
			}
		}
	}
	requireRel(t, et, "prep gcum", f.gcum, gcum, fwdTol)
	requireRel(t, et, "prep w", f.w, w, fwdTol)
	requireRel(t, et, "prep u", f.u, u, fwdTol)
	requireRel(t, et, "prep kt", f.kt, kt, fwdTol)

	// Walks and output: the kernels' W, U, Kt, gamma, qn, kn and states.
	segs := make([][]*gdnref.Segment, l.NS)
	for s := range segs {
		for h := 0; h < HV; h++ {
			segs[s] = append(segs[s], kernelSegment(t, d, f, s, h, true))
		}
	}
	if len(c.sumList) > 0 {
		p, q := make([]float64, len(f.outP)), make([]float64, len(f.outQ))
		for li, s := range c.sumList {
			for h := 0; h < HV; h++ {
				sum, err := gdnref.SummaryWalk(segs[s][h], 128)
				require.NoError(t, err)
				putState(p, sum.P, li, h, HV)
				putState(q, sum.Q, li, h, HV)
			}
		}
		requireRel(t, et, "summary P", f.outP, p, fwdTol)
		requireRel(t, et, "summary Q", f.outQ, q, fwdTol)
	}
	start := make([]float64, len(f.start))
	for s := 0; s < l.NS; s++ {
		ch, pos := c.chainOf(s)
		for h := 0; h < HV; h++ {
			var sums []*gdnref.Summary
			for _, p := range ch[:pos] {
				li := listIndex(c.sumList, p)
				sums = append(sums, &gdnref.Summary{P: state(f.outP, li, h, HV), Q: state(f.outQ, li, h, HV)})
			}
			starts, err := gdnref.ComposeForward(nil, sums, dHead, dHead)
			require.NoError(t, err)
			putState(start, starts[pos], s, h, HV)
		}
	}
	requireRel(t, et, "compose start", f.start, start, fwdTol)

	hs, vnew, final := make([]float64, len(f.h)), make([]float64, len(f.vnew)), make([]float64, len(f.final))
	o := make([]float64, len(f.o))
	for s := 0; s < l.NS; s++ {
		c0, _ := l.chunks(s)
		t0 := int(l.segStart[s])
		for h := 0; h < HV; h++ {
			st, err := gdnref.StateWalk(segs[s][h], state(f.start, s, h, HV), 128)
			require.NoError(t, err)
			for ci, m := range st.H {
				putState(hs, m, c0+ci, h, HV)
			}
			putRows(vnew, st.VNew, t0, h, HV)
			putState(final, st.Final, s, h, HV)
			// The output from the kernel's states.
			kst := gdnref.NewStates(segs[s][h])
			for ci := range kst.H {
				kst.H[ci] = state(f.h, c0+ci, h, HV)
			}
			kst.VNew = rows(f.vnew, t0, int(l.segLen[s]), h, HV)
			out, err := gdnref.Output(segs[s][h], kst)
			require.NoError(t, err)
			putRows(o, out, t0, h, HV)
		}
	}
	requireRel(t, et, "state h", f.h, hs, fwdTol)
	requireRel(t, et, "state vnew", f.vnew, vnew, fwdTol)
	requireRel(t, et, "state final", f.final, final, fwdTol)
	requireBF16Close(t, et, "output o (bf16)", f.o, o)

	// End to end: the float64 forward of the raw inputs, document by document.
	oE, finalE := make([]float64, len(f.o)), make([]float64, len(f.final))
	for s := 0; s < l.NS; s++ {
		ch, pos := c.chainOf(s)
		if pos != 0 {
			continue
		}
		for h := 0; h < HV; h++ {
			var s0 *mat.Dense
			for _, x := range ch {
				seg, err := gdnref.Prep(rawHead(d, x, h), d.opts())
				require.NoError(t, err)
				st, err := gdnref.StateWalk(seg, s0, 64)
				require.NoError(t, err)
				out, err := gdnref.Output(seg, st)
				require.NoError(t, err)
				putRows(oE, out, int(l.segStart[x]), h, HV)
				putState(finalE, st.Final, x, h, HV)
				s0 = st.Final
			}
		}
	}
	requireRel(t, et, "end-to-end final", f.final, finalE, fwdTol)
	requireBF16Close(t, et, "end-to-end o (bf16)", f.o, oE)
}
