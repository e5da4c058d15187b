package sched_test

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/sched"
)

func ExampleLPT() {
	// Five jobs over two slots: 3+2+2 | 3+2 would be 7; the optimum is 6.
	fmt.Println(sched.LPT([]int{3, 3, 2, 2, 2}, 2))
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
	fmt.Println(len(order), sched.ListMakespan(chains, 48, 2, 132), span)
	// Output: 288 1891 1686
}
