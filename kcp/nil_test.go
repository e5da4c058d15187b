package kcp

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/niltest"
)

// TestNilValuesNoPanic calls every exported method of a nil pointer of each
// of kcp's exported types with zero arguments: each returns zero values or an
// error, none panics (TestNewGPUErrors checks what the GPU's give).
func TestNilValuesNoPanic(t *testing.T) {
	niltest.NoPanics(t, (*GPU)(nil), (*GPUForward)(nil), (*GPUCheckpoint)(nil), (*GPUGrads)(nil), (*CPU)(nil),
		(*Activations)(nil), (*Checkpoint)(nil), (*Plan)(nil), (*Inputs)(nil), (*Grads)(nil), (*Output)(nil),
		(*RankPlan)(nil), (*GPUOptions)(nil))
	var p *Plan
	require.Nil(t, p.Segment(SegRef{}))
	require.ErrorContains(t, p.CheckDOut(nil, false), "kcp: plan is nil")
	_, err := p.Decisions(DefaultProfile, 0)
	require.ErrorContains(t, err, "kcp: plan is nil")
	require.ErrorContains(t, (&Inputs{}).Validate(nil, StageCore, false), "kcp: plan is nil")
	real := smallPlan(t, []int{10}, 1, LayoutC, 16)
	require.NotNil(t, real.Segment(SegRef{}))
	require.Nil(t, real.Segment(SegRef{Rank: 0, Seg: 1}), "a segment index past the rank's")
	require.Nil(t, real.Segment(SegRef{Rank: 1}), "a rank past the plan's")
}
