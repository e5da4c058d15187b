package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
)

// fakeDevices stands in the GPU views until the test ends.
func fakeDevices(t *testing.T, all func(archdetect.Options) ([]*archdetect.Profile, error),
	nvml func() ([]archdetect.NVMLDevice, string, error)) {
	savedAll, savedNVML := detectAll, nvmlInfo
	t.Cleanup(func() { detectAll, nvmlInfo = savedAll, savedNVML })
	detectAll, nvmlInfo = all, nvml
}

// h200 is an H200 as archdetect sees it, with the embedded manifest's blob
// for its slot (or opts.Blob's), so that its kernel choice is the real one.
func h200(opts archdetect.Options) ([]*archdetect.Profile, error) {
	m, err := ptx.Default().Manifest()
	if err != nil {
		return nil, err
	}
	slot := "sm_90a"
	if opts.Blob != "" {
		slot = opts.Blob
	}
	b, ok := m.Blob(slot)
	if !ok {
		return nil, fmt.Errorf("no embedded blob %s", slot)
	}
	p := &archdetect.Profile{
		Ordinal: 0, Name: "NVIDIA H200", Arch: "Hopper", Major: 9, Minor: 0, SMs: 132, MemBytes: 150 << 30, SharedOptin: 232448,
		Blob: b, Target: slot, Reason: "exact cubin sm_90a for compute capability 9.0", Variant: "sm_90a",
	}
	if opts.Blob != "" {
		p.Forced, p.Reason = true, "forced by option"
	}
	return []*archdetect.Profile{p}, nil
}

func TestDevicesNoDriver(t *testing.T) {
	fakeDevices(t,
		func(archdetect.Options) ([]*archdetect.Profile, error) {
			return nil, fmt.Errorf("archdetect: %w (tried libcuda.so.1)", loader.ErrNoDriver)
		},
		func() ([]archdetect.NVMLDevice, string, error) { return nil, "", archdetect.ErrNVMLNeedsCgo })
	stdout, stderr, code := execute("devices")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "NVML: not available: archdetect: NVML needs a cgo build")
	assert.Contains(t, stdout, "CUDA driver: none (archdetect: loader: CUDA driver library not found")
	assert.Contains(t, stdout, "kcp plan needs --arch")

	stdout, _, code = execute("devices", "--json")
	require.Equal(t, 0, code)
	var dj devicesJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &dj))
	assert.False(t, dj.Driver)
	assert.Nil(t, dj.NVML)
	assert.Empty(t, dj.Devices)
	assert.Contains(t, dj.DriverError, "CUDA driver library not found")
}

// A driver library with no GPU behind it (cuInit: CUDA_ERROR_NO_DEVICE, NVML:
// driver not loaded) is reported, not a failure.
func TestDevicesNoGPU(t *testing.T) {
	fakeDevices(t,
		func(archdetect.Options) ([]*archdetect.Profile, error) {
			return nil, fmt.Errorf("archdetect: %w", &loader.Error{Call: "cuInit", Code: loader.ErrorNoDevice})
		},
		func() ([]archdetect.NVMLDevice, string, error) {
			return nil, "", fmt.Errorf("%w: nvml.Init: Driver Not Loaded", archdetect.ErrNVMLNoDriver)
		})
	stdout, stderr, code := execute("devices")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "NVML: not available: archdetect: NVML is installed but the NVIDIA kernel driver is not loaded")
	assert.Contains(t, stdout, "CUDA driver: present, but it sees no GPU (archdetect: cuInit: CUDA_ERROR_NO_DEVICE (100))")
	assert.Contains(t, stdout, "kcp plan needs --arch")

	stdout, _, code = execute("devices", "--json")
	require.Equal(t, 0, code)
	var dj devicesJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &dj))
	assert.True(t, dj.Driver)
	assert.True(t, dj.NoGPU)
	assert.Empty(t, dj.Devices)
	assert.Contains(t, dj.DriverError, "CUDA_ERROR_NO_DEVICE")
}

func TestDevicesOneGPU(t *testing.T) {
	fakeDevices(t, h200, func() ([]archdetect.NVMLDevice, string, error) {
		return []archdetect.NVMLDevice{{Index: 0, Name: "NVIDIA H200", UUID: "GPU-1", Major: 9, Architecture: "Hopper",
			MIGSupported: true, MemTotal: 150 << 30, MemFree: 149 << 30}}, "580.159.04", nil
	})
	stdout, stderr, code := execute("devices")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "NVML: driver 580.159.04, 1 GPU(s)")
	assert.Contains(t, stdout, "NVIDIA H200 (CC 9.0, Hopper), 150.0 GiB total, 149.0 GiB free, MIG off")
	assert.Contains(t, stdout, "GPU 0: NVIDIA H200 (CC 9.0, Hopper, 132 SMs, 150.0 GiB)")
	assert.Contains(t, stdout, "sm_90a (cubin, built as sm_90a): exact cubin sm_90a")
	assert.Contains(t, stdout, "variant sm_90a, 132 SMs: Hopper")
	assert.Regexp(t, `kernels: +v5: auto: v5 \(the fastest set; blob sm_90a has it and NVIDIA H200 allows its shared memory\)`, stdout)

	stdout, _, code = execute("devices", "--json", "--blob", "compute_80")
	require.Equal(t, 0, code)
	var dj devicesJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &dj))
	require.Len(t, dj.Devices, 1)
	d := dj.Devices[0]
	assert.Equal(t, "compute_80", d.Blob)
	assert.True(t, d.Forced)
	assert.Equal(t, "sm_90a", d.Variant)
	assert.Contains(t, d.RuleNote, "measured on an H200")
	assert.Equal(t, "v5", d.Kernels, d.KernelsWhy)
	assert.Contains(t, d.KernelsWhy, "blob compute_80 has it")
	assert.Equal(t, "580.159.04", dj.NVML.DriverVersion)
}

func TestDevicesErrors(t *testing.T) {
	fakeDevices(t, func(archdetect.Options) ([]*archdetect.Profile, error) {
		return nil, errors.New("archdetect: no blob for NVIDIA T4 (compute capability 7.5)")
	}, func() ([]archdetect.NVMLDevice, string, error) { return nil, "", archdetect.ErrNoNVML })
	stdout, stderr, code := execute("devices")
	assert.Equal(t, 1, code)
	assert.Contains(t, stdout, "error: archdetect: no blob for NVIDIA T4")
	assert.Contains(t, stderr, "kcp: error: archdetect: no blob")

	_, stderr, code = execute("devices", "--blob", "sm_80")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `--blob "sm_80": unknown blob slot`)
}
