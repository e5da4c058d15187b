package kcp_test

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/sched"
)

func ExampleNewPlan() {
	// Two documents (200 and 90 tokens) over two ranks, per-document zigzag:
	// each document is cut into 4 pieces; rank 0 holds pieces 0 and 3 of each,
	// rank 1 pieces 1 and 2, which are adjacent and merge into one segment.
	p, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{200, 90}, Ranks: 2, Layout: kcp.LayoutD})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, rp := range p.Ranks {
		fmt.Printf("rank %d: %d tokens\n", rp.Rank, rp.Tokens)
		for i, s := range rp.Segments {
			fmt.Printf("  seg %d: doc %d [%d,%d) %d chunks, halo %+v\n", i, s.Doc, s.Start, s.End(), s.Chunks, s.Halo)
		}
		fmt.Println("  summary", rp.Summary, "state", rp.State, "offset", rp.Offset, "tape", rp.Tape)
	}
	// Output:
	// rank 0: 145 tokens
	//   seg 0: doc 0 [0,50) 1 chunks, halo []
	//   seg 1: doc 0 [150,200) 1 chunks, halo [{Rank:1 Seg:0 Offset:97 Count:3}]
	//   seg 2: doc 1 [200,223) 1 chunks, halo []
	//   seg 3: doc 1 [268,290) 1 chunks, halo [{Rank:1 Seg:1 Offset:42 Count:3}]
	//   summary [0 2] state [0 1 2 3] offset [1 3] tape [0 1 2 3]
	// rank 1: 145 tokens
	//   seg 0: doc 0 [50,150) 2 chunks, halo [{Rank:0 Seg:0 Offset:47 Count:3}]
	//   seg 1: doc 1 [223,268) 1 chunks, halo [{Rank:0 Seg:2 Offset:20 Count:3}]
	//   summary [0 1] state [0 1] offset [0 1] tape [0 1]
}

func ExamplePlan_Width() {
	pk, _ := kcp.PackByName("P3")
	p, err := kcp.NewPlan(kcp.PlanConfig{Docs: pk.Docs, Ranks: 8, Layout: kcp.LayoutC})
	if err != nil {
		fmt.Println(err)
		return
	}
	gb200 := sched.Profile{Variant: sched.VariantSM100a, SMs: 148}
	for _, rule := range sched.Rules() {
		d, err := p.Width(3, sched.State, gb200, rule)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Reason)
	}
	// Output:
	// state walk, rule A: vh = 64: one-wave rule: 2*n_walk*HV = 96 <= 2*SM = 296
	// state walk, rule B: vh = 64: one wave: 2*n_walk*HV = 96 <= 2*SM = 296
}
