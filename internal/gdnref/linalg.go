package gdnref

import (
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/gonum/mat"
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
// depends on the same column of b alone, and gonum's Dgemm sums every element over the inner index in
// order (serially or in parallel blocks of rows and columns, never splitting one element's sum across
// workers), so a column's bits do not depend on the tile width. (A product with a transposed right operand,
// a bᵀ, would not do: gonum computes it by dot products that its parallel path splits into blocks of the
// inner index, and whether it takes that path depends on the number of columns.) This relies on gonum's own
// BLAS implementation, the default; code that swaps it with blas64.Use must re-run the bitwise tests.
func gemmNN(alpha float64, a, b *mat.Dense, beta float64, c *mat.Dense) {
	blas64.Gemm(blas.NoTrans, blas.NoTrans, alpha, a.RawMatrix(), b.RawMatrix(), beta, c.RawMatrix())
}

// gemmTN computes c = alpha aᵀ b + beta c (b and c may be column views). See gemmNN.
func gemmTN(alpha float64, a, b *mat.Dense, beta float64, c *mat.Dense) {
	blas64.Gemm(blas.Trans, blas.NoTrans, alpha, a.RawMatrix(), b.RawMatrix(), beta, c.RawMatrix())
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

// rowDot returns the dot products of the rows of a and b: out_i = a_i · b_i.
func rowDot(a, b *mat.Dense) []float64 {
	r, _ := a.Dims()
	out := make([]float64, r)
	for i := range out {
		out[i] = dot(a.RawRowView(i), b.RawRowView(i))
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
