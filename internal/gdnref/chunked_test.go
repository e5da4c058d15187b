package gdnref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"
)

// TestChunkedMatchesNaive: one segment through Prep + StateWalk + Output and DVLocal + TapeWalk + ChunkGrads
// equals the token-by-token recurrence and its backward.
func TestChunkedMatchesNaive(t *testing.T) {
	cases := []struct {
		name      string
		t, dk, dv int
		vh        int
		opt       Options
		s0, dsf   bool
		setG      bool // draw g in [gLo, gHi] instead of randHead's [-0.3, -0.01]
		gLo, gHi  float64
	}{
		{name: "T=1", t: 1, dk: 16, dv: 16, vh: 16, s0: true, dsf: true},
		{name: "T=37 <C", t: 37, dk: 16, dv: 16, vh: 8, s0: true, dsf: true},
		{name: "T=64 =C", t: 64, dk: 16, dv: 16, vh: 16, s0: true},
		{name: "T=65", t: 65, dk: 16, dv: 32, vh: 16, dsf: true},
		{name: "T=130", t: 130, dk: 32, dv: 16, vh: 16, s0: true, dsf: true},
		{name: "T=200", t: 200, dk: 16, dv: 32, vh: 32, s0: true, dsf: true},
		{name: "T=200 no l2norm", t: 200, dk: 16, dv: 16, vh: 8, opt: Options{NoL2Norm: true, Scale: 0.1}, s0: true, dsf: true},
		{name: "T=150 strong decay", t: 150, dk: 16, dv: 16, vh: 16, s0: true, dsf: true, setG: true, gLo: -3, gHi: -0.5},
		{name: "T=150 no decay", t: 150, dk: 16, dv: 16, vh: 16, s0: true, dsf: true, setG: true},
		{name: "T=130 K=V=128", t: 130, dk: 128, dv: 128, vh: 64, s0: true, dsf: true},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 1))
			h := randHead(rng, tc.t, tc.dk, tc.dv)
			if tc.setG {
				for i := range h.G {
					h.G[i] = tc.gLo + (tc.gHi-tc.gLo)*rng.Float64()
				}
			}
			if tc.opt.NoL2Norm { // keep q, k at unit scale, as the l2norm would
				h.Q.Scale(1/math.Sqrt(float64(tc.dk)), h.Q)
				h.K.Scale(1/math.Sqrt(float64(tc.dk)), h.K)
			}
			var s0, dsf *mat.Dense
			if tc.s0 {
				s0 = randDense(rng, tc.dk, tc.dv, 1)
			}
			if tc.dsf {
				dsf = randDense(rng, tc.dk, tc.dv, 1)
			}
			dO := randDense(rng, tc.t, tc.dv, 1)

			oN, sN, err := Forward(h, s0, tc.opt)
			require.NoError(t, err)
			gN, err := Backward(h, s0, dO, dsf, tc.opt)
			require.NoError(t, err)

			oC, sC, err := ChunkedForward(h, s0, tc.opt, tc.vh)
			require.NoError(t, err)
			gC, err := ChunkedBackward(h, s0, dO, dsf, tc.opt, tc.vh)
			require.NoError(t, err)

			errs := gradErrs(gC, gN)
			errs["o"] = relErr(oC, oN)
			errs["sfinal"] = relErr(sC, sN)
			worst := requireSmall(t, errs, 1e-10)
			t.Logf("max rel err %.2e (o %.1e, sfinal %.1e, dq %.1e, dk %.1e, dv %.1e, dg %.1e, dbeta %.1e, ds0 %.1e)",
				worst, errs["o"], errs["sfinal"], errs["dq"], errs["dk"], errs["dv"], errs["dg"], errs["dbeta"], errs["ds0"])
		})
	}
}

// runDocumentCP processes one document cut into segments of the given lengths exactly as the CP orchestrator
// will: per segment Prep; summary walks for all but the last; ComposeForward; state walks and outputs;
// DVLocal; offset walks for all but the first; ComposeBackward; tape walks; ChunkGrads. It returns the
// concatenated outputs and gradients, the final state and the composed start states and terminal adjoints.
func runDocumentCP(t *testing.T, h Head, lens []int, s0, dO, dsf *mat.Dense, opt Options, vh int) (o, sFinal *mat.Dense, g *Grads) {
	t.Helper()
	total, dk, dv, err := h.Dims()
	require.NoError(t, err)
	var segs []*Segment
	var dOs []*mat.Dense
	at := 0
	for _, n := range lens {
		s, err := Prep(sliceHead(h, at, at+n), opt)
		require.NoError(t, err)
		segs = append(segs, s)
		dOs = append(dOs, mat.DenseCopyOf(rowsOf(dO, at, at+n)))
		at += n
	}
	require.Equal(t, total, at)

	// Forward: summaries of all but the last segment, compose, state walks, outputs.
	var sums []*Summary
	for _, s := range segs[:len(segs)-1] {
		sum, err := SummaryWalk(s, vh)
		require.NoError(t, err)
		sums = append(sums, sum)
	}
	starts, err := ComposeForward(s0, sums, dk, dv)
	require.NoError(t, err)
	var states []*States
	o = mat.NewDense(total, dv, nil)
	at = 0
	for j, s := range segs {
		st, err := StateWalk(s, starts[j], vh)
		require.NoError(t, err)
		states = append(states, st)
		oj, err := Output(s, st)
		require.NoError(t, err)
		rowsOf(o, at, at+s.T).Copy(oj)
		at += s.T
		if j+1 < len(segs) { // the composed start of the next segment is this segment's end state
			require.Less(t, relErr(st.Final, starts[j+1]), 1e-12)
		}
	}
	sFinal = states[len(states)-1].Final

	// Backward: local dV', offsets of all but the first segment, reverse compose, tape walks, gradients.
	var dvls []*mat.Dense
	var offs []*Offset
	for j, s := range segs {
		dvl, err := DVLocal(s, dOs[j])
		require.NoError(t, err)
		dvls = append(dvls, dvl)
		if j > 0 {
			off, err := OffsetWalk(s, dvl, dOs[j], vh)
			require.NoError(t, err)
			offs = append(offs, off)
		}
	}
	ends, err := ComposeBackward(dsf, offs, dk, dv)
	require.NoError(t, err)
	g = &Grads{DQ: mat.NewDense(total, dk, nil), DK: mat.NewDense(total, dk, nil), DV: mat.NewDense(total, dv, nil),
		DG: make([]float64, total), DBeta: make([]float64, total)}
	at = 0
	for j, s := range segs {
		tp, err := TapeWalk(s, dvls[j], dOs[j], ends[j], vh)
		require.NoError(t, err)
		gj, err := ChunkGrads(s, states[j], tp, dOs[j])
		require.NoError(t, err)
		rowsOf(g.DQ, at, at+s.T).Copy(gj.DQ)
		rowsOf(g.DK, at, at+s.T).Copy(gj.DK)
		rowsOf(g.DV, at, at+s.T).Copy(gj.DV)
		copy(g.DG[at:], gj.DG)
		copy(g.DBeta[at:], gj.DBeta)
		at += s.T
		if j == 0 {
			g.DS0 = gj.DS0
		} else { // the start adjoint of segment j is the composed terminal adjoint of segment j-1
			require.Less(t, relErr(gj.DS0, ends[j-1]), 1e-12)
		}
	}
	return o, sFinal, g
}

// TestDocumentSplitMatchesNaive: a document cut into 2-4 segments, run through the CP algebra (summary walk,
// compose, state walk; offset walk, reverse compose, tape walk, chunk gradients), equals the naive recurrence
// on the whole document.
func TestDocumentSplitMatchesNaive(t *testing.T) {
	cases := []struct {
		name    string
		lens    []int
		dk, dv  int
		vh      int
		s0, dsf bool
	}{
		{name: "2 segs 70+130", lens: []int{70, 130}, dk: 16, dv: 16, vh: 8, s0: true, dsf: true},
		{name: "2 segs 5+59 (one chunk)", lens: []int{5, 59}, dk: 16, dv: 32, vh: 16},
		{name: "3 segs 50+50+50", lens: []int{50, 50, 50}, dk: 32, dv: 16, vh: 16, dsf: true},
		{name: "4 segs 1+63+64+72", lens: []int{1, 63, 64, 72}, dk: 16, dv: 16, vh: 16, s0: true, dsf: true},
		{name: "4 segs 130+2+3+65", lens: []int{130, 2, 3, 65}, dk: 32, dv: 32, vh: 32, s0: true},
		{name: "3 segs 64+64+64", lens: []int{64, 64, 64}, dk: 16, dv: 16, vh: 5, s0: true, dsf: true},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 2))
			total := 0
			for _, n := range tc.lens {
				total += n
			}
			h := randHead(rng, total, tc.dk, tc.dv)
			var s0, dsf *mat.Dense
			if tc.s0 {
				s0 = randDense(rng, tc.dk, tc.dv, 1)
			}
			if tc.dsf {
				dsf = randDense(rng, tc.dk, tc.dv, 1)
			}
			dO := randDense(rng, total, tc.dv, 1)
			oN, sN, err := Forward(h, s0, Options{})
			require.NoError(t, err)
			gN, err := Backward(h, s0, dO, dsf, Options{})
			require.NoError(t, err)

			o, sF, g := runDocumentCP(t, h, tc.lens, s0, dO, dsf, Options{}, tc.vh)
			errs := gradErrs(g, gN)
			errs["o"] = relErr(o, oN)
			errs["sfinal"] = relErr(sF, sN)
			worst := requireSmall(t, errs, 1e-10)
			t.Logf("max rel err %.2e (o %.1e, sfinal %.1e, dq %.1e, dk %.1e, dv %.1e, dg %.1e, dbeta %.1e, ds0 %.1e)",
				worst, errs["o"], errs["sfinal"], errs["dq"], errs["dk"], errs["dv"], errs["dg"], errs["dbeta"], errs["ds0"])
		})
	}
}

// TestSummaryAndOffsetAgree: the offset walk's Pᵀ is the transpose of the summary walk's P, and the summary
// applied to a start state gives the state walk's final state.
func TestSummaryAndOffsetAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	h := randHead(rng, 150, 16, 32)
	s, err := Prep(h, Options{})
	require.NoError(t, err)
	sum, err := SummaryWalk(s, 16)
	require.NoError(t, err)
	dO := randDense(rng, 150, 32, 1)
	dvl, err := DVLocal(s, dO)
	require.NoError(t, err)
	off, err := OffsetWalk(s, dvl, dO, 16)
	require.NoError(t, err)
	require.Less(t, relErr(off.PT, sum.P.T()), 1e-12)

	h0 := randDense(rng, 16, 32, 1)
	st, err := StateWalk(s, h0, 16)
	require.NoError(t, err)
	want := mul(sum.P, h0)
	want.Add(want, sum.Q)
	require.Less(t, relErr(st.Final, want), 1e-12)

	// D_start = Pᵀ D_end + R against the tape walk from the same D_end.
	dEnd := randDense(rng, 16, 32, 1)
	tp, err := TapeWalk(s, dvl, dO, dEnd, 16)
	require.NoError(t, err)
	wantD := mul(off.PT, dEnd)
	wantD.Add(wantD, off.R)
	require.Less(t, relErr(tp.DStart, wantD), 1e-12)
}
