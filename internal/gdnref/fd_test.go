package gdnref

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"
)

// fdStep is the central finite-difference step; fdTol bounds |analytic - fd| / max(1, |analytic|).
const (
	fdStep = 1e-5
	fdTol  = 1e-7
)

// param is one scalar input that a finite difference perturbs.
type param struct {
	name string
	ptr  *float64
	grad float64
}

// denseParams lists the entries of m with their analytic gradients from gm.
func denseParams(name string, m, gm *mat.Dense) []param {
	r, c := m.Dims()
	var ps []param
	for i := 0; i < r; i++ {
		row := m.RawRowView(i)
		for j := 0; j < c; j++ {
			ps = append(ps, param{fmt.Sprintf("%s[%d,%d]", name, i, j), &row[j], gm.At(i, j)})
		}
	}
	return ps
}

func vecParams(name string, v, gv []float64) []param {
	var ps []param
	for i := range v {
		ps = append(ps, param{fmt.Sprintf("%s[%d]", name, i), &v[i], gv[i]})
	}
	return ps
}

// checkFD compares each param's analytic gradient with (loss(x+h) - loss(x-h)) / 2h and returns the largest
// scaled difference.
func checkFD(t *testing.T, ps []param, loss func() float64) float64 {
	t.Helper()
	worst := 0.0
	for _, p := range ps {
		x := *p.ptr
		*p.ptr = x + fdStep
		lp := loss()
		*p.ptr = x - fdStep
		lm := loss()
		*p.ptr = x
		fd := (lp - lm) / (2 * fdStep)
		e := math.Abs(fd-p.grad) / math.Max(1, math.Abs(p.grad))
		require.Lessf(t, e, fdTol, "%s: analytic %.12g, finite difference %.12g", p.name, p.grad, fd)
		worst = math.Max(worst, e)
	}
	return worst
}

// TestNaiveBackwardFiniteDifferences: the naive backward equals central finite differences of
// L = <dO, O> + <dSFinal, S_T> for every input, including the initial state and q, k before the l2norm.
func TestNaiveBackwardFiniteDifferences(t *testing.T) {
	for _, tc := range []struct {
		t   int
		opt Options
	}{
		{t: 5}, {t: 6}, {t: 7}, {t: 8}, {t: 9},
		{t: 7, opt: Options{NoL2Norm: true, Scale: 0.3}},
	} {
		t.Run(fmt.Sprintf("T=%d l2norm=%v", tc.t, !tc.opt.NoL2Norm), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.t), 3))
			const dk, dv = 4, 4
			h := randHead(rng, tc.t, dk, dv)
			s0 := randDense(rng, dk, dv, 1)
			dO := randDense(rng, tc.t, dv, 1)
			dsf := randDense(rng, dk, dv, 1)
			loss := func() float64 {
				o, s, err := Forward(h, s0, tc.opt)
				require.NoError(t, err)
				return frobenius(dO, o) + frobenius(dsf, s)
			}
			g, err := Backward(h, s0, dO, dsf, tc.opt)
			require.NoError(t, err)
			var ps []param
			ps = append(ps, denseParams("q", h.Q, g.DQ)...)
			ps = append(ps, denseParams("k", h.K, g.DK)...)
			ps = append(ps, denseParams("v", h.V, g.DV)...)
			ps = append(ps, vecParams("g", h.G, g.DG)...)
			ps = append(ps, vecParams("beta", h.Beta, g.DBeta)...)
			ps = append(ps, denseParams("s0", s0, g.DS0)...)
			t.Logf("%d inputs, max scaled |analytic - fd| %.2e", len(ps), checkFD(t, ps, loss))
		})
	}
}

// TestNaiveBackwardFiniteDifferencesLong spot-checks the naive backward on a document longer than its
// checkpoint block (the states are recomputed block by block), at inputs in every block.
func TestNaiveBackwardFiniteDifferencesLong(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 3))
	const n, dk, dv = 150, 4, 4
	h := randHead(rng, n, dk, dv)
	s0 := randDense(rng, dk, dv, 1)
	dO := randDense(rng, n, dv, 1)
	dsf := randDense(rng, dk, dv, 1)
	loss := func() float64 {
		o, s, err := Forward(h, s0, Options{})
		require.NoError(t, err)
		return frobenius(dO, o) + frobenius(dsf, s)
	}
	g, err := Backward(h, s0, dO, dsf, Options{})
	require.NoError(t, err)
	var ps []param
	for _, tok := range []int{0, 63, 64, 100, 128, 149} {
		ps = append(ps,
			param{fmt.Sprintf("q[%d,1]", tok), &h.Q.RawRowView(tok)[1], g.DQ.At(tok, 1)},
			param{fmt.Sprintf("k[%d,2]", tok), &h.K.RawRowView(tok)[2], g.DK.At(tok, 2)},
			param{fmt.Sprintf("v[%d,3]", tok), &h.V.RawRowView(tok)[3], g.DV.At(tok, 3)},
			param{fmt.Sprintf("g[%d]", tok), &h.G[tok], g.DG[tok]},
			param{fmt.Sprintf("beta[%d]", tok), &h.Beta[tok], g.DBeta[tok]})
	}
	ps = append(ps, denseParams("s0", s0, g.DS0)...)
	t.Logf("%d inputs, max scaled |analytic - fd| %.2e", len(ps), checkFD(t, ps, loss))
}

// TestConvFiniteDifferences: the conv backward equals central finite differences of L = <dY, y> for x, the
// halo and w.
func TestConvFiniteDifferences(t *testing.T) {
	for _, withHalo := range []bool{false, true} {
		t.Run(fmt.Sprintf("halo=%v", withHalo), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 5))
			const n, ch = 7, 3
			x := randDense(rng, n, ch, 1)
			w := randDense(rng, ch, ConvWidth, 0.7)
			var halo *mat.Dense
			if withHalo {
				halo = randDense(rng, ConvHalo, ch, 1)
			}
			dy := randDense(rng, n, ch, 1)
			loss := func() float64 {
				y, err := Conv1dForward(x, w, halo)
				require.NoError(t, err)
				return frobenius(dy, y)
			}
			dx, dhalo, dw, err := Conv1dBackward(x, w, halo, dy)
			require.NoError(t, err)
			ps := append(denseParams("x", x, dx), denseParams("w", w, dw)...)
			if withHalo {
				ps = append(ps, denseParams("halo", halo, dhalo)...)
			}
			t.Logf("%d inputs, max scaled |analytic - fd| %.2e", len(ps), checkFD(t, ps, loss))
		})
	}
}

// TestForwardBackwardBitwise: ForwardBackward returns Forward's outputs and final state and Backward's
// gradients bit for bit, across checkpoint blocks, with and without an initial state and a final adjoint.
func TestForwardBackwardBitwise(t *testing.T) {
	for _, tc := range []struct {
		name      string
		t, d      int
		s0, dsf   bool
		opt       Options
		wantError string
	}{
		{name: "short", t: 9, d: 4},
		{name: "blocks", t: 2*naiveCheckpoint + 5, d: 8, s0: true, dsf: true},
		{name: "one block exactly", t: naiveCheckpoint, d: 16, dsf: true},
		{name: "no l2norm", t: 70, d: 4, s0: true, opt: Options{NoL2Norm: true, Scale: 0.3}},
		{name: "empty", t: 0, d: 4, wantError: "ForwardBackward: empty head"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.t), 5))
			h := Head{Q: &mat.Dense{}, K: &mat.Dense{}, V: &mat.Dense{}}
			var dO, s0, dsf *mat.Dense
			if tc.t > 0 {
				h = randHead(rng, tc.t, tc.d, tc.d)
				dO = randDense(rng, tc.t, tc.d, 1)
			}
			if tc.s0 {
				s0 = randDense(rng, tc.d, tc.d, 1)
			}
			if tc.dsf {
				dsf = randDense(rng, tc.d, tc.d, 1)
			}
			o, sf, g, err := ForwardBackward(h, s0, dO, dsf, tc.opt)
			if tc.wantError != "" {
				require.ErrorContains(t, err, tc.wantError)
				return
			}
			require.NoError(t, err)
			wantO, wantSF, err := Forward(h, s0, tc.opt)
			require.NoError(t, err)
			wantG, err := Backward(h, s0, dO, dsf, tc.opt)
			require.NoError(t, err)
			requireBitwise(t, "o", wantO, o)
			requireBitwise(t, "final state", wantSF, sf)
			requireBitwiseGrads(t, wantG, g)
		})
	}
}
