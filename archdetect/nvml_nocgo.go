//go:build !cgo

package archdetect

// NVMLInfo would report NVML's devices and driver version; without cgo it
// returns ErrNVMLNeedsCgo. Use Detect (the driver API) instead.
func NVMLInfo() ([]NVMLDevice, string, error) {
	return nil, "", ErrNVMLNeedsCgo
}
