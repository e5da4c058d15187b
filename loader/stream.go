package loader

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
)

// StreamFlags are cuStreamCreate flags.
type StreamFlags uint32

// Stream flags.
const (
	// StreamDefault streams synchronize with the legacy default stream.
	StreamDefault StreamFlags = 0
	// StreamNonBlocking streams run concurrently with the default stream.
	StreamNonBlocking StreamFlags = 1
)

// Stream is a CUDA stream of one context. A nil *Stream passed to this
// package's functions means the context's default stream.
type Stream struct {
	ctx     *Context
	handle  uintptr
	closed  atomic.Bool
	cleanup runtime.Cleanup
}

// NewStream creates a stream (cuStreamCreate).
func (c *Context) NewStream(flags StreamFlags) (*Stream, error) {
	return c.newStream(func() (uintptr, error) { return c.d.streamCreate(uint32(flags)) })
}

// newStream creates a stream with create, run on the context's thread, and
// arranges its release.
func (c *Context) newStream(create func() (uintptr, error)) (*Stream, error) {
	var h uintptr
	err := c.Do(func() error {
		var e error
		h, e = create()
		return e
	})
	if err != nil {
		return nil, err
	}
	s := &Stream{ctx: c, handle: h}
	s.cleanup = runtime.AddCleanup(s, runCleanup, released{d: c.d, ctx: c.handle, handle: h,
		free: func(d *driver, h uintptr) error { return d.streamDestroy(h) }})
	return s, nil
}

// StreamPriorities returns the context's range of stream priorities
// (cuCtxGetStreamPriorityRange): least is the default priority, greatest the
// highest, and a lower number is a higher priority. Where both pend, the GPU
// hands out the CTAs of a higher-priority stream's launches first.
func (c *Context) StreamPriorities() (least, greatest int, err error) {
	var l, g int32
	err = c.Do(func() error {
		var e error
		l, g, e = c.d.streamPriorities()
		return e
	})
	return int(l), int(g), err
}

// NewStreamWithPriority creates a stream of the given priority
// (cuStreamCreateWithPriority; StreamPriorities gives the range, and the
// driver clamps a priority outside it).
func (c *Context) NewStreamWithPriority(flags StreamFlags, priority int) (*Stream, error) {
	if priority < math.MinInt32 || priority > math.MaxInt32 {
		return nil, fmt.Errorf("loader: stream priority %d out of range", priority)
	}
	return c.newStream(func() (uintptr, error) { return c.d.streamCreateWithPriority(uint32(flags), int32(priority)) })
}

// Handle returns the raw CUstream (usable as a cudaStream_t, e.g. by NCCL).
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	return s.handle
}

// Context returns the stream's context.
func (s *Stream) Context() *Context {
	if s == nil {
		return nil
	}
	return s.ctx
}

func (s *Stream) alive() error {
	if s == nil {
		return fmt.Errorf("loader: nil stream")
	}
	if s.closed.Load() {
		return fmt.Errorf("loader: stream: %w", ErrClosed)
	}
	return s.ctx.alive()
}

// Synchronize waits until all work on the stream has completed.
func (s *Stream) Synchronize() error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.ctx.Do(func() error { return s.ctx.d.streamSynchronize(s.handle) })
}

// Query reports whether all work on the stream has completed.
func (s *Stream) Query() (done bool, err error) {
	if err := s.alive(); err != nil {
		return false, err
	}
	err = s.ctx.Do(func() error {
		var e error
		done, e = s.ctx.d.streamQuery(s.handle)
		return e
	})
	return done, err
}

// WaitEvent makes later work on the stream wait for ev (cuStreamWaitEvent).
func (s *Stream) WaitEvent(ev *Event) error {
	if err := s.alive(); err != nil {
		return err
	}
	if err := ev.alive(); err != nil {
		return err
	}
	return s.ctx.Do(func() error { return s.ctx.d.streamWaitEvent(s.handle, ev.handle) })
}

// Close destroys the stream (cuStreamDestroy_v2). Only the first call
// destroys; later calls return nil.
func (s *Stream) Close() error {
	if s == nil || !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.cleanup.Stop()
	if err := s.ctx.alive(); err != nil {
		return err
	}
	return s.ctx.Do(func() error { return s.ctx.d.streamDestroy(s.handle) })
}
