package comm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundData is what rank r sends in a round: size bytes, derived from (seed, round, rank) only.
func roundData(seed uint64, round, rank, size int) []byte {
	rng := rand.New(rand.NewPCG(seed^uint64(round)<<20, uint64(rank)))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// roundSize is the send length of a round, the same on every rank.
func roundSize(seed uint64, round int) int {
	return rand.New(rand.NewPCG(seed, uint64(round))).IntN(300)
}

// runAll runs fn on every rank's goroutine and returns each rank's error, without aborting on failure.
func runAll(comms []Communicator, fn func(c Communicator) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Go(func() { errs[i] = fn(c) })
	}
	wg.Wait()
	return errs
}

func TestNewLoopback(t *testing.T) {
	for _, n := range []int{0, -1} {
		comms, err := NewLoopback(n)
		assert.Nil(t, comms)
		assert.EqualError(t, err, fmt.Sprintf("comm: loopback of %d ranks, want at least 1", n))
	}
	comms, err := NewLoopback(3)
	require.NoError(t, err)
	require.Len(t, comms, 3)
	for r, c := range comms {
		assert.Equal(t, r, c.Rank())
		assert.Equal(t, 3, c.Size())
	}
}

func TestAllGatherRandom(t *testing.T) {
	const rounds = 200
	for n := 1; n <= 8; n++ {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			seed := uint64(n)
			comms, err := NewLoopback(n)
			require.NoError(t, err)
			err = RunRanks(context.Background(), comms, func(ctx context.Context, c Communicator) error {
				for round := range rounds {
					if round%7 == 3 {
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						continue
					}
					size := roundSize(seed, round)
					send := roundData(seed, round, c.Rank(), size)
					var recv []byte
					if round%5 == 1 {
						// In place: send is this rank's slot of recv, as NCCL allows.
						recv = make([]byte, n*size)
						copy(recv[c.Rank()*size:], send)
						send = recv[c.Rank()*size : (c.Rank()+1)*size]
					} else {
						recv = make([]byte, n*size)
					}
					if err := c.AllGather(ctx, send, recv); err != nil {
						return err
					}
					for r := range n {
						if want := roundData(seed, round, r, size); !bytes.Equal(recv[r*size:(r+1)*size], want) {
							return fmt.Errorf("round %d: slot of rank %d differs", round, r)
						}
					}
				}
				return nil
			})
			require.NoError(t, err)
			// Every round was cleaned up.
			h := comms[0].(*loopback).hub
			h.mu.Lock()
			assert.Empty(t, h.rounds)
			h.mu.Unlock()
		})
	}
}

func TestTypedHelpers(t *testing.T) {
	for _, le := range []bool{true, false} {
		t.Run(fmt.Sprintf("little-endian view %v", le), func(t *testing.T) {
			defer func(v bool) { hostLittleEndian = v }(hostLittleEndian)
			hostLittleEndian = le
			comms, err := NewLoopback(3)
			require.NoError(t, err)
			nan := math.Float64frombits(0x7ff8_0000_dead_beef)
			var got64 [3][]float64
			var got32 [3][]float32
			err = RunRanks(context.Background(), comms, func(ctx context.Context, c Communicator) error {
				r := float64(c.Rank())
				v64, err := AllGatherFloat64(ctx, c, []float64{r, -r / 3, nan})
				if err != nil {
					return err
				}
				got64[c.Rank()] = v64
				v32, err := AllGatherFloat32(ctx, c, []float32{float32(r) + 0.5})
				if err != nil {
					return err
				}
				got32[c.Rank()] = v32
				empty, err := AllGatherFloat64(ctx, c, nil)
				if err != nil {
					return err
				}
				if len(empty) != 0 {
					return fmt.Errorf("empty all-gather gave %v", empty)
				}
				return nil
			})
			require.NoError(t, err)
			for r := range 3 {
				require.Len(t, got64[r], 9)
				for i, v := range got64[r] {
					want := []float64{0, math.Copysign(0, -1), nan, 1, -1.0 / 3, nan, 2, -2.0 / 3, nan}[i]
					assert.Equal(t, math.Float64bits(want), math.Float64bits(v), "rank %d element %d", r, i)
				}
				assert.Equal(t, []float32{0.5, 1.5, 2.5}, got32[r])
			}
		})
	}
}

func TestMismatch(t *testing.T) {
	tests := []struct {
		name string
		n    int
		call func(ctx context.Context, c Communicator) error
		msg  string
	}{{
		name: "send lengths",
		n:    4,
		call: func(ctx context.Context, c Communicator) error {
			size := 8
			if c.Rank() == 1 {
				size = 12
			}
			return c.AllGather(ctx, make([]byte, size), make([]byte, 4*size))
		},
		msg: "all-gather #2: send lengths differ across ranks: 8 bytes on ranks 0, 2, 3; 12 bytes on rank 1",
	}, {
		name: "recv length",
		n:    3,
		call: func(ctx context.Context, c Communicator) error {
			recv := 12
			if c.Rank() == 2 {
				recv = 8
			}
			return c.AllGather(ctx, make([]byte, 4), make([]byte, recv))
		},
		msg: "all-gather #2: recv of the wrong length: rank 2 has 8 bytes, want 12 bytes (3 ranks x 4 bytes)",
	}, {
		name: "typed recv length",
		n:    2,
		call: func(ctx context.Context, c Communicator) error {
			return AllGatherFloat64Into(ctx, c, []float64{1}, make([]float64, 1+c.Rank()))
		},
		msg: "all-gather #2: recv of the wrong length: rank 0 has 8 bytes, want 16 bytes (2 ranks x 8 bytes)",
	}, {
		name: "barrier against all-gather",
		n:    3,
		call: func(ctx context.Context, c Communicator) error {
			if c.Rank() == 1 {
				return c.Barrier(ctx)
			}
			return c.AllGather(ctx, nil, nil)
		},
		msg: "barrier #2: collectives differ across ranks: all-gather on ranks 0, 2; barrier on rank 1",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms, err := NewLoopback(tc.n)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			errs := runAll(comms, func(c Communicator) error {
				if err := c.Barrier(ctx); err != nil { // #1
					return err
				}
				return tc.call(ctx, c) // #2
			})
			for r, err := range errs {
				require.Error(t, err, "rank %d", r)
				assert.ErrorIs(t, err, ErrMismatch)
				assert.NotErrorIs(t, err, context.DeadlineExceeded)
				assert.Contains(t, err.Error(), fmt.Sprintf("comm: rank %d: ", r))
				if tc.name == "barrier against all-gather" && r != 1 {
					assert.Contains(t, err.Error(), strings.Replace(tc.msg, "barrier #2", "all-gather #2", 1))
				} else {
					assert.Contains(t, err.Error(), tc.msg)
				}
			}
			// Every rank saw the failure alike, so the group goes on.
			errs = runAll(comms, func(c Communicator) error {
				got, err := AllGatherFloat64(ctx, c, []float64{float64(c.Rank())})
				if err == nil && len(got) != tc.n {
					err = fmt.Errorf("got %v", got)
				}
				return err
			})
			for r, err := range errs {
				assert.NoError(t, err, "rank %d", r)
			}
		})
	}
}

func TestTimeoutNamesMissingRank(t *testing.T) {
	const n, timeout = 4, 100 * time.Millisecond
	comms, err := NewLoopback(n)
	require.NoError(t, err)
	late := make(chan struct{})
	var elapsed [n]time.Duration
	errs := runAll(comms, func(c Communicator) error {
		if err := c.Barrier(context.Background()); err != nil { // #1 completes
			return err
		}
		if c.Rank() == 2 {
			<-late // rank 2 stalls until the others have given up
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		err := c.AllGather(ctx, []byte{byte(c.Rank())}, make([]byte, n)) // #2
		elapsed[c.Rank()] = time.Since(start)
		if c.Rank() == 0 {
			// Released by the timeouts, not by rank 2.
			go func() {
				time.Sleep(50 * time.Millisecond)
				close(late)
			}()
		}
		return err
	})
	timedOut := 0
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		t.Log(err)
		msg := err.Error()
		assert.Contains(t, msg, fmt.Sprintf("comm: rank %d: all-gather #2: ", r))
		assert.Contains(t, msg, "rank 2 did not arrive")
		assert.Regexp(t, `rank 2 did not arrive( at all-gather #2)?: context deadline exceeded$`, msg)
		if errors.Is(err, context.DeadlineExceeded) {
			timedOut++
		}
		if r != 2 {
			assert.Less(t, elapsed[r], timeout+time.Second, "rank %d returned late", r)
		}
		var ae *AbortError
		if !strings.Contains(msg, "aborted by") {
			continue
		}
		require.ErrorAs(t, err, &ae)
		assert.NotEqual(t, 2, ae.Rank)
	}
	assert.GreaterOrEqual(t, timedOut, 1, "some rank reports its own deadline")
	// The late rank was told by an abort error.
	var ae *AbortError
	require.ErrorAs(t, errs[2], &ae)
	assert.ErrorIs(t, errs[2], context.DeadlineExceeded)
}

func TestAbortMidSequence(t *testing.T) {
	const n = 4
	comms, err := NewLoopback(n)
	require.NoError(t, err)
	boom := errors.New("boom: NaN in the summary walk")
	// A watchdog only: an abort must release the ranks long before this.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rounds [n]int
	errs := runAll(comms, func(c Communicator) error {
		for round := 0; ; round++ {
			if c.Rank() == 2 && round == 5 {
				c.Abort(boom)
				c.Abort(errors.New("second abort is ignored"))
				return c.Barrier(ctx) // a later call on the aborting rank fails too
			}
			if _, err := AllGatherFloat64(ctx, c, []float64{1, 2}); err != nil {
				return err
			}
			rounds[c.Rank()]++
		}
	})
	for r, err := range errs {
		require.Error(t, err, "rank %d", r)
		assert.ErrorIs(t, err, boom)
		assert.NotErrorIs(t, err, context.DeadlineExceeded)
		var ae *AbortError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, 2, ae.Rank)
		assert.Contains(t, err.Error(), fmt.Sprintf("comm: rank %d: ", r))
		assert.Contains(t, err.Error(), "#6: aborted by rank 2: boom: NaN in the summary walk")
		assert.Equal(t, 5, rounds[r])
	}
	// Later calls fail at once, on every rank.
	for _, c := range comms {
		err := c.Barrier(context.Background())
		assert.ErrorIs(t, err, boom)
	}
	// Abort(nil) still names the rank.
	comms, err = NewLoopback(2)
	require.NoError(t, err)
	comms[1].Abort(nil)
	assert.EqualError(t, comms[0].Barrier(ctx), "comm: rank 0: barrier #1: aborted by rank 1: Abort called without a reason")
}

func TestClose(t *testing.T) {
	comms, err := NewLoopback(3)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, RunRanks(ctx, comms, func(ctx context.Context, c Communicator) error { return c.Barrier(ctx) }))

	require.NoError(t, comms[1].Close())
	require.NoError(t, comms[1].Close(), "Close is idempotent")
	assert.Equal(t, 1, comms[1].Rank(), "Rank works after Close")

	err = comms[1].AllGather(ctx, nil, nil)
	assert.ErrorIs(t, err, ErrClosed)
	assert.EqualError(t, err, "comm: rank 1: all-gather: communicator closed")

	err = comms[0].Barrier(ctx)
	assert.ErrorIs(t, err, ErrClosed)
	assert.EqualError(t, err, "comm: rank 0: barrier #2: aborted by rank 1: communicator closed")
	for _, c := range comms {
		assert.NoError(t, c.Close())
	}
}

func TestConcurrentUseOfOneRank(t *testing.T) {
	comms, err := NewLoopback(2)
	require.NoError(t, err)
	ctx := context.Background()
	done := make(chan error)
	go func() { done <- comms[0].Barrier(ctx) }()
	for !comms[0].(*loopback).busy.Load() {
		time.Sleep(time.Millisecond)
	}
	err = comms[0].Barrier(ctx)
	assert.ErrorContains(t, err, "comm: rank 0: barrier: called while another collective of this rank is in progress")
	require.NoError(t, comms[1].Barrier(ctx))
	require.NoError(t, <-done)
}

func TestRunRanks(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name   string
		fn     func(ctx context.Context, c Communicator) error
		failed []int    // ranks whose own failure must be reported
		msgs   []string // substrings of the joined error
	}{{
		name: "one rank fails, the others loop on collectives",
		fn: func(ctx context.Context, c Communicator) error {
			for round := 0; ; round++ {
				if c.Rank() == 1 && round == 3 {
					return boom
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
			}
		},
		failed: []int{1},
		msgs:   []string{"rank 1: boom", "rank 0: comm: rank 0: barrier #4: aborted by rank 1: boom"},
	}, {
		name: "one rank panics, the others wait on the context",
		fn: func(ctx context.Context, c Communicator) error {
			if c.Rank() == 2 {
				var m map[string]int
				m["x"]++ // panics
			}
			<-ctx.Done()
			return context.Cause(ctx)
		},
		failed: []int{2},
		msgs:   []string{"rank 2: panic: assignment to entry in nil map", "rank 0: rank 2: panic"},
	}, {
		name: "two ranks fail",
		fn: func(ctx context.Context, c Communicator) error {
			if c.Rank()%2 == 1 {
				return fmt.Errorf("odd rank %d: %w", c.Rank(), boom)
			}
			return c.Barrier(ctx)
		},
		failed: []int{1, 3},
		msgs:   []string{"rank 1: odd rank 1: boom", "rank 3: odd rank 3: boom"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comms, err := NewLoopback(4)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			err = RunRanks(ctx, comms, tc.fn)
			require.Error(t, err)
			assert.Less(t, time.Since(start), 5*time.Second)
			assert.NotErrorIs(t, err, context.DeadlineExceeded)
			t.Log(err)
			joined, ok := err.(interface{ Unwrap() []error })
			require.True(t, ok, "a joined error")
			assert.Len(t, joined.Unwrap(), 4, "every rank failed, the others by abort")
			for _, r := range tc.failed {
				assert.Contains(t, err.Error(), fmt.Sprintf("rank %d: ", r))
			}
			for _, m := range tc.msgs {
				assert.Contains(t, err.Error(), m)
			}
		})
	}

	t.Run("success", func(t *testing.T) {
		comms, err := NewLoopback(3)
		require.NoError(t, err)
		assert.NoError(t, RunRanks(context.Background(), comms, func(ctx context.Context, c Communicator) error {
			return c.Barrier(ctx)
		}))
	})
	t.Run("bad arguments", func(t *testing.T) {
		comms, err := NewLoopback(2)
		require.NoError(t, err)
		ok := func(context.Context, Communicator) error { return nil }
		assert.EqualError(t, RunRanks(context.Background(), nil, ok), "comm: RunRanks: no communicators")
		assert.EqualError(t, RunRanks(context.Background(), []Communicator{comms[0], nil}, ok), "comm: RunRanks: communicator 1 is nil")
		assert.EqualError(t, RunRanks(context.Background(), comms, nil), "comm: RunRanks: nil function")
	})
}

func TestFormatRanks(t *testing.T) {
	tests := []struct {
		ranks []int
		want  string
	}{
		{[]int{3}, "rank 3"},
		{[]int{0, 2}, "ranks 0, 2"},
		{[]int{0, 1}, "ranks 0, 1"},
		{[]int{0, 1, 2, 3, 4, 5, 7}, "ranks 0-5, 7"},
		{[]int{1, 3, 4, 5, 9, 10}, "ranks 1, 3-5, 9, 10"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, formatRanks(tc.ranks))
	}
}
