package loader

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gpuContext returns device 0's primary context, or skips the test on a
// machine without a driver or a GPU.
func gpuContext(t *testing.T) *Context {
	t.Helper()
	n, err := DeviceCount()
	if err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	if n == 0 {
		t.Skip("needs a CUDA GPU: the driver reports no devices")
	}
	ctx, err := Primary(0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, ctx.Close()) })
	return ctx
}

// testModule loads testPTX and returns its functions with signatures set.
func testModule(t *testing.T, ctx *Context) (mod *Module, axpy, spin, shrev *Function) {
	t.Helper()
	mod, err := LoadModule(ctx, []byte(testPTX))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, mod.Close()) })
	get := func(name string, sig []ParamSpec) *Function {
		fn, err := mod.Function(name)
		require.NoError(t, err)
		require.NoError(t, fn.SetSignature(sig))
		return fn
	}
	return mod, get("axpy", axpyParams), get("spin", spinParams), get("shrev", shrevParams)
}

func randFloats(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}

func byteRepeat(v byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = v
	}
	return b
}
