package archdetect

import (
	"fmt"
	"os"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
)

// EnvBlob names the environment variable that forces a blob slot, e.g.
// GDNKCP_BLOB=compute_80.
const EnvBlob = "GDNKCP_BLOB"

// Options steer Detect and DetectAll.
type Options struct {
	// Blob forces a blob slot (a flag's value). Empty: GDNKCP_BLOB, unless
	// IgnoreEnv is set; empty too: the automatic choice.
	Blob string
	// IgnoreEnv ignores GDNKCP_BLOB.
	IgnoreEnv bool
	// Manifest to choose from; nil: the embedded blobs' manifest.
	Manifest *ptx.Manifest
}

// override returns the forced slot and where it came from.
func (o Options) override() (slot, source string) {
	if o.Blob != "" {
		return o.Blob, "option"
	}
	if !o.IgnoreEnv {
		if v := os.Getenv(EnvBlob); v != "" {
			return v, EnvBlob + "=" + v
		}
	}
	return "", ""
}

func (o Options) manifest() (*ptx.Manifest, error) {
	if o.Manifest != nil {
		return o.Manifest, nil
	}
	return ptx.Default().Manifest()
}

// Detect asks the driver about device ordinal and returns its Profile.
func Detect(ordinal int, opts Options) (*Profile, error) {
	m, err := opts.manifest()
	if err != nil {
		return nil, err
	}
	return detect(ordinal, m, opts)
}

func detect(ordinal int, m *ptx.Manifest, opts Options) (*Profile, error) {
	dev, err := loader.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("archdetect: device %d: %w", ordinal, err)
	}
	name, err := dev.Name()
	if err != nil {
		return nil, fmt.Errorf("archdetect: device %d: %w", ordinal, err)
	}
	major, minor, err := dev.ComputeCapability()
	if err != nil {
		return nil, fmt.Errorf("archdetect: device %d (%s): %w", ordinal, name, err)
	}
	sms, err := dev.SMCount()
	if err != nil {
		return nil, fmt.Errorf("archdetect: device %d (%s): %w", ordinal, name, err)
	}
	mem, err := dev.TotalMem()
	if err != nil {
		return nil, fmt.Errorf("archdetect: device %d (%s): %w", ordinal, name, err)
	}
	optin, err := dev.SharedMemoryOptin()
	if err != nil {
		return nil, fmt.Errorf("archdetect: device %d (%s): %w", ordinal, name, err)
	}
	slot, source := opts.override()
	p, err := profileFor(CC{major, minor}, sms, name, m, slot, source)
	if err != nil {
		return nil, fmt.Errorf("device %d: %w", ordinal, err)
	}
	p.Ordinal, p.MemBytes, p.SharedOptin = ordinal, mem, optin
	return p, nil
}

// DetectAll returns a Profile for every device, in ordinal order. It stops
// at the first device that has no usable blob.
func DetectAll(opts Options) ([]*Profile, error) {
	m, err := opts.manifest()
	if err != nil {
		return nil, err
	}
	n, err := loader.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("archdetect: %w", err)
	}
	ps := make([]*Profile, 0, n)
	for i := range n {
		p, err := detect(i, m, opts)
		if err != nil {
			return ps, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}
