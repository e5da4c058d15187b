package kcp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/fakecuda"
	"github.com/gdnkcp/gdnkcp/internal/fakenccl"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// fakeFaultCalls are the driver calls TestFakeDriverFaults fails: every
// call the GPU backend makes on its way that can fail, not the releases nor
// cuCtxSetCurrent, which releases make too (a failed free leaks by
// definition; the fake counts what is still held).
var fakeFaultCalls = []string{
	"cuDevicePrimaryCtxRetain", "cuDeviceGetAttribute", "cuModuleLoadDataEx", "cuModuleGetFunction",
	"cuFuncSetAttribute", "cuMemAlloc_v2", "cuMemHostAlloc", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyHtoDAsync_v2",
	"cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemsetD8Async", "cuMemsetD32Async", "cuStreamCreate",
	"cuStreamCreateWithPriority", "cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuStreamSynchronize",
	"cuEventSynchronize", "cuEventElapsedTime_v2", "cuLaunchKernel",
}

// fakeReleaseCalls are the releases TestFakeDriverFaults fails: each
// failure must reach the caller (a release's error is not dropped), with no
// panic; what the failed release held stays held, so the rest is not
// counted.
var fakeReleaseCalls = []string{
	"cuMemFree_v2", "cuMemFreeHost", "cuStreamDestroy_v2", "cuEventDestroy_v2", "cuModuleUnload",
	"cuDevicePrimaryCtxRelease_v2", "cuCtxSetCurrent",
}

// fakeFaultSamples is how many of a call's occurrences in one run are failed
// (all where there are fewer; else the first, the last and evenly between).
const fakeFaultSamples = 10

// TestFakeDriverFaults runs the GPU backend on internal/fakecuda's stand-in
// driver, on any machine with a C compiler (in a child process: the loader
// reads loader.EnvLibrary once): a module-stage plan over two ranks on one
// fake device, B1 (forward, backward) then B3 (checkpoint, recompute,
// backward; the first with every walk split between the widths on prioritised
// side streams), then B1 with the ranks on two fake devices, once as it is and
// then with one driver call failing at a time,
// each of fakeFaultCalls at up to fakeFaultSamples of its occurrences. Every
// failed run must return an error (no panic, no hang) that carries the
// driver's error for that call, and leave nothing held: every device
// allocation, host buffer, stream, event and module made is released.
// The kernels do not run (the fake's launches do nothing), so no result is
// checked; the GPU tests check those on a GPU. (Not named TestGPU...: the
// device scripts run those, and this one needs no GPU.)
func TestFakeDriverFaults(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverFaults", "FAKECUDA_DEVICES=2")
	if fk == nil {
		return
	}
	p := bwdPlan(t, []int{100, 70, 20}, 2, LayoutC, 2, 4)
	in, dout := RandomInputs(p, StageModule, 5)
	run := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		if err := fakeB1B3(p, in, dout); err != nil {
			return err
		}
		return fakeTwoDevices(p, in, dout)
	}

	held0 := fk.Held()
	before := fakeCallCounts(fk)
	require.NoError(t, run(), "a run with nothing failed")
	counts := fakeCallCounts(fk)
	for c := range counts {
		counts[c] -= before[c]
	}
	held := fk.Held()
	require.Equal(t, held0.Allocs, held.Allocs, "device allocations after a run")
	require.Equal(t, held0.HostBuffers, held.HostBuffers, "host buffers after a run")
	require.Equal(t, held0.Streams, held.Streams, "streams after a run")
	require.Equal(t, held0.Events, held.Events, "events after a run")
	t.Logf("fake driver: one run: %v", fakeCountsLine(counts))
	require.Positive(t, counts["cuLaunchKernel"], "the run launched kernels")

	runs := 0
	for _, call := range fakeFaultCalls {
		for _, nth := range fakeSamples(counts[call]) {
			code := fakecuda.ErrorOutOfMemory
			if call == "cuLaunchKernel" || strings.Contains(call, "Synchronize") {
				code = fakecuda.ErrorLaunchFailed
			}
			fk.Fail(call, nth, code)
			failures := fk.Failures()
			err := run()
			fk.Fail("", 0, 0)
			runs++
			if fk.Failures() == failures {
				continue // this run made fewer such calls (the ranks interleave): nothing failed
			}
			what := fmt.Sprintf("%s failing at call %d of %d", call, nth, counts[call])
			require.Error(t, err, "%s: the run reported nothing", what)
			require.NotContains(t, err.Error(), "panic:", what)
			var de *loader.Error
			require.ErrorAs(t, err, &de, "%s: %v", what, err)
			require.Equal(t, call, de.Call, "%s: %v", what, err)
			h := fk.Held()
			require.Equal(t, held, h, "%s: what the run left held (%v)", what, err)
		}
	}
	require.Zero(t, fk.BadFrees(), "frees of memory the driver never handed out")
	t.Logf("fake driver: %d runs with a failing call, each an error naming it, nothing left held", runs)

	// The releases: a failed one is reported, never dropped or a panic. What it held stays held, so each
	// run is measured against the one before it.
	release := 0
	for _, call := range fakeReleaseCalls {
		counts := fakeCallCounts(fk, call)
		require.NoError(t, run(), "a run with nothing failed")
		n := fakeCallCounts(fk, call)[call] - counts[call]
		for _, nth := range fakeSamples(n) {
			fk.Fail(call, nth, fakecuda.ErrorInvalidValue)
			failures := fk.Failures()
			err := run()
			fk.Fail("", 0, 0)
			if fk.Failures() == failures {
				continue
			}
			release++
			what := fmt.Sprintf("%s failing at call %d of %d", call, nth, n)
			require.Error(t, err, "%s: the run reported nothing", what)
			require.NotContains(t, err.Error(), "panic:", what)
			var de *loader.Error
			require.ErrorAs(t, err, &de, "%s: %v", what, err)
			require.Equal(t, call, de.Call, "%s: %v", what, err)
		}
	}
	t.Logf("fake driver: %d runs with a failing release, each reported", release)
}

// fakeChild runs test on the fake driver in a child process
// (fakecuda.RunChild, with env): in the parent it logs the child's "fake
// driver:" lines and returns nil (the test then returns); in the child it
// returns the fake's controls.
func fakeChild(t *testing.T, test string, env ...string) *fakecuda.Lib {
	t.Helper()
	so := fakecuda.InChild()
	if so == "" {
		out := fakecuda.RunChild(t, test, env...)
		for _, l := range strings.Split(out, "\n") {
			if _, msg, ok := strings.Cut(l, "fake driver:"); ok {
				t.Log("fake driver:" + msg)
			}
		}
		return nil
	}
	fk, err := fakecuda.Open(so)
	require.NoError(t, err)
	return fk
}

// fakeB1B3 is the scenario TestFakeDriverFaults fails, on the v5 kernels:
// B1 of plan p with every walk split between the widths
// (GPUOptions.SplitHeads, on prioritised side streams) and its ranks taking
// turns on the device (SerialRanks), then B3 at the rule's
// widths, every object closed whatever happens.
func fakeB1B3(p *Plan, in *Inputs, dout []float32) (err error) {
	g, err := fakeV5(p, GPUOptions{})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	split := GPUOptions{Options: Options{Stage: StageModule}, KeepDevice: true, SplitPriority: true, SerialRanks: true}
	split.SplitHeads = [sched.NumWalkKinds]int{1, 2, 3, 1}
	gs, err := g.ForPlan(p, split)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, gs.Close()) }()
	fs, err := fakeForwardBackward(gs, in, dout)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, fs.Close()) }()
	for r := range p.Ranks {
		if len(p.Ranks[r].Walk(sched.State)) > 0 && fs.Split[r][sched.State] == 0 {
			return fmt.Errorf("rank %d: the state walk did not run split", r)
		}
	}
	f, err := fakeForwardBackward(g, in, dout)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	return fakeB3(g, in, dout)
}

// fakeB3 is g's B3: checkpoint, recompute, backward, the recompute closed.
func fakeB3(g *GPU, in *Inputs, dout []float32) (err error) {
	ctx := context.Background()
	ck, err := g.ForwardCheckpoint(ctx, in)
	if err != nil {
		return err
	}
	f3, err := ck.Recompute(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f3.Close()) }()
	_, err = f3.Backward(ctx, dout)
	return err
}

// fakeTwoDevices is B1 of plan p with its two ranks on the fake's two
// devices, exchanging through host memory (each device loads its own module).
func fakeTwoDevices(p *Plan, in *Inputs, dout []float32) (err error) {
	g, err := fakeV5(p, GPUOptions{Devices: []int{0, 1}, Comm: CommLoopback})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	if d := g.RankDevices(); !slices.Equal(d, []int{0, 1}) {
		return fmt.Errorf("ranks on devices %v, want [0 1]", d)
	}
	f, err := fakeForwardBackward(g, in, dout)
	if err != nil {
		return err
	}
	return f.Close()
}

// fakeV5 opens plan p on the v5 kernels in the module stage, keeping the
// forward's device buffers, with o's devices and exchange.
func fakeV5(p *Plan, o GPUOptions) (*GPU, error) {
	o.Options, o.KeepDevice = Options{Stage: StageModule}, true
	if err := o.SetKernels("v5"); err != nil {
		return nil, err
	}
	return NewGPU(p, o)
}

// fakeForwardBackward is g's forward and its backward; the forward is the
// caller's to close.
func fakeForwardBackward(g *GPU, in *Inputs, dout []float32) (*GPUForward, error) {
	f, err := g.Forward(context.Background(), in)
	if err != nil {
		return nil, err
	}
	if _, err := f.Backward(context.Background(), dout); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return f, nil
}

// fakeCallCounts is the calls so far of each of calls (default
// fakeFaultCalls).
func fakeCallCounts(fk *fakecuda.Lib, calls ...string) map[string]int {
	if len(calls) == 0 {
		calls = fakeFaultCalls
	}
	m := map[string]int{}
	for _, c := range calls {
		m[c] = max(fk.Calls(c), 0)
	}
	return m
}

// fakeCountsLine renders counts in fakeFaultCalls' order.
func fakeCountsLine(counts map[string]int) string {
	var b strings.Builder
	for _, c := range fakeFaultCalls {
		fmt.Fprintf(&b, "%s %d, ", c, counts[c])
	}
	return strings.TrimSuffix(b.String(), ", ")
}

// fakeSamples is the occurrences (1-based) of a call made n times a run to
// fail: all of them up to fakeFaultSamples, else the first, the last and
// evenly spaced ones between.
func fakeSamples(n int) []int {
	if n <= fakeFaultSamples {
		s := make([]int, n)
		for i := range s {
			s[i] = i + 1
		}
		return s
	}
	s := make([]int, 0, fakeFaultSamples)
	for i := range fakeFaultSamples {
		s = append(s, 1+i*(n-1)/(fakeFaultSamples-1))
	}
	return slices.Compact(s)
}

// TestFakeDriverSplitStreams checks, on the fake driver's stream-order log
// (in a child process, as TestFakeDriverFaults), how a split state walk is
// launched (GPUForward's split, sched.Mixed's model): its vh = 128 launch,
// grid (T, S, W/S), is issued before its vh = 64 launch, grid (2T, S, HV -
// W/S); both start only after everything before them on the rank's stream
// (an event recorded there, which each side stream waits for); and the
// rank's stream waits for every side stream before its next launch (the
// output). Without GPUOptions.SplitPriority the vh = 128 launch goes on the
// rank's stream and the vh = 64 one on a side stream; with it both go on side
// streams, the vh = 128 one at the context's greatest priority. First, NewGPU
// and ForPlan refuse SplitHeads on the fp32 kernels, whose walks cannot split.
func TestFakeDriverSplitStreams(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverSplitStreams")
	if fk == nil {
		return
	}
	p := bwdPlan(t, []int{100, 70, 20}, 1, LayoutC, 2, 4) // one rank, three segments
	in, _ := RandomInputs(p, StageCore, 6)
	// The fp32 kernels' walks cannot split: NewGPU and ForPlan say so before anything runs.
	fp32, err := NewGPU(p, GPUOptions{Kernels: "fp32"})
	require.NoError(t, err)
	o32 := GPUOptions{Kernels: "fp32"}
	o32.SplitHeads[sched.Tape] = 1
	_, err = fp32.ForPlan(p, o32)
	require.ErrorContains(t, err, "GPUOptions.SplitHeads[tape] = 1: these kernels' tape walk runs at one width only")
	require.NoError(t, fp32.Close())
	_, err = NewGPU(p, o32)
	require.ErrorContains(t, err, "runs at one width only")

	var base GPUOptions
	require.NoError(t, base.SetKernels("v5"))
	g, err := NewGPU(p, base)
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Close()) }()
	for _, prio := range []bool{false, true} {
		t.Run(fmt.Sprintf("priority=%v", prio), func(t *testing.T) {
			o := GPUOptions{Options: Options{Stage: StageCore}, SplitPriority: prio}
			o.SplitHeads[sched.State] = 3
			gs, err := g.ForPlan(p, o)
			require.NoError(t, err)
			defer func() { require.NoError(t, gs.Close()) }()
			fk.ClearLog()
			f, err := gs.Forward(context.Background(), in)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			require.Equal(t, 3*3, f.Split[0][sched.State], "state walks at vh 128: 3 heads of 3 segments")
			require.Zero(t, fk.LogDropped(), "the fake's log kept every entry")
			ops := fk.Log(0)

			var walk []int // the state walk's launches
			for i, op := range ops {
				if op.Kind == fakecuda.OpLaunch && op.Function == entryStatePlanes {
					walk = append(walk, i)
				}
			}
			require.Len(t, walk, 2, "the split state walk's launches")
			w128, w64 := ops[walk[0]], ops[walk[1]]
			assert.Equal(t, [3]uint32{1, 3, 3}, w128.Grid, "vh 128: (T, S, W/S), issued first")
			assert.Equal(t, [3]uint32{2, 3, 1}, w64.Grid, "vh 64: (2T, S, HV - W/S)")
			// The rank's stream: the prep's, the launch before the walk's.
			prep := slices.IndexFunc(ops, func(op fakecuda.Op) bool {
				return op.Kind == fakecuda.OpLaunch && strings.HasPrefix(op.Function, "gdn_prep")
			})
			require.GreaterOrEqual(t, prep, 0, "the prep's launch")
			rank := ops[prep].Stream
			next := slices.IndexFunc(ops[walk[1]+1:], func(op fakecuda.Op) bool { return op.Kind == fakecuda.OpLaunch })
			require.GreaterOrEqual(t, next, 0, "a launch after the walk (the output)")
			next += walk[1] + 1
			assert.Equal(t, rank, ops[next].Stream, "the output on the rank's stream")

			sides := []fakecuda.Op{w64}
			if prio {
				assert.NotEqual(t, rank, w128.Stream, "vh 128 on a side stream")
				assert.Equal(t, -5, fk.StreamPriority(w128.Stream), "vh 128 at the greatest priority (the fake's range: 0 .. -5)")
				assert.Zero(t, fk.StreamPriority(w64.Stream), "vh 64 at the default priority")
				sides = append(sides, w128)
			} else {
				assert.Equal(t, rank, w128.Stream, "vh 128 on the rank's stream")
			}
			assert.NotEqual(t, rank, w64.Stream, "vh 64 on a side stream")
			assert.NotEqual(t, w128.Stream, w64.Stream)
			for _, side := range sides {
				at := slices.IndexFunc(ops, func(op fakecuda.Op) bool { return op == side })
				assert.True(t, fakeWaitsFor(ops, side.Stream, rank, prep, at),
					"the side stream of %v waits for an event recorded on the rank's stream after the prep", side.Grid)
				assert.True(t, fakeWaitsFor(ops, rank, side.Stream, at, next),
					"the rank's stream waits for the side stream of %v before the output", side.Grid)
			}
		})
	}
}

// fakeWaitsFor reports whether, in ops between indices lo and hi, stream
// waiter waits for an event recorded on stream on after lo (and before the
// wait).
func fakeWaitsFor(ops []fakecuda.Op, waiter, on uintptr, lo, hi int) bool {
	recorded := map[uintptr]bool{}
	for _, op := range ops[lo+1 : hi] {
		switch {
		case op.Kind == fakecuda.OpRecord && op.Stream == on:
			recorded[op.Event] = true
		case op.Kind == fakecuda.OpWait && op.Stream == waiter && recorded[op.Event]:
			return true
		}
	}
	return false
}

// TestFakeDriverKernels checks, on the fake driver (an H200's attributes;
// in a child process, as TestFakeDriverFaults), which kernels NewGPU runs
// for each way GPUOptions choose them: the zero value takes ChooseKernels'
// set (v5), a name its set, switches alone theirs; ForPlan keeps the base's
// and refuses another name; a bad choice fails before the driver is asked
// for anything.
func TestFakeDriverKernels(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverKernels")
	if fk == nil {
		return
	}
	p := bwdPlan(t, []int{100, 70}, 2, LayoutC, 2, 4)
	auto, autoWhy, err := ChooseKernels(0, "")
	require.NoError(t, err)
	require.Equal(t, "v5", auto, autoWhy)
	for _, c := range []struct {
		name      string
		o         GPUOptions
		set, why  string
		state     string // the state walk's entry
		splitable bool
	}{
		{"zero", GPUOptions{}, "v5", autoWhy, entryStatePlanes, true},
		{"auto", GPUOptions{Kernels: KernelsAuto, SplitGrads: true}, "v5", autoWhy, entryStatePlanes, true},
		{"fp32", GPUOptions{Kernels: "fp32"}, "fp32", "GPUOptions: fp32", entryState, false},
		{"mma", GPUOptions{Kernels: "mma"}, "mma", "GPUOptions: mma", entryStateMMA, false},
		{"custom", GPUOptions{TensorCoreWalks: true}, KernelsCustom, "GPUOptions: custom", entryStateTC, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := NewGPU(p, c.o)
			require.NoError(t, err)
			defer func() { require.NoError(t, g.Close()) }()
			set, why := g.Kernels()
			require.Equal(t, [2]string{c.set, c.why}, [2]string{set, why})
			require.Equal(t, c.state, g.dev.ks.state)
			require.Equal(t, c.o.SplitGrads, g.gopts.SplitGrads)
			var split GPUOptions
			split.SplitHeads[sched.State] = 1
			gs, err := g.ForPlan(p, split)
			if !c.splitable {
				require.ErrorContains(t, err, "runs at one width only")
			} else {
				require.NoError(t, err)
				require.Equal(t, [2]string{set, why}, func() [2]string { s, w := gs.Kernels(); return [2]string{s, w} }())
				require.NoError(t, gs.Close())
			}
			other := "tc"
			if set == "tc" {
				other = "fp32"
			}
			_, err = g.ForPlan(p, GPUOptions{Kernels: other})
			require.ErrorContains(t, err, "ForPlan keeps the devices, blob and kernels")
			if set != KernelsCustom {
				same, err := g.ForPlan(p, GPUOptions{Kernels: set})
				require.NoError(t, err)
				require.NoError(t, same.Close())
			}
			auto, err := g.ForPlan(p, GPUOptions{Kernels: KernelsAuto}) // g's choice, whatever it was
			require.NoError(t, err)
			require.Equal(t, [2]string{set, why}, func() [2]string { s, w := auto.Kernels(); return [2]string{s, w} }())
			require.NoError(t, auto.Close())
		})
	}
	calls := fk.Calls("cuDeviceGetAttribute")
	_, err = NewGPU(p, GPUOptions{Kernels: "v5", TensorCoreChunk: true})
	require.ErrorContains(t, err, `GPUOptions.Kernels "v5" and the kernel switches set (those of custom) disagree`)
	_, err = NewGPU(p, GPUOptions{Kernels: "fast"})
	require.ErrorContains(t, err, `GPUOptions.Kernels: kcp: kernel set "fast"`)
	require.Equal(t, calls, fk.Calls("cuDeviceGetAttribute"), "refused before the driver is asked")
	held := fk.Held()
	require.Zero(t, held.Allocs+held.Modules+held.Streams, "everything released: %+v", held)
}

// TestFakeDriverRandomPlans runs the GPU backend's host side on the fake
// driver (in a child process, as TestFakeDriverFaults) over 80 random plans:
// 1-6 documents of 1-300 tokens, 1-8 ranks (empty ranks included) on one fake
// device or two, every layout, both stages, value heads 2-6 over 1-2 QK heads, walk widths by the
// rule, forced to 64 or 128, or split (SplitHeads, the model unless SingleWidth), launch or
// dispatch order: forward, backward, checkpoint, recompute and backward
// again. Each must run without an error (the fake checks every launch's grid,
// block and shared memory against an H200's limits), and leave nothing held.
// The kernels do not run, so no value is checked.
func TestFakeDriverRandomPlans(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverRandomPlans", "FAKECUDA_DEVICES=2")
	if fk == nil {
		return
	}
	held0 := fk.Held()
	r := rand.New(rand.NewPCG(29, 12))
	heads := [][2]int{{1, 2}, {1, 3}, {2, 4}, {2, 6}, {1, 1}}
	launches := 0
	for it := range 80 {
		docs := make([]int, 1+r.IntN(6))
		for i := range docs {
			docs[i] = 1 + r.IntN(300)
		}
		R, layout, hd := 1+r.IntN(8), Layouts()[r.IntN(3)], heads[r.IntN(len(heads))]
		stage := []Stage{StageCore, StageModule}[r.IntN(2)]
		p, err := NewPlan(PlanConfig{Docs: docs, Ranks: R, Layout: layout, HQK: hd[0], HV: hd[1], DK: 128, DV: 128})
		require.NoError(t, err)
		o := GPUOptions{Kernels: "v5", Options: Options{Stage: stage}, KeepDevice: true, LaunchOrder: r.IntN(4) == 0}
		if r.IntN(3) == 0 {
			o.Devices, o.Comm = []int{0, 1}, CommLoopback // the ranks in two blocks over two fake devices
		}
		switch r.IntN(4) {
		case 0:
			o.ForceVH = []int{64, 128}[r.IntN(2)]
		case 1:
			if hd[1] > 1 {
				for k := range o.SplitHeads {
					o.SplitHeads[k] = 1 + r.IntN(hd[1]-1)
				}
				o.SplitPriority = r.IntN(2) == 0
			}
		case 2:
			o.SingleWidth = true
		}
		o.SerialRanks = it%3 == 1 // not a draw: the plans stay those of the seed
		what := fmt.Sprintf("plan %d: docs %v, R %d, layout %s, heads %v, %s, split %v, devices %v, serial %v", it, docs, R, layout, hd,
			stage, o.SplitHeads, o.Devices, o.SerialRanks)
		in, dout := RandomInputs(p, stage, uint64(it))
		fk.ClearLog()
		err = func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
				}
			}()
			g, err := NewGPU(p, o)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, g.Close()) }()
			f, err := fakeForwardBackward(g, in, dout)
			if err != nil {
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			return fakeB3(g, in, dout)
		}()
		require.NoError(t, err, what)
		require.Equal(t, held0, fk.Held(), "%s: held after the run", what)
		require.Zero(t, fk.LogDropped(), "%s: the fake's log overflowed", what)
		launches += fk.LogLen()
	}
	require.Zero(t, fk.BadFrees())
	t.Logf("fake driver: 80 random plans, forward, backward, checkpoint, recompute: %d log entries, nothing held", launches)
}

// TestFakeDriverConcurrent runs four B1s and four B3s of one GPU backend at
// once (GPU is documented safe for concurrent use: each run allocates its own
// buffers and streams) on the fake driver, over a loopback of two ranks and,
// through ForPlan, a plan of another rank count: every run without an error
// and nothing held afterwards. Under -race it checks the host side's sharing
// (the blobs, the dispatch-order and split caches, the stagers).
func TestFakeDriverConcurrent(t *testing.T) {
	fk := fakeChild(t, "TestFakeDriverConcurrent")
	if fk == nil {
		return
	}
	held0 := fk.Held()
	p2 := bwdPlan(t, []int{300, 70, 200}, 2, LayoutD, 2, 4)
	p3 := bwdPlan(t, []int{300, 70, 200}, 3, LayoutZ, 2, 4)
	g, err := fakeV5(p2, GPUOptions{})
	require.NoError(t, err)
	g3, err := g.ForPlan(p3, GPUOptions{Options: Options{Stage: StageModule}, KeepDevice: true})
	require.NoError(t, err)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			be, p := g, p2
			if i%2 == 1 {
				be, p = g3, p3
			}
			in, dout := RandomInputs(p, StageModule, uint64(i))
			if i < 4 {
				f, err := fakeForwardBackward(be, in, dout)
				if err == nil {
					err = f.Close()
				}
				errs[i] = err
				return
			}
			errs[i] = fakeB3(be, in, dout)
		})
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "run %d", i)
	}
	require.NoError(t, g3.Close())
	require.NoError(t, g.Close())
	require.Equal(t, held0, fk.Held(), "held after the runs")
	t.Logf("fake driver: 8 concurrent runs on one backend, nothing held")
}

// TestFakeDriverMultiLoopback runs TestGPUMultiLoopback, which needs two
// GPUs (the device machine seldom lends them), on two fake devices: CP 4 and
// 8 over both, every layout, B1 and B3, with the rank digests (the fake
// computes nothing, so the runs' bits agree as the test requires). It found
// the empty ranks' missing digests.
func TestFakeDriverMultiLoopback(t *testing.T) {
	out := fakecuda.RunChild(t, "TestGPUMultiLoopback", "FAKECUDA_DEVICES=2")
	require.Contains(t, out, "--- PASS: TestGPUMultiLoopback", out)
	require.NotContains(t, out, "--- SKIP", out)
}

// TestFakeDriverMultiNCCL runs the NCCL tests of the GPU backend, which need
// two GPUs and NCCL (TestGPUMultiNCCL: NCCL on two GPUs against the loopback
// on one, device and host exchanges; TestGPUMultiProcessPerRank: a backend a
// rank over one NCCL group; TestGPUMultiFaults: a rank failing mid-run over
// NCCL, the loopback and a process a rank), on two fake devices and a fake
// NCCL whose all-gathers really gather (internal/fakenccl).
func TestFakeDriverMultiNCCL(t *testing.T) {
	so, err := fakenccl.Build(t.TempDir())
	if errors.Is(err, fakenccl.ErrUnsupported) {
		t.Skipf("the fake NCCL: %v", err)
	}
	require.NoError(t, err)
	out := fakecuda.RunChild(t, "(TestGPUMultiNCCL|TestGPUMultiProcessPerRank|TestGPUMultiFaults)", "FAKECUDA_DEVICES=2",
		fakenccl.EnvLibrary+"="+so)
	for _, name := range []string{"TestGPUMultiNCCL", "TestGPUMultiProcessPerRank", "TestGPUMultiFaults"} {
		require.Contains(t, out, "--- PASS: "+name+" ", out)
	}
	require.NotContains(t, out, "--- SKIP", out)
}
