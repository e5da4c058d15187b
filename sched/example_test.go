package sched_test

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/sched"
)

func ExampleLPT() {
	// Five jobs over two slots: 3+2+2 | 3+2 would be 7; the optimum is 6.
	makespan, err := sched.LPT([]int{3, 3, 2, 2, 2}, 2)
	if err != nil {
		panic(err)
	}
	fmt.Println(makespan)
	// Output: 7
}

func ExampleDecide() {
	prof := sched.Profile{Variant: sched.VariantSM100a, SMs: 148}
	// A state walk over seven segments: 672 CTAs at vh = 64, more than one
	// wave, but the LPT schedule of the two-CTA grid ends within the longest
	// chain: the short chains stack up behind the long one.
	chains := []int{100, 50, 50, 25, 25, 25, 25}
	for _, rule := range sched.Rules() {
		d, err := sched.Decide(sched.State, chains, 48, prof, rule)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.VH, d.Reason)
	}
	// Output:
	// 128 state walk, rule A: vh = 128: one-wave rule: 2*n_walk*HV = 672 > 2*SM = 296
	// 64 state walk, rule B: vh = 64: chain fit: LPT(jobs2) = 100 <= longest chain 100 (not one wave: 2*n_walk*HV = 672 > 2*SM = 296)
}

// ExampleDispatchOrder: the three documents of the 120,908-token pack at
// vh 64 (two column tiles a segment, HV 48) on the H200's 132 SMs. Launch
// order ends after 1891 chunk times; the order returned after 1686.
func ExampleDispatchOrder() {
	chains := []int{625, 704, 562}
	order, span, err := sched.DispatchOrder(chains, 48, 2, 132)
	if err != nil {
		panic(err)
	}
	launch, err := sched.ListMakespan(chains, 48, 2, 132)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(order), launch, span)
	// Output: 288 1891 1686
}

// ExampleMixedWalk: the same pack's tape walk (a vh 128 chunk costs 5/3 of a
// vh 64 one on sm_90a) split between the widths: 24 heads of every document
// at vh 128 pack the 132 SMs 11% tighter than vh 64 alone (5058 cost units).
func ExampleMixedWalk() {
	m, err := sched.MixedWalk([]int{625, 704, 562}, 48, 1, 132, sched.ChunkCost{Narrow: 3, Wide: 5})
	if err != nil {
		panic(err)
	}
	fmt.Println(m.Wide, m.Grid128(), m.Grid64(), m.Better())
	fmt.Println(m)
	// Output:
	// [24 24 24] [1 3 24] [2 3 24] true
	// mixed: 72 of 144 (segment, head) walks at vh = 128 (per chain [24 24 24]), makespan 4496 against 5058 at vh = 64 (-11.1%)
}

// ExampleMixedWalkAtMost: sm_90a's model of the core stage's state walk
// (CostRule.SplitFor: 5/3, at most half of a chain's heads at vh 128) on four
// documents of 256 chunks. Uncapped, the model would put 30 heads of each at
// vh 128 (measured 11% slower on an H100); capped, no split is 2% better, and
// the walk runs at vh 64.
func ExampleMixedWalkAtMost() {
	rule, err := sched.RulesFor(sched.VariantSM90a)
	if err != nil {
		panic(err)
	}
	model, _ := rule.Cost.SplitFor(sched.State, true)
	chains := []int{256, 256, 256, 256}
	all, err := sched.MixedWalk(chains, 48, 1, 132, model.Cost)
	if err != nil {
		panic(err)
	}
	capped, err := sched.MixedWalkAtMost(chains, 48, model.MaxWide(48), 1, 132, model.Cost)
	if err != nil {
		panic(err)
	}
	fmt.Println(all.Wide, all.Better())
	fmt.Println(model.MaxWide(48), capped.Better())
	// Output:
	// [30 30 30 30] true
	// 24 false
}
