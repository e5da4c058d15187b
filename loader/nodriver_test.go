package loader

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/niltest"
)

// useDriver points the package at another library for one test.
func useDriver(t *testing.T, names ...string) *driver {
	t.Helper()
	old := drv
	d := newDriver(newLibrary(names))
	drv = d
	t.Cleanup(func() { drv = old })
	return d
}

func TestNoDriver(t *testing.T) {
	d := useDriver(t, "libcuda-gdnkcp-does-not-exist.so.1", "libcuda-gdnkcp-does-not-exist.so")

	calls := []struct {
		name string
		call func() error
	}{
		{"DeviceCount", func() error { _, err := DeviceCount(); return err }},
		{"GetDevice", func() error { _, err := GetDevice(0); return err }},
		{"Primary", func() error { _, err := Primary(0); return err }},
		{"DriverVersion", func() error { _, err := DriverVersion(); return err }},
		{"raw cuMemAlloc", func() error { _, err := d.memAlloc(16); return err }},
		{"raw cuLaunchKernel", func() error {
			return d.launchKernel(0, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, 0, nil)
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = tc.call() })
			require.ErrorIs(t, err, ErrNoDriver)
			assert.Contains(t, err.Error(), "libcuda-gdnkcp-does-not-exist.so.1")
		})
	}
}

// A library that opens but is not the driver: every function is a missing
// symbol, reported with its name, and never a panic.
func TestMissingSymbol(t *testing.T) {
	d := useDriver(t, "libc.so.6")
	if _, err := d.lib.Open(); err != nil {
		t.Skipf("needs libc.so.6 to stand in for a driver without symbols: %v", err)
	}
	_, err := DeviceCount()
	require.ErrorIs(t, err, ErrMissingSymbol)
	assert.NotErrorIs(t, err, ErrNoDriver)
	var se *SymbolError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "cuInit", se.Name)
	assert.Equal(t, "libc.so.6", se.Library)
	assert.Contains(t, err.Error(), "driver version unknown")

	_, err = d.eventElapsed(0, 0)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "cuEventElapsedTime", se.Name, "falls back from _v2 to the old name")

	// An error code can still be named without the driver.
	e := d.newError("cuX", ErrorInvalidContext)
	assert.Equal(t, "cuX: CUDA_ERROR_INVALID_CONTEXT (201)", e.Error())
}

// A nil buffer's address is the null pointer kernels take for an output
// they should not write.
func TestNilBufferPtr(t *testing.T) {
	var b *Buffer
	require.Zero(t, b.Ptr())
}

// Nil handles answer with zero values or errors, never a panic: what a
// caller's cleanup path may hold after a failed creation.
func TestNilHandles(t *testing.T) {
	var b *Buffer
	require.Zero(t, b.Size())
	require.Nil(t, b.Context())
	var c *Context
	require.Nil(t, c.Device())
	require.Zero(t, c.Handle())
	_, err := c.Alloc(16)
	require.ErrorContains(t, err, "loader: Alloc(16): loader: nil context")
	_, err = c.AllocHost(16)
	require.ErrorContains(t, err, "nil context")
	_, err = c.NewStream(StreamNonBlocking)
	require.ErrorContains(t, err, "nil context")
	_, err = c.NewEvent(0)
	require.ErrorContains(t, err, "nil context")
	_, _, err = c.StreamPriorities()
	require.ErrorContains(t, err, "nil context")
	require.ErrorContains(t, c.Synchronize(), "nil context")
	require.NoError(t, c.Close())
	var s *Stream
	require.Zero(t, s.Handle())
	require.Nil(t, s.Context())
	require.ErrorContains(t, s.Synchronize(), "nil stream")
	var e *Event
	require.Zero(t, e.Handle())
}

// TestNilHandlesNoPanic calls every exported method of a nil *Buffer,
// *HostBuffer, *Stream, *Event, *Module, *Function, *Device and *Context
// with zero arguments: each returns (zero values or an error), none panics.
// (Args is a builder made by NewArgs and not covered.)
func TestNilHandlesNoPanic(t *testing.T) {
	niltest.NoPanics(t, (*Buffer)(nil), (*HostBuffer)(nil), (*Stream)(nil), (*Event)(nil), (*Module)(nil),
		(*Function)(nil), (*Device)(nil), (*Context)(nil))
}
