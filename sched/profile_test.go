package sched

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProfiles(t *testing.T) {
	assert.Equal(t, []string{"generic", "sm_100a", "sm_103a", "sm_107a", "sm_90a"}, Variants())
	for _, v := range Variants() {
		r, err := RulesFor(v)
		require.NoError(t, err)
		assert.NotEmpty(t, r.Note, v)
	}
	r, _ := RulesFor(VariantGeneric)
	assert.Contains(t, r.Note, "rule B as written for sm_103a until measured")
	assert.False(t, r.Measured)
	assert.False(t, r.TapeTwoWave)
	assert.Zero(t, r.LongChain)
	assert.Nil(t, r.Cost)
	r, _ = RulesFor(VariantSM90a)
	assert.True(t, r.Measured)
	assert.Equal(t, &CostRule{CTAsPerSM: 1, Forward: ChunkCost{Narrow: 4, Wide: 9}, ForwardLean: ChunkCost{Narrow: 1, Wide: 2},
		Backward: ChunkCost{Narrow: 3, Wide: 5}, Dispatch: true,
		StateSplitLean:              SplitModel{Cost: ChunkCost{Narrow: 3, Wide: 5}, MaxWidePercent: 50},
		BackwardSplitMaxWidePercent: 50}, r.Cost)
	// The walks the model splits between the widths, at what costs and with
	// how many of 48 heads at most at vh 128: the backward walks always, the
	// state walk of a lean run only; half the heads at most.
	for _, tc := range []struct {
		kind    WalkKind
		lean    bool
		want    ChunkCost
		maxWide int
		ok      bool
	}{
		{Tape, false, ChunkCost{Narrow: 3, Wide: 5}, 24, true},
		{Offset, true, ChunkCost{Narrow: 3, Wide: 5}, 24, true},
		{State, true, ChunkCost{Narrow: 3, Wide: 5}, 24, true},
		{State, false, ChunkCost{}, 48, false},
		{Summary, true, ChunkCost{}, 48, false},
	} {
		got, ok := r.Cost.SplitFor(tc.kind, tc.lean)
		assert.Equal(t, tc.ok, ok, "%s lean %v", tc.kind, tc.lean)
		assert.Equal(t, tc.want, got.Cost, "%s lean %v", tc.kind, tc.lean)
		assert.Equal(t, tc.maxWide, got.MaxWide(48), "%s lean %v", tc.kind, tc.lean)
	}
	assert.Equal(t, 1, SplitModel{MaxWidePercent: 50}.MaxWide(1), "at least one head")
	assert.Equal(t, 3, SplitModel{MaxWidePercent: 100}.MaxWide(3))
	var none CostRule
	_, ok := none.SplitFor(State, true)
	assert.False(t, ok, "a rule without StateSplitLean splits no state walk")
	assert.Equal(t, ChunkCost{Narrow: 4, Wide: 9}, r.Cost.For(State))
	assert.Equal(t, ChunkCost{Narrow: 4, Wide: 9}, r.Cost.For(Summary))
	assert.Equal(t, ChunkCost{Narrow: 3, Wide: 5}, r.Cost.For(Offset))
	assert.Equal(t, ChunkCost{Narrow: 3, Wide: 5}, r.Cost.For(Tape))
	// A lean run (no fp32 per-chunk states stored) changes the forward walks' costs; the backward's lean
	// cost measured equal to its full one since the v5.32 walks, so BackwardLean is unset.
	for _, tc := range []struct {
		kind       WalkKind
		lean, full ChunkCost
	}{
		{State, ChunkCost{Narrow: 1, Wide: 2}, ChunkCost{Narrow: 4, Wide: 9}},
		{Summary, ChunkCost{Narrow: 1, Wide: 2}, ChunkCost{Narrow: 4, Wide: 9}},
		{Offset, ChunkCost{Narrow: 3, Wide: 5}, ChunkCost{Narrow: 3, Wide: 5}},
		{Tape, ChunkCost{Narrow: 3, Wide: 5}, ChunkCost{Narrow: 3, Wide: 5}},
	} {
		assert.Equal(t, tc.lean, r.Cost.ForRun(tc.kind, true), "%s lean", tc.kind)
		assert.Equal(t, tc.full, r.Cost.ForRun(tc.kind, false), "%s", tc.kind)
	}
	assert.Equal(t, ChunkCost{Narrow: 4, Wide: 9}, CostRule{Forward: ChunkCost{Narrow: 4, Wide: 9}}.ForRun(State, true),
		"no ForwardLean: Forward")
	assert.Equal(t, ChunkCost{Narrow: 3, Wide: 5}, CostRule{Backward: ChunkCost{Narrow: 3, Wide: 5}}.ForRun(Tape, true),
		"no BackwardLean: Backward")
	withLean := CostRule{Backward: ChunkCost{Narrow: 3, Wide: 5}, BackwardLean: ChunkCost{Narrow: 7, Wide: 10}}
	assert.Equal(t, ChunkCost{Narrow: 7, Wide: 10}, withLean.ForRun(Offset, true), "BackwardLean in a lean run")
	assert.Equal(t, ChunkCost{Narrow: 3, Wide: 5}, withLean.ForRun(Tape, false), "Backward otherwise")
	assert.Equal(t, "sm_90a/132 lean", Profile{Variant: VariantSM90a, SMs: 132, LeanForward: true}.String())
	assert.Contains(t, r.Note, "measured on an H200")
	for _, v := range []string{VariantSM100a, VariantSM103a, VariantSM107a} {
		r, _ := RulesFor(v)
		assert.Nil(t, r.Cost, v)
	}
	r, _ = RulesFor(VariantSM100a)
	assert.Equal(t, 400, r.LongChain)
	r, _ = RulesFor(VariantSM107a)
	assert.True(t, r.TapeTwoWave)

	p, err := NewProfile("sm_90a", 0)
	require.NoError(t, err)
	assert.Equal(t, Profile{Variant: "sm_90a", SMs: 132}, p)
	assert.Equal(t, 264, p.Slots())
	assert.Equal(t, "sm_90a/132", p.String())
	assert.Contains(t, p.Note(), "measured on an H200")
	p, err = NewProfile("generic", 84)
	require.NoError(t, err)
	assert.Equal(t, 168, p.Slots())

	_, err = NewProfile("generic", 0)
	assert.ErrorContains(t, err, "no default SM count")
	_, err = NewProfile("sm_100", 148)
	assert.ErrorContains(t, err, `unknown arch variant "sm_100"`)
	_, err = NewProfile("sm_100a", -1)
	assert.ErrorContains(t, err, "SM count -1")

	ref := ReferenceProfiles()
	require.Len(t, ref, 4)
	for _, p := range ref {
		assert.NoError(t, p.Validate())
	}
}
