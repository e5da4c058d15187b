// Package comm is the rank-to-rank exchange of the context-parallel algorithm: the forward all-gathers the
// (P, Q) state summaries of exported segments and the backward the adjoint offsets, each rank then folding
// the chains in a fixed order (DESIGN.md §3).
//
// A [Communicator] is one rank's handle on a group of ranks. Every rank of the group issues the same
// collectives in the same order; the n-th collective call of each rank (its sequence number, counted
// from 1) meets the n-th call of every other rank. A communicator is used by one goroutine at a time.
//
// Implementations:
//   - [NewLoopback]: n ranks in one process, sharing an in-process hub. For tests, for the CPU backend and
//     for more ranks than GPUs.
//   - [NewNCCLComm], [NewLocalNCCL], [NewNCCLCommFromEnv]: NCCL opened at run time with purego, ranks on
//     the GPUs of one host or of many (torchrun's environment, [EnvFromOS]). Tested against a fake libnccl
//     on the CPU and against NCCL 2.28.3 on two H200s (nccl_gpu_test.go); the multi-process bootstrap
//     from the environment runs under `kcp launch`.
//
// Faults never hang the group: a rank whose context ends while it waits for peers names the ranks that
// did not arrive and aborts the group; [Communicator.Abort] does the same on demand, and [RunRanks] aborts
// the group when any rank's function fails. Every later call on every rank then returns an error naming
// the rank that aborted, as an [*AbortError].
package comm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// Communicator is one rank's endpoint in a group of Size ranks.
//
// AllGather works on host memory: send and recv are Go byte slices. The NCCL communicator also takes
// device buffers and a stream ([NCCLComm.AllGatherDevice]); the rank, size, ordering, abort and error
// rules described here are the same for both.
type Communicator interface {
	// Rank returns this rank's index in the group, in [0, Size).
	Rank() int
	// Size returns the number of ranks in the group.
	Size() int
	// AllGather gathers every rank's send into recv: recv is the concatenation of the sends in rank order,
	// identical on every rank. Every rank must send the same number of bytes, and len(recv) must be
	// Size()*len(send). (The loopback checks this across ranks and fails the collective on every rank
	// with [ErrMismatch] and the ranks and lengths; NCCL cannot check it across processes, so callers must
	// not rely on it.) send may be this rank's slot of recv (in place). AllGather blocks until every rank
	// has joined this collective, the group is aborted, or ctx ends; in the last case it returns ctx.Err()
	// wrapped with the ranks that did not arrive and the sequence number, and aborts the group.
	AllGather(ctx context.Context, send, recv []byte) error
	// Barrier blocks until every rank has reached it, with AllGather's rules for errors, cancellation and
	// abort. It counts as a collective in the sequence.
	Barrier(ctx context.Context) error
	// Abort poisons the group: every waiting and every later collective on every rank returns an
	// [*AbortError] naming this rank and err (a nil err is recorded as "Abort called without a reason").
	// Only the first abort of a group is recorded; later ones do nothing. Abort never blocks and may be
	// called from any goroutine, also while this rank waits in a collective.
	Abort(err error)
	// Close releases this rank's endpoint. It is idempotent. Later collectives on this rank return
	// [ErrClosed]; collectives on other ranks can no longer complete, so closing aborts the group (a
	// collective that every rank has already joined still completes).
	Close() error
}

// ErrClosed is returned (wrapped) by collectives on a closed communicator, and is the cause recorded when
// a rank closes a group that others still use.
var ErrClosed = errors.New("communicator closed")

// AbortError is the error a collective returns after a group was aborted: by [Communicator.Abort],
// by Close, or by a rank that gave up waiting for its peers.
type AbortError struct {
	// Rank is the rank that aborted the group.
	Rank int
	// Err is the reason it gave.
	Err error
}

// Error returns "aborted by rank N: reason".
func (e *AbortError) Error() string {
	return fmt.Sprintf("aborted by rank %d: %v", e.Rank, e.Err)
}

// Unwrap returns the reason, so errors.Is sees through an abort to its cause.
func (e *AbortError) Unwrap() error { return e.Err }

// hostLittleEndian reports whether this machine stores numbers little-endian, so that the typed helpers
// can view a []float64 as its little-endian bytes without copying. (A variable so tests can cover the
// portable path.)
var hostLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// AllGatherFloat64 all-gathers float64 values: every rank passes its send (all of the same length) and
// gets the concatenation of all sends in rank order, in a new slice. The values travel as little-endian
// IEEE 754 bits, so the result is bitwise what each rank sent.
func AllGatherFloat64(ctx context.Context, c Communicator, send []float64) ([]float64, error) {
	recv := make([]float64, c.Size()*len(send))
	if err := AllGatherFloat64Into(ctx, c, send, recv); err != nil {
		return nil, err
	}
	return recv, nil
}

// AllGatherFloat64Into is [AllGatherFloat64] into a caller-owned recv of length Size()*len(send), for hot
// loops: on little-endian hosts it copies nothing beyond the collective itself.
func AllGatherFloat64Into(ctx context.Context, c Communicator, send, recv []float64) error {
	if hostLittleEndian {
		return c.AllGather(ctx, float64Bytes(send), float64Bytes(recv))
	}
	sb := make([]byte, 8*len(send))
	for i, v := range send {
		binary.LittleEndian.PutUint64(sb[8*i:], math.Float64bits(v))
	}
	rb := make([]byte, 8*len(recv))
	if err := c.AllGather(ctx, sb, rb); err != nil {
		return err
	}
	for i := range recv {
		recv[i] = math.Float64frombits(binary.LittleEndian.Uint64(rb[8*i:]))
	}
	return nil
}

// AllGatherFloat32 is [AllGatherFloat64] for float32 values.
func AllGatherFloat32(ctx context.Context, c Communicator, send []float32) ([]float32, error) {
	recv := make([]float32, c.Size()*len(send))
	if err := AllGatherFloat32Into(ctx, c, send, recv); err != nil {
		return nil, err
	}
	return recv, nil
}

// AllGatherFloat32Into is [AllGatherFloat64Into] for float32 values.
func AllGatherFloat32Into(ctx context.Context, c Communicator, send, recv []float32) error {
	if hostLittleEndian {
		return c.AllGather(ctx, float32Bytes(send), float32Bytes(recv))
	}
	sb := make([]byte, 4*len(send))
	for i, v := range send {
		binary.LittleEndian.PutUint32(sb[4*i:], math.Float32bits(v))
	}
	rb := make([]byte, 4*len(recv))
	if err := c.AllGather(ctx, sb, rb); err != nil {
		return err
	}
	for i := range recv {
		recv[i] = math.Float32frombits(binary.LittleEndian.Uint32(rb[4*i:]))
	}
	return nil
}

// float64Bytes views s as its bytes in host order (no copy).
func float64Bytes(s []float64) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 8*len(s))
}

// float32Bytes views s as its bytes in host order (no copy).
func float32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s))
}
