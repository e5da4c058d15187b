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
//     then fills every SM with output CTAs before the walk's start).
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
	} {
		b.Run(c.name, func(b *testing.B) {
			var tot, walk []float64
			for i := 0; i < b.N+2; i++ { // two warm-up runs
				t, w, err := pr.run(c.walk, c.out, c.outFirst)
				if err != nil {
					b.Fatal(err)
				}
				if i >= 2 {
					tot, walk = append(tot, t), append(walk, w)
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
	for i := range pr.ev {
		if pr.ev[i], err = rk.dev.ctx.NewEvent(loader.EventDefault); err != nil {
			return nil, err
		}
	}
	return pr, nil
}

func (pr *overlapProbe) close(b *testing.B) {
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
	start, wEnd, oEnd, end := pr.ev[0], pr.ev[1], pr.ev[2], pr.ev[3]
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
