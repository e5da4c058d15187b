package loader

import (
	"fmt"
	"runtime"
	"sync/atomic"
)

// EventFlags are cuEventCreate flags.
type EventFlags uint32

// Event flags.
const (
	EventDefault       EventFlags = 0 // timing enabled, spin on sync
	EventBlockingSync  EventFlags = 1 // Synchronize blocks the thread instead of spinning
	EventDisableTiming EventFlags = 2 // cheaper; ElapsedMillis refuses it
)

// Event is a CUDA event of one context.
type Event struct {
	ctx     *Context
	handle  uintptr
	closed  atomic.Bool
	cleanup runtime.Cleanup
}

// NewEvent creates an event (cuEventCreate).
func (c *Context) NewEvent(flags EventFlags) (*Event, error) {
	var h uintptr
	err := c.Do(func() error {
		var e error
		h, e = c.d.eventCreate(uint32(flags))
		return e
	})
	if err != nil {
		return nil, err
	}
	ev := &Event{ctx: c, handle: h}
	ev.cleanup = runtime.AddCleanup(ev, runCleanup, released{d: c.d, ctx: c.handle, handle: h,
		free: func(d *driver, h uintptr) error { return d.eventDestroy(h) }})
	return ev, nil
}

// Handle returns the raw CUevent.
func (e *Event) Handle() uintptr {
	if e == nil {
		return 0
	}
	return e.handle
}

func (e *Event) alive() error {
	if e == nil {
		return fmt.Errorf("loader: nil event")
	}
	if e.closed.Load() {
		return fmt.Errorf("loader: event: %w", ErrClosed)
	}
	return e.ctx.alive()
}

// Record captures the work submitted to s so far (nil: default stream).
func (e *Event) Record(s *Stream) error {
	if err := e.alive(); err != nil {
		return err
	}
	sh, err := streamOf(s, e.ctx)
	if err != nil {
		return err
	}
	return e.ctx.Do(func() error { return e.ctx.d.eventRecord(e.handle, sh) })
}

// Synchronize waits until the recorded work has completed.
func (e *Event) Synchronize() error {
	if err := e.alive(); err != nil {
		return err
	}
	return e.ctx.Do(func() error { return e.ctx.d.eventSynchronize(e.handle) })
}

// Query reports whether the recorded work has completed.
func (e *Event) Query() (done bool, err error) {
	if err := e.alive(); err != nil {
		return false, err
	}
	err = e.ctx.Do(func() error {
		var er error
		done, er = e.ctx.d.eventQuery(e.handle)
		return er
	})
	return done, err
}

// Close destroys the event (cuEventDestroy_v2). Only the first call
// destroys; later calls return nil.
func (e *Event) Close() error {
	if e == nil || !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.cleanup.Stop()
	if err := e.ctx.alive(); err != nil {
		return err
	}
	return e.ctx.Do(func() error { return e.ctx.d.eventDestroy(e.handle) })
}

// ElapsedMillis returns the time in milliseconds between two recorded,
// completed events of one context (cuEventElapsedTime_v2, or
// cuEventElapsedTime on drivers older than CUDA 12.8).
func ElapsedMillis(start, end *Event) (float32, error) {
	if err := start.alive(); err != nil {
		return 0, err
	}
	if err := end.alive(); err != nil {
		return 0, err
	}
	var ms float32
	err := start.ctx.Do(func() error {
		var e error
		ms, e = start.ctx.d.eventElapsed(start.handle, end.handle)
		return e
	})
	return ms, err
}
