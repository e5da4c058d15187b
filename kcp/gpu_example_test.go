package kcp_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
)

// Train one step of the GDN module on the GPU: pick the fastest kernel set
// the device can run, forward (keeping what the backward needs), backward,
// and compare with the naive float64 recurrence. Two CP ranks share the one
// GPU through the loopback communicator. (Not run as a test: it needs a
// CUDA GPU; without one ChooseKernels says so.)
func ExampleChooseKernels() {
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{300, 40, 700}, Ranks: 2, Layout: kcp.LayoutD,
		HQK: 16, HV: 48, DK: 128, DV: 128})
	if err != nil {
		panic(err)
	}
	set, why, err := kcp.ChooseKernels(0, "")
	if errors.Is(err, loader.ErrNoDriver) || loader.IsCode(err, loader.ErrorNoDevice) {
		fmt.Println("no CUDA GPU here: use kcp.NewCPU")
		return
	}
	if err != nil {
		panic(err)
	}
	fmt.Println(why) // e.g. "auto: v5 (the fastest set; ...)" on an H200
	opts := kcp.GPUOptions{Options: kcp.Options{Stage: kcp.StageModule}, KeepDevice: true}
	if err := opts.SetKernels(set); err != nil {
		panic(err)
	}
	g, err := kcp.NewGPU(plan, opts)
	if err != nil {
		panic(err)
	}
	defer g.Close()
	in, dout := kcp.RandomInputs(plan, kcp.StageModule, 7)
	ctx := context.Background()
	f, err := g.Forward(ctx, in)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	grads, err := f.Backward(ctx, dout)
	if err != nil {
		panic(err)
	}
	ref, refGrads, err := kcp.Reference(ctx, plan, in, dout, kcp.Options{Stage: kcp.StageModule})
	if err != nil {
		panic(err)
	}
	fmt.Printf("output %.1e, dq %.1e\n", kcp.RelErr(f.Output().O, ref.O), kcp.RelErr(grads.Gradients().DQ, refGrads.DQ))
}

// Run the GDN core forward of a packed batch on the GPU with the zero
// GPUOptions: the fastest kernel set the device and its blob allow, which
// GPU.Kernels names. (Not run as a test: it needs a CUDA GPU.)
func ExampleNewGPU() {
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{4096, 900, 3000}, Ranks: 1, Layout: kcp.LayoutC,
		HQK: 16, HV: 48, DK: 128, DV: 128})
	if err != nil {
		panic(err)
	}
	g, err := kcp.NewGPU(plan, kcp.GPUOptions{})
	if errors.Is(err, loader.ErrNoDriver) || loader.IsCode(err, loader.ErrorNoDevice) {
		fmt.Println("no CUDA GPU here: use kcp.NewCPU")
		return
	}
	if err != nil {
		panic(err)
	}
	defer g.Close()
	set, why := g.Kernels()
	fmt.Println(set, "-", why) // e.g. "v5 - auto: v5 (the fastest set; ...)" on an H200
	in, _ := kcp.RandomInputs(plan, kcp.StageCore, 1)
	f, err := g.Forward(context.Background(), in)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	fmt.Println("output tokens:", len(f.Output().O)/(48*128))
}
