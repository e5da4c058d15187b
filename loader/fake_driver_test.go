package loader

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/fakecuda"
)

// fakeDriver builds internal/fakecuda's stand-in driver and points the
// package at it for one test; it skips where the fake cannot be built.
func fakeDriver(t *testing.T) *fakecuda.Lib {
	t.Helper()
	so, err := fakecuda.Build(t.TempDir())
	if errors.Is(err, fakecuda.ErrUnsupported) {
		t.Skipf("the fake CUDA driver: %v", err)
	}
	require.NoError(t, err)
	useDriver(t, so)
	fk, err := fakecuda.Open(so)
	require.NoError(t, err)
	return fk
}

// TestFakeDriver runs the bindings against the fake driver, on any machine:
// the device queries, memory (the fake's device memory is host memory, so
// copies round-trip), streams, events, a module and a launch, each driver
// call made to fail once (an error naming the call and the CUDA error, the
// next call working), and everything released at the end.
func TestFakeDriver(t *testing.T) {
	require.Equal(t, EnvLibrary, fakecuda.EnvLibrary, "fakecuda's copy of the variable's name")
	fk := fakeDriver(t)
	n, err := DeviceCount()
	require.NoError(t, err)
	require.Equal(t, 1, n)
	dev, err := GetDevice(0)
	require.NoError(t, err)
	name, err := dev.Name()
	require.NoError(t, err)
	assert.Contains(t, name, "fakecuda")
	major, minor, err := dev.ComputeCapability()
	require.NoError(t, err)
	assert.Equal(t, [2]int{9, 0}, [2]int{major, minor})
	_, err = GetDevice(1)
	require.Error(t, err, "the fake has one device")

	ctx, err := Primary(0)
	require.NoError(t, err)
	buf, err := AllocFor[uint32](ctx, 64)
	require.NoError(t, err)
	src := make([]uint32, 64)
	for i := range src {
		src[i] = uint32(3*i + 1)
	}
	require.NoError(t, CopyToDevice(buf, src))
	got := make([]uint32, 64)
	require.NoError(t, CopyFromDevice(buf, got))
	require.Equal(t, src, got)
	require.NoError(t, buf.Memset32(7))
	require.NoError(t, CopyFromDevice(buf, got))
	assert.Equal(t, uint32(7), got[63])
	s, err := ctx.NewStream(StreamNonBlocking)
	require.NoError(t, err)
	ev, err := ctx.NewEvent(0)
	require.NoError(t, err)
	require.NoError(t, ev.Record(s))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, fakecuda.Held{Allocs: 1, Bytes: 256, Streams: 1, Events: 1, Contexts: 1}, fk.Held())

	// The fake's stream-order log keeps 65,536 entries and counts the rest; ClearLog empties both.
	fk.ClearLog()
	require.Equal(t, [2]int{0, 0}, [2]int{fk.LogLen(), fk.LogDropped()})
	require.NoError(t, ev.Record(s))
	require.Equal(t, []fakecuda.Op{{Kind: fakecuda.OpRecord, Stream: s.Handle(), Event: ev.Handle()}}, fk.Log(0))
	for range 65536 {
		require.NoError(t, ev.Record(s))
	}
	require.Equal(t, [2]int{65536, 1}, [2]int{fk.LogLen(), fk.LogDropped()}, "one record past the log's end, counted")
	fk.ClearLog()
	require.Equal(t, [2]int{0, 0}, [2]int{fk.LogLen(), fk.LogDropped()})

	// Each call fails once where the fake is told to, with the call and the code in the error; the same
	// call then works again.
	failing := []struct {
		call string
		do   func() error
	}{
		{"cuMemAlloc_v2", func() error { b, err := ctx.Alloc(16); return errors.Join(err, freeIf(b)) }},
		{"cuMemcpyHtoD_v2", func() error { return CopyToDevice(buf, src) }},
		{"cuMemcpyDtoH_v2", func() error { return CopyFromDevice(buf, got) }},
		{"cuStreamCreate", func() error { st, err := ctx.NewStream(StreamNonBlocking); return errors.Join(err, closeIf(st)) }},
		{"cuEventRecord", func() error { return ev.Record(s) }},
		{"cuStreamSynchronize", s.Synchronize},
		{"cuMemsetD32_v2", func() error { return buf.Memset32(1) }},
	}
	for _, f := range failing {
		t.Run(f.call, func(t *testing.T) {
			before := fk.Held()
			fk.Fail(f.call, 1, fakecuda.ErrorOutOfMemory)
			var err error
			require.NotPanics(t, func() { err = f.do() })
			require.Error(t, err)
			var de *Error
			require.ErrorAs(t, err, &de)
			assert.Equal(t, f.call, de.Call)
			assert.Contains(t, err.Error(), "CUDA_ERROR_OUT_OF_MEMORY")
			require.NoError(t, f.do(), "the next call")
			assert.Equal(t, before, fk.Held(), "nothing left held")
		})
	}
	assert.Equal(t, len(failing), fk.Failures())

	require.NoError(t, ev.Close())
	require.NoError(t, s.Close())
	require.NoError(t, buf.Free())
	require.NoError(t, ctx.Close())
	assert.Equal(t, fakecuda.Held{}, fk.Held())
	assert.Zero(t, fk.BadFrees())
	assert.Positive(t, fk.Calls("cuInit"))
}

func freeIf(b *Buffer) error {
	if b == nil {
		return nil
	}
	return b.Free()
}

func closeIf(s *Stream) error {
	if s == nil {
		return nil
	}
	return s.Close()
}
