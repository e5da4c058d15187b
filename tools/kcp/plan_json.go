package main

import (
	"fmt"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/sched"
)

// planJSON is one plan as `kcp plan --json` writes it. The names of the
// issue's schema are kept; the other fields are additions.
type planJSON struct {
	Pack     string     `json:"pack"`
	Docs     []int      `json:"docs"`
	CP       int        `json:"cp"`
	Layout   string     `json:"layout"`
	Arch     string     `json:"arch"`
	SMs      int        `json:"sms"`
	HV       int        `json:"hv"`
	HQK      int        `json:"hqk"`
	Chunk    int        `json:"chunk"`
	Tokens   int        `json:"tokens"`
	Rule     string     `json:"rule"` // the rule whose reason "reason" holds
	ArchNote string     `json:"arch_note"`
	Detected string     `json:"detected,omitempty"` // the GPU planned for when --arch was not given
	Ranks    []rankJSON `json:"ranks"`
}

type rankJSON struct {
	Rank     int           `json:"rank"`
	Tokens   int           `json:"tokens"`
	Parts    [][2]int      `json:"parts"` // global [start, end) in buffer order
	Segments []segmentJSON `json:"segments"`
	Walks    []walkJSON    `json:"walks"`
}

type refJSON struct {
	Rank int `json:"rank"`
	Seg  int `json:"seg"`
}

type haloJSON struct {
	Rank   int `json:"rank"`
	Seg    int `json:"seg"`
	Offset int `json:"offset"`
	Count  int `json:"count"`
}

type segmentJSON struct {
	Doc        int        `json:"doc"`
	Start      int        `json:"start"` // global token offset
	Len        int        `json:"len"`
	Chunks     int        `json:"chunks"`
	LocalStart int        `json:"local_start"`
	Pred       *refJSON   `json:"pred"`
	Succ       *refJSON   `json:"succ"`
	Halo       []haloJSON `json:"halo"`
}

type walkJSON struct {
	Walk         string `json:"walk"`
	Segments     []int  `json:"segments"` // indices into the rank's segments
	Chains       []int  `json:"chains"`   // their chunk counts
	NWalk        int    `json:"n_walk"`
	LongestChain int    `json:"longest_chain"`
	Makespan1    int    `json:"makespan_1cta"`
	Makespan2    int    `json:"makespan_2cta"`
	VHA          *int   `json:"vh_a"` // null: empty walk list, nothing launches
	VHB          *int   `json:"vh_b"`
	Reason       string `json:"reason"`
	ReasonA      string `json:"reason_a"`
	ReasonB      string `json:"reason_b"`
	// Mixed is a walk's best split between the widths on a variant with a
	// measured cost rule, for the walks its sched.CostRule.SplitFor names
	// (sched.MixedWalk; kcp's GPU backend takes it unless
	// GPUOptions.SingleWidth): absent elsewhere.
	Mixed *mixedJSON `json:"mixed,omitempty"`
}

// mixedJSON is a walk's best split between the widths by the cost model.
type mixedJSON struct {
	Wide     []int  `json:"wide"`     // per chain, the value heads at vh 128
	Walks128 int    `json:"walks128"` // (segment, head) walks at vh 128
	Makespan int    `json:"makespan"` // cost units: chunks x the rule's chunk cost
	Single   int    `json:"single"`   // the better single width's makespan, same units
	SingleVH int    `json:"single_vh"`
	Taken    bool   `json:"taken"` // at least sched.MixedMarginPercent below Single
	Summary  string `json:"summary"`
}

// walkMixed is k's split on prof where k launches, prof's variant has a
// cost rule and that rule's SplitFor names k (the offset and tape walks,
// and on sm_90a the state walk of a lean run); else nil.
func walkMixed(k sched.WalkKind, chains []int, hv int, prof sched.Profile) (*mixedJSON, error) {
	m, err := prof.BestSplit(k, chains, hv)
	if err != nil || m == nil {
		return nil, err
	}
	return &mixedJSON{Wide: m.Wide, Walks128: m.Walks128(), Makespan: m.Makespan, Single: m.Single,
		SingleVH: m.SingleVH, Taken: m.Better(), Summary: m.String()}, nil
}

func ref(r *kcp.SegRef) *refJSON {
	if r == nil {
		return nil
	}
	return &refJSON{r.Rank, r.Seg}
}

func vh(d sched.Decision) *int {
	if d.VH == 0 {
		return nil
	}
	v := d.VH
	return &v
}

// buildPlanJSON lays out p with both rules' decisions on prof; reason is
// rule's.
func buildPlanJSON(pack string, p *kcp.Plan, prof sched.Profile, rule sched.Rule) (planJSON, error) {
	cfg := p.Config
	pj := planJSON{
		Pack: pack, Docs: cfg.Docs, CP: cfg.Ranks, Layout: string(cfg.Layout), Arch: prof.Variant, SMs: prof.SMs,
		HV: cfg.HV, HQK: cfg.HQK, Chunk: cfg.Chunk, Tokens: p.Tokens, Rule: rule.String(), ArchNote: prof.Note(),
		Ranks: make([]rankJSON, len(p.Ranks)),
	}
	decA, err := p.Decisions(prof, sched.RuleA)
	if err != nil {
		return planJSON{}, err
	}
	decB, err := p.Decisions(prof, sched.RuleB)
	if err != nil {
		return planJSON{}, err
	}
	for r, rp := range p.Ranks {
		rj := rankJSON{Rank: r, Tokens: rp.Tokens, Parts: [][2]int{}, Segments: []segmentJSON{}}
		for _, pt := range rp.Parts {
			rj.Parts = append(rj.Parts, [2]int{pt.Start, pt.End})
		}
		for _, s := range rp.Segments {
			sj := segmentJSON{
				Doc: s.Doc, Start: s.Start, Len: s.Len, Chunks: s.Chunks, LocalStart: s.LocalStart,
				Pred: ref(s.Pred), Succ: ref(s.Succ), Halo: []haloJSON{},
			}
			for _, h := range s.Halo {
				sj.Halo = append(sj.Halo, haloJSON{h.Rank, h.Seg, h.Offset, h.Count})
			}
			rj.Segments = append(rj.Segments, sj)
		}
		for _, k := range sched.WalkKinds() {
			a, b := decA[r][k], decB[r][k]
			wj := walkJSON{
				Walk: k.String(), Segments: append([]int{}, rp.Walk(k)...), Chains: rp.WalkChains(k),
				NWalk: b.NWalk, LongestChain: b.LongestChain, Makespan1: b.Makespan1, Makespan2: b.Makespan2,
				VHA: vh(a), VHB: vh(b), Reason: b.Reason, ReasonA: a.Reason, ReasonB: b.Reason,
			}
			if rule == sched.RuleA {
				wj.Reason = a.Reason
			}
			if wj.Mixed, err = walkMixed(k, wj.Chains, cfg.HV, prof); err != nil {
				return planJSON{}, fmt.Errorf("rank %d: %w", r, err)
			}
			rj.Walks = append(rj.Walks, wj)
		}
		pj.Ranks[r] = rj
	}
	return pj, nil
}
