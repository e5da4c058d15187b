package comm

// Tests on real NCCL and GPUs. They skip without libnccl.so.2, without a CUDA driver or GPU, or with
// fewer GPUs than they need. Build them with `CGO_ENABLED=0 go test -c ./comm` and run the binary on a
// GPU host: -test.run 'GPU'. TestNCCLOnFakes runs them everywhere else on two fake devices and a fake
// NCCL (internal/fakecuda, internal/fakenccl).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/loader"
)

// ncclGPUs returns the primary contexts of GPUs 0..n-1, or skips the test, saying what it needs.
func ncclGPUs(t *testing.T, n int) []*loader.Context {
	t.Helper()
	v, err := NCCLVersion()
	if err != nil {
		t.Skipf("needs libnccl.so.2 (NCCL 2.x) and %d CUDA GPU(s): %v", n, err)
	}
	count, err := loader.DeviceCount()
	if err != nil {
		t.Skipf("needs libcuda.so.1 and %d CUDA GPU(s): %v", n, err)
	}
	if count < n {
		t.Skipf("needs %d CUDA GPUs, found %d", n, count)
	}
	t.Logf("NCCL %s, %d GPU(s)", NCCLVersionString(v), count)
	ctxs := make([]*loader.Context, n)
	for i := range ctxs {
		ctx, err := loader.Primary(i)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, ctx.Close()) })
		ctxs[i] = ctx
	}
	return ctxs
}

// ncclTestBytes is what rank sends in a round: size bytes from (seed, round, rank) only.
func ncclTestBytes(seed uint64, round, rank, size int) []byte {
	rng := rand.New(rand.NewPCG(seed^uint64(round)<<24, uint64(rank)+1))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// ncclTestSizes are the per-rank sizes of the rounds: odd (ncclUint8) and multiples of 4
// (ncclFloat32), small and large.
var ncclTestSizes = []int{1, 3, 4, 8, 13, 1000, 4096 + 5, 1 << 20}

func closeAll(t *testing.T, comms []*NCCLComm) {
	t.Helper()
	for _, c := range comms {
		assert.NoError(t, c.Close(), "rank %d", c.Rank())
	}
}

func TestNCCLGPUOneRank(t *testing.T) {
	ctx := ncclGPUs(t, 1)[0]
	for _, opts := range []NCCLOptions{{}, {Blocking: true}} {
		t.Run(fmt.Sprintf("blocking=%v", opts.Blocking), func(t *testing.T) {
			id, err := NewUniqueID()
			require.NoError(t, err)
			c, err := NewNCCLCommWith(ctx, id, 1, 0, opts)
			require.NoError(t, err)
			defer func() { assert.NoError(t, c.Close()) }()
			assert.Equal(t, opts.Blocking, c.Blocking())

			// Host bytes.
			for round, n := range ncclTestSizes {
				send := ncclTestBytes(1, round, 0, n)
				recv := make([]byte, n)
				require.NoError(t, c.AllGather(t.Context(), send, recv))
				require.Equal(t, send, recv, "%d bytes", n)
			}
			require.NoError(t, c.Barrier(t.Context()))
			got, err := AllGatherFloat64(t.Context(), c, []float64{1.5, -2})
			require.NoError(t, err)
			assert.Equal(t, []float64{1.5, -2}, got)

			// Device float32 buffers, on the communicator's stream and on another.
			vals := []float32{1, 2.5, -3, 4e-30, 5}
			send, err := loader.AllocFor[float32](ctx, len(vals))
			require.NoError(t, err)
			defer func() { assert.NoError(t, send.Free()) }()
			require.NoError(t, loader.CopyToDevice(send, vals))
			recv, err := loader.AllocFor[float32](ctx, len(vals))
			require.NoError(t, err)
			defer func() { assert.NoError(t, recv.Free()) }()
			other, err := ctx.NewStream(loader.StreamNonBlocking)
			require.NoError(t, err)
			defer func() { assert.NoError(t, other.Close()) }()
			for _, s := range []*loader.Stream{nil, other} {
				require.NoError(t, recv.Memset8(0))
				require.NoError(t, c.AllGatherDevice(t.Context(), send, recv, s))
				out := make([]float32, len(vals))
				require.NoError(t, loader.CopyFromDevice(recv, out))
				assert.Equal(t, vals, out)
			}
			// In place: send is this rank's slot of recv.
			require.NoError(t, c.AllGatherDevice(t.Context(), recv, recv, nil))
			// A bad recv size is refused (and aborts this communicator).
			err = c.AllGatherDevice(t.Context(), send, mustView(t, recv, 0, 4), nil)
			require.ErrorIs(t, err, ErrMismatch)
			var ae *AbortError
			assert.ErrorAs(t, c.Barrier(t.Context()), &ae)
		})
	}
}

func mustView(t *testing.T, b *loader.Buffer, off, size int) *loader.Buffer {
	t.Helper()
	v, err := b.View(off, size)
	require.NoError(t, err)
	return v
}

// exchange runs the same rounds on every rank of comms and returns what each rank received, round by
// round: host all-gathers of ncclTestSizes, a barrier, and the float64 helper.
func exchange(t *testing.T, comms []Communicator) [][][]byte {
	t.Helper()
	got := make([][][]byte, len(comms))
	err := RunRanks(t.Context(), comms, func(ctx context.Context, c Communicator) error {
		for round, n := range ncclTestSizes {
			send := ncclTestBytes(7, round, c.Rank(), n)
			recv := make([]byte, c.Size()*n)
			if err := c.AllGather(ctx, send, recv); err != nil {
				return err
			}
			got[c.Rank()] = append(got[c.Rank()], recv)
			if round == 2 {
				if err := c.Barrier(ctx); err != nil {
					return err
				}
			}
		}
		f, err := AllGatherFloat64(ctx, c, []float64{float64(c.Rank()) + 0.25, -1e300})
		if err != nil {
			return err
		}
		got[c.Rank()] = append(got[c.Rank()], float64Bytes(f))
		return nil
	})
	require.NoError(t, err)
	return got
}

func TestNCCLGPUTwoRanksMatchLoopback(t *testing.T) {
	ctxs := ncclGPUs(t, 2)
	comms, err := NewLocalNCCL(ctxs)
	require.NoError(t, err)
	defer closeAll(t, comms)
	loop, err := NewLoopback(2)
	require.NoError(t, err)

	nccl := make([]Communicator, len(comms))
	for i, c := range comms {
		nccl[i] = c
	}
	want := exchange(t, loop)
	got := exchange(t, nccl)
	for r := range want {
		require.Len(t, got[r], len(want[r]))
		for i := range want[r] {
			require.True(t, bytes.Equal(want[r][i], got[r][i]), "rank %d round %d differs from the loopback", r, i)
		}
	}

	// Device buffers on both GPUs, against the loopback's host result.
	for round, n := range ncclTestSizes {
		recvs := make([][]byte, 2)
		err := RunRanks(t.Context(), nccl, func(ctx context.Context, cc Communicator) error {
			c := cc.(*NCCLComm)
			lctx := c.Context()
			send, err := lctx.Alloc(n)
			if err != nil {
				return err
			}
			defer send.Free()
			recv, err := lctx.Alloc(2 * n)
			if err != nil {
				return err
			}
			defer recv.Free()
			if err := send.CopyHtoD(ncclTestBytes(7, round, c.Rank(), n)); err != nil {
				return err
			}
			if err := c.AllGatherDevice(ctx, send, recv, nil); err != nil {
				return err
			}
			recvs[c.Rank()] = make([]byte, 2*n)
			return recv.CopyDtoH(recvs[c.Rank()])
		})
		require.NoError(t, err)
		for r := range recvs {
			require.True(t, bytes.Equal(want[r][round], recvs[r]), "device round %d (%d bytes) rank %d differs from the loopback", round, n, r)
		}
	}
}

func TestNCCLGPUAbortOnTimeout(t *testing.T) {
	ctxs := ncclGPUs(t, 2)
	comms, err := NewLocalNCCLWith(ctxs, NCCLOptions{Timeout: 30 * time.Second})
	require.NoError(t, err)
	defer closeAll(t, comms)
	comms[0].Timeout = 300 * time.Millisecond

	// Rank 1 never joins: rank 0 must give up, abort, and say who, what and why.
	start := time.Now()
	err = comms[0].AllGather(t.Context(), make([]byte, 8), make([]byte, 16))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, err, ErrTimeout)
	assert.Contains(t, err.Error(), "comm: rank 0: all-gather #1: timed out after 300ms")
	assert.Contains(t, err.Error(), "NCCL communicator aborted")

	// Rank 1, in the same process, shares the abort.
	err = comms[1].Barrier(t.Context())
	var ae *AbortError
	require.ErrorAs(t, err, &ae)
	assert.Equal(t, 0, ae.Rank)
	assert.ErrorIs(t, err, ErrTimeout)
}

func TestNCCLGPUInitTimeout(t *testing.T) {
	ctx := ncclGPUs(t, 1)[0]
	id, err := NewUniqueID()
	require.NoError(t, err)
	start := time.Now()
	_, err = NewNCCLCommWith(ctx, id, 2, 0, NCCLOptions{Timeout: 500 * time.Millisecond})
	require.Error(t, err)
	assert.Less(t, time.Since(start), 10*time.Second)
	require.ErrorIs(t, err, ErrTimeout)
	assert.Contains(t, err.Error(), "comm: NCCL rank 0 of 2 (device 0): init: timed out")
	assert.Contains(t, err.Error(), "not every rank joined")
}

func TestNCCLGPUDuplicateDevice(t *testing.T) {
	ctx := ncclGPUs(t, 1)[0]
	_, err := NewLocalNCCL([]*loader.Context{ctx, ctx})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ranks 0 and 1 are both on device 0")
	assert.False(t, errors.Is(err, ErrNoNCCL))
}

// rankHelperEnv makes TestNCCLGPUProcessPerRank act out one rank (rankHelper) in a child process.
const rankHelperEnv = "GDNKCP_COMM_RANK_HELPER"

// TestNCCLGPUProcessPerRank starts two processes of this test binary, one rank each on GPUs 0 and 1, with
// a launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NCCL_COMM_ID), as kcp launch
// and torchrun set them: each meets the other through NewNCCLCommFromEnv and checks every host and
// device all-gather of ncclTestSizes against the bytes both ranks sent, then a barrier.
func TestNCCLGPUProcessPerRank(t *testing.T) {
	if os.Getenv(rankHelperEnv) != "" {
		os.Exit(rankHelper())
	}
	ncclGPUs(t, 2)
	l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for NCCL's bootstrap root
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	outs := make([]bytes.Buffer, 2)
	cmds := make([]*exec.Cmd, 2)
	for r := range cmds {
		cmds[r] = exec.Command(os.Args[0], "-test.run=^TestNCCLGPUProcessPerRank$", "-test.count=1")
		cmds[r].Env = append(os.Environ(), rankHelperEnv+"=1", fmt.Sprintf("RANK=%d", r), "WORLD_SIZE=2",
			fmt.Sprintf("LOCAL_RANK=%d", r), "LOCAL_WORLD_SIZE=2", fmt.Sprintf("NCCL_COMM_ID=127.0.0.1:%d", port))
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
		require.NoError(t, cmds[r].Start())
	}
	for r, cmd := range cmds {
		err := cmd.Wait()
		require.NoError(t, err, "rank %d:\n%s", r, outs[r].String())
		require.Contains(t, outs[r].String(), fmt.Sprintf("rank %d of 2: %d rounds checked", r, len(ncclTestSizes)))
	}
}

// rankHelper is one rank of TestNCCLGPUProcessPerRank; it returns the process's exit code.
func rankHelper() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "rank helper:", err)
		return 1
	}
	e, err := EnvFromOS()
	if err != nil {
		return fail(err)
	}
	lctx, err := loader.Primary(e.LocalRank)
	if err != nil {
		return fail(err)
	}
	defer lctx.Close()
	c, err := NewNCCLCommFromEnv(lctx, e, NCCLOptions{Timeout: time.Minute})
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	ctx := context.Background()
	for round, n := range ncclTestSizes {
		want := make([]byte, 0, e.WorldSize*n)
		for r := range e.WorldSize {
			want = append(want, ncclTestBytes(11, round, r, n)...)
		}
		recv := make([]byte, e.WorldSize*n)
		if err := c.AllGather(ctx, ncclTestBytes(11, round, e.Rank, n), recv); err != nil {
			return fail(err)
		}
		if !bytes.Equal(recv, want) {
			return fail(fmt.Errorf("host all-gather, round %d (%d bytes a rank): not the ranks' bytes in rank order", round, n))
		}
		err := func() error {
			send, err := lctx.Alloc(n)
			if err != nil {
				return err
			}
			defer send.Free()
			drecv, err := lctx.Alloc(e.WorldSize * n)
			if err != nil {
				return err
			}
			defer drecv.Free()
			if err := send.CopyHtoD(ncclTestBytes(11, round, e.Rank, n)); err != nil {
				return err
			}
			if err := c.AllGatherDevice(ctx, send, drecv, nil); err != nil {
				return err
			}
			clear(recv)
			if err := drecv.CopyDtoH(recv); err != nil {
				return err
			}
			if !bytes.Equal(recv, want) {
				return fmt.Errorf("device all-gather, round %d (%d bytes a rank): not the ranks' bytes in rank order", round, n)
			}
			return nil
		}()
		if err != nil {
			return fail(err)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		return fail(err)
	}
	fmt.Printf("rank %d of %d: %d rounds checked\n", e.Rank, e.WorldSize, len(ncclTestSizes))
	return 0
}
