package loader

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGPUEventsElapsed(t *testing.T) {
	ctx := gpuContext(t)
	_, _, spin, _ := testModule(t, ctx)
	s, err := ctx.NewStream(StreamNonBlocking)
	require.NoError(t, err)
	defer s.Close()
	start, err := ctx.NewEvent(EventDefault)
	require.NoError(t, err)
	defer start.Close()
	end, err := ctx.NewEvent(EventBlockingSync)
	require.NoError(t, err)
	defer end.Close()
	out, err := AllocFor[uint32](ctx, 1)
	require.NoError(t, err)
	defer out.Free()

	const iters = 1 << 22
	require.NoError(t, start.Record(s))
	require.NoError(t, Launch(s, spin, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, NewArgs().Ptr(out).U32(iters)))
	require.NoError(t, end.Record(s))
	require.NoError(t, end.Synchronize())
	done, err := end.Query()
	require.NoError(t, err)
	assert.True(t, done)
	ms, err := ElapsedMillis(start, end)
	require.NoError(t, err)
	assert.Greater(t, ms, float32(0))
	t.Logf("spin of %d steps: %.3f ms", iters, ms)

	// A second stream waits on the event, then reads the result.
	s2, err := ctx.NewStream(StreamNonBlocking)
	require.NoError(t, err)
	defer s2.Close()
	require.NoError(t, s2.WaitEvent(end))
	got := make([]uint32, 1)
	require.NoError(t, CopyFromDeviceAsync(out, got, s2))
	require.NoError(t, s2.Synchronize())
	idle, err := s2.Query()
	require.NoError(t, err)
	assert.True(t, idle)
	assert.Equal(t, lcg(iters), got[0])
}

// TestGPUStreamPriorities: the context's priority range runs from least
// (the default) down to greatest, and a stream made at each end runs a
// launch to the right result.
func TestGPUStreamPriorities(t *testing.T) {
	ctx := gpuContext(t)
	_, _, spin, _ := testModule(t, ctx)
	least, greatest, err := ctx.StreamPriorities()
	require.NoError(t, err)
	t.Logf("stream priorities: least %d, greatest %d", least, greatest)
	require.LessOrEqual(t, greatest, least)
	for _, prio := range []int{least, greatest} {
		s, err := ctx.NewStreamWithPriority(StreamNonBlocking, prio)
		require.NoError(t, err, "priority %d", prio)
		out, err := AllocFor[uint32](ctx, 1)
		require.NoError(t, err)
		const iters = 1 << 12
		require.NoError(t, Launch(s, spin, [3]uint32{1, 1, 1}, [3]uint32{1, 1, 1}, 0, NewArgs().Ptr(out).U32(iters)))
		got := make([]uint32, 1)
		require.NoError(t, CopyFromDeviceAsync(out, got, s))
		require.NoError(t, s.Synchronize())
		assert.Equal(t, lcg(iters), got[0], "priority %d", prio)
		require.NoError(t, out.Free())
		require.NoError(t, s.Close())
	}
}
