package gdnref

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// The prep's A = (I + L)^-1 (L_ij = beta_i (k_i . k_j) e^(gamma_i - gamma_j), j < i,
// 64 tokens) has a dependent chain that keeps the prep latency-bound
// (docs/perf-notes.md, "What a fused forward would need"). A product form,
// (I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8)(I + L^16)(I + L^32) (L
// strictly lower, so L^64 = 0), would put it on ten tensor-core products six
// deep. TestProductFormInverse measures it on the kernels' arithmetic (every
// product three bf16 products of a hi / lo split, accumulated in fp32)
// against float64 forward substitution, beside fp32 forward substitution (the
// precision class of the blocked substitution the prep runs), on W = A
// diag(beta e^gamma) K, the walks' input, for keys of three kinds. It pins the
// finding: fine on uncorrelated keys (4e-7), useless on correlated ones, whose
// powers of L grow (L^32's entries to 6e8 and 2e13) before they cancel (W's
// error 7e4 and 5e8); the substitution stays at fp32's ~1e-7 on all three.
func TestProductFormInverse(t *testing.T) {
	const C, D = 64, 128
	rng := rand.New(rand.NewPCG(7, 11))
	for _, tc := range []struct {
		name         string
		noise        float64 // k_i = normalise(noise n_i (+ base where shared)), n_i and base N(0, I)
		shared       bool    // base, a direction common to every key, in every key
		betaLo       float64 // beta in (betaLo, 1)
		gLo          float64 // g in (gLo, 0): per-token log decay
		maxPF, minPF float64 // bounds on the product form's error of W
	}{
		{"uncorrelated keys", 1, false, 0, -0.12, 1e-4, 0},
		{"correlated keys (k.k' ~ 0.8)", 0.5, true, 0.5, -0.05, math.Inf(1), 1e-2},
		{"near-equal keys (k.k' ~ 0.99)", 0.1, true, 0.5, -0.01, math.Inf(1), 1e-1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var base [D]float64
			for d := range base {
				base[d] = rng.NormFloat64()
			}
			k := make([][D]float64, C)
			for i := range k {
				var ss float64
				for d := range D {
					x := tc.noise * rng.NormFloat64()
					if tc.shared {
						x += base[d]
					}
					k[i][d] = x
					ss += x * x
				}
				for d := range D {
					k[i][d] /= math.Sqrt(ss)
				}
			}
			beta, gam := make([]float64, C), make([]float64, C)
			var acc float64
			for i := range C {
				beta[i] = tc.betaLo + (1-tc.betaLo)*rng.Float64()
				acc += tc.gLo * rng.Float64()
				gam[i] = acc
			}
			L := make([][]float64, C)
			for i := range L {
				L[i] = make([]float64, C)
				for j := range i {
					var dot float64
					for d := range D {
						dot += k[i][d] * k[j][d]
					}
					L[i][j] = beta[i] * dot * math.Exp(gam[i]-gam[j])
				}
			}
			ref := substitute(L, func(x float64) float64 { return x })
			f32 := substitute(L, func(x float64) float64 { return float64(float32(x)) })
			pf := productForm(L)
			// W = A diag(beta e^gamma) K in float64 from each A.
			w := func(A [][]float64) [][]float64 {
				out := make([][]float64, C)
				for i := range out {
					out[i] = make([]float64, D)
					for j := range C {
						c := A[i][j] * beta[j] * math.Exp(gam[j])
						for d := range D {
							out[i][d] += c * k[j][d]
						}
					}
				}
				return out
			}
			wr := w(ref)
			e32, epf := sliceRelErr(w(f32), wr), sliceRelErr(w(pf), wr)
			t.Logf("W's normwise error: fp32 substitution %.2g, product form %.2g (largest |L^32| entry %.2g)", e32, epf, maxPower(L, 32))
			assert.Less(t, e32, 1e-6, "the substitution")
			assert.Less(t, epf, tc.maxPF, "the product form")
			assert.GreaterOrEqual(t, epf, tc.minPF, "the product form")
		})
	}
}

// substitute is (I + L)^-1 by forward substitution, each value passed
// through round (float64 itself, or float32's rounding).
func substitute(L [][]float64, round func(float64) float64) [][]float64 {
	n := len(L)
	A := make([][]float64, n)
	for i := range A {
		A[i] = make([]float64, n)
	}
	for c := range n {
		A[c][c] = 1
		for i := c + 1; i < n; i++ {
			var s float64
			for j := c; j < i; j++ {
				s = round(s + round(round(L[i][j])*A[j][c]))
			}
			A[i][c] = round(-s)
		}
	}
	return A
}

// productForm is (I - L)(I + L^2)(I + L^4) ... (I + L^32) with every product
// on the kernels' arithmetic (mm3).
func productForm(L [][]float64) [][]float64 {
	n := len(L)
	M := make([][]float32, n) // -L, then its squares
	R := make([][]float32, n) // the running product, I - L first
	for i := range M {
		M[i], R[i] = make([]float32, n), make([]float32, n)
		for j := range n {
			M[i][j] = -float32(L[i][j])
			R[i][j] = M[i][j]
		}
		R[i][i] = 1
	}
	for s := 1; s < 6; s++ {
		M = mm3(M, M)
		IP := make([][]float32, n)
		for i := range IP {
			IP[i] = append([]float32(nil), M[i]...)
			IP[i][i]++
		}
		R = mm3(R, IP)
	}
	out := make([][]float64, n)
	for i := range out {
		out[i] = make([]float64, n)
		for j := range n {
			out[i][j] = float64(R[i][j])
		}
	}
	return out
}

// mm3 is X Y as the kernels form a product of fp32 operands: each split into
// bf16 hi + lo, the three products hi hi + hi lo + lo hi (each exact in
// fp32) accumulated in fp32 in k order.
func mm3(X, Y [][]float32) [][]float32 {
	n := len(X)
	split := func(v float32) (float32, float32) {
		h := bf16.Round(v)
		return h, bf16.Round(v - h)
	}
	Z := make([][]float32, n)
	for i := range Z {
		Z[i] = make([]float32, n)
		for j := range n {
			var s float32
			for k := range n {
				xh, xl := split(X[i][k])
				yh, yl := split(Y[k][j])
				s += xh*yh + xh*yl + xl*yh
			}
			Z[i][j] = s
		}
	}
	return Z
}

// maxPower is the largest |entry| of L^p.
func maxPower(L [][]float64, p int) float64 {
	n := len(L)
	P := make([][]float64, n)
	for i := range P {
		P[i] = append([]float64(nil), L[i]...)
	}
	for range p - 1 {
		Q := make([][]float64, n)
		for i := range Q {
			Q[i] = make([]float64, n)
			for k := range n {
				if P[i][k] != 0 {
					for j := range n {
						Q[i][j] += P[i][k] * L[k][j]
					}
				}
			}
		}
		P = Q
	}
	var m float64
	for i := range P {
		for _, v := range P[i] {
			m = math.Max(m, math.Abs(v))
		}
	}
	return m
}

// sliceRelErr is ||a - b|| / ||b|| (Frobenius) of row slices.
func sliceRelErr(a, b [][]float64) float64 {
	var num, den float64
	for i := range a {
		for j := range a[i] {
			d := a[i][j] - b[i][j]
			num += d * d
			den += b[i][j] * b[i][j]
		}
	}
	return math.Sqrt(num / den)
}
