package loader

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Buffer is device memory owned by one context, or a view into another
// Buffer. Byte copies move min-length data from/to its start; see the typed
// helpers (CopyToDevice, CopyFromDevice) for exact-size element copies.
type Buffer struct {
	ctx     *Context
	ptr     uintptr
	size    int
	root    *Buffer // the owning buffer; itself unless a view
	freed   atomic.Bool
	cleanup runtime.Cleanup
}

// Alloc allocates size bytes of device memory (cuMemAlloc_v2). The memory
// is not cleared.
func (c *Context) Alloc(size int) (*Buffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("loader: Alloc(%d): size must be positive", size)
	}
	if err := c.alive(); err != nil {
		return nil, fmt.Errorf("loader: Alloc(%d): %w", size, err)
	}
	var p uintptr
	err := c.Do(func() error {
		var e error
		p, e = c.d.memAlloc(uintptr(size))
		return e
	})
	if err != nil {
		return nil, fmt.Errorf("loader: Alloc(%d) on device %d: %w", size, c.dev.Ordinal, err)
	}
	b := &Buffer{ctx: c, ptr: p, size: size}
	b.root = b
	b.cleanup = runtime.AddCleanup(b, runCleanup, released{d: c.d, ctx: c.handle, handle: p,
		free: func(d *driver, h uintptr) error { return d.memFree(h) }})
	return b, nil
}

// Ptr returns the device address (CUdeviceptr); 0 for a nil buffer, the
// null pointer a kernel takes for an output it should not write.
func (b *Buffer) Ptr() uintptr {
	if b == nil {
		return 0
	}
	return b.ptr
}

// Size returns the buffer's length in bytes.
func (b *Buffer) Size() int {
	if b == nil {
		return 0
	}
	return b.size
}

// Context returns the context that owns the memory.
func (b *Buffer) Context() *Context {
	if b == nil {
		return nil
	}
	return b.ctx
}

// View returns a Buffer for bytes [offset, offset+size) of b. It shares b's
// memory: freeing b invalidates it, and freeing the view frees nothing.
func (b *Buffer) View(offset, size int) (*Buffer, error) {
	if err := b.alive(); err != nil {
		return nil, err
	}
	if offset < 0 || size <= 0 || offset+size > b.size {
		return nil, fmt.Errorf("loader: View(%d, %d) of a %d-byte buffer is out of range", offset, size, b.size)
	}
	return &Buffer{ctx: b.ctx, ptr: b.ptr + uintptr(offset), size: size, root: b.root}, nil
}

// alive reports an error once the buffer, its owner or its context is gone.
func (b *Buffer) alive() error {
	if b == nil {
		return fmt.Errorf("loader: nil buffer")
	}
	if b.freed.Load() || b.root.freed.Load() {
		return fmt.Errorf("loader: buffer 0x%x (%d bytes): %w", b.ptr, b.size, ErrClosed)
	}
	return b.ctx.alive()
}

// Free releases the memory (cuMemFree_v2). Only the first call frees; later
// calls return nil. Freeing a view only invalidates the view.
func (b *Buffer) Free() error {
	if b == nil || !b.freed.CompareAndSwap(false, true) {
		return nil
	}
	if b.root != b {
		return nil
	}
	b.cleanup.Stop()
	if err := b.ctx.alive(); err != nil {
		return err
	}
	return b.ctx.Do(func() error { return b.ctx.d.memFree(b.ptr) })
}

// streamOf returns the raw stream for work in ctx: 0 (the default stream)
// for nil, or an error when s is closed or belongs to another context.
func streamOf(s *Stream, ctx *Context) (uintptr, error) {
	if s == nil {
		return 0, nil
	}
	if err := s.alive(); err != nil {
		return 0, err
	}
	if s.ctx.handle != ctx.handle {
		return 0, fmt.Errorf("loader: stream of device %d used for work on device %d", s.ctx.dev.Ordinal, ctx.dev.Ordinal)
	}
	return s.handle, nil
}

func (b *Buffer) fits(op string, n int) error {
	if n > b.size {
		return fmt.Errorf("loader: %s: %d bytes do not fit in a %d-byte buffer", op, n, b.size)
	}
	return nil
}

// CopyHtoD copies src to the start of the buffer and returns when done.
func (b *Buffer) CopyHtoD(src []byte) error { return b.copyHtoD(src, nil, false) }

// CopyHtoDAsync copies src to the start of the buffer in stream order. From
// Go memory the driver stages the data before returning; from a HostBuffer
// the copy is truly asynchronous, so keep the HostBuffer until the stream
// has synchronized.
func (b *Buffer) CopyHtoDAsync(src []byte, s *Stream) error { return b.copyHtoD(src, s, true) }

func (b *Buffer) copyHtoD(src []byte, s *Stream, async bool) error {
	if err := b.alive(); err != nil {
		return err
	}
	if err := b.fits("CopyHtoD", len(src)); err != nil || len(src) == 0 {
		return err
	}
	sh, err := streamOf(s, b.ctx)
	if err != nil {
		return err
	}
	return b.ctx.Do(func() error {
		return b.ctx.d.memcpyHtoD(b.ptr, unsafe.Pointer(&src[0]), uintptr(len(src)), sh, async)
	})
}

// CopyDtoH fills dst from the start of the buffer and returns when done.
func (b *Buffer) CopyDtoH(dst []byte) error { return b.copyDtoH(dst, nil, false) }

// CopyDtoHAsync fills dst from the start of the buffer in stream order. Into
// Go memory the driver returns only when the copy is complete; into a
// HostBuffer it returns at once, and the data is there after the stream
// synchronizes.
func (b *Buffer) CopyDtoHAsync(dst []byte, s *Stream) error { return b.copyDtoH(dst, s, true) }

func (b *Buffer) copyDtoH(dst []byte, s *Stream, async bool) error {
	if err := b.alive(); err != nil {
		return err
	}
	if err := b.fits("CopyDtoH", len(dst)); err != nil || len(dst) == 0 {
		return err
	}
	sh, err := streamOf(s, b.ctx)
	if err != nil {
		return err
	}
	return b.ctx.Do(func() error {
		return b.ctx.d.memcpyDtoH(unsafe.Pointer(&dst[0]), b.ptr, uintptr(len(dst)), sh, async)
	})
}

// CopyDtoD copies all of src to the start of b and returns when done.
func (b *Buffer) CopyDtoD(src *Buffer) error { return b.copyDtoD(src, nil, false) }

// CopyDtoDAsync copies all of src to the start of b in stream order.
func (b *Buffer) CopyDtoDAsync(src *Buffer, s *Stream) error { return b.copyDtoD(src, s, true) }

func (b *Buffer) copyDtoD(src *Buffer, s *Stream, async bool) error {
	if err := b.alive(); err != nil {
		return err
	}
	if err := src.alive(); err != nil {
		return err
	}
	if err := b.fits("CopyDtoD", src.size); err != nil {
		return err
	}
	sh, err := streamOf(s, b.ctx)
	if err != nil {
		return err
	}
	return b.ctx.Do(func() error {
		return b.ctx.d.memcpyDtoD(b.ptr, src.ptr, uintptr(src.size), sh, async)
	})
}

// Memset8 sets every byte of the buffer to v and returns when done.
func (b *Buffer) Memset8(v byte) error { return b.memset8(v, nil, false) }

// Memset8Async sets every byte of the buffer to v in stream order.
func (b *Buffer) Memset8Async(v byte, s *Stream) error { return b.memset8(v, s, true) }

func (b *Buffer) memset8(v byte, s *Stream, async bool) error {
	if err := b.alive(); err != nil {
		return err
	}
	sh, err := streamOf(s, b.ctx)
	if err != nil {
		return err
	}
	return b.ctx.Do(func() error { return b.ctx.d.memsetD8(b.ptr, v, uintptr(b.size), sh, async) })
}

// Memset32 sets every 32-bit word of the buffer to v and returns when done.
// The buffer's address and size must be multiples of 4.
func (b *Buffer) Memset32(v uint32) error { return b.memset32(v, nil, false) }

// Memset32Async sets every 32-bit word of the buffer to v in stream order.
func (b *Buffer) Memset32Async(v uint32, s *Stream) error { return b.memset32(v, s, true) }

func (b *Buffer) memset32(v uint32, s *Stream, async bool) error {
	if err := b.alive(); err != nil {
		return err
	}
	if b.size%4 != 0 || b.ptr%4 != 0 {
		return fmt.Errorf("loader: Memset32 on a %d-byte buffer at 0x%x: size and address must be multiples of 4", b.size, b.ptr)
	}
	sh, err := streamOf(s, b.ctx)
	if err != nil {
		return err
	}
	return b.ctx.Do(func() error { return b.ctx.d.memsetD32(b.ptr, v, uintptr(b.size/4), sh, async) })
}

// CopyPeerAsync copies n bytes from the start of src to the start of dst,
// which may live on different devices (cuMemcpyPeerAsync), in the order of
// stream s (nil: the default stream of dst's context).
func CopyPeerAsync(dst, src *Buffer, n int, s *Stream) error {
	if err := dst.alive(); err != nil {
		return err
	}
	if err := src.alive(); err != nil {
		return err
	}
	if n < 0 || n > src.size || n > dst.size {
		return fmt.Errorf("loader: CopyPeerAsync of %d bytes from a %d-byte to a %d-byte buffer", n, src.size, dst.size)
	}
	if n == 0 {
		return nil
	}
	ctx := dst.ctx
	if s != nil {
		ctx = s.ctx
	}
	sh, err := streamOf(s, ctx)
	if err != nil {
		return err
	}
	return ctx.Do(func() error {
		return ctx.d.memcpyPeerAsync(dst.ptr, dst.ctx.handle, src.ptr, src.ctx.handle, uintptr(n), sh)
	})
}
