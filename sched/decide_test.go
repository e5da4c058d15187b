package sched

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func rep(c, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = c
	}
	return out
}

var (
	sm100 = Profile{Variant: VariantSM100a, SMs: 148}
	sm103 = Profile{Variant: VariantSM103a, SMs: 148}
	sm107 = Profile{Variant: VariantSM107a, SMs: 148}
	sm90  = Profile{Variant: VariantSM90a, SMs: 132}
)

func decide(t *testing.T, kind WalkKind, chains []int, hv int, p Profile, r Rule) Decision {
	t.Helper()
	d, err := Decide(kind, chains, hv, p, r)
	require.NoError(t, err)
	return d
}

type boundaryCase struct {
	name   string
	kind   WalkKind
	chains []int
	hv     int
	prof   Profile
	rule   Rule
	vh     int
	reason string // a substring of Reason
}

func runBoundary(t *testing.T, tests []boundaryCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(t, tc.kind, tc.chains, tc.hv, tc.prof, tc.rule)
			assert.Equal(t, tc.vh, d.VH, d.Reason)
			assert.Contains(t, d.Reason, tc.reason)
			assert.NotContains(t, d.Reason, "\n")
		})
	}
}

// The sm_100a long-chain clause: 7 chains, HV 48 on 148 SMs is 672 CTAs at
// vh = 64, over two waves (592), and LPT(jobs2) = 3 chains > LPT(jobs1) = 2.
func TestLongChainThreshold(t *testing.T) {
	runBoundary(t, []boundaryCase{
		{"offset 399 chunks", Offset, rep(399, 7), 48, sm100, RuleB, 64, "no long-chain clause: longest chain 399 < 400"},
		{"offset 400 chunks", Offset, rep(400, 7), 48, sm100, RuleB, 128, "long-chain clause (longest chain 400 >= 400"},
		{"tape 399 chunks", Tape, rep(399, 7), 48, sm100, RuleB, 64, "tape walks take vh = 64 on sm_100a"},
		{"tape 400 chunks", Tape, rep(400, 7), 48, sm100, RuleB, 128, "4*SM = 592"},
		{"400 chunks but two waves", Tape, rep(400, 6), 48, sm100, RuleB, 64, "576 <= 4*SM = 592"},
		{"sm_103a has no clause", Offset, rep(400, 7), 48, sm103, RuleB, 64, "offset walks take vh = 64 on sm_103a"},
		{"sm_107a offset has no clause", Offset, rep(400, 7), 48, sm107, RuleB, 64, "offset walks take vh = 64"},
		{"sm_90a has its own rule", Tape, rep(400, 7), 48, sm90, RuleB, 128, "measured cost rule"},
		{"forward walks have no clause", State, rep(400, 7), 48, Profile{Variant: VariantSM100a, SMs: 148}, RuleB, 128, "neither one wave"},
	})
}

// The sm_90a cost rule on the packs it was measured on (one rank, HV 48, 132
// SMs; docs/perf-notes.md, "Width rule on sm_90a"): the width that measured
// faster for the state walk (core; the plane walks, re-measured 2026-12-02 on
// every pack but 4 x 256 and 16 x 64: vh = 64 everywhere, a vh = 128 chunk
// 2.3-2.5 times a vh = 64 one) and for the tape walk (2026-12-01 and, with
// the dispatch order and gdn_chunk_grads_mma8's bf16 dV' store, 2026-12-02
// on 3 x 342 and the 3-document pack: a vh = 128 chunk 1.56-1.83 times a
// vh = 64 one, hence 5/3). The column lean is the state walk's width in a run
// whose forward stores no fp32 states (Profile.LeanForward: 2, since the v5.34
// walks, whose U^T copies a chunk ahead and zero-filling copies sped up the
// vh = 64 state walk 3-12% and the vh = 128 one 0-2%: the sweep of 2026-12-04,
// twenty-sixth session, the core stage's plane state walk at 2.00-2.17 times on
// 1 x 1024, 2 x 512, 3 x 342 and 4 x 256 and 1.86 on the 3-document pack, vh = 64
// faster on all five, 2 x 512 included (2.161 / 2.179 ms), where M64 = 2 M128:
// the tie, which takes vh = 64, as on 8 x 128 and 16 x 64, not measured on v5.34;
// 15/8 before, from the v5.21 sweep, with vh = 128 faster on those three packs),
// and leanTape the tape walk's in such a run (the core stage's tape
// walk, storing bf16 dV' and D only: 5/3 since the v5.32 walks, whose U^T and
// dvl^T reads without a guard on n sped up vh = 64 more than vh = 128: a vh = 128
// chunk 1.77 times a vh = 64 one on 1 x 512 and 1.63 on the 3-document pack,
// vh = 64 faster on both (the sweep of 2026-12-04, twenty-fourth session; v5.31's
// walks took 10/7, 1.40-1.49 on all seven packs, vh = 128 faster everywhere but
// 1 x 1024; the module stage's, which also stores fp32 dV' planes, measured
// 1.49-1.70 on v5.31 and keeps 5/3). The makespans are the dispatch order's.
func TestSM90aCostRule(t *testing.T) {
	for _, tc := range []struct {
		name        string
		chains      []int
		state, tape int
		m1, m2      int
		lean        int // the state walk's width in a lean run (Profile.LeanForward)
		leanTape    int // the tape walk's width in a lean run
	}{
		{"1 x 1024", []int{1024}, 64, 64, 1024, 1024, 64, 64},
		{"2 x 512", rep(512, 2), 64, 128, 512, 1024, 64, 128},
		{"3 x 342", rep(342, 3), 64, 64, 684, 1026, 64, 64},
		{"4 x 256", rep(256, 4), 64, 64, 512, 768, 64, 64},
		{"3 documents, 120,908 tokens", []int{625, 704, 562}, 64, 64, 1124, 1686, 64, 64},
		{"8 x 128", rep(128, 8), 64, 128, 384, 768, 64, 128},
		{"16 x 64", rep(64, 16), 64, 128, 384, 768, 64, 128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, vh := range map[WalkKind]int{State: tc.state, Tape: tc.tape} {
				d := decide(t, k, tc.chains, 48, sm90, RuleB)
				assert.Equal(t, vh, d.VH, d.Reason)
				assert.Equal(t, []int{132, tc.m1, tc.m2}, []int{d.CostSlots, d.CostMakespan1, d.CostMakespan2}, d.Reason)
				assert.Contains(t, d.Reason, "sm_90a: vh = ")
				assert.Contains(t, d.Reason, "measured cost rule")
			}
			// The dispatch order's makespans are below launch order's where the
			// segments differ in length (launch order: 1266 / 1891), and equal
			// where they do not. LPT's list makespans, with the jobs sorted first,
			// would get the 3-document pack wrong (1124 / 1812 over the same
			// slots: vh = 128, measured 9% slower in launch order).
			lm1, lm2 := mustList(t, tc.chains, 48, 1, 132), mustList(t, tc.chains, 48, 2, 132)
			assert.LessOrEqual(t, tc.m1, lm1)
			assert.LessOrEqual(t, tc.m2, lm2)
			if tc.name == "3 documents, 120,908 tokens" {
				assert.Equal(t, []int{1266, 1891}, []int{lm1, lm2})
				var j1, j2 []int
				for _, c := range tc.chains {
					j1, j2 = append(j1, rep(c, 48)...), append(j2, rep(c, 96)...)
				}
				assert.Equal(t, []int{1124, 1812}, []int{mustLPT(t, j1, 132), mustLPT(t, j2, 132)})
				assert.Greater(t, 2*mustLPT(t, j2, 132), 3*mustLPT(t, j1, 132))
			}
			// The summary and offset walks run twice the CTAs (P and Q columns),
			// at the costs of the state and the tape walk.
			for k, vh := range map[WalkKind]int{Summary: tc.state, Offset: tc.tape} {
				d := decide(t, k, tc.chains, 24, sm90, RuleB)
				assert.Equal(t, vh, d.VH, d.Reason)
				assert.Equal(t, []int{tc.m1, tc.m2}, []int{d.CostMakespan1, d.CostMakespan2}, d.Reason)
			}
			// A lean run (no fp32 per-chunk states stored): the forward walks at
			// 2 (ties at M64 = 2 M128 take vh = 64), the backward walks at 5/3.
			lean := sm90
			lean.LeanForward = true
			for k, vh := range map[WalkKind]int{State: tc.lean, Tape: tc.leanTape} {
				d := decide(t, k, tc.chains, 48, lean, RuleB)
				assert.Equal(t, vh, d.VH, d.Reason)
				assert.Equal(t, k == State, strings.Contains(d.Reason, "lean forward"), d.Reason)
				assert.NotContains(t, d.Reason, "lean run", "the backward's lean cost is its full one")
			}
			d := decide(t, Summary, tc.chains, 24, lean, RuleB)
			assert.Equal(t, tc.lean, d.VH, d.Reason)
			d = decide(t, Offset, tc.chains, 24, lean, RuleB)
			assert.Equal(t, tc.leanTape, d.VH, d.Reason)
			// Rule A does not read the cost rule.
			d = decide(t, State, tc.chains, 48, sm90, RuleA)
			assert.Contains(t, d.Reason, "one-wave rule")
			assert.Equal(t, d.OneWave, d.VH == 64, d.Reason)
		})
	}
}

// LPT(jobs2) against LPT(jobs1) in the long-chain clause. HV 1 on 2 SMs (4
// slots), 5 chains: 10 CTAs at vh = 64, over two waves (8).
func TestLongChainMakespanComparison(t *testing.T) {
	eq := []int{400, 94, 7, 49, 153}     // LPT(jobs1) = LPT(jobs2) = 400
	over := []int{400, 104, 59, 74, 164} // LPT(jobs1) = 400, LPT(jobs2) = 401
	p := Profile{Variant: VariantSM100a, SMs: 2}
	d := decide(t, Offset, eq, 1, p, RuleB)
	require.Equal(t, []int{400, 400}, []int{d.Makespan1, d.Makespan2})
	d = decide(t, Offset, over, 1, p, RuleB)
	require.Equal(t, []int{400, 401}, []int{d.Makespan1, d.Makespan2})
	runBoundary(t, []boundaryCase{
		{"offset LPT2 == LPT1", Offset, eq, 1, p, RuleB, 64, "LPT(jobs2) = 400 <= LPT(jobs1) = 400"},
		{"offset LPT2 == LPT1 + 1", Offset, over, 1, p, RuleB, 128, "LPT(jobs2) = 401 > LPT(jobs1) = 400"},
		{"tape LPT2 == LPT1", Tape, eq, 1, p, RuleB, 64, "tape walks take vh = 64"},
		{"tape LPT2 == LPT1 + 1", Tape, over, 1, p, RuleB, 128, "2*n_walk*HV = 10 > 4*SM = 8"},
	})
}

// Chain fit: HV 1 on 2 SMs (4 slots), 3 chains: 6 CTAs, not one wave.
// jobs2 of {4,2,2} = 4,4,2,2,2,2 -> loads 4,4,4,4; of {4,3,2} -> 5.
func TestChainFitBoundary(t *testing.T) {
	p := Profile{Variant: VariantSM103a, SMs: 2}
	d := decide(t, State, []int{4, 2, 2}, 1, p, RuleB)
	require.Equal(t, 4, d.Makespan2)
	require.False(t, d.OneWave)
	d = decide(t, State, []int{4, 3, 2}, 1, p, RuleB)
	require.Equal(t, 5, d.Makespan2)
	runBoundary(t, []boundaryCase{
		{"state LPT2 == longest", State, []int{4, 2, 2}, 1, p, RuleB, 64, "chain fit: LPT(jobs2) = 4 <= longest chain 4"},
		{"state LPT2 == longest + 1", State, []int{4, 3, 2}, 1, p, RuleB, 128, "LPT(jobs2) = 5 > longest chain 4"},
		{"summary LPT2 == longest", Summary, []int{2, 4, 2}, 1, p, RuleB, 64, "chain fit"},
		{"summary LPT2 == longest + 1", Summary, []int{3, 2, 4}, 1, p, RuleB, 128, "neither one wave"},
		{"rule A ignores chain fit", State, []int{4, 2, 2}, 1, p, RuleA, 128, "one-wave rule: 2*n_walk*HV = 6 > 2*SM = 4"},
	})
	// Production sizes: 4 chains of 200 chunks and 8 of 100 over 148 SMs.
	// jobs2 = 384 of 200 + 768 of 100 over 296 slots.
	d = decide(t, State, append(rep(200, 4), rep(100, 8)...), 48, sm100, RuleB)
	assert.False(t, d.OneWave)
	assert.Equal(t, d.Makespan2 <= 200, d.VH == 64, d.Reason)
}

// One wave: 2*n_walk*HV <= 2*SM. The CTA count is even, so the closest to
// "one CTA over" is one SM short (two CTAs over).
func TestWaveBoundaries(t *testing.T) {
	full := Profile{Variant: VariantSM103a, SMs: 144} // 3 chains * 2 * 48 = 288 = 2*144
	short := Profile{Variant: VariantSM103a, SMs: 143}
	half := Profile{Variant: VariantSM107a, SMs: 72} // 288 = 4*72: two waves exactly full
	halfShort := Profile{Variant: VariantSM107a, SMs: 71}
	long := []int{50, 10, 10} // LPT(jobs2) > 50 once the grid does not fit
	runBoundary(t, []boundaryCase{
		{"A state one wave full", State, long, 48, full, RuleA, 64, "288 <= 2*SM = 288"},
		{"A state one wave over", State, long, 48, short, RuleA, 128, "288 > 2*SM = 286"},
		{"A summary one wave full", Summary, long, 48, full, RuleA, 64, "<= 2*SM"},
		{"A summary one wave over", Summary, long, 48, short, RuleA, 128, "> 2*SM"},
		{"B state one wave full", State, long, 48, full, RuleB, 64, "one wave: 2*n_walk*HV = 288 <= 2*SM = 288"},
		{"B state one wave over, chain fit decides", State, []int{50, 10, 10}, 48, short, RuleB, 64, "chain fit"},
		{"B state one wave over, no fit", State, []int{50, 50, 50}, 48, short, RuleB, 128, "neither one wave"},
		{"A offset two waves full", Offset, long, 48, Profile{Variant: VariantSM100a, SMs: 72}, RuleA, 64, "288 <= 4*SM = 288"},
		{"A offset two waves over", Offset, long, 48, Profile{Variant: VariantSM100a, SMs: 71}, RuleA, 128, "288 > 4*SM = 284"},
		{"A tape two waves full", Tape, long, 48, half, RuleA, 64, "two-wave rule"},
		{"A tape two waves over", Tape, long, 48, halfShort, RuleA, 128, "two-wave rule"},
		{"B sm_107a tape two waves full", Tape, long, 48, half, RuleB, 64, "rule B, sm_107a: vh = 64: two-wave rule"},
		{"B sm_107a tape two waves over", Tape, long, 48, halfShort, RuleB, 128, "288 > 4*SM = 284"},
		{"B sm_103a tape always 64", Tape, long, 48, Profile{Variant: VariantSM103a, SMs: 71}, RuleB, 64, "tape walks take vh = 64"},
		{"B offset always 64", Offset, long, 48, Profile{Variant: VariantSM107a, SMs: 1}, RuleB, 64, "offset walks take vh = 64"},
		{"B generic follows sm_103a", Tape, long, 48, Profile{Variant: VariantGeneric, SMs: 1}, RuleB, 64, "on generic"},
	})
}

func TestDecideEmptyWalk(t *testing.T) {
	for _, k := range WalkKinds() {
		for _, r := range Rules() {
			for _, chains := range [][]int{nil, {}} {
				d := decide(t, k, chains, 48, sm100, r)
				assert.Equal(t, 0, d.VH)
				assert.False(t, d.Launches())
				assert.Zero(t, d.NWalk+d.Makespan1+d.Makespan2+d.LongestChain)
				assert.Equal(t, k.String()+" walk, rule "+r.String()+": empty walk list: launch nothing", d.Reason)
				assert.Zero(t, d.CTAsPerSegment(48))
			}
		}
	}
}

func TestDecideFields(t *testing.T) {
	chains := []int{30, 70, 5}
	in := slices.Clone(chains)
	d := decide(t, State, chains, 48, sm100, RuleB)
	assert.Equal(t, in, chains, "Decide must not modify chains")
	assert.Equal(t, State, d.Kind)
	assert.Equal(t, RuleB, d.Rule)
	assert.Equal(t, 3, d.NWalk)
	assert.Equal(t, 70, d.LongestChain)
	assert.Equal(t, 70, d.Makespan1) // 144 CTAs over 296 slots
	assert.Equal(t, 70, d.Makespan2) // 288 CTAs over 296 slots
	assert.True(t, d.OneWave)
	assert.True(t, d.TwoWaves)
	assert.True(t, d.ChainFit)
	assert.Equal(t, 64, d.VH)
	assert.Equal(t, 96, d.CTAsPerSegment(48))
	assert.Equal(t, "state walk, rule B: vh = 64: one wave: 2*n_walk*HV = 288 <= 2*SM = 296", d.Reason)

	d = decide(t, State, []int{30, 70, 5}, 48, sm100, RuleA)
	assert.Equal(t, "state walk, rule A: vh = 64: one-wave rule: 2*n_walk*HV = 288 <= 2*SM = 296", d.Reason)
	d.VH = 128
	assert.Equal(t, 48, d.CTAsPerSegment(48))
}

// Every decision against the rule as written, on random walk lists.
func TestDecideMatchesSpec(t *testing.T) {
	profiles := append(ReferenceProfiles(), Profile{Variant: VariantGeneric, SMs: 100}, Profile{Variant: VariantSM100a, SMs: 20})
	seed := uint64(7)
	next := func(n int) int {
		seed = seed*6364136223846793005 + 1442695040888963407
		return int((seed >> 33) % uint64(n))
	}
	for it := 0; it < 4000; it++ {
		chains := make([]int, next(14))
		for i := range chains {
			chains[i] = 1 + next(900)
		}
		hv := []int{1, 6, 16, 48, 64}[next(5)]
		p := profiles[next(len(profiles))]
		var jobs1, jobs2 []int
		for _, c := range chains {
			jobs1 = append(jobs1, rep(c, hv)...)
			jobs2 = append(jobs2, rep(c, 2*hv)...)
		}
		m1, m2 := naiveLPT(jobs1, 2*p.SMs), naiveLPT(jobs2, 2*p.SMs)
		longest := 0
		if len(chains) > 0 {
			longest = slices.Max(chains)
		}
		one := 2*len(chains)*hv <= 2*p.SMs
		two := 2*len(chains)*hv <= 4*p.SMs
		fit := m2 <= longest
		for _, k := range WalkKinds() {
			var a, b bool // vh = 64 under A and B
			if p.Variant == VariantSM90a {
				// The measured cost rule: one CTA an SM, vh = 128 at 9/4 the chunk
				// cost in the forward walks, 5/3 in the backward ones.
				a = one
				if !k.Forward() {
					a = two
				}
				tiles := 1
				if k == Summary || k == Offset {
					tiles = 2
				}
				narrow, wide := 3, 5
				if k.Forward() {
					narrow, wide = 4, 9
				}
				// The walks run in their dispatch order (TestDispatchOrder checks
				// its makespans against launch order's and LPT's).
				span := func(per int) int {
					_, m, err := DispatchOrder(chains, hv, per, p.SMs)
					require.NoError(t, err)
					return m
				}
				b = narrow*span(2*tiles) <= wide*span(tiles)
			} else if k == Summary || k == State {
				a, b = one, one || fit
			} else {
				a, b = two, true
				if k == Tape && p.Variant == VariantSM107a {
					b = two
				}
				if p.Variant == VariantSM100a && longest >= 400 && m2 > m1 {
					b = two
				}
			}
			want := func(narrow bool) int {
				switch {
				case len(chains) == 0:
					return 0
				case narrow:
					return 64
				}
				return 128
			}
			da := decide(t, k, chains, hv, p, RuleA)
			db := decide(t, k, chains, hv, p, RuleB)
			require.Equal(t, want(a), da.VH, "%s %v hv %d %s: %s", k, chains, hv, p, da.Reason)
			require.Equal(t, want(b), db.VH, "%s %v hv %d %s: %s", k, chains, hv, p, db.Reason)
			if len(chains) > 0 {
				require.Equal(t, []int{m1, m2}, []int{da.Makespan1, da.Makespan2})
				require.Equal(t, []int{m1, m2}, []int{db.Makespan1, db.Makespan2})
			}
		}
	}
}

func TestDecideErrors(t *testing.T) {
	tests := []struct {
		name   string
		kind   WalkKind
		chains []int
		hv     int
		prof   Profile
		rule   Rule
		msg    string
	}{
		{"zero SMs", State, []int{1}, 48, Profile{Variant: VariantSM100a, SMs: 0}, RuleB, "SM count 0"},
		{"negative SMs", State, []int{1}, 48, Profile{Variant: VariantSM100a, SMs: -4}, RuleB, "SM count -4"},
		{"unknown variant", State, []int{1}, 48, Profile{Variant: "sm_120", SMs: 10}, RuleB, `unknown arch variant "sm_120"`},
		{"empty variant", State, []int{1}, 48, Profile{Variant: "", SMs: 10}, RuleB, "unknown arch variant"},
		{"zero HV", State, []int{1}, 0, sm100, RuleB, "HV 0"},
		{"negative HV", Tape, []int{1}, -1, sm100, RuleA, "HV -1"},
		{"zero rule", State, []int{1}, 48, sm100, 0, "unknown rule"},
		{"bad kind", WalkKind(9), []int{1}, 48, sm100, RuleB, "unknown walk kind"},
		{"empty chain", Offset, []int{3, 0}, 48, sm100, RuleB, "chain 1 has 0 chunks"},
		{"errors even for empty walk lists", State, nil, 48, Profile{Variant: VariantSM100a, SMs: 0}, RuleB, "SM count"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decide(tc.kind, tc.chains, tc.hv, tc.prof, tc.rule)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

func TestNames(t *testing.T) {
	for _, k := range WalkKinds() {
		got, err := ParseWalkKind(strings.ToUpper(k.String()))
		require.NoError(t, err)
		assert.Equal(t, k, got)
	}
	_, err := ParseWalkKind("forward")
	assert.Error(t, err)
	assert.Equal(t, "WalkKind(7)", WalkKind(7).String())
	assert.Equal(t, []bool{true, true, false, false},
		[]bool{Summary.Forward(), State.Forward(), Offset.Forward(), Tape.Forward()})
	for in, want := range map[string]Rule{"a": RuleA, "A": RuleA, " b": RuleB, "B": RuleB} {
		got, err := ParseRule(in)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	_, err = ParseRule("c")
	assert.ErrorContains(t, err, `unknown rule "c"`)
	assert.Equal(t, "Rule(0)", Rule(0).String())
}

// TestColumnSets: the summary and offset walks run two column sets (P and Q,
// P^T and R), the state and tape walks one.
func TestColumnSets(t *testing.T) {
	for k, want := range map[WalkKind]int{Summary: 2, State: 1, Offset: 2, Tape: 1} {
		assert.Equal(t, want, k.ColumnSets(), "%s walk", k)
	}
}
