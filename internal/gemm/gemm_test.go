package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// general returns an r x c matrix with stride r's columns plus pad, filled with normal values; lower makes
// it lower triangular (zeros right of the diagonal).
func general(rng *rand.Rand, r, c, pad int, lower bool) blas64.General {
	g := blas64.General{Rows: r, Cols: c, Stride: max(1, c+pad), Data: make([]float64, r*max(1, c+pad))}
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			if !lower || j <= i {
				g.Data[i*g.Stride+j] = rng.NormFloat64()
			}
		}
	}
	return g
}

func clone(g blas64.General) blas64.General {
	g.Data = append([]float64(nil), g.Data...)
	return g
}

// requireBits requires the same bits everywhere in a and b (padding included).
func requireBits(t *testing.T, what string, a, b []float64) {
	t.Helper()
	require.Len(t, b, len(a), what)
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			require.Failf(t, "bits differ", "%s: element %d: %v vs %v", what, i, a[i], b[i])
		}
	}
}

// TestMatchesGonumBitwise: NN and TN give gonum's Dgemm bits, on the AVX2 kernels and on the Go kernel,
// for every shape class the kernels split (row groups and their remainder, 8- and 4-column blocks and
// the rest), strided operands, alpha and beta in every case Dgemm treats apart, and triangular a.
func TestMatchesGonumBitwise(t *testing.T) {
	avx2 := useAVX2
	defer func() { useAVX2 = avx2 }()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		m, n, k     int
		alpha, beta float64
		lower       bool
	}{
		{m: 64, n: 128, k: 128, alpha: -1, beta: 1},
		{m: 128, n: 64, k: 64, alpha: 1, beta: 0.75},
		{m: 64, n: 64, k: 64, alpha: 1, beta: 0, lower: true},
		{m: 7, n: 13, k: 5, alpha: 0.5, beta: -2},
		{m: 5, n: 4, k: 1, alpha: 2, beta: 0},
		{m: 3, n: 3, k: 9, alpha: 1, beta: 1},
		{m: 9, n: 12, k: 600, alpha: 1, beta: 1},
		{m: 6, n: 21, k: 0, alpha: 1, beta: 3},
		{m: 8, n: 16, k: 4, alpha: 0, beta: 0.5},
		{m: 1, n: 128, k: 128, alpha: 1, beta: 0},
		{m: 5, n: 43, k: 7, alpha: -1, beta: 1},
	} {
		for _, trans := range []bool{false, true} {
			for _, pad := range []int{0, 3} {
				name := fmt.Sprintf("%dx%dx%d_alpha%v_beta%v_lower%v_trans%v_pad%d", tc.m, tc.n, tc.k, tc.alpha, tc.beta, tc.lower, trans, pad)
				t.Run(name, func(t *testing.T) {
					var a blas64.General
					tA := blas.NoTrans
					if trans {
						a, tA = general(rng, tc.k, tc.m, pad, tc.lower), blas.Trans
					} else {
						a = general(rng, tc.m, tc.k, pad, tc.lower)
					}
					b := general(rng, tc.k, tc.n, pad, false)
					c := general(rng, tc.m, tc.n, pad, false)
					want := clone(c)
					blas64.Gemm(tA, blas.NoTrans, tc.alpha, a, b, tc.beta, want)
					for _, useASM := range []bool{true, false} {
						useAVX2 = avx2 && useASM
						got := clone(c)
						if trans {
							TN(tc.alpha, a, b, tc.beta, got)
						} else {
							NN(tc.alpha, a, b, tc.beta, got)
						}
						requireBits(t, fmt.Sprintf("asm %v", useAVX2), want.Data, got.Data)
					}
				})
			}
		}
	}
}

// TestGemvTMatchesGonumBitwise: TN with a one-column a is gonum's Dgemv(Trans) (what mat.VecDense.MulVec
// of a transposed matrix runs), bit for bit, on the AVX2 and Go paths.
func TestGemvTMatchesGonumBitwise(t *testing.T) {
	avx2 := useAVX2
	defer func() { useAVX2 = avx2 }()
	rng := rand.New(rand.NewPCG(9, 10))
	for _, tc := range []struct{ k, n int }{{128, 128}, {128, 64}, {16, 16}, {7, 21}, {3, 5}} {
		t.Run(fmt.Sprintf("%dx%d", tc.k, tc.n), func(t *testing.T) {
			a := general(rng, tc.k, tc.n, 0, false)
			x := general(rng, tc.k, 1, 0, false)
			want := make([]float64, tc.n)
			for i := range want {
				want[i] = 1e300 // beta = 0 must overwrite
			}
			blas64.Gemv(blas.Trans, 1, a, blas64.Vector{N: tc.k, Inc: 1, Data: x.Data}, 0, blas64.Vector{N: tc.n, Inc: 1, Data: want})
			for _, useASM := range []bool{true, false} {
				useAVX2 = avx2 && useASM
				got := blas64.General{Rows: 1, Cols: tc.n, Stride: tc.n, Data: make([]float64, tc.n)}
				for i := range got.Data {
					got.Data[i] = -7
				}
				TN(1, x, a, 0, got)
				requireBits(t, fmt.Sprintf("asm %v", useAVX2), want, got.Data)
			}
		})
	}
}

// TestColumnsIndependent: a column range of c computed alone has the bits it has in the whole product.
func TestColumnsIndependent(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := general(rng, 64, 128, 0, false)
	b := general(rng, 64, 128, 0, false)
	c := general(rng, 128, 128, 0, false)
	whole := clone(c)
	TN(1, a, b, 0.5, whole)
	for _, w := range []int{64, 13, 4, 1} {
		tiled := clone(c)
		for c0 := 0; c0 < 128; c0 += w {
			c1 := min(c0+w, 128)
			bv := blas64.General{Rows: 64, Cols: c1 - c0, Stride: b.Stride, Data: b.Data[c0:]}
			cv := blas64.General{Rows: 128, Cols: c1 - c0, Stride: tiled.Stride, Data: tiled.Data[c0:]}
			TN(1, a, bv, 0.5, cv)
		}
		requireBits(t, fmt.Sprintf("tiles of %d", w), whole.Data, tiled.Data)
	}
}

// TestShapePanics: mismatched shapes panic.
func TestShapePanics(t *testing.T) {
	g := func(r, c int) blas64.General {
		return blas64.General{Rows: r, Cols: c, Stride: c, Data: make([]float64, r*c)}
	}
	require.Panics(t, func() { NN(1, g(2, 3), g(4, 2), 0, g(2, 2)) })
	require.Panics(t, func() { TN(1, g(3, 2), g(4, 2), 0, g(2, 2)) })
}

func BenchmarkNN64x128x128(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	x, y, z := general(rng, 64, 128, 0, false), general(rng, 128, 128, 0, false), general(rng, 64, 128, 0, false)
	b.Run("gemm", func(b *testing.B) {
		for b.Loop() {
			NN(1, x, y, 1, z)
		}
	})
	b.Run("gonum", func(b *testing.B) {
		for b.Loop() {
			blas64.Gemm(blas.NoTrans, blas.NoTrans, 1, x, y, 1, z)
		}
	})
}
