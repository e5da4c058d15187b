package comm

// NCCLComm: one rank of an NCCL communicator, on one GPU. The control logic (sequence numbers, waiting,
// timeouts, abort and close) is tested on the CPU with a fake in place of NCCL and the driver
// (nccl_comm_test.go); nccl_gpu_test.go runs it on real NCCL and GPUs (it skips without them).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gdnkcp/gdnkcp/loader"
)

// DefaultNCCLTimeout bounds NCCL init and every collective whose context has no deadline, unless
// [NCCLOptions.Timeout] or [NCCLComm.Timeout] says otherwise. The first collective of a communicator
// also sets up its connections, so the bound is generous.
const DefaultNCCLTimeout = 5 * time.Minute

// NCCLOptions tunes [NewNCCLCommWith] and [NewLocalNCCLWith]. The zero value is the default.
type NCCLOptions struct {
	// Timeout bounds init and then, as [NCCLComm.Timeout], every collective whose context has no
	// deadline. 0 means DefaultNCCLTimeout.
	Timeout time.Duration
	// Blocking asks for an NCCL communicator in blocking mode (ncclCommInitRank). Its calls may block
	// inside NCCL, where no timeout reaches them: init until every rank has joined, the first
	// collectives while connections are made. The default is non-blocking mode
	// (ncclCommInitRankConfig with blocking = 0): every NCCL call returns at once and this package waits
	// on ncclCommGetAsyncError with the timeout, so a rank that never joins ends in an error, not a
	// hang. Libraries without ncclCommInitRankConfig (NCCL < 2.14) always get blocking mode.
	Blocking bool
}

// NCCLComm is one rank of an NCCL communicator, bound to one GPU's primary context. It implements
// [Communicator] on host bytes (staged through device buffers, on the communicator's own stream), so
// code written for the loopback runs on it unchanged, and adds [NCCLComm.AllGatherDevice] for device
// buffers. Like every Communicator it is used by one goroutine at a time; Abort may come from any.
//
// Every collective is enqueued, then waited for by polling the stream (cuStreamQuery) and
// ncclCommGetAsyncError with a short sleep. When it fails asynchronously, its context ends, or it has
// not completed after Timeout (when its context has no deadline), the rank aborts its communicator
// (ncclCommAbort) and returns an error naming the rank, the collective, its sequence number and the
// cause; every later collective returns an [*AbortError]. Ranks in other processes cannot be told:
// they see the failure as their own timeout or an NCCL remote error, and abort in turn. Ranks made
// together by [NewLocalNCCL] share aborts as the loopback does: an abort or a failed collective on one
// aborts the others at once, interrupting collectives they are waiting in.
//
// Its control logic (sequence numbers, waiting, timeouts, abort, close) is tested on the CPU with a fake
// in place of NCCL and the driver; init (blocking and non-blocking), the host and device all-gathers,
// Barrier, the abort on a timeout and Close ran on NCCL 2.28.3 with two H200s (nccl_gpu_test.go).
type NCCLComm struct {
	// Timeout bounds each collective whose context has no deadline (a context's deadline always wins).
	// 0 or less means DefaultNCCLTimeout. Set it before use, not while a collective runs.
	Timeout time.Duration

	ops      ncclOps
	ctx      *loader.Context
	stream   *loader.Stream // the communicator's own stream (nil in CPU tests)
	rank     int
	size     int
	blocking bool
	cfg      *ncclConfig     // kept reachable while the communicator lives
	group    *ncclLocalGroup // ranks made together in this process, or nil

	busy      atomic.Bool
	seq       uint64         // sequence number of the last collective; guarded by busy
	sendStage *loader.Buffer // host AllGather staging, grown on demand; guarded by busy
	recvStage *loader.Buffer

	mu         sync.Mutex
	closed     bool
	abortErr   *AbortError   // set once, with abortCh closed
	abortCh    chan struct{} // closed on abort: a waiting collective stops
	idle       chan struct{} // non-nil while a collective is in flight; closed when it ends
	released   bool          // the NCCL communicator was aborted or destroyed
	releaseErr error         // what ncclCommAbort said when an abort released it outside a collective
}

var _ Communicator = (*NCCLComm)(nil)

// ncclOps is what NCCLComm asks of NCCL; the real one is ncclHandle, tests use a fake.
type ncclOps interface {
	// allGather enqueues ncclAllGather of count elements of dt on stream.
	allGather(send, recv uintptr, count int, dt NCCLDataType, stream uintptr) error
	// state is ncclCommGetAsyncError.
	state() (NCCLResult, error)
	// describe turns a failing state into an error.
	describe(NCCLResult) error
	// finalize is ncclCommFinalize; pending reports ncclInProgress (wait on state).
	finalize() (pending bool, err error)
	// abort is ncclCommAbort.
	abort() error
	// destroy is ncclCommDestroy.
	destroy() error
}

// ncclHandle is an ncclComm_t with the API and the CUDA context its calls run under.
type ncclHandle struct {
	api  *ncclAPI
	ctx  *loader.Context
	comm uintptr
}

func (h *ncclHandle) allGather(send, recv uintptr, count int, dt NCCLDataType, stream uintptr) error {
	return h.ctx.Do(func() error { return h.api.allGatherRaw(send, recv, count, dt, h.comm, stream) })
}

func (h *ncclHandle) state() (st NCCLResult, err error) {
	err = h.ctx.Do(func() error {
		var e error
		st, e = h.api.asyncState(h.comm)
		return e
	})
	return st, err
}

func (h *ncclHandle) describe(rc NCCLResult) error {
	return h.api.newError("ncclCommGetAsyncError", rc, h.comm)
}

func (h *ncclHandle) finalize() (pending bool, err error) {
	if _, ferr := h.api.commFinalize.Get(h.api.lib); ferr != nil {
		return false, nil // NCCL < 2.14: ncclCommDestroy finalizes itself
	}
	err = h.ctx.Do(func() error {
		rc, e := h.api.commCall(&h.api.commFinalize, h.comm)
		pending = rc == NCCLInProgress
		return e
	})
	return pending, err
}

// abort calls ncclCommAbort. A non-blocking communicator may answer ncclInProgress; the communicator is
// being torn down then and is not waited on (its state may no longer be asked).
func (h *ncclHandle) abort() error {
	return h.ctx.Do(func() error {
		_, err := h.api.commCall(&h.api.commAbort, h.comm)
		return err
	})
}

func (h *ncclHandle) destroy() error {
	return h.ctx.Do(func() error {
		_, err := h.api.commCall(&h.api.commDestroy, h.comm)
		return err
	})
}

// ncclLocalGroup links the ranks of one NewLocalNCCL call so that they share aborts.
type ncclLocalGroup struct {
	comms []*NCCLComm
}

// abortPeers aborts every rank of the group but rank by, with an abort naming by.
func (g *ncclLocalGroup) abortPeers(by int, err error) {
	if g == nil {
		return
	}
	for _, p := range g.comms {
		if p != nil && p.rank != by {
			p.abortFrom(by, err)
		}
	}
}

// NewNCCLComm makes this process's rank of an nranks-rank NCCL communicator on ctx's GPU, with the
// default options: non-blocking mode, init bounded by DefaultNCCLTimeout. Every rank passes the same id
// (made by one of them with [NewUniqueID], or by each from NCCL_COMM_ID: [NewNCCLCommFromEnv]).
// Init runs under ctx.Do, so ctx is current on the locked OS thread that calls NCCL, and returns once
// every rank has joined. It sets NCCL_NVLS_ENABLE=0 when unset ([EnsureNVLSOff]). Without NCCL the
// error wraps [ErrNoNCCL].
func NewNCCLComm(ctx *loader.Context, id UniqueID, nranks, rank int) (*NCCLComm, error) {
	return NewNCCLCommWith(ctx, id, nranks, rank, NCCLOptions{})
}

// NewNCCLCommWith is [NewNCCLComm] with options.
func NewNCCLCommWith(ctx *loader.Context, id UniqueID, nranks, rank int, opts NCCLOptions) (*NCCLComm, error) {
	return newNCCLComm(context.Background(), ncclLib, ctx, id, nranks, rank, opts)
}

// newNCCLComm makes one rank; initCtx ending aborts a non-blocking init that is still waiting.
func newNCCLComm(initCtx context.Context, api *ncclAPI, lctx *loader.Context, id UniqueID, nranks, rank int,
	opts NCCLOptions) (*NCCLComm, error) {
	where := fmt.Sprintf("comm: NCCL rank %d of %d", rank, nranks)
	switch {
	case nranks < 1:
		return nil, fmt.Errorf("%s: want at least 1 rank", where)
	case rank < 0 || rank >= nranks:
		return nil, fmt.Errorf("%s: rank outside [0, %d)", where, nranks)
	case lctx == nil:
		return nil, fmt.Errorf("%s: nil CUDA context", where)
	case id.IsZero():
		return nil, fmt.Errorf("%s: the unique id is all zero: make it with NewUniqueID on one rank and pass it to all, or parse the one that rank printed", where)
	case opts.Timeout < 0:
		return nil, fmt.Errorf("%s: negative timeout %v", where, opts.Timeout)
	}
	if err := api.ready(); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	where = fmt.Sprintf("%s (device %d)", where, lctx.Device().Ordinal)
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultNCCLTimeout
	}
	blocking := opts.Blocking || !api.hasConfigInit()
	var cfg *ncclConfig
	if !blocking {
		cfg = newNCCLConfig(false)
	}
	stream, err := lctx.NewStream(loader.StreamNonBlocking)
	if err != nil {
		return nil, fmt.Errorf("%s: stream: %w", where, err)
	}
	var handle uintptr
	err = lctx.Do(func() error {
		var e error
		handle, e = api.initRank(nranks, rank, id, cfg)
		return e
	})
	h := &ncclHandle{api: api, ctx: lctx, comm: handle}
	if err == nil && !blocking {
		// NCCL set up the communicator; a failure from here on leaves one to abort.
		err = waitNCCL(initCtx, poller{state: h.state, describe: h.describe}, timeout, nil)
		if err != nil {
			if errors.Is(err, ErrTimeout) {
				err = fmt.Errorf("%w: not every rank joined; check that all %d ranks run, with the same unique id (or NCCL_COMM_ID) and world size", err, nranks)
			}
			err = errors.Join(err, h.abortWrapped())
		}
	}
	if err != nil {
		// A call that failed at once is not aborted: NCCL has released (or never made) the
		// communicator then, and aborting a freed one would be worse than a leak.
		return nil, errors.Join(fmt.Errorf("%s: init: %w", where, err), stream.Close())
	}
	return &NCCLComm{
		Timeout:  timeout,
		ops:      h,
		ctx:      lctx,
		stream:   stream,
		rank:     rank,
		size:     nranks,
		blocking: blocking,
		cfg:      cfg,
		abortCh:  make(chan struct{}),
	}, nil
}

// abortWrapped is abort with the call named, or nil.
func (h *ncclHandle) abortWrapped() error {
	if err := h.abort(); err != nil {
		return fmt.Errorf("and aborting the half-made communicator failed: %w", err)
	}
	return nil
}

// NewLocalNCCL makes one NCCL communicator over the GPUs of ctxs, all driven by this process: rank r
// runs on ctxs[r], which must be distinct devices (NCCL takes one GPU per rank; use the loopback for
// more ranks than GPUs). It makes the unique id itself and initialises every rank concurrently, each
// on its own goroutine and locked OS thread with its context current, since NCCL init waits for all
// ranks. When one rank fails the others are aborted and the error names each failed rank. The ranks
// share aborts (see [NCCLComm]). Default options; see [NewLocalNCCLWith].
func NewLocalNCCL(ctxs []*loader.Context) ([]*NCCLComm, error) {
	return NewLocalNCCLWith(ctxs, NCCLOptions{})
}

// NewLocalNCCLWith is [NewLocalNCCL] with options.
func NewLocalNCCLWith(ctxs []*loader.Context, opts NCCLOptions) ([]*NCCLComm, error) {
	if len(ctxs) == 0 {
		return nil, errors.New("comm: NewLocalNCCL: no contexts")
	}
	seen := map[int]int{}
	for r, c := range ctxs {
		if c == nil {
			return nil, fmt.Errorf("comm: NewLocalNCCL: context %d is nil", r)
		}
		dev := c.Device().Ordinal
		if prev, ok := seen[dev]; ok {
			return nil, fmt.Errorf("comm: NewLocalNCCL: ranks %d and %d are both on device %d: NCCL takes one GPU per rank (use the loopback for more ranks than GPUs)", prev, r, dev)
		}
		seen[dev] = r
	}
	id, err := NewUniqueID()
	if err != nil {
		return nil, err
	}
	initCtx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	comms := make([]*NCCLComm, len(ctxs))
	errs := make([]error, len(ctxs))
	var wg sync.WaitGroup
	for r, lctx := range ctxs {
		wg.Go(func() {
			c, err := newNCCLComm(initCtx, ncclLib, lctx, id, len(ctxs), r, opts)
			if err != nil {
				errs[r] = err
				cancel(fmt.Errorf("rank %d failed to initialise", r))
				return
			}
			comms[r] = c
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				c.Abort(errors.New("another rank failed to initialise"))
				err = errors.Join(err, c.Close())
			}
		}
		return nil, err
	}
	g := &ncclLocalGroup{comms: comms}
	for _, c := range comms {
		c.group = g
	}
	return comms, nil
}

// errNilNCCL is what the collectives of a nil *NCCLComm return.
var errNilNCCL = errors.New("comm: nil NCCL communicator")

// Rank returns this rank's index in the communicator.
func (c *NCCLComm) Rank() int {
	if c == nil {
		return 0
	}
	return c.rank
}

// Size returns the number of ranks.
func (c *NCCLComm) Size() int {
	if c == nil {
		return 0
	}
	return c.size
}

// Context returns the CUDA context the communicator runs in.
func (c *NCCLComm) Context() *loader.Context {
	if c == nil {
		return nil
	}
	return c.ctx
}

// Stream returns the communicator's own stream, which AllGather, Barrier and AllGatherDevice with a nil
// stream use.
func (c *NCCLComm) Stream() *loader.Stream {
	if c == nil {
		return nil
	}
	return c.stream
}

// Blocking reports whether the NCCL communicator is in blocking mode (see [NCCLOptions.Blocking]).
func (c *NCCLComm) Blocking() bool { return c != nil && c.blocking }

// timeout is the bound for a collective whose context has no deadline.
func (c *NCCLComm) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultNCCLTimeout
	}
	return c.Timeout
}

// AllGatherDevice all-gathers device memory: every rank's send (the same size on every rank) lands in
// recv in rank order, recv[r*n:(r+1)*n] = rank r's send, n = send.Size(). It enqueues ncclAllGather on
// stream (nil: the communicator's own) and waits until all work on that stream has completed, with the
// fault handling of [NCCLComm]. recv must be at least Size()*n bytes; send may be this rank's slot of
// recv (in place) but may not overlap it otherwise. Both buffers and the stream must belong to the
// communicator's context. The count is in ncclFloat32 elements when n is a multiple of 4, else in
// ncclUint8: an all-gather copies bits, so the type only sets the unit. A zero-byte send calls no NCCL
// function (every rank passes the same size, so all skip alike) but still counts in the sequence.
func (c *NCCLComm) AllGatherDevice(ctx context.Context, send, recv *loader.Buffer, stream *loader.Stream) error {
	if c == nil {
		return errNilNCCL
	}
	if stream == nil {
		stream = c.stream
	}
	return c.collective(ctx, "all-gather", streamDone(stream), func() error {
		if err := c.checkDeviceArgs(send, recv, stream); err != nil {
			return err
		}
		return c.enqueueAllGather(send.Ptr(), recv.Ptr(), send.Size(), stream)
	}, nil)
}

// streamDone polls s, or reports done at once for a nil stream (CPU tests).
func streamDone(s *loader.Stream) func() (bool, error) {
	if s == nil {
		return func() (bool, error) { return true, nil }
	}
	return s.Query
}

// checkDeviceArgs validates AllGatherDevice's arguments.
func (c *NCCLComm) checkDeviceArgs(send, recv *loader.Buffer, stream *loader.Stream) error {
	if send == nil || recv == nil || stream == nil {
		return errors.New("nil device buffer or stream")
	}
	for _, x := range []struct {
		what string
		ctx  *loader.Context
	}{{"send buffer", send.Context()}, {"recv buffer", recv.Context()}, {"stream", stream.Context()}} {
		if x.ctx == nil || x.ctx.Handle() != c.ctx.Handle() {
			return fmt.Errorf("the %s belongs to another context than the communicator's (device %d)", x.what, c.ctx.Device().Ordinal)
		}
	}
	n := send.Size()
	if recv.Size() < c.size*n {
		return fmt.Errorf("%w: recv of %s, want at least %s (%d ranks x %s)", ErrMismatch,
			plural(recv.Size(), "byte"), plural(c.size*n, "byte"), c.size, plural(n, "byte"))
	}
	s, r := send.Ptr(), recv.Ptr()
	if n > 0 && s < r+uintptr(c.size*n) && r < s+uintptr(n) && s != r+uintptr(c.rank*n) {
		return fmt.Errorf("%w: send overlaps recv but is not this rank's slot (rank %d, offset %d bytes)",
			ErrMismatch, c.rank, c.rank*n)
	}
	return nil
}

// enqueueAllGather enqueues the all-gather of n bytes per rank.
func (c *NCCLComm) enqueueAllGather(send, recv uintptr, n int, stream *loader.Stream) error {
	if n == 0 {
		return nil
	}
	dt, count := NCCLUint8, n
	if n%4 == 0 {
		dt, count = NCCLFloat32, n/4
	}
	var sh uintptr
	if stream != nil {
		sh = stream.Handle()
	}
	return c.ops.allGather(send, recv, count, dt, sh)
}

// AllGather implements [Communicator.AllGather] on host bytes: send is copied to a device staging
// buffer, all-gathered with ncclAllGather on the communicator's stream, and copied back into recv.
// len(recv) must be Size()*len(send); a wrong length is a local error that wraps [ErrMismatch] and, as
// the other ranks cannot be told, aborts this rank's communicator.
func (c *NCCLComm) AllGather(ctx context.Context, send, recv []byte) error {
	if c == nil {
		return errNilNCCL
	}
	return c.hostAllGather(ctx, "all-gather", send, recv)
}

// Barrier implements [Communicator.Barrier] as an all-gather of one byte per rank.
func (c *NCCLComm) Barrier(ctx context.Context) error {
	if c == nil {
		return errNilNCCL
	}
	return c.hostAllGather(ctx, "barrier", []byte{1}, make([]byte, c.size))
}

// hostAllGather stages host bytes through device memory.
func (c *NCCLComm) hostAllGather(ctx context.Context, op string, send, recv []byte) error {
	n := len(send)
	return c.collective(ctx, op, streamDone(c.stream), func() error {
		if len(recv) != c.size*n {
			return fmt.Errorf("%w: recv of %s, want %s (%d ranks x %s)", ErrMismatch,
				plural(len(recv), "byte"), plural(c.size*n, "byte"), c.size, plural(n, "byte"))
		}
		if n == 0 {
			return nil
		}
		if err := c.stage(n); err != nil {
			return err
		}
		if err := c.sendStage.CopyHtoDAsync(send, c.stream); err != nil {
			return err
		}
		return c.enqueueAllGather(c.sendStage.Ptr(), c.recvStage.Ptr(), n, c.stream)
	}, func() error {
		if n == 0 {
			return nil
		}
		return c.recvStage.CopyDtoHAsync(recv, c.stream) // into Go memory: returns when complete
	})
}

// stage makes sure the staging buffers hold n bytes per rank.
func (c *NCCLComm) stage(n int) error {
	if c.sendStage != nil && c.sendStage.Size() >= n {
		return nil
	}
	if err := c.freeStage(); err != nil {
		return err
	}
	var err error
	if c.sendStage, err = c.ctx.Alloc(n); err != nil {
		return fmt.Errorf("staging buffer: %w", err)
	}
	if c.recvStage, err = c.ctx.Alloc(c.size * n); err != nil {
		return fmt.Errorf("staging buffer: %w", err)
	}
	return nil
}

// freeStage frees the staging buffers.
func (c *NCCLComm) freeStage() error {
	var errs []error
	for _, b := range []**loader.Buffer{&c.sendStage, &c.recvStage} {
		if *b != nil {
			errs = append(errs, (*b).Free())
			*b = nil
		}
	}
	return errors.Join(errs...)
}

// collective runs one collective: it takes the next sequence number, runs enqueue (which validates
// and enqueues), waits for done with the fault handling described on NCCLComm, then runs after (copies
// back). Any failure aborts the communicator (the ranks' sequences no longer match) and is returned
// as "comm: rank R: OP #SEQ: cause".
func (c *NCCLComm) collective(ctx context.Context, op string, done func() (bool, error), enqueue, after func() error) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("comm: rank %d: %s: called while another collective of this rank is in progress (use a communicator from one goroutine)", c.rank, op)
	}
	defer c.busy.Store(false)

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("comm: rank %d: %s: %w", c.rank, op, ErrClosed)
	}
	c.seq++
	seq := c.seq
	if c.abortErr != nil {
		err := c.abortErr
		c.mu.Unlock()
		return fmt.Errorf("comm: rank %d: %s #%d: %w", c.rank, op, seq, err)
	}
	c.idle = make(chan struct{})
	c.mu.Unlock()

	err := enqueue()
	if err == nil {
		err = waitNCCL(ctx, poller{state: c.ops.state, describe: c.ops.describe, done: done}, c.timeout(), c.abortCh)
	}
	if err == nil && after != nil {
		err = after()
	}
	return c.finish(op, seq, err)
}

// finish ends the in-flight collective: on failure it records the abort (unless one was requested),
// shares it with local peers and releases the NCCL communicator with ncclCommAbort; an abort requested
// while the collective ran is released here too.
func (c *NCCLComm) finish(op string, seq uint64, err error) error {
	c.mu.Lock()
	close(c.idle)
	c.idle = nil
	recorded := false
	if err != nil && c.abortErr == nil {
		c.recordAbortLocked(c.rank, fmt.Errorf("%s #%d: %w", op, seq, err))
		recorded = true
	}
	release := c.abortErr != nil && !c.released
	if release {
		c.released = true
	}
	abortErr := c.abortErr
	c.mu.Unlock()

	if recorded {
		c.group.abortPeers(c.rank, abortErr.Err)
	}
	var relErr error
	if release {
		relErr = c.ops.abort()
	}
	switch {
	case err == nil:
		if relErr != nil {
			c.keepReleaseErr(relErr)
		}
		return nil // the collective completed; the abort applies from the next one
	case errors.Is(err, errAbortRequested):
		if relErr != nil {
			c.keepReleaseErr(relErr)
		}
		return fmt.Errorf("comm: rank %d: %s #%d: %w", c.rank, op, seq, abortErr)
	}
	how := "NCCL communicator aborted"
	if errors.Is(err, ErrTimeout) {
		how = "a peer may have failed, stopped, or not called this collective; NCCL communicator aborted"
	}
	if relErr != nil {
		how = fmt.Sprintf("aborting the NCCL communicator failed too: %v", relErr)
	}
	return fmt.Errorf("comm: rank %d: %s #%d: %w (%s)", c.rank, op, seq, err, how)
}

// recordAbortLocked records the first abort. c.mu is held.
func (c *NCCLComm) recordAbortLocked(by int, err error) {
	c.abortErr = &AbortError{Rank: by, Err: err}
	close(c.abortCh)
}

// keepReleaseErr keeps an ncclCommAbort error for Close to return.
func (c *NCCLComm) keepReleaseErr(err error) {
	c.mu.Lock()
	c.releaseErr = errors.Join(c.releaseErr, fmt.Errorf("comm: rank %d: %w", c.rank, err))
	c.mu.Unlock()
}

// Abort implements [Communicator.Abort]: it records the abort (the first one only), makes a collective
// this rank is waiting in return at once, releases the NCCL communicator with ncclCommAbort (now, or
// when that collective returns), and aborts the other ranks of a [NewLocalNCCL] group the same way.
// It does not wait for peers; ncclCommAbort itself is local but not instantaneous.
func (c *NCCLComm) Abort(err error) {
	if c == nil {
		return
	}
	if err == nil {
		err = errNoReason
	}
	if c.abortFrom(c.rank, err) {
		c.group.abortPeers(c.rank, err)
	}
}

// abortFrom records an abort by rank by unless one is recorded, and releases the NCCL communicator now
// unless a collective is in flight (which releases it when it returns). It reports whether it recorded.
func (c *NCCLComm) abortFrom(by int, err error) bool {
	c.mu.Lock()
	if c.abortErr != nil {
		c.mu.Unlock()
		return false
	}
	c.recordAbortLocked(by, err)
	release := c.idle == nil && !c.released
	if release {
		c.released = true
	}
	c.mu.Unlock()
	if release {
		if rerr := c.ops.abort(); rerr != nil {
			c.keepReleaseErr(rerr)
		}
	}
	return true
}

// Close implements [Communicator.Close]: it releases the NCCL communicator (a healthy non-blocking one
// with ncclCommFinalize, waited on with the timeout, then ncclCommDestroy; a blocking one with
// ncclCommDestroy; an aborted one was released by the abort), the staging buffers and the stream, and
// returns the errors met, ncclCommAbort's of an earlier abort included. Later collectives return
// [ErrClosed]. Unlike the loopback, closing a healthy rank does not abort its peers: NCCL cannot tell
// ranks in other processes, and aborting local peers could cut short a collective they are finishing.
// A collective in flight on another goroutine is aborted and waited for. Idempotent.
func (c *NCCLComm) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	idle := c.idle
	destroy := c.abortErr == nil && idle == nil && !c.released
	if c.abortErr == nil {
		c.recordAbortLocked(c.rank, ErrClosed)
	}
	if destroy {
		c.released = true
	}
	c.mu.Unlock()
	if idle != nil {
		<-idle // the collective sees abortCh, returns and releases the communicator
	}
	var errs []error
	if destroy {
		errs = append(errs, c.finalizeAndDestroy())
	}
	c.mu.Lock()
	errs = append(errs, c.releaseErr)
	c.releaseErr = nil
	c.mu.Unlock()
	errs = append(errs, c.freeStage())
	if c.stream != nil {
		errs = append(errs, c.stream.Close())
	}
	return errors.Join(errs...)
}

// finalizeAndDestroy releases a healthy NCCL communicator; when finalizing fails it aborts instead.
func (c *NCCLComm) finalizeAndDestroy() error {
	if !c.blocking {
		pending, err := c.ops.finalize()
		if err == nil && pending {
			err = waitNCCL(context.Background(), poller{state: c.ops.state, describe: c.ops.describe}, c.timeout(), nil)
		}
		if err != nil {
			aerr := c.ops.abort()
			if aerr != nil {
				aerr = fmt.Errorf("ncclCommAbort: %w", aerr)
			}
			return fmt.Errorf("comm: rank %d: finalizing the NCCL communicator: %w (aborted it instead)", c.rank, errors.Join(err, aerr))
		}
	}
	if err := c.ops.destroy(); err != nil {
		return fmt.Errorf("comm: rank %d: %w", c.rank, err)
	}
	return nil
}
