package loader

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
)

// ErrClosed is wrapped by every call on a Context, Buffer, HostBuffer,
// Stream, Event or Module that was already closed or freed.
var ErrClosed = errors.New("loader: already closed")

// Context is a retained reference to a device's primary context. Every
// method that needs it current binds it on a locked OS thread for the call.
type Context struct {
	d       *driver
	dev     *Device
	handle  uintptr
	closed  atomic.Bool
	cleanup runtime.Cleanup
}

// PrimaryContext retains the device's primary context
// (cuDevicePrimaryCtxRetain). Close releases it.
func (dev *Device) PrimaryContext() (*Context, error) {
	if dev == nil {
		return nil, errNilDevice
	}
	h, err := dev.d.primaryCtxRetain(dev.handle)
	if err != nil {
		return nil, fmt.Errorf("loader: device %d: %w", dev.Ordinal, err)
	}
	c := &Context{d: dev.d, dev: dev, handle: h}
	type rel struct {
		d   *driver
		dev int32
	}
	c.cleanup = runtime.AddCleanup(c, func(r rel) {
		recordCleanupError(r.d.primaryCtxRelease(r.dev))
	}, rel{dev.d, dev.handle})
	return c, nil
}

// Primary is GetDevice(ordinal) followed by PrimaryContext.
func Primary(ordinal int) (*Context, error) {
	dev, err := GetDevice(ordinal)
	if err != nil {
		return nil, err
	}
	return dev.PrimaryContext()
}

// Device returns the context's device.
func (c *Context) Device() *Device {
	if c == nil {
		return nil
	}
	return c.dev
}

// Handle returns the raw CUcontext, for code that calls other CUDA
// libraries (e.g. NCCL) inside Do.
func (c *Context) Handle() uintptr {
	if c == nil {
		return 0
	}
	return c.handle
}

// alive returns ErrClosed (wrapped) once Close has run.
func (c *Context) alive() error {
	if c == nil {
		return errors.New("loader: nil context")
	}
	if c.closed.Load() {
		return fmt.Errorf("loader: context of device %d: %w", c.dev.Ordinal, ErrClosed)
	}
	return nil
}

// Do runs fn on one locked OS thread with the context current, so that
// several driver calls (this package's or another library's) happen on the
// same thread without re-binding in between.
func (c *Context) Do(fn func() error) error {
	if err := c.alive(); err != nil {
		return err
	}
	return withContext(c.d, c.handle, fn)
}

// Synchronize waits for all work in the context (cuCtxSynchronize).
func (c *Context) Synchronize() error {
	return c.Do(func() error { return c.d.ctxSynchronize() }) // not c.d's method value: c may be nil
}

// MemGetInfo returns the free and total device memory in bytes.
func (c *Context) MemGetInfo() (free, total uint64, err error) {
	err = c.Do(func() error {
		var e error
		free, total, e = c.d.memGetInfo()
		return e
	})
	return free, total, err
}

// EnablePeerAccess lets this context access memory of peer's context
// (cuCtxEnablePeerAccess). Enabling it twice is not an error.
func (c *Context) EnablePeerAccess(peer *Context) error {
	if err := peer.alive(); err != nil {
		return err
	}
	err := c.Do(func() error { return c.d.ctxEnablePeerAccess(peer.handle) })
	if IsCode(err, ErrorPeerAccessAlreadyEnabled) {
		return nil
	}
	return err
}

// Close releases the primary context (cuDevicePrimaryCtxRelease_v2). Only
// the first call releases; later calls return nil. Free and close what was
// made in the context first: afterwards their Free and Close return an
// error wrapping ErrClosed.
func (c *Context) Close() error {
	if c == nil || !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.cleanup.Stop()
	return c.d.primaryCtxRelease(c.dev.handle)
}
