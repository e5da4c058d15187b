package kcp

import (
	"testing"

	"github.com/gdnkcp/gdnkcp/sched"
)

// largestWalk returns the walk list of P1, CP 8, layout D with the most
// segments (the most CTAs): the largest decision of the benchmark packs.
func largestWalk(tb testing.TB) (*Plan, int, sched.WalkKind) {
	pk, err := PackByName("P1")
	if err != nil {
		tb.Fatal(err)
	}
	p, err := NewPlan(PlanConfig{Docs: pk.Docs, Ranks: 8, Layout: LayoutD})
	if err != nil {
		tb.Fatal(err)
	}
	rank, kind, n := 0, sched.State, -1
	for r := range p.Ranks {
		for _, k := range sched.WalkKinds() {
			if len(p.Ranks[r].Walk(k)) > n {
				rank, kind, n = r, k, len(p.Ranks[r].Walk(k))
			}
		}
	}
	return p, rank, kind
}

func TestLargestWalk(t *testing.T) {
	p, rank, kind := largestWalk(t)
	// Rank 0 holds pieces 0 and 15 of all six documents: 12 segments.
	if n := len(p.Ranks[rank].Walk(kind)); n != 12 {
		t.Fatalf("largest walk list of P1 CP 8 D has %d segments, want 12", n)
	}
}

// BenchmarkDecideLargestWalk is one decision, not memoized, for the largest
// walk list of P1, CP 8, layout D (12 segments, 1152 CTAs at vh = 64).
// Target: under 20 µs.
func BenchmarkDecideLargestWalk(b *testing.B) {
	p, rank, kind := largestWalk(b)
	chains := p.Ranks[rank].WalkChains(kind)
	prof := sched.Profile{Variant: sched.VariantSM100a, SMs: 148}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sched.Decide(kind, chains, 48, prof, sched.RuleB); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWidthMemoized is a memoized lookup of that decision. Target: under
// 100 ns.
func BenchmarkWidthMemoized(b *testing.B) {
	p, rank, kind := largestWalk(b)
	prof := sched.Profile{Variant: sched.VariantSM100a, SMs: 148}
	if _, err := p.Width(rank, kind, prof, sched.RuleB); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.Width(rank, kind, prof, sched.RuleB); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWidthMemoizedParallel is the memoized lookup from many goroutines.
func BenchmarkWidthMemoizedParallel(b *testing.B) {
	p, rank, kind := largestWalk(b)
	prof := sched.Profile{Variant: sched.VariantSM100a, SMs: 148}
	if _, err := p.Width(rank, kind, prof, sched.RuleB); err != nil {
		b.Fatal(err)
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := p.Width(rank, kind, prof, sched.RuleB); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkNewPlanP1CP8D builds the plan of P1, CP 8, layout D.
func BenchmarkNewPlanP1CP8D(b *testing.B) {
	pk, _ := PackByName("P1")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewPlan(PlanConfig{Docs: pk.Docs, Ranks: 8, Layout: LayoutD}); err != nil {
			b.Fatal(err)
		}
	}
}
