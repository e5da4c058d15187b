//go:build cgo

package archdetect

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLInfo returns every GPU as NVML sees it and the driver version (e.g.
// "580.159.04"). It creates no CUDA context. Without libnvidia-ml.so.1 it
// returns an error wrapping ErrNoNVML; with it but without the kernel
// driver, one wrapping ErrNVMLNoDriver.
func NVMLInfo() ([]NVMLDevice, string, error) {
	switch ret := nvml.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, "", fmt.Errorf("%w: nvml.Init: %v", ErrNoNVML, ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, "", fmt.Errorf("%w: nvml.Init: %v", ErrNVMLNoDriver, ret)
	default:
		return nil, "", fmt.Errorf("archdetect: nvml.Init: %v", ret)
	}
	defer nvml.Shutdown()

	version, ret := nvml.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("archdetect: nvml.SystemGetDriverVersion: %v", ret)
	}
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, version, fmt.Errorf("archdetect: nvml.DeviceGetCount: %v", ret)
	}
	devs := make([]NVMLDevice, 0, n)
	for i := range n {
		d, err := nvmlDevice(i)
		if err != nil {
			return devs, version, err
		}
		devs = append(devs, d)
	}
	return devs, version, nil
}

func nvmlDevice(i int) (NVMLDevice, error) {
	fail := func(call string, ret nvml.Return) (NVMLDevice, error) {
		return NVMLDevice{}, fmt.Errorf("archdetect: NVML device %d: %s: %v", i, call, ret)
	}
	h, ret := nvml.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return fail("DeviceGetHandleByIndex", ret)
	}
	d := NVMLDevice{Index: i}
	if d.Name, ret = h.GetName(); ret != nvml.SUCCESS {
		return fail("GetName", ret)
	}
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return fail("GetUUID", ret)
	}
	if d.Major, d.Minor, ret = h.GetCudaComputeCapability(); ret != nvml.SUCCESS {
		return fail("GetCudaComputeCapability", ret)
	}
	arch, ret := h.GetArchitecture()
	switch ret {
	case nvml.SUCCESS:
		d.Architecture = archName(uint32(arch))
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		d.Architecture = "unknown"
	default:
		return fail("GetArchitecture", ret)
	}
	cur, pending, ret := h.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		d.MIGSupported = true
		d.MIGEnabled = cur == nvml.DEVICE_MIG_ENABLE
		d.MIGPending = pending == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
	default:
		return fail("GetMigMode", ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("GetMemoryInfo", ret)
	}
	d.MemTotal, d.MemFree = mem.Total, mem.Free
	return d, nil
}

// archName names an nvmlDeviceArchitecture_t.
func archName(a uint32) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	case nvml.DEVICE_ARCH_RUBIN:
		return "Rubin"
	}
	return fmt.Sprintf("unknown (%d)", a)
}
