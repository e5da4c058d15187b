package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/sched"
)

// Flag errors come before any GPU is touched; a valid matrix without a GPU
// says so; the launcher's rules are kcp run's (placeGPU is shared).
func TestSweepFlags(t *testing.T) {
	env := &comm.Env{Rank: 0, WorldSize: 2, LocalRank: 0, LocalWorldSize: 2, NCCLCommID: "127.0.0.1:29501"}
	for _, tc := range []struct {
		name string
		env  *comm.Env
		args []string
		want string
	}{
		{"unknown pack", nil, []string{"--packs", "P1,P9"}, `--packs: P9: kcp: unknown pack "P9"`},
		{"bad token count", nil, []string{"--packs", "P1@8k"}, `"8k" after @ is not a token count`},
		{"pack twice", nil, []string{"--packs", "P2@4096, P2@4096"}, "P2@4096 is listed twice"},
		{"no pack", nil, []string{"--packs", " , "}, "--packs \" , \": empty list"},
		{"unknown layout", nil, []string{"--layouts", "C,Q"}, `--layouts: kcp: unknown layout "Q"`},
		{"layout twice", nil, []string{"--layouts", "C,c"}, "c is listed twice"},
		{"unknown mode", nil, []string{"--modes", "b1,b2"}, `--modes: "b2" is not a mode`},
		{"mode twice", nil, []string{"--modes", "b3,B3"}, "B3 is listed twice"},
		{"unknown rule", nil, []string{"--rules", "a,c"}, `--rules: sched: unknown rule "c"`},
		{"rule twice", nil, []string{"--rules", "b,B"}, "B is listed twice"},
		{"no reps", nil, []string{"--reps", "0"}, "--reps 0, --warmup 1: need at least one timed repetition"},
		{"negative warmup", nil, []string{"--warmup", "-1"}, "--reps 3, --warmup -1"},
		{"kernels", nil, []string{"--kernels", "bf16"}, `--kernels: kcp: kernel set "bf16": want one of fp32, tc, mma`},
		{"stage", nil, []string{"--stage", "conv"}, `--stage: kcp: unknown stage "conv"`},
		{"cp", nil, []string{"--cp", "0"}, "--cp 0: want 1..64"},
		{"compare missing", nil, []string{"--compare", filepath.Join(t.TempDir(), "none.json")}, "--compare: open"},
		{"no gpu", nil, []string{"--packs", "P1@8192"}, "kcp sweep needs a CUDA GPU: the driver shows 0 devices"},
		{"no gpu, kernels auto", nil, []string{"--packs", "P1@8192", "--kernels", "auto"}, "kcp sweep needs a CUDA GPU: the driver shows 0 devices"},
		{"no gpu, kernels v5", nil, []string{"--packs", "P1@8192", "--kernels", "v5"}, "kcp sweep needs a CUDA GPU: the driver shows 0 devices"},
		{"launcher devices", env, []string{"--devices", "0"}, "do not apply under a launcher"},
		{"launcher cp", env, []string{"--cp", "4"}, "--cp 4 but WORLD_SIZE=2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			standIn(t, tc.env, 0, nil)
			out, stderr, code := runKCP(t, append([]string{"sweep", "--no-progress"}, tc.args...)...)
			require.Equal(t, 1, code)
			require.Empty(t, out)
			require.Contains(t, stderr, tc.want)
		})
	}
}

// The flags make the matrix they say.
func TestSweepSpec(t *testing.T) {
	o := sweepOptions{packs: "P1@8192, p4", layouts: "z,D", modes: "B3", rules: "b", stage: "core", kernels: "fp32", reps: 2, seed: 7}
	sp, err := o.spec(func(string) bool { return false })
	require.NoError(t, err)
	require.Len(t, sp.packs, 2)
	require.Equal(t, "P1@8192", sp.packs[0].Name)
	require.Equal(t, 8192, sp.packs[0].Tokens)
	p4, err := kcp.PackByName("P4")
	require.NoError(t, err)
	require.Equal(t, p4, sp.packs[1])
	require.Equal(t, []kcp.Layout{kcp.LayoutZ, kcp.LayoutD}, sp.layouts)
	require.Equal(t, []string{"b3"}, sp.modes)
	require.Equal(t, []sched.Rule{sched.RuleB}, sp.rules)
	require.Equal(t, kcp.StageCore, sp.stage)
	require.Equal(t, 2*1*1*2, sp.cells())

	// auto passes the flag checks and stays unresolved until the GPU is known.
	o.kernels = kcp.KernelsAuto
	sp, err = o.spec(func(string) bool { return false })
	require.NoError(t, err)
	require.Equal(t, kcp.KernelsAuto, sp.kernels)
}

// kcp sweep's and kcp bench's default kernel set is kcp run's: auto.
func TestSweepKernelsDefault(t *testing.T) {
	for _, name := range []string{"sweep", "run", "bench"} {
		cmd, _, err := newRootCmd().Find([]string{name})
		require.NoError(t, err, name)
		f := cmd.Flags().Lookup("kernels")
		require.NotNil(t, f, name)
		require.Equal(t, kcp.KernelsAuto, f.DefValue, name)
	}
}

// fakeEngine stands in for the GPU: each step returns the times of the
// tables below, the widths of fakeVH, and outputs and gradients that depend
// on the token only (so digests are a function of the plan and the rank),
// except where corrupt says; like the GPU under a launcher, it fills only
// the local ranks' entries.
type fakeEngine struct {
	local   []int                  // the ranks this "process" runs; nil: all
	corrupt func(c fakeCell) []int // ranks whose rows get other values in cell c
	mu      sync.Mutex
	runs    map[fakeCell]int
}

type fakeCell struct {
	layout kcp.Layout
	rule   sched.Rule
	mode   string
}

// fakeTotals[rep][rank] are rule A's totals of the timed repetitions;
// fakeExch[rep] every rank's exchange time. Rule B adds fakeRuleB[rank].
var (
	fakeTotals = [][]float64{{5, 7, 6}, {9, 4, 8}, {6, 8, 3}}
	fakeExch   = []float64{1, 2, 0.5}
	fakeRuleB  = []float64{0, 0, 3}
)

const fakeWarmupMs = 1000 // a warm-up run's times: never in a median

// fakeVH is the widths launched: 64, but under rule B in layout C rank 0's
// state walk and rank 2's tape walk take 128.
func fakeVH(c fakeCell, rank int) [sched.NumWalkKinds]int {
	vh := [sched.NumWalkKinds]int{64, 64, 64, 64}
	if c.rule == sched.RuleB && c.layout == kcp.LayoutC {
		switch rank {
		case 0:
			vh[sched.State] = 128
		case 2:
			vh[sched.Tape] = 128
		}
	}
	return vh
}

type fakeBackend struct {
	e    *fakeEngine
	plan *kcp.Plan
	rule sched.Rule
}

func (e *fakeEngine) open(plan *kcp.Plan, rule sched.Rule) (sweepBackend, error) {
	return &fakeBackend{e: e, plan: plan, rule: rule}, nil
}

func (e *fakeEngine) describe() (string, string, string, []int) {
	return "GPU 0: Fake H200", "loopback", "host", []int{0, 0, 0}
}

func (e *fakeEngine) close() error { return nil }

func (b *fakeBackend) localRanks() []int {
	if b.e.local != nil {
		return b.e.local
	}
	var all []int
	for r := range b.plan.Ranks {
		all = append(all, r)
	}
	return all
}

func (b *fakeBackend) close() error { return nil }

func (b *fakeBackend) step(_ context.Context, mode string, in *kcp.Inputs, dout []float32) (*gpuStep, error) {
	c := fakeCell{b.plan.Config.Layout, b.rule, mode}
	b.e.mu.Lock()
	if b.e.runs == nil {
		b.e.runs = map[fakeCell]int{}
	}
	run := b.e.runs[c]
	b.e.runs[c]++
	b.e.mu.Unlock()
	p, cfg := b.plan, b.plan.Config
	R := len(p.Ranks)
	local := b.localRanks()
	st := &gpuStep{blob: "sm_90a", vh: make([][sched.NumWalkKinds]int, R), names: []string{"forward"}}
	fwd, rec, bwd := make([]kcp.RankTiming, R), make([]kcp.RankTiming, R), make([]kcp.RankTiming, R)
	for _, r := range local {
		total, exch := float64(fakeWarmupMs), float64(fakeWarmupMs)
		if run >= 1 { // one warm-up run in these tests
			total, exch = fakeTotals[run-1][r], fakeExch[run-1]
			if b.rule == sched.RuleB {
				total += fakeRuleB[r]
			}
		}
		work := total - exch
		fwd[r] = kcp.RankTiming{Rank: r, Stages: []kcp.StageTime{{Stage: "prep", Millis: work / 2}, {Stage: "exchange summaries", Millis: exch / 2}}}
		bwd[r] = kcp.RankTiming{Rank: r, Stages: []kcp.StageTime{{Stage: "tape walk", Millis: work / 4}, {Stage: "exchange offsets", Millis: exch / 2}}}
		rec[r] = kcp.RankTiming{Rank: r, Stages: []kcp.StageTime{{Stage: "state walk", Millis: work / 4}}}
		if mode == "b1" {
			bwd[r].Stages[0].Millis = work / 2
		}
		for _, tm := range []*kcp.RankTiming{&fwd[r], &rec[r], &bwd[r]} {
			for _, s := range tm.Stages {
				tm.TotalMillis += s.Millis
			}
		}
		st.vh[r] = fakeVH(c, r)
	}
	st.phases = [][]kcp.RankTiming{fwd}
	if mode == "b3" {
		st.phases, st.names = append(st.phases, rec), append(st.names, "recompute")
	}
	st.phases, st.names = append(st.phases, bwd), append(st.names, "backward")
	fill := func(n, salt int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = float64((i*31+salt)%97) / 8
		}
		return x
	}
	T := p.Tokens
	out := &kcp.Output{O: fill(T*cfg.HV*cfg.DV, 1)}
	g := &kcp.Grads{DQ: fill(T*cfg.HQK*cfg.DK, 2), DK: fill(T*cfg.HQK*cfg.DK, 3), DV: fill(T*cfg.HV*cfg.DV, 4),
		DG: fill(T*cfg.HV, 5), DBeta: fill(T*cfg.HV, 6), DConvW: fill(p.ConvChannels()*kcp.ConvWidth, 7)}
	if b.e.corrupt != nil {
		for _, r := range b.e.corrupt(c) {
			seg := p.Ranks[r].Segments[0]
			out.O[seg.Start*cfg.HV*cfg.DV] += 1
		}
	}
	out, g = maskRanks(p, local, out, g)
	st.output = func() *kcp.Output { return out }
	st.gradients = func() *kcp.Grads { return g }
	st.digest = func(r int) (string, error) { return kcp.RankDigest(p, r, out, g) }
	_ = in
	_ = dout
	return st, nil
}

// fakeSpec is a small matrix: one pack, layouts C and D, rules A and B,
// modes B1 and B3, CP 3, 3 timed repetitions after 1 warm-up, tiny heads.
func fakeSpec(t testing.TB) *sweepSpec {
	t.Helper()
	p1, err := kcp.PackByName("P1")
	require.NoError(t, err)
	pk, err := kcp.ScalePack(p1, 300)
	require.NoError(t, err)
	return &sweepSpec{packs: []kcp.Pack{pk}, layouts: []kcp.Layout{kcp.LayoutC, kcp.LayoutD}, modes: []string{"b1", "b3"},
		rules: []sched.Rule{sched.RuleA, sched.RuleB}, stage: kcp.StageModule, kernels: "tc", cp: 3, seed: 5, reps: 3, warmup: 1,
		hqk: 1, hv: 2, dk: 16, dv: 16}
}

// corruptDB3 gives rank 1 other values under rule B in layout D, mode B3.
func corruptDB3(c fakeCell) []int {
	if c.layout == kcp.LayoutD && c.rule == sched.RuleB && c.mode == "b3" {
		return []int{1}
	}
	return nil
}

func fakeReport(t testing.TB, ref *sweepReport, compare string) *sweepReport {
	t.Helper()
	spec := fakeSpec(t)
	m, err := runSweep(context.Background(), spec, &fakeEngine{corrupt: corruptDB3}, nil, nil)
	require.NoError(t, err)
	return buildSweepReport(spec, m, ref, compare)
}

// The rows: slowest-rank medians over the timed repetitions only, the
// slowest rank, its exchange share, the launches that differ, and the
// digests compared between the rules.
func TestSweepRows(t *testing.T) {
	rep := fakeReport(t, nil, "")
	require.Len(t, rep.Rows, 4)
	require.Equal(t, "sm_90a", rep.Blob)
	require.Equal(t, []int{0, 0, 0}, rep.RankDevices)
	for _, row := range rep.Rows {
		require.Equal(t, "P1@300", row.Pack)
		require.Equal(t, 300, row.Tokens)
		require.Len(t, row.Rules, 2)
		a, b := row.Rules[0], row.Rules[1]
		require.Equal(t, []string{"A", "B"}, []string{a.Rule, b.Rule})
		// Rule A: slowest per repetition 7 (rank 1), 9 (rank 0), 8 (rank 1).
		require.Equal(t, 8.0, a.SlowestMs, row)
		require.Equal(t, 1, a.SlowestRank)
		require.InDelta(t, 1.0/7, a.ExchangeShare, 1e-12) // rank 1: median exchange 1, median total 7
		// Rule B (rank 2 +3): 9 (rank 2), 11 (rank 2), 8 (rank 1).
		require.Equal(t, 9.0, b.SlowestMs)
		require.Equal(t, 2, b.SlowestRank)
		require.InDelta(t, 1.0/9, b.ExchangeShare, 1e-12)
		require.Equal(t, []float64{5, 9, 6}, a.TotalsMs[0]) // the warm-up is left out
		require.Equal(t, []float64{1, 2, 0.5}, b.ExchangeMs[2])
		require.Len(t, a.Digests, 3)
		for _, d := range append(a.Digests, b.Digests...) {
			require.Len(t, d, digestBytes)
		}
		require.NotEqual(t, a.Digests[0], a.Digests[1])
		require.NotNil(t, row.LaunchesDiffer)
		if row.Layout == "C" {
			require.True(t, *row.LaunchesDiffer)
			require.Equal(t, []string{"rank 0 state 64->128", "rank 2 tape 64->128"}, row.LaunchDiffs)
			require.Equal(t, 128, b.VH[2]["tape"])
		} else {
			require.False(t, *row.LaunchesDiffer)
			require.Empty(t, row.LaunchDiffs)
		}
		require.NotNil(t, row.BitwiseRules)
		if row.Layout == "D" && row.Mode == "b3" {
			require.False(t, *row.BitwiseRules)
			require.Equal(t, []int{1}, row.RuleDiffRanks)
		} else {
			require.True(t, *row.BitwiseRules, row)
			require.Equal(t, a.Digests, b.Digests)
		}
		require.Nil(t, row.BitwiseRef)
	}
	// The same plan and rank give the same digest in B1 and B3 here (the fake's
	// values depend on the token only), other layouts other ones.
	require.Equal(t, rep.Rows[0].Rules[0].Digests, rep.Rows[1].Rules[0].Digests)
	require.NotEqual(t, rep.Rows[0].Rules[0].Digests, rep.Rows[2].Rules[0].Digests)
	s := rep.Summary
	require.Equal(t, 4, s.Rows)
	require.Equal(t, 2, s.LaunchesDiffer)
	require.NotNil(t, s.BitwiseRules)
	require.False(t, *s.BitwiseRules)
	require.Len(t, s.Failures, 1)
	require.Contains(t, s.Failures[0], "P1@300 D B3: digests differ between rules A and B (ranks 1)")
	require.ErrorContains(t, sweepFailure(s), "1 comparison(s) failed")

	// One rule: nothing to compare between rules.
	spec := fakeSpec(t)
	spec.rules = []sched.Rule{sched.RuleB}
	m, err := runSweep(context.Background(), spec, &fakeEngine{corrupt: corruptDB3}, nil, nil)
	require.NoError(t, err)
	one := buildSweepReport(spec, m, nil, "")
	require.Nil(t, one.Rows[0].LaunchesDiffer)
	require.Nil(t, one.Rows[0].BitwiseRules)
	require.Nil(t, one.Summary.BitwiseRules)
	require.NoError(t, sweepFailure(one.Summary))
}

// --compare: equal rows, a differing digest, a missing row and a missing
// rule, read back from a JSON file as sweep --json writes it.
func TestSweepCompare(t *testing.T) {
	base := fakeReport(t, nil, "")
	var buf bytes.Buffer
	require.NoError(t, writeJSON(&buf, base))
	var ref sweepReport
	require.NoError(t, json.Unmarshal(buf.Bytes(), &ref))
	// Row 0 (C B1): rule B's rank 2 digest changed. Row 2 (D B1): rule A
	// gone. Row 3 (D B3): gone.
	d := []byte(ref.Rows[0].Rules[1].Digests[2])
	d[0] ^= 1
	ref.Rows[0].Rules[1].Digests[2] = string(d)
	ref.Rows[2].Rules = ref.Rows[2].Rules[1:]
	ref.Rows = ref.Rows[:3]
	ref.Seed = 6
	path := filepath.Join(t.TempDir(), "ref.json")
	buf.Reset()
	require.NoError(t, writeJSON(&buf, &ref))
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	back, err := readSweepReport("compare", path)
	require.NoError(t, err)

	rep := fakeReport(t, back, path)
	for _, tc := range []struct {
		row          int
		want         *bool
		rules        []*bool
		note         string
		layout, mode string
	}{
		{0, ptr(false), []*bool{ptr(true), ptr(false)}, "rule B: ranks 2 differ", "C", "b1"},
		{1, ptr(true), []*bool{ptr(true), ptr(true)}, "", "C", "b3"},
		{2, nil, []*bool{nil, ptr(true)}, "rule A not in " + path, "D", "b1"},
		{3, nil, []*bool{nil, nil}, "not in " + path, "D", "b3"},
	} {
		row := rep.Rows[tc.row]
		require.Equal(t, tc.layout, row.Layout)
		require.Equal(t, tc.mode, row.Mode)
		require.Equal(t, tc.want, row.BitwiseRef, "row %d", tc.row)
		for i, w := range tc.rules {
			require.Equal(t, w, row.Rules[i].BitwiseRef, "row %d rule %d", tc.row, i)
		}
		require.Equal(t, tc.note, row.RefNote, "row %d", tc.row)
	}
	s := rep.Summary
	require.Equal(t, [3]int{1, 1, 2}, [3]int{s.RefEqual, s.RefDiffer, s.RefNotCompared})
	require.Equal(t, "seed 6 there, 5 here", s.RefNote)
	require.Len(t, s.Failures, 2) // D B3 between the rules, C B1 against the file
	require.Contains(t, s.Failures[0], "P1@300 C B1: digests differ from "+path+" (rule B: ranks 2 differ)")

	// kcp sweep --show prints the saved report as the table, and runs nothing.
	out, errOut, code := execute("sweep", "--show", path)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "seed 6\n")
	require.Contains(t, out, "tokens  layout  mode  A ms")
	require.Equal(t, 3, strings.Count(out, "\nP1@300  300 "), out) // the file's 3 rows
	require.Contains(t, out, "\nsummary: ")
	_, errOut, code = execute("sweep", "--show", path, "--reps", "2")
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "--reps does not apply")
	_, errOut, code = execute("sweep", "--show", filepath.Join(t.TempDir(), "none.json"))
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "--show")

	_, err = readSweepReport("compare", filepath.Join(t.TempDir(), "x.json"))
	require.ErrorContains(t, err, "--compare")
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"backend": "gpu"}`), 0o644))
	_, err = readSweepReport("show", bad)
	require.ErrorContains(t, err, "no rows")
}

// A rank's record survives packing, and bad records are errors.
func TestSweepRecord(t *testing.T) {
	digest := strings.Repeat("ab", 32)
	rr := sweepRankRun{totals: []float64{1.5, math.Nextafter(2, 3), 1e-300}, exchange: []float64{0, 0.25, 7}, vh: [4]int{64, 128, 0, 64}, digest: digest, set: true}
	rec, err := packRankRun(rr, 3)
	require.NoError(t, err)
	require.Len(t, rec, recordLen(3))
	back, err := unpackRankRun(rec, []byte(digest), 3)
	require.NoError(t, err)
	require.Equal(t, rr, back)
	for _, tc := range []struct {
		name string
		rr   sweepRankRun
		reps int
		want string
	}{
		{"reps", rr, 2, "3 totals and 3 exchange times for 2 repetitions"},
		{"digest", sweepRankRun{totals: rr.totals, exchange: rr.exchange, digest: "abc"}, 3, `digest "abc" is not 64 hex digits`},
	} {
		_, err := packRankRun(tc.rr, tc.reps)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err = unpackRankRun(rec[1:], []byte(digest), 3)
	require.ErrorContains(t, err, "a record of 10 values, want 11")
	unset := append([]float64{0}, rec[1:]...)
	_, err = unpackRankRun(unset, []byte(digest), 3)
	require.ErrorContains(t, err, "sent no results")

	// Two ranks' records and digests, unpacked into a cell.
	rr2 := sweepRankRun{totals: []float64{3, 4, 5}, exchange: []float64{1, 1, 1}, vh: [4]int{128, 128, 64, 64}, digest: strings.Repeat("cd", 32), set: true}
	rec2, err := packRankRun(rr2, 3)
	require.NoError(t, err)
	cell := &sweepCell{ranks: make([]sweepRankRun, 2)}
	require.NoError(t, unpackCell(cell, append(rec, rec2...), []byte(rr.digest+rr2.digest), 3))
	require.Equal(t, []sweepRankRun{rr, rr2}, cell.ranks)
	require.ErrorContains(t, unpackCell(cell, rec, []byte(rr.digest), 3), "for 2 ranks")
}

// Three "processes" (goroutines on a loopback communicator, one rank each)
// each get the whole matrix, equal to the one-process run's; a process run
// with other flags stops them all at the hello.
func TestSweepAcrossProcesses(t *testing.T) {
	spec := fakeSpec(t)
	one, err := runSweep(context.Background(), spec, &fakeEngine{corrupt: corruptDB3}, nil, nil)
	require.NoError(t, err)
	want := sweepRows(spec.cp, spec.rules, one.cells)

	comms, err := comm.NewLoopback(3)
	require.NoError(t, err)
	got := make([]*sweepMatrix, 3)
	err = comm.RunRanks(context.Background(), comms, func(ctx context.Context, c comm.Communicator) error {
		r := c.Rank()
		eng := &fakeEngine{local: []int{r}, corrupt: corruptDB3}
		m, err := runSweep(ctx, fakeSpec(t), eng, &commExchange{c: c, device: 2 - r}, nil)
		got[r] = m
		return err
	})
	require.NoError(t, err)
	for r, m := range got {
		require.Equal(t, 3, m.processes)
		require.Equal(t, []int{2, 1, 0}, m.rankDevices, "rank %d", r)
		require.Equal(t, want, sweepRows(spec.cp, spec.rules, m.cells), "rank %d", r)
	}

	comms, err = comm.NewLoopback(3)
	require.NoError(t, err)
	errs := make([]error, 3)
	_ = comm.RunRanks(context.Background(), comms, func(ctx context.Context, c comm.Communicator) error {
		sp := fakeSpec(t)
		if c.Rank() == 1 {
			sp.reps = 2
		}
		_, errs[c.Rank()] = runSweep(ctx, sp, &fakeEngine{local: []int{c.Rank()}}, &commExchange{c: c}, nil)
		return errs[c.Rank()]
	})
	for r, err := range errs {
		require.ErrorContains(t, err, "rank 1 runs 8 configurations x 2 repetitions (1 warm-up) at CP 3, rank 0 8 x 3 (1) at CP 3", "rank %d", r)
	}
}

// fakeExchange records output's barrier.
type fakeExchange struct {
	sweepExchange
	r, barriers int
}

func (x *fakeExchange) rank() int                      { return x.r }
func (x *fakeExchange) done(ctx context.Context) error { x.barriers++; return nil }

// Rank 0 (or the only process) prints the report, the others one line;
// every process waits at the barrier, and fails when a comparison failed.
func TestSweepOutput(t *testing.T) {
	rep := fakeReport(t, nil, "")
	for _, tc := range []struct {
		name string
		ex   *fakeExchange
		json bool
		want string
	}{
		{"one process", nil, false, "summary: 4 rows"},
		{"rank 0", &fakeExchange{r: 0}, true, `"rows": [`},
		{"rank 2", &fakeExchange{r: 2}, true, "rank 2: done\n"},
	} {
		var b bytes.Buffer
		o := sweepOptions{json: tc.json}
		var ex sweepExchange
		if tc.ex != nil {
			ex = tc.ex
		}
		err := o.output(context.Background(), &b, ex, rep)
		require.ErrorContains(t, err, "digests differ between rules A and B", tc.name)
		require.Contains(t, b.String(), tc.want, tc.name)
		if tc.ex != nil {
			require.Equal(t, 1, tc.ex.barriers, tc.name)
			if tc.ex.r != 0 {
				require.Equal(t, tc.want, b.String())
			}
		}
	}
}

// The text table: one line a row with each rule's slowest-rank median, rank
// and exchange share, the comparisons and the launches that differ.
func TestSweepText(t *testing.T) {
	rep := fakeReport(t, nil, "")
	rep.Seconds = 1.5
	var b strings.Builder
	require.NoError(t, writeSweepText(&b, rep))
	out := b.String()
	t.Log("\n" + out)
	for _, re := range []string{
		`(?m)^kcp sweep: CP 3, stage module, tc forward kernels, blob sm_90a, median of 3 after 1 warm-up, seed 5$`,
		`(?m)^gpu: GPU 0: Fake H200$`,
		`(?m)^pack\s+tokens\s+layout\s+mode\s+A ms\s+slowest\s+exch\s+B ms\s+slowest\s+exch\s+bits A=B\s+ref\s+launches A->B$`,
		`(?m)^P1@300\s+300\s+C\s+B1\s+8\.000\s+rank 1\s+14\.3%\s+9\.000\s+rank 2\s+11\.1%\s+yes\s+-\s+rank 0 state 64->128, rank 2 tape 64->128$`,
		`(?m)^P1@300\s+300\s+D\s+B3\s+8\.000\s+rank 1\s+14\.3%\s+9\.000\s+rank 2\s+11\.1%\s+NO\s+-\s+same$`,
		`(?m)^summary: 4 rows; launches differ between rules A and B in 2; digests DIFFER between the rules; 1\.5 s$`,
		`(?m)^FAILED: P1@300 D B3: digests differ between rules A and B \(ranks 1\)$`,
	} {
		require.Regexp(t, regexp.MustCompile(re), out)
	}
	require.Equal(t, 3+1+4+1+1, strings.Count(out, "\n"), "3 header lines, the table's head, 4 rows, the summary, 1 failure")
}
