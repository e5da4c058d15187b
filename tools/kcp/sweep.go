package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/internal/stats"
	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// kcp sweep runs the CP matrix of the multi-GPU work in one process (or one
// process a rank under a launcher): packs x layouts x width rules x modes,
// inputs made once per pack and every configuration of the pack run on
// backends that share the loaded blobs (GPU.ForPlan). Each cell is one
// (pack, layout, rule, mode): --warmup untimed and --reps timed runs through
// runGPUStep, kcp run's step. A row is one (pack, layout, mode) with every
// rule's cell side by side.

func init() { register(newSweepCmd) }

type sweepOptions struct {
	packs, layouts, modes, rules, stage, kernels, compare, show string
	cp, reps, warmup                                            int
	seed                                                        uint64
	json, noProgress                                            bool
	// gpu holds the flags shared with kcp run (--devices, --ranks-per-gpu,
	// --comm, --timeout, --blob), so that placeGPU and gpuOptions place the
	// ranks and make the communicator exactly as kcp run does.
	gpu runOptions
}

func newSweepCmd() *cobra.Command {
	var o sweepOptions
	cmd := &cobra.Command{
		Use:   "sweep [flags]",
		Short: "Run the CP matrix (packs x layouts x rules A/B x modes B1/B3) on GPUs: slowest-rank times, launches, digests",
		Long: `sweep runs the GDN layer's forward and backward on the GPU backend over a matrix of
configurations: every pack of --packs x layout of --layouts x width rule of --rules x mode of
--modes, at CP --cp. The inputs are drawn once per pack (--seed); the first plan loads the
blobs and every later plan and rule derives its backend from it (no reload). Each
configuration runs --warmup untimed and --reps timed repetitions, as kcp run does.

The ranks are placed as by kcp run: one process with every rank, on --devices (default: every
visible GPU), --ranks-per-gpu ranks a GPU, exchanging by --comm; or, under a launcher (kcp
launch, torchrun), one rank a process on GPU LOCAL_RANK through NCCL. Then the processes
all-gather every rank's times, launched widths and digests between runs, so every process has
the whole matrix; rank 0 prints it and the others print "rank i: done".

A row is one pack, layout and mode; for each rule it gives the median over the repetitions
of the slowest rank's total (forward + recompute + backward CUDA-event totals, uploads,
exchanges and copies included), that rank, and its exchange share (its median exchange
time over its median total). launches differ: the walks (rank, kind, width A->B) whose
launched width differs between rules A and B. bitwise A=B: every rank's digest (a sha256
of its rows of the output and gradients, of the last repetition) is equal under both
rules, as it must be (the widths never change bits). --compare FILE, a previous
kcp sweep --json, checks every row's digests against the row of the same pack, layout,
mode and rule there (rows missing from it are not compared). Any digest difference
(between the rules or against FILE) makes every process exit non-zero.

Progress goes to stderr (a bar; under a launcher one line a configuration from rank 0),
not with --no-progress or --json.`,
		Example: `  kcp sweep --packs P1@8192 --reps 1 --warmup 0
  kcp sweep --json --packs P1@8192,P3@8192 --devices 0 --comm loopback --cp 4 > ref.json
  kcp sweep --json --packs P1@8192,P3@8192 --cp 4 --compare ref.json
  kcp launch --nproc 4 -- sweep --packs P1,P2,P3,P4,P5 --reps 3 --warmup 1
  kcp sweep --show ref.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.packs, "packs", "P1,P2,P3,P4,P5", "packs, comma-separated: P1..P5, or NAME@TOKENS to scale one")
	f.StringVar(&o.layouts, "layouts", "C,Z,D", "layouts, comma-separated: C, Z, D")
	f.StringVar(&o.modes, "modes", "b1,b3", "modes, comma-separated: b1 (forward keeping activations, backward), b3 (checkpoint, recompute, backward)")
	f.StringVar(&o.rules, "rules", "a,b", "width rules, comma-separated: a, b")
	f.StringVar(&o.stage, "stage", "module", "core (GDN only) or module (conv1d + SiLU, then GDN)")
	f.StringVar(&o.kernels, "kernels", kcp.KernelsAuto, "kernels: auto (the set kcp run picks: the fastest the blob has and the first rank's GPU allows), fp32 (CUDA cores), tc (tensor-core forward, fp32 backward), mma (v4 forward and backward on mma.sync) or v5 (mma with bf16 H and V' for the output and the chunk gradients grouped by QK head); mma and v5 need blobs built with them")
	f.IntVar(&o.reps, "reps", 3, "timed repetitions of every configuration")
	f.IntVar(&o.warmup, "warmup", 1, "untimed repetitions before the timed ones")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the random inputs")
	f.IntVar(&o.cp, "cp", 0, "CP ranks R, 1..64 (default: WORLD_SIZE under a launcher, else --ranks-per-gpu x the GPUs used)")
	addPlacementFlags(cmd, &o.gpu)
	f.StringVar(&o.compare, "compare", "", "a previous kcp sweep --json output: every row's digests must equal its row there")
	f.StringVar(&o.show, "show", "", "print a saved kcp sweep --json output as the table, run nothing")
	f.BoolVar(&o.json, "json", false, "write one JSON object to stdout (rank 0), nothing else")
	f.BoolVar(&o.noProgress, "no-progress", false, "no progress on stderr")
	return cmd
}

// sweepSpec is the matrix a sweep runs, read from the flags.
type sweepSpec struct {
	packs   []kcp.Pack
	layouts []kcp.Layout
	modes   []string // b1, b3
	rules   []sched.Rule
	stage   kcp.Stage
	kernels string // fp32, tc, mma or v5
	cp      int
	seed    uint64
	reps    int
	warmup  int
	// hqk, hv, dk, dv are the plans' heads and dims: 0 takes the defaults
	// (the GPU kernels' 16/48 and 128); tests use small ones.
	hqk, hv, dk, dv int
}

// cells is the number of (pack, layout, rule, mode) configurations.
func (s *sweepSpec) cells() int {
	return len(s.packs) * len(s.layouts) * len(s.rules) * len(s.modes)
}

// sweepList splits a comma-separated flag value into its trimmed, non-empty
// items; an empty list is an error.
func sweepList(flag, s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s %q: empty list", flag, s)
	}
	return out, nil
}

// sweepParse reads every item of a list flag with parse and rejects
// duplicates (by the parsed value).
func sweepParse[T comparable](flag, s string, parse func(string) (T, error)) ([]T, error) {
	items, err := sweepList(flag, s)
	if err != nil {
		return nil, err
	}
	var out []T
	for _, it := range items {
		v, err := parse(it)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("%s %q: %s is listed twice", flag, s, it)
		}
		out = append(out, v)
	}
	return out, nil
}

// spec checks the flags and returns the matrix (CP still unresolved when
// --cp is not given).
func (o *sweepOptions) spec(changed func(string) bool) (*sweepSpec, error) {
	sp := &sweepSpec{seed: o.seed, reps: o.reps, warmup: o.warmup, kernels: o.kernels, cp: o.cp}
	var err error
	if o.reps < 1 || o.warmup < 0 {
		return nil, fmt.Errorf("--reps %d, --warmup %d: need at least one timed repetition and no negative warm-up", o.reps, o.warmup)
	}
	if o.kernels != kcp.KernelsAuto {
		if err := new(kcp.GPUOptions).SetKernels(o.kernels); err != nil {
			return nil, fmt.Errorf("--kernels: %w", err)
		}
	}
	if changed("cp") && (o.cp < 1 || o.cp > kcp.MaxRanks) {
		return nil, fmt.Errorf("--cp %d: want 1..%d", o.cp, kcp.MaxRanks)
	}
	if sp.stage, err = kcp.ParseStage(o.stage); err != nil {
		return nil, fmt.Errorf("--stage: %w", err)
	}
	packs, err := sweepList("--packs", o.packs)
	if err != nil {
		return nil, err
	}
	for _, s := range packs {
		pk, err := parsePack(s)
		if err != nil {
			return nil, fmt.Errorf("--packs: %w", err)
		}
		if slices.ContainsFunc(sp.packs, func(q kcp.Pack) bool { return q.Name == pk.Name }) {
			return nil, fmt.Errorf("--packs %q: %s is listed twice", o.packs, pk.Name)
		}
		sp.packs = append(sp.packs, pk)
	}
	if sp.layouts, err = sweepParse("--layouts", o.layouts, kcp.ParseLayout); err != nil {
		return nil, err
	}
	if sp.modes, err = sweepParse("--modes", o.modes, func(s string) (string, error) {
		m := strings.ToLower(s)
		if m != "b1" && m != "b3" {
			return "", fmt.Errorf("%q is not a mode: want b1 or b3", s)
		}
		return m, nil
	}); err != nil {
		return nil, err
	}
	if sp.rules, err = sweepParse("--rules", o.rules, sched.ParseRule); err != nil {
		return nil, err
	}
	return sp, nil
}

// sweepBackend is one backend of the sweep: a plan's ranks under one rule.
type sweepBackend interface {
	// localRanks are the ranks this process runs, ascending.
	localRanks() []int
	// step runs mode once (kcp run's runGPUStep).
	step(ctx context.Context, mode string, in *kcp.Inputs, dout []float32) (*gpuStep, error)
	close() error
}

// sweepEngine opens the sweep's backends: the GPU one (gpuEngine), or a
// fake in tests.
type sweepEngine interface {
	// open returns the backend of plan under rule.
	open(plan *kcp.Plan, rule sched.Rule) (sweepBackend, error)
	// describe returns the device line, how the ranks exchange and each
	// rank's device (-1: another process runs it), once a backend was
	// opened.
	describe() (device, comm, exchange string, rankDevices []int)
	close() error
}

// gpuEngine opens GPU backends: the first plan's with NewGPU (loading the
// blobs), every later one with ForPlan from it, so the blobs load once and
// an NCCL group is made once and shared. The first stays open until close.
type gpuEngine struct {
	opts kcp.GPUOptions
	base *kcp.GPU
}

// gpuSweepBackend is a GPU backend of the sweep.
type gpuSweepBackend struct {
	g     *kcp.GPU
	owned bool // made by ForPlan: closed with the backend
}

func (b gpuSweepBackend) localRanks() []int { return b.g.LocalRanks() }

func (b gpuSweepBackend) step(ctx context.Context, mode string, in *kcp.Inputs, dout []float32) (*gpuStep, error) {
	return runGPUStep(ctx, b.g, mode, in, dout)
}

func (b gpuSweepBackend) close() error {
	if b.owned {
		return b.g.Close()
	}
	return nil
}

func (e *gpuEngine) open(plan *kcp.Plan, rule sched.Rule) (sweepBackend, error) {
	opts := e.opts
	opts.Rule = rule
	if e.base == nil {
		g, err := kcp.NewGPU(plan, opts)
		if err != nil {
			if errors.Is(err, loader.ErrNoDriver) || loader.IsCode(err, loader.ErrorNoDevice) {
				return nil, fmt.Errorf("kcp sweep needs a CUDA GPU: %w", err)
			}
			return nil, err
		}
		e.base = g
		return gpuSweepBackend{g: g}, nil
	}
	g, err := e.base.ForPlan(plan, opts)
	if err != nil {
		return nil, err
	}
	return gpuSweepBackend{g: g, owned: true}, nil
}

func (e *gpuEngine) describe() (string, string, string, []int) {
	if e.base == nil {
		return "", "", "", nil
	}
	return e.base.Profile().String(), string(e.base.Comm()), exchangeKind(e.base), e.base.RankDevices()
}

func (e *gpuEngine) close() error {
	if e.base == nil {
		return nil
	}
	return e.base.Close()
}

// sweepRankRun is one rank's results in one cell.
type sweepRankRun struct {
	totals   []float64 // per timed repetition: forward + recompute + backward, ms
	exchange []float64 // per timed repetition: the stages named "exchange ...", ms
	// vh is the width each walk launched with (the last repetition's; the
	// forward's summary and state, the backward's offset and tape), 0 where
	// none launched.
	vh     [sched.NumWalkKinds]int
	digest string // kcp.RankDigest of the last repetition
	set    bool   // filled, by this process or through the exchange
}

// sweepCell is one (pack, layout, rule, mode) over every rank of the plan.
type sweepCell struct {
	pack   string
	tokens int
	layout kcp.Layout
	rule   sched.Rule
	mode   string
	blob   string
	ranks  []sweepRankRun // indexed by rank
}

// sweepMatrix is what a sweep ran.
type sweepMatrix struct {
	device, comm, exchange string
	rankDevices            []int
	processes              int
	blob                   string
	cells                  []*sweepCell // in run order: pack, layout, rule, mode
}

// sweepExchange shares the cells between the processes of a launched sweep
// (nil: one process runs every rank).
type sweepExchange interface {
	// hello checks that every process runs the same matrix and returns
	// every rank's device.
	hello(ctx context.Context, spec *sweepSpec) ([]int, error)
	// gather fills every rank of cell from the process that ran it.
	gather(ctx context.Context, cell *sweepCell, reps int) error
	// done is a barrier: rank 0 has written its output.
	done(ctx context.Context) error
	rank() int
	size() int
}

// sweepProgress is the sweep's progress on stderr: the bar (one process), or
// one line a cell (rank 0 under a launcher). The zero value and nil show
// nothing.
type sweepProgress struct {
	bar   *runBar
	lines io.Writer
}

// describe sets the bar's description.
func (p *sweepProgress) describe(s string) {
	if p != nil && p.bar != nil {
		p.bar.describe(s)
	}
}

// stage is the backends' Options.Progress: one bar step a rank's stage.
func (p *sweepProgress) stage(rank int, stage string) {
	if p != nil && p.bar != nil {
		p.bar.step(rank, stage)
	}
}

// cellDone writes, under a launcher, the line of the i-th of n cells, done
// and gathered.
func (p *sweepProgress) cellDone(i, n int, c *sweepCell) {
	if p == nil || p.lines == nil {
		return
	}
	rr := cellRuleRun(c)
	fmt.Fprintf(p.lines, "kcp sweep: %d/%d %s layout %s rule %s %s: slowest rank %d %.3f ms, exchanges %.1f%%\n",
		i, n, c.pack, c.layout, c.rule, strings.ToUpper(c.mode), rr.SlowestRank, rr.SlowestMs, 100*rr.ExchangeShare)
}

// finish ends the bar.
func (p *sweepProgress) finish() {
	if p != nil && p.bar != nil {
		p.bar.finish()
	}
}

// runSweep runs the matrix on eng: for each pack the inputs once, for each
// layout a plan, for each rule a backend, for each mode a cell; with ex, each
// cell is gathered from every process right after its runs (between runs, in
// the same order on every process, on the communicator the runs use).
func runSweep(ctx context.Context, spec *sweepSpec, eng sweepEngine, ex sweepExchange, prog *sweepProgress) (*sweepMatrix, error) {
	m := &sweepMatrix{processes: 1}
	var helloDevices []int
	if ex != nil {
		var err error
		if helloDevices, err = ex.hello(ctx, spec); err != nil {
			return nil, err
		}
		m.processes = ex.size()
	}
	n := spec.cells()
	for _, pk := range spec.packs {
		var (
			in   *kcp.Inputs
			dout []float32
		)
		for _, layout := range spec.layouts {
			plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: pk.Docs, Ranks: spec.cp, Layout: layout, HQK: spec.hqk, HV: spec.hv, DK: spec.dk, DV: spec.dv})
			if err != nil {
				return nil, fmt.Errorf("pack %s, layout %s: %w", pk.Name, layout, err)
			}
			if in == nil { // the inputs depend on the shapes only, not on the layout
				prog.describe(fmt.Sprintf("%s: inputs", pk.Name))
				in, dout = kcp.RandomInputs(plan, spec.stage, spec.seed)
			}
			if err := errors.Join(in.Validate(plan, spec.stage, false), plan.CheckDOut(dout, false)); err != nil {
				return nil, fmt.Errorf("pack %s, layout %s: %w", pk.Name, layout, err)
			}
			for _, rule := range spec.rules {
				be, err := eng.open(plan, rule)
				if err != nil {
					return nil, fmt.Errorf("pack %s, layout %s, rule %s: %w", pk.Name, layout, rule, err)
				}
				for _, mode := range spec.modes {
					where := fmt.Sprintf("pack %s, layout %s, rule %s, mode %s", pk.Name, layout, rule, strings.ToUpper(mode))
					cell, err := runCell(ctx, spec, plan, be, pk.Name, layout, rule, mode, in, dout, prog)
					if err != nil {
						return nil, errors.Join(fmt.Errorf("%s: %w", where, err), be.close())
					}
					if ex != nil {
						if err := ex.gather(ctx, cell, spec.reps); err != nil {
							return nil, errors.Join(fmt.Errorf("%s: exchanging the results: %w", where, err), be.close())
						}
					}
					if m.blob == "" {
						m.blob = cell.blob
					}
					m.cells = append(m.cells, cell)
					prog.cellDone(len(m.cells), n, cell)
				}
				if err := be.close(); err != nil {
					return nil, fmt.Errorf("pack %s, layout %s, rule %s: %w", pk.Name, layout, rule, err)
				}
			}
		}
		// Several processes may share the host: give the pack's inputs and
		// results (dead from here on) back before the next pack's.
		debug.FreeOSMemory()
	}
	m.device, m.comm, m.exchange, m.rankDevices = eng.describe()
	if helloDevices != nil {
		m.rankDevices = helloDevices
	}
	return m, nil
}

// runCell runs one mode on one backend: --warmup and --reps repetitions,
// keeping each local rank's totals, exchange times and launched widths, and
// the digests of the last repetition. Between repetitions it drops the
// step's host results and collects them, so a process holds about one
// step's results at a time.
func runCell(ctx context.Context, spec *sweepSpec, plan *kcp.Plan, be sweepBackend, pack string, layout kcp.Layout, rule sched.Rule,
	mode string, in *kcp.Inputs, dout []float32, prog *sweepProgress) (*sweepCell, error) {
	cell := &sweepCell{pack: pack, tokens: plan.Tokens, layout: layout, rule: rule, mode: mode, ranks: make([]sweepRankRun, len(plan.Ranks))}
	local := be.localRanks()
	runs := spec.warmup + spec.reps
	for i := range runs {
		prog.describe(fmt.Sprintf("%s %s rule %s %s: run %d of %d", pack, layout, rule, strings.ToUpper(mode), i+1, runs))
		st, err := be.step(ctx, mode, in, dout)
		if err != nil {
			return nil, err
		}
		if len(st.vh) != len(plan.Ranks) || len(st.phases) == 0 {
			return nil, fmt.Errorf("the step reported %d ranks' widths and %d phases for a plan of %d ranks", len(st.vh), len(st.phases), len(plan.Ranks))
		}
		cell.blob = st.blob
		if i >= spec.warmup {
			for _, r := range local {
				rr := &cell.ranks[r]
				rr.totals = append(rr.totals, st.rankTotal(r))
				rr.exchange = append(rr.exchange, st.rankExchange(r))
				rr.vh, rr.set = st.vh[r], true
			}
		}
		if i == runs-1 {
			digests, err := rankDigests(local, st)
			if err != nil {
				return nil, err
			}
			for j, r := range local {
				cell.ranks[r].digest = digests[j]
			}
		}
		st = nil
		runtime.GC()
	}
	return cell, nil
}

// rankDigests returns kcp.RankDigest of each rank of ranks over the step's
// output and gradients (from the GPU's rows: no float64 tensors made).
func rankDigests(ranks []int, st *gpuStep) ([]string, error) {
	if st.digest == nil {
		return nil, errors.New("the step returned no output or no gradients")
	}
	out := make([]string, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() { out[i], errs[i] = st.digest(r) })
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// The cross-process protocol of a launched sweep, on the communicator the
// backends exchange through, always between runs and in the same order on
// every process:
//
//  1. hello, before the first run: AllGatherFloat64 of [cells, reps, warmup,
//     CP, device] from every rank; every process checks that all run the
//     same matrix, and learns each rank's device.
//  2. after each cell's runs: AllGatherFloat64 of the rank's record (see
//     packRankRun), then AllGather of its digest as digestBytes bytes.
//  3. after rank 0 wrote its output: a Barrier, so that no process exits
//     (and makes the launcher stop the others) before rank 0 has printed.
//
// Every process thus holds the whole matrix and reaches the same verdict.

// digestBytes is the length of a rank digest: a hex sha256.
const digestBytes = 64

// helloFields is the length of the hello record.
const helloFields = 5

// commExchange is the sweepExchange over a communicator (the launcher's).
type commExchange struct {
	c      comm.Communicator
	device int // this process's device
}

func (x *commExchange) rank() int { return x.c.Rank() }
func (x *commExchange) size() int { return x.c.Size() }

func (x *commExchange) hello(ctx context.Context, spec *sweepSpec) ([]int, error) {
	if x.c.Size() != spec.cp {
		return nil, fmt.Errorf("the communicator has %d ranks, the plans %d", x.c.Size(), spec.cp)
	}
	send := []float64{float64(spec.cells()), float64(spec.reps), float64(spec.warmup), float64(spec.cp), float64(x.device)}
	all, err := comm.AllGatherFloat64(ctx, x.c, send)
	if err != nil {
		return nil, fmt.Errorf("sweep hello: %w", err)
	}
	devices := make([]int, x.c.Size())
	for r := range devices {
		rec := all[r*helloFields : (r+1)*helloFields]
		if !slices.Equal(rec[:4], all[:4]) {
			return nil, fmt.Errorf("rank %d runs %v configurations x %v repetitions (%v warm-up) at CP %v, rank 0 %v x %v (%v) at CP %v: every process needs the same flags",
				r, rec[0], rec[1], rec[2], rec[3], all[0], all[1], all[2], all[3])
		}
		devices[r] = int(rec[4])
	}
	return devices, nil
}

func (x *commExchange) gather(ctx context.Context, cell *sweepCell, reps int) error {
	me := x.c.Rank()
	if me >= len(cell.ranks) || !cell.ranks[me].set {
		return fmt.Errorf("this process (rank %d) did not run its rank", me)
	}
	rec, err := packRankRun(cell.ranks[me], reps)
	if err != nil {
		return err
	}
	all, err := comm.AllGatherFloat64(ctx, x.c, rec)
	if err != nil {
		return err
	}
	recv := make([]byte, x.c.Size()*digestBytes)
	if err := x.c.AllGather(ctx, []byte(cell.ranks[me].digest), recv); err != nil {
		return err
	}
	return unpackCell(cell, all, recv, reps)
}

func (x *commExchange) done(ctx context.Context) error { return x.c.Barrier(ctx) }

// recordLen is the length of one rank's record with reps repetitions.
func recordLen(reps int) int { return 1 + 2*reps + sched.NumWalkKinds }

// packRankRun writes a rank's results as a fixed-size float64 record:
// [1 (set), totals (reps), exchange times (reps), launched widths (summary,
// state, offset, tape)]. Its digest travels apart, as bytes.
func packRankRun(rr sweepRankRun, reps int) ([]float64, error) {
	if len(rr.totals) != reps || len(rr.exchange) != reps {
		return nil, fmt.Errorf("%d totals and %d exchange times for %d repetitions", len(rr.totals), len(rr.exchange), reps)
	}
	if len(rr.digest) != digestBytes {
		return nil, fmt.Errorf("digest %q is not %d hex digits", rr.digest, digestBytes)
	}
	rec := make([]float64, 0, recordLen(reps))
	rec = append(rec, 1)
	rec = append(rec, rr.totals...)
	rec = append(rec, rr.exchange...)
	for _, v := range rr.vh {
		rec = append(rec, float64(v))
	}
	return rec, nil
}

// unpackRankRun reads a record of packRankRun and the rank's digest.
func unpackRankRun(rec []float64, digest []byte, reps int) (sweepRankRun, error) {
	if len(rec) != recordLen(reps) {
		return sweepRankRun{}, fmt.Errorf("a record of %d values, want %d", len(rec), recordLen(reps))
	}
	if rec[0] != 1 {
		return sweepRankRun{}, errors.New("the rank sent no results")
	}
	rr := sweepRankRun{
		totals:   slices.Clone(rec[1 : 1+reps]),
		exchange: slices.Clone(rec[1+reps : 1+2*reps]),
		digest:   string(digest),
		set:      true,
	}
	for k := range rr.vh {
		rr.vh[k] = int(rec[1+2*reps+k])
	}
	return rr, nil
}

// unpackCell fills every rank of cell from the gathered records and digests.
func unpackCell(cell *sweepCell, recs []float64, digests []byte, reps int) error {
	n := recordLen(reps)
	if len(recs) != len(cell.ranks)*n || len(digests) != len(cell.ranks)*digestBytes {
		return fmt.Errorf("gathered %d values and %d digest bytes for %d ranks", len(recs), len(digests), len(cell.ranks))
	}
	for r := range cell.ranks {
		rr, err := unpackRankRun(recs[r*n:(r+1)*n], digests[r*digestBytes:(r+1)*digestBytes], reps)
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
		cell.ranks[r] = rr
	}
	return nil
}

// sweepReport is what sweep prints; its JSON names are part of the CLI's
// interface (and --compare reads them back).
type sweepReport struct {
	// Device is archdetect's line of this process's (rank 0's) first device.
	Device string `json:"device"`
	// Comm is how the ranks exchanged: loopback, nccl, or communicator (one
	// rank a process under a launcher).
	Comm string `json:"comm"`
	// Exchange is how the summaries and offsets travelled: "device" (NCCL
	// all-gathers of device memory) or "host" (through host memory).
	Exchange  string `json:"exchange"`
	Processes int    `json:"processes"`
	// RankDevices is each rank's CUDA device (under a launcher, each
	// process's LOCAL_RANK).
	RankDevices []int      `json:"rank_devices"`
	Blob        string     `json:"blob"`
	Kernels     string     `json:"kernels"` // fp32, tc, mma or v5
	Stage       string     `json:"stage"`
	CP          int        `json:"cp"`
	Seed        uint64     `json:"seed"`
	Reps        int        `json:"reps"`
	Warmup      int        `json:"warmup"`
	Compare     string     `json:"compare,omitempty"` // --compare FILE
	Rows        []sweepRow `json:"rows"`
	Summary     sweepSum   `json:"summary"`
	Seconds     float64    `json:"seconds"`
}

// sweepRow is one pack, layout and mode, with every rule's results.
type sweepRow struct {
	Pack   string         `json:"pack"`
	Tokens int            `json:"tokens"`
	CP     int            `json:"cp"`
	Layout string         `json:"layout"`
	Mode   string         `json:"mode"`
	Rules  []sweepRuleRun `json:"rules"` // in --rules order
	// LaunchesDiffer says whether any rank launched any walk at another
	// width under rule B than under rule A (null without both rules);
	// LaunchDiffs names them: "rank 2 tape 64->128".
	LaunchesDiffer *bool    `json:"launches_differ"`
	LaunchDiffs    []string `json:"launch_diffs,omitempty"`
	// BitwiseRules says whether every rank's digest is equal under rules A
	// and B (null without both); RuleDiffRanks are the ranks whose differ.
	BitwiseRules  *bool `json:"bitwise_rules"`
	RuleDiffRanks []int `json:"rule_diff_ranks,omitempty"`
	// BitwiseRef says whether every rule's digests equal those of the same
	// row and rule in the --compare file: null when not compared (no file,
	// or no such row or rule there and no difference); RefNote says why
	// not, or which differ.
	BitwiseRef *bool  `json:"bitwise_ref"`
	RefNote    string `json:"ref_note,omitempty"`
}

// sweepRuleRun is one rule's cell of a row.
type sweepRuleRun struct {
	Rule string `json:"rule"` // A or B
	// SlowestMs is the median over the repetitions of the slowest rank's
	// total; SlowestRank the rank slowest most often; ExchangeShare its
	// median exchange time over its median total.
	SlowestMs     float64 `json:"slowest_ms"`
	SlowestRank   int     `json:"slowest_rank"`
	ExchangeShare float64 `json:"exchange_share"`
	// TotalsMs and ExchangeMs are every rank's per-repetition times,
	// [rank][repetition].
	TotalsMs   [][]float64 `json:"totals_ms"`
	ExchangeMs [][]float64 `json:"exchange_ms"`
	// VH is each rank's launched width per walk (0: none launched).
	VH []map[string]int `json:"vh"`
	// Digests are each rank's kcp.RankDigest of the last repetition.
	Digests []string `json:"digests"`
	// BitwiseRef: equal to the --compare file's (null: not compared).
	BitwiseRef *bool `json:"bitwise_ref"`

	vh [][sched.NumWalkKinds]int
}

// sweepSum is the report's summary.
type sweepSum struct {
	Rows int `json:"rows"`
	// LaunchesDiffer counts the rows whose launches differ between the rules.
	LaunchesDiffer int `json:"launches_differ"`
	// BitwiseRules: every row's digests equal between the rules (null
	// without both rules).
	BitwiseRules *bool `json:"bitwise_rules"`
	// RefEqual, RefDiffer and RefNotCompared count the rows against
	// --compare (all zero without it); RefNote notes settings that differ
	// from the file's.
	RefEqual       int    `json:"ref_equal"`
	RefDiffer      int    `json:"ref_differ"`
	RefNotCompared int    `json:"ref_not_compared"`
	RefNote        string `json:"ref_note,omitempty"`
	// Failures are the failed comparisons; any makes the sweep fail.
	Failures []string `json:"failures,omitempty"`
}

// cellRuleRun summarises a cell: the slowest rank's median total, that rank,
// its exchange share, and every rank's times, widths and digest.
func cellRuleRun(c *sweepCell) sweepRuleRun {
	rr := sweepRuleRun{Rule: c.rule.String()}
	ranks := make([]int, len(c.ranks))
	for r, x := range c.ranks {
		ranks[r] = r
		rr.TotalsMs = append(rr.TotalsMs, x.totals)
		rr.ExchangeMs = append(rr.ExchangeMs, x.exchange)
		rr.Digests = append(rr.Digests, x.digest)
		rr.vh = append(rr.vh, x.vh)
		m := map[string]int{}
		for _, k := range sched.WalkKinds() {
			m[k.String()] = x.vh[k]
		}
		rr.VH = append(rr.VH, m)
	}
	rr.SlowestMs, rr.SlowestRank = slowestOf(ranks, rr.TotalsMs)
	if len(ranks) > 0 {
		if t := stats.Median(rr.TotalsMs[rr.SlowestRank]); t > 0 {
			rr.ExchangeShare = stats.Median(rr.ExchangeMs[rr.SlowestRank]) / t
		}
	}
	return rr
}

// sweepRows groups the cells into rows (pack, layout, mode; in run order)
// with their rules in the order given, and compares the rules.
func sweepRows(cp int, rules []sched.Rule, cells []*sweepCell) []sweepRow {
	type key struct {
		pack   string
		layout kcp.Layout
		mode   string
	}
	var order []key
	byKey := map[key]map[sched.Rule]*sweepCell{}
	for _, c := range cells {
		k := key{c.pack, c.layout, c.mode}
		if byKey[k] == nil {
			byKey[k] = map[sched.Rule]*sweepCell{}
			order = append(order, k)
		}
		byKey[k][c.rule] = c
	}
	var rows []sweepRow
	for _, k := range order {
		row := sweepRow{Pack: k.pack, Layout: string(k.layout), Mode: k.mode, CP: cp}
		byRule := map[sched.Rule]sweepRuleRun{}
		for _, rule := range rules {
			c, ok := byKey[k][rule]
			if !ok {
				continue
			}
			row.Tokens = c.tokens
			rr := cellRuleRun(c)
			byRule[rule] = rr
			row.Rules = append(row.Rules, rr)
		}
		a, okA := byRule[sched.RuleA]
		b, okB := byRule[sched.RuleB]
		if okA && okB {
			for r := range a.vh {
				for _, kind := range sched.WalkKinds() {
					if wa, wb := a.vh[r][kind], b.vh[r][kind]; wa != wb {
						row.LaunchDiffs = append(row.LaunchDiffs, fmt.Sprintf("rank %d %s %d->%d", r, kind, wa, wb))
					}
				}
				if a.Digests[r] != b.Digests[r] {
					row.RuleDiffRanks = append(row.RuleDiffRanks, r)
				}
			}
			row.LaunchesDiffer = ptr(len(row.LaunchDiffs) > 0)
			row.BitwiseRules = ptr(len(row.RuleDiffRanks) == 0)
		}
		rows = append(rows, row)
	}
	return rows
}

// ptr returns a pointer to a copy of v (JSON's true/false/null fields).
func ptr[T any](v T) *T { return &v }

// readSweepReport reads a kcp sweep --json output.
func readSweepReport(flag, path string) (*sweepReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	var rep sweepReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("--%s %s: not a kcp sweep --json output: %w", flag, path, err)
	}
	if rep.Rows == nil {
		return nil, fmt.Errorf("--%s %s: no rows (not a kcp sweep --json output?)", flag, path)
	}
	return &rep, nil
}

// compareRows sets every row's and rule's BitwiseRef against ref's row of
// the same pack, layout and mode and its rule; what ref lacks stays null.
func compareRows(rows []sweepRow, ref *sweepReport, name string) {
	type key struct{ pack, layout, mode string }
	refRows := map[key]*sweepRow{}
	for i := range ref.Rows {
		r := &ref.Rows[i]
		refRows[key{r.Pack, r.Layout, r.Mode}] = r
	}
	for i := range rows {
		row := &rows[i]
		rr, ok := refRows[key{row.Pack, row.Layout, row.Mode}]
		if !ok {
			row.RefNote = "not in " + name
			continue
		}
		var notes, missing []string
		same, compared := true, 0
		for j := range row.Rules {
			ru := &row.Rules[j]
			k := slices.IndexFunc(rr.Rules, func(x sweepRuleRun) bool { return x.Rule == ru.Rule })
			if k < 0 {
				missing = append(missing, ru.Rule)
				continue
			}
			compared++
			want := rr.Rules[k].Digests
			var diff []string
			for r, d := range ru.Digests {
				if r >= len(want) || want[r] != d {
					diff = append(diff, fmt.Sprint(r))
				}
			}
			if len(want) != len(ru.Digests) {
				diff = append(diff, fmt.Sprintf("%d ranks there, %d here", len(want), len(ru.Digests)))
			}
			ru.BitwiseRef = ptr(len(diff) == 0)
			if len(diff) > 0 {
				same = false
				notes = append(notes, fmt.Sprintf("rule %s: ranks %s differ", ru.Rule, strings.Join(diff, ", ")))
			}
		}
		if len(missing) > 0 {
			notes = append(notes, fmt.Sprintf("rule %s not in %s", strings.Join(missing, ", "), name))
		}
		if rr.CP != row.CP {
			notes = append(notes, fmt.Sprintf("CP %d there, %d here", rr.CP, row.CP))
		}
		switch {
		case !same:
			row.BitwiseRef = ptr(false)
		case compared == len(row.Rules) && compared > 0:
			row.BitwiseRef = ptr(true)
		}
		row.RefNote = strings.Join(notes, "; ")
	}
}

// summarizeSweep counts the rows and lists the failed comparisons.
func summarizeSweep(rep *sweepReport, ref *sweepReport) {
	s := sweepSum{Rows: len(rep.Rows)}
	for _, row := range rep.Rows {
		if row.LaunchesDiffer != nil && *row.LaunchesDiffer {
			s.LaunchesDiffer++
		}
		if row.BitwiseRules != nil {
			if s.BitwiseRules == nil {
				s.BitwiseRules = ptr(true)
			}
			if !*row.BitwiseRules {
				*s.BitwiseRules = false
				s.Failures = append(s.Failures, fmt.Sprintf("%s %s %s: digests differ between rules A and B (ranks %s)",
					row.Pack, row.Layout, strings.ToUpper(row.Mode), joinInts(row.RuleDiffRanks)))
			}
		}
		if ref == nil {
			continue
		}
		switch {
		case row.BitwiseRef == nil:
			s.RefNotCompared++
		case *row.BitwiseRef:
			s.RefEqual++
		default:
			s.RefDiffer++
			s.Failures = append(s.Failures, fmt.Sprintf("%s %s %s: digests differ from %s (%s)",
				row.Pack, row.Layout, strings.ToUpper(row.Mode), rep.Compare, row.RefNote))
		}
	}
	if ref != nil {
		var notes []string
		if ref.Kernels != rep.Kernels {
			notes = append(notes, fmt.Sprintf("kernels %s there, %s here", ref.Kernels, rep.Kernels))
		}
		if ref.Stage != rep.Stage {
			notes = append(notes, fmt.Sprintf("stage %s there, %s here", ref.Stage, rep.Stage))
		}
		if ref.Seed != rep.Seed {
			notes = append(notes, fmt.Sprintf("seed %d there, %d here", ref.Seed, rep.Seed))
		}
		if ref.CP != rep.CP {
			notes = append(notes, fmt.Sprintf("CP %d there, %d here", ref.CP, rep.CP))
		}
		s.RefNote = strings.Join(notes, "; ")
	}
	rep.Summary = s
}

// joinInts writes "1, 3".
func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

// sweepFailure is the error of a sweep whose comparisons failed.
func sweepFailure(s sweepSum) error {
	if len(s.Failures) == 0 {
		return nil
	}
	return fmt.Errorf("%d comparison(s) failed:\n  %s", len(s.Failures), strings.Join(s.Failures, "\n  "))
}

// buildSweepReport makes the report of a matrix, compared with ref (nil:
// no --compare).
func buildSweepReport(spec *sweepSpec, m *sweepMatrix, ref *sweepReport, compare string) *sweepReport {
	rep := &sweepReport{
		Device: m.device, Comm: m.comm, Exchange: m.exchange, Processes: m.processes, RankDevices: m.rankDevices, Blob: m.blob,
		Kernels: spec.kernels, Stage: string(spec.stage), CP: spec.cp, Seed: spec.seed, Reps: spec.reps, Warmup: spec.warmup,
		Compare: compare, Rows: sweepRows(spec.cp, spec.rules, m.cells),
	}
	if ref != nil {
		compareRows(rep.Rows, ref, compare)
	}
	summarizeSweep(rep, ref)
	return rep
}

// yesNo renders a comparison: yes, NO, or - when not made.
func yesNo(b *bool) string {
	switch {
	case b == nil:
		return "-"
	case *b:
		return "yes"
	}
	return "NO"
}

// writeSweepText writes the table: one line a row, each rule's slowest-rank
// median, that rank and its exchange share, the comparisons, the launches
// that differ; then the summary line.
func writeSweepText(w io.Writer, r *sweepReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kcp sweep: CP %d, stage %s, %s forward kernels, blob %s, median of %d after %d warm-up, seed %d\n",
		r.CP, r.Stage, r.Kernels, r.Blob, r.Reps, r.Warmup, r.Seed)
	fmt.Fprintf(&b, "gpu: %s\n", r.Device)
	fmt.Fprintf(&b, "ranks on devices %v through %s (%s exchange), %d process(es); times: slowest rank's total (CUDA events: uploads, kernels, exchanges, copies), ms\n",
		r.RankDevices, r.Comm, orUnknown(r.Exchange), r.Processes)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	var rules []string
	if len(r.Rows) > 0 {
		for _, ru := range r.Rows[0].Rules {
			rules = append(rules, ru.Rule)
		}
	}
	head := "pack\ttokens\tlayout\tmode"
	for _, ru := range rules {
		head += fmt.Sprintf("\t%s ms\tslowest\texch", ru)
	}
	head += "\tbits A=B\tref\tlaunches A->B\n"
	io.WriteString(tw, head)
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s", row.Pack, row.Tokens, row.Layout, strings.ToUpper(row.Mode))
		for _, name := range rules {
			k := slices.IndexFunc(row.Rules, func(x sweepRuleRun) bool { return x.Rule == name })
			if k < 0 {
				io.WriteString(tw, "\t-\t-\t-")
				continue
			}
			ru := row.Rules[k]
			fmt.Fprintf(tw, "\t%.3f\trank %d\t%.1f%%", ru.SlowestMs, ru.SlowestRank, 100*ru.ExchangeShare)
		}
		launches := "-"
		switch {
		case row.LaunchesDiffer == nil:
		case *row.LaunchesDiffer:
			launches = strings.Join(row.LaunchDiffs, ", ")
		default:
			launches = "same"
		}
		fmt.Fprintf(tw, "\t%s\t%s\t%s\n", yesNo(row.BitwiseRules), yesNo(row.BitwiseRef), launches)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := r.Summary
	fmt.Fprintf(&b, "summary: %d rows; launches differ between rules A and B in %d", s.Rows, s.LaunchesDiffer)
	switch {
	case s.BitwiseRules == nil:
		b.WriteString("; digests between the rules: not compared (one rule)")
	case *s.BitwiseRules:
		b.WriteString("; digests equal between the rules in every row")
	default:
		b.WriteString("; digests DIFFER between the rules")
	}
	if r.Compare != "" {
		fmt.Fprintf(&b, "; vs %s: %d equal, %d differ, %d not compared", r.Compare, s.RefEqual, s.RefDiffer, s.RefNotCompared)
		if s.RefNote != "" {
			fmt.Fprintf(&b, " (%s)", s.RefNote)
		}
	}
	fmt.Fprintf(&b, "; %.1f s\n", r.Seconds)
	for _, f := range s.Failures {
		fmt.Fprintf(&b, "FAILED: %s\n", f)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// run checks the flags, places the ranks as kcp run does, runs the matrix
// on the GPU backend and writes the report.
func (o *sweepOptions) run(cmd *cobra.Command) (err error) {
	start := time.Now()
	changed := cmd.Flags().Changed
	if o.show != "" {
		for _, f := range []string{"packs", "layouts", "modes", "rules", "stage", "kernels", "reps", "warmup", "seed", "cp", "compare", "json"} {
			if changed(f) {
				return fmt.Errorf("--show prints a saved report and runs nothing: --%s does not apply", f)
			}
		}
		rep, err := readSweepReport("show", o.show)
		if err != nil {
			return err
		}
		return writeSweepText(cmd.OutOrStdout(), rep)
	}
	spec, err := o.spec(changed)
	if err != nil {
		return err
	}
	var ref *sweepReport
	if o.compare != "" {
		if ref, err = readSweepReport("compare", o.compare); err != nil {
			return err
		}
	}
	o.gpu.backend = "gpu"
	pl, cp, err := o.gpu.placeGPU(changed, o.cp, true)
	if err != nil {
		return err
	}
	if pl.env == nil && len(pl.devices) == 0 {
		n, derr := deviceCount()
		if derr == nil {
			derr = fmt.Errorf("the driver shows %d devices", n)
		}
		return fmt.Errorf("kcp sweep needs a CUDA GPU: %w", derr)
	}
	spec.cp = cp
	if spec.kernels == kcp.KernelsAuto {
		set, why, err := kcp.ChooseKernels(pl.firstDevice(o.gpu.device), o.gpu.blob)
		if err != nil {
			return gpuOpenError(err)
		}
		if !o.json && (pl.env == nil || pl.env.Rank == 0) {
			fmt.Fprintln(cmd.ErrOrStderr(), "kernels", why)
		}
		spec.kernels = set
	}
	kopts := kcp.GPUOptions{Options: kcp.Options{Stage: spec.stage}, Blob: o.gpu.blob, KeepDevice: true}
	if err := kopts.SetKernels(spec.kernels); err != nil {
		return fmt.Errorf("--kernels: %w", err)
	}
	gopts, closeComm, err := o.gpu.gpuOptions(pl, kopts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeComm()) }()
	var ex sweepExchange
	if gopts.Communicator != nil {
		ex = &commExchange{c: gopts.Communicator, device: gopts.Device}
	}
	prog := &sweepProgress{}
	if !o.noProgress && !o.json {
		switch {
		case ex == nil:
			steps := 0
			for _, m := range spec.modes {
				n := len(kcp.ForwardStages) + len(kcp.BackwardStages)
				if m == "b3" {
					n += len(kcp.RecomputeStages)
				}
				steps += n * len(spec.packs) * len(spec.layouts) * len(spec.rules)
			}
			prog.bar = newRunBar(cmd.ErrOrStderr(), steps*(spec.warmup+spec.reps)*spec.cp+1)
		case ex.rank() == 0:
			prog.lines = cmd.ErrOrStderr()
		}
	}
	gopts.Progress = prog.stage
	eng := &gpuEngine{opts: gopts}
	defer func() { err = errors.Join(err, eng.close()) }()
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	m, err := runSweep(ctx, spec, eng, ex, prog)
	prog.finish()
	if err != nil {
		return err
	}
	rep := buildSweepReport(spec, m, ref, o.compare)
	rep.Seconds = time.Since(start).Seconds()
	return o.output(ctx, cmd.OutOrStdout(), ex, rep)
}

// output prints the report (rank 0, or the only process) or "rank i: done",
// waits for every process at a barrier once rank 0 has written, and fails
// when a comparison failed.
func (o *sweepOptions) output(ctx context.Context, w io.Writer, ex sweepExchange, rep *sweepReport) error {
	var werr error
	switch {
	case ex != nil && ex.rank() != 0:
		_, werr = fmt.Fprintf(w, "rank %d: done\n", ex.rank())
	case o.json:
		werr = writeJSON(w, rep)
	default:
		werr = writeSweepText(w, rep)
	}
	if ex != nil {
		if err := ex.done(ctx); err != nil {
			werr = errors.Join(werr, fmt.Errorf("the final barrier: %w", err))
		}
	}
	return errors.Join(werr, sweepFailure(rep.Summary))
}
