// Package gemm is the dense float64 matrix product of the CPU reference: c = alpha op(a) b + beta c with
// op(a) = a or aᵀ and b never transposed, the two forms gdnref's walks and gradients need.
//
// Every element of c is computed the same way on every path (AVX2 or plain Go, whatever the shapes around
// it): c is first scaled by beta exactly as gonum's Dgemm does (set to zero when beta is 0, multiplied when
// beta is not 1), then, for the inner index l ascending, c_ij <- c_ij + (alpha op(a)_il) b_lj, each product
// and each sum rounded on its own (no fused multiply-add). A column's values therefore depend on that column
// of b alone, never on how many columns are computed beside it, nor on the thread count, nor on the CPU.
//
// This is the per-element sequence of gonum's Dgemm for these two forms (which accumulates by axpy, in
// order, serially or in parallel blocks). gonum skips a term whose alpha op(a)_il is zero; here a row group
// of four skips only the leading and trailing inner indices where all four are zero, and adds the zero
// products in between, which changes nothing but the sign of an exactly zero element (or propagates a NaN
// or Inf of b that gonum would skip).
package gemm

import "gonum.org/v1/gonum/blas/blas64"

// rowGroup is the number of rows of c the kernels update together.
const rowGroup = 4

// NN computes c = alpha a b + beta c, a m x k, b k x n, c m x n. It panics on mismatched shapes.
func NN(alpha float64, a, b blas64.General, beta float64, c blas64.General) {
	if a.Rows != c.Rows || a.Cols != b.Rows || b.Cols != c.Cols {
		panic("gemm: NN: shape mismatch")
	}
	gemm(false, alpha, a, b, beta, c)
}

// TN computes c = alpha aᵀ b + beta c, a k x m, b k x n, c m x n. It panics on mismatched shapes.
func TN(alpha float64, a, b blas64.General, beta float64, c blas64.General) {
	if a.Cols != c.Rows || a.Rows != b.Rows || b.Cols != c.Cols {
		panic("gemm: TN: shape mismatch")
	}
	gemm(true, alpha, a, b, beta, c)
}

func gemm(aTrans bool, alpha float64, a, b blas64.General, beta float64, c blas64.General) {
	m, n, k := c.Rows, c.Cols, b.Rows
	if m == 0 || n == 0 {
		return
	}
	if beta != 1 {
		for i := 0; i < m; i++ {
			row := c.Data[i*c.Stride : i*c.Stride+n]
			if beta == 0 {
				clear(row)
				continue
			}
			for j := range row {
				row[j] *= beta
			}
		}
	}
	if alpha == 0 || k == 0 {
		return
	}
	var panel [rowGroup * 512]float64
	p := panel[:]
	if k > 512 {
		p = make([]float64, rowGroup*k)
	}
	for i0 := 0; i0 < m; i0 += rowGroup {
		rows := min(rowGroup, m-i0)
		lo, hi := pack(p, aTrans, alpha, a, i0, rows, k)
		if lo >= hi {
			continue
		}
		kernel(rows, n, hi-lo, p[lo*rowGroup:hi*rowGroup], b.Data[lo*b.Stride:], b.Stride, c.Data[i0*c.Stride:], c.Stride)
	}
}

// pack writes into p the panel of rows [i0, i0+rows) of alpha op(a): alpha op(a)_{i0+r, l} at
// l*rowGroup + r, zero for r >= rows. It returns the range [lo, hi) of l outside which the panel is zero
// (lo >= hi when it is zero everywhere).
func pack(p []float64, aTrans bool, alpha float64, a blas64.General, i0, rows, k int) (lo, hi int) {
	p = p[:k*rowGroup]
	lo, hi = k, 0
	switch {
	case rows == rowGroup && aTrans:
		for l := 0; l < k; l++ {
			src := a.Data[l*a.Stride+i0 : l*a.Stride+i0+rowGroup]
			pl := p[l*rowGroup : l*rowGroup+rowGroup]
			pl[0], pl[1], pl[2], pl[3] = alpha*src[0], alpha*src[1], alpha*src[2], alpha*src[3]
			if pl[0] != 0 || pl[1] != 0 || pl[2] != 0 || pl[3] != 0 {
				lo, hi = min(lo, l), l+1
			}
		}
	case rows == rowGroup:
		r0 := a.Data[i0*a.Stride : i0*a.Stride+k]
		r1 := a.Data[(i0+1)*a.Stride : (i0+1)*a.Stride+k]
		r2 := a.Data[(i0+2)*a.Stride : (i0+2)*a.Stride+k]
		r3 := a.Data[(i0+3)*a.Stride : (i0+3)*a.Stride+k]
		for l := 0; l < k; l++ {
			pl := p[l*rowGroup : l*rowGroup+rowGroup]
			pl[0], pl[1], pl[2], pl[3] = alpha*r0[l], alpha*r1[l], alpha*r2[l], alpha*r3[l]
			if pl[0] != 0 || pl[1] != 0 || pl[2] != 0 || pl[3] != 0 {
				lo, hi = min(lo, l), l+1
			}
		}
	case rows == 1:
		step, off := 1, i0*a.Stride
		if aTrans {
			step, off = a.Stride, i0
		}
		for l := 0; l < k; l++ {
			pl := p[l*rowGroup : l*rowGroup+rowGroup]
			pl[0], pl[1], pl[2], pl[3] = alpha*a.Data[off+l*step], 0, 0, 0
			if pl[0] != 0 {
				lo, hi = min(lo, l), l+1
			}
		}
	default:
		for l := 0; l < k; l++ {
			pl := p[l*rowGroup : l*rowGroup+rowGroup]
			nz := false
			for r := range pl {
				v := 0.0
				if r < rows {
					if aTrans {
						v = alpha * a.Data[l*a.Stride+i0+r]
					} else {
						v = alpha * a.Data[(i0+r)*a.Stride+l]
					}
				}
				pl[r] = v
				nz = nz || v != 0
			}
			if nz {
				lo, hi = min(lo, l), l+1
			}
		}
	}
	return lo, hi
}

// kernelGo updates rows x n elements of c: c[r][j] += p[l*rowGroup+r] b[l][j] for l in [0, k), in order.
// It is the definition the assembly kernels follow, bit for bit.
func kernelGo(rows, n, k int, p, b []float64, ldb int, c []float64, ldc int) {
	for r := 0; r < rows; r++ {
		cr := c[r*ldc : r*ldc+n]
		for j := range cr {
			acc := cr[j]
			for l := 0; l < k; l++ {
				acc += float64(p[l*rowGroup+r] * b[l*ldb+j])
			}
			cr[j] = acc
		}
	}
}
