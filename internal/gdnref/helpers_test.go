package gdnref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/mat"
)

// randDense returns an r x c matrix of standard normal entries times sd.
func randDense(rng *rand.Rand, r, c int, sd float64) *mat.Dense {
	m := mat.NewDense(r, c, nil)
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			m.Set(i, j, sd*rng.NormFloat64())
		}
	}
	return m
}

// randHead draws a head of t tokens: q, k, v normal; g in [-0.3, -0.01] (log decay); beta in [0.1, 0.9].
func randHead(rng *rand.Rand, t, dk, dv int) Head {
	h := Head{Q: randDense(rng, t, dk, 1), K: randDense(rng, t, dk, 1), V: randDense(rng, t, dv, 1),
		G: make([]float64, t), Beta: make([]float64, t)}
	for i := 0; i < t; i++ {
		h.G[i] = -0.01 - 0.29*rng.Float64()
		h.Beta[i] = 0.1 + 0.8*rng.Float64()
	}
	return h
}

// sliceHead returns the tokens [t0, t1) of h (copies).
func sliceHead(h Head, t0, t1 int) Head {
	return Head{
		Q: mat.DenseCopyOf(rowsOf(h.Q, t0, t1)), K: mat.DenseCopyOf(rowsOf(h.K, t0, t1)),
		V: mat.DenseCopyOf(rowsOf(h.V, t0, t1)),
		G: append([]float64(nil), h.G[t0:t1]...), Beta: append([]float64(nil), h.Beta[t0:t1]...),
	}
}

// relErr is the normwise relative error max|got - want| / max|want|.
func relErr(got, want mat.Matrix) float64 {
	r, c := want.Dims()
	diff, ref := 0.0, 0.0
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			diff = math.Max(diff, math.Abs(got.At(i, j)-want.At(i, j)))
			ref = math.Max(ref, math.Abs(want.At(i, j)))
		}
	}
	if ref == 0 {
		return diff
	}
	return diff / ref
}

func relErrVec(got, want []float64) float64 {
	return relErr(mat.NewDense(1, len(got), got), mat.NewDense(1, len(want), want))
}

// gradErrs returns the relative error of each gradient of got against want, by name.
func gradErrs(got, want *Grads) map[string]float64 {
	return map[string]float64{
		"dq": relErr(got.DQ, want.DQ), "dk": relErr(got.DK, want.DK), "dv": relErr(got.DV, want.DV),
		"dg": relErrVec(got.DG, want.DG), "dbeta": relErrVec(got.DBeta, want.DBeta), "ds0": relErr(got.DS0, want.DS0),
	}
}

// requireSmall checks every error in errs is below tol and returns the largest.
func requireSmall(t *testing.T, errs map[string]float64, tol float64) float64 {
	t.Helper()
	worst := 0.0
	for name, e := range errs {
		require.Lessf(t, e, tol, "%s: relative error %.3g", name, e)
		worst = math.Max(worst, e)
	}
	return worst
}

// requireBitwise checks that a and b hold the same float64 bits.
func requireBitwise(t *testing.T, name string, a, b *mat.Dense) {
	t.Helper()
	ar, ac := a.Dims()
	br, bc := b.Dims()
	require.Equal(t, [2]int{ar, ac}, [2]int{br, bc}, name)
	for i := 0; i < ar; i++ {
		for j := 0; j < ac; j++ {
			if math.Float64bits(a.At(i, j)) != math.Float64bits(b.At(i, j)) {
				t.Fatalf("%s: bits differ at (%d,%d): %v vs %v", name, i, j, a.At(i, j), b.At(i, j))
			}
		}
	}
}

func requireBitwiseVec(t *testing.T, name string, a, b []float64) {
	t.Helper()
	requireBitwise(t, name, mat.NewDense(1, len(a), a), mat.NewDense(1, len(b), b))
}

func requireBitwiseGrads(t *testing.T, a, b *Grads) {
	t.Helper()
	requireBitwise(t, "dq", a.DQ, b.DQ)
	requireBitwise(t, "dk", a.DK, b.DK)
	requireBitwise(t, "dv", a.DV, b.DV)
	requireBitwiseVec(t, "dg", a.DG, b.DG)
	requireBitwiseVec(t, "dbeta", a.DBeta, b.DBeta)
	requireBitwise(t, "ds0", a.DS0, b.DS0)
}
