package gdnref

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/floats"
	"gonum.org/v1/gonum/mat"
)

// Chunk is the prepared form of one chunk: tokens [Start, Start+Len) of its segment (Len <= ChunkSize).
// Row i of each matrix is the chunk's i-th token.
type Chunk struct {
	Start, Len int
	Q, K       *mat.Dense // Len x K, as the kernel sees them (l2-normalised unless NoL2Norm); views
	V          *mat.Dense // Len x V; view
	Beta       []float64  // Len
	Gamma      []float64  // Len: gamma_i = g_0 + ... + g_i, the in-chunk cumulative log decay
	Decay      float64    // exp(gamma_last)
	A          *mat.Dense // Len x Len: (I + strict_lower(diag(beta) K Kᵀ ⊙ Γ))⁻¹, unit lower triangular
	W          *mat.Dense // Len x K: A diag(beta ⊙ exp(gamma)) K
	U          *mat.Dense // Len x V: A diag(beta) V
	Kt         *mat.Dense // Len x K: diag(exp(gamma_last - gamma)) K
	Qg         *mat.Dense // Len x K: diag(exp(gamma)) Q
}

// gammaDiff writes into m (Len x Len) Γ_ij = exp(gamma_i - gamma_j) for j <= i and 0 above the diagonal.
func (c *Chunk) gammaDiff(m *mat.Dense) *mat.Dense {
	for i := 0; i < c.Len; i++ {
		row := m.RawRowView(i)[:c.Len]
		for j := 0; j <= i; j++ {
			row[j] = math.Exp(c.Gamma[i] - c.Gamma[j])
		}
		clear(row[i+1:])
	}
	return m
}

// attention returns the in-chunk attention (Q Kᵀ ⊙ Γ ⊙ causal), causal including the diagonal (Len x Len),
// on ws.
func (c *Chunk) attention(ws *scratch) *mat.Dense {
	qk := ws.dense(c.Len, c.Len)
	mulNT(ws, qk, c.Q, c.K)
	qk.MulElem(qk, c.gammaDiff(ws.dense(c.Len, c.Len))) // Γ is zero above the diagonal
	return qk
}

// Segment is the chunk prep of one segment of one value head: the normalised q, k and the chunks.
// It is read-only once built; every walk reads it.
type Segment struct {
	T, Dk, Dv  int
	Scale      float64
	Q, K       *mat.Dense // T x K as the kernel sees them
	V          *mat.Dense // T x V (a copy of the input)
	QInv, KInv []float64  // inverse l2 norms of the raw q, k rows (nil without l2norm)
	Chunks     []Chunk
}

// Prep normalises q and k and prepares every chunk of the segment h (chunks of ChunkSize tokens from the
// segment's start, the last one possibly shorter):
//
//	gamma = in-chunk cumsum of g
//	L_ij  = beta_i (k_i · k_j) exp(gamma_i - gamma_j)  for j < i, 0 otherwise
//	A     = (I + L)⁻¹ by forward substitution: row_i(A) = e_i - sum_{j<i} L_ij row_j(A)
//	W     = A diag(beta ⊙ exp(gamma)) K,   U = A diag(beta) V
//	Kt    = diag(exp(gamma_last - gamma)) K,   Qg = diag(exp(gamma)) Q
func Prep(h Head, opt Options) (*Segment, error) {
	t, dk, dv, err := h.Dims()
	if err != nil {
		return nil, err
	}
	if t == 0 {
		return nil, fmt.Errorf("gdnref: Prep: empty segment (T = 0)")
	}
	s := &Segment{T: t, Dk: dk, Dv: dv, Scale: opt.scaleFor(dk), V: mat.DenseCopyOf(h.V)}
	s.Q, s.K, s.QInv, s.KInv = normalisedQK(h, opt)
	ws := getScratch()
	defer putScratch(ws)
	for start := 0; start < t; start += ChunkSize {
		n := min(ChunkSize, t-start)
		c := Chunk{
			Start: start, Len: n,
			Q: rowsOf(s.Q, start, start+n), K: rowsOf(s.K, start, start+n), V: rowsOf(s.V, start, start+n),
			Beta:  append([]float64(nil), h.Beta[start:start+n]...),
			Gamma: make([]float64, n),
		}
		acc := 0.0
		for i := range c.Gamma {
			acc += h.G[start+i]
			c.Gamma[i] = acc
		}
		c.Decay = math.Exp(c.Gamma[n-1])

		// L = strict_lower(diag(beta) K Kᵀ ⊙ Γ), then A = (I + L)⁻¹ by forward substitution.
		ws.reset()
		kk := ws.dense(n, n)
		mulNT(ws, kk, c.K, c.K)
		c.A = mat.NewDense(n, n, nil)
		for i := 0; i < n; i++ {
			ai := c.A.RawRowView(i)
			ai[i] = 1
			for j := 0; j < i; j++ {
				lij := c.Beta[i] * kk.At(i, j) * math.Exp(c.Gamma[i]-c.Gamma[j])
				// row j of A is zero right of its diagonal
				floats.AddScaled(ai[:j+1], -lij, c.A.RawRowView(j)[:j+1])
			}
		}

		bg := ws.floats(n)   // beta ⊙ exp(gamma)
		tail := ws.floats(n) // exp(gamma_last - gamma)
		eg := ws.floats(n)   // exp(gamma)
		for i := range bg {
			eg[i] = math.Exp(c.Gamma[i])
			bg[i] = c.Beta[i] * eg[i]
			tail[i] = math.Exp(c.Gamma[n-1] - c.Gamma[i])
		}
		bk := ws.dense(n, dk)
		scaleRowsTo(bk, bg, c.K)
		c.W = mat.NewDense(n, dk, nil)
		mulNN(c.W, c.A, bk)
		bv := ws.dense(n, dv)
		scaleRowsTo(bv, c.Beta, c.V)
		c.U = mat.NewDense(n, dv, nil)
		mulNN(c.U, c.A, bv)
		c.Kt = scaleRows(tail, c.K)
		c.Qg = scaleRows(eg, c.Q)
		s.Chunks = append(s.Chunks, c)
	}
	return s, nil
}

// checkTile checks a column range [c0, c1) within [0, n).
func checkTile(what string, c0, c1, n int) error {
	if c0 < 0 || c1 > n || c0 >= c1 {
		return fmt.Errorf("gdnref: %s: column range [%d, %d) not within [0, %d)", what, c0, c1, n)
	}
	return nil
}

// tokenMatrix checks that m is T x c for the segment.
func (s *Segment) tokenMatrix(name string, m *mat.Dense, c int) error {
	if m == nil {
		return fmt.Errorf("gdnref: %s must be set", name)
	}
	if r, cc := m.Dims(); r != s.T || cc != c {
		return fmt.Errorf("gdnref: %s is %dx%d, want %dx%d", name, r, cc, s.T, c)
	}
	return nil
}
