package kcp

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
	"github.com/gdnkcp/gdnkcp/sched"
)

// smallPlan is a plan with small heads so the float64 backend runs fast.
func smallPlan(t *testing.T, docs []int, ranks int, layout Layout, dk int) *Plan {
	t.Helper()
	p, err := NewPlan(PlanConfig{Docs: docs, Ranks: ranks, Layout: layout, HQK: 2, HV: 4, DK: dk, DV: dk})
	require.NoError(t, err)
	return p
}

func requireClose(t *testing.T, name string, got, want []float64, tol float64) {
	t.Helper()
	e := RelErr(got, want)
	require.False(t, math.IsNaN(e), "%s: NaN", name)
	require.Less(t, e, tol, "%s: relative error %.3g", name, e)
}

func requireBitwise(t *testing.T, name string, a, b []float64) {
	t.Helper()
	require.Equal(t, len(a), len(b), name)
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) {
			t.Fatalf("%s: element %d differs: %v vs %v", name, i, a[i], b[i])
		}
	}
}

// The CP backend over every layout and rank count equals the naive
// recurrence, for the output and every gradient, core and module.
func TestCPUMatchesNaive(t *testing.T) {
	packs := map[string][]int{
		"short docs":      {5, 64, 3, 130, 1, 70},
		"one chunk":       {64, 64},
		"spans all":       {700},
		"mixed":           {200, 9, 333},
		"shorter than 2R": {6, 2, 15},
	}
	for name, docs := range packs {
		for _, layout := range Layouts() {
			for _, R := range []int{1, 2, 3, 4, 8} {
				for _, stage := range []Stage{StageCore, StageModule} {
					if stage == StageModule && R != 2 && R != 3 && name != "short docs" {
						continue // the module path adds the halo exchange; cover it on a subset
					}
					t.Run(fmt.Sprintf("%s/%s/R%d/%s", name, layout, R, stage), func(t *testing.T) {
						p := smallPlan(t, docs, R, layout, 16)
						in, dout := RandomInputs(p, stage, uint64(R*31+len(docs)))
						opts := Options{Stage: stage}
						ref, refG, err := Reference(context.Background(), p, in, dout, opts)
						require.NoError(t, err)
						be, err := NewCPU(p, opts)
						require.NoError(t, err)
						act, err := be.Forward(context.Background(), in)
						require.NoError(t, err)
						requireClose(t, "o", act.Out.O, ref.O, 1e-10)
						g, err := act.Backward(context.Background(), dout)
						require.NoError(t, err)
						errs, err := GradErrors(g, refG)
						require.NoError(t, err)
						for _, e := range errs {
							require.False(t, math.IsNaN(e.RelErr), e.Name)
							require.Less(t, e.RelErr, 1e-10, "%s: relative error %.3g", e.Name, e.RelErr)
						}
					})
				}
			}
		}
	}
}

// Production head dims (128) on a short pack, one layout.
func TestCPUMatchesNaiveDim128(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{70, 90}, Ranks: 2, Layout: LayoutD, HQK: 1, HV: 2, DK: 128, DV: 128})
	require.NoError(t, err)
	in, dout := RandomInputs(p, StageModule, 7)
	opts := Options{Stage: StageModule}
	ref, refG, err := Reference(context.Background(), p, in, dout, opts)
	require.NoError(t, err)
	be, err := NewCPU(p, opts)
	require.NoError(t, err)
	act, err := be.Forward(context.Background(), in)
	require.NoError(t, err)
	requireClose(t, "o", act.Out.O, ref.O, 1e-10)
	g, err := act.Backward(context.Background(), dout)
	require.NoError(t, err)
	for i, n := range g.Tensors() {
		requireClose(t, n.Name, n.Data, refG.Tensors()[i].Data, 1e-10)
	}
}

// Both walk widths, two runs, and forward vs recompute give the same bits.
func TestCPUBitwise(t *testing.T) {
	for _, layout := range Layouts() {
		t.Run(string(layout), func(t *testing.T) {
			p := smallPlan(t, []int{150, 40, 260}, 3, layout, 16)
			in, dout := RandomInputs(p, StageModule, 11)
			run := func(vh int) (*Activations, *Grads) {
				be, err := NewCPU(p, Options{Stage: StageModule, ForceVH: vh})
				require.NoError(t, err)
				act, err := be.Forward(context.Background(), in)
				require.NoError(t, err)
				g, err := act.Backward(context.Background(), dout)
				require.NoError(t, err)
				return act, g
			}
			a64, g64 := run(64)
			a128, g128 := run(128)
			aRule, gRule := run(0)
			aAgain, gAgain := run(0)
			for _, other := range []struct {
				name string
				a    *Activations
				g    *Grads
			}{{"vh128", a128, g128}, {"rule", aRule, gRule}, {"second run", aAgain, gAgain}} {
				requireBitwise(t, other.name+" o", a64.Out.O, other.a.Out.O)
				for i, n := range g64.Tensors() {
					requireBitwise(t, other.name+" "+n.Name, n.Data, other.g.Tensors()[i].Data)
				}
			}
			// Checkpoint mode: the recompute reproduces the forward's
			// intermediates bit for bit, with no communication.
			be, err := NewCPU(p, Options{Stage: StageModule})
			require.NoError(t, err)
			ck, err := be.ForwardCheckpoint(context.Background(), in)
			require.NoError(t, err)
			requireBitwise(t, "checkpoint o", aRule.Out.O, ck.Out.O)
			re, err := ck.Recompute(context.Background())
			require.NoError(t, err)
			requireBitwise(t, "recompute o", aRule.Out.O, re.Out.O)
			require.Equal(t, aRule.Decisions, re.Decisions)
			for r := range aRule.ranks {
				for s, cs := range aRule.ranks[r].segs {
					for h, hd := range cs.heads {
						rh := re.ranks[r].segs[s].heads[h]
						for c := range hd.states.H {
							requireBitwise(t, "recompute H", hd.states.H[c].RawMatrix().Data, rh.states.H[c].RawMatrix().Data)
						}
						requireBitwise(t, "recompute V'", hd.states.VNew.RawMatrix().Data, rh.states.VNew.RawMatrix().Data)
					}
				}
			}
			g3, err := re.Backward(context.Background(), dout)
			require.NoError(t, err)
			for i, n := range gRule.Tensors() {
				requireBitwise(t, "b3 "+n.Name, n.Data, g3.Tensors()[i].Data)
			}
		})
	}
}

// Widths come from the plan's memo under the backend's profile and rule.
func TestCPUDecisionsFromPlan(t *testing.T) {
	p := smallPlan(t, []int{300, 200}, 2, LayoutD, 16)
	in, _ := RandomInputs(p, StageCore, 3)
	prof := sched.Profile{Variant: sched.VariantSM100a, SMs: 148}
	be, err := NewCPU(p, Options{Profile: prof, Rule: sched.RuleA})
	require.NoError(t, err)
	act, err := be.Forward(context.Background(), in)
	require.NoError(t, err)
	want, err := p.Decisions(prof, sched.RuleA)
	require.NoError(t, err)
	require.Equal(t, want, act.Decisions)
}

func TestCPUBadInput(t *testing.T) {
	p := smallPlan(t, []int{10, 20}, 2, LayoutC, 16)
	in, dout := RandomInputs(p, StageCore, 1)
	_, err := NewCPU(nil, Options{})
	require.ErrorContains(t, err, "plan is nil")
	_, err = NewCPU(p, Options{ForceVH: 96})
	require.ErrorContains(t, err, "ForceVH 96")
	_, err = NewCPU(p, Options{Stage: "attention"})
	require.ErrorContains(t, err, "unknown stage")
	be, err := NewCPU(p, Options{})
	require.NoError(t, err)
	bad := *in
	bad.V = bad.V[:len(bad.V)-1]
	_, err = be.Forward(context.Background(), &bad)
	require.ErrorContains(t, err, "v has")
	require.ErrorContains(t, err, "[T, HV, V]")
	mod, err := NewCPU(p, Options{Stage: StageModule})
	require.NoError(t, err)
	_, err = mod.Forward(context.Background(), in)
	require.ErrorContains(t, err, "conv_w has 0 elements")
	nan := *in
	nan.G = append([]float32(nil), in.G...)
	nan.G[5] = float32(math.NaN())
	require.ErrorContains(t, nan.Validate(p, StageCore, true), "g [T, HV]: element 5")
	grow := *in
	grow.G = append([]float32(nil), in.G...)
	grow.G[9] = 0.25
	for _, finite := range []bool{true, false} {
		require.ErrorContains(t, grow.Validate(p, StageCore, finite), "g [T, HV]: element 9 ([2 1]) is 0.25: g is a log-decay, at most 0")
	}
	_, err = be.Forward(context.Background(), &grow)
	require.ErrorContains(t, err, "g is a log-decay")
	grow.G[9] = 0
	require.NoError(t, grow.Validate(p, StageCore, true), "g = 0: no decay")
	act, err := be.Forward(context.Background(), in)
	require.NoError(t, err)
	_, err = act.Backward(context.Background(), dout[:3])
	require.ErrorContains(t, err, "dout has 3 elements")
	var empty *Checkpoint
	_, err = empty.Recompute(context.Background())
	require.Error(t, err)
}

// TestCPUConvOutOverride: the module stage's conv output given in
// Options.convOut (what the GPU tests hand over from GPUForward.ConvOutput)
// replaces the conv's own. Given the float64 conv output rounded to bf16,
// the gradients equal the convBF16 reference's bit for bit at R 1 and R 2
// (with halos); one element one bf16 ulp away changes them; a wrong length
// is an error.
func TestCPUConvOutOverride(t *testing.T) {
	docs := []int{70, 5, 130}
	p1 := smallPlan(t, docs, 1, LayoutC, 16)
	in, dout := RandomInputs(p1, StageModule, 11)
	c, err := NewCPU(p1, Options{Stage: StageModule})
	require.NoError(t, err)
	C := p1.ConvChannels()
	y := make([]float32, p1.Tokens*C)
	for i := range p1.Ranks[0].Segments { // R 1: a segment a document, no halos
		seg := &p1.Ranks[0].Segments[i]
		yd, err := gdnref.Conv1dForward(c.preConv(seg, in), c.convWeights(in), nil)
		require.NoError(t, err)
		for r := range seg.Len {
			for j, v := range yd.RawRowView(r) {
				y[(seg.Start+r)*C+j] = bf16.Round(float32(v))
			}
		}
	}
	grads := func(p *Plan, o Options) []Named { return cpuGrads(t, p, o, in, dout).Tensors() }
	for _, R := range []int{1, 2} {
		p := smallPlan(t, docs, R, LayoutC, 16)
		want := grads(p, Options{Stage: StageModule, convBF16: true})
		got := grads(p, Options{Stage: StageModule, convOut: y})
		for i := range want {
			requireBitwise(t, fmt.Sprintf("R %d %s", R, want[i].Name), got[i].Data, want[i].Data)
		}
		y2 := append([]float32(nil), y...)
		k := 37*C + 5 // a q channel of token 37
		y2[k] = bf16.BF16ToFloat32(bf16.Float32ToBF16(y2[k]) + 1)
		moved := grads(p, Options{Stage: StageModule, convOut: y2})
		require.NotEqual(t, want[1].Data, moved[1].Data, "R %d: dk with one conv output element 1 ulp away", R)
	}
	be, err := NewCPU(p1, Options{Stage: StageModule, convOut: y[:len(y)-1]})
	require.NoError(t, err)
	_, err = be.Forward(context.Background(), in)
	require.ErrorContains(t, err, "conv output override")
}
