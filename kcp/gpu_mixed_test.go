package kcp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/sched"
)

// halfWide is a split of a tape walk over the given chains and hv value
// heads for mixedTapeForce: hv/2 heads of every chain at vh 128 (the
// emulator's TestTapePlanesOnCPU runs uneven splits of the same kernels).
func halfWide(chains []int, hv int) []int {
	wide := make([]int, len(chains))
	for s := range wide {
		wide[s] = hv / 2
	}
	return wide
}

// TestGPUMixedTape runs B1 with the tape walk split between the widths
// (GPUOptions.MixedTape) and requires vh 64's gradients bit for bit, with
// the default blob and the compute_80 PTX forced:
//   - forced: every pack's first two bwdPacks, HQK 2 / HV 4, core and module
//     stages, every layout, R 1, 2 and 4, each rank's tape walk split by
//     mixedTapeForce (halfWide: the two launches' grids cover half the heads
//     each); GPUGrads.Mixed reports the split, and the peak device
//     memory differs from vh 64's by at most the split's order table;
//   - the model: heads 16 / 48, documents of 10, 11 and 9 chunks on one rank
//     (issue 6's three-document pack scaled down), where sm_90a's cost rule
//     splits the tape walk by sched.MixedWalk (72 of 144 walks at vh 128),
//     on the rank's and a side stream and on two prioritised side streams
//     (GPUOptions.MixedTapePriority).
func TestGPUMixedTape(t *testing.T) {
	seed := gpuTestSeed(t)
	gpus := openTestGPUs(t, bwdPlan(t, bwdPacks[0].docs, 1, LayoutC, 2, 4), GPUOptions{})
	t.Run("forced", func(t *testing.T) {
		mixedTapeForce = halfWide
		t.Cleanup(func() { mixedTapeForce = nil })
		for pi, pk := range bwdPacks[:2] {
			for si, stage := range []Stage{StageCore, StageModule} {
				p0 := bwdPlan(t, pk.docs, 1, LayoutC, 2, 4)
				in, dout := RandomInputs(p0, stage, seed+uint64(10*pi+si))
				for _, layout := range Layouts() {
					for _, R := range []int{1, 2, 4} {
						t.Run(fmt.Sprintf("%s/%s/%s/R%d", pk.name, stage, layout, R), func(t *testing.T) {
							p := bwdPlan(t, pk.docs, R, layout, 2, 4)
							for _, tg := range gpus {
								_, narrow := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: stage, ForceVH: 64}}, in, dout)
								_, mixed := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: stage}, MixedTape: true}, in, dout)
								requireSameGradBits(t, tg.name+": vh 64 vs the split tape walk", narrow, mixed)
								for r := range p.Ranks {
									ns := len(p.Ranks[r].Segments)
									want := 0
									if len(p.Ranks[r].Tape) > 0 {
										want = ns * 2
									}
									require.Equal(t, want, mixed.Mixed[r], "%s: rank %d: tape walks at vh 128", tg.name, r)
									require.Zero(t, narrow.Mixed[r], "%s: rank %d: ForceVH split the tape walk", tg.name, r)
									table := int64(4 * 2 * ns * 4)
									require.InDelta(t, narrow.PeakBytes[r], mixed.PeakBytes[r], float64(table),
										"%s: rank %d: peak device memory", tg.name, r)
								}
							}
						})
					}
				}
			}
		}
	})
	t.Run("model", func(t *testing.T) {
		p := bwdPlan(t, []int{640, 704, 576}, 1, LayoutC, 16, 48)
		in, dout := RandomInputs(p, StageCore, seed+99)
		for _, tg := range gpus {
			if v := tg.g.Profile().Variant; v != sched.VariantSM90a {
				t.Logf("%s: profile %s has no measured cost rule to split by", tg.name, v)
				continue
			}
			_, narrow := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: StageCore, ForceVH: 64}}, in, dout)
			_, mixed := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: StageCore}, MixedTape: true}, in, dout)
			requireSameGradBits(t, tg.name+": vh 64 vs the split tape walk", narrow, mixed)
			require.Equal(t, 72, mixed.Mixed[0], "%s: tape walks at vh 128 (sched.MixedWalk on chains 10, 11, 9)", tg.name)
			_, prio := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: StageCore}, MixedTape: true, MixedTapePriority: true}, in, dout)
			requireSameGradBits(t, tg.name+": vh 64 vs the split tape walk on prioritised streams", narrow, prio)
			require.Equal(t, 72, prio.Mixed[0], "%s: tape walks at vh 128, prioritised streams", tg.name)
			_, plain := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: StageCore}}, in, dout)
			require.Zero(t, plain.Mixed[0], "%s: split without GPUOptions.MixedTape", tg.name)
			requireSameGradBits(t, tg.name+": the rule's width vs the split tape walk", plain, mixed)
		}
	})
}
