package loader

import (
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGPUThreadHopping: many goroutines, hopping between OS threads, never
// meet a thread without their context. A poisoner keeps clearing the
// current context of whatever threads it runs on.
func TestGPUThreadHopping(t *testing.T) {
	ctx := gpuContext(t)
	_, axpy, _, _ := testModule(t, ctx)

	// The hazard is real: a thread without the context cannot allocate.
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.NoError(t, ctx.d.ctxSetCurrent(0))
		_, err := ctx.d.memAlloc(256)
		require.True(t, IsCode(err, ErrorInvalidContext), "raw call on an unbound thread: %v", err)
	}()

	stop := make(chan struct{})
	poisoned := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				poisoned <- n
				return
			default:
			}
			runtime.LockOSThread()
			if ctx.d.ctxSetCurrent(0) == nil {
				n++
			}
			runtime.UnlockOSThread()
			runtime.Gosched()
		}
	}()

	const workers, rounds, n = 64, 25, 1024
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			errs <- hopWorker(ctx, axpy, w, rounds, n)
		}()
	}
	var failures []error
	for range workers {
		if err := <-errs; err != nil {
			failures = append(failures, err)
		}
	}
	close(stop)
	t.Logf("poisoner cleared the context %d times", <-poisoned)
	for _, err := range failures {
		assert.False(t, IsCode(err, ErrorInvalidContext), "CUDA_ERROR_INVALID_CONTEXT: %v", err)
		assert.NoError(t, err)
	}
}

func hopWorker(ctx *Context, axpy *Function, w, rounds, n int) error {
	r := rand.New(rand.NewPCG(uint64(w), 7))
	for range rounds {
		x, y := randFloats(r, n), randFloats(r, n)
		dx, err := AllocFor[float32](ctx, n)
		if err != nil {
			return err
		}
		runtime.Gosched()
		dy, err := AllocFor[float32](ctx, n)
		if err != nil {
			dx.Free()
			return err
		}
		err = func() error {
			if err := CopyToDevice(dx, x); err != nil {
				return err
			}
			runtime.Gosched()
			if err := CopyToDevice(dy, y); err != nil {
				return err
			}
			runtime.Gosched()
			if err := Launch(nil, axpy, [3]uint32{uint32(n / 256), 1, 1}, [3]uint32{256, 1, 1}, 0,
				NewArgs().Ptr(dx).Ptr(dy).F32(-0.5).U32(uint32(n))); err != nil {
				return err
			}
			runtime.Gosched()
			got := make([]float32, n)
			if err := CopyFromDevice(dy, got); err != nil {
				return err
			}
			for i := range got {
				if want := float32(-0.5*x[i]) + y[i]; got[i] != want {
					return assert.AnError
				}
			}
			return nil
		}()
		runtime.Gosched()
		if ferr := dx.Free(); err == nil {
			err = ferr
		}
		if ferr := dy.Free(); err == nil {
			err = ferr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
