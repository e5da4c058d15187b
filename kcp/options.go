package kcp

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/sched"
)

// DefaultProfile is the width-rule profile a backend uses when Options leaves
// it unset: the H200 this project is tested on (sm_90a, 132 SMs).
var DefaultProfile = sched.Profile{Variant: sched.VariantSM90a, SMs: 132}

// Options configure a backend run. The zero value is the module's default:
// stage core, scale 1/sqrt(K), q/k l2-normalised, widths from rule B on
// DefaultProfile.
type Options struct {
	Stage    Stage         // StageCore (default) or StageModule
	Scale    float64       // output scale; 0 means 1/sqrt(DK)
	NoL2Norm bool          // turn the in-kernel l2norm of q and k off
	Profile  sched.Profile // width-rule profile; zero means DefaultProfile
	Rule     sched.Rule    // width rule; zero means rule B
	// ForceVH runs every walk at one width (64 or 128) instead of the width
	// rule's decision, for oracle comparisons; 0 follows the rule.
	ForceVH int
	// Progress, when set, is called after each stage of each rank (from the
	// rank's goroutine; it must be safe for concurrent use).
	Progress func(rank int, stage string)

	// convBF16 rounds the float64 conv output to bf16 (through float32), as
	// the GPU stores its own (set by tests only; the GPU tests use convOut,
	// which is the GPU's values exactly).
	convBF16 bool
	// convOut, when set, is the module stage's conv output to use in place of
	// the conv's own, [T, C] in global token order (a GPU's bf16 conv output,
	// from GPUForward.ConvOutput), so that tests compare a GPU's gradients
	// with a reference that saw the very values the GPU stored: bf16 values
	// that the float64 conv rounds the other way (1 ulp of bf16 in a few
	// elements) move dg by up to ~1e-4 on a few hundred tokens (set by tests
	// only).
	convOut []float32
}

// Stage names reported to Options.Progress, in the order a rank runs them.
var (
	ForwardStages   = []string{"conv", "prep", "summary walk", "exchange summaries", "compose", "state walk", "output"}
	RecomputeStages = []string{"conv", "prep", "state walk", "output"}
	BackwardStages  = []string{"dv local", "offset walk", "exchange offsets", "reverse compose", "tape walk", "chunk grads", "conv backward"}
)

func (o Options) normalize() (Options, error) {
	if o.Stage == "" {
		o.Stage = StageCore
	}
	if _, err := ParseStage(string(o.Stage)); err != nil {
		return o, err
	}
	if o.Profile == (sched.Profile{}) {
		o.Profile = DefaultProfile
	}
	if err := o.Profile.Validate(); err != nil {
		return o, fmt.Errorf("kcp: options: %w", err)
	}
	if o.Rule == 0 {
		o.Rule = sched.RuleB
	}
	switch o.ForceVH {
	case 0, 64, 128:
	default:
		return o, fmt.Errorf("kcp: options: ForceVH %d (want 0, 64 or 128)", o.ForceVH)
	}
	if o.Scale < 0 {
		return o, fmt.Errorf("kcp: options: negative scale %v", o.Scale)
	}
	return o, nil
}

func (o Options) progress(rank int, stage string) {
	if o.Progress != nil {
		o.Progress(rank, stage)
	}
}
