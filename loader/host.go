package loader

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// cuMemHostAlloc flags.
const memHostAllocPortable = 0x01

// HostBuffer is page-locked host memory from cuMemHostAlloc: copies to and
// from it run asynchronously and at full speed. Its bytes live outside the
// Go heap and vanish on Free.
type HostBuffer struct {
	ctx     *Context
	p       unsafe.Pointer
	size    int
	freed   atomic.Bool
	cleanup runtime.Cleanup
}

// AllocHost allocates size bytes of pinned host memory, portable to every
// context.
func (c *Context) AllocHost(size int) (*HostBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("loader: AllocHost(%d): size must be positive", size)
	}
	var p unsafe.Pointer
	err := c.Do(func() error {
		var e error
		p, e = c.d.memHostAlloc(uintptr(size), memHostAllocPortable)
		return e
	})
	if err != nil {
		return nil, fmt.Errorf("loader: AllocHost(%d): %w", size, err)
	}
	h := &HostBuffer{ctx: c, p: p, size: size}
	h.cleanup = runtime.AddCleanup(h, runCleanup, released{d: c.d, ctx: c.handle, handle: uintptr(p),
		free: freeHostHandle})
	return h, nil
}

// freeHostHandle frees pinned memory known only by its address; it runs in
// safety-net cleanups, where the memory is not the Go heap's.
func freeHostHandle(d *driver, h uintptr) error {
	return d.memFreeHost(*(*unsafe.Pointer)(unsafe.Pointer(&h)))
}

// Bytes returns the memory as a byte slice, or nil after Free. The slice
// must not be used after Free.
func (h *HostBuffer) Bytes() []byte {
	if h == nil || h.freed.Load() {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.size)
}

// Size returns the length in bytes.
func (h *HostBuffer) Size() int {
	if h == nil {
		return 0
	}
	return h.size
}

// Free releases the memory (cuMemFreeHost). Only the first call frees;
// later calls return nil.
func (h *HostBuffer) Free() error {
	if h == nil || !h.freed.CompareAndSwap(false, true) {
		return nil
	}
	h.cleanup.Stop()
	if err := h.ctx.alive(); err != nil {
		return err
	}
	return h.ctx.Do(func() error { return h.ctx.d.memFreeHost(h.p) })
}
