package comm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// script is a fake NCCL communicator and stream: state answers from states (the last one repeats), done
// becomes true after doneAfter queries (never when negative).
type script struct {
	states    []NCCLResult
	stateErr  error
	doneAfter int
	doneErr   error

	stateCalls, doneCalls int
}

func (s *script) poller() poller {
	return poller{
		state: func() (NCCLResult, error) {
			s.stateCalls++
			if s.stateErr != nil {
				return 0, s.stateErr
			}
			if len(s.states) == 0 {
				return NCCLSuccess, nil
			}
			st := s.states[0]
			if len(s.states) > 1 {
				s.states = s.states[1:]
			}
			return st, nil
		},
		describe: func(rc NCCLResult) error {
			return &NCCLError{Call: "ncclCommGetAsyncError", Code: rc, Name: rc.String(), Message: rc.fallbackMessage()}
		},
		done: func() (bool, error) {
			s.doneCalls++
			if s.doneErr != nil {
				return false, s.doneErr
			}
			return s.doneAfter >= 0 && s.doneCalls > s.doneAfter, nil
		},
	}
}

func TestWaitNCCL(t *testing.T) {
	errStream := errors.New("cuStreamQuery: CUDA_ERROR_ILLEGAL_ADDRESS (700): an illegal memory access was encountered")
	errQuery := errors.New("ncclCommGetAsyncError: ncclInvalidArgument (4): invalid argument")
	tests := []struct {
		name      string
		s         script
		timeout   time.Duration
		check     func(t *testing.T, err error, s *script)
		wantDone  int // stream queries expected, when >= 0
		wantState int // state queries expected, when > 0
	}{
		{name: "done at once", s: script{doneAfter: 0}, timeout: time.Second, wantDone: 1, wantState: 1,
			check: func(t *testing.T, err error, _ *script) { assert.NoError(t, err) }},
		{name: "done after polls", s: script{doneAfter: 500}, timeout: 10 * time.Second, wantDone: 501, wantState: 501,
			check: func(t *testing.T, err error, _ *script) { assert.NoError(t, err) }},
		{name: "stream not asked while NCCL is still enqueuing",
			s:       script{states: []NCCLResult{NCCLInProgress, NCCLInProgress, NCCLInProgress, NCCLSuccess}, doneAfter: 0},
			timeout: time.Second, wantDone: 1, wantState: 4,
			check: func(t *testing.T, err error, _ *script) { assert.NoError(t, err) }},
		{name: "async error", s: script{states: []NCCLResult{NCCLSuccess, NCCLRemoteError}, doneAfter: -1},
			timeout: time.Second, wantDone: 1, wantState: 2,
			check: func(t *testing.T, err error, _ *script) {
				assert.True(t, IsNCCLCode(err, NCCLRemoteError), "%v", err)
				assert.EqualError(t, err, "ncclCommGetAsyncError: ncclRemoteError (6): remote process exited or there was a network error")
			}},
		{name: "async error during init", s: script{states: []NCCLResult{NCCLInProgress, NCCLSystemError}, doneAfter: -1},
			timeout: time.Second, wantDone: 0, wantState: 2,
			check: func(t *testing.T, err error, _ *script) { assert.True(t, IsNCCLCode(err, NCCLSystemError)) }},
		{name: "state query fails", s: script{stateErr: errQuery}, timeout: time.Second, wantDone: 0,
			check: func(t *testing.T, err error, _ *script) { assert.ErrorIs(t, err, errQuery) }},
		{name: "stream query fails", s: script{doneErr: errStream}, timeout: time.Second, wantDone: 1,
			check: func(t *testing.T, err error, _ *script) { assert.ErrorIs(t, err, errStream) }},
		{name: "timeout", s: script{doneAfter: -1}, timeout: 30 * time.Millisecond, wantDone: -1,
			check: func(t *testing.T, err error, s *script) {
				require.ErrorIs(t, err, ErrTimeout)
				assert.EqualError(t, err, "timed out after 30ms (the default timeout; the context had no deadline)")
				assert.Greater(t, s.doneCalls, spinPolls, "spun before sleeping")
			}},
		{name: "timeout while NCCL is still in progress", s: script{states: []NCCLResult{NCCLInProgress}, doneAfter: -1},
			timeout: 20 * time.Millisecond, wantDone: 0,
			check: func(t *testing.T, err error, _ *script) { assert.ErrorIs(t, err, ErrTimeout) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			start := time.Now()
			err := waitNCCL(t.Context(), s.poller(), tc.timeout, nil)
			elapsed := time.Since(start)
			tc.check(t, err, &s)
			if tc.wantDone >= 0 {
				assert.Equal(t, tc.wantDone, s.doneCalls, "stream queries")
			}
			if tc.wantState > 0 {
				assert.Equal(t, tc.wantState, s.stateCalls, "state queries")
			}
			if errors.Is(err, ErrTimeout) {
				assert.GreaterOrEqual(t, elapsed, tc.timeout)
				assert.Less(t, elapsed, tc.timeout+time.Second, "noticed late")
			}
		})
	}
}

func TestWaitNCCLContext(t *testing.T) {
	never := func() *script { return &script{doneAfter: -1} }

	t.Run("cancel with a cause", func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		cause := errors.New("rank 2: forward failed")
		time.AfterFunc(20*time.Millisecond, func() { cancel(cause) })
		err := waitNCCL(ctx, never().poller(), time.Hour, nil)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, cause)
		assert.NotErrorIs(t, err, ErrTimeout)
		assert.EqualError(t, err, "context canceled (cause: rank 2: forward failed)")
	})
	t.Run("context deadline beats a longer default", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := waitNCCL(ctx, never().poller(), time.Hour, nil)
		require.ErrorIs(t, err, ErrTimeout)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "(the context's deadline)")
		assert.Less(t, time.Since(start), time.Second)
	})
	t.Run("context deadline beats a shorter default", func(t *testing.T) {
		// start is taken before the context so that the timer, armed inside
		// WithTimeout, cannot fire less than 60 ms after it.
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Millisecond)
		defer cancel()
		deadline, _ := ctx.Deadline()
		err := waitNCCL(ctx, never().poller(), time.Millisecond, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.False(t, time.Now().Before(deadline), "returned before the context's deadline")
		assert.GreaterOrEqual(t, time.Since(start), 60*time.Millisecond, "the default timeout does not apply under a deadline")
	})
	t.Run("abort requested", func(t *testing.T) {
		abort := make(chan struct{})
		time.AfterFunc(10*time.Millisecond, func() { close(abort) })
		err := waitNCCL(t.Context(), never().poller(), time.Hour, abort)
		assert.ErrorIs(t, err, errAbortRequested)
	})
	t.Run("completion wins over a closed abort", func(t *testing.T) {
		abort := make(chan struct{})
		close(abort)
		assert.NoError(t, waitNCCL(t.Context(), (&script{doneAfter: 0}).poller(), time.Hour, abort))
	})
	t.Run("no stream to wait for", func(t *testing.T) {
		p := (&script{}).poller()
		p.done = nil
		assert.NoError(t, waitNCCL(t.Context(), p, time.Second, nil))
	})
}

func TestPollSleep(t *testing.T) {
	assert.Zero(t, pollSleep(0))
	assert.Zero(t, pollSleep(spinPolls-1))
	assert.Equal(t, pollStep, pollSleep(spinPolls))
	assert.Equal(t, 2*pollStep, pollSleep(spinPolls+1))
	assert.Equal(t, maxPollSleep, pollSleep(spinPolls+100000))
	for i := 1; i < spinPolls+200; i++ {
		assert.GreaterOrEqual(t, pollSleep(i), pollSleep(i-1), "non-decreasing at %d", i)
	}
}
