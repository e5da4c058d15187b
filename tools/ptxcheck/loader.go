package main

import (
	"errors"
	"fmt"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/ptx"
)

// loaderDriver is the --gpu driver backed by package loader.
type loaderDriver struct {
	ctxs map[int]*loader.Context
}

// newLoaderDriver opens the CUDA driver through package loader; without a
// driver it returns loader.ErrNoDriver.
func newLoaderDriver() (gpuDriver, error) {
	if _, err := loader.DriverVersion(); err != nil {
		return nil, err
	}
	return &loaderDriver{ctxs: map[int]*loader.Context{}}, nil
}

// Devices asks the driver for every device's name and compute capability.
func (l *loaderDriver) Devices() ([]gpuDevice, error) {
	n, err := loader.DeviceCount()
	if err != nil {
		return nil, err
	}
	var out []gpuDevice
	for i := 0; i < n; i++ {
		dev, err := loader.GetDevice(i)
		if err != nil {
			return nil, err
		}
		name, err := dev.Name()
		if err != nil {
			return nil, err
		}
		major, minor, err := dev.ComputeCapability()
		if err != nil {
			return nil, err
		}
		out = append(out, gpuDevice{Ordinal: i, Name: name, Major: major, Minor: minor})
	}
	return out, nil
}

// Load loads image into the device's primary context, resolves each entry,
// records its manifest signature with loader (which checks the layout) and
// reads its register count; the module is unloaded before returning.
func (l *loaderDriver) Load(d gpuDevice, image []byte, entries []ptx.Entry) (out []gpuEntry, err error) {
	ctx, ok := l.ctxs[d.Ordinal]
	if !ok {
		ctx, err = loader.Primary(d.Ordinal)
		if err != nil {
			return nil, err
		}
		l.ctxs[d.Ordinal] = ctx
	}
	mod, err := loader.LoadModule(ctx, image)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := mod.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("unload: %w", cerr)
		}
	}()
	var errs []error
	for _, e := range entries {
		fn, err := mod.Function(e.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sig := make([]loader.ParamSpec, len(e.Params))
		for i, p := range e.Params {
			sig[i] = loader.ParamSpec{Name: p.Name, Size: p.Size, Align: p.Align, Offset: p.Offset}
		}
		if err := fn.SetSignature(sig); err != nil {
			errs = append(errs, fmt.Errorf("entry %s: parameter layout: %w", e.Name, err))
			continue
		}
		attrs, err := fn.Attributes()
		if err != nil {
			errs = append(errs, fmt.Errorf("entry %s: attributes: %w", e.Name, err))
			continue
		}
		out = append(out, gpuEntry{Name: e.Name, Registers: attrs.Registers})
	}
	return out, errors.Join(errs...)
}

// Close releases the primary contexts retained by Load.
func (l *loaderDriver) Close() error {
	var errs []error
	for _, c := range l.ctxs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
