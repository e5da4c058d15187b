package archdetect

import "errors"

// NVMLDevice is one GPU as NVML sees it, read without a CUDA context.
type NVMLDevice struct {
	Index        int
	Name         string
	UUID         string
	Major, Minor int    // CUDA compute capability
	Architecture string // e.g. "Hopper"
	MIGSupported bool   // the device has a MIG mode
	MIGEnabled   bool   // MIG mode is on now
	MIGPending   bool   // MIG mode will be on after a reset
	MemTotal     uint64 // bytes
	MemFree      uint64 // bytes
}

// ErrNVMLNeedsCgo is returned by NVMLInfo in CGO_ENABLED=0 builds.
var ErrNVMLNeedsCgo = errors.New("archdetect: NVML needs a cgo build (go-nvml is cgo); this binary was built with CGO_ENABLED=0")

// ErrNoNVML is returned (wrapped) by NVMLInfo when libnvidia-ml.so.1
// cannot be loaded.
var ErrNoNVML = errors.New("archdetect: NVML library libnvidia-ml.so.1 not found")

// ErrNVMLNoDriver is returned (wrapped) by NVMLInfo when libnvidia-ml.so.1
// loads but the NVIDIA kernel driver is not (a machine or container with
// the user-space libraries and no GPU).
var ErrNVMLNoDriver = errors.New("archdetect: NVML is installed but the NVIDIA kernel driver is not loaded")
