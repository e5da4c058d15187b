package loader

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
)

// ImageKind says what a module image is.
type ImageKind int

// Image kinds, told apart by their first bytes.
const (
	ImagePTX    ImageKind = iota // PTX text, compiled by the driver's JIT
	ImageCubin                   // an ELF cubin for one architecture
	ImageFatbin                  // a fatbinary container
)

// String names the kind.
func (k ImageKind) String() string {
	switch k {
	case ImagePTX:
		return "ptx"
	case ImageCubin:
		return "cubin"
	case ImageFatbin:
		return "fatbin"
	}
	return fmt.Sprintf("ImageKind(%d)", int(k))
}

var (
	elfMagic    = []byte{0x7f, 'E', 'L', 'F'}
	fatbinMagic = []byte{0x50, 0xed, 0x55, 0xba} // 0xBA55ED50, little-endian
)

// prepareImage classifies an image and returns the bytes to hand to the
// driver: binaries unchanged, PTX NUL-terminated (in a copy when a NUL has
// to be added, so the caller's slice is never written).
func prepareImage(image []byte) ([]byte, ImageKind, error) {
	switch {
	case len(image) == 0:
		return nil, 0, errors.New("loader: empty module image")
	case bytes.HasPrefix(image, elfMagic):
		return image, ImageCubin, nil
	case bytes.HasPrefix(image, fatbinMagic):
		return image, ImageFatbin, nil
	case image[len(image)-1] == 0:
		return image, ImagePTX, nil
	}
	out := make([]byte, len(image)+1)
	copy(out, image)
	return out, ImagePTX, nil
}

// JITError is a module that failed to load. For PTX, Log holds the JIT
// compiler's (ptxas) error log.
type JITError struct {
	Kind    ImageKind
	Size    int    // image bytes
	Err     error  // the driver error, an *Error
	Log     string // the JIT error log
	InfoLog string // the JIT info log
}

// Error includes the error log, which says what and where.
func (e *JITError) Error() string {
	s := fmt.Sprintf("loader: load %s module (%d bytes): %v", e.Kind, e.Size, e.Err)
	if e.Log != "" {
		s += "\nJIT error log:\n" + e.Log
	}
	return s
}

// Unwrap returns the driver error, so IsCode works on a JITError.
func (e *JITError) Unwrap() error { return e.Err }

// Module is a loaded PTX, cubin or fatbin image.
type Module struct {
	ctx     *Context
	handle  uintptr
	kind    ImageKind
	infoLog string
	closed  atomic.Bool
	cleanup runtime.Cleanup
}

// LoadModule loads an image into the context with cuModuleLoadDataEx, with
// 64 KiB JIT info and error logs and verbose logging. PTX is NUL-terminated
// first if needed. A failed load returns a *JITError carrying the error log.
func LoadModule(ctx *Context, image []byte) (*Module, error) {
	if err := ctx.alive(); err != nil {
		return nil, err
	}
	img, kind, err := prepareImage(image)
	if err != nil {
		return nil, err
	}
	var h uintptr
	var info, elog string
	err = ctx.Do(func() error {
		var e error
		h, info, elog, e = ctx.d.moduleLoadData(img)
		return e
	})
	runtime.KeepAlive(img)
	if err != nil {
		var de *Error
		if !errors.As(err, &de) {
			return nil, err // no driver or a missing symbol: nothing was compiled
		}
		return nil, &JITError{Kind: kind, Size: len(image), Err: err, Log: elog, InfoLog: info}
	}
	m := &Module{ctx: ctx, handle: h, kind: kind, infoLog: info}
	m.cleanup = runtime.AddCleanup(m, runCleanup, released{d: ctx.d, ctx: ctx.handle, handle: h,
		free: func(d *driver, h uintptr) error { return d.moduleUnload(h) }})
	return m, nil
}

// InfoLog returns the JIT info log of the load (for PTX: ptxas's register
// and memory report; often empty for cubins).
func (m *Module) InfoLog() string {
	if m == nil {
		return ""
	}
	return m.infoLog
}

// Kind says what the image was.
func (m *Module) Kind() ImageKind {
	if m == nil {
		var k ImageKind
		return k
	}
	return m.kind
}

// Context returns the module's context.
func (m *Module) Context() *Context {
	if m == nil {
		return nil
	}
	return m.ctx
}

func (m *Module) alive() error {
	if m == nil {
		return errors.New("loader: nil module")
	}
	if m.closed.Load() {
		return fmt.Errorf("loader: module: %w", ErrClosed)
	}
	return m.ctx.alive()
}

// Function looks up a kernel entry by name. A missing entry is an error
// that names it and wraps CUDA_ERROR_NOT_FOUND.
func (m *Module) Function(name string) (*Function, error) {
	if err := m.alive(); err != nil {
		return nil, err
	}
	var h uintptr
	err := m.ctx.Do(func() error {
		var e error
		h, e = m.ctx.d.moduleGetFunction(m.handle, name)
		return e
	})
	if err != nil {
		return nil, fmt.Errorf("loader: kernel %q in %s module: %w", name, m.kind, err)
	}
	return &Function{mod: m, handle: h, name: name}, nil
}

// Close unloads the module (cuModuleUnload); its Functions become unusable.
// Only the first call unloads; later calls return nil.
func (m *Module) Close() error {
	if m == nil || !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	m.cleanup.Stop()
	if err := m.ctx.alive(); err != nil {
		return err
	}
	return m.ctx.Do(func() error { return m.ctx.d.moduleUnload(m.handle) })
}
