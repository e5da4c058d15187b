//go:build !amd64 || purego

package gemm

// useAVX2 is false where there are no assembly kernels.
var useAVX2 = false

// kernel updates rows x n elements of c; see kernelGo.
func kernel(rows, n, k int, p, b []float64, ldb int, c []float64, ldc int) {
	kernelGo(rows, n, k, p, b, ldb, c, ldc)
}
