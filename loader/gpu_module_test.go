package loader

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGPUAxpy(t *testing.T) {
	ctx := gpuContext(t)
	_, axpy, _, _ := testModule(t, ctx)
	r := rand.New(rand.NewPCG(5, 6))
	const n = 100_003
	x, y := randFloats(r, n), randFloats(r, n)
	a := float32(1.75)

	dx, err := AllocFor[float32](ctx, n)
	require.NoError(t, err)
	defer dx.Free()
	dy, err := AllocFor[float32](ctx, n)
	require.NoError(t, err)
	defer dy.Free()
	require.NoError(t, CopyToDevice(dx, x))
	require.NoError(t, CopyToDevice(dy, y))

	s, err := ctx.NewStream(StreamNonBlocking)
	require.NoError(t, err)
	defer s.Close()
	args := NewArgs().Ptr(dx).Ptr(dy).F32(a).U32(n)
	require.NoError(t, Launch(s, axpy, [3]uint32{(n + 255) / 256, 1, 1}, [3]uint32{256, 1, 1}, 0, args))
	require.NoError(t, s.Synchronize())

	got := make([]float32, n)
	require.NoError(t, CopyFromDevice(dy, got))
	for i := range got {
		want := float32(a*x[i]) + y[i]
		if got[i] != want {
			t.Fatalf("y[%d] = %v, want %v", i, got[i], want)
		}
	}

	attrs, err := axpy.Attributes()
	require.NoError(t, err)
	major, minor, err := ctx.Device().ComputeCapability()
	require.NoError(t, err)
	assert.Positive(t, attrs.Registers)
	assert.Equal(t, 80, attrs.PTXVersion)
	assert.Equal(t, major*10+minor, attrs.BinaryVersion)
	assert.Equal(t, 1024, attrs.MaxThreadsPerBlock)
	assert.Zero(t, attrs.SharedStaticBytes)
	t.Logf("axpy: %+v", attrs)
}

func TestGPUInfoLog(t *testing.T) {
	ctx := gpuContext(t)
	// A nonce defeats the driver's compute cache, which skips ptxas (and its
	// log) for PTX it has compiled before.
	ptx := fmt.Sprintf("%s\n// nonce %d\n", testPTX, time.Now().UnixNano())
	mod, err := LoadModule(ctx, []byte(ptx))
	require.NoError(t, err)
	defer mod.Close()
	assert.Equal(t, ImagePTX, mod.Kind())
	assert.Contains(t, mod.InfoLog(), "axpy", "verbose JIT reports each entry")
	t.Logf("info log:\n%s", mod.InfoLog())
}

func TestGPUBadPTX(t *testing.T) {
	ctx := gpuContext(t)
	mod, err := LoadModule(ctx, []byte(badPTX))
	require.Error(t, err)
	assert.Nil(t, mod)
	var je *JITError
	require.ErrorAs(t, err, &je)
	assert.True(t, IsCode(err, ErrorInvalidPTX), "%v", err)
	assert.Contains(t, je.Log, "ptxas")
	assert.Contains(t, je.Log, "gdnkcp_undeclared_symbol")
	assert.Contains(t, err.Error(), je.Log, "the error text carries the log")
	t.Logf("%v", err)
}

func TestGPUMissingEntry(t *testing.T) {
	ctx := gpuContext(t)
	mod, _, _, _ := testModule(t, ctx)
	fn, err := mod.Function("no_such_kernel")
	require.Error(t, err)
	assert.Nil(t, fn)
	assert.True(t, IsCode(err, ErrorNotFound), "%v", err)
	assert.Contains(t, err.Error(), `"no_such_kernel"`)
	assert.Contains(t, err.Error(), "CUDA_ERROR_NOT_FOUND (500)")
	t.Logf("%v", err)
}

func TestGPUSignatureMismatchBeforeLaunch(t *testing.T) {
	ctx := gpuContext(t)
	_, axpy, _, _ := testModule(t, ctx)
	y := []float32{1, 2, 3, 4}
	dx, err := AllocFor[float32](ctx, 4)
	require.NoError(t, err)
	defer dx.Free()
	dy, err := AllocFor[float32](ctx, 4)
	require.NoError(t, err)
	defer dy.Free()
	require.NoError(t, CopyToDevice(dx, y))
	require.NoError(t, CopyToDevice(dy, y))

	// a passed as a double: the kernel would read garbage; Launch refuses.
	err = Launch(nil, axpy, [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, NewArgs().Ptr(dx).Ptr(dy).F64(2).U32(4))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "launch axpy")
	assert.Contains(t, err.Error(), `parameter 2 "a"`)
	require.NoError(t, ctx.Synchronize())
	got := make([]float32, 4)
	require.NoError(t, CopyFromDevice(dy, got))
	assert.Equal(t, y, got, "nothing ran")

	err = Launch(nil, axpy, [3]uint32{1, 1, 1}, [3]uint32{4, 1, 1}, 0, NewArgs().Ptr(dx).Ptr(dy).F32(2))
	assert.ErrorContains(t, err, `parameter 3 "n"`)
}

func TestGPUDynamicSharedOptIn(t *testing.T) {
	ctx := gpuContext(t)
	_, _, _, shrev := testModule(t, ctx)
	optin, err := ctx.Device().SharedMemoryOptin()
	require.NoError(t, err)
	const shared = 100 << 10
	if optin < shared {
		t.Skipf("needs %d bytes of opt-in shared memory per block, device has %d", shared, optin)
	}
	const words = shared / 4
	in := make([]uint32, words)
	for i := range in {
		in[i] = uint32(i)*2654435761 + 17
	}
	din, err := AllocFor[uint32](ctx, words)
	require.NoError(t, err)
	defer din.Free()
	dout, err := AllocFor[uint32](ctx, words)
	require.NoError(t, err)
	defer dout.Free()
	require.NoError(t, CopyToDevice(din, in))
	args := NewArgs().Ptr(din).Ptr(dout).U32(words)

	before, err := shrev.Attribute(FuncMaxDynamicSharedBytes)
	require.NoError(t, err)
	assert.LessOrEqual(t, before, 48<<10)
	err = Launch(nil, shrev, [3]uint32{1, 1, 1}, [3]uint32{256, 1, 1}, shared, args)
	require.Error(t, err, "100 KiB without opt-in is refused")
	t.Logf("without opt-in: %v", err)

	require.NoError(t, shrev.SetMaxDynamicSharedMemory(shared))
	after, err := shrev.Attribute(FuncMaxDynamicSharedBytes)
	require.NoError(t, err)
	assert.Equal(t, shared, after)
	require.NoError(t, Launch(nil, shrev, [3]uint32{1, 1, 1}, [3]uint32{256, 1, 1}, shared, args))
	require.NoError(t, ctx.Synchronize())
	out := make([]uint32, words)
	require.NoError(t, CopyFromDevice(dout, out))
	for i := range out {
		if out[i] != in[words-1-i] {
			t.Fatalf("out[%d] = %d, want %d", i, out[i], in[words-1-i])
		}
	}
	assert.Error(t, shrev.SetMaxDynamicSharedMemory(optin+4096), "beyond the device's opt-in limit")
}
