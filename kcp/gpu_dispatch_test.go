package kcp

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// dispatchDocs are five documents of 10 to 65 chunks: at the production
// heads (HQK 16, HV 48) and R 2 their walks' CTAs outnumber the H200's 132
// walk slots and their segments differ in length, so the walks get a
// dispatch order that is not launch order.
var dispatchDocs = []int{64*65 - 7, 64 * 10, 64*33 + 5, 64 * 47, 64*21 + 40}

// TestGPUDispatchOrder: the v5 walks in their dispatch order (the default)
// and in launch order (GPUOptions.LaunchOrder) give the same output, states
// and gradients, bit for bit: B1 at R 2, layouts C and D, core and module,
// with the default blob and the compute_80 PTX forced. On any machine it
// first checks that the plan's state walks on an H200 do get a dispatch
// order (else the test would compare launch order with itself).
func TestGPUDispatchOrder(t *testing.T) {
	h200 := sched.Profile{Variant: sched.VariantSM90a, SMs: 132}
	permuted := 0
	for _, layout := range []Layout{LayoutC, LayoutD} {
		p := gpuPlan(t, dispatchDocs, 2, layout)
		for r := range p.Ranks {
			tb, err := buildGPUTables(p, r)
			require.NoError(t, err)
			for _, vh := range []int{64, 128} {
				order, err := walkDispatch(h200, tb.SegNChunk, 48, gpuD/vh)
				require.NoError(t, err)
				if order != nil {
					permuted++
				}
			}
		}
	}
	require.Positive(t, permuted, "no rank's state walk gets a dispatch order: the packs test nothing")

	seed := gpuTestSeed(t)
	if _, err := loader.DeviceCount(); err != nil {
		t.Skipf("needs libcuda.so.1 and a CUDA GPU: %v", err)
	}
	var kopts GPUOptions
	require.NoError(t, kopts.SetKernels("v5"))
	p0 := gpuPlan(t, dispatchDocs, 2, LayoutC)
	gpus := openTestGPUs(t, p0, kopts)
	for si, stage := range []Stage{StageCore, StageModule} {
		in, dout := RandomInputs(p0, stage, seed+uint64(si))
		for _, layout := range []Layout{LayoutC, LayoutD} {
			t.Run(fmt.Sprintf("%s/%s/R2", stage, layout), func(t *testing.T) {
				p := gpuPlan(t, dispatchDocs, 2, layout)
				for _, tg := range gpus {
					opts := kopts
					opts.Options = Options{Stage: stage}
					fd, gd := gpuB1(t, tg.g, p, opts, in, dout)
					opts.LaunchOrder = true
					fl, gl := gpuB1(t, tg.g, p, opts, in, dout)
					what := fmt.Sprintf("%s: dispatch vs launch order", tg.name)
					requireSameBits(t, what, fd, fl)
					requireSameGradBits(t, what, gd, gl)
				}
			})
		}
	}
}

// TestOrderCapacity: every order table a walk can take fits the one size
// walkOrder and launchSplit reserve (orderCapacity), so that no width choice
// changes a rank's peak device memory: the dispatch orders at both widths and
// the splits of every walk kind, on the dispatch test's plans; and uploadCap
// refuses a table larger than its buffer before it allocates.
func TestOrderCapacity(t *testing.T) {
	h200 := sched.Profile{Variant: sched.VariantSM90a, SMs: 132}
	slots := walkSlots(h200)
	cost := sched.ChunkCost{Narrow: 3, Wide: 5}
	for _, layout := range []Layout{LayoutC, LayoutD} {
		p := gpuPlan(t, dispatchDocs, 2, layout)
		for r := range p.Ranks {
			tb, err := buildGPUTables(p, r)
			require.NoError(t, err)
			chains := make([]int, len(tb.SegNChunk))
			for i, c := range tb.SegNChunk {
				chains[i] = int(c)
			}
			for _, k := range sched.WalkKinds() {
				T := k.ColumnSets()
				capacity := orderCapacity(T, len(chains), 48)
				name := fmt.Sprintf("%s/rank %d/%s", layout, r, k)
				for _, vh := range []int{64, 128} {
					order, err := walkDispatch(h200, tb.SegNChunk, 48, T*gpuD/vh)
					require.NoError(t, err, name)
					require.LessOrEqual(t, len(order), capacity, "%s: vh %d's dispatch order", name, vh)
				}
				require.Equal(t, capacity, 2*T*len(chains)*48, "%s: the vh 64 launch's CTAs", name)
				m, err := sched.MixedWalk(chains, 48, T, slots, cost)
				require.NoError(t, err, name)
				require.LessOrEqual(t, len(m.Order128)+len(m.Order64), capacity, "%s: the model's split", name)
				for _, w := range []int{1, 24, 47} {
					wide := make([]int, len(chains))
					for i := range wide {
						wide[i] = w
					}
					m, err := sched.SplitWalk(chains, wide, 48, T, slots, cost)
					require.NoError(t, err, name)
					require.Equal(t, T*(2*len(chains)*48-w*len(chains)), len(m.Order128)+len(m.Order64), "%s: %d heads a chain at vh 128", name, w)
					require.Equal(t, capacity, orderCapacity(m.Tiles, m.Segments, m.HV), "%s: launchSplit's reservation", name)
				}
			}
		}
	}
	_, err := uploadCap[int32](nil, nil, "order", make([]int32, 5), 4, 4)
	require.ErrorContains(t, err, "upload order: 5 elements into a buffer of 4")
}
