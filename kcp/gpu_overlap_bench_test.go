package kcp

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/loader"
)

// BenchmarkGPUWalkOutputOverlap measures the premise of docs/mma-kernels.md's
// "consumers behind the walks" note: at 32K tokens in one document the vh 64
// state walk runs 96 CTAs, one an SM, and leaves the H200's other SMs idle.
// On a forward kept on the device (its H16 and V'16 already written), it
// times, CUDA events, medians over b.N runs:
//   - walk: gdn_state_walk_planes alone (the forward alone's arguments);
//   - output: gdn_output_mma16gn alone;
//   - walk+output: the walk launched on one stream, then the output on a
//     second, both after the same event: the output's CTAs take the SMs the
//     walk leaves free, then the rest as the walk ends. It reports the pair's
//     time, the walk's own (whether the output's memory traffic slows it) and
//     the saving against walk + output in sequence;
//   - output+walk: the same launched the other way round (whether the GPU
//     then fills every SM with output CTAs before the walk's start);
//   - flags: the design itself, where the blob has its two entries
//     (ptx/staging's walk_consumer_flags.patch; skipped otherwise): the walk
//     publishing each chunk (gdn_state_walk_planes_f) and a "behind" grid of
//     gdn_output_mma16gn_claim on the SMs the walk leaves free, beside it on
//     a second stream, then a full grid of it after the walk, sharing one
//     claim counter. H16 and V'16 are poisoned before each of its runs and
//     the output compared after each: a chunk read before its flag fails.
//
// The walk rewrites H16 and V'16 with the bits they hold, so the output read
// beside it is the same bits; the benchmark fails where it is not.
// GDNKCP_OVERLAP_DOCS sets the pack (comma-separated document lengths; default
// 32768). No kernel changes and nothing of this is in the library: a probe
// for a design decision. On the GPU machine:
//
//	(cd kcp && ../.gpu/kcp.test -test.run '^$' -test.bench WalkOutputOverlap -test.benchtime 20x)
func BenchmarkGPUWalkOutputOverlap(b *testing.B) {
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
	opts := GPUOptions{Options: Options{Stage: StageCore}, KeepDevice: true}
	if err := opts.SetKernels("v5"); err != nil {
		b.Fatal(err)
	}
	g, err := NewGPU(p, opts)
	if err != nil {
		b.Skipf("needs blobs with the v5 kernels: %v", err)
	}
	defer func() {
		if err := g.Close(); err != nil {
			b.Error(err)
		}
	}()
	in, _ := RandomInputs(p, StageCore, 11)
	f, err := g.Forward(context.Background(), in)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := f.Close(); err != nil {
			b.Error(err)
		}
	}()
	pr, err := newOverlapProbe(f)
	if err != nil {
		b.Skip(err)
	}
	defer pr.close(b)
	tokens := 0
	for _, n := range docs {
		tokens += n
	}
	b.Logf("%d tokens in %d documents, %d chunks; walk grid %v (%d CTAs), output grid %v", tokens, len(docs),
		pr.rk.tb.NC, pr.walkGrid, pr.walkGrid[0]*pr.walkGrid[1]*pr.walkGrid[2], pr.outGrid)
	ref, err := pr.output()
	if err != nil {
		b.Fatal(err)
	}
	var walkMs, outMs float64
	for _, c := range []struct {
		name      string
		walk, out bool
		outFirst  bool
	}{
		{"walk", true, false, false},
		{"output", false, true, false},
		{"walk+output", true, true, false},
		{"output+walk", true, true, true},
		{"flags", true, true, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			flags := c.name == "flags"
			if flags && pr.walkF == nil {
				b.Skipf("the blob has no %s / %s (walk_consumer_flags.patch not built)", entryStateWalkFlags, entryOutputClaim)
			}
			var tot, walk []float64
			for i := 0; i < b.N+2; i++ { // two warm-up runs
				t, w, err := pr.run(c.walk, c.out, c.outFirst)
				if flags {
					t, w, err = pr.runFlags()
				}
				if err != nil {
					b.Fatal(err)
				}
				if i >= 2 {
					tot, walk = append(tot, t), append(walk, w)
				}
				if flags { // every run: H16 and V'16 were poisoned before it, so an early read shows
					got, err := pr.output()
					if err != nil {
						b.Fatal(err)
					}
					if !slices.Equal(got, ref) {
						b.Fatalf("flags, run %d: the output differs from the output alone's bits (a chunk read before its flag?)", i)
					}
				}
			}
			mt, mw := medianOf(tot), medianOf(walk)
			b.ReportMetric(mt, "ms")
			switch {
			case c.walk && !c.out:
				walkMs = mt
			case c.out && !c.walk:
				outMs = mt
			default:
				b.ReportMetric(mw, "walk-ms")
				if walkMs > 0 && outMs > 0 {
					b.ReportMetric(walkMs+outMs-mt, "saved-ms")
				}
			}
			if c.out {
				got, err := pr.output()
				if err != nil {
					b.Fatal(err)
				}
				if !slices.Equal(got, ref) {
					b.Fatalf("%s: the output differs from the output alone's bits", c.name)
				}
			}
		})
	}
}

// The entries of ptx/staging's walk_consumer_flags.patch, which the probe
// resolves itself where the blob has them.
const (
	entryStateWalkFlags = "gdn_state_walk_planes_f"
	entryOutputClaim    = "gdn_output_mma16gn_claim"
)

// overlapProbe holds what BenchmarkGPUWalkOutputOverlap launches: a kept
// forward's rank 0, a second stream and the events.
type overlapProbe struct {
	rk                *gpuRank
	s1, s2            *loader.Stream
	ev                [4]*loader.Event // start, walk end, output end, end
	walkGrid, outGrid [3]uint32
	walkSmem, outSmem int
	walkArgs, outArgs *loader.Args
	walkEntry         string
	// The flagged form (nil walkF: the blob lacks it): the entries, the
	// flags and claim counter (zeroed before each run), their arguments and
	// the grids of the behind and the full claiming launches.
	walkF, outClaim          *loader.Function
	ready, claim             *loader.Buffer
	walkFArgs, claimArgs     *loader.Args
	behindGrid, fullGrid     [3]uint32
	readyWords, behindBlocks int
}

func newOverlapProbe(f *GPUForward) (*overlapProbe, error) {
	if len(f.ranks) != 1 || f.ranks[0] == nil {
		return nil, fmt.Errorf("overlap probe: needs the kept forward's one rank")
	}
	rk := f.ranks[0]
	ks := rk.dev.ks
	if !ks.planes || !rk.normQK || rk.wp == nil || rk.wk == nil || rk.h16 == nil || rk.vnew16 == nil {
		return nil, fmt.Errorf("overlap probe: needs the v5 plane walks and the bf16 H / V' (kernels %+v)", ks)
	}
	cfg := f.plan.Config
	HQK, HV := cfg.HQK, cfg.HV
	const vh = 64
	pr := &overlapProbe{
		rk: rk, s1: rk.stream, walkEntry: ks.state,
		walkGrid: [3]uint32{uint32(gpuD / vh), uint32(rk.tb.NS), uint32(HV)}, walkSmem: ks.walkSmem(vh),
		outGrid: [3]uint32{uint32(rk.tb.NC), uint32(HQK), 1}, outSmem: ks.outputSmem,
	}
	pr.walkArgs = argsStatePlanes(rk.wp.Ptr(), rk.kRaw, rk.kSt, rk.kRstd.Ptr(), rk.u.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(),
		rk.chunkLen.Ptr(), rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.start.Ptr(), 0, 0, rk.final.Ptr(), rk.h16.Ptr(),
		rk.vnew16.Ptr(), HQK, HV, vh, 0, 0)
	pr.outArgs = argsOutputGN(rk.qRaw, rk.wk.Ptr(), rk.qSt, !f.opts.NoL2Norm, rk.gcum.Ptr(), rk.vnew16.Ptr(), rk.h16.Ptr(),
		rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(), rk.o.Ptr(), HQK, HV, gpuScale(f.opts))
	var err error
	if pr.s2, err = rk.dev.ctx.NewStream(loader.StreamNonBlocking); err != nil {
		return nil, err
	}
	if err := pr.openFlags(f); err != nil {
		return nil, err
	}
	for i := range pr.ev {
		if pr.ev[i], err = rk.dev.ctx.NewEvent(loader.EventDefault); err != nil {
			return nil, err
		}
	}
	return pr, nil
}

// openFlags resolves the flagged form's entries where the blob has them and
// makes its buffers and arguments.
func (pr *overlapProbe) openFlags(f *GPUForward) error {
	rk, ks := pr.rk, pr.rk.dev.ks
	walkF, err := rk.dev.kernels.Function(entryStateWalkFlags)
	if err != nil {
		return nil // not built: the flags case skips
	}
	outClaim, err := rk.dev.kernels.Function(entryOutputClaim)
	if err != nil {
		return nil
	}
	if err := walkF.SetMaxDynamicSharedMemory(pr.walkSmem); err != nil {
		return err
	}
	if err := outClaim.SetMaxDynamicSharedMemory(ks.outputSmem); err != nil {
		return err
	}
	cfg := f.plan.Config
	HQK, HV := cfg.HQK, cfg.HV
	pr.readyWords = rk.tb.NC * HV
	if pr.ready, err = loader.AllocFor[uint32](rk.dev.ctx, pr.readyWords); err != nil {
		return err
	}
	if pr.claim, err = loader.AllocFor[uint32](rk.dev.ctx, 1); err != nil {
		return err
	}
	const vh = 64
	pr.walkFArgs = argsStatePlanes(rk.wp.Ptr(), rk.kRaw, rk.kSt, rk.kRstd.Ptr(), rk.u.Ptr(), rk.gcum.Ptr(), rk.chunkTok0.Ptr(),
		rk.chunkLen.Ptr(), rk.segChunk0.Ptr(), rk.segNChunk.Ptr(), rk.start.Ptr(), 0, 0, rk.final.Ptr(), rk.h16.Ptr(),
		rk.vnew16.Ptr(), HQK, HV, vh, 0, 0).DevicePtr(pr.ready.Ptr())
	pr.claimArgs = argsOutputGN(rk.qRaw, rk.wk.Ptr(), rk.qSt, !f.opts.NoL2Norm, rk.gcum.Ptr(), rk.vnew16.Ptr(), rk.h16.Ptr(),
		rk.chunkTok0.Ptr(), rk.chunkLen.Ptr(), rk.o.Ptr(), HQK, HV, gpuScale(f.opts)).
		DevicePtr(pr.ready.Ptr()).I32(int32(gpuD / vh)).DevicePtr(pr.claim.Ptr()).I32(int32(rk.tb.NC * HQK))
	sms := rk.dev.profile.SMs
	walkCTAs := int(pr.walkGrid[0] * pr.walkGrid[1] * pr.walkGrid[2])
	pr.behindBlocks = sms - walkCTAs // one a free SM: fits beside the whole walk however the GPU places it
	pr.behindGrid = [3]uint32{uint32(max(pr.behindBlocks, 0)), 1, 1}
	pr.fullGrid = [3]uint32{uint32(2 * sms), 1, 1} // two CTAs an SM
	pr.walkF, pr.outClaim = walkF, outClaim
	return nil
}

// runFlags runs the flagged form: flags and counter zeroed, then the walk on
// s1, the behind grid on s2 (where the walk leaves SMs free) and the full
// grid on s1 after the walk; it returns the time to the end of all three and
// to the walk's end.
func (pr *overlapProbe) runFlags() (total, walkEnd float64, err error) {
	start, wEnd, oEnd := pr.ev[0], pr.ev[1], pr.ev[2]
	dev := pr.rk.dev
	if err := poisonOn(dev, pr.s1, 0, pr.ready, pr.readyWords, 0); err != nil {
		return 0, 0, err
	}
	if err := poisonOn(dev, pr.s1, 0, pr.claim, 1, 0); err != nil {
		return 0, 0, err
	}
	// H16 and V'16 poisoned (bf16 NaN pairs): the walk rewrites them, so an output item computed before
	// its chunk's flag reads NaN and the benchmark's comparison fails.
	for _, buf := range []*loader.Buffer{pr.rk.h16, pr.rk.vnew16} {
		if err := poisonOn(dev, pr.s1, 0, buf, buf.Size()/4, 0x7fc07fc0); err != nil {
			return 0, 0, err
		}
	}
	if err := start.Record(pr.s1); err != nil {
		return 0, 0, err
	}
	if err := loader.Launch(pr.s1, pr.walkF, pr.walkGrid, [3]uint32{gpuBlock, 1, 1}, uint32(pr.walkSmem), pr.walkFArgs); err != nil {
		return 0, 0, fmt.Errorf("%s: %w", entryStateWalkFlags, err)
	}
	if err := wEnd.Record(pr.s1); err != nil {
		return 0, 0, err
	}
	if pr.behindBlocks > 0 {
		if err := pr.s2.WaitEvent(start); err != nil {
			return 0, 0, err
		}
		if err := loader.Launch(pr.s2, pr.outClaim, pr.behindGrid, [3]uint32{gpuBlock, 1, 1}, uint32(pr.outSmem), pr.claimArgs); err != nil {
			return 0, 0, fmt.Errorf("%s (behind): %w", entryOutputClaim, err)
		}
		if err := oEnd.Record(pr.s2); err != nil {
			return 0, 0, err
		}
	}
	if err := loader.Launch(pr.s1, pr.outClaim, pr.fullGrid, [3]uint32{gpuBlock, 1, 1}, uint32(pr.outSmem), pr.claimArgs); err != nil {
		return 0, 0, fmt.Errorf("%s (full): %w", entryOutputClaim, err)
	}
	if pr.behindBlocks > 0 {
		if err := pr.s1.WaitEvent(oEnd); err != nil {
			return 0, 0, err
		}
	}
	return pr.finish(true)
}

// finish records the end event on s1, waits for it and returns the times
// from the start event to it and, where a walk ran, to the walk's end.
func (pr *overlapProbe) finish(walk bool) (total, walkEnd float64, err error) {
	start, wEnd, end := pr.ev[0], pr.ev[1], pr.ev[3]
	if err := end.Record(pr.s1); err != nil {
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
	if walk {
		if w, err = loader.ElapsedMillis(start, wEnd); err != nil {
			return 0, 0, err
		}
	}
	return float64(t), float64(w), nil
}

func (pr *overlapProbe) close(b *testing.B) {
	for _, buf := range []*loader.Buffer{pr.ready, pr.claim} {
		if buf != nil {
			if err := buf.Free(); err != nil {
				b.Error(err)
			}
		}
	}
	for _, e := range pr.ev {
		if e != nil {
			if err := e.Close(); err != nil {
				b.Error(err)
			}
		}
	}
	if pr.s2 != nil {
		if err := pr.s2.Close(); err != nil {
			b.Error(err)
		}
	}
}

// run launches the walk (on s1) and / or the output (on s2 where both run,
// the output first where outFirst), both after the start event, and returns
// the time to the end of both and to the walk's end (0 without the walk).
func (pr *overlapProbe) run(walk, out, outFirst bool) (total, walkEnd float64, err error) {
	start, wEnd, oEnd := pr.ev[0], pr.ev[1], pr.ev[2]
	if err := start.Record(pr.s1); err != nil {
		return 0, 0, err
	}
	outS := pr.s1
	if walk && out {
		outS = pr.s2
		if err := outS.WaitEvent(start); err != nil {
			return 0, 0, err
		}
	}
	launchWalk := func() error {
		if err := launchOn(pr.rk.dev, pr.s1, 0, pr.walkEntry, pr.walkGrid, pr.walkSmem, pr.walkArgs); err != nil {
			return err
		}
		return wEnd.Record(pr.s1)
	}
	launchOut := func() error {
		if err := launchOn(pr.rk.dev, outS, 0, entryOutputMMA16GN, pr.outGrid, pr.outSmem, pr.outArgs); err != nil {
			return err
		}
		if err := oEnd.Record(outS); err != nil {
			return err
		}
		if outS != pr.s1 {
			return pr.s1.WaitEvent(oEnd)
		}
		return nil
	}
	steps := []func() error{}
	if out && outFirst {
		steps = append(steps, launchOut)
	}
	if walk {
		steps = append(steps, launchWalk)
	}
	if out && !outFirst {
		steps = append(steps, launchOut)
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return 0, 0, err
		}
	}
	return pr.finish(walk)
}

// output reads the rank's bf16 output back.
func (pr *overlapProbe) output() ([]bf16.BF16, error) {
	if err := pr.s1.Synchronize(); err != nil {
		return nil, err
	}
	o := make([]bf16.BF16, pr.rk.o.Size()/2)
	if err := loader.CopyFromDevice(pr.rk.o, o); err != nil {
		return nil, err
	}
	return o, nil
}

// medianOf is the median of xs (the mean of the middle two for an even count).
func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
