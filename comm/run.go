package comm

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
)

// RunRanks runs fn once per communicator, each on its own goroutine with that rank's communicator, and
// waits for all of them. When a rank's fn returns an error (or panics), RunRanks aborts the group through
// that rank's communicator, so ranks waiting in collectives return at once, and cancels the context the
// other ranks see (context.Cause gives the failure). It returns nil if every rank succeeded, else an
// errors.Join of "rank N: ..." for each failed rank in rank order; ranks stopped by another's failure
// report an [*AbortError] naming the rank that failed. fn must return once its context is cancelled
// or a collective fails, or RunRanks cannot return either.
func RunRanks(ctx context.Context, comms []Communicator, fn func(ctx context.Context, c Communicator) error) error {
	if len(comms) == 0 {
		return errors.New("comm: RunRanks: no communicators")
	}
	for i, c := range comms {
		if c == nil {
			return fmt.Errorf("comm: RunRanks: communicator %d is nil", i)
		}
	}
	if fn == nil {
		return errors.New("comm: RunRanks: nil function")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Go(func() {
			err := runRank(ctx, c, fn)
			if err == nil {
				return
			}
			errs[i] = fmt.Errorf("rank %d: %w", c.Rank(), err)
			c.Abort(err)
			cancel(errs[i])
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runRank calls fn, turning a panic into an error with the stack.
func runRank(ctx context.Context, c Communicator, fn func(context.Context, Communicator) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return fn(ctx, c)
}
