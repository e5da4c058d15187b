//go:build !amd64 || purego

package gemm

// useAVX2 is false where there are no assembly kernels.
var useAVX2 = false

// kernel updates rows x n elements of c; see kernelGo.
func kernel(rows, n, k int, p, b []float64, ldb int, c []float64, ldc int) {
	kernelGo(rows, n, k, p, b, ldb, c, ldc)
}

func scaleAddRow(dst, s []float64, a, t float64, y []float64) { scaleAddRowGo(dst, s, a, t, y) }

func addScaleRow(dst []float64, t float64, y []float64, a float64) { addScaleRowGo(dst, t, y, a) }
