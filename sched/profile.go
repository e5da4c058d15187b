package sched

import (
	"fmt"
	"slices"
	"strings"
)

// Width-rule variants: the GPU families the rules distinguish.
const (
	VariantSM100a  = "sm_100a" // GB200 / B200
	VariantSM103a  = "sm_103a" // GB300 / B300
	VariantSM107a  = "sm_107a" // R200
	VariantSM90a   = "sm_90a"  // Hopper: H100, H200
	VariantGeneric = "generic" // any other GPU
)

// LongChainChunks is the longest-chain threshold of the sm_100a clause of rule
// B: an offset or tape walk whose longest chain has at least this many chunks
// and whose two-CTA makespan exceeds its one-CTA makespan takes the two-wave
// rule.
const LongChainChunks = 400

// VariantRules is how rule B treats one variant. Rule A is the same on every
// variant.
type VariantRules struct {
	// TapeTwoWave: tape walks take the two-wave rule instead of always vh = 64
	// (sm_107a).
	TapeTwoWave bool
	// LongChain, when > 0: an offset or tape walk whose longest chain has at
	// least LongChain chunks and whose LPT(jobs2) > LPT(jobs1) takes the
	// two-wave rule (sm_100a, at LongChainChunks).
	LongChain int
	// DefaultSMs is the SM count assumed when none is given (0: none assumed).
	DefaultSMs int
	// Cost, when non-nil, replaces rule B's clauses on this variant for every
	// walk kind with a cost comparison measured on it (CostRule). Rule A does
	// not read it.
	Cost *CostRule
	// Measured says whether the rule was chosen by measurement on this variant.
	Measured bool
	// Note says where the rule comes from.
	Note string
}

var variants = map[string]VariantRules{
	VariantSM100a: {
		LongChain:  LongChainChunks,
		DefaultSMs: 148,
		Measured:   true,
		Note: "GB200/B200: rule B as measured upstream; offset and tape walks with a chain of >= 400 chunks " +
			"whose two-CTA makespan exceeds the one-CTA makespan take the two-wave rule",
	},
	VariantSM103a: {
		DefaultSMs: 148,
		Measured:   true,
		Note:       "GB300/B300: rule B as measured upstream; offset and tape walks always take vh = 64",
	},
	VariantSM107a: {
		TapeTwoWave: true,
		DefaultSMs:  148,
		Note: "R200: rule B as specified upstream (tape walks keep the two-wave rule); not measured upstream, " +
			"148 SMs assumed until real hardware says otherwise",
	},
	VariantSM90a: {
		DefaultSMs: 132,
		Cost: &CostRule{CTAsPerSM: 1, Forward: ChunkCost{Narrow: 4, Wide: 9}, ForwardLean: ChunkCost{Narrow: 1, Wide: 2},
			Backward: ChunkCost{Narrow: 3, Wide: 5}, Dispatch: true,
			StateSplitLean:              SplitModel{Cost: ChunkCost{Narrow: 3, Wide: 5}, MaxWidePercent: 50},
			BackwardSplitMaxWidePercent: 50},
		Measured: true,
		Note: "Hopper (H100/H200, 132 SMs): measured on an H200 with the v5 kernels (docs/perf-notes.md, " +
			"\"Width rule on sm_90a\"): one walk CTA an SM; a vh = 128 CTA's chunk costs 9/4 of a vh = 64 CTA's in " +
			"the forward's plane walks (summary, state) that store fp32 states, 2 in those that store only bf16 " +
			"ones (Profile.LeanForward: the v5 core stage; 15/8 before the v5.34 walks), and in the backward walks (offset, tape) 5/3 where the " +
			"tape walk stores fp32 dV' planes (the module stage) and, since the v5.32 walks, where it stores only bf16 " +
			"ones too (a lean run: 1.63-1.77 measured; v5.31's took 10/7, CostRule.BackwardLean, now unset); " +
			"vh = 64 iff Narrow*M64 <= Wide*M128, M the makespan of the CTAs over SM slots in the walks' dispatch " +
			"order (DispatchOrder). Splits between the widths (MixedWalk, CostRule.SplitFor): the offset and tape " +
			"walks at their 5/3, the lean state walk at 5/3 too, each with at most half of a chain's heads at vh = 128 " +
			"(measured on an H100 at 120,908 tokens in 3 documents: 24 heads of 48 at vh = 128 took the state walk " +
			"5.46 -> 4.46 ms, the tape walk's split 5.51 -> 4.83; on 3 x 342 chunks 8 heads 2.65 -> 2.41 (state), " +
			"2.79 -> 2.63 (tape); on 4 x 256 the 30 heads the uncapped model picks 2.16 -> 2.40 (state), " +
			"2.34 -> 2.65 (tape), slower; docs/perf-notes.md, \"Walks split between the widths, measured\")",
	},
	VariantGeneric: {
		Note: "any other GPU: not measured; uses rule B as written for sm_103a until measured; give the SM count",
	},
}

// CostRule is a width rule measured on one variant (sm_90a), in place of rule
// B's wave and chain-fit clauses, which assume two walk CTAs an SM. There the
// walk kernels hold CTAsPerSM CTAs an SM (their shared memory), and a vh = 128
// CTA takes Wide/Narrow times as long a chunk as a vh = 64 CTA, a ratio of
// each walk kind's kernels (For). A walk's time is then the makespan of its
// CTAs as the GPU hands them out, each to the first of CTAsPerSM*SM slots to
// come free, in launch order (the column tile fastest, then the segment in
// walk-list order, then the value head: ListMakespan) or, where Dispatch is
// set, in the order the walks take from DispatchOrder (its makespan), times
// its CTAs' chunk cost:
//
//	vh = 64  iff  M64 * Narrow <= M128 * Wide
//
// where M128 is the makespan of HV*tiles CTAs a segment and M64 of 2*HV*tiles,
// tiles = 2 for the summary and offset walks (their P and Q, or P^T and R,
// column sets are CTAs of their own) and 1 for the state and tape walks. A tie
// takes vh = 64. (LPT, which sorts the jobs first, is not what the GPU does: on
// 3 documents of 562, 625 and 704 chunks it predicts vh = 128, and vh = 64 is
// 9% faster.)
type CostRule struct {
	CTAsPerSM int       // walk CTAs resident on one SM
	Forward   ChunkCost // the summary and state walks
	// ForwardLean: the summary and state walks of a run whose forward stores
	// no fp32 per-chunk states (Profile.LeanForward); zero: Forward.
	ForwardLean ChunkCost
	Backward    ChunkCost // the offset and tape walks
	// BackwardLean: the offset and tape walks of a lean run (Profile.LeanForward:
	// kcp's v5 core stage, whose tape walk stores only bf16 dV' and D, where the
	// module stage's also stores fp32 dV' planes); zero: Backward.
	BackwardLean ChunkCost
	// StateSplitLean: how MixedWalkAtMost models the state walk of a lean
	// run split between the widths (SplitFor); zero: the model splits no
	// forward walk. Its costs are not ForwardLean's: those are measured with
	// every CTA of a walk at one width, and a split launch with a few wide
	// CTAs among narrow ones runs them beside fewer CTAs' HBM traffic, so
	// they cost less than ForwardLean says; with most heads wide they cost
	// what ForwardLean says, hence the cap on wide heads.
	StateSplitLean SplitModel
	// BackwardSplitMaxWidePercent: the most of a chain's value heads, in
	// percent, a split of the offset and tape walks puts at vh = 128
	// (SplitModel.MaxWidePercent; 0: any number). The cap is
	// StateSplitLean's, for the same reason: with most heads wide a wide CTA
	// costs what the single-width Backward says, and the model's uncapped
	// pick on four 256-chunk documents (30 of 48 heads) made the tape walk
	// 13% slower than vh 64 on an H100.
	BackwardSplitMaxWidePercent int
	// Dispatch: the variant's walks run their CTAs in DispatchOrder's order
	// (kcp passes it to the v5 walks), so the makespans compared are
	// DispatchOrder's; otherwise launch order's (ListMakespan).
	Dispatch bool
}

// ChunkCost is the relative cost of a chunk step of a vh = 64 CTA (Narrow) and
// of a vh = 128 CTA (Wide) of one walk kind's kernels.
type ChunkCost struct {
	Narrow int // relative chunk cost of a vh = 64 CTA
	Wide   int // relative chunk cost of a vh = 128 CTA
}

// For returns the chunk costs of kind's walks.
func (c CostRule) For(kind WalkKind) ChunkCost {
	if kind.Forward() {
		return c.Forward
	}
	return c.Backward
}

// ForRun returns the chunk costs of kind's walks in a run whose walks store no
// fp32 per-chunk states (lean) or do: where lean, ForwardLean for a forward
// walk and BackwardLean for a backward one, each if set; else For.
func (c CostRule) ForRun(kind WalkKind, lean bool) ChunkCost {
	l := c.BackwardLean
	if kind.Forward() {
		l = c.ForwardLean
	}
	if lean && l != (ChunkCost{}) {
		return l
	}
	return c.For(kind)
}

// SplitModel is how the width rule models a walk split between the widths
// (MixedWalkAtMost): its chunk costs, and the most of a chain's value heads
// it puts at vh = 128, MaxWidePercent of them (MaxWide; 0: all).
type SplitModel struct {
	Cost           ChunkCost
	MaxWidePercent int
}

// MaxWide is the most of a chain's hv value heads m puts at vh = 128: hv
// MaxWidePercent / 100 rounded down, at least 1, or hv where MaxWidePercent
// is 0.
func (m SplitModel) MaxWide(hv int) int {
	if m.MaxWidePercent <= 0 {
		return hv
	}
	return min(hv, max(1, hv*m.MaxWidePercent/100))
}

// SplitFor returns how MixedWalkAtMost models walk kind split between the
// widths in a lean run or not, and whether the model splits that walk at
// all: the offset and tape walks at their ForRun costs, with at most
// BackwardSplitMaxWidePercent of a chain's heads wide; the state walk of a
// lean run by StateSplitLean where it is set; no other walk (the summary
// walk's and the fp32 forward's splits are not measured).
func (c CostRule) SplitFor(kind WalkKind, lean bool) (SplitModel, bool) {
	switch {
	case !kind.Forward():
		return SplitModel{Cost: c.ForRun(kind, lean), MaxWidePercent: c.BackwardSplitMaxWidePercent}, true
	case kind == State && lean && c.StateSplitLean != (SplitModel{}):
		return c.StateSplitLean, true
	}
	return SplitModel{}, false
}

// Variants returns the known width-rule variants, sorted.
func Variants() []string {
	out := make([]string, 0, len(variants))
	for v := range variants {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

// RulesFor returns how rule B treats variant.
func RulesFor(variant string) (VariantRules, error) {
	r, ok := variants[variant]
	if !ok {
		return VariantRules{}, fmt.Errorf("sched: unknown arch variant %q (known: %s)", variant,
			strings.Join(Variants(), ", "))
	}
	return r, nil
}

// Profile is what the width rules need to know of a GPU: its width-rule
// variant and its SM count. The variant's rules (RulesFor) come with it, so a
// plain Profile{Variant: "sm_100a", SMs: 148} is complete. Profile is
// comparable and serves as a memoization key.
type Profile struct {
	Variant string // one of Variants()
	SMs     int    // streaming multiprocessors, >= 1
	// LeanForward: the run's walks store no fp32 per-chunk states (kcp's v5
	// core stage keeps only bf16 H and V' in the forward, bf16 dV' and D in
	// the tape walk), which makes a wide walk relatively cheaper on a variant
	// whose CostRule measured it (CostRule.ForwardLean, BackwardLean). It
	// describes the run, not the GPU: the backend sets it; NewProfile leaves
	// it false.
	LeanForward bool
}

// NewProfile returns the profile for variant with sms SMs; sms = 0 takes the
// variant's default SM count (an error for "generic", which has none).
func NewProfile(variant string, sms int) (Profile, error) {
	r, err := RulesFor(variant)
	if err != nil {
		return Profile{}, err
	}
	if sms == 0 {
		if r.DefaultSMs == 0 {
			return Profile{}, fmt.Errorf("sched: arch %s has no default SM count; give one", variant)
		}
		sms = r.DefaultSMs
	}
	p := Profile{Variant: variant, SMs: sms}
	return p, p.Validate()
}

// ReferenceProfiles returns the four profiles of the pinned width vectors and
// of `kcp plan --all`: sm_100a, sm_103a and sm_107a with 148 SMs, sm_90a with
// 132.
func ReferenceProfiles() []Profile {
	return []Profile{
		{Variant: VariantSM100a, SMs: 148},
		{Variant: VariantSM103a, SMs: 148},
		{Variant: VariantSM107a, SMs: 148},
		{Variant: VariantSM90a, SMs: 132},
	}
}

// Validate reports an unknown variant or an SM count below 1.
func (p Profile) Validate() error {
	if _, err := RulesFor(p.Variant); err != nil {
		return err
	}
	if p.SMs < 1 {
		return fmt.Errorf("sched: SM count %d for %s, need at least 1", p.SMs, p.Variant)
	}
	return nil
}

// Rules returns the profile's variant rules (zero for an unknown variant).
func (p Profile) Rules() VariantRules { return variants[p.Variant] }

// Note says where the profile's rule comes from and whether it was measured.
func (p Profile) Note() string { return variants[p.Variant].Note }

// Slots is the number of LPT slots, two CTAs per SM.
func (p Profile) Slots() int { return 2 * p.SMs }

// String is "variant/SMs", e.g. "sm_100a/148", with " lean" where LeanForward.
func (p Profile) String() string {
	if p.LeanForward {
		return fmt.Sprintf("%s/%d lean", p.Variant, p.SMs)
	}
	return fmt.Sprintf("%s/%d", p.Variant, p.SMs)
}
