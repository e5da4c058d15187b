package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"unsafe"

	"github.com/gdnkcp/gdnkcp/internal/dlib"
	"github.com/gdnkcp/gdnkcp/internal/stats"
	"github.com/gdnkcp/gdnkcp/loader"
)

// The ceilings kcp bench measures in its own run (METHOD.md: the copy
// bandwidth and the bf16 matrix rate, measured where the floors are used).

// copyBytes is the size of the copy measureCopyTBs times: far past the
// H200's 50 MB L2, so it measures device memory.
const copyBytes = 512 << 20

// measureCopyTBs times device-to-device copies of n bytes on device dev
// (warm untimed, then reps timed with CUDA events) and returns the median
// rate in TB/s of bytes read plus written. Everything it made is released.
func measureCopyTBs(dev, n, warm, reps int) (tbs float64, err error) {
	ctx, err := loader.Primary(dev)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, ctx.Close()) }()
	src, err := ctx.Alloc(n)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, src.Free()) }()
	dst, err := ctx.Alloc(n)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, dst.Free()) }()
	if err := src.Memset32(0x3f800000); err != nil { // 1.0f: not zeros
		return 0, err
	}
	med, err := timeMedian(ctx, warm, reps, func(s *loader.Stream) error { return dst.CopyDtoDAsync(src, s) })
	if err != nil {
		return 0, err
	}
	if !(med > 0) {
		return 0, fmt.Errorf("the copy of %d bytes timed at %g ms", n, med)
	}
	return 2 * float64(n) / (med * 1e-3) / 1e12, nil
}

// envCublas names the cuBLAS library measureGemmTFLOPs opens instead of
// the usual names (a path, or a name dlopen searches).
const envCublas = "GDNKCP_CUBLAS_LIBRARY"

// errNoCublas is what a cuBLAS that cannot be opened wraps.
var errNoCublas = errors.New("cuBLAS library not found")

// cublasNames are tried in order: the toolkit's (CUDA 13, 12, 11) by name,
// then where nvcc's toolkit keeps them.
var cublasNames = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so",
	"/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so"}

// cublasAPI is the few cuBLAS functions the matrix-rate measurement needs;
// handles and streams travel as uintptr.
type cublasAPI struct {
	lib       *dlib.Library
	create    dlib.Proc[func(h *uintptr) int32]
	destroy   dlib.Proc[func(h uintptr) int32]
	setStream dlib.Proc[func(h, stream uintptr) int32]
	gemmEx    dlib.Proc[func(h uintptr, transa, transb, m, n, k int32, alpha unsafe.Pointer, a uintptr, atype, lda int32,
		b uintptr, btype, ldb int32, beta unsafe.Pointer, c uintptr, ctype, ldc, compute, algo int32) int32]
}

// newCublasAPI opens GDNKCP_CUBLAS_LIBRARY where set, else the first of
// cublasNames.
func newCublasAPI() *cublasAPI {
	names := cublasNames
	if v := os.Getenv(envCublas); v != "" {
		names = []string{v}
	}
	a := &cublasAPI{lib: dlib.New(names, errNoCublas, func(symbol, library string, err error) error {
		return fmt.Errorf("cuBLAS %s has no %s: %w", library, symbol, err)
	}, "cannot bind cuBLAS function")}
	a.create.Name, a.destroy.Name, a.setStream.Name, a.gemmEx.Name = "cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasGemmEx"
	return a
}

// check turns a cublasStatus_t into an error naming the call.
func cublasCheck(call string, status int32) error {
	if status != 0 {
		return fmt.Errorf("%s: cublasStatus_t %d", call, status)
	}
	return nil
}

// cuBLAS / CUDA enums of the measurement: bf16 operands and output, fp32
// accumulation, the default algorithm, no transposes.
const (
	cudaR16BF       = 14
	cublasCompute32 = 68
	cublasGemmDflt  = -1
	gemmDim         = 8192
)

// measureGemmTFLOPs times bf16 GEMMs of 8192^3 (bf16 in and out, fp32
// accumulation, random operands) through cuBLAS on device dev, warm untimed
// and reps timed with CUDA events, and returns the median rate in TFLOP/s:
// the bf16 matrix rate scripts/ceilings.py measured through PyTorch.
// Everything it made is released.
func measureGemmTFLOPs(dev, warm, reps int) (tflops float64, err error) {
	api := newCublasAPI()
	if _, err := api.lib.Open(); err != nil {
		return 0, err
	}
	create, err := api.create.Get(api.lib)
	if err != nil {
		return 0, err
	}
	destroy, err := api.destroy.Get(api.lib)
	if err != nil {
		return 0, err
	}
	setStream, err := api.setStream.Get(api.lib)
	if err != nil {
		return 0, err
	}
	gemm, err := api.gemmEx.Get(api.lib)
	if err != nil {
		return 0, err
	}
	ctx, err := loader.Primary(dev)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, ctx.Close()) }()
	const n = gemmDim * gemmDim
	var bufs [3]*loader.Buffer
	for i := range bufs {
		b, err := loader.AllocFor[uint16](ctx, n)
		if err != nil {
			return 0, err
		}
		defer func() { err = errors.Join(err, b.Free()) }()
		bufs[i] = b
	}
	// Random bf16 operands in [-1, 1) (never zeros: METHOD.md), C poisoned.
	rng := rand.New(rand.NewPCG(1, 2))
	host := make([]uint16, n)
	for op := range 2 {
		for i := range host {
			host[i] = uint16(((rng.Uint32() >> 16) & 0x807f) | 0x3e00) // ±[0.125, 0.25): random sign and mantissa
		}
		if err := loader.CopyToDevice(bufs[op], host); err != nil {
			return 0, err
		}
	}
	if err := bufs[2].Memset32(0x7fc17fc1); err != nil {
		return 0, err
	}
	var h uintptr
	if err := ctx.Do(func() error { return cublasCheck("cublasCreate_v2", create(&h)) }); err != nil {
		return 0, err
	}
	defer func() { // back on the default stream first: timeMedian's own is gone by then
		err = errors.Join(err, ctx.Do(func() error {
			return errors.Join(cublasCheck("cublasSetStream_v2", setStream(h, 0)), cublasCheck("cublasDestroy_v2", destroy(h)))
		}))
	}()
	alpha, beta := float32(1), float32(0)
	med, err := timeMedian(ctx, warm, reps, func(s *loader.Stream) error {
		return ctx.Do(func() error {
			if err := cublasCheck("cublasSetStream_v2", setStream(h, s.Handle())); err != nil {
				return err
			}
			return cublasCheck("cublasGemmEx", gemm(h, 0, 0, gemmDim, gemmDim, gemmDim, unsafe.Pointer(&alpha), bufs[0].Ptr(),
				cudaR16BF, gemmDim, bufs[1].Ptr(), cudaR16BF, gemmDim, unsafe.Pointer(&beta), bufs[2].Ptr(), cudaR16BF, gemmDim,
				cublasCompute32, cublasGemmDflt))
		})
	})
	if err != nil {
		return 0, err
	}
	out := make([]uint16, 8)
	if err := bufs[2].CopyDtoH(unsafe.Slice((*byte)(unsafe.Pointer(&out[0])), 2*len(out))); err != nil {
		return 0, err
	}
	if out[0] == 0x7fc1 && out[1] == 0x7fc1 {
		return 0, errors.New("cublasGemmEx left C poisoned: it did not run")
	}
	if !(med > 0) {
		return 0, fmt.Errorf("the GEMM timed at %g ms", med)
	}
	return 2 * float64(gemmDim) * gemmDim * gemmDim / (med * 1e-3) / 1e12, nil
}

// timeMedian runs enqueue on a stream of its own warm times untimed, then
// reps times between two CUDA events each, and returns the median of the
// timed runs in ms. Its stream and events are released.
func timeMedian(ctx *loader.Context, warm, reps int, enqueue func(*loader.Stream) error) (med float64, err error) {
	s, err := ctx.NewStream(loader.StreamNonBlocking)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	start, err := ctx.NewEvent(loader.EventDefault)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, start.Close()) }()
	end, err := ctx.NewEvent(loader.EventDefault)
	if err != nil {
		return 0, err
	}
	defer func() { err = errors.Join(err, end.Close()) }()
	var ms []float64
	for i := range warm + reps {
		if err := start.Record(s); err != nil {
			return 0, err
		}
		if err := enqueue(s); err != nil {
			return 0, err
		}
		if err := end.Record(s); err != nil {
			return 0, err
		}
		if err := s.Synchronize(); err != nil {
			return 0, err
		}
		t, err := loader.ElapsedMillis(start, end)
		if err != nil {
			return 0, err
		}
		if i >= warm {
			ms = append(ms, float64(t))
		}
	}
	return stats.Median(ms), nil
}
