package gdnref

import (
	"sync"

	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/internal/gemm"
)

// rowsOf returns the view of rows [r0, r1) of m (shares m's storage).
func rowsOf(m *mat.Dense, r0, r1 int) *mat.Dense {
	_, c := m.Dims()
	return m.Slice(r0, r1, 0, c).(*mat.Dense)
}

// colsOf returns the view of columns [c0, c1) of m (shares m's storage).
func colsOf(m *mat.Dense, c0, c1 int) *mat.Dense {
	r, _ := m.Dims()
	return m.Slice(0, r, c0, c1).(*mat.Dense)
}

// gemmNN computes c = alpha a b + beta c (b and c may be column views).
//
// The walks use only gemmNN and gemmTN, with the column-tiled matrix as b and c: each column of c then
// depends on the same column of b alone, as package gemm sums every element over the inner index in order,
// the same way on every path (AVX2 or Go, any shape), so a column's bits do not depend on the tile width,
// the thread count or the CPU. (A product with a transposed right operand, a bᵀ, through gonum would not
// do: gonum computes it by dot products that its parallel path splits into blocks of the inner index, and
// whether it takes that path depends on the number of columns.) The bits are those of gonum's Dgemm for
// the same two forms (see package gemm).
func gemmNN(alpha float64, a, b *mat.Dense, beta float64, c *mat.Dense) {
	gemm.NN(alpha, a.RawMatrix(), b.RawMatrix(), beta, c.RawMatrix())
}

// gemmTN computes c = alpha aᵀ b + beta c (b and c may be column views). See gemmNN.
func gemmTN(alpha float64, a, b *mat.Dense, beta float64, c *mat.Dense) {
	gemm.TN(alpha, a.RawMatrix(), b.RawMatrix(), beta, c.RawMatrix())
}

// mulNN sets c = a b (c must be sized, and must not share storage with a or b): gonum's a.Mul(a, b), bit
// for bit (see package gemm).
func mulNN(c, a, b *mat.Dense) { gemmNN(1, a, b, 0, c) }

// mulTN sets c = aᵀ b, as mulNN.
func mulTN(c, a, b *mat.Dense) { gemmTN(1, a, b, 0, c) }

// mulNT sets c = a bᵀ (c must be sized, and must not share storage with a or b): bᵀ is copied onto ws
// and the product runs as mulNN, so every element sums over the inner index in order, like the others.
func mulNT(ws *scratch, c, a, b *mat.Dense) {
	r, k := b.Dims()
	bt := ws.dense(k, r)
	raw := bt.RawMatrix()
	for i := 0; i < r; i++ {
		for l, v := range b.RawRowView(i)[:k] {
			raw.Data[l*raw.Stride+i] = v
		}
	}
	mulNN(c, a, bt)
}

// addTo sets dst = dst + src elementwise (mat.Dense.Add's operations).
func addTo(dst, src *mat.Dense) {
	r, c := dst.Dims()
	for i := 0; i < r; i++ {
		d, s := dst.RawRowView(i)[:c], src.RawRowView(i)[:c]
		for j, v := range s {
			d[j] += v
		}
	}
}

// scaleRowsTo sets dst = diag(s) m (dst may be m): dst_ij = m_ij s_i, as scaleRows.
func scaleRowsTo(dst *mat.Dense, s []float64, m *mat.Dense) {
	r, c := m.Dims()
	for i := 0; i < r; i++ {
		d, x := dst.RawRowView(i)[:c], m.RawRowView(i)[:c]
		for j, v := range x {
			d[j] = v * s[i]
		}
	}
}

// scaleTo sets dst = f m elementwise (dst may be m), as mat.Dense.Scale.
func scaleTo(dst *mat.Dense, f float64, m *mat.Dense) {
	r, c := m.Dims()
	for i := 0; i < r; i++ {
		d, x := dst.RawRowView(i)[:c], m.RawRowView(i)[:c]
		for j, v := range x {
			d[j] = v * f
		}
	}
}

// scratch hands out matrices and vectors from one buffer that it reuses: after reset, every matrix it
// handed out before may be handed out again, so a caller writes each one whole before reading it.
type scratch struct {
	buf []float64
	off int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch  { return scratchPool.Get().(*scratch) }
func putScratch(s *scratch) { s.reset(); scratchPool.Put(s) }

func (s *scratch) reset() { s.off = 0 }

// floats returns n values with arbitrary contents.
func (s *scratch) floats(n int) []float64 {
	if s.off+n > len(s.buf) {
		// Earlier slices keep the old buffer; the new one starts empty.
		s.buf = make([]float64, max(2*len(s.buf), n, 1<<16))
		s.off = 0
	}
	x := s.buf[s.off : s.off+n : s.off+n]
	s.off += n
	return x
}

// dense returns an r x c matrix with arbitrary contents.
func (s *scratch) dense(r, c int) *mat.Dense { return mat.NewDense(r, c, s.floats(r*c)) }

// zeros returns an r x c zero matrix.
func (s *scratch) zeros(r, c int) *mat.Dense {
	x := s.floats(r * c)
	clear(x)
	return mat.NewDense(r, c, x)
}

// scaleRows returns diag(s) m as a new matrix.
func scaleRows(s []float64, m *mat.Dense) *mat.Dense {
	r, c := m.Dims()
	out := mat.NewDense(r, c, nil)
	for i := 0; i < r; i++ {
		row := out.RawRowView(i)
		copy(row, m.RawRowView(i))
		for j := range row {
			row[j] *= s[i]
		}
	}
	return out
}

// dot is the plain left-to-right dot product.
func dot(x, y []float64) float64 {
	s := 0.0
	for i, v := range x {
		s += v * y[i]
	}
	return s
}

// frobenius returns <a, b> = sum_ij a_ij b_ij, row by row in order.
func frobenius(a, b *mat.Dense) float64 {
	r, _ := a.Dims()
	s := 0.0
	for i := 0; i < r; i++ {
		s += dot(a.RawRowView(i), b.RawRowView(i))
	}
	return s
}

// clone returns a copy of m, or a zero r x c matrix when m is nil.
func cloneOrZero(m *mat.Dense, r, c int) *mat.Dense {
	out := mat.NewDense(r, c, nil)
	if m != nil {
		out.Copy(m)
	}
	return out
}

// identity returns the n x n identity.
func identity(n int) *mat.Dense {
	m := mat.NewDense(n, n, nil)
	for i := 0; i < n; i++ {
		m.Set(i, i, 1)
	}
	return m
}

// mul returns the new matrix a b.
func mul(a, b mat.Matrix) *mat.Dense {
	var m mat.Dense
	m.Mul(a, b)
	return &m
}
