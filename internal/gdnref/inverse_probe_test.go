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
// deep. TestInverseForms measures it on the kernels' arithmetic (every
// product three bf16 products of a hi / lo split, accumulated in fp32)
// against float64 forward substitution, beside the prep's blocked form (P3's
// fp32 diagonal inverses, P4's block columns on the same products), recursive
// doubling of the diagonal blocks (32 from 16, 64 from 32: a shorter chain)
// and scalar fp32 substitution, on W = A diag(beta e^gamma) K, the walks'
// input, for keys of three kinds. It pins the findings: the product form is
// fine on uncorrelated keys (4e-7) and useless on correlated ones, whose
// powers of L grow (L^32's entries to 6e8 and 2e13) before they cancel (W's
// error 7e4 and 5e8); recursive doubling is exactly as precise as the blocked
// form (2e-7, 9e-6, 4e-5 on the three kinds; its dependent depth is the same);
// and both lose two orders of magnitude to scalar fp32 substitution on
// near-equal keys (4e-5 against 5e-7), the split products' 2^-16 amplified by
// the inverse's cancellation. L formed from K K^T on the same split products
// costs little of it (scalar substitution on that L: 1.9e-6 and 2.7e-6 on the
// correlated kinds): the block products of the inverse set the error.
func TestInverseForms(t *testing.T) {
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
			// Ls: L as the prep forms it, K K^T on the split products (mm3), then beta and the decay in fp32.
			Kf, KT := make([][]float32, C), make([][]float32, D)
			for i := range Kf {
				Kf[i] = make([]float32, D)
				for d := range D {
					Kf[i][d] = float32(k[i][d])
				}
			}
			for d := range KT {
				KT[d] = make([]float32, C)
				for i := range C {
					KT[d][i] = Kf[i][d]
				}
			}
			KK := mm3(Kf, KT)
			Ls := make([][]float64, C)
			for i := range Ls {
				Ls[i] = make([]float64, C)
				for j := range i {
					Ls[i][j] = float64(float32(beta[i]) * KK[i][j] * float32(math.Exp(gam[i]-gam[j])))
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
			ebl, edb := sliceRelErr(w(blocked(L)), wr), sliceRelErr(w(doubling(L)), wr)
			eLs := sliceRelErr(w(substitute(Ls, func(x float64) float64 { return float64(float32(x)) })), wr)
			eBoth := sliceRelErr(w(blocked(Ls)), wr)
			t.Logf("W's normwise error: fp32 substitution %.2g, the prep's blocked form %.2g, recursive doubling %.2g, "+
				"product form %.2g (largest |L^32| entry %.2g); with L from split K K^T: fp32 substitution %.2g, blocked %.2g",
				e32, ebl, edb, epf, maxPower(L, 32), eLs, eBoth)
			assert.Less(t, e32, 1e-6, "the substitution")
			assert.Less(t, ebl, 1e-4, "the prep's blocked form")
			if tc.shared { // on uncorrelated keys L's split (4.7e-7) outweighs the block products' (2.2e-7)
				assert.InDelta(t, 1, eBoth/ebl, 0.5, "the blocked form's error is its block products' more than L's")
				assert.Less(t, 2*eLs, ebl, "on correlated keys the block products, not K K^T's split, set the error")
			}
			assert.InDelta(t, 1, edb/ebl, 0.5, "recursive doubling is as precise as the blocked form (%.2g, %.2g)", edb, ebl)
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
	return widen(R)
}

// diagInverses is a 64 x 64 fp32 matrix holding the inverses of (I + L)'s
// four 16 x 16 diagonal blocks by fp32 substitution (the prep's P3), zero
// elsewhere.
func diagInverses(L [][]float64) [][]float32 {
	n := len(L)
	A := make([][]float32, n)
	for i := range A {
		A[i] = make([]float32, n)
	}
	for b := 0; b < n; b += 16 {
		blk := make([][]float64, 16)
		for i := range blk {
			blk[i] = L[b+i][b : b+16]
		}
		inv := substitute(blk, func(x float64) float64 { return float64(float32(x)) })
		for i := range 16 {
			for j := range 16 {
				A[b+i][b+j] = float32(inv[i][j])
			}
		}
	}
	return A
}

// block is rows r0 .. r1-1, columns c0 .. c1-1 of m, in fp32 (a copy).
func block[T float32 | float64](m [][]T, r0, r1, c0, c1 int) [][]float32 {
	out := make([][]float32, r1-r0)
	for i := range out {
		out[i] = make([]float32, c1-c0)
		for j := range out[i] {
			out[i][j] = float32(m[r0+i][c0+j])
		}
	}
	return out
}

// setNeg writes -X into m at rows r0 .., columns c0 ...
func setNeg(m [][]float32, r0, c0 int, X [][]float32) {
	for i := range X {
		for j, v := range X[i] {
			m[r0+i][c0+j] = -v
		}
	}
}

// widen is m in float64.
func widen(m [][]float32) [][]float64 {
	out := make([][]float64, len(m))
	for i := range out {
		out[i] = make([]float64, len(m[i]))
		for j, v := range m[i] {
			out[i][j] = float64(v)
		}
	}
	return out
}

// doubling is (I + L)^-1 by recursive doubling on the kernels' arithmetic:
// the diagonal blocks' inverses (diagInverses), then [P 0; C Q]^-1 =
// [P^-1 0; -Q^-1 C P^-1  Q^-1] twice (32 from 16, 64 from 32), each
// off-diagonal block two dependent mm3 products.
func doubling(L [][]float64) [][]float64 {
	n, A := len(L), diagInverses(L)
	for w := 16; w < n; w *= 2 { // blocks of 2w from blocks of w
		for b := 0; b < n; b += 2 * w {
			Pi, Qi := block(A, b, b+w, b, b+w), block(A, b+w, b+2*w, b+w, b+2*w)
			setNeg(A, b+w, b, mm3(Qi, mm3(block(L, b+w, b+2*w, b, b+w), Pi)))
		}
	}
	return widen(A)
}

// blocked is (I + L)^-1 as the prep's P3 and P4 form it: the diagonal
// blocks D_b (diagInverses), then block column j walked down,
// A_ij = -D_i (sum over k = j .. i-1 of L_ik A_kj), the sum one mm3 product
// over the k blocks in order and the result a second.
func blocked(L [][]float64) [][]float64 {
	n, A := len(L), diagInverses(L)
	for j := 0; j < n; j += 16 {
		for i := j + 16; i < n; i += 16 {
			Di := block(A, i, i+16, i, i+16)
			setNeg(A, i, j, mm3(Di, mm3(block(L, i, i+16, j, i), block(A, j, i, j, j+16))))
		}
	}
	return widen(A)
}

// mm3 is X Y as the kernels form a product of fp32 operands: each split into
// bf16 hi + lo, the three products hi hi + hi lo + lo hi (each exact in
// fp32) accumulated in fp32 in k order.
func mm3(X, Y [][]float32) [][]float32 {
	m, kk, n := len(X), len(Y), len(Y[0])
	split := func(v float32) (float32, float32) {
		h := bf16.Round(v)
		return h, bf16.Round(v - h)
	}
	Z := make([][]float32, m)
	for i := range Z {
		Z[i] = make([]float32, n)
		for j := range n {
			var s float32
			for k := range kk {
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
