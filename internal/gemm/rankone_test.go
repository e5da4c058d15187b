package gemm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"gonum.org/v1/gonum/blas/blas64"
)

func randVec(rng *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.NormFloat64()
	}
	return v
}

// TestRankOneMatchesGonumBitwise: ScaleRankOne is gonum's Dscal then Dger, and RankOneScale its Dger then
// Dscal, bit for bit, on the AVX2 and Go paths, in place and not, for row lengths around the 4-wide blocks
// and alpha 0 (which Dger skips).
func TestRankOneMatchesGonumBitwise(t *testing.T) {
	avx2 := useAVX2
	defer func() { useAVX2 = avx2 }()
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		m, n     int
		a, alpha float64
		pad      int
		inPlace  bool
	}{
		{m: 128, n: 128, a: 0.97, alpha: 1, inPlace: true},
		{m: 128, n: 128, a: 0.9, alpha: 1},
		{m: 16, n: 7, a: 1.3, alpha: -0.4, pad: 2},
		{m: 5, n: 3, a: 0.5, alpha: 2, inPlace: true},
		{m: 4, n: 12, a: 0.8, alpha: 0},
		{m: 3, n: 9, a: -1.5, alpha: 0.25, pad: 1, inPlace: true},
	} {
		name := fmt.Sprintf("%dx%d_a%v_alpha%v_pad%d_inplace%v", tc.m, tc.n, tc.a, tc.alpha, tc.pad, tc.inPlace)
		t.Run(name, func(t *testing.T) {
			src := general(rng, tc.m, tc.n, tc.pad, false)
			x, y := randVec(rng, tc.m), randVec(rng, tc.n)
			// Dscal then Dger.
			want1 := clone(src)
			for i := 0; i < tc.m; i++ {
				blas64.Scal(tc.a, blas64.Vector{N: tc.n, Inc: 1, Data: want1.Data[i*want1.Stride:]})
			}
			blas64.Ger(tc.alpha, blas64.Vector{N: tc.m, Inc: 1, Data: x}, blas64.Vector{N: tc.n, Inc: 1, Data: y}, want1)
			// Dger then Dscal.
			want2 := clone(src)
			blas64.Ger(tc.alpha, blas64.Vector{N: tc.m, Inc: 1, Data: x}, blas64.Vector{N: tc.n, Inc: 1, Data: y}, want2)
			for i := 0; i < tc.m; i++ {
				blas64.Scal(tc.a, blas64.Vector{N: tc.n, Inc: 1, Data: want2.Data[i*want2.Stride:]})
			}
			for _, useASM := range []bool{true, false} {
				useAVX2 = avx2 && useASM
				got1 := clone(src)
				if tc.inPlace {
					ScaleRankOne(got1, got1, tc.a, tc.alpha, x, y)
				} else {
					dst := clone(src)
					for i := range dst.Data {
						dst.Data[i] = 99
					}
					ScaleRankOne(dst, src, tc.a, tc.alpha, x, y)
					for i := 0; i < tc.m; i++ { // the padding is left alone
						copy(got1.Data[i*got1.Stride:i*got1.Stride+tc.n], dst.Data[i*dst.Stride:])
						for j := tc.n; j < dst.Stride && i*dst.Stride+j < len(dst.Data); j++ {
							require.Equal(t, 99.0, dst.Data[i*dst.Stride+j])
						}
					}
				}
				requireBits(t, fmt.Sprintf("ScaleRankOne, asm %v", useAVX2), want1.Data, got1.Data)
				got2 := clone(src)
				RankOneScale(got2, tc.alpha, x, y, tc.a)
				requireBits(t, fmt.Sprintf("RankOneScale, asm %v", useAVX2), want2.Data, got2.Data)
			}
		})
	}
	require.Panics(t, func() { RankOneScale(general(rng, 3, 4, 0, false), 1, make([]float64, 2), make([]float64, 4), 1) })
}
