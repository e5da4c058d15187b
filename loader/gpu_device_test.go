package loader

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGPUDeviceQuery(t *testing.T) {
	ctx := gpuContext(t)
	dev := ctx.Device()
	n, err := DeviceCount()
	require.NoError(t, err)

	name, err := dev.Name()
	require.NoError(t, err)
	assert.NotEmpty(t, name)
	major, minor, err := dev.ComputeCapability()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, major, 3)
	assert.GreaterOrEqual(t, minor, 0)
	sms, err := dev.SMCount()
	require.NoError(t, err)
	assert.Positive(t, sms)
	mem, err := dev.TotalMem()
	require.NoError(t, err)
	assert.Greater(t, mem, uint64(1<<30))
	optin, err := dev.SharedMemoryOptin()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, optin, 48<<10)
	warp, err := dev.Attribute(AttrWarpSize)
	require.NoError(t, err)
	assert.Equal(t, 32, warp)
	ver, err := DriverVersion()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ver, 11000)
	free, total, err := ctx.MemGetInfo()
	require.NoError(t, err)
	assert.LessOrEqual(t, free, total)
	assert.Equal(t, mem, total)
	t.Logf("device 0 of %d: %s, CC %d.%d, %d SMs, %d MiB, opt-in shared %d, driver %d", n, name, major, minor, sms, mem>>20, optin, ver)

	_, err = GetDevice(n)
	assert.ErrorContains(t, err, "does not exist")
	_, err = GetDevice(-1)
	assert.Error(t, err)
}

func TestGPUPeerAccess(t *testing.T) {
	ctx := gpuContext(t)
	n, err := DeviceCount()
	require.NoError(t, err)
	if n < 2 {
		t.Skipf("needs two CUDA GPUs, found %d", n)
	}
	peer, err := Primary(1)
	require.NoError(t, err)
	defer peer.Close()
	can, err := ctx.Device().CanAccessPeer(peer.Device())
	require.NoError(t, err)
	if can {
		require.NoError(t, ctx.EnablePeerAccess(peer))
		require.NoError(t, ctx.EnablePeerAccess(peer), "enabling twice is fine")
	}
	src := []byte("peer to peer copy")
	a, err := ctx.Alloc(len(src))
	require.NoError(t, err)
	defer a.Free()
	b, err := peer.Alloc(len(src))
	require.NoError(t, err)
	defer b.Free()
	require.NoError(t, a.CopyHtoD(src))
	require.NoError(t, CopyPeerAsync(b, a, len(src), nil))
	require.NoError(t, peer.Synchronize())
	got := make([]byte, len(src))
	require.NoError(t, b.CopyDtoH(got))
	assert.Equal(t, src, got)
	s, err := ctx.NewStream(StreamDefault)
	require.NoError(t, err)
	defer s.Close()
	assert.ErrorContains(t, b.CopyHtoDAsync(src, s), "stream of device 0 used for work on device 1")
}
