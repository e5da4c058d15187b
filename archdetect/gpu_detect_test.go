package archdetect

import (
	"errors"
	"testing"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDetectWithoutDriver(t *testing.T) {
	if _, err := loader.DeviceCount(); !errors.Is(err, loader.ErrNoDriver) {
		t.Skip("a driver is present; TestGPUDetect covers Detect")
	}
	_, err := Detect(0, Options{Manifest: fakeManifest(allSlots...)})
	assert.ErrorIs(t, err, loader.ErrNoDriver)
	assert.ErrorContains(t, err, "archdetect: device 0")
	ps, err := DetectAll(Options{Manifest: fakeManifest(allSlots...)})
	assert.ErrorIs(t, err, loader.ErrNoDriver)
	assert.Empty(t, ps)
}

func TestGPUDetect(t *testing.T) {
	ctx := gpu(t)
	t.Setenv(EnvBlob, "")
	m := fakeManifest(allSlots...)
	p, err := Detect(0, Options{Manifest: m})
	require.NoError(t, err)
	major, minor, err := ctx.Device().ComputeCapability()
	require.NoError(t, err)
	sms, err := ctx.Device().SMCount()
	require.NoError(t, err)
	name, err := ctx.Device().Name()
	require.NoError(t, err)
	assert.Equal(t, CC{major, minor}, p.CC())
	assert.Equal(t, sms, p.SMs)
	assert.Equal(t, name, p.Name)
	assert.Positive(t, p.MemBytes)
	assert.GreaterOrEqual(t, p.SharedOptin, 48<<10)
	want, err := ProfileFor(CC{major, minor}, sms, name, m, "")
	require.NoError(t, err)
	assert.Equal(t, want.Target, p.Target)
	assert.Equal(t, want.Variant, p.Variant)
	assert.Equal(t, want.Reason, p.Reason)
	if major == 9 && minor == 0 {
		assert.Equal(t, SlotSM90a, p.Target)
		assert.Equal(t, VariantSM90a, p.Variant)
	}
	t.Log(p)

	n, err := loader.DeviceCount()
	require.NoError(t, err)
	all, err := DetectAll(Options{Manifest: m})
	require.NoError(t, err)
	assert.Len(t, all, n)
	for i, q := range all {
		assert.Equal(t, i, q.Ordinal)
	}

	_, err = Detect(0, Options{Manifest: &ptx.Manifest{}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "device 0: archdetect: no blob for "+name)
}

func TestGPUDetectOverride(t *testing.T) {
	ctx := gpu(t)
	major, minor, err := ctx.Device().ComputeCapability()
	require.NoError(t, err)
	m := fakeManifest(allSlots...)

	t.Setenv(EnvBlob, "compute_80")
	p, err := Detect(0, Options{Manifest: m})
	require.NoError(t, err)
	assert.True(t, p.Forced)
	assert.Equal(t, SlotCompute80, p.Target)
	assert.Contains(t, p.Reason, "forced by GDNKCP_BLOB=compute_80")
	assert.Equal(t, rowFor(CC{major, minor}).Variant, p.Variant, "forcing a blob keeps the device's variant")

	p, err = Detect(0, Options{Manifest: m, IgnoreEnv: true})
	require.NoError(t, err)
	assert.False(t, p.Forced)

	// A blob for another device is refused, naming blob, device and CC.
	wrong := SlotSM100a
	if major == 10 && minor == 0 {
		wrong = SlotSM90a
	}
	t.Setenv(EnvBlob, wrong)
	_, err = Detect(0, Options{Manifest: m})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "blob "+wrong+" forced by GDNKCP_BLOB="+wrong+" cannot run on")
	assert.Contains(t, err.Error(), CC{major, minor}.String())

	t.Setenv(EnvBlob, "sm_89")
	_, err = Detect(0, Options{Manifest: m})
	assert.ErrorContains(t, err, "valid blobs: sm_90a, sm_100a, sm_103a, sm_107a, compute_80")
}
