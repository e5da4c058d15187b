package kcp_test

import (
	"context"
	"fmt"

	"github.com/gdnkcp/gdnkcp/kcp"
)

// Run a small module (conv + GDN) over three documents on three CP ranks with
// the CPU reference backend, in checkpoint mode (B3), and check it against the
// naive recurrence.
func ExampleCPU() {
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{90, 7, 150}, Ranks: 3, Layout: kcp.LayoutD, HQK: 1, HV: 2, DK: 16, DV: 16})
	if err != nil {
		panic(err)
	}
	in, dout := kcp.RandomInputs(plan, kcp.StageModule, 42)
	be, err := kcp.NewCPU(plan, kcp.Options{Stage: kcp.StageModule})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	ck, err := be.ForwardCheckpoint(ctx, in) // output + handle, nothing else kept
	if err != nil {
		panic(err)
	}
	act, err := ck.Recompute(ctx) // no communication
	if err != nil {
		panic(err)
	}
	grads, err := act.Backward(ctx, dout)
	if err != nil {
		panic(err)
	}
	refOut, refGrads, err := kcp.Reference(ctx, plan, in, dout, kcp.Options{Stage: kcp.StageModule})
	if err != nil {
		panic(err)
	}
	fmt.Println("output close:", kcp.RelErr(act.Out.O, refOut.O) < 1e-12)
	errs, _ := kcp.GradErrors(grads, refGrads)
	for _, e := range errs {
		fmt.Printf("%s close: %v\n", e.Name, e.RelErr < 1e-12)
	}
	// Output:
	// output close: true
	// dq close: true
	// dk close: true
	// dv close: true
	// dg close: true
	// dbeta close: true
	// dconv_w close: true
}
