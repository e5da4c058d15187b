package kcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/loader"
)

// CPU tests of where the ranks run and of the rank runner: option checks,
// the placement of ranks on devices, and the runner's abort and error
// naming with fake rank work over the loopback (and the loopback standing
// in for an NCCL group). No GPU.

// rankPlan is a plan with the GPU's head dims (nothing runs on it here).
func rankPlan(t *testing.T, R int) *Plan {
	t.Helper()
	p, err := NewPlan(PlanConfig{Docs: []int{40, 90}, Ranks: R, Layout: LayoutD, HQK: 1, HV: 2, DK: 128, DV: 128})
	require.NoError(t, err)
	return p
}

// fakeComm reports another rank and size than the communicator it wraps.
type fakeComm struct {
	comm.Communicator
	rank, size int
}

func (c fakeComm) Rank() int { return c.rank }
func (c fakeComm) Size() int { return c.size }

// loopbacks makes n loopback communicators and closes them with the test.
func loopbacks(t *testing.T, n int) []comm.Communicator {
	t.Helper()
	cs, err := comm.NewLoopback(n)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range cs {
			_ = c.Close()
		}
	})
	return cs
}

func TestGPUDeviceList(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts GPUOptions
		want []int
		err  string
	}{
		{"default", GPUOptions{}, []int{0}, ""},
		{"device", GPUOptions{Device: 3}, []int{3}, ""},
		{"devices", GPUOptions{Devices: []int{1, 0}}, []int{1, 0}, ""},
		{"device agrees", GPUOptions{Device: 2, Devices: []int{2, 3}}, []int{2, 3}, ""},
		{"negative device", GPUOptions{Device: -1}, nil, "device -1: a CUDA device ordinal is at least 0"},
		{"negative in devices", GPUOptions{Devices: []int{0, -2}}, nil, "GPUOptions.Devices[1] is -2"},
		{"duplicate", GPUOptions{Devices: []int{0, 1, 0}}, nil, "device 0 is listed twice in GPUOptions.Devices [0 1 0] (entries 0 and 2)"},
		{"disagree", GPUOptions{Device: 1, Devices: []int{0, 1}}, nil, "GPUOptions.Device 1 and Devices [0 1] disagree"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.opts.deviceList()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	require.NoError(t, checkOrdinals([]int{0, 1}, 2))
	require.ErrorContains(t, checkOrdinals([]int{0, 2}, 2), "device 2 is out of range: the driver shows 2 devices (ordinals 0-1)")
	require.ErrorContains(t, checkOrdinals([]int{1}, 1), "device 1 is out of range: the driver shows 1 device (ordinals 0-0)")
	require.ErrorContains(t, checkOrdinals([]int{0}, 0), "the driver shows 0 devices (CUDA")
}

// Ranks sit on the devices in contiguous blocks; auto takes NCCL exactly
// when every rank has a device of its own and there is more than one.
func TestResolveRanks(t *testing.T) {
	for _, tc := range []struct {
		R       int
		devs    []int
		kind    CommKind
		devices []int
		want    CommKind
	}{
		{1, []int{0}, "", []int{0}, CommLoopback},
		{2, []int{0}, "", []int{0, 0}, CommLoopback},
		{2, []int{0, 1}, "", []int{0, 1}, CommNCCL},
		{2, []int{0, 1}, CommAuto, []int{0, 1}, CommNCCL},
		{2, []int{0, 1}, CommLoopback, []int{0, 1}, CommLoopback},
		{4, []int{0, 1}, "", []int{0, 0, 1, 1}, CommLoopback},
		{8, []int{0, 1}, "", []int{0, 0, 0, 0, 1, 1, 1, 1}, CommLoopback},
		{8, []int{3, 5}, CommLoopback, []int{3, 3, 3, 3, 5, 5, 5, 5}, CommLoopback},
		{3, []int{0, 1}, "", []int{0, 0, 1}, CommLoopback},
		{1, []int{0, 1}, "", []int{0}, CommLoopback},
		{1, []int{0, 1}, CommNCCL, []int{0}, CommNCCL},
		{2, []int{0, 1, 2, 3}, "", []int{0, 2}, CommNCCL},
		{4, []int{1, 0, 3, 2}, CommNCCL, []int{1, 0, 3, 2}, CommNCCL},
	} {
		t.Run(fmt.Sprintf("R%d-%v-%s", tc.R, tc.devs, tc.kind), func(t *testing.T) {
			l, err := resolveRanks(tc.R, GPUOptions{Comm: tc.kind}, tc.devs)
			require.NoError(t, err)
			require.Equal(t, tc.devices, l.devices)
			require.Equal(t, tc.want, l.kind)
			require.Len(t, l.local, tc.R)
			for r, x := range l.local {
				require.Equal(t, r, x)
			}
		})
	}
	cs := loopbacks(t, 2)
	l, err := resolveRanks(2, GPUOptions{Communicator: cs[1]}, []int{3})
	require.NoError(t, err)
	require.Equal(t, []int{-1, 3}, l.devices)
	require.Equal(t, []int{1}, l.local)
	require.Equal(t, CommGiven, l.kind)

	for _, tc := range []struct {
		name string
		R    int
		opts GPUOptions
		devs []int
		want string
	}{
		{"nccl shares", 4, GPUOptions{Comm: CommNCCL}, []int{0, 1}, "GPUOptions.Comm nccl: ranks 0 and 1 of 4 both run on device 0 (devices [0 1]): NCCL takes one GPU per rank"},
		{"nccl one gpu", 2, GPUOptions{Comm: CommNCCL}, []int{0}, "ranks 0 and 1 of 2 both run on device 0"},
		{"unknown kind", 2, GPUOptions{Comm: "mpi"}, []int{0}, `unknown communicator kind "mpi"`},
		{"given kind", 2, GPUOptions{Comm: CommGiven}, []int{0}, `unknown communicator kind "communicator"`},
		{"negative timeout", 2, GPUOptions{Timeout: -time.Second}, []int{0}, "negative GPUOptions.Timeout"},
		{"size", 4, GPUOptions{Communicator: cs[0]}, []int{0}, "the Communicator has 2 ranks, the plan 4"},
		{"rank outside", 2, GPUOptions{Communicator: fakeComm{cs[0], 2, 2}}, []int{0}, "the Communicator's rank 2 is outside the plan's 2 ranks"},
		{"negative rank", 2, GPUOptions{Communicator: fakeComm{cs[0], -1, 2}}, []int{0}, "rank -1 is outside"},
		{"comm and communicator", 2, GPUOptions{Comm: CommNCCL, Communicator: cs[0]}, []int{0}, `GPUOptions.Comm "nccl" with a Communicator`},
		{"communicator devices", 2, GPUOptions{Communicator: cs[0]}, []int{0, 1}, "with a Communicator the backend runs one rank, on GPUOptions.Device; Devices lists 2 devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := resolveRanks(tc.R, tc.opts, tc.devs)
			require.ErrorContains(t, err, tc.want)
		})
	}
	for _, s := range []string{"", "auto", "loopback", "nccl"} {
		k, err := ParseCommKind(s)
		require.NoError(t, err)
		if s == "" {
			s = "auto"
		}
		require.Equal(t, CommKind(s), k)
	}
}

// NewGPU refuses bad device and communicator options before touching the
// driver.
func TestNewGPURankOptionErrors(t *testing.T) {
	p := rankPlan(t, 2)
	cs := loopbacks(t, 4)
	for _, tc := range []struct {
		name string
		opts GPUOptions
		want string
	}{
		{"duplicate", GPUOptions{Devices: []int{1, 1}}, "device 1 is listed twice"},
		{"negative", GPUOptions{Devices: []int{0, -1}}, "is -1"},
		{"nccl shared", GPUOptions{Devices: []int{0}, Comm: CommNCCL}, "NCCL takes one GPU per rank"},
		{"size", GPUOptions{Communicator: cs[0]}, "the Communicator has 4 ranks, the plan 2"},
		{"rank", GPUOptions{Communicator: fakeComm{cs[0], 5, 2}}, "rank 5 is outside the plan's 2 ranks"},
		{"kind", GPUOptions{Comm: "shm"}, "unknown communicator kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewGPU(p, tc.opts)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, g)
			require.False(t, errors.Is(err, loader.ErrNoDriver), "checked before the driver: %v", err)
		})
	}
}

// fakeFleet is a fleet of devices with profiles but nothing loaded: enough
// for newGPU and the runner with fake work. It is never released.
func fakeFleet(ordinals ...int) *gpuFleet {
	var devs []*gpuDevice
	for _, d := range ordinals {
		devs = append(devs, &gpuDevice{refs: 1, profile: &archdetect.Profile{Ordinal: d, Name: "fake", Variant: "sm_90a", SMs: 132, Target: "sm_90a"}})
	}
	f := newFleet(devs)
	f.refs = 1 << 20 // never reaches zero: nothing real to release
	return f
}

// fakeGPU is a backend over a fake fleet.
func fakeGPU(t *testing.T, p *Plan, opts GPUOptions, ordinals ...int) *GPU {
	t.Helper()
	g, err := newGPU(p, opts, fakeFleet(ordinals...))
	require.NoError(t, err)
	return g
}

// stageRecorder is a stage hook that records the stages each rank enters,
// in order, in the map it returns (read it once the run is over).
func stageRecorder() (func(rank int, stage string) error, map[int][]string) {
	var mu sync.Mutex
	stages := map[int][]string{}
	return func(rank int, stage string) error {
		mu.Lock()
		defer mu.Unlock()
		stages[rank] = append(stages[rank], stage)
		return nil
	}, stages
}

// fakeForward is rank work that walks the forward's stages and takes part
// in the two exchanges as the forward does (halo in "upload", summaries).
// It records the devices it ran on.
func fakeForward(seen *sync.Map) func(ctx context.Context, w *rankWork) error {
	return func(ctx context.Context, w *rankWork) error {
		seen.Store(w.rank, w.device)
		if w.cm != nil {
			if _, err := comm.AllGatherFloat32(ctx, w.cm, []float32{float32(w.rank)}); err != nil {
				return fmt.Errorf("rank %d: halo exchange: %w", w.rank, err)
			}
		}
		if err := w.st.upTo("exchange summaries"); err != nil {
			return err
		}
		if w.cm != nil {
			all, err := comm.AllGatherFloat32(ctx, w.cm, []float32{float32(10 * w.rank)})
			if err != nil {
				return fmt.Errorf("rank %d: summary exchange: %w", w.rank, err)
			}
			if len(all) != w.cm.Size() {
				return fmt.Errorf("rank %d: gathered %d values", w.rank, len(all))
			}
		}
		if err := w.st.finish(); err != nil {
			return err
		}
		return ctx.Err()
	}
}

// The runner over the loopback, ranks spread over two devices: every rank
// runs on its device with a communicator, passes through every stage in
// order (the hook sees them all, also those a rank skips), and a recompute
// gets no communicator.
func TestRunRanksLoopback(t *testing.T) {
	p := rankPlan(t, 4)
	hook, stages := stageRecorder()
	g := fakeGPU(t, p, GPUOptions{Devices: []int{0, 1}, StageHook: hook}, 0, 1)
	require.Equal(t, CommLoopback, g.Comm())
	require.Equal(t, []int{0, 0, 1, 1}, g.RankDevices())
	require.Equal(t, []int{0, 1, 2, 3}, g.LocalRanks())
	require.Equal(t, []int{0, 1}, g.Devices())
	require.True(t, g.Local(3))
	require.False(t, g.Local(4))
	require.NoError(t, g.Err())
	var seen sync.Map
	require.NoError(t, g.runRanks(t.Context(), "forward", GPUForwardStages, true, fakeForward(&seen)))
	for r := range 4 {
		d, ok := seen.Load(r)
		require.True(t, ok, "rank %d ran", r)
		require.Equal(t, g.RankDevices()[r], d, "rank %d device", r)
		require.Equal(t, GPUForwardStages, stages[r], "rank %d stages", r)
	}
	// A recompute exchanges nothing: no communicator.
	require.NoError(t, g.runRanks(t.Context(), "recompute", GPURecomputeStages, false, func(ctx context.Context, w *rankWork) error {
		if w.cm != nil {
			return errors.New("a recompute got a communicator")
		}
		return w.st.finish()
	}))
}

// A rank failing at a stage ends every rank at once, each error naming its
// rank, device and stage and the rank that failed first; the loopback
// backend stays usable.
func TestRunRanksAbort(t *testing.T) {
	p := rankPlan(t, 4)
	injected := errors.New("fault injected")
	var once sync.Once
	fault := func(rank int, stage string) error {
		if rank == 2 && stage == "prep" {
			var err error
			once.Do(func() { err = injected })
			return err
		}
		return nil
	}
	g := fakeGPU(t, p, GPUOptions{Devices: []int{0, 1}, fault: fault}, 0, 1)
	var seen sync.Map
	start := time.Now()
	// fakeForward enters "exchange summaries" straight from "upload": the
	// hook still runs for "prep" on the way.
	err := g.runRanks(t.Context(), "forward", GPUForwardStages, true, fakeForward(&seen))
	require.Less(t, time.Since(start), 5*time.Second)
	var re *RunError
	require.ErrorAs(t, err, &re, "%v", err)
	require.Equal(t, "forward", re.Op)
	require.Equal(t, 2, re.First)
	require.Equal(t, "prep", re.FirstStage)
	require.Len(t, re.Ranks, 4, "%v", err)
	for i, r := range re.Ranks {
		require.Equal(t, i, r.Rank)
		require.Equal(t, []int{0, 0, 1, 1}[i], r.Device)
		require.Equal(t, 2, r.First)
		if i == 2 {
			require.Equal(t, "prep", r.Stage)
			require.ErrorIs(t, r, injected)
			require.Contains(t, r.Error(), `rank 2 (device 1), stage "prep", failed first: stage hook: fault injected`)
			continue
		}
		require.Equal(t, "exchange summaries", r.Stage, "rank %d", i)
		var ab *comm.AbortError
		require.ErrorAs(t, r, &ab, "rank %d: %v", i, r)
		require.Equal(t, 2, ab.Rank)
		require.Contains(t, r.Error(), fmt.Sprintf(`rank %d (device %d), stage "exchange summaries", stopped after rank 2 failed:`, i, r.Device))
		require.Contains(t, r.Error(), `aborted by rank 2: stage "prep": stage hook: fault injected`)
	}
	require.ErrorIs(t, err, injected)
	msg := err.Error()
	require.True(t, strings.HasPrefix(msg, `kcp: gpu forward: rank 2 failed first, at stage "prep"`+"\n"), msg)
	t.Logf("the error:\n%s", msg)

	// The loopback is made per run: the backend runs again.
	require.NoError(t, g.Err())
	require.NoError(t, g.runRanks(t.Context(), "forward", GPUForwardStages, true, fakeForward(&seen)))
}

// A panic is a rank error with the stack.
func TestRunRanksPanic(t *testing.T) {
	g := fakeGPU(t, rankPlan(t, 2), GPUOptions{}, 0)
	err := g.runRanks(t.Context(), "backward", GPUBackwardStages, true, func(ctx context.Context, w *rankWork) error {
		if w.rank == 1 {
			if err := w.st.upTo("tape walk"); err != nil {
				return err
			}
			panic("boom")
		}
		return fakeForwardStages(ctx, w, "exchange conv grads")
	})
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 1, re.First)
	require.Equal(t, "tape walk", re.FirstStage)
	require.Contains(t, err.Error(), `rank 1 (device 0), stage "tape walk", failed first: panic: boom`)
	require.Contains(t, err.Error(), `rank 0 (device 0), stage "exchange conv grads", stopped after rank 1 failed`)
}

// fakeForwardStages enters stage and waits in one exchange.
func fakeForwardStages(ctx context.Context, w *rankWork, stage string) error {
	if err := w.st.upTo(stage); err != nil {
		return err
	}
	_, err := comm.AllGatherFloat32(ctx, w.cm, []float32{1})
	return err
}

// A rank that never arrives makes the others fail within GPUOptions.Timeout
// with comm.ErrTimeout naming it; nothing hangs.
func TestRunRanksTimeout(t *testing.T) {
	g := fakeGPU(t, rankPlan(t, 3), GPUOptions{Timeout: 100 * time.Millisecond}, 0)
	start := time.Now()
	err := g.runRanks(t.Context(), "forward", GPUForwardStages, true, func(ctx context.Context, w *rankWork) error {
		if w.rank == 2 {
			if err := w.st.upTo("prep"); err != nil {
				return err
			}
			<-ctx.Done() // stuck until the others give up
			return context.Cause(ctx)
		}
		return fakeForwardStages(ctx, w, "exchange summaries")
	})
	require.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, err, comm.ErrTimeout)
	require.Contains(t, err.Error(), "rank 2 did not arrive")
	require.Contains(t, err.Error(), "GPUOptions.Timeout 100ms")
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Len(t, re.Ranks, 3)
	require.Equal(t, "prep", re.Ranks[2].Stage)
	t.Logf("the error:\n%v", err)
}

// With a given communicator the backend runs its one rank; a failure in
// another process (here: the peer aborting) names that rank as the first.
func TestRunRanksGiven(t *testing.T) {
	p := rankPlan(t, 2)
	cs := loopbacks(t, 2)
	g := fakeGPU(t, p, GPUOptions{Device: 1, Communicator: cs[0]}, 1)
	require.Equal(t, CommGiven, g.Comm())
	require.Equal(t, []int{1, -1}, g.RankDevices())
	require.Equal(t, []int{0}, g.LocalRanks())

	// Both ranks healthy: rank 1 is played by the test.
	done := make(chan error, 1)
	go func() {
		_, err := comm.AllGatherFloat32(t.Context(), cs[1], []float32{1})
		if err == nil {
			_, err = comm.AllGatherFloat32(t.Context(), cs[1], []float32{2})
		}
		done <- err
	}()
	var seen sync.Map
	require.NoError(t, g.runRanks(t.Context(), "forward", GPUForwardStages, true, fakeForward(&seen)))
	require.NoError(t, <-done)
	d, _ := seen.Load(0)
	require.Equal(t, 1, d)

	// Rank 1 dies at its prep: it aborts the group.
	go func() {
		_, err := comm.AllGatherFloat32(t.Context(), cs[1], []float32{1})
		if err == nil {
			cs[1].Abort(errors.New(`stage "prep": killed`))
		}
		done <- err
	}()
	err := g.runRanks(t.Context(), "forward", GPUForwardStages, true, fakeForward(&seen))
	require.NoError(t, <-done)
	var re *RunError
	require.ErrorAs(t, err, &re, "%v", err)
	require.Equal(t, 1, re.First)
	require.Empty(t, re.FirstStage)
	require.Len(t, re.Ranks, 1)
	require.Equal(t, 0, re.Ranks[0].Rank)
	require.Equal(t, 1, re.Ranks[0].Device)
	require.Equal(t, "exchange summaries", re.Ranks[0].Stage)
	require.True(t, strings.HasPrefix(err.Error(), "kcp: gpu forward: rank 1 failed first (in another process)\n"), err.Error())
	require.Contains(t, err.Error(), `rank 0 (device 1), stage "exchange summaries", stopped after rank 1 failed: `)
	require.Contains(t, err.Error(), `aborted by rank 1: stage "prep": killed`)
}

// A failed run on an NCCL group (the loopback standing in for NCCL) aborts
// and closes the group; the backend, and every backend of its family whose
// ranks use those devices, then reports ErrReopen without running.
func TestRunRanksNCCLGroupBroken(t *testing.T) {
	var opened [][]comm.Communicator
	old := openNCCLGroup
	openNCCLGroup = func(ctxs []*loader.Context) ([]comm.Communicator, error) {
		cs, err := comm.NewLoopback(len(ctxs))
		opened = append(opened, cs)
		return cs, err
	}
	t.Cleanup(func() { openNCCLGroup = old })

	p := rankPlan(t, 2)
	g := fakeGPU(t, p, GPUOptions{Devices: []int{0, 1}}, 0, 1)
	require.Equal(t, CommNCCL, g.Comm())
	require.Equal(t, []int{0, 1}, g.RankDevices())
	var seen sync.Map
	// Two good runs share one group, made on first use.
	for range 2 {
		require.NoError(t, g.runRanks(t.Context(), "forward", GPUForwardStages, true, fakeForward(&seen)))
	}
	require.Len(t, opened, 1)
	g2, err := g.ForPlan(rankPlan(t, 2), GPUOptions{})
	require.NoError(t, err)
	require.NoError(t, g2.runRanks(t.Context(), "forward", GPUForwardStages, true, fakeForward(&seen)))
	require.Len(t, opened, 1, "a ForPlan backend on the same devices shares the group")
	// R 4 on the same devices runs on the loopback, no group.
	g4, err := g.ForPlan(rankPlan(t, 4), GPUOptions{})
	require.NoError(t, err)
	require.Equal(t, CommLoopback, g4.Comm())

	fail := errors.New("fault injected")
	err = g.runRanks(t.Context(), "backward", GPUBackwardStages, true, func(ctx context.Context, w *rankWork) error {
		if w.rank == 0 {
			if err := w.st.upTo("dv local"); err != nil {
				return err
			}
			return fail
		}
		return fakeForwardStages(ctx, w, "exchange offsets")
	})
	var re *RunError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 0, re.First)
	require.Equal(t, "dv local", re.FirstStage)
	require.Equal(t, "exchange offsets", re.Ranks[1].Stage)

	// The group was closed: its endpoints refuse collectives.
	for _, c := range opened[0] {
		require.ErrorIs(t, c.Barrier(t.Context()), comm.ErrClosed)
	}
	for _, b := range []*GPU{g, g2} {
		require.ErrorIs(t, b.Err(), ErrReopen)
		require.ErrorContains(t, b.Err(), `rank 0 failed first, at stage "dv local"`)
		ran := false
		err := b.runRanks(t.Context(), "forward", GPUForwardStages, true, func(context.Context, *rankWork) error {
			ran = true
			return nil
		})
		require.ErrorIs(t, err, ErrReopen)
		require.ErrorContains(t, err, "kcp: gpu: the backend's NCCL group was aborted; close the backend and open a new one (the group over devices [0 1] was aborted: kcp: gpu backward: rank 0 failed first")
		require.False(t, ran)
	}
	// A run without exchange (a recompute) needs no group.
	require.NoError(t, g.runRanks(t.Context(), "recompute", GPURecomputeStages, false, func(ctx context.Context, w *rankWork) error {
		return w.st.finish()
	}))
	require.NoError(t, g4.Err())
	require.Len(t, opened, 1)
}

// ForPlan keeps the devices and inherits the communication options unless
// it sets them.
func TestForPlanRankOptions(t *testing.T) {
	p2 := rankPlan(t, 2)
	g := fakeGPU(t, p2, GPUOptions{Devices: []int{0, 1}, Comm: CommLoopback, Timeout: time.Second}, 0, 1)
	require.Equal(t, CommLoopback, g.Comm())
	g4, err := g.ForPlan(rankPlan(t, 4), GPUOptions{})
	require.NoError(t, err)
	require.Equal(t, CommLoopback, g4.Comm())
	require.Equal(t, time.Second, g4.gopts.Timeout)
	require.Equal(t, []int{0, 0, 1, 1}, g4.RankDevices())
	gn, err := g.ForPlan(p2, GPUOptions{Comm: CommAuto})
	require.NoError(t, err)
	require.Equal(t, CommNCCL, gn.Comm())
	_, err = g.ForPlan(p2, GPUOptions{Devices: []int{1, 0}})
	require.ErrorContains(t, err, "ForPlan keeps the devices")
	_, err = g.ForPlan(rankPlan(t, 4), GPUOptions{Comm: CommNCCL})
	require.ErrorContains(t, err, "NCCL takes one GPU per rank")
	require.True(t, slices.Equal([]int{0, 1}, g4.Devices()))
}

// gatherComm is a communicator that can all-gather device memory, as
// comm.NCCLComm does: it records the deadline each call saw.
type gatherComm struct {
	comm.Communicator
	calls     int
	deadlines []bool
	err       error
}

func (c *gatherComm) AllGatherDevice(ctx context.Context, send, recv *loader.Buffer, stream *loader.Stream) error {
	c.calls++
	_, ok := ctx.Deadline()
	c.deadlines = append(c.deadlines, ok)
	if c.err != nil {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// The device all-gather is found through the run's timeout wrapper, which
// bounds it by the timeout and names comm.ErrTimeout when it runs out; the
// loopback (and a nil communicator) has none, so exchanges go through host
// memory; comm.NCCLComm has one.
func TestDeviceGatherOf(t *testing.T) {
	cs, err := comm.NewLoopback(1)
	require.NoError(t, err)
	defer func() { require.NoError(t, cs[0].Close()) }()
	require.Nil(t, deviceGatherOf(cs[0]))
	require.Nil(t, deviceGatherOf(nil))
	require.Nil(t, deviceGatherOf(&timeoutComm{Communicator: cs[0], d: time.Second}))
	var _ deviceGatherer = (*comm.NCCLComm)(nil)

	gc := &gatherComm{Communicator: cs[0]}
	g := deviceGatherOf(gc)
	require.NotNil(t, g)
	require.NoError(t, g(context.Background(), nil, nil, nil))
	g = deviceGatherOf(&timeoutComm{Communicator: gc, d: time.Minute})
	require.NotNil(t, g)
	require.NoError(t, g(context.Background(), nil, nil, nil))
	require.Equal(t, 2, gc.calls)
	require.Equal(t, []bool{false, true}, gc.deadlines, "the wrapper bounds the call")

	gc.err = errors.New("stuck")
	g = deviceGatherOf(&timeoutComm{Communicator: gc, d: 20 * time.Millisecond})
	err = g(context.Background(), nil, nil, nil)
	require.ErrorIs(t, err, comm.ErrTimeout)
	require.ErrorContains(t, err, "GPUOptions.Timeout 20ms")
}

// deviceTurns gives the ranks that share a device one turn between them and
// a rank alone on its device none.
func TestDeviceTurns(t *testing.T) {
	for _, tc := range []struct {
		devices []int
		same    [][]int // groups of rank indices sharing a turn
		none    []int   // rank indices without one
	}{
		{[]int{0, 0, 0, 0}, [][]int{{0, 1, 2, 3}}, nil},
		{[]int{0, 0, 1, 1}, [][]int{{0, 1}, {2, 3}}, nil},
		{[]int{0, 0, 1}, [][]int{{0, 1}}, []int{2}},
		{[]int{0, 1, 2}, nil, []int{0, 1, 2}},
		{[]int{3, 5, 3}, [][]int{{0, 2}}, []int{1}},
	} {
		turns := deviceTurns(tc.devices)
		require.Len(t, turns, len(tc.devices))
		for _, g := range tc.same {
			require.NotNil(t, turns[g[0]], "%v: rank index %d", tc.devices, g[0])
			for _, i := range g[1:] {
				assert.Equal(t, turns[g[0]], turns[i], "%v: rank indices %d and %d", tc.devices, g[0], i)
			}
		}
		for i, a := range tc.same {
			for _, b := range tc.same[i+1:] {
				assert.NotEqual(t, turns[a[0]], turns[b[0]], "%v: two devices, one turn", tc.devices)
			}
		}
		for _, i := range tc.none {
			assert.Nil(t, turns[i], "%v: rank index %d", tc.devices, i)
		}
	}
}

// serialForward is rank work that records, per device, which rank is doing
// device work (every moment of its run but its waits in a collective): a
// second rank of the device at work at the same time is an overlap. Where
// the ranks take turns (callRank takes the turn, turnComm gives it back for
// the collective) there is none.
func serialForward(owner []atomic.Int32, overlaps *atomic.Int32) func(ctx context.Context, w *rankWork) error {
	return func(ctx context.Context, w *rankWork) error {
		work := func() {
			if w.st.turn != nil {
				if prev := owner[w.device].Swap(int32(w.rank)); prev != -1 && prev != int32(w.rank) {
					overlaps.Add(1)
				}
			}
			time.Sleep(time.Millisecond) // room for another rank to slip in
		}
		for _, stage := range GPUForwardStages[1:] {
			if err := w.st.upTo(stage); err != nil {
				return err
			}
			work() // a stage's work, or an exchange's download
			if strings.HasPrefix(stage, "exchange") {
				owner[w.device].CompareAndSwap(int32(w.rank), -1) // turnComm gives the turn back
				if _, err := comm.AllGatherFloat32(ctx, w.cm, []float32{float32(w.rank)}); err != nil {
					return err
				}
				work() // the exchange's upload
			}
		}
		work()                                            // the downloads after the last stage
		owner[w.device].CompareAndSwap(int32(w.rank), -1) // callRank gives the turn back
		return nil
	}
}

// GPUOptions.SerialRanks: the ranks sharing a device never hold its turn at
// once, every rank still passes through every stage, a rank alone on its
// device takes no turn, and a rank failing inside its turn gives it back,
// so the others end with errors instead of waiting for ever.
func TestRunRanksSerial(t *testing.T) {
	p := rankPlan(t, 4)
	for _, tc := range []struct {
		devices []int
		ords    []int
		serial  bool
		turns   bool
	}{
		{[]int{0}, []int{0}, true, true},
		{[]int{0, 1}, []int{0, 1}, true, true},
		{[]int{0}, []int{0}, false, false},
	} {
		t.Run(fmt.Sprintf("devices %v serial %v", tc.devices, tc.serial), func(t *testing.T) {
			hook, stages := stageRecorder()
			g := fakeGPU(t, p, GPUOptions{Devices: tc.devices, StageHook: hook, SerialRanks: tc.serial}, tc.ords...)
			owner := make([]atomic.Int32, 2)
			for i := range owner {
				owner[i].Store(-1)
			}
			var overlaps atomic.Int32
			var turned atomic.Bool
			fn := serialForward(owner, &overlaps)
			require.NoError(t, g.runRanks(t.Context(), "forward", GPUForwardStages, true, func(ctx context.Context, w *rankWork) error {
				if w.st.turn != nil {
					turned.Store(true)
				}
				return fn(ctx, w)
			}))
			assert.Zero(t, overlaps.Load(), "ranks inside one device's turn at once")
			assert.Equal(t, tc.turns, turned.Load(), "ranks took turns")
			for r := range 4 {
				assert.Equal(t, GPUForwardStages, stages[r], "rank %d stages", r)
			}
		})
	}
	t.Run("a rank fails inside its turn", func(t *testing.T) {
		injected := errors.New("fault injected")
		fault := func(rank int, stage string) error {
			if rank == 1 && stage == "prep" {
				return injected
			}
			return nil
		}
		g := fakeGPU(t, p, GPUOptions{Devices: []int{0}, SerialRanks: true, fault: fault}, 0)
		owner := make([]atomic.Int32, 1)
		owner[0].Store(-1)
		var overlaps atomic.Int32
		done := make(chan error, 1)
		go func() {
			done <- g.runRanks(t.Context(), "forward", GPUForwardStages, true, serialForward(owner, &overlaps))
		}()
		select {
		case err := <-done:
			var re *RunError
			require.ErrorAs(t, err, &re, "%v", err)
			require.Equal(t, 1, re.First)
			require.ErrorIs(t, err, injected)
		case <-time.After(10 * time.Second):
			t.Fatal("the ranks still wait for the failed rank's turn after 10 s")
		}
	})
}
