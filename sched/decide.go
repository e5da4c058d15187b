package sched

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Rule selects a width rule.
type Rule uint8

// The width rules. The zero Rule is invalid.
const (
	RuleA Rule = 1 // previous rule: forward walks one wave, offset and tape walks two waves
	RuleB Rule = 2 // current rule (DESIGN.md §4)
)

// Rules returns rule A and rule B.
func Rules() []Rule { return []Rule{RuleA, RuleB} }

// String is "A" or "B".
func (r Rule) String() string {
	switch r {
	case RuleA:
		return "A"
	case RuleB:
		return "B"
	}
	return fmt.Sprintf("Rule(%d)", uint8(r))
}

// ParseRule reads "a", "A", "b" or "B".
func ParseRule(s string) (Rule, error) {
	switch strings.ToUpper(strings.TrimSpace(s)) {
	case "A":
		return RuleA, nil
	case "B":
		return RuleB, nil
	}
	return 0, fmt.Errorf("sched: unknown rule %q (want a or b)", s)
}

// WalkKind is one of the four walks.
type WalkKind uint8

// The walks, in launch order.
const (
	Summary WalkKind = iota // forward: segments with a chain successor, from zero state
	State                   // forward: every segment, from its true start state
	Offset                  // backward: segments with a chain predecessor, from zero adjoint
	Tape                    // backward: every segment, from its true terminal adjoint

	// NumWalkKinds is the number of walk kinds.
	NumWalkKinds = 4
)

// WalkKinds returns the four walks in launch order.
func WalkKinds() []WalkKind { return []WalkKind{Summary, State, Offset, Tape} }

var walkNames = [NumWalkKinds]string{"summary", "state", "offset", "tape"}

// String is "summary", "state", "offset" or "tape".
func (k WalkKind) String() string {
	if k < NumWalkKinds {
		return walkNames[k]
	}
	return fmt.Sprintf("WalkKind(%d)", uint8(k))
}

// Forward reports whether k is a forward walk (summary or state).
func (k WalkKind) Forward() bool { return k == Summary || k == State }

// ColumnSets is the column sets a walk of kind k runs, its CTAs a (segment,
// head) at vh = 128: 2 for the summary and offset walks (P and Q, P^T and
// R), 1 for the state and tape walks.
func (k WalkKind) ColumnSets() int {
	if k == Summary || k == Offset {
		return 2
	}
	return 1
}

// ParseWalkKind reads a walk name as String writes it.
func ParseWalkKind(s string) (WalkKind, error) {
	for i, n := range walkNames {
		if strings.EqualFold(s, n) {
			return WalkKind(i), nil
		}
	}
	return 0, fmt.Errorf("sched: unknown walk %q (want summary, state, offset or tape)", s)
}

// Decision is the width of one walk launch and why.
type Decision struct {
	Kind WalkKind // the walk decided for
	Rule Rule     // the rule that decided
	// VH is the value columns per CTA: 64 (2*HV CTAs per segment) or 128 (HV
	// CTAs per segment); 0 for an empty walk list, which launches nothing.
	VH int
	// NWalk is the number of walked segments.
	NWalk int
	// LongestChain is the largest walked chunk count.
	LongestChain int
	// Makespan1 is LPT(jobs1) and Makespan2 is LPT(jobs2), over 2*SM slots.
	Makespan1, Makespan2 int
	// CostSlots, CostMakespan1 and CostMakespan2 are filled in where the
	// variant has a CostRule: its slots (CTAsPerSM*SM) and the makespans of
	// the vh = 128 and the vh = 64 CTAs over them, in the variant's CTA order
	// (DispatchOrder where CostRule.Dispatch is set, else ListMakespan's launch
	// order).
	CostSlots, CostMakespan1, CostMakespan2 int
	// OneWave: 2*n_walk*HV <= 2*SM. TwoWaves: 2*n_walk*HV <= 4*SM.
	// ChainFit: LPT(jobs2) <= LongestChain.
	OneWave, TwoWaves, ChainFit bool
	// Reason is one line saying which clause decided VH.
	Reason string
}

// Launches reports whether the walk launches anything.
func (d Decision) Launches() bool { return d.VH != 0 }

// CTAsPerSegment is the number of CTAs per walked segment for hv value heads:
// 2*hv at vh = 64, hv at vh = 128, 0 when nothing launches.
func (d Decision) CTAsPerSegment(hv int) int {
	switch d.VH {
	case 64:
		return 2 * hv
	case 128:
		return hv
	}
	return 0
}

var lptPool = sync.Pool{New: func() any { return new(lptState) }}

// Decide picks the width of one walk launch (DESIGN.md §4). chains holds the
// chunk count of every walked segment, in walk-list order; hv is the number of
// value heads.
//
// Let slots = 2*SM, jobs1 = every chain hv times and jobs2 = every chain 2*hv
// times (each of a segment's two vh = 64 CTAs walks its whole chain over half
// the columns). One wave: 2*n_walk*hv <= 2*SM; two waves: 2*n_walk*hv <=
// 4*SM; chain fit: LPT(jobs2, slots) <= the longest chain.
//
// Rule B: summary and state walks take vh = 64 iff one wave or chain fit;
// offset walks take 64; tape walks take 64, except on sm_107a where they take
// the two-wave rule (64 iff two waves). On sm_100a, an offset or tape walk
// whose longest chain is >= 400 chunks and whose LPT(jobs2) > LPT(jobs1) takes
// the two-wave rule. A variant with a CostRule (sm_90a) takes it for every
// walk instead (CostRule's doc). generic follows sm_103a.
//
// Rule A: summary and state walks take 64 iff one wave; offset and tape walks
// iff two waves.
//
// An empty chains launches nothing (VH 0). Errors: an unknown kind or rule,
// an invalid profile (unknown variant, SMs < 1), hv < 1, a chain below 1
// chunk, and, under a cost rule with Dispatch, more CTAs than an int32
// indexes (DispatchOrder's error). Both makespans are filled in under
// either rule.
func Decide(kind WalkKind, chains []int, hv int, prof Profile, rule Rule) (Decision, error) {
	if kind >= NumWalkKinds {
		return Decision{}, fmt.Errorf("sched: unknown walk kind %d", uint8(kind))
	}
	if rule != RuleA && rule != RuleB {
		return Decision{}, fmt.Errorf("sched: unknown rule %d (want RuleA or RuleB)", uint8(rule))
	}
	vr, ok := variants[prof.Variant]
	if !ok {
		return Decision{}, prof.Validate()
	}
	if prof.SMs < 1 {
		return Decision{}, prof.Validate()
	}
	if hv < 1 {
		return Decision{}, fmt.Errorf("sched: HV %d, need at least 1", hv)
	}
	d := Decision{Kind: kind, Rule: rule, NWalk: len(chains)}
	for i, c := range chains {
		if c < 1 {
			return Decision{}, fmt.Errorf("sched: %s walk: chain %d has %d chunks, need at least 1", kind, i, c)
		}
		d.LongestChain = max(d.LongestChain, c)
	}
	head := fmt.Sprintf("%s walk, rule %s", kind, rule)
	if len(chains) == 0 {
		d.Reason = head + ": empty walk list: launch nothing"
		return d, nil
	}

	slots := prof.Slots()
	var desc [16]int
	sorted := append(desc[:0], chains...)
	slices.SortFunc(sorted, func(a, b int) int { return b - a })
	lp := lptPool.Get().(*lptState)
	d.Makespan1 = lptRepeated(lp, sorted, hv, slots)
	d.Makespan2 = lptRepeated(lp, sorted, 2*hv, slots)
	lptPool.Put(lp)
	cost := vr.Cost
	if cost != nil {
		tiles := kind.ColumnSets()
		d.CostSlots = cost.CTAsPerSM * prof.SMs
		if cost.Dispatch {
			var err1, err2 error
			_, d.CostMakespan1, err1 = DispatchOrder(chains, hv, tiles, d.CostSlots)
			_, d.CostMakespan2, err2 = DispatchOrder(chains, hv, 2*tiles, d.CostSlots)
			if err := errors.Join(err1, err2); err != nil {
				return Decision{}, fmt.Errorf("sched: %s walk: %w", kind, err)
			}
		} else {
			var err1, err2 error
			d.CostMakespan1, err1 = ListMakespan(chains, hv, tiles, d.CostSlots)
			d.CostMakespan2, err2 = ListMakespan(chains, hv, 2*tiles, d.CostSlots)
			if err := errors.Join(err1, err2); err != nil {
				return Decision{}, fmt.Errorf("sched: %s walk: %w", kind, err)
			}
		}
	}

	ctas := 2 * d.NWalk * hv
	d.OneWave = ctas <= 2*prof.SMs
	d.TwoWaves = ctas <= 4*prof.SMs
	d.ChainFit = d.Makespan2 <= d.LongestChain

	oneWave := func() string {
		return fmt.Sprintf("2*n_walk*HV = %d %s 2*SM = %d", ctas, leq(d.OneWave), 2*prof.SMs)
	}
	twoWaveRule := func() (bool, string) {
		return d.TwoWaves, fmt.Sprintf("two-wave rule: 2*n_walk*HV = %d %s 4*SM = %d", ctas, leq(d.TwoWaves), 4*prof.SMs)
	}
	chainFit := func() string {
		return fmt.Sprintf("LPT(jobs2) = %d %s longest chain %d", d.Makespan2, leq(d.ChainFit), d.LongestChain)
	}

	var narrow bool
	var why string
	switch {
	case rule == RuleA && kind.Forward():
		narrow, why = d.OneWave, "one-wave rule: "+oneWave()
	case rule == RuleA:
		narrow, why = twoWaveRule()
	case cost != nil:
		head += ", " + prof.Variant
		cc := cost.ForRun(kind, prof.LeanForward)
		if cc != cost.For(kind) {
			if kind.Forward() {
				head += " (lean forward: no fp32 states stored)"
			} else {
				head += " (lean run: bf16 per-chunk outputs only)"
			}
		}
		a, b := d.CostMakespan2*cc.Narrow, d.CostMakespan1*cc.Wide
		narrow = a <= b
		order := "launch-order"
		if cost.Dispatch {
			order = "dispatch-order"
		}
		why = fmt.Sprintf("measured cost rule: M64 = %d x %d = %d %s M128 = %d x %d = %d (%s makespans over %d slots)",
			d.CostMakespan2, cc.Narrow, a, leq(narrow), d.CostMakespan1, cc.Wide, b, order, d.CostSlots)
	case kind.Forward():
		switch {
		case d.OneWave:
			narrow, why = true, "one wave: "+oneWave()
		case d.ChainFit:
			narrow, why = true, "chain fit: "+chainFit()+" (not one wave: "+oneWave()+")"
		default:
			narrow, why = false, "neither one wave ("+oneWave()+") nor chain fit ("+chainFit()+")"
		}
	default: // rule B, offset or tape
		if vr.LongChain > 0 && d.LongestChain >= vr.LongChain && d.Makespan2 > d.Makespan1 {
			head += ", " + prof.Variant
			narrow, why = twoWaveRule()
			why = fmt.Sprintf("long-chain clause (longest chain %d >= %d, LPT(jobs2) = %d > LPT(jobs1) = %d): %s",
				d.LongestChain, vr.LongChain, d.Makespan2, d.Makespan1, why)
		} else if kind == Tape && vr.TapeTwoWave {
			head += ", " + prof.Variant
			narrow, why = twoWaveRule()
		} else {
			narrow, why = true, fmt.Sprintf("%s walks take vh = 64 on %s", kind, prof.Variant)
			if vr.LongChain > 0 {
				if d.LongestChain < vr.LongChain {
					why += fmt.Sprintf(" (no long-chain clause: longest chain %d < %d)", d.LongestChain, vr.LongChain)
				} else {
					why += fmt.Sprintf(" (no long-chain clause: LPT(jobs2) = %d <= LPT(jobs1) = %d)", d.Makespan2, d.Makespan1)
				}
			}
		}
	}
	d.VH = 128
	if narrow {
		d.VH = 64
	}
	d.Reason = fmt.Sprintf("%s: vh = %d: %s", head, d.VH, why)
	return d, nil
}

func leq(ok bool) string {
	if ok {
		return "<="
	}
	return ">"
}
