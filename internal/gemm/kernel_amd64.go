//go:build amd64 && !purego

package gemm

import "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2 kernels; they give the same bits as kernelGo.
var useAVX2 = cpu.X86.HasAVX2

// kern4x8 updates nb blocks of 4 rows x 8 columns of c (at c, c+8, ...): c[r][j] += p[l*4+r] b[l][j] for l
// in [0, k), in order, with separate multiplies and adds.
//
//go:noescape
func kern4x8(k, nb int, p, b *float64, ldb int, c *float64, ldc int)

// kern1x16 updates nb blocks of 1 row x 16 columns of c: c[j] += p[l*4] b[l][j] for l in [0, k), in order.
//
//go:noescape
func kern1x16(k, nb int, p, b *float64, ldb int, c *float64)

// kern4x4 is kern4x8 for one block of 4 rows x 4 columns.
//
//go:noescape
func kern4x4(k int, p, b *float64, ldb int, c *float64, ldc int)

// maxPadCols is the widest c whose last, partial row group kernel runs on the AVX2 kernels through a
// 4-row copy on the stack.
const maxPadCols = 256

// kernel updates rows x n elements of c; see kernelGo.
func kernel(rows, n, k int, p, b []float64, ldb int, c []float64, ldc int) {
	if !useAVX2 || n < 4 {
		kernelGo(rows, n, k, p, b, ldb, c, ldc)
		return
	}
	if rows == 1 && n >= 16 {
		// One row (a matrix-vector product): 16 columns at a time.
		_ = b[(k-1)*ldb+n-1]
		_ = c[n-1]
		_ = p[(k-1)*rowGroup]
		nb := n / 16
		kern1x16(k, nb, &p[0], &b[0], ldb, &c[0])
		if j := nb * 16; j < n {
			kernel(1, n-j, k, p, b[j:], ldb, c[j:], ldc)
		}
		return
	}
	if rows < rowGroup {
		if n > maxPadCols {
			kernelGo(rows, n, k, p, b, ldb, c, ldc)
			return
		}
		// The panel's rows past rows are zero; run all four on a copy and keep the first rows.
		var buf [rowGroup * maxPadCols]float64
		tmp := buf[:rowGroup*n]
		for r := 0; r < rows; r++ {
			copy(tmp[r*n:(r+1)*n], c[r*ldc:r*ldc+n])
		}
		kernel(rowGroup, n, k, p, b, ldb, tmp, n)
		for r := 0; r < rows; r++ {
			copy(c[r*ldc:r*ldc+n], tmp[r*n:(r+1)*n])
		}
		return
	}
	// Bounds: the kernels read b[l*ldb+j] for l < k, j < n and write c[r*ldc+j] for r < 4, j < n.
	_ = b[(k-1)*ldb+n-1]
	_ = c[(rowGroup-1)*ldc+n-1]
	_ = p[k*rowGroup-1]
	j := 0
	if nb := n / 8; nb > 0 {
		kern4x8(k, nb, &p[0], &b[0], ldb, &c[0], ldc)
		j = nb * 8
	}
	if n-j >= 4 {
		kern4x4(k, &p[0], &b[j], ldb, &c[j], ldc)
		j += 4
	}
	if j < n {
		kernelGo(rowGroup, n-j, k, p, b[j:], ldb, c[j:], ldc)
	}
}

// scaleAdd4 sets dst_j = s_j a + t y_j for j < n, n a positive multiple of 4.
//
//go:noescape
func scaleAdd4(n int, dst, s *float64, a, t float64, y *float64)

// addScale4 sets dst_j = (dst_j + t y_j) a for j < n, n a positive multiple of 4.
//
//go:noescape
func addScale4(n int, dst *float64, t float64, y *float64, a float64)

func scaleAddRow(dst, s []float64, a, t float64, y []float64) {
	n := len(dst) &^ 3
	if !useAVX2 || n == 0 {
		scaleAddRowGo(dst, s, a, t, y)
		return
	}
	_, _ = s[len(dst)-1], y[len(dst)-1]
	scaleAdd4(n, &dst[0], &s[0], a, t, &y[0])
	scaleAddRowGo(dst[n:], s[n:len(dst)], a, t, y[n:len(dst)])
}

func addScaleRow(dst []float64, t float64, y []float64, a float64) {
	n := len(dst) &^ 3
	if !useAVX2 || n == 0 {
		addScaleRowGo(dst, t, y, a)
		return
	}
	_ = y[len(dst)-1]
	addScale4(n, &dst[0], t, &y[0], a)
	addScaleRowGo(dst[n:], t, y[n:len(dst)], a)
}
