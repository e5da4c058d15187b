package kcp

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/fakecuda"
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
	so := fakecuda.InChild()
	if so == "" {
		out := fakecuda.RunChild(t, "TestFakeDriverFaults", "FAKECUDA_DEVICES=2")
		for _, l := range strings.Split(out, "\n") {
			if _, msg, ok := strings.Cut(l, "fake driver:"); ok {
				t.Log("fake driver:" + msg)
			}
		}
		return
	}
	fk, err := fakecuda.Open(so)
	require.NoError(t, err)
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

// fakeB1B3 is the scenario TestFakeDriverFaults fails, on the v5 kernels:
// B1 of plan p with
// every walk split between the widths (GPUOptions.SplitHeads, on prioritised
// side streams), then B3 at the rule's widths, every object closed whatever
// happens.
func fakeB1B3(p *Plan, in *Inputs, dout []float32) (err error) {
	ctx := context.Background()
	opts := GPUOptions{Options: Options{Stage: StageModule}, KeepDevice: true}
	if err := opts.SetKernels("v5"); err != nil {
		return err
	}
	g, err := NewGPU(p, opts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	split := GPUOptions{Options: Options{Stage: StageModule}, KeepDevice: true, SplitPriority: true}
	split.SplitHeads = [sched.NumWalkKinds]int{1, 2, 3, 1}
	gs, err := g.ForPlan(p, split)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, gs.Close()) }()
	b1 := func(g *GPU) (*GPUForward, error) { // forward and backward; the forward for the caller to close
		f, err := g.Forward(ctx, in)
		if err != nil {
			return nil, err
		}
		if _, err := f.Backward(ctx, dout); err != nil {
			return nil, errors.Join(err, f.Close())
		}
		return f, nil
	}
	fs, err := b1(gs)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, fs.Close()) }()
	for r := range p.Ranks {
		if len(p.Ranks[r].Walk(sched.State)) > 0 && fs.Split[r][sched.State] == 0 {
			return fmt.Errorf("rank %d: the state walk did not run split", r)
		}
	}
	f, err := b1(g)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
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
	opts := GPUOptions{Options: Options{Stage: StageModule}, KeepDevice: true, Devices: []int{0, 1}, Comm: CommLoopback}
	if err := opts.SetKernels("v5"); err != nil {
		return err
	}
	g, err := NewGPU(p, opts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, g.Close()) }()
	if d := g.RankDevices(); !slices.Equal(d, []int{0, 1}) {
		return fmt.Errorf("ranks on devices %v, want [0 1]", d)
	}
	f, err := g.Forward(context.Background(), in)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	_, err = f.Backward(context.Background(), dout)
	return err
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
