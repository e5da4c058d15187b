package gemm

import "gonum.org/v1/gonum/blas/blas64"

// ScaleRankOne sets m = a src + alpha x yᵀ (m and src m x n; src may be m) in one pass over m:
// m_ij = src_ij a + (alpha x_i) y_j, each product and the sum rounded on its own. These are the operations,
// and the bits, of scaling src by a into m (mat.VecDense's ScaleVec, or Dscal for a != 0) followed by gonum's
// Dger(alpha, x, y, m), which skips the update when alpha is 0. It panics on mismatched shapes.
func ScaleRankOne(m, src blas64.General, a, alpha float64, x, y []float64) {
	checkRankOne(m, src, x, y)
	for i := 0; i < m.Rows; i++ {
		dst := m.Data[i*m.Stride : i*m.Stride+m.Cols]
		s := src.Data[i*src.Stride : i*src.Stride+m.Cols]
		if alpha == 0 {
			for j, v := range s {
				dst[j] = v * a
			}
			continue
		}
		scaleAddRow(dst, s, a, alpha*x[i], y[:m.Cols])
	}
}

// RankOneScale sets m = a (m + alpha x yᵀ) in one pass over m: m_ij = (m_ij + (alpha x_i) y_j) a, each
// operation rounded on its own: the operations, and the bits, of gonum's Dger(alpha, x, y, m), which skips
// the update when alpha is 0, followed by the scale of m by a (as ScaleRankOne's). It panics on mismatched
// shapes.
func RankOneScale(m blas64.General, alpha float64, x, y []float64, a float64) {
	checkRankOne(m, m, x, y)
	for i := 0; i < m.Rows; i++ {
		dst := m.Data[i*m.Stride : i*m.Stride+m.Cols]
		if alpha == 0 {
			for j, v := range dst {
				dst[j] = v * a
			}
			continue
		}
		addScaleRow(dst, alpha*x[i], y[:m.Cols], a)
	}
}

func checkRankOne(m, src blas64.General, x, y []float64) {
	if src.Rows != m.Rows || src.Cols != m.Cols || len(x) < m.Rows || len(y) < m.Cols {
		panic("gemm: rank-one update: shape mismatch")
	}
}

// scaleAddRowGo sets dst_j = s_j a + t y_j; the definition the assembly follows, bit for bit.
func scaleAddRowGo(dst, s []float64, a, t float64, y []float64) {
	for j := range dst {
		dst[j] = float64(s[j]*a) + float64(t*y[j])
	}
}

// addScaleRowGo sets dst_j = (dst_j + t y_j) a; the definition the assembly follows, bit for bit.
func addScaleRowGo(dst []float64, t float64, y []float64, a float64) {
	for j := range dst {
		dst[j] = float64(dst[j]+float64(t*y[j])) * a
	}
}
