package kcp

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzCPUBackend runs the CP backend on arbitrary small packs (up to eight
// documents of 1-256 tokens from docs, one byte each), rank counts 1-8, every
// layout and both stages, with heads 1 / 2 and dims 16: the output and every
// gradient must match the naive recurrence within 1e-10, and the walks at
// vh = 64 and vh = 128 must give the same bits. Plain `go test` runs the
// seeds; `go test ./kcp -run '^$' -fuzz FuzzCPUBackend` explores.
func FuzzCPUBackend(f *testing.F) {
	f.Add([]byte{4, 63, 2, 129, 0, 69}, uint8(3), uint8(2), true, uint64(1))
	f.Add([]byte{0, 0, 0, 0}, uint8(8), uint8(1), true, uint64(2))
	f.Add([]byte{255, 255}, uint8(5), uint8(0), false, uint64(3))
	f.Add([]byte{2, 1, 0}, uint8(2), uint8(2), true, uint64(4))
	f.Fuzz(func(t *testing.T, docs []byte, ranks, layout uint8, module bool, seed uint64) {
		if len(docs) == 0 {
			return
		}
		if len(docs) > 8 {
			docs = docs[:8]
		}
		lens := make([]int, len(docs))
		for i, b := range docs {
			lens[i] = int(b) + 1
		}
		R := 1 + int(ranks)%8
		p, err := NewPlan(PlanConfig{Docs: lens, Ranks: R, Layout: Layouts()[int(layout)%3], HQK: 1, HV: 2, DK: 16, DV: 16})
		require.NoError(t, err)
		stage := StageCore
		if module {
			stage = StageModule
		}
		ctx := context.Background()
		in, dout := RandomInputs(p, stage, seed)
		ref, refG, err := Reference(ctx, p, in, dout, Options{Stage: stage})
		require.NoError(t, err)
		var outs [2]*Activations
		var grads [2]*Grads
		for i, vh := range []int{64, 128} {
			be, err := NewCPU(p, Options{Stage: stage, ForceVH: vh})
			require.NoError(t, err)
			act, err := be.Forward(ctx, in)
			require.NoError(t, err)
			g, err := act.Backward(ctx, dout)
			require.NoError(t, err)
			outs[i], grads[i] = act, g
		}
		where := func(name string) string {
			return fmt.Sprintf("%s (docs %v, R %d, layout %s, %s)", name, lens, R, p.Config.Layout, stage)
		}
		requireClose(t, where("o"), outs[0].Out.O, ref.O, 1e-10)
		for i, n := range grads[0].Tensors() {
			requireClose(t, where(n.Name), n.Data, refG.Tensors()[i].Data, 1e-10)
		}
		requireBitwise(t, "o at vh 64 and 128", outs[0].Out.O, outs[1].Out.O)
		for i, n := range grads[0].Tensors() {
			requireBitwise(t, n.Name+" at vh 64 and 128", n.Data, grads[1].Tensors()[i].Data)
		}
	})
}
