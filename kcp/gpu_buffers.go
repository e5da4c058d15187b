package kcp

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/gdnkcp/gdnkcp/loader"
)

// devMem tracks what one rank made on the device (buffers, streams, events)
// and releases it in reverse order. It is used by one goroutine at a time.
type devMem struct {
	ctx     *loader.Context
	release []func() error
	names   []string
	bytes   int64 // device memory held now
	peak    int64 // the most device memory held at once since newDevMem
	pool    *stagerPool
	st      *stager // the run's, from pool (devMem.stager)
}

// newDevMem tracks a run's device memory in ctx; pool (nil: none) lends the
// run a stager for its large uploads.
func newDevMem(ctx *loader.Context, pool *stagerPool) *devMem { return &devMem{ctx: ctx, pool: pool} }

// devMemLive is the device memory all devMems of the process hold now, in
// bytes: the tests' check that every path frees what it allocated.
var devMemLive atomic.Int64

// track records a release function.
func (m *devMem) track(name string, fn func() error) {
	m.release = append(m.release, fn)
	m.names = append(m.names, name)
}

// alloc allocates a device buffer of bytes (at least 4, so that an empty
// table still has an address a kernel may be handed and never reads).
func (m *devMem) alloc(name string, bytes int) (*loader.Buffer, error) {
	n := max(bytes, 4)
	b, err := m.ctx.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("allocate %s (%d bytes; %d held): %w", name, n, m.bytes, err)
	}
	m.bytes += int64(n)
	devMemLive.Add(int64(n))
	m.peak = max(m.peak, m.bytes)
	m.track(name, b.Free)
	return b, nil
}

// stream creates a non-blocking stream.
func (m *devMem) stream() (*loader.Stream, error) {
	s, err := m.ctx.NewStream(loader.StreamNonBlocking)
	if err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	m.track("stream", s.Close)
	return s, nil
}

// priorityStream creates a non-blocking stream of the given priority
// (loader.Context.StreamPriorities gives the range).
func (m *devMem) priorityStream(priority int) (*loader.Stream, error) {
	s, err := m.ctx.NewStreamWithPriority(loader.StreamNonBlocking, priority)
	if err != nil {
		return nil, fmt.Errorf("create stream of priority %d: %w", priority, err)
	}
	m.track("stream", s.Close)
	return s, nil
}

// event creates a timing event.
func (m *devMem) event() (*loader.Event, error) {
	e, err := m.ctx.NewEvent(loader.EventDefault)
	if err != nil {
		return nil, fmt.Errorf("create event: %w", err)
	}
	m.track("event", e.Close)
	return e, nil
}

// held returns the device memory held now and the most held at once so far,
// in bytes (buffers only; streams and events are not counted).
func (m *devMem) held() (now, peak int64) {
	if m == nil {
		return 0, 0
	}
	return m.bytes, m.peak
}

// free releases everything in reverse order and joins the errors. It may be
// called more than once; the peak is kept.
func (m *devMem) free() error {
	if m == nil {
		return nil
	}
	var errs []error
	if err := m.dropStager(); err != nil { // no buffer goes while a staged copy into it may run
		errs = append(errs, err)
	}
	for i := len(m.release) - 1; i >= 0; i-- {
		if err := m.release[i](); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", m.names[i], err))
		}
	}
	devMemLive.Add(-m.bytes)
	m.release, m.names, m.bytes = nil, nil, 0
	return errors.Join(errs...)
}

// upload allocates a buffer for src and copies src into it in stream order,
// through the run's pinned stager from stageMinBytes on.
func upload[T any](m *devMem, s *loader.Stream, name string, src []T, elem int) (*loader.Buffer, error) {
	return uploadCap(m, s, name, src, elem, len(src))
}

// uploadCap is upload into a buffer of capacity elements (at least
// len(src)); the elements past src are not written.
func uploadCap[T any](m *devMem, s *loader.Stream, name string, src []T, elem, capacity int) (*loader.Buffer, error) {
	if capacity < len(src) {
		return nil, fmt.Errorf("upload %s: %d elements into a buffer of %d", name, len(src), capacity)
	}
	b, err := m.alloc(name, capacity*elem)
	if err != nil {
		return nil, err
	}
	if len(src) == 0 {
		return b, nil
	}
	if n := len(src) * elem; n >= stageMinBytes {
		raw := bytesOf(src)
		if len(raw) != n {
			return nil, fmt.Errorf("upload %s: %d elements of %d bytes, want %d", name, len(src), len(raw)/len(src), elem)
		}
		st, err := m.stager()
		if err != nil {
			return nil, fmt.Errorf("upload %s: %w", name, err)
		}
		if err := st.put(b, n, 1, s, copyFill(raw)); err != nil {
			return nil, fmt.Errorf("upload %s: %w", name, err)
		}
		return b, nil
	}
	v, err := exact(b, len(src)*elem)
	if err != nil {
		return nil, err
	}
	if err := loader.CopyToDeviceAsync(v, src, s); err != nil {
		return nil, fmt.Errorf("upload %s: %w", name, err)
	}
	return b, nil
}

// download copies the first len(dst) elements of b into dst (no-op when
// empty); into Go memory the copy is complete when it returns.
func download[T any](b *loader.Buffer, s *loader.Stream, name string, dst []T, elem int) error {
	if len(dst) == 0 {
		return nil
	}
	v, err := exact(b, len(dst)*elem)
	if err != nil {
		return err
	}
	if err := loader.CopyFromDeviceAsync(v, dst, s); err != nil {
		return fmt.Errorf("download %s: %w", name, err)
	}
	return nil
}

// exact is b itself when it has bytes bytes, else a view of its first bytes.
func exact(b *loader.Buffer, bytes int) (*loader.Buffer, error) {
	if b.Size() == bytes {
		return b, nil
	}
	return b.View(0, bytes)
}
