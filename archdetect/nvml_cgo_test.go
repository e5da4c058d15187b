//go:build cgo

package archdetect

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNVMLInfo(t *testing.T) {
	devs, ver, err := NVMLInfo()
	if errors.Is(err, ErrNoNVML) || errors.Is(err, ErrNVMLNoDriver) {
		t.Skipf("needs libnvidia-ml.so.1 and the NVIDIA driver: %v", err)
	}
	require.NoError(t, err)
	assert.NotEmpty(t, ver, "driver version")
	for i, d := range devs {
		assert.Equal(t, i, d.Index)
		assert.NotEmpty(t, d.Name)
		assert.NotEmpty(t, d.UUID)
		assert.GreaterOrEqual(t, d.Major, 3)
		assert.Positive(t, d.MemTotal)
		assert.LessOrEqual(t, d.MemFree, d.MemTotal)
		assert.NotEmpty(t, d.Architecture)
		t.Logf("NVML %d: %+v (driver %s)", i, d, ver)
	}
	// NVML and the driver API agree on the first device.
	if dev, err := loader.GetDevice(0); err == nil && len(devs) > 0 {
		major, minor, err := dev.ComputeCapability()
		require.NoError(t, err)
		assert.Equal(t, [2]int{major, minor}, [2]int{devs[0].Major, devs[0].Minor})
	}
}

func TestArchName(t *testing.T) {
	tests := map[uint32]string{
		nvml.DEVICE_ARCH_AMPERE:    "Ampere",
		nvml.DEVICE_ARCH_HOPPER:    "Hopper",
		nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
		99:                         "unknown (99)",
	}
	for in, want := range tests {
		assert.Equal(t, want, archName(in))
	}
}
