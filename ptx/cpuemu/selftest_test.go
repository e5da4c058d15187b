package cpuemu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// smemFill is emu.h's kSmemFill: what fresh shared memory holds.
const smemFill uint32 = 0x7fedcba9

// TestEmulator checks the emulator with the small kernels of
// testdata/selftest.cpp: barriers, shuffles and shared memory behave as on
// the GPU, and the bugs it is there to catch are caught.
func TestEmulator(t *testing.T) {
	bin := built(t, "runner_fwd")

	t.Run("block_sum", func(t *testing.T) { // a tree reduction through __syncthreads, bit for bit
		const blocks, n = 3, 256
		rng := rand.New(rand.NewPCG(1, 1))
		in := make([]float32, blocks*n)
		for i := range in {
			in[i] = float32(rng.NormFloat64())
		}
		j := newJob(t)
		j.f32("in", in)
		j.out("sum", 4*blocks)
		j.launch("sum", "emu_block_sum", grid1(blocks), n, "1024", buf("in"), buf("sum"))
		got := j.run(bin).f32s("sum")
		for b := 0; b < blocks; b++ {
			a := append([]float32(nil), in[b*n:(b+1)*n]...)
			for s := n / 2; s > 0; s /= 2 {
				for i := 0; i < s; i++ {
					a[i] += a[i+s]
				}
			}
			require.Equal(t, math.Float32bits(a[0]), math.Float32bits(got[b]), "block %d", b)
		}
	})

	t.Run("shuffles", func(t *testing.T) {
		const blocks, n = 2, 96
		j := newJob(t)
		j.out("out", 4*4*blocks*n)
		j.launch("shfl", "emu_shuffles", grid1(blocks), n, "0", buf("out"))
		r := j.run(bin)
		for th := 0; th < blocks*n; th++ {
			lane, warp := th%n%32, th%n/32
			down, up := lane+3, lane-7
			if down >= 32 {
				down = lane
			}
			if up < 0 {
				up = lane
			}
			for k, src := range []int{lane ^ 5, down, up, 9} {
				got := int32(math.Float32bits(f32Of(r.raw["out"], th*4+k)))
				require.Equal(t, int32(src*10+warp), got, "thread %d shuffle %d", th, k)
			}
		}
	})

	t.Run("static_shared", func(t *testing.T) {
		const blocks, n = 2, 256
		j := newJob(t)
		j.out("out", 4*blocks*n)
		j.launch("static", "emu_static_shared", grid1(blocks), n, "0", buf("out"))
		got := j.run(bin).f32s("out")
		for i, v := range got {
			require.Equal(t, float32(i/n*1000+n-1-i%n), v, "thread %d", i)
		}
	})

	t.Run("missing_sync_reads_nan", func(t *testing.T) {
		// Ascending order in block 0, descending in block 1: either way some
		// thread reads its neighbour's slot before it is written.
		const blocks, n = 2, 256
		j := newJob(t)
		j.out("out", 4*blocks*n)
		j.launch("race", "emu_missing_sync", grid1(blocks), n, "1024", buf("out"))
		requireFreshReads(t, j.run(bin).raw["out"], blocks, n, "no thread read unwritten shared memory")
	})

	t.Run("named_barrier_pairs", func(t *testing.T) {
		// Warps w and w+4 meet at named barrier 1 + w%4 and read each other's post.
		const blocks, n = 2, 256
		j := newJob(t)
		j.out("out", 4*blocks*n)
		j.launch("pair", "emu_named_pair", grid1(blocks), n, "1024", buf("out"), i32a(1))
		got := j.run(bin).f32s("out")
		for i, v := range got {
			w, lane := i%n/32, i%32
			require.Equal(t, float32(lane*10+(w+4)%8), v, "thread %d", i)
		}
	})

	t.Run("named_barrier_missing_reads_nan", func(t *testing.T) {
		// Without the pair's barrier the warp that runs first reads its partner's slot unwritten, in
		// either block order.
		const blocks, n = 2, 256
		j := newJob(t)
		j.out("out", 4*blocks*n)
		j.launch("pair", "emu_named_pair", grid1(blocks), n, "1024", buf("out"), i32a(0))
		requireFreshReads(t, j.run(bin).raw["out"], blocks, n, "no warp read its partner's slot unwritten")
	})

	t.Run("arrive_pair", func(t *testing.T) {
		// Producers (warps 0-3) write, then bar.arrive; consumers (warps 4-7) bar.sync and read.
		const blocks, n = 2, 256
		j := newJob(t)
		j.out("out", 4*blocks*n)
		j.launch("arrive", "emu_arrive_pair", grid1(blocks), n, "1024", buf("out"), i32a(1))
		got := j.run(bin).f32s("out")
		for i, v := range got {
			b, th := i/n, i%n
			want := float32(0)
			if th >= 128 {
				want = float32(th - 128 + 1000*b)
			}
			require.Equal(t, want, v, "block %d thread %d", b, th)
		}
	})

	t.Run("arrive_before_write_reads_nan", func(t *testing.T) {
		// Producers that arrive before they write: the arriving threads go on only after the consumers
		// their arrival released, so in the descending block the consumers read the slots unwritten.
		const blocks, n = 2, 256
		j := newJob(t)
		j.out("out", 4*blocks*n)
		j.launch("arrive", "emu_arrive_pair", grid1(blocks), n, "1024", buf("out"), i32a(0))
		out := j.run(bin).raw["out"]
		fresh := 0
		for i := n + 128; i < 2*n; i++ {
			if math.Float32bits(f32Of(out, i)) == smemFill {
				fresh++
			}
		}
		require.Equal(t, 128, fresh, "every consumer of block 1 reads its slot unwritten")
	})

	for _, c := range []struct {
		name, kernel, smem, want string
		args                     []string
	}{
		{"named_barrier_count_mismatch", "emu_named_count_mismatch", "0", "threads name counts 64 and 96", []string{buf("p")}},
		{"named_barrier_short", "emu_named_short", "0", "at a named barrier (bar.sync) short of its count", []string{buf("p")}},
		{"arrive_count_mismatch", "emu_arrive_count_mismatch", "0", "threads name counts", []string{buf("p")}},
		{"divergent_syncthreads", "emu_divergent_sync", "0", "barrier divergence", []string{buf("p")}},
		{"smem_past_launch_size", "emu_smem_overflow", "1024", "beyond the launch's 1024 bytes", []string{i32a(1024)}},
		{"smem_past_device_limit", "emu_smem_overflow", "232452", "more than the device's", []string{i32a(0)}},
		{"global_out_of_bounds", "emu_oob_write", "0", "past the end of buffer p", []string{buf("p"), i32a(10)}},
		{"wrong_argument_kinds", "emu_oob_write", "0", "takes parameters of kinds bi", []string{buf("p"), f32a(1)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := newJob(t)
			j.f32("p", make([]float32, 10))
			j.launch(c.name, c.kernel, grid1(1), 256, c.smem, c.args...)
			require.Contains(t, j.runFail(bin), c.want)
		})
	}
}

// requireFreshReads requires, in each of blocks blocks of n fp32 results,
// at least one that is the emulator's fill of unwritten shared memory
// (smemFill): a read the missing barrier let through.
func requireFreshReads(t *testing.T, out []byte, blocks, n int, what string) {
	t.Helper()
	for b := 0; b < blocks; b++ {
		fresh := 0
		for i := b * n; i < (b+1)*n; i++ {
			if math.Float32bits(f32Of(out, i)) == smemFill {
				fresh++
			}
		}
		require.Positive(t, fresh, "block %d: %s", b, what)
	}
}
