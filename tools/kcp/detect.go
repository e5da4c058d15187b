package main

import (
	"errors"
	"fmt"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// detectGPU returns the width-rule profile of GPU 0, and a line naming it, for
// plan without --arch. It is a variable so tests can stand in a GPU.
var detectGPU = func() (sched.Profile, string, error) {
	// The blob override does not matter for the width rule.
	p, err := archdetect.Detect(0, archdetect.Options{IgnoreEnv: true})
	if err != nil {
		if errors.Is(err, loader.ErrNoDriver) {
			return sched.Profile{}, "", fmt.Errorf("no GPU detected (%v); pass --arch", err)
		}
		return sched.Profile{}, "", fmt.Errorf("cannot tell the GPU's width profile (%v); pass --arch", err)
	}
	prof, err := sched.NewProfile(p.Variant, p.SMs)
	if err != nil {
		return sched.Profile{}, "", fmt.Errorf("GPU 0 (%s): %w; pass --arch", p.Name, err)
	}
	return prof, fmt.Sprintf("GPU 0: %s (CC %d.%d, %d SMs)", p.Name, p.Major, p.Minor, p.SMs), nil
}
