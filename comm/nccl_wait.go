package comm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// errAbortRequested is what a wait returns when [NCCLComm.Abort] (or an abort of a local peer) asked it
// to stop; the communicator's recorded abort is then the error the caller sees.
var errAbortRequested = errors.New("abort requested")

// poller is what waiting on an enqueued NCCL operation needs to know; the real one asks NCCL and the
// CUDA driver, tests fake it.
type poller struct {
	// state is ncclCommGetAsyncError: ncclSuccess once NCCL has enqueued everything (always, for a
	// blocking communicator, unless an error happened), ncclInProgress while a non-blocking communicator
	// is still working, else an asynchronous error. Its own error is a failed query.
	state func() (NCCLResult, error)
	// describe turns a failing state into an error (an *NCCLError with NCCL's description).
	describe func(NCCLResult) error
	// done is cuStreamQuery on the stream the operation was enqueued on (nil: nothing to wait for on a
	// stream, as for init and finalize). It is asked only once state is ncclSuccess.
	done func() (bool, error)
}

// Polling: the first spinPolls polls run back to back (yielding the processor), which is what a small
// all-gather between GPUs of one host needs (tens of microseconds); then the sleep between polls grows
// by pollStep up to maxPollSleep, which bounds how late a timeout, an abort or a cancel is noticed.
const (
	spinPolls    = 200
	pollStep     = 10 * time.Microsecond
	maxPollSleep = time.Millisecond
)

// pollSleep is the pause before poll i+1.
func pollSleep(i int) time.Duration {
	if i < spinPolls {
		return 0
	}
	return min(time.Duration(i-spinPolls+1)*pollStep, maxPollSleep)
}

// waitNCCL polls p until the operation completes, fails, or must be given up: it returns nil when
// state is ncclSuccess and done reports true; the error of a failed query (state or done); describe's
// error for an asynchronous NCCL error; errAbortRequested once abort is closed; ctx's error (with its
// cause) once ctx ends; and an error wrapping ErrTimeout after timeout when ctx has no deadline of its
// own (ctx's deadline wins when it has one; timeout <= 0 means none). It never aborts anything itself.
func waitNCCL(ctx context.Context, p poller, timeout time.Duration, abort <-chan struct{}) error {
	start := time.Now()
	var deadline time.Time
	if _, ok := ctx.Deadline(); !ok && timeout > 0 {
		deadline = start.Add(timeout)
	}
	for i := 0; ; i++ {
		st, err := p.state()
		if err != nil {
			return err
		}
		switch st {
		case NCCLSuccess:
			if p.done == nil {
				return nil
			}
			ok, err := p.done()
			if err != nil {
				return err
			}
			if ok {
				return nil
			}
		case NCCLInProgress:
		default:
			return p.describe(st)
		}
		select {
		case <-abort:
			return errAbortRequested
		case <-ctx.Done():
			return ctxError(ctx, time.Since(start))
		default:
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			return fmt.Errorf("%w after %v (the default timeout; the context had no deadline)", ErrTimeout, timeout)
		}
		if d := pollSleep(i); d > 0 {
			time.Sleep(d)
		} else {
			runtime.Gosched()
		}
	}
}

// ctxError is ctx's error after waiting for waited, with its cause when that says more.
func ctxError(ctx context.Context, waited time.Duration) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: %w after %v (the context's deadline)", ErrTimeout, err, waited.Round(time.Millisecond))
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w (cause: %w)", err, cause)
	}
	return err
}
