package sched

import "testing"

// BenchmarkDispatchOrder: a layout-D-like rank (30 segments of 10-700
// chunks, HV 48, the summary walk's 4 CTAs a segment at vh 64) on 132 slots:
// 5,760 CTAs, decided on the host before the walk's launch.
func BenchmarkDispatchOrder(b *testing.B) {
	chains := make([]int, 30)
	for i := range chains {
		chains[i] = 10 + (i*97)%690
	}
	for b.Loop() {
		if _, _, err := DispatchOrder(chains, 48, 4, 132); err != nil {
			b.Fatal(err)
		}
	}
}
