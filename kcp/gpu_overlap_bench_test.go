package kcp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/stats"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// The overlap probes measure the premise of docs/mma-kernels.md's "consumers
// behind the walks" note: at 32K tokens in one document the vh 64 walks run
// 96 CTAs, one an SM, and leave the H200's other SMs idle, where the stage
// after each walk could run. No kernel or library change: probes for a design
// decision. GDNKCP_OVERLAP_DOCS sets the pack (comma-separated document
// lengths; default 32768). On the GPU machine (scripts/overlap-probe.sh):
//
//	(cd kcp && ../.gpu/kcp.test -test.run '^$' -test.bench Overlap -test.benchtime 20x)

// overlapForward runs the probes' forward: one rank, v5 kernels, every walk
// at vh 64, kept on the device (closed when b ends); dout is a backward's
// input for it.
func overlapForward(b *testing.B) (f *GPUForward, dout []float32) {
	b.Helper()
	if _, err := loader.DeviceCount(); err != nil {
		b.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	docs := []int{32768}
	if s := os.Getenv("GDNKCP_OVERLAP_DOCS"); s != "" {
		docs = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				b.Fatalf("GDNKCP_OVERLAP_DOCS: %q is not a document length", f)
			}
			docs = append(docs, n)
		}
	}
	p, err := NewPlan(PlanConfig{Docs: docs, Ranks: 1, Layout: LayoutC, HQK: 16, HV: 48, DK: 128, DV: 128})
	if err != nil {
		b.Fatal(err)
	}
	// Every walk at vh 64 (ForceVH): the width the probes' flagged entries take, and the one the rule picks
	// for the state walk at 32K on the H200.
	opts := GPUOptions{Options: Options{Stage: StageCore, ForceVH: overlapVH}, KeepDevice: true}
	if err := opts.SetKernels("v5"); err != nil {
		b.Fatal(err)
	}
	g, err := NewGPU(p, opts)
	if err != nil {
		b.Skipf("needs blobs with the v5 kernels: %v", err)
	}
	b.Cleanup(func() {
		if err := g.Close(); err != nil {
			b.Error(err)
		}
	})
	in, dout := RandomInputs(p, StageCore, 11)
	f, err = g.Forward(context.Background(), in)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { // before g's: cleanups run last added first
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	})
	return f, dout
}

// launcher launches one kernel on a stream.
type launcher func(s *loader.Stream) error

// streamPair times two kernels A and B alone and together: A on the rank's
// stream s1, B on s1 alone or on s2 beside A, both after one start event.
type streamPair struct {
	s1, s2 *loader.Stream
	ev     [4]*loader.Event // start, A's end, B's end, end
}

func newStreamPair(ctx *loader.Context, s1 *loader.Stream) (sp *streamPair, err error) {
	sp = &streamPair{s1: s1}
	defer func() {
		if err != nil {
			err = errors.Join(err, sp.close())
		}
	}()
	if sp.s2, err = ctx.NewStream(loader.StreamNonBlocking); err != nil {
		return nil, err
	}
	for i := range sp.ev {
		if sp.ev[i], err = ctx.NewEvent(loader.EventDefault); err != nil {
			return nil, err
		}
	}
	return sp, nil
}

func (sp *streamPair) close() error {
	var errs []error
	for _, e := range sp.ev {
		if e != nil {
			errs = append(errs, e.Close())
		}
	}
	if sp.s2 != nil {
		errs = append(errs, sp.s2.Close())
	}
	return errors.Join(errs...)
}

// run launches A (on s1) where runA, B where runB (on s2 beside A, B first
// where bFirst), and returns the times from the start to the end of both and
// to A's end.
func (sp *streamPair) run(a, b launcher, runA, runB, bFirst bool) (total, aEnd float64, err error) {
	start, aDone, bDone := sp.ev[0], sp.ev[1], sp.ev[2]
	if err := start.Record(sp.s1); err != nil {
		return 0, 0, err
	}
	bs := sp.s1
	if runA && runB {
		bs = sp.s2
		if err := bs.WaitEvent(start); err != nil {
			return 0, 0, err
		}
	}
	launchA := func() error {
		if err := a(sp.s1); err != nil {
			return err
		}
		return aDone.Record(sp.s1)
	}
	launchB := func() error {
		if err := b(bs); err != nil {
			return err
		}
		if err := bDone.Record(bs); err != nil {
			return err
		}
		if bs != sp.s1 {
			return sp.s1.WaitEvent(bDone)
		}
		return nil
	}
	var steps []func() error
	if runB && bFirst {
		steps = append(steps, launchB)
	}
	if runA {
		steps = append(steps, launchA)
	}
	if runB && !bFirst {
		steps = append(steps, launchB)
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return 0, 0, err
		}
	}
	return sp.finish(runA)
}

// finish records the end event on s1, waits for it and returns the times
// from the start event to it and, where A ran, to A's end.
func (sp *streamPair) finish(aRan bool) (total, aEnd float64, err error) {
	start, aDone, end := sp.ev[0], sp.ev[1], sp.ev[3]
	if err := end.Record(sp.s1); err != nil {
		return 0, 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, 0, err
	}
	t, err := loader.ElapsedMillis(start, end)
	if err != nil {
		return 0, 0, err
	}
	var w float32
	if aRan {
		if w, err = loader.ElapsedMillis(start, aDone); err != nil {
			return 0, 0, err
		}
	}
	return float64(t), float64(w), nil
}

// pairTimes are the medians of the four ways a streamPair runs A and B.
type pairTimes struct {
	a, b, ab, ba float64 // A alone, B alone, A then B beside it, B then A beside it
	aInAB        float64 // A's own time beside B
}

// timePair runs each way reps times after two warm-up runs and calls check
// after each way's runs (nil: no check).
func (sp *streamPair) timePair(a, b launcher, reps int, check func(way string) error) (pairTimes, error) {
	var pt pairTimes
	for _, w := range []struct {
		name               string
		runA, runB, bFirst bool
		total, aEnd        *float64
	}{
		{"A", true, false, false, &pt.a, nil},
		{"B", false, true, false, &pt.b, nil},
		{"A+B", true, true, false, &pt.ab, &pt.aInAB},
		{"B+A", true, true, true, &pt.ba, nil},
	} {
		var tot, aEnd []float64
		for i := 0; i < reps+2; i++ {
			t, ae, err := sp.run(a, b, w.runA, w.runB, w.bFirst)
			if err != nil {
				return pt, fmt.Errorf("%s: %w", w.name, err)
			}
			if i >= 2 {
				tot, aEnd = append(tot, t), append(aEnd, ae)
			}
		}
		*w.total = stats.Median(tot)
		if w.aEnd != nil {
			*w.aEnd = stats.Median(aEnd)
		}
		if check != nil {
			if err := check(w.name); err != nil {
				return pt, err
			}
		}
	}
	return pt, nil
}

// report reports pt's medians with the given names for A and B.
func (pt pairTimes) report(b *testing.B, nameA, nameB string) {
	b.ReportMetric(pt.a, nameA+"-ms")
	b.ReportMetric(pt.b, nameB+"-ms")
	b.ReportMetric(pt.ab, nameA+"+"+nameB+"-ms")
	b.ReportMetric(pt.aInAB, nameA+"-beside-ms")
	b.ReportMetric(pt.ba, nameB+"+"+nameA+"-ms")
	b.ReportMetric(pt.a+pt.b-pt.ab, "saved-ms")
}

// BenchmarkGPUWalkOutputOverlap, on a forward kept on the device (its H16
// and V'16 written): A = the state walk (gdn_state_walk_planes, the forward
// alone's arguments), B = the output (gdn_output_mma16gn); alone, together
// on two streams (the output's CTAs take the SMs the walk leaves free, then
// the rest as it ends) in both launch orders: the pair's time, the walk's own
// beside the output (whether the output's traffic slows it) and the saving
// against the two in sequence. The walk rewrites H16 and V'16 with the bits
// they hold, so the output must keep the output alone's bits (checked).
//
// Then "flags", the design itself, where the blob has its two entries
// (ptx/staging/parked's walk_consumer_flags.patch; skipped otherwise): the walk
// publishing each chunk (gdn_state_walk_planes_f), a "behind" grid of
// gdn_output_mma16gn_claim on the SMs the walk leaves free beside it on a
// second stream, then a full grid after the walk, sharing one claim counter.
// H16 and V'16 are poisoned before each of its runs and the output compared
// after each: a chunk read before its flag fails.
func BenchmarkGPUWalkOutputOverlap(b *testing.B) {
	f, _ := overlapForward(b)
	pr, err := newOverlapProbe(f)
	if err != nil {
		b.Skip(err)
	}
	defer func() {
		if err := pr.close(); err != nil {
			b.Error(err)
		}
	}()
	b.Logf("%d chunks; walk grid %v (%d CTAs), output grid %v, %d SMs", pr.rk.tb.NC, pr.walkGrid,
		pr.walkGrid[0]*pr.walkGrid[1]*pr.walkGrid[2], pr.outGrid, pr.rk.dev.profile.SMs)
	ref, err := pr.output()
	if err != nil {
		b.Fatal(err)
	}
	same := func(way string) error {
		got, err := pr.output()
		if err != nil {
			return err
		}
		if !slices.Equal(got, ref) {
			return fmt.Errorf("%s: the output differs from the output alone's bits", way)
		}
		return nil
	}
	pt, err := pr.sp.timePair(pr.launchWalk, pr.launchOutput, b.N, same)
	if err != nil {
		b.Fatal(err)
	}
	pt.report(b, "walk", "output")
	if pr.walkF == nil {
		b.Logf("flags: the blob has no %s / %s (walk_consumer_flags.patch not built): not run", entryStateWalkFlags,
			entryOutputClaim)
		return
	}
	var tot, walk []float64
	for i := 0; i < b.N+2; i++ {
		t, w, err := pr.runFlags()
		if err != nil {
			b.Fatal(err)
		}
		if i >= 2 {
			tot, walk = append(tot, t), append(walk, w)
		}
		if err := same(fmt.Sprintf("flags, run %d (a chunk read before its flag?)", i)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(stats.Median(tot), "flags-ms")
	b.ReportMetric(stats.Median(walk), "flags-walk-ms")
	b.ReportMetric(pt.a+pt.b-stats.Median(tot), "flags-saved-ms")
}

// The entries of ptx/staging/parked's walk_consumer_flags.patch, which the probe
// resolves itself where the blob has them.
const (
	entryStateWalkFlags = "gdn_state_walk_planes_f"
	entryOutputClaim    = "gdn_output_mma16gn_claim"
	entryTapeWalkFlags  = "gdn_tape_walk_planes_f"
	entryGradsClaim     = "gdn_chunk_grads_mma8_claim"
	// claimSlotBytes: a claiming consumer's dynamic shared memory is its
	// body's and this much past it, for the item a CTA claimed
	// (kOutputClaimSmem, kGradClaimSmem in the patch).
	claimSlotBytes = 16
)

// overlapProbe holds what BenchmarkGPUWalkOutputOverlap launches: a kept
// forward's rank 0, the stream pair, the walk's and the output's launches.
type overlapProbe struct {
	rk                *gpuRank
	f                 *GPUForward
	sp                *streamPair
	walkGrid, outGrid [3]uint32
	walkSmem, outSmem int
	// The flagged form (nil walkF: the blob lacks it): the entries, the
	// flags and claim counter (zeroed before each run), and the CTAs of the
	// behind and the full claiming launches.
	walkF, outClaim          *loader.Function
	ready, claim             *loader.Buffer
	readyWords               int
	behindBlocks, fullBlocks int
}

// overlapVH is the walk width the probes launch: the one the width rule
// picks at 32K on the H200.
const overlapVH = 64

func newOverlapProbe(f *GPUForward) (pr *overlapProbe, err error) {
	if len(f.ranks) != 1 || f.ranks[0] == nil {
		return nil, errors.New("overlap probe: needs the kept forward's one rank")
	}
	rk := f.ranks[0]
	ks := rk.dev.ks
	if !ks.planes || !rk.normQK || rk.wp == nil || rk.wk == nil || rk.h16 == nil || rk.vnew16 == nil {
		return nil, fmt.Errorf("overlap probe: needs the v5 plane walks and the bf16 H / V' (kernels %+v)", ks)
	}
	pr = &overlapProbe{
		rk: rk, f: f,
		walkGrid: [3]uint32{uint32(gpuD / overlapVH), uint32(rk.tb.NS), uint32(f.plan.Config.HV)}, walkSmem: ks.walkSmem(overlapVH),
		outGrid: [3]uint32{uint32(rk.tb.NC), uint32(f.plan.Config.HQK), 1}, outSmem: ks.outputSmem,
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, pr.close())
		}
	}()
	if pr.sp, err = newStreamPair(rk.dev.ctx, rk.stream); err != nil {
		return nil, err
	}
	if err := pr.openFlags(); err != nil {
		return nil, err
	}
	return pr, nil
}

// walkArgs are the state walk's arguments as the forward alone passes them
// (no fp32 H or V', no token slots, launch order).
func (pr *overlapProbe) walkArgs() *loader.Args {
	rk, cfg := pr.rk, pr.f.plan.Config
	return argsStatePlanes(rk.wp.Ptr(), rk.kRaw, rk.kSt, rk.kRstd.Ptr(), rk.u.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(),
		rk.chunkLen.Ptr(), rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.start.Ptr(), 0, 0, rk.final.Ptr(), rk.h16.Ptr(),
		rk.vnew16.Ptr(), cfg.HQK, cfg.HV, overlapVH, 0, 0)
}

// outArgs are gdn_output_mma16gn's arguments.
func (pr *overlapProbe) outArgs() *loader.Args {
	rk, cfg := pr.rk, pr.f.plan.Config
	return argsOutputGN(rk.qRaw, rk.wk.Ptr(), rk.qSt, !pr.f.opts.NoL2Norm, rk.gcum.Ptr(), rk.vnew16.Ptr(), rk.h16.Ptr(),
		rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(), rk.o.Ptr(), cfg.HQK, cfg.HV, gpuScale(pr.f.opts))
}

func (pr *overlapProbe) launchWalk(s *loader.Stream) error {
	return launchOn(pr.rk.dev, s, 0, pr.rk.dev.ks.state, pr.walkGrid, pr.walkSmem, pr.walkArgs())
}

func (pr *overlapProbe) launchOutput(s *loader.Stream) error {
	return launchOn(pr.rk.dev, s, 0, entryOutputMMA16GN, pr.outGrid, pr.outSmem, pr.outArgs())
}

// openFlags resolves the flagged form's entries where the blob has them and
// makes its buffers.
func (pr *overlapProbe) openFlags() error {
	rk := pr.rk
	walkF, err := rk.dev.kernels.Function(entryStateWalkFlags)
	if err != nil {
		return nil // not built: the flags case is not run
	}
	outClaim, err := rk.dev.kernels.Function(entryOutputClaim)
	if err != nil {
		return nil
	}
	if err := walkF.SetMaxDynamicSharedMemory(pr.walkSmem); err != nil {
		return err
	}
	if err := outClaim.SetMaxDynamicSharedMemory(pr.outSmem + claimSlotBytes); err != nil {
		return err
	}
	pr.readyWords = rk.tb.NC * pr.f.plan.Config.HV
	if pr.ready, err = loader.AllocFor[uint32](rk.dev.ctx, pr.readyWords); err != nil {
		return err
	}
	if pr.claim, err = loader.AllocFor[uint32](rk.dev.ctx, 1); err != nil {
		return err
	}
	sms := rk.dev.profile.SMs
	walkCTAs := int(pr.walkGrid[0] * pr.walkGrid[1] * pr.walkGrid[2])
	pr.behindBlocks = max(sms-walkCTAs, 0) // one a free SM: fits beside the whole walk however the GPU places it
	pr.fullBlocks = 2 * sms                // two CTAs an SM
	pr.walkF, pr.outClaim = walkF, outClaim
	return nil
}

// runFlags runs the flagged form (claimedPair.run) with H16 and V'16
// poisoned first: the walk rewrites them, so an output item computed before
// its chunk's flag reads NaN and the comparison after the run fails.
func (pr *overlapProbe) runFlags() (total, walkEnd float64, err error) {
	cfg := pr.f.plan.Config
	cp := &claimedPair{
		sp: pr.sp, dev: pr.rk.dev, ready: pr.ready, claim: pr.claim, readyWords: pr.readyWords,
		poison:   []*loader.Buffer{pr.rk.h16, pr.rk.vnew16},
		producer: pr.walkF, prodGrid: pr.walkGrid, prodSmem: pr.walkSmem, prodArgs: pr.walkArgs().DevicePtr(pr.ready.Ptr()),
		consumer: pr.outClaim, consSmem: pr.outSmem + claimSlotBytes, behind: pr.behindBlocks, full: pr.fullBlocks,
		consArgs: pr.outArgs().DevicePtr(pr.ready.Ptr()).I32(int32(gpuD / overlapVH)).DevicePtr(pr.claim.Ptr()).
			I32(int32(pr.rk.tb.NC * cfg.HQK)),
	}
	return cp.run()
}

// claimedPair is the design's launch sequence: a producer walk that
// publishes each chunk into ready, and a claiming consumer, a "behind" grid
// of it beside the walk on s2 (where behind > 0) and a full grid after the
// walk on s1, sharing the claim counter.
type claimedPair struct {
	sp                 *streamPair
	dev                *gpuDevice
	ready, claim       *loader.Buffer
	readyWords         int
	poison             []*loader.Buffer // the walk's outputs the consumer reads, poisoned (bf16 NaN) before each run
	producer, consumer *loader.Function
	prodGrid           [3]uint32
	prodSmem, consSmem int
	prodArgs, consArgs *loader.Args
	behind, full       int // the consumer's CTAs beside the walk and after it
}

// run zeroes the flags and the counter, poisons the consumer's inputs, then
// launches the three; it returns the times from the start to the end of all
// of them and to the walk's end.
func (cp *claimedPair) run() (total, walkEnd float64, err error) {
	sp := cp.sp
	start, wEnd, cEnd := sp.ev[0], sp.ev[1], sp.ev[2]
	if err := poisonOn(cp.dev, sp.s1, 0, cp.ready, cp.readyWords, 0); err != nil {
		return 0, 0, err
	}
	if err := poisonOn(cp.dev, sp.s1, 0, cp.claim, 1, 0); err != nil {
		return 0, 0, err
	}
	for _, buf := range cp.poison {
		if err := poisonOn(cp.dev, sp.s1, 0, buf, buf.Size()/4, 0x7fc07fc0); err != nil {
			return 0, 0, err
		}
	}
	block := [3]uint32{gpuBlock, 1, 1}
	if err := start.Record(sp.s1); err != nil {
		return 0, 0, err
	}
	if err := loader.Launch(sp.s1, cp.producer, cp.prodGrid, block, uint32(cp.prodSmem), cp.prodArgs); err != nil {
		return 0, 0, fmt.Errorf("the flagged walk: %w", err)
	}
	if err := wEnd.Record(sp.s1); err != nil {
		return 0, 0, err
	}
	if cp.behind > 0 {
		if err := sp.s2.WaitEvent(start); err != nil {
			return 0, 0, err
		}
		if err := loader.Launch(sp.s2, cp.consumer, [3]uint32{uint32(cp.behind), 1, 1}, block, uint32(cp.consSmem), cp.consArgs); err != nil {
			return 0, 0, fmt.Errorf("the claiming consumer (behind): %w", err)
		}
		if err := cEnd.Record(sp.s2); err != nil {
			return 0, 0, err
		}
	}
	if err := loader.Launch(sp.s1, cp.consumer, [3]uint32{uint32(cp.full), 1, 1}, block, uint32(cp.consSmem), cp.consArgs); err != nil {
		return 0, 0, fmt.Errorf("the claiming consumer (full): %w", err)
	}
	if cp.behind > 0 {
		if err := sp.s1.WaitEvent(cEnd); err != nil {
			return 0, 0, err
		}
	}
	return sp.finish(true)
}

func (pr *overlapProbe) close() error {
	var errs []error
	for _, buf := range []*loader.Buffer{pr.ready, pr.claim} {
		if buf != nil {
			errs = append(errs, buf.Free())
		}
	}
	if pr.sp != nil {
		errs = append(errs, pr.sp.close())
	}
	return errors.Join(errs...)
}

// output reads the rank's bf16 output back.
func (pr *overlapProbe) output() ([]bf16.BF16, error) {
	if err := pr.sp.s1.Synchronize(); err != nil {
		return nil, err
	}
	o := make([]bf16.BF16, pr.rk.o.Size()/2)
	if err := loader.CopyFromDevice(pr.rk.o, o); err != nil {
		return nil, err
	}
	return o, nil
}

// BenchmarkGPUTapeGradsOverlap is BenchmarkGPUWalkOutputOverlap's first part
// for the backward: A = the tape walk, B = the chunk gradients
// (gdn_chunk_grads_mma8), replayed with the arguments of a B1 backward at its
// end (bwdProbeHook, before its buffers are freed). The tape walk rewrites D16
// and dV'16 with the bits they hold, so the gradients must keep their bits
// (dq, dk, dv, dg, dbeta, checked after each way).
func BenchmarkGPUTapeGradsOverlap(b *testing.B) {
	f, dout := overlapForward(b)
	var pt pairTimes
	var flags []float64 // the flagged form's medians: total, the tape walk's end (nil: not run)
	ran := false
	bwdProbeHook = func(br *bwdRun) error {
		ks := br.rk.dev.ks
		var tape, grads *recordedLaunch
		for i := range br.launches {
			switch l := &br.launches[i]; {
			case l.entry == ks.tapeEntry(64) || l.entry == ks.tapeEntry(128):
				tape = l
			case l.entry == ks.gradsFor(false):
				grads = l
			}
		}
		if tape == nil || grads == nil {
			return fmt.Errorf("tape / grads probe: the backward launched no tape walk (%s) or no %s", ks.tapeEntry(64),
				ks.gradsFor(false))
		}
		b.Logf("replaying %s, grid %v, and %s, grid %v", tape.entry, tape.grid, grads.entry, grads.grid)
		outs := []*loader.Buffer{br.dq16, br.dk16, br.dv16, br.dg, br.dbeta}
		read := func() ([][]byte, error) {
			if err := br.rk.stream.Synchronize(); err != nil {
				return nil, err
			}
			var r [][]byte
			for _, o := range outs {
				if o == nil {
					return nil, errors.New("tape / grads probe: a gradient buffer is missing (not the v5 core stage?)")
				}
				v := make([]byte, o.Size())
				if err := loader.CopyFromDevice(o, v); err != nil {
					return nil, err
				}
				r = append(r, v)
			}
			return r, nil
		}
		ref, err := read()
		if err != nil {
			return err
		}
		sp, err := newStreamPair(br.rk.dev.ctx, br.rk.stream)
		if err != nil {
			return err
		}
		replay := func(l *recordedLaunch) launcher {
			return func(s *loader.Stream) error { return launchOn(br.rk.dev, s, 0, l.entry, l.grid, l.smem, l.args) }
		}
		same := func(way string) error {
			got, err := read()
			if err != nil {
				return err
			}
			for i := range ref {
				if !slices.Equal(got[i], ref[i]) {
					return fmt.Errorf("%s: gradient %d of (dq, dk, dv, dg, dbeta) differs from the backward's bits", way, i)
				}
			}
			return nil
		}
		pt, err = sp.timePair(replay(tape), replay(grads), b.N, same)
		if err == nil {
			flags, err = tapeGradsFlags(b, br, sp, tape, grads, same)
		}
		ran = err == nil
		return errors.Join(err, sp.close())
	}
	defer func() { bwdProbeHook = nil }()
	gr, err := f.Backward(context.Background(), dout)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("the backward's tape walk ran at vh %d", gr.VH[0][sched.Tape])
	if !ran {
		b.Fatal("tape / grads probe: the backward's hook did not run")
	}
	pt.report(b, "tape", "grads")
	if flags != nil {
		b.ReportMetric(flags[0], "flags-ms")
		b.ReportMetric(flags[1], "flags-tape-ms")
		b.ReportMetric(pt.a+pt.b-flags[0], "flags-saved-ms")
	}
}

// tapeGradsFlags runs the backward's flagged form where the blob has its
// entries (ptx/staging/parked's walk_consumer_flags.patch) and the tape walk ran at
// vh 64: gdn_tape_walk_planes_f with the backward's tape arguments and the
// flags, gdn_chunk_grads_mma8_claim with its gradients' arguments, a behind
// grid beside the walk and a full one after it (one CTA an SM), D16 and
// dV'16 poisoned before each run and the gradients compared after each. It
// returns the medians of the total and of the walk's end, nil where it did
// not run.
func tapeGradsFlags(b *testing.B, br *bwdRun, sp *streamPair, tape, grads *recordedLaunch, same func(string) error) ([]float64, error) {
	dev, ks, cfg := br.rk.dev, br.rk.dev.ks, br.f.plan.Config
	tapeF, err1 := dev.kernels.Function(entryTapeWalkFlags)
	gradsC, err2 := dev.kernels.Function(entryGradsClaim)
	if err1 != nil || err2 != nil || tape.entry != ks.tapeEntry(64) {
		b.Logf("flags: not run (needs %s and %s in the blob, walk_consumer_flags.patch, and the tape walk at vh 64; it ran %s)",
			entryTapeWalkFlags, entryGradsClaim, tape.entry)
		return nil, nil
	}
	if err := tapeF.SetMaxDynamicSharedMemory(tape.smem); err != nil {
		return nil, err
	}
	if err := gradsC.SetMaxDynamicSharedMemory(grads.smem + claimSlotBytes); err != nil {
		return nil, err
	}
	NC := br.rk.tb.NC
	ready, err := loader.AllocFor[uint32](dev.ctx, NC*cfg.HV)
	if err != nil {
		return nil, err
	}
	defer func() { _ = ready.Free() }()
	claim, err := loader.AllocFor[uint32](dev.ctx, 1)
	if err != nil {
		return nil, err
	}
	defer func() { _ = claim.Free() }()
	sms := dev.profile.SMs
	tapeCTAs := int(tape.grid[0] * tape.grid[1] * tape.grid[2])
	cp := &claimedPair{
		sp: sp, dev: dev, ready: ready, claim: claim, readyWords: NC * cfg.HV, poison: []*loader.Buffer{br.dchunk, br.dvnew},
		producer: tapeF, prodGrid: tape.grid, prodSmem: tape.smem, prodArgs: tape.args.Clone().DevicePtr(ready.Ptr()),
		consumer: gradsC, consSmem: grads.smem + claimSlotBytes, behind: max(sms-tapeCTAs, 0), full: sms, // one CTA an SM
		consArgs: grads.args.Clone().DevicePtr(ready.Ptr()).I32(2).DevicePtr(claim.Ptr()).I32(int32(NC * cfg.HQK)),
	}
	var tot, walk []float64
	for i := 0; i < b.N+2; i++ {
		t, w, err := cp.run()
		if err != nil {
			return nil, err
		}
		if i >= 2 {
			tot, walk = append(tot, t), append(walk, w)
		}
		if err := same(fmt.Sprintf("flags, run %d (a chunk read before its flag?)", i)); err != nil {
			return nil, err
		}
	}
	return []float64{stats.Median(tot), stats.Median(walk)}, nil
}
