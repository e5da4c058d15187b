package comm

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeOps stands in for NCCL under an NCCLComm, recording what the communicator asked.
type fakeOps struct {
	mu              sync.Mutex
	st              NCCLResult
	finalizePending bool
	finalizeErr     error
	abortErr        error
	allGathers      []fakeAllGather
	aborts          int
	finalizes       int
	destroys        int
}

type fakeAllGather struct {
	send, recv uintptr
	count      int
	dt         NCCLDataType
}

func (f *fakeOps) allGather(send, recv uintptr, count int, dt NCCLDataType, _ uintptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allGathers = append(f.allGathers, fakeAllGather{send, recv, count, dt})
	return nil
}

func (f *fakeOps) state() (NCCLResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st, nil
}

func (f *fakeOps) setState(st NCCLResult) {
	f.mu.Lock()
	f.st = st
	f.mu.Unlock()
}

func (f *fakeOps) describe(rc NCCLResult) error {
	return &NCCLError{Call: "ncclCommGetAsyncError", Code: rc, Name: rc.String(), Message: rc.fallbackMessage()}
}

func (f *fakeOps) finalize() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.finalizes++
	return f.finalizePending, f.finalizeErr
}

func (f *fakeOps) abort() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aborts++
	return f.abortErr
}

func (f *fakeOps) destroy() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroys++
	return nil
}

// counts returns aborts, finalizes, destroys.
func (f *fakeOps) counts() [3]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return [3]int{f.aborts, f.finalizes, f.destroys}
}

// fakeComm is an NCCLComm over fake NCCL, without a GPU: no context, no stream.
func fakeComm(rank, size int, blocking bool) (*NCCLComm, *fakeOps) {
	ops := &fakeOps{}
	return &NCCLComm{Timeout: time.Second, ops: ops, rank: rank, size: size, blocking: blocking,
		abortCh: make(chan struct{})}, ops
}

// run issues one collective whose stream completes after doneAfter queries (never when negative).
func run(ctx context.Context, c *NCCLComm, op string, doneAfter int) error {
	n := 0
	done := func() (bool, error) {
		n++
		return doneAfter >= 0 && n > doneAfter, nil
	}
	return c.collective(ctx, op, done, func() error { return nil }, nil)
}

func TestNCCLCommCollectiveFaults(t *testing.T) {
	errEnqueue := &NCCLError{Call: "ncclAllGather", Code: NCCLInvalidUsage, Name: "ncclInvalidUsage", Message: "invalid usage"}
	tests := []struct {
		name    string
		setup   func(c *NCCLComm, ops *fakeOps) (context.Context, func() error)
		is      []error
		wantMsg string
	}{
		{
			name: "timeout",
			setup: func(c *NCCLComm, _ *fakeOps) (context.Context, func() error) {
				c.Timeout = 30 * time.Millisecond
				return context.Background(), nil
			},
			is: []error{ErrTimeout},
			wantMsg: "comm: rank 1: all-gather #2: timed out after 30ms (the default timeout; the context had no deadline) " +
				"(a peer may have failed, stopped, or not called this collective; NCCL communicator aborted)",
		},
		{
			name: "async error",
			setup: func(_ *NCCLComm, ops *fakeOps) (context.Context, func() error) {
				time.AfterFunc(10*time.Millisecond, func() { ops.setState(NCCLRemoteError) })
				return context.Background(), nil
			},
			wantMsg: "comm: rank 1: all-gather #2: ncclCommGetAsyncError: ncclRemoteError (6): remote process exited or there was a network error (NCCL communicator aborted)",
		},
		{
			name: "enqueue fails",
			setup: func(*NCCLComm, *fakeOps) (context.Context, func() error) {
				return context.Background(), func() error { return errEnqueue }
			},
			is:      []error{errEnqueue},
			wantMsg: "comm: rank 1: all-gather #2: ncclAllGather: ncclInvalidUsage (5): invalid usage (NCCL communicator aborted)",
		},
		{
			name: "context cancelled",
			setup: func(*NCCLComm, *fakeOps) (context.Context, func() error) {
				ctx, cancel := context.WithCancelCause(context.Background())
				time.AfterFunc(10*time.Millisecond, func() { cancel(errors.New("rank 0 failed")) })
				return ctx, nil
			},
			is:      []error{context.Canceled},
			wantMsg: "comm: rank 1: all-gather #2: context canceled (cause: rank 0 failed) (NCCL communicator aborted)",
		},
		{
			name: "context deadline",
			setup: func(*NCCLComm, *fakeOps) (context.Context, func() error) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				time.AfterFunc(time.Second, cancel)
				return ctx, nil
			},
			is: []error{ErrTimeout, context.DeadlineExceeded},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, ops := fakeComm(1, 2, false)
			require.NoError(t, run(t.Context(), c, "all-gather", 3), "a first collective completes")
			ctx, enqueue := tc.setup(c, ops)
			if enqueue == nil {
				enqueue = func() error { return nil }
			}
			start := time.Now()
			err := c.collective(ctx, "all-gather", func() (bool, error) { return false, nil }, enqueue, nil)
			require.Error(t, err)
			assert.Less(t, time.Since(start), 2*time.Second)
			for _, target := range tc.is {
				assert.ErrorIs(t, err, target)
			}
			if tc.wantMsg != "" {
				assert.EqualError(t, err, tc.wantMsg)
			}
			assert.Equal(t, [3]int{1, 0, 0}, ops.counts(), "ncclCommAbort once")

			// Every later collective names the abort.
			err = run(t.Context(), c, "barrier", 0)
			var ae *AbortError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, 1, ae.Rank)
			assert.Contains(t, err.Error(), "comm: rank 1: barrier #3: aborted by rank 1: all-gather #2: ")
			for _, target := range tc.is {
				assert.ErrorIs(t, err, target)
			}

			require.NoError(t, c.Close())
			assert.Equal(t, [3]int{1, 0, 0}, ops.counts(), "an aborted communicator is not destroyed")
			assert.ErrorIs(t, run(t.Context(), c, "barrier", 0), ErrClosed)
		})
	}
}

func TestNCCLCommAbort(t *testing.T) {
	t.Run("while waiting", func(t *testing.T) {
		c, ops := fakeComm(0, 2, false)
		errc := make(chan error, 1)
		go func() { errc <- run(context.Background(), c, "all-gather", -1) }()
		time.Sleep(20 * time.Millisecond)
		c.Abort(errors.New("operator said stop"))
		select {
		case err := <-errc:
			assert.EqualError(t, err, "comm: rank 0: all-gather #1: aborted by rank 0: operator said stop")
		case <-time.After(2 * time.Second):
			t.Fatal("the waiting collective did not return after Abort")
		}
		assert.Equal(t, [3]int{1, 0, 0}, ops.counts())
		c.Abort(errors.New("again")) // only the first counts
		assert.Equal(t, [3]int{1, 0, 0}, ops.counts())
		require.NoError(t, c.Close())
	})
	t.Run("while idle, without a reason", func(t *testing.T) {
		c, ops := fakeComm(3, 4, true)
		c.Abort(nil)
		assert.Equal(t, [3]int{1, 0, 0}, ops.counts(), "released at once")
		assert.EqualError(t, run(t.Context(), c, "barrier", 0), "comm: rank 3: barrier #1: aborted by rank 3: Abort called without a reason")
		require.NoError(t, c.Close())
		assert.Equal(t, [3]int{1, 0, 0}, ops.counts())
	})
	t.Run("ncclCommAbort failing is reported by Close", func(t *testing.T) {
		c, ops := fakeComm(0, 1, true)
		ops.abortErr = errors.New("ncclCommAbort: ncclInternalError (3): internal error")
		c.Abort(errors.New("stop"))
		assert.EqualError(t, c.Close(), "comm: rank 0: ncclCommAbort: ncclInternalError (3): internal error")
		assert.NoError(t, c.Close(), "idempotent")
	})
}

func TestNCCLCommClose(t *testing.T) {
	t.Run("blocking: destroy", func(t *testing.T) {
		c, ops := fakeComm(0, 2, true)
		require.NoError(t, run(t.Context(), c, "all-gather", 0))
		require.NoError(t, c.Close())
		assert.Equal(t, [3]int{0, 0, 1}, ops.counts())
		require.NoError(t, c.Close())
		assert.Equal(t, [3]int{0, 0, 1}, ops.counts())
		assert.EqualError(t, run(t.Context(), c, "all-gather", 0), "comm: rank 0: all-gather: communicator closed")
		c.Abort(errors.New("late")) // after Close: nothing left to release
		assert.Equal(t, [3]int{0, 0, 1}, ops.counts())
	})
	t.Run("non-blocking: finalize, wait, destroy", func(t *testing.T) {
		c, ops := fakeComm(0, 2, false)
		ops.finalizePending = true
		ops.setState(NCCLInProgress)
		time.AfterFunc(10*time.Millisecond, func() { ops.setState(NCCLSuccess) })
		require.NoError(t, c.Close())
		assert.Equal(t, [3]int{0, 1, 1}, ops.counts())
	})
	t.Run("non-blocking: finalize times out, abort instead", func(t *testing.T) {
		c, ops := fakeComm(1, 2, false)
		c.Timeout = 20 * time.Millisecond
		ops.finalizePending = true
		ops.setState(NCCLInProgress)
		err := c.Close()
		require.ErrorIs(t, err, ErrTimeout)
		assert.Contains(t, err.Error(), "comm: rank 1: finalizing the NCCL communicator: timed out after 20ms")
		assert.Contains(t, err.Error(), "(aborted it instead)")
		assert.Equal(t, [3]int{1, 1, 0}, ops.counts())
	})
	t.Run("while a collective waits", func(t *testing.T) {
		c, ops := fakeComm(0, 2, false)
		errc := make(chan error, 1)
		go func() { errc <- run(context.Background(), c, "all-gather", -1) }()
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, c.Close())
		err := <-errc
		assert.ErrorIs(t, err, ErrClosed)
		assert.EqualError(t, err, "comm: rank 0: all-gather #1: aborted by rank 0: communicator closed")
		assert.Equal(t, [3]int{1, 0, 0}, ops.counts(), "aborted, not destroyed, under a running collective")
	})
}

func TestNCCLLocalGroupSharesAborts(t *testing.T) {
	newGroup := func() ([]*NCCLComm, []*fakeOps) {
		c0, o0 := fakeComm(0, 2, false)
		c1, o1 := fakeComm(1, 2, false)
		g := &ncclLocalGroup{comms: []*NCCLComm{c0, c1}}
		c0.group, c1.group = g, g
		return []*NCCLComm{c0, c1}, []*fakeOps{o0, o1}
	}

	t.Run("a failed collective aborts the peer that waits", func(t *testing.T) {
		comms, ops := newGroup()
		comms[0].Timeout = 30 * time.Millisecond
		comms[1].Timeout = time.Hour
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for r, c := range comms {
			wg.Go(func() { errs[r] = run(context.Background(), c, "all-gather", -1) })
		}
		wg.Wait()
		require.ErrorIs(t, errs[0], ErrTimeout)
		assert.Contains(t, errs[0].Error(), "comm: rank 0: all-gather #1: timed out after 30ms")
		var ae *AbortError
		require.ErrorAs(t, errs[1], &ae)
		assert.Equal(t, 0, ae.Rank)
		assert.ErrorIs(t, errs[1], ErrTimeout)
		assert.Contains(t, errs[1].Error(), "comm: rank 1: all-gather #1: aborted by rank 0: all-gather #1: timed out")
		for r := range ops {
			assert.Equal(t, [3]int{1, 0, 0}, ops[r].counts(), "rank %d", r)
			require.NoError(t, comms[r].Close())
		}
	})
	t.Run("Abort reaches idle peers", func(t *testing.T) {
		comms, ops := newGroup()
		comms[1].Abort(errors.New("rank 1's forward failed"))
		err := run(t.Context(), comms[0], "barrier", 0)
		assert.EqualError(t, err, "comm: rank 0: barrier #1: aborted by rank 1: rank 1's forward failed")
		assert.Equal(t, [3]int{1, 0, 0}, ops[0].counts())
		assert.Equal(t, [3]int{1, 0, 0}, ops[1].counts())
	})
	t.Run("closing a healthy rank leaves its peers alone", func(t *testing.T) {
		comms, ops := newGroup()
		require.NoError(t, comms[0].Close())
		require.NoError(t, run(t.Context(), comms[1], "barrier", 0))
		require.NoError(t, comms[1].Close())
		assert.Equal(t, [3]int{0, 1, 1}, ops[0].counts())
		assert.Equal(t, [3]int{0, 1, 1}, ops[1].counts())
	})
}

func TestNCCLCommHostArguments(t *testing.T) {
	c, ops := fakeComm(1, 3, true)
	// Zero bytes: no NCCL call, but a collective of the sequence.
	require.NoError(t, c.AllGather(t.Context(), nil, nil))
	require.NoError(t, c.AllGather(t.Context(), []byte{}, []byte{}))
	assert.Empty(t, ops.allGathers)
	assert.Equal(t, uint64(2), c.seq)

	// A recv of the wrong length is this rank's error; the peers cannot be told, so it aborts.
	err := c.AllGather(t.Context(), make([]byte, 4), make([]byte, 8))
	require.ErrorIs(t, err, ErrMismatch)
	assert.EqualError(t, err, "comm: rank 1: all-gather #3: collective arguments do not match across ranks: "+
		"recv of 8 bytes, want 12 bytes (3 ranks x 4 bytes) (NCCL communicator aborted)")
	assert.Equal(t, [3]int{1, 0, 0}, ops.counts())
}

func TestNCCLCommEnqueueUnits(t *testing.T) {
	tests := []struct {
		n     int
		count int
		dt    NCCLDataType
	}{
		{12, 3, NCCLFloat32},
		{4, 1, NCCLFloat32},
		{13, 13, NCCLUint8},
		{1, 1, NCCLUint8},
		{6, 6, NCCLUint8},
	}
	for _, tc := range tests {
		c, ops := fakeComm(0, 2, true)
		require.NoError(t, c.enqueueAllGather(0x100, 0x200, tc.n, nil))
		require.Len(t, ops.allGathers, 1)
		assert.Equal(t, fakeAllGather{0x100, 0x200, tc.count, tc.dt}, ops.allGathers[0], "%d bytes", tc.n)
	}
	c, ops := fakeComm(0, 2, true)
	require.NoError(t, c.enqueueAllGather(0x100, 0x200, 0, nil))
	assert.Empty(t, ops.allGathers)
}

func TestNCCLCommOneGoroutine(t *testing.T) {
	c, _ := fakeComm(0, 2, true)
	release := make(chan struct{})
	done := func() (bool, error) {
		select {
		case <-release:
			return true, nil
		default:
			return false, nil
		}
	}
	errc := make(chan error, 1)
	go func() {
		errc <- c.collective(context.Background(), "all-gather", done, func() error { return nil }, nil)
	}()
	time.Sleep(10 * time.Millisecond)
	err := run(t.Context(), c, "barrier", 0)
	assert.EqualError(t, err, "comm: rank 0: barrier: called while another collective of this rank is in progress (use a communicator from one goroutine)")
	close(release)
	require.NoError(t, <-errc)
	require.NoError(t, run(t.Context(), c, "barrier", 0))
	assert.Equal(t, uint64(2), c.seq, "the refused call took no sequence number")
	assert.Equal(t, 0, c.Rank())
	assert.Equal(t, 2, c.Size())
	assert.True(t, c.Blocking())
	c.Timeout = 0
	assert.Equal(t, DefaultNCCLTimeout, c.timeout())
}
