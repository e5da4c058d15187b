package kcp

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/sched"
)

// widthKey is what a memoized width decision is keyed by.
type widthKey struct {
	rank int
	walk sched.WalkKind
	rule sched.Rule
	prof sched.Profile
}

// Width returns the width decision for walk list walk of rank rank under prof
// and rule (sched.Decide over the list's chunk counts and the plan's HV). The
// decision is computed once per (rank, walk, profile, rule) and memoized in
// the plan, so the forward, the checkpoint recompute and the replay read the
// same decision. Width is safe for concurrent use. It returns an error for a
// rank outside the plan, an unknown walk kind or rule, or an invalid profile.
func (p *Plan) Width(rank int, walk sched.WalkKind, prof sched.Profile, rule sched.Rule) (sched.Decision, error) {
	if p == nil {
		return sched.Decision{}, errNilPlan
	}
	key := widthKey{rank, walk, rule, prof}
	if d, ok := p.widths.Load(key); ok {
		return d.(sched.Decision), nil
	}
	if rank < 0 || rank >= len(p.Ranks) {
		return sched.Decision{}, fmt.Errorf("kcp: rank %d outside the plan's %d ranks", rank, len(p.Ranks))
	}
	d, err := sched.Decide(walk, p.Ranks[rank].WalkChains(walk), p.Config.HV, prof, rule)
	if err != nil {
		return sched.Decision{}, fmt.Errorf("kcp: rank %d %s walk: %w", rank, walk, err)
	}
	// Decide is deterministic, so racing callers store equal decisions;
	// LoadOrStore still hands every caller the one that was kept.
	v, _ := p.widths.LoadOrStore(key, d)
	return v.(sched.Decision), nil
}

// Decisions returns the width decision of every walk of every rank under prof
// and rule, indexed [rank][walk kind], through the same memo as Width.
func (p *Plan) Decisions(prof sched.Profile, rule sched.Rule) ([][sched.NumWalkKinds]sched.Decision, error) {
	if p == nil {
		return nil, errNilPlan
	}
	out := make([][sched.NumWalkKinds]sched.Decision, len(p.Ranks))
	for r := range p.Ranks {
		for _, k := range sched.WalkKinds() {
			d, err := p.Width(r, k, prof, rule)
			if err != nil {
				return nil, err
			}
			out[r][k] = d
		}
	}
	return out, nil
}
