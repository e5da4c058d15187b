package kcp

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/sched"
)

// FuzzNewPlan feeds NewPlan arbitrary configurations: document lengths from
// docs (two bytes each, so up to 65,535 tokens a document and 32 documents;
// an odd last byte makes a zero-length document), any rank count, layout,
// head counts and dims. It must never panic: it returns an error, or a plan
// that keeps every invariant checkPlan checks, whose widths every rule and
// profile decide without panicking, and whose token tensors have a row a token.
// `go test ./kcp -run '^$' -fuzz FuzzNewPlan` explores; plain `go test` runs
// the seed corpus.
func FuzzNewPlan(f *testing.F) {
	le := func(ns ...int) []byte {
		b := make([]byte, 2*len(ns))
		for i, n := range ns {
			binary.LittleEndian.PutUint16(b[2*i:], uint16(n))
		}
		return b
	}
	f.Add(le(300, 40, 700), 2, byte(2), 0, 0, 0, 0, 0)
	f.Add(le(40000, 45000, 35908), 1, byte(0), 16, 48, 128, 128, 64)
	f.Add(le(1, 1, 1, 1, 64, 65), 8, byte(1), 1, 2, 16, 16, 64)
	f.Add(le(5000), 64, byte(1), 2, 4, 32, 64, 0)
	f.Add([]byte{7}, 3, byte(2), 0, 0, 0, 0, 0)     // a zero-length document
	f.Add(le(100), 0, byte(0), 0, 0, 0, 0, 0)       // no rank
	f.Add(le(100), 65, byte(0), 0, 0, 0, 0, 0)      // too many ranks
	f.Add(le(100), 1, byte(9), 0, 0, 0, 0, 0)       // no such layout
	f.Add(le(100), 1, byte(0), 3, 4, 0, 0, 0)       // HV not a multiple of HQK
	f.Add(le(100), 1, byte(0), -1, 48, 96, 128, 32) // negative heads, odd dims, chunk 32
	f.Add([]byte{}, 1, byte(0), 0, 0, 0, 0, 0)      // no documents
	f.Fuzz(func(t *testing.T, docs []byte, ranks int, layout byte, hqk, hv, dk, dv, chunk int) {
		if len(docs) > 64 {
			docs = docs[:64]
		}
		var lens []int
		for i := 0; i < len(docs); i += 2 {
			if i+1 == len(docs) {
				lens = append(lens, 0)
				break
			}
			lens = append(lens, int(binary.LittleEndian.Uint16(docs[i:])))
		}
		layouts := []Layout{LayoutC, LayoutZ, LayoutD, "X", ""}
		cfg := PlanConfig{Docs: lens, Ranks: ranks, Layout: layouts[int(layout)%len(layouts)], HQK: hqk, HV: hv, DK: dk,
			DV: dv, Chunk: chunk}
		p, err := NewPlan(cfg)
		if err != nil {
			require.Nil(t, p)
			require.Contains(t, err.Error(), "kcp: plan: ")
			return
		}
		checkPlan(t, p)
		for _, prof := range []sched.Profile{DefaultProfile, {Variant: sched.VariantSM90a, SMs: 1}} {
			for _, rule := range []sched.Rule{sched.RuleA, sched.RuleB} {
				ds, err := p.Decisions(prof, rule)
				require.NoError(t, err)
				require.Len(t, ds, p.Config.Ranks)
				for r, d := range ds {
					for k, dk := range d {
						if len(p.Ranks[r].Walk(sched.WalkKind(k))) > 0 {
							require.Contains(t, []int{64, 128}, dk.VH, "rank %d walk %s", r, sched.WalkKind(k))
						}
					}
				}
			}
		}
		for _, stage := range []Stage{StageCore, StageModule} {
			for _, s := range append(p.InputShapes(stage), p.OutputShape()) {
				require.NotEmpty(t, s.Shape, s.Name)
				if s.Name != "conv_w" {
					require.Equal(t, p.Tokens, s.Shape[0], "%s: a row a token", s.Name)
				}
			}
		}
	})
}
