package kcp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/loader"
)

// Multi-GPU tests: the ranks of one plan on two GPUs, through NCCL in one
// process, through the loopback across the GPUs (several ranks per GPU),
// and one backend per rank over a given communicator (one process per rank,
// emulated with goroutines). They need two CUDA GPUs, libnccl.so.2 (all but
// the loopback test) and blobs with the GDN kernels, and skip with a message
// otherwise. Build and run on the GPU machine:
//
//	CGO_ENABLED=0 go test -c -o .gpu/kcp.test ./kcp
//	(cd kcp && ../.gpu/kcp.test -test.run 'GPUMulti' -test.v)
//
// Inputs are fresh each run (seed from the clock, logged; GDNKCP_TEST_SEED
// repeats one). Heads HQK 1 / HV 2, dims 128, small packs.

// multiTimeout bounds every exchange of these tests: a fault ends a run by
// an abort, well before it.
const multiTimeout = 30 * time.Second

// needGPUs skips the test without n CUDA GPUs and, with nccl, without NCCL.
func needGPUs(t *testing.T, n int, nccl bool) {
	t.Helper()
	count, err := loader.DeviceCount()
	if err != nil {
		t.Skipf("needs libcuda.so.1 and %d CUDA GPUs: %v", n, err)
	}
	if count < n {
		t.Skipf("needs %d CUDA GPUs, the driver shows %d", n, count)
	}
	if nccl {
		v, err := comm.NCCLVersion()
		if err != nil {
			t.Skipf("needs libnccl.so.2 (NCCL) for ranks on several GPUs in one process: %v", err)
		}
		t.Logf("NCCL %s", comm.NCCLVersionString(v))
	}
}

// openMulti opens the default blob with opts on base's plan, skipping the
// test when the blobs lack the kernels.
func openMulti(t *testing.T, plan *Plan, opts GPUOptions) *GPU {
	t.Helper()
	opts = fp32Unless(opts)
	g, err := NewGPU(plan, opts)
	if errors.Is(err, ErrMissingKernels) {
		t.Skipf("needs blobs with the GDN forward and backward kernels: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, g.Close()) })
	return g
}

// b13 is what a B1 (forward kept on the device, backward) and a B3
// (checkpoint, recompute, backward) of one plan give.
type b13 struct {
	fwd, ck        *Output
	b1, b3         *Grads
	comm           CommKind
	devices        []int
	deviceExchange bool
}

// runB13 runs B1 and B3 of p on base's devices with opts and frees
// everything it made.
func runB13(t *testing.T, base *GPU, p *Plan, opts GPUOptions, in *Inputs, dout []float32) b13 {
	t.Helper()
	ctx := context.Background()
	opts.KeepDevice = true
	g, err := base.ForPlan(p, opts)
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Close()) }()
	f, err := g.Forward(ctx, in)
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	g1, err := f.Backward(ctx, dout)
	require.NoError(t, err)
	ck, f3, g3 := b3Run(t, g, in, dout)
	defer func() { require.NoError(t, f3.Close()) }()
	requireSameGradBits(t, "B3 vs B1", g1, g3)
	// The digests made from the GPU's rows are RankDigest of the float64
	// tensors.
	for _, r := range g.LocalRanks() {
		for _, c := range []struct {
			name string
			f    *GPUForward
			g    *GPUGrads
		}{{"B1", f, g1}, {"B3", f3, g3}} {
			want, err := RankDigest(p, r, c.f.Output(), c.g.Gradients())
			require.NoError(t, err)
			got, err := c.g.RankDigest(r)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s rank %d digest", c.name, r)
		}
	}
	return b13{fwd: f.Output(), ck: ck.Output(), b1: g1.Gradients(), b3: g3.Gradients(), comm: g.Comm(), devices: g.RankDevices(),
		deviceExchange: g.DeviceExchange()}
}

// requireSameB13 requires two runs' outputs and gradients (B1 and B3)
// bitwise identical.
func requireSameB13(t *testing.T, what string, a, b b13) {
	t.Helper()
	requireBitwise(t, what+": forward o", a.fwd.O, b.fwd.O)
	requireBitwise(t, what+": checkpoint o", a.ck.O, b.ck.O)
	for _, pair := range []struct {
		name string
		x, y *Grads
	}{{"B1", a.b1, b.b1}, {"B3", a.b3, b.b3}} {
		xt, yt := pair.x.Tensors(), pair.y.Tensors()
		require.Equal(t, len(xt), len(yt), what)
		for i := range xt {
			requireBitwise(t, what+": "+pair.name+" "+xt[i].Name, xt[i].Data, yt[i].Data)
		}
	}
}

// multiPacks are the packs of the multi-GPU tests: short documents, and a
// tiny pack that leaves ranks empty at R 8.
var multiPacks = []int{0, 3} // indices into bwdPacks

// TestGPUMultiNCCL runs CP 2 on two GPUs through NCCL in one process (the
// default for two ranks on two devices), every layout, core and module, B1
// and B3, with the summaries and offsets all-gathered in device memory and
// again through host memory (GPUOptions.HostExchange): the output and every
// gradient bitwise identical to the same plan on one GPU through the
// loopback.
func TestGPUMultiNCCL(t *testing.T) {
	needGPUs(t, 2, true)
	seed := gpuTestSeed(t)
	p0 := bwdPlan(t, bwdPacks[0].docs, 1, LayoutC, 1, 2)
	one := openMulti(t, p0, GPUOptions{Devices: []int{0}, Timeout: multiTimeout})
	two := openMulti(t, p0, GPUOptions{Devices: []int{0, 1}, Timeout: multiTimeout})
	require.Equal(t, []int{0, 1}, two.Devices())
	for pi, pk := range multiPacks {
		docs := bwdPacks[pk].docs
		for si, stage := range []Stage{StageCore, StageModule} {
			in, dout := RandomInputs(bwdPlan(t, docs, 1, LayoutC, 1, 2), stage, seed+uint64(10*pi+si))
			for _, layout := range Layouts() {
				t.Run(fmt.Sprintf("%s/%s/%s/R2", bwdPacks[pk].name, stage, layout), func(t *testing.T) {
					p := bwdPlan(t, docs, 2, layout, 1, 2)
					opts := GPUOptions{Options: Options{Stage: stage}}
					ref := runB13(t, one, p, opts, in, dout)
					require.Equal(t, CommLoopback, ref.comm)
					require.Equal(t, []int{0, 0}, ref.devices)
					got := runB13(t, two, p, opts, in, dout)
					require.Equal(t, CommNCCL, got.comm)
					require.Equal(t, []int{0, 1}, got.devices)
					require.True(t, got.deviceExchange, "NCCL all-gathers device memory")
					require.False(t, ref.deviceExchange, "the loopback goes through host memory")
					requireSameB13(t, "NCCL on 2 GPUs vs loopback on 1", ref, got)
					opts.HostExchange = true
					host := runB13(t, two, p, opts, in, dout)
					require.False(t, host.deviceExchange)
					requireSameB13(t, "NCCL through host memory vs loopback on 1", ref, host)
				})
			}
		}
	}
}

// TestGPUMultiLoopback runs CP 4 and CP 8 through the loopback across two
// GPUs (2 and 4 ranks per GPU), every layout, core and module, B1 and B3:
// bitwise identical to the same plans on one GPU.
func TestGPUMultiLoopback(t *testing.T) {
	needGPUs(t, 2, false)
	seed := gpuTestSeed(t)
	p0 := bwdPlan(t, bwdPacks[0].docs, 1, LayoutC, 1, 2)
	one := openMulti(t, p0, GPUOptions{Timeout: multiTimeout})
	two := openMulti(t, p0, GPUOptions{Devices: []int{0, 1}, Timeout: multiTimeout})
	for pi, pk := range multiPacks {
		docs := bwdPacks[pk].docs
		for si, stage := range []Stage{StageCore, StageModule} {
			in, dout := RandomInputs(bwdPlan(t, docs, 1, LayoutC, 1, 2), stage, seed+uint64(10*pi+si))
			for _, layout := range Layouts() {
				for _, R := range []int{4, 8} {
					t.Run(fmt.Sprintf("%s/%s/%s/R%d", bwdPacks[pk].name, stage, layout, R), func(t *testing.T) {
						p := bwdPlan(t, docs, R, layout, 1, 2)
						opts := GPUOptions{Options: Options{Stage: stage}}
						ref := runB13(t, one, p, opts, in, dout)
						got := runB13(t, two, p, opts, in, dout)
						require.Equal(t, CommLoopback, got.comm)
						for r, d := range got.devices {
							require.Equal(t, r*2/R, d, "rank %d of %d: device", r, R)
						}
						requireSameB13(t, fmt.Sprintf("loopback on 2 GPUs (%d ranks each) vs 1 GPU", R/2), ref, got)
					})
				}
			}
		}
	}
}

// rankResult is one emulated process's digests of one case.
type rankResult struct {
	b1, b3 string
}

// TestGPUMultiProcessPerRank emulates one process per rank: two goroutines,
// each with a backend that runs one rank on its own GPU over its own
// communicator of one NCCL group (comm.NewLocalNCCL), every layout, core and
// module, B1 and B3. Each result holds only its rank (the other's rows stay
// zero, the conv weight gradient is whole), and the per-rank digests equal
// those of the one-GPU loopback run.
func TestGPUMultiProcessPerRank(t *testing.T) {
	needGPUs(t, 2, true)
	seed := gpuTestSeed(t)
	docs := bwdPacks[0].docs
	ctx := context.Background()
	p0 := bwdPlan(t, docs, 1, LayoutC, 1, 2)
	one := openMulti(t, p0, GPUOptions{Timeout: multiTimeout})
	type tcase struct {
		stage  Stage
		layout Layout
		p      *Plan
		in     *Inputs
		dout   []float32
	}
	var cases []tcase
	want := map[int][]rankResult{} // [rank][case]
	for si, stage := range []Stage{StageCore, StageModule} {
		in, dout := RandomInputs(p0, stage, seed+uint64(si))
		for _, layout := range Layouts() {
			p := bwdPlan(t, docs, 2, layout, 1, 2)
			ref := runB13(t, one, p, GPUOptions{Options: Options{Stage: stage}}, in, dout)
			for r := range 2 {
				d1, err := RankDigest(p, r, ref.fwd, ref.b1)
				require.NoError(t, err)
				d3, err := RankDigest(p, r, ref.ck, ref.b3)
				require.NoError(t, err)
				want[r] = append(want[r], rankResult{d1, d3})
			}
			cases = append(cases, tcase{stage, layout, p, in, dout})
		}
	}

	ctxs := make([]*loader.Context, 2)
	for d := range ctxs {
		c, err := loader.Primary(d)
		require.NoError(t, err)
		ctxs[d] = c
		defer func() { require.NoError(t, c.Close()) }()
	}
	comms, err := comm.NewLocalNCCL(ctxs)
	require.NoError(t, err)
	defer func() {
		for _, c := range comms {
			require.NoError(t, c.Close())
		}
	}()

	got := make([][]rankResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			res, err := processRank(ctx, r, comms[r], cases[0].p, func(base *GPU) ([]rankResult, error) {
				var out []rankResult
				for _, c := range cases {
					g, err := base.ForPlan(c.p, GPUOptions{Options: Options{Stage: c.stage}, KeepDevice: true})
					if err != nil {
						return nil, err
					}
					rr, err := rankB13(ctx, g, r, c.p, c.in, c.dout)
					err = errors.Join(err, g.Close())
					if err != nil {
						return nil, fmt.Errorf("%s %s: %w", c.stage, c.layout, err)
					}
					out = append(out, rr)
				}
				return out, nil
			})
			got[r], errs[r] = res, err
		})
	}
	wg.Wait()
	for r := range 2 {
		require.NoError(t, errs[r], "rank %d", r)
		for i, c := range cases {
			require.Equal(t, want[r][i], got[r][i], "rank %d %s %s: digests (B1, B3) vs the one-GPU loopback run", r, c.stage, c.layout)
		}
	}
}

// processRank plays one process of a one-process-per-rank run: a backend
// for rank r on device r over cm, on which run does the work. A failure
// before the backend runs aborts cm, so that the peer stops waiting.
func processRank(ctx context.Context, r int, cm comm.Communicator, p *Plan, run func(*GPU) ([]rankResult, error)) ([]rankResult, error) {
	base, err := NewGPU(p, GPUOptions{Kernels: "fp32", Device: r, Communicator: cm, Timeout: multiTimeout})
	if err != nil {
		cm.Abort(err)
		return nil, err
	}
	defer func() { _ = base.Close() }()
	if got := base.LocalRanks(); len(got) != 1 || got[0] != r {
		err := fmt.Errorf("rank %d: local ranks %v", r, got)
		cm.Abort(err)
		return nil, err
	}
	return run(base)
}

// rankB13 runs B1 and B3 of one rank on g and returns its digests, after
// checking that the results hold that rank only.
func rankB13(ctx context.Context, g *GPU, r int, p *Plan, in *Inputs, dout []float32) (rankResult, error) {
	f, err := g.Forward(ctx, in)
	if err != nil {
		return rankResult{}, err
	}
	defer func() { _ = f.Close() }()
	g1, err := f.Backward(ctx, dout)
	if err != nil {
		return rankResult{}, err
	}
	ck, err := g.ForwardCheckpoint(ctx, in)
	if err != nil {
		return rankResult{}, err
	}
	f3, err := ck.Recompute(ctx)
	if err != nil {
		return rankResult{}, err
	}
	defer func() { _ = f3.Close() }()
	g3, err := f3.Backward(ctx, dout)
	if err != nil {
		return rankResult{}, err
	}
	for _, ranks := range [][]int{f.Ranks, g1.Ranks, ck.Ranks, f3.Ranks, g3.Ranks} {
		if len(ranks) != 1 || ranks[0] != r {
			return rankResult{}, fmt.Errorf("rank %d: the results hold ranks %v", r, ranks)
		}
	}
	other := 1 - r
	nv := p.Config.HV * p.Config.DV
	for _, seg := range p.Ranks[other].Segments {
		for _, v := range f.Output().O[seg.Start*nv : seg.End()*nv] {
			if v != 0 {
				return rankResult{}, fmt.Errorf("rank %d: rank %d's output rows are not zero", r, other)
			}
		}
		for _, v := range g1.Gradients().DG[seg.Start*p.Config.HV : seg.End()*p.Config.HV] {
			if v != 0 {
				return rankResult{}, fmt.Errorf("rank %d: rank %d's dg rows are not zero", r, other)
			}
		}
	}
	if _, _, err := f.SegmentStates(other, 0, 0); err == nil && len(p.Ranks[other].Segments) > 0 {
		return rankResult{}, fmt.Errorf("rank %d: states of rank %d", r, other)
	}
	d1, err := RankDigest(p, r, f.Output(), g1.Gradients())
	if err != nil {
		return rankResult{}, err
	}
	d3, err := RankDigest(p, r, ck.Output(), g3.Gradients())
	return rankResult{d1, d3}, err
}

// faultAt returns a test fault: rank fails when it enters stage.
func faultAt(rank int, stage string, injected error) func(int, string) error {
	return func(r int, s string) error {
		if r == rank && s == stage {
			return injected
		}
		return nil
	}
}

// requireRunFault requires err to be a run error whose first failed rank is
// first at stage firstStage (firstStage "" when it ran elsewhere), with
// every other local rank of want stopped at its stage.
func requireRunFault(t *testing.T, err error, op string, first int, firstStage string, want map[int]string) {
	t.Helper()
	var re *RunError
	require.ErrorAs(t, err, &re, "%v", err)
	t.Logf("the error:\n%v", err)
	require.Equal(t, op, re.Op)
	require.Equal(t, first, re.First, "%v", err)
	require.Equal(t, firstStage, re.FirstStage, "%v", err)
	require.Len(t, re.Ranks, len(want), "%v", err)
	for _, rk := range re.Ranks {
		stage, ok := want[rk.Rank]
		require.True(t, ok, "rank %d failed: %v", rk.Rank, rk)
		require.Equal(t, stage, rk.Stage, "rank %d", rk.Rank)
		require.Equal(t, first, rk.First, "rank %d", rk.Rank)
		require.Contains(t, rk.Error(), fmt.Sprintf("rank %d (device %d), stage %q", rk.Rank, rk.Device, stage))
	}
}

// freeMem returns the free memory of each device.
func freeMem(t *testing.T, ctxs []*loader.Context) []uint64 {
	t.Helper()
	out := make([]uint64, len(ctxs))
	for i, c := range ctxs {
		free, _, err := c.MemGetInfo()
		require.NoError(t, err)
		out[i] = free
	}
	return out
}

// TestGPUMultiFaults fails a rank mid-forward and mid-backward: through
// NCCL in one process, through the loopback across two GPUs, and with one
// backend per rank over a given communicator. Every rank ends with an error
// naming the failed rank and its stage, within the timeout (by the abort,
// never by waiting it out); the ranks' device memory is released (the
// backends' accounting, and the devices' free memory); an aborted NCCL
// group is closed and its backend reports ErrReopen, and a new backend runs.
func TestGPUMultiFaults(t *testing.T) {
	needGPUs(t, 2, true)
	seed := gpuTestSeed(t)
	ctx := context.Background()
	docs := bwdPacks[0].docs
	p0 := bwdPlan(t, docs, 1, LayoutC, 1, 2)
	p2 := bwdPlan(t, docs, 2, LayoutD, 1, 2)
	p4 := bwdPlan(t, docs, 4, LayoutZ, 1, 2)
	in, dout := RandomInputs(p0, StageModule, seed)
	module := Options{Stage: StageModule}
	injected := errors.New("fault injected")

	ctxs := make([]*loader.Context, 2)
	for d := range ctxs {
		c, err := loader.Primary(d)
		require.NoError(t, err)
		ctxs[d] = c
		defer func() { require.NoError(t, c.Close()) }()
	}
	// Warm up: the kernels on both devices and one NCCL group made and
	// destroyed, so that what the driver and NCCL keep per process is
	// there before memory is measured.
	warm := openMulti(t, p0, GPUOptions{Devices: []int{0, 1}, Timeout: multiTimeout})
	runB13(t, warm, p2, GPUOptions{Options: module}, in, dout)
	runB13(t, warm, p4, GPUOptions{Options: module}, in, dout)
	require.NoError(t, warm.Close())

	t.Run("nccl/forward", func(t *testing.T) {
		g, err := NewGPU(p2, GPUOptions{Kernels: "fp32", Options: module, Devices: []int{0, 1}, Timeout: multiTimeout,
			fault: faultAt(1, "prep", injected)})
		require.NoError(t, err)
		defer func() { require.NoError(t, g.Close()) }()
		require.Equal(t, CommNCCL, g.Comm())
		live, free := devMemLive.Load(), freeMem(t, ctxs)
		start := time.Now()
		_, err = g.Forward(ctx, in)
		require.Less(t, time.Since(start), multiTimeout/2, "ended by the abort")
		require.ErrorIs(t, err, injected)
		requireRunFault(t, err, "forward", 1, "prep", map[int]string{0: "exchange summaries", 1: "prep"})
		require.Equal(t, live, devMemLive.Load(), "every rank's buffers freed")
		after := freeMem(t, ctxs)
		for d := range ctxs {
			t.Logf("device %d: free %d MiB before the run, %d MiB after the failure (the NCCL group closed)", d, free[d]>>20, after[d]>>20)
			require.GreaterOrEqual(t, int64(after[d]), int64(free[d])-64<<20, "device %d: free memory after the failure", d)
		}
		require.ErrorIs(t, g.Err(), ErrReopen)
		_, err = g.Forward(ctx, in)
		require.ErrorIs(t, err, ErrReopen)
		_, err = g.ForwardCheckpoint(ctx, in)
		require.ErrorIs(t, err, ErrReopen)
		require.Equal(t, live, devMemLive.Load())
	})

	t.Run("nccl/backward", func(t *testing.T) {
		// A new backend after the aborted one: its forward runs, its
		// backward fails at rank 0's tape walk.
		g, err := NewGPU(p2, GPUOptions{Kernels: "fp32", Options: module, Devices: []int{0, 1}, Timeout: multiTimeout, KeepDevice: true,
			fault: faultAt(0, "tape walk", injected)})
		require.NoError(t, err)
		defer func() { require.NoError(t, g.Close()) }()
		base := devMemLive.Load()
		f, err := g.Forward(ctx, in)
		require.NoError(t, err)
		kept := devMemLive.Load()
		start := time.Now()
		_, err = f.Backward(ctx, dout)
		require.Less(t, time.Since(start), multiTimeout/2, "ended by the abort")
		requireRunFault(t, err, "backward", 0, "tape walk", map[int]string{0: "tape walk", 1: "exchange conv grads"})
		require.Equal(t, kept, devMemLive.Load(), "the backward's buffers freed, the forward's kept")
		require.ErrorIs(t, g.Err(), ErrReopen)
		_, err = f.Backward(ctx, dout)
		require.ErrorIs(t, err, ErrReopen)
		require.NoError(t, f.Close())
		require.Equal(t, base, devMemLive.Load())
	})

	t.Run("loopback", func(t *testing.T) {
		g, err := NewGPU(p0, GPUOptions{Kernels: "fp32", Devices: []int{0, 1}, Timeout: multiTimeout})
		require.NoError(t, err)
		defer func() { require.NoError(t, g.Close()) }()
		base := devMemLive.Load()
		gf, err := g.ForPlan(p4, GPUOptions{Options: module, fault: faultAt(3, "summary walk", injected)})
		require.NoError(t, err)
		defer func() { require.NoError(t, gf.Close()) }()
		require.Equal(t, []int{0, 0, 1, 1}, gf.RankDevices())
		_, err = gf.Forward(ctx, in)
		requireRunFault(t, err, "forward", 3, "summary walk",
			map[int]string{0: "exchange summaries", 1: "exchange summaries", 2: "exchange summaries", 3: "summary walk"})
		require.Equal(t, base, devMemLive.Load())
		require.NoError(t, gf.Err(), "a loopback is made per run")

		gb, err := g.ForPlan(p4, GPUOptions{Options: module, KeepDevice: true, fault: faultAt(1, "offset walk", injected)})
		require.NoError(t, err)
		defer func() { require.NoError(t, gb.Close()) }()
		f, err := gb.Forward(ctx, in)
		require.NoError(t, err)
		kept := devMemLive.Load()
		_, err = f.Backward(ctx, dout)
		requireRunFault(t, err, "backward", 1, "offset walk",
			map[int]string{0: "exchange offsets", 1: "offset walk", 2: "exchange offsets", 3: "exchange offsets"})
		require.Equal(t, kept, devMemLive.Load())
		require.NoError(t, f.Close())
		require.Equal(t, base, devMemLive.Load())
	})

	t.Run("process per rank", func(t *testing.T) {
		comms, err := comm.NewLocalNCCL(ctxs)
		require.NoError(t, err)
		defer func() {
			for _, c := range comms {
				_ = c.Close() // aborted by the fault: Close reports what the abort met
			}
		}()
		base := devMemLive.Load()
		errs := make([]error, 2)
		var wg sync.WaitGroup
		start := time.Now()
		for r := range 2 {
			wg.Go(func() {
				g, err := NewGPU(p2, GPUOptions{Kernels: "fp32", Options: module, Device: r, Communicator: comms[r], Timeout: multiTimeout,
					fault: faultAt(1, "prep", injected)})
				if err != nil {
					comms[r].Abort(err)
					errs[r] = err
					return
				}
				defer func() { _ = g.Close() }()
				_, errs[r] = g.Forward(ctx, in)
			})
		}
		wg.Wait()
		require.Less(t, time.Since(start), multiTimeout/2, "ended by the abort")
		require.ErrorIs(t, errs[1], injected)
		requireRunFault(t, errs[1], "forward", 1, "prep", map[int]string{1: "prep"})
		requireRunFault(t, errs[0], "forward", 1, "", map[int]string{0: "exchange summaries"})
		require.ErrorContains(t, errs[0], `aborted by rank 1: stage "prep"`)
		require.Equal(t, base, devMemLive.Load())
	})
}
