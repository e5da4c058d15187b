package comm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrMismatch is matched (with errors.Is) by the error of a collective whose ranks passed arguments that
// do not fit together: different collectives at the same sequence number, different send lengths, or a
// recv of the wrong length. On the loopback every rank gets that error and the group stays usable.
var ErrMismatch = errors.New("collective arguments do not match across ranks")

// mismatchError is a collective failure that every rank of the group observes alike.
type mismatchError struct{ msg string }

func (e *mismatchError) Error() string        { return e.msg }
func (e *mismatchError) Is(target error) bool { return target == ErrMismatch }

// errNoReason is the reason recorded by Abort(nil).
var errNoReason = errors.New("Abort called without a reason")

type opKind uint8

const (
	opAllGather opKind = iota
	opBarrier
)

func (k opKind) String() string {
	if k == opBarrier {
		return "barrier"
	}
	return "all-gather"
}

// NewLoopback returns n communicators, ranks 0..n-1, that exchange data through a hub in this process.
// Each is meant for one goroutine (one rank); [RunRanks] runs a function on all of them. A collective
// completes when all n ranks have called it for the same sequence number, and every rank gets the same
// bytes, in rank order, whatever the order of arrival: the loopback is deterministic. n < 1 is an error.
func NewLoopback(n int) ([]Communicator, error) {
	if n < 1 {
		return nil, fmt.Errorf("comm: loopback of %d ranks, want at least 1", n)
	}
	h := &hub{n: n, rounds: map[uint64]*round{}, aborted: make(chan struct{})}
	comms := make([]Communicator, n)
	for r := range comms {
		comms[r] = &loopback{hub: h, rank: r}
	}
	return comms, nil
}

// hub is the state the ranks of a loopback group share.
type hub struct {
	n int

	mu       sync.Mutex
	rounds   map[uint64]*round // collectives some rank has joined and not every rank has left
	abortErr *AbortError       // set once, with aborted closed
	aborted  chan struct{}
}

// round is one collective: the n-th call of every rank.
type round struct {
	op      []opKind
	joined  []bool
	njoined int
	send    [][]byte // the callers' buffers, valid until the round completes
	recvLen []int
	done    chan struct{} // closed when every rank has joined

	// Set when the round completes, then read-only.
	result []byte
	err    error
	left   int // ranks that have taken the outcome
}

// abortLocked poisons the hub unless it already is. h.mu is held.
func (h *hub) abortLocked(rank int, err error) {
	if h.abortErr != nil {
		return
	}
	h.abortErr = &AbortError{Rank: rank, Err: err}
	close(h.aborted)
}

// complete builds the outcome once every rank has joined. h.mu is held.
func (rd *round) complete(n int) {
	defer func() {
		rd.send = nil // drop the callers' buffers
		close(rd.done)
	}()
	if msg := groupBy(n, func(r int) string { return rd.op[r].String() }); msg != "" {
		rd.err = &mismatchError{"collectives differ across ranks: " + msg}
		return
	}
	if rd.op[0] == opBarrier {
		return
	}
	if msg := groupBy(n, func(r int) string { return plural(len(rd.send[r]), "byte") }); msg != "" {
		rd.err = &mismatchError{"send lengths differ across ranks: " + msg}
		return
	}
	size := len(rd.send[0])
	var bad []string
	for r := range n {
		if rd.recvLen[r] != n*size {
			bad = append(bad, fmt.Sprintf("rank %d has %s", r, plural(rd.recvLen[r], "byte")))
		}
	}
	if len(bad) > 0 {
		rd.err = &mismatchError{fmt.Sprintf("recv of the wrong length: %s, want %s (%d ranks x %s)",
			strings.Join(bad, ", "), plural(n*size, "byte"), n, plural(size, "byte"))}
		return
	}
	rd.result = make([]byte, 0, n*size)
	for r := range n {
		rd.result = append(rd.result, rd.send[r]...)
	}
}

// groupBy returns "" when key is the same for every rank, else the ranks grouped by key, in order of
// first appearance: "8 bytes on ranks 0, 2-3; 12 bytes on rank 1".
func groupBy(n int, key func(r int) string) string {
	var keys []string
	ranks := map[string][]int{}
	for r := range n {
		k := key(r)
		if _, ok := ranks[k]; !ok {
			keys = append(keys, k)
		}
		ranks[k] = append(ranks[k], r)
	}
	if len(keys) == 1 {
		return ""
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " on " + formatRanks(ranks[k])
	}
	return strings.Join(parts, "; ")
}

// formatRanks writes a sorted list of ranks: "rank 3", "ranks 0, 2", "ranks 0-5, 7".
func formatRanks(ranks []int) string {
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		switch {
		case j == i:
			parts = append(parts, strconv.Itoa(ranks[i]))
		case j == i+1:
			parts = append(parts, strconv.Itoa(ranks[i]), strconv.Itoa(ranks[j]))
		default:
			parts = append(parts, fmt.Sprintf("%d-%d", ranks[i], ranks[j]))
		}
		i = j + 1
	}
	if len(ranks) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ", ")
}

func plural(n int, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return strconv.Itoa(n) + " " + unit + "s"
}

// loopback is one rank's endpoint on a hub.
type loopback struct {
	hub    *hub
	rank   int
	seq    uint64 // sequence number of this rank's last collective
	busy   atomic.Bool
	closed atomic.Bool
}

// Rank returns this rank's index.
func (c *loopback) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *loopback) Size() int { return c.hub.n }

// AllGather implements [Communicator.AllGather].
func (c *loopback) AllGather(ctx context.Context, send, recv []byte) error {
	return c.collective(ctx, opAllGather, send, recv)
}

// Barrier implements [Communicator.Barrier].
func (c *loopback) Barrier(ctx context.Context) error {
	return c.collective(ctx, opBarrier, nil, nil)
}

// Abort implements [Communicator.Abort].
func (c *loopback) Abort(err error) {
	if err == nil {
		err = errNoReason
	}
	c.hub.mu.Lock()
	c.hub.abortLocked(c.rank, err)
	c.hub.mu.Unlock()
}

// Close implements [Communicator.Close].
func (c *loopback) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	c.hub.mu.Lock()
	c.hub.abortLocked(c.rank, ErrClosed)
	c.hub.mu.Unlock()
	return nil
}

func (c *loopback) collective(ctx context.Context, op opKind, send, recv []byte) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if c.closed.Load() {
		return fmt.Errorf("comm: rank %d: %s: %w", c.rank, op, ErrClosed)
	}
	if !c.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("comm: rank %d: %s: called while another collective of this rank is in progress (use a communicator from one goroutine)", c.rank, op)
	}
	defer c.busy.Store(false)
	c.seq++
	seq := c.seq
	fail := func(err error) error { return fmt.Errorf("comm: rank %d: %s #%d: %w", c.rank, op, seq, err) }

	h := c.hub
	h.mu.Lock()
	if h.abortErr != nil {
		err := h.abortErr
		h.mu.Unlock()
		return fail(err)
	}
	rd := h.rounds[seq]
	if rd == nil {
		rd = &round{
			op:      make([]opKind, h.n),
			joined:  make([]bool, h.n),
			send:    make([][]byte, h.n),
			recvLen: make([]int, h.n),
			done:    make(chan struct{}),
		}
		h.rounds[seq] = rd
	}
	rd.op[c.rank], rd.joined[c.rank] = op, true
	rd.send[c.rank], rd.recvLen[c.rank] = send, len(recv)
	rd.njoined++
	if rd.njoined == h.n {
		rd.complete(h.n)
	}
	h.mu.Unlock()

	select {
	case <-rd.done:
	case <-h.aborted:
	case <-ctx.Done():
	}

	h.mu.Lock()
	if rd.njoined == h.n { // complete: the outcome stands even if the group was aborted meanwhile
		rd.left++
		if rd.left == h.n {
			delete(h.rounds, seq)
		}
		h.mu.Unlock()
		if rd.err != nil {
			return fail(rd.err)
		}
		copy(recv, rd.result)
		return nil
	}
	defer h.mu.Unlock()
	if h.abortErr != nil {
		return fail(h.abortErr)
	}
	var missing []int
	for r, ok := range rd.joined {
		if !ok {
			missing = append(missing, r)
		}
	}
	h.abortLocked(c.rank, fmt.Errorf("%s did not arrive at %s #%d: %w", formatRanks(missing), op, seq, ctx.Err()))
	return fail(fmt.Errorf("%s did not arrive: %w", formatRanks(missing), ctx.Err()))
}
