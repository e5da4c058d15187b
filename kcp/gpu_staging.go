package kcp

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/loader"
)

// Host-to-device copies of large tensors (the module's x, dO, q, k, v) go
// through pinned memory: from pageable Go memory the driver copies at ~6
// GB/s and the copy blocks the rank's goroutine (116 ms for x at 32K tokens
// on the H200), while a pinned source is copied by DMA at the link's rate,
// asynchronously. A stager holds two pinned chunks: while the DMA of one
// runs, the host fills the other (in parallel blocks), so the host fill,
// not the link, sets the pace. Stagers are pooled per device (pinning
// memory is slow: NewGPU makes one for each local rank on the device before
// any timeline starts) and each run holds one at a time.
const (
	// stageChunkBytes is the size of each of a stager's two chunks.
	stageChunkBytes = 16 << 20
	// stageMinBytes is the smallest copy that goes through a stager;
	// smaller ones (tables, g, beta at small sizes) copy directly.
	stageMinBytes = 1 << 20
	// stageFillBlock is the piece of a chunk one goroutine fills.
	stageFillBlock = 1 << 20
)

// stager copies host data to the device through two pinned chunks.
type stager struct {
	buf    [2]*loader.HostBuffer
	done   [2]*loader.Event // recorded after the chunk's last copy
	busy   [2]bool          // done recorded and not yet waited for
	next   int
	failed bool // a copy or a wait failed: close it rather than pool it
}

// newStager allocates the two chunks and their events in ctx; on error what
// it made is released.
func newStager(ctx *loader.Context) (*stager, error) {
	st := &stager{}
	for i := range st.buf {
		var err error
		if st.buf[i], err = ctx.AllocHost(stageChunkBytes); err != nil {
			return nil, errors.Join(fmt.Errorf("pinned staging chunk: %w", err), st.close())
		}
		if st.done[i], err = ctx.NewEvent(loader.EventDisableTiming); err != nil {
			return nil, errors.Join(fmt.Errorf("staging event: %w", err), st.close())
		}
	}
	return st, nil
}

// wait blocks until both chunks' copies are done.
func (st *stager) wait() error {
	var errs []error
	for i := range st.done {
		if st.busy[i] {
			if err := st.done[i].Synchronize(); err != nil {
				errs = append(errs, fmt.Errorf("staging copy: %w", err))
				st.failed = true
			}
			st.busy[i] = false
		}
	}
	return errors.Join(errs...)
}

// close waits for the copies and frees the chunks and events.
func (st *stager) close() error {
	errs := []error{st.wait()}
	for i := range st.buf {
		if st.done[i] != nil {
			errs = append(errs, st.done[i].Close())
		}
		if st.buf[i] != nil {
			errs = append(errs, st.buf[i].Free())
		}
	}
	return errors.Join(errs...)
}

// stageSpans splits n bytes into the spans [off, off+len) a stager copies
// one chunk at a time: each at most chunk bytes and, but for the last, a
// multiple of align (a row of the source, so that a fill converts whole
// rows). align must be positive and at most chunk.
func stageSpans(n, align, chunk int) [][2]int {
	step := chunk / align * align
	var out [][2]int
	for off := 0; off < n; off += step {
		out = append(out, [2]int{off, min(step, n-off)})
	}
	return out
}

// put copies n bytes to the start of dst in the order of stream s. fill
// writes bytes [off, off+len(p)) of the source into p (p is pinned memory,
// off a multiple of align); it is called once per span, in order, from this
// goroutine, while the previous span's DMA runs. put returns once the last
// span's copy is queued; the stager is not reused before its copies are done.
func (st *stager) put(dst *loader.Buffer, n, align int, s *loader.Stream, fill func(p []byte, off int)) error {
	if align <= 0 || align > stageChunkBytes {
		return fmt.Errorf("staged copy: row of %d bytes (want 1..%d)", align, stageChunkBytes)
	}
	if n > dst.Size() {
		return fmt.Errorf("staged copy: %d bytes into a buffer of %d", n, dst.Size())
	}
	for _, sp := range stageSpans(n, align, stageChunkBytes) {
		i := st.next
		st.next ^= 1
		if st.busy[i] {
			if err := st.done[i].Synchronize(); err != nil {
				st.failed = true
				return fmt.Errorf("staging copy: %w", err)
			}
			st.busy[i] = false
		}
		p := st.buf[i].Bytes()[:sp[1]]
		fill(p, sp[0])
		v, err := dst.View(sp[0], sp[1])
		if err != nil {
			return err
		}
		if err := v.CopyHtoDAsync(p, s); err != nil {
			st.failed = true
			return err
		}
		if err := st.done[i].Record(s); err != nil {
			// The copy is queued but no event tracks it: wait for the stream instead.
			st.failed = true
			return errors.Join(fmt.Errorf("staging event: %w", err), s.Synchronize())
		}
		st.busy[i] = true
	}
	return nil
}

// stagerPool keeps a device's idle stagers.
type stagerPool struct {
	mu   sync.Mutex
	ctx  *loader.Context
	idle []*stager
	made int // stagers made and not closed (idle or lent)
}

// get returns an idle stager or a new one.
func (p *stagerPool) get() (*stager, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		st := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return st, nil
	}
	st, err := newStager(p.ctx)
	if err == nil {
		p.made++
	}
	p.mu.Unlock()
	return st, err
}

// put waits for st's copies and keeps it for the next get; a stager whose
// copies failed (now or before) is closed instead.
func (p *stagerPool) put(st *stager) error {
	if err := st.wait(); err != nil || st.failed {
		p.mu.Lock()
		p.made-- // reserve may make another
		p.mu.Unlock()
		return errors.Join(err, st.close())
	}
	p.mu.Lock()
	p.idle = append(p.idle, st)
	p.mu.Unlock()
	return nil
}

// reserve makes idle stagers until the pool holds n in all (idle or lent),
// so that the first runs do not pin memory inside their timelines. A nil
// pool (a device the tests fake) reserves nothing.
func (p *stagerPool) reserve(n int) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.made < n {
		st, err := newStager(p.ctx)
		if err != nil {
			return err
		}
		p.idle = append(p.idle, st)
		p.made++
	}
	return nil
}

// close frees every idle stager (none in a nil pool).
func (p *stagerPool) close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	var errs []error
	for _, st := range idle {
		errs = append(errs, st.close())
	}
	return errors.Join(errs...)
}

// stager returns the run's stager, taking one from the pool (or making a
// private one without a pool) when the run holds none; dropStager (called
// once a run's uploads are queued, and by free) gives it back.
func (m *devMem) stager() (*stager, error) {
	if m.st != nil {
		return m.st, nil
	}
	var st *stager
	var err error
	if m.pool != nil {
		st, err = m.pool.get()
	} else {
		st, err = newStager(m.ctx)
	}
	if err != nil {
		return nil, err
	}
	m.st = st
	m.track("staging", m.dropStager)
	return st, nil
}

// dropStager waits for the run's staged copies and gives its stager back to
// the pool (or closes a private one); a no-op when the run holds none. A run
// that keeps its buffers (KeepDevice) thus does not keep pinned memory, and
// its backward takes a pooled stager again.
func (m *devMem) dropStager() error {
	st := m.st
	if st == nil {
		return nil
	}
	m.st = nil
	if m.pool != nil {
		return m.pool.put(st)
	}
	return errors.Join(st.wait(), st.close())
}

// bytesOf views a slice's elements as bytes.
func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// bf16sOf views bytes (an even count) as bf16 values.
func bf16sOf(p []byte) []bf16.BF16 {
	if len(p) < 2 {
		return nil
	}
	return unsafe.Slice((*bf16.BF16)(unsafe.Pointer(&p[0])), len(p)/2)
}

// fillParallel runs fn on the blocks [i, i+n) of total bytes, in parallel.
func fillParallel(total int, fn func(i, n int)) {
	nb := (total + stageFillBlock - 1) / stageFillBlock
	_ = parallel(nb, func(b int) error {
		i := b * stageFillBlock
		fn(i, min(stageFillBlock, total-i))
		return nil
	})
}

// copyFill is the fill of a stager's put for a plain source.
func copyFill(src []byte) func(p []byte, off int) {
	return func(p []byte, off int) {
		fillParallel(len(p), func(i, n int) { copy(p[i:i+n], src[off+i:off+i+n]) })
	}
}

// uploadDOut allocates the rank's dO buffer ([Tr, HV, 128] bf16) and fills
// it from dout ([T, HV, 128] float32, global order) through the run's
// stager, converting each chunk's rows straight into pinned memory
// (gatherDOutRows): no pageable bf16 copy of dO is made.
func uploadDOut(m *devMem, s *loader.Stream, p *Plan, rank int, dout []float32) (*loader.Buffer, error) {
	nv := p.Config.HV * p.Config.DV
	n := 2 * p.Ranks[rank].Tokens * nv
	b, err := m.alloc("dout", n)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return b, nil
	}
	st, err := m.stager()
	if err != nil {
		return nil, fmt.Errorf("upload dout: %w", err)
	}
	fill := func(pb []byte, off int) { gatherDOutRows(p, rank, dout, bf16sOf(pb), off/(2*nv)) }
	if err := st.put(b, n, 2*nv, s, fill); err != nil {
		return nil, fmt.Errorf("upload dout: %w", err)
	}
	return b, nil
}
