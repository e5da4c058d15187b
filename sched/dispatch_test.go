package sched

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDispatchOrder: the order is a permutation of the launch's CTAs; its
// makespan is the list makespan of that order, never above launch order's
// (ListMakespan) or LPT order's, and where the packing leaves room it is
// lower (the three-document pack of issues 5 and 6: 1891 -> 1686 at vh 64,
// 1266 -> 1124 at vh 128).
func TestDispatchOrder(t *testing.T) {
	for _, c := range []struct {
		name                  string
		chains                []int
		hv, perSegment, slots int
		want                  int // the makespan, where known; 0: only the bounds
		launchSpan            int // launch order's, where pinned
	}{
		{name: "one document", chains: []int{512}, hv: 48, perSegment: 2, slots: 132, want: 512},
		{name: "120,908 tokens vh 64", chains: []int{625, 704, 562}, hv: 48, perSegment: 2, slots: 132, want: 1686, launchSpan: 1891},
		{name: "120,908 tokens vh 128", chains: []int{625, 704, 562}, hv: 48, perSegment: 1, slots: 132, want: 1124, launchSpan: 1266},
		{name: "fewer CTAs than slots", chains: []int{3, 9}, hv: 2, perSegment: 2, slots: 132, want: 9},
		{name: "empty segments", chains: []int{0, 7, 0, 1}, hv: 3, perSegment: 1, slots: 2},
		{name: "one slot", chains: []int{4, 2, 5}, hv: 2, perSegment: 2, slots: 1, want: 44},
		{name: "no chains", chains: nil, hv: 48, perSegment: 2, slots: 132, want: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			order, span, err := DispatchOrder(c.chains, c.hv, c.perSegment, c.slots)
			require.NoError(t, err)
			n := c.hv * len(c.chains) * c.perSegment
			require.Len(t, order, n)
			sorted := slices.Clone(order)
			slices.Sort(sorted)
			for i, x := range sorted {
				require.Equal(t, int32(i), x, "not a permutation")
			}
			length := func(cta int32) int { return c.chains[(int(cta)/c.perSegment)%len(c.chains)] }
			assert.Equal(t, listMakespanOf(order, length, c.slots), span, "the makespan of the order returned")
			launch := mustList(t, c.chains, c.hv, c.perSegment, c.slots)
			assert.LessOrEqual(t, span, launch, "above launch order's")
			if c.launchSpan > 0 {
				assert.Equal(t, c.launchSpan, launch)
			}
			lpt := make([]int32, n)
			for i := range lpt {
				lpt[i] = int32(i)
			}
			slices.SortStableFunc(lpt, func(a, b int32) int { return length(b) - length(a) })
			assert.LessOrEqual(t, span, listMakespanOf(lpt, length, c.slots), "above LPT order's")
			if c.want > 0 || n == 0 {
				assert.Equal(t, c.want, span)
			}
		})
	}
}

// Random launches: the bounds hold, and the order is a function of its
// inputs (the same order twice).
func TestDispatchOrderRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		chains := make([]int, 1+rng.IntN(12))
		for i := range chains {
			chains[i] = rng.IntN(900)
		}
		hv, per, slots := 1+rng.IntN(48), 1+rng.IntN(2), 1+rng.IntN(140)
		order, span, err := DispatchOrder(chains, hv, per, slots)
		require.NoError(t, err)
		again, span2, err := DispatchOrder(chains, hv, per, slots)
		require.NoError(t, err)
		require.Equal(t, order, again)
		require.Equal(t, span, span2)
		require.LessOrEqual(t, span, mustList(t, chains, hv, per, slots), "chains %v hv %d per %d slots %d", chains, hv, per, slots)
		total, longest := 0, 0
		for _, c := range chains {
			total += c * hv * per
			longest = max(longest, c)
		}
		require.GreaterOrEqual(t, span, max(longest, (total+slots-1)/slots), "below the lower bound")
	}
}

func TestDispatchOrderErrors(t *testing.T) {
	for _, c := range []struct {
		name                  string
		chains                []int
		hv, perSegment, slots int
		want                  string
	}{
		{"no slots", []int{1}, 1, 1, 0, "0 slots"},
		{"negative chain", []int{1, -2}, 1, 1, 4, "chain 1 has -2 chunks"},
		{"no heads", []int{1}, 0, 1, 4, "0 heads"},
		{"no tiles", []int{1}, 1, 0, 4, "0 tiles"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := DispatchOrder(c.chains, c.hv, c.perSegment, c.slots)
			require.ErrorContains(t, err, c.want)
		})
	}
}
