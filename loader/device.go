package loader

import (
	"errors"
	"fmt"
)

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int32

// Device attributes used by gdnkcp. Values are the driver's.
const (
	AttrMaxThreadsPerBlock               DeviceAttribute = 1
	AttrMaxBlockDimX                     DeviceAttribute = 2
	AttrMaxBlockDimY                     DeviceAttribute = 3
	AttrMaxBlockDimZ                     DeviceAttribute = 4
	AttrMaxGridDimX                      DeviceAttribute = 5
	AttrMaxGridDimY                      DeviceAttribute = 6
	AttrMaxGridDimZ                      DeviceAttribute = 7
	AttrMaxSharedMemoryPerBlock          DeviceAttribute = 8
	AttrTotalConstantMemory              DeviceAttribute = 9
	AttrWarpSize                         DeviceAttribute = 10
	AttrMaxRegistersPerBlock             DeviceAttribute = 12
	AttrClockRate                        DeviceAttribute = 13
	AttrMultiprocessorCount              DeviceAttribute = 16
	AttrPCIBusID                         DeviceAttribute = 33
	AttrPCIDeviceID                      DeviceAttribute = 34
	AttrL2CacheSize                      DeviceAttribute = 38
	AttrMaxThreadsPerMultiprocessor      DeviceAttribute = 39
	AttrUnifiedAddressing                DeviceAttribute = 41
	AttrPCIDomainID                      DeviceAttribute = 50
	AttrComputeCapabilityMajor           DeviceAttribute = 75
	AttrComputeCapabilityMinor           DeviceAttribute = 76
	AttrMaxSharedMemoryPerMultiprocessor DeviceAttribute = 81
	AttrMaxRegistersPerMultiprocessor    DeviceAttribute = 82
	AttrCooperativeLaunch                DeviceAttribute = 95
	AttrMaxSharedMemoryPerBlockOptin     DeviceAttribute = 97
)

// Device is one CUDA device. Its methods need no context.
type Device struct {
	Ordinal int // the index given to GetDevice

	d      *driver
	handle int32
}

// errNilDevice is what the methods of a nil *Device return.
var errNilDevice = errors.New("loader: nil device")

// DriverVersion returns cuDriverGetVersion, e.g. 13000 for CUDA 13.0.
func DriverVersion() (int, error) {
	return drv.lib.driverVersion()
}

// DriverVersion returns cuDriverGetVersion of the driver the device
// belongs to, e.g. 13000 for CUDA 13.0.
func (dev *Device) DriverVersion() (int, error) {
	if dev == nil {
		return 0, errNilDevice
	}
	return dev.d.lib.driverVersion()
}

// DeviceCount returns the number of CUDA devices.
func DeviceCount() (int, error) {
	d := drv
	if err := d.ready(); err != nil {
		return 0, err
	}
	return d.deviceCount()
}

// GetDevice returns the device with the given ordinal.
func GetDevice(ordinal int) (*Device, error) {
	d := drv
	if err := d.ready(); err != nil {
		return nil, err
	}
	n, err := d.deviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("loader: device %d does not exist (%d devices)", ordinal, n)
	}
	h, err := d.deviceGet(ordinal)
	if err != nil {
		return nil, err
	}
	return &Device{Ordinal: ordinal, d: d, handle: h}, nil
}

// Name returns the device's name, e.g. "NVIDIA H200".
func (dev *Device) Name() (string, error) {
	if dev == nil {
		return "", errNilDevice
	}
	return dev.d.deviceName(dev.handle)
}

// Attribute returns one device attribute.
func (dev *Device) Attribute(attr DeviceAttribute) (int, error) {
	if dev == nil {
		return 0, errNilDevice
	}
	v, err := dev.d.deviceAttribute(attr, dev.handle)
	if err != nil {
		return 0, fmt.Errorf("loader: device %d attribute %d: %w", dev.Ordinal, attr, err)
	}
	return v, nil
}

// ComputeCapability returns the device's compute capability, e.g. 9, 0.
func (dev *Device) ComputeCapability() (major, minor int, err error) {
	if major, err = dev.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = dev.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// SMCount returns the number of streaming multiprocessors.
func (dev *Device) SMCount() (int, error) {
	return dev.Attribute(AttrMultiprocessorCount)
}

// SharedMemoryOptin returns the most shared memory one block may use after
// opting in (Function.SetMaxDynamicSharedMemory), in bytes.
func (dev *Device) SharedMemoryOptin() (int, error) {
	return dev.Attribute(AttrMaxSharedMemoryPerBlockOptin)
}

// TotalMem returns the device's memory in bytes.
func (dev *Device) TotalMem() (uint64, error) {
	if dev == nil {
		return 0, errNilDevice
	}
	return dev.d.deviceTotalMem(dev.handle)
}

// CanAccessPeer reports whether this device can read and write peer's memory
// once peer access is enabled.
func (dev *Device) CanAccessPeer(peer *Device) (bool, error) {
	if dev == nil || peer == nil {
		return false, fmt.Errorf("loader: CanAccessPeer: %w", errNilDevice)
	}
	return dev.d.deviceCanAccessPeer(dev.handle, peer.handle)
}
