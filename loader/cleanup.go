package loader

import (
	"errors"
	"runtime"
	"sync"
)

// Objects that own driver resources register a runtime cleanup as a safety
// net for a forgotten Close or Free. The cleanup runs on a runtime goroutine,
// so it binds the owning context itself; its errors are kept here.
var cleanupErrs struct {
	mu   sync.Mutex
	errs []error
}

func recordCleanupError(err error) {
	if err == nil {
		return
	}
	cleanupErrs.mu.Lock()
	defer cleanupErrs.mu.Unlock()
	if len(cleanupErrs.errs) < 64 {
		cleanupErrs.errs = append(cleanupErrs.errs, err)
	}
}

// TakeCleanupError returns the errors met by safety-net cleanups (objects
// released by the garbage collector rather than by Close or Free) since the
// previous call, joined, or nil. At most 64 are kept.
func TakeCleanupError() error {
	cleanupErrs.mu.Lock()
	defer cleanupErrs.mu.Unlock()
	err := errors.Join(cleanupErrs.errs...)
	cleanupErrs.errs = nil
	return err
}

// withContext runs fn on a locked OS thread with ctx current. It is the one
// place that binds contexts: the current context is read and replaced only
// when it differs.
func withContext(d *driver, ctx uintptr, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := d.ctxGetCurrent()
	if err != nil {
		return err
	}
	if cur != ctx {
		if err := d.ctxSetCurrent(ctx); err != nil {
			return err
		}
	}
	return fn()
}

// released is what a safety-net cleanup needs to free one resource: the
// driver, the owning context and the handle, never the Go object itself.
type released struct {
	d      *driver
	ctx    uintptr
	handle uintptr
	free   func(d *driver, handle uintptr) error
}

func runCleanup(r released) {
	recordCleanupError(withContext(r.d, r.ctx, func() error { return r.free(r.d, r.handle) }))
}
