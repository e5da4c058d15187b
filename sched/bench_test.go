package sched

import "testing"

// p1cp8d is the largest walk list of the benchmark packs: rank 0 of P1, CP 8,
// layout D (pieces 0 and 15 of six documents).
var p1cp8d = []int{60, 60, 18, 18, 44, 44, 8, 8, 72, 72, 35, 35}

// BenchmarkDecide is one rule-B decision for that walk list on sm_100a.
func BenchmarkDecide(b *testing.B) {
	prof := Profile{Variant: VariantSM100a, SMs: 148}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decide(State, p1cp8d, 48, prof, RuleB); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecideSM90a is the same decision on sm_90a, whose cost rule
// compares the dispatch orders' makespans (two DispatchOrder calls).
func BenchmarkDecideSM90a(b *testing.B) {
	prof := Profile{Variant: VariantSM90a, SMs: 132}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decide(State, p1cp8d, 48, prof, RuleB); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLPTJobs2 is LPT of that walk list's 1152 two-CTA jobs, given as a
// plain job list, over 296 slots.
func BenchmarkLPTJobs2(b *testing.B) {
	var jobs []int
	for _, c := range p1cp8d {
		jobs = append(jobs, rep(c, 96)...)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := LPT(jobs, 296); err != nil {
			b.Fatal(err)
		}
	}
}
