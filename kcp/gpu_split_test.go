package kcp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/sched"
)

// TestCheckSplitHeads: GPUOptions.SplitHeads takes 1..HV-1 heads of any
// walk, and not with ForceVH; NewGPU refuses the rest before it touches a
// driver.
func TestCheckSplitHeads(t *testing.T) {
	split := func(k sched.WalkKind, n int) (h [sched.NumWalkKinds]int) {
		h[k] = n
		return h
	}
	for _, c := range []struct {
		name string
		o    GPUOptions
		err  string
	}{
		{"none", GPUOptions{}, ""},
		{"state", GPUOptions{SplitHeads: split(sched.State, 24)}, ""},
		{"tape, one head narrow", GPUOptions{SplitHeads: split(sched.Tape, 47)}, ""},
		{"all heads", GPUOptions{SplitHeads: split(sched.Tape, 48)}, "SplitHeads[tape] = 48: want 1..47"},
		{"negative", GPUOptions{SplitHeads: split(sched.State, -1)}, "SplitHeads[state] = -1"},
		{"summary", GPUOptions{SplitHeads: split(sched.Summary, 2)}, ""},
		{"offset", GPUOptions{SplitHeads: split(sched.Offset, 47)}, ""},
		{"offset, all heads", GPUOptions{SplitHeads: split(sched.Offset, 48)}, "SplitHeads[offset] = 48"},
		{"with ForceVH", GPUOptions{Options: Options{ForceVH: 64}, SplitHeads: split(sched.Tape, 2)}, "with ForceVH 64"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.o.checkSplitHeads(48)
			if c.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, c.err)
			p := bwdPlan(t, []int{100}, 1, LayoutC, 16, 48)
			_, err = NewGPU(p, c.o)
			require.ErrorContains(t, err, c.err, "NewGPU checks SplitHeads first")
		})
	}
}

// TestGPUSplitWalks runs B1 with walks split between the widths and requires
// vh 64's outputs, states and gradients bit for bit, with the default blob
// and the compute_80 PTX forced:
//   - forced: the first two bwdPacks, HQK 2 / HV 4, core and module stages,
//     every layout, R 1, 2 and 4, every walk of every rank split with 2 of
//     the 4 heads of every chain at vh 128 (GPUOptions.SplitHeads;
//     SplitPriority on R 2): GPUForward.Split and GPUGrads.Split report the
//     splits, and the peak device memory is vh 64's;
//   - the model: heads 16 / 48, documents of 10, 11 and 9 chunks on one rank
//     (issue 6's three-document pack scaled down), where sm_90a's cost rule
//     splits the state and tape walks by sched.MixedWalk by default (72 of
//     144 walks at vh 128 each), on the rank's and a side stream and on two
//     prioritised side streams, and in B3 (checkpoint, recompute, backward);
//     with GPUOptions.SingleWidth they run at one width.
func TestGPUSplitWalks(t *testing.T) {
	seed := gpuTestSeed(t)
	var v5 GPUOptions // the plane walks split; ForPlan keeps the base's kernels
	require.NoError(t, v5.SetKernels("v5"))
	gpus := openTestGPUs(t, bwdPlan(t, bwdPacks[0].docs, 1, LayoutC, 2, 4), v5)
	t.Run("forced", func(t *testing.T) {
		for pi, pk := range bwdPacks[:2] {
			for si, stage := range []Stage{StageCore, StageModule} {
				p0 := bwdPlan(t, pk.docs, 1, LayoutC, 2, 4)
				in, dout := RandomInputs(p0, stage, seed+uint64(10*pi+si))
				for _, layout := range Layouts() {
					for _, R := range []int{1, 2, 4} {
						t.Run(fmt.Sprintf("%s/%s/%s/R%d", pk.name, stage, layout, R), func(t *testing.T) {
							p := bwdPlan(t, pk.docs, R, layout, 2, 4)
							o := GPUOptions{Options: Options{Stage: stage}, SplitPriority: R == 2}
							o.SplitHeads = [sched.NumWalkKinds]int{2, 2, 2, 2}
							for _, tg := range gpus {
								fn, narrow := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: stage, ForceVH: 64}}, in, dout)
								fs, split := gpuB1(t, tg.g, p, o, in, dout)
								requireSameGradBits(t, tg.name+": vh 64 vs split state and tape walks", narrow, split)
								requireSameBits(t, tg.name+": vh 64 vs a split state walk", fn, fs)
								for r, rp := range p.Ranks {
									for _, k := range sched.WalkKinds() {
										got := split.Split[r][k]
										if k.Forward() {
											got = fs.Split[r][k]
										}
										require.Equal(t, 2*len(rp.Walk(k)), got, "%s: rank %d: %s walks at vh 128", tg.name, r, k)
									}
									require.Zero(t, narrow.Split[r], "%s: rank %d: ForceVH split a walk", tg.name, r)
									require.Equal(t, narrow.PeakBytes[r], split.PeakBytes[r],
										"%s: rank %d: peak device memory, vh 64 vs split walks", tg.name, r)
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
			// By default the state and tape walks split (sched.MixedWalk on
			// chains 10, 11, 9 at CostRule.SplitFor's 5/3: 24 heads of each
			// chain at vh 128).
			for _, prio := range []bool{false, true} {
				fw, mixed := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: StageCore}, SplitPriority: prio}, in, dout)
				requireSameGradBits(t, fmt.Sprintf("%s: vh 64 vs the split walks (priority %v)", tg.name, prio), narrow, mixed)
				require.Equal(t, 72, mixed.Split[0][sched.Tape], "%s: tape walks at vh 128", tg.name)
				require.Equal(t, 72, fw.Split[0][sched.State], "%s: state walks at vh 128", tg.name)
				require.Zero(t, mixed.Split[0][sched.Offset], "%s: one rank, no offset walk", tg.name)
				require.Equal(t, narrow.PeakBytes, mixed.PeakBytes, "%s: peak device memory, vh 64 vs the split walks", tg.name)
			}
			// B3 (checkpoint, recompute, backward) with the default splits:
			// vh 64's gradient bits, the tape walk split as in B1.
			g3, err := tg.g.ForPlan(p, GPUOptions{Options: Options{Stage: StageCore}, KeepDevice: true})
			require.NoError(t, err)
			b3 := b3Grads(t, g3, in, dout)
			require.NoError(t, g3.Close())
			requireSameGradBits(t, tg.name+": vh 64 vs B3 with the split walks", narrow, b3)
			require.Equal(t, 72, b3.Split[0][sched.Tape], "%s: B3's tape walks at vh 128", tg.name)
			fw, single := gpuB1(t, tg.g, p, GPUOptions{Options: Options{Stage: StageCore}, SingleWidth: true}, in, dout)
			assert.Zero(t, single.Split[0][sched.Tape], "%s: the tape walk split with GPUOptions.SingleWidth", tg.name)
			assert.Zero(t, fw.Split[0][sched.State], "%s: the state walk split with GPUOptions.SingleWidth", tg.name)
			requireSameGradBits(t, tg.name+": the rule's width vs vh 64", single, narrow)
			require.Equal(t, narrow.PeakBytes, single.PeakBytes, "%s: peak device memory, vh 64 vs the rule's widths", tg.name)
		}
	})
}
