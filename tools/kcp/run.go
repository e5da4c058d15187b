package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/sched"
)

func init() { register(newRunCmd) }

type runOptions struct {
	pack, docs, layout, stage, mode, backend, arch, rule string
	dump, inputs                                         string
	cp, sms, hqk, hv, dk, dv, forceVH                    int
	seed                                                 uint64
	json, checkFinite, noProgress                        bool
}

func newRunCmd() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "Run a GDN layer forward and backward over a CP plan, and check it against the naive reference",
		Long: `run lays a pack out over CP ranks, runs the layer's forward and backward on the chosen
backend, and compares every output and gradient with the naive token-by-token recurrence
in float64. It prints the plan, each walk's width, checksums, the largest relative errors
and the time taken.

With no flags it runs the CPU reference backend on the default pack: P1's six documents
scaled to 2,048 tokens, heads 16/48, dims 128, CP 2, layout D, the module stage (conv +
GDN), mode B1.

Modes: b1 = forward keeping what backward needs, then backward; b3 = forward in
checkpoint mode, recompute from the handle (no communication), then backward.

--dump DIR writes the inputs, the output and the gradients as .npy files (bf16 inputs as
float32 holding the exact bf16 values; float64 results from the CPU backend) and a
meta.json. --inputs DIR reads q, k, v, g, beta (conv_w for --stage module) and dout from
.npy files instead of drawing random ones; head counts and dims follow from the shapes,
and the documents from DIR/meta.json unless --pack or --docs is given.`,
		Example: `  kcp run
  kcp run --pack P1 --cp 4 --layout Z --stage core --mode b3 --json
  kcp run --docs 300,100,700 --cp 3 --layout C --hqk 2 --hv 6 --dk 32 --dv 32 --dump out/
  kcp run --inputs out/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.pack, "pack", "", "pack: P1..P5, or NAME@TOKENS to scale one (default P1@2048)")
	f.StringVar(&o.docs, "docs", "", "document lengths in tokens, comma-separated (instead of --pack)")
	f.IntVar(&o.cp, "cp", 2, "CP ranks R, 1..64")
	f.StringVar(&o.layout, "layout", "D", "layout: C, Z or D")
	f.StringVar(&o.stage, "stage", "module", "core (GDN only) or module (conv1d + SiLU, then GDN)")
	f.StringVar(&o.mode, "mode", "b1", "b1 (forward keeping activations, backward) or b3 (checkpoint, recompute, backward)")
	f.StringVar(&o.backend, "backend", "cpu", "cpu (float64 reference) or gpu")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the random inputs")
	f.IntVar(&o.hqk, "hqk", kcp.DefaultHQK, "query/key heads")
	f.IntVar(&o.hv, "hv", kcp.DefaultHV, "value heads (a multiple of --hqk)")
	f.IntVar(&o.dk, "dk", kcp.DefaultDK, "key head dim: 128 (16, 32, 64 for small CPU runs)")
	f.IntVar(&o.dv, "dv", kcp.DefaultDV, "value head dim: 128 (16, 32, 64 for small CPU runs)")
	f.StringVar(&o.arch, "arch", "", "width-rule variant for the walk widths: "+strings.Join(sched.Variants(), ", ")+" (default: the GPU present, else sm_90a)")
	f.IntVar(&o.sms, "sms", 0, "SM count for the width rule (default: the architecture's)")
	f.StringVar(&o.rule, "rule", "b", "width rule: a or b")
	f.IntVar(&o.forceVH, "force-vh", 0, "run every walk at vh 64 or 128 instead of the rule's width")
	f.StringVar(&o.dump, "dump", "", "write inputs, outputs and gradients as .npy files and meta.json into this folder")
	f.StringVar(&o.inputs, "inputs", "", "read the inputs from .npy files in this folder")
	f.BoolVar(&o.checkFinite, "check-finite", true, "reject inputs holding NaN or Inf")
	f.BoolVar(&o.json, "json", false, "write one JSON object to stdout, nothing else")
	f.BoolVar(&o.noProgress, "no-progress", false, "no progress bar on stderr")
	return cmd
}

// runReport is what run prints; its JSON names are part of the CLI's interface.
type runReport struct {
	Backend        string             `json:"backend"`
	Pack           string             `json:"pack"`
	Docs           []int              `json:"docs"`
	Tokens         int                `json:"tokens"`
	CP             int                `json:"cp"`
	Layout         string             `json:"layout"`
	Stage          string             `json:"stage"`
	Mode           string             `json:"mode"`
	Seed           uint64             `json:"seed"`
	Inputs         string             `json:"inputs,omitempty"`
	Heads          [2]int             `json:"heads"` // [H_qk, HV]
	Dims           [2]int             `json:"dims"`  // [K, V]
	Profile        string             `json:"profile"`
	Rule           string             `json:"rule"`
	ForceVH        int                `json:"force_vh,omitempty"`
	Ranks          []runRank          `json:"ranks"`
	MaxRelErrOut   float64            `json:"max_rel_err_out"`
	MaxRelErrGrad  float64            `json:"max_rel_err_grad"`
	RelErr         map[string]float64 `json:"rel_err"`
	ChecksumOut    float64            `json:"checksum_out"`
	ChecksumGrad   float64            `json:"checksum_grad"`
	Checksums      map[string]float64 `json:"checksums"`
	Seconds        float64            `json:"seconds"`
	SecondsBackend float64            `json:"seconds_backend"`
	SecondsRef     float64            `json:"seconds_reference"`
}

type runRank struct {
	Rank     int       `json:"rank"`
	Tokens   int       `json:"tokens"`
	Segments int       `json:"segments"`
	Walks    []runWalk `json:"walks"`
}

type runWalk struct {
	Walk   string `json:"walk"`
	NWalk  int    `json:"n_walk"`
	VH     *int   `json:"vh"` // null for an empty walk list
	Reason string `json:"reason"`
}

func (o *runOptions) run(cmd *cobra.Command) error {
	start := time.Now()
	changed := cmd.Flags().Changed
	if o.backend != "cpu" {
		if o.backend == "gpu" {
			return errors.New("--backend gpu: the GPU backend is not built yet (the GDN kernels land with the GPU forward issue); use --backend cpu")
		}
		return fmt.Errorf("--backend %q: want cpu or gpu", o.backend)
	}
	stage, err := kcp.ParseStage(o.stage)
	if err != nil {
		return fmt.Errorf("--stage: %w", err)
	}
	if o.mode != "b1" && o.mode != "b3" {
		return fmt.Errorf("--mode %q: want b1 or b3", o.mode)
	}
	layout, err := kcp.ParseLayout(o.layout)
	if err != nil {
		return fmt.Errorf("--layout: %w", err)
	}
	rule, err := sched.ParseRule(o.rule)
	if err != nil {
		return fmt.Errorf("--rule: %w", err)
	}
	prof, err := o.widthProfile(changed)
	if err != nil {
		return err
	}
	var (
		in   *kcp.Inputs
		dout []float32
		plan *kcp.Plan
		name string
	)
	if o.inputs != "" {
		plan, name, in, dout, err = o.loadInputs(changed, layout, stage)
		if err != nil {
			return err
		}
	} else {
		var docs []int
		name, docs, err = o.runDocs(changed)
		if err != nil {
			return err
		}
		plan, err = kcp.NewPlan(kcp.PlanConfig{Docs: docs, Ranks: o.cp, Layout: layout, HQK: o.hqk, HV: o.hv, DK: o.dk, DV: o.dv})
		if err != nil {
			return err
		}
		in, dout = kcp.RandomInputs(plan, stage, o.seed)
	}
	if err := in.Validate(plan, stage, o.checkFinite); err != nil {
		return err
	}
	if err := plan.CheckDOut(dout, o.checkFinite); err != nil {
		return err
	}
	opts := kcp.Options{Stage: stage, Profile: prof, Rule: rule, ForceVH: o.forceVH}
	bar := o.newBar(cmd.ErrOrStderr(), plan)
	opts.Progress = bar.step
	be, err := kcp.NewCPU(plan, opts)
	if err != nil {
		return err
	}
	ctx := context.Background()
	t0 := time.Now()
	var act *kcp.Activations
	if o.mode == "b1" {
		act, err = be.Forward(ctx, in)
	} else {
		var ck *kcp.Checkpoint
		if ck, err = be.ForwardCheckpoint(ctx, in); err == nil {
			act, err = ck.Recompute(ctx)
		}
	}
	if err != nil {
		return err
	}
	grads, err := act.Backward(ctx, dout)
	if err != nil {
		return err
	}
	tBackend := time.Since(t0)
	bar.describe("naive reference")
	t1 := time.Now()
	refOut, refGrads, err := kcp.Reference(ctx, plan, in, dout, kcp.Options{Stage: stage})
	if err != nil {
		return err
	}
	tRef := time.Since(t1)
	bar.finish()
	rep, err := o.report(name, plan, stage, prof, rule, act, grads, refOut, refGrads)
	if err != nil {
		return err
	}
	rep.SecondsBackend, rep.SecondsRef = tBackend.Seconds(), tRef.Seconds()
	if o.dump != "" {
		if err := dumpRun(o.dump, rep, plan, stage, in, dout, act.Out, grads); err != nil {
			return err
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	if o.json {
		return writeJSON(cmd.OutOrStdout(), rep)
	}
	return writeRunText(cmd.OutOrStdout(), rep)
}

// widthProfile is --arch/--sms, else the GPU present, else DefaultProfile.
func (o *runOptions) widthProfile(changed func(string) bool) (sched.Profile, error) {
	if changed("arch") {
		prof, err := sched.NewProfile(strings.TrimSpace(o.arch), o.sms)
		if err != nil {
			return sched.Profile{}, fmt.Errorf("--arch %s: %w", o.arch, err)
		}
		return prof, nil
	}
	prof, _, err := detectGPU()
	if err != nil {
		prof = kcp.DefaultProfile
	}
	if changed("sms") {
		prof.SMs = o.sms
	}
	return prof, prof.Validate()
}

// runDocs is --pack (NAME or NAME@TOKENS) or --docs, else the default pack.
func (o *runOptions) runDocs(changed func(string) bool) (string, []int, error) {
	switch {
	case changed("pack") && changed("docs"):
		return "", nil, errors.New("give --pack or --docs, not both")
	case changed("docs"):
		docs, err := parseDocs(o.docs)
		return "custom", docs, err
	case changed("pack"):
		pk, err := parsePackSpec(o.pack)
		return pk.Name, pk.Docs, err
	}
	pk := kcp.DefaultRunPack()
	return pk.Name, pk.Docs, nil
}

// parsePackSpec reads "P3" or "P3@4096" (P3 scaled to 4096 tokens).
func parsePackSpec(s string) (kcp.Pack, error) {
	name, size, scaled := strings.Cut(strings.TrimSpace(s), "@")
	pk, err := kcp.PackByName(name)
	if err != nil {
		return kcp.Pack{}, fmt.Errorf("--pack: %w", err)
	}
	if !scaled {
		return pk, nil
	}
	var n int
	if _, err := fmt.Sscanf(size, "%d", &n); err != nil || fmt.Sprint(n) != size {
		return kcp.Pack{}, fmt.Errorf("--pack %s: %q after @ is not a token count", s, size)
	}
	return kcp.ScalePack(pk, n)
}

func (o *runOptions) report(name string, plan *kcp.Plan, stage kcp.Stage, prof sched.Profile, rule sched.Rule,
	act *kcp.Activations, grads *kcp.Grads, refOut *kcp.Output, refGrads *kcp.Grads) (*runReport, error) {
	cfg := plan.Config
	rep := &runReport{
		Backend: o.backend, Pack: name, Docs: cfg.Docs, Tokens: plan.Tokens, CP: cfg.Ranks,
		Layout: string(cfg.Layout), Stage: string(stage), Mode: o.mode, Seed: o.seed, Inputs: o.inputs,
		Heads: [2]int{cfg.HQK, cfg.HV}, Dims: [2]int{cfg.DK, cfg.DV},
		Profile: prof.String(), Rule: rule.String(), ForceVH: o.forceVH,
		RelErr: map[string]float64{}, Checksums: map[string]float64{},
	}
	for r, rp := range plan.Ranks {
		rr := runRank{Rank: r, Tokens: rp.Tokens, Segments: len(rp.Segments)}
		for _, k := range sched.WalkKinds() {
			d := act.Decisions[r][k]
			w := runWalk{Walk: k.String(), NWalk: d.NWalk, Reason: d.Reason}
			if vh := d.VH; vh != 0 {
				if o.forceVH != 0 {
					vh = o.forceVH
					w.Reason = fmt.Sprintf("forced by --force-vh (rule: %s)", d.Reason)
				}
				w.VH = &vh
			}
			rr.Walks = append(rr.Walks, w)
		}
		rep.Ranks = append(rep.Ranks, rr)
	}
	rep.MaxRelErrOut = kcp.RelErr(act.Out.O, refOut.O)
	rep.RelErr["o"] = rep.MaxRelErrOut
	rep.ChecksumOut = checksum(act.Out.O)
	rep.Checksums["o"] = rep.ChecksumOut
	errs, err := kcp.GradErrors(grads, refGrads)
	if err != nil {
		return nil, err
	}
	for i, e := range errs {
		rep.RelErr[e.Name] = e.RelErr
		if e.RelErr > rep.MaxRelErrGrad || math.IsNaN(e.RelErr) {
			rep.MaxRelErrGrad = e.RelErr
		}
		cs := checksum(grads.Tensors()[i].Data)
		rep.Checksums[e.Name] = cs
		rep.ChecksumGrad += cs
	}
	return rep, nil
}

// checksum is the sum of the elements in index order (a fixed order, so equal
// tensors give equal checksums bit for bit).
func checksum(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	return s
}

func writeRunText(w io.Writer, r *runReport) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kcp run: backend %s, pack %s (%d documents, %d tokens), CP %d, layout %s, stage %s, mode %s\n",
		r.Backend, r.Pack, len(r.Docs), r.Tokens, r.CP, r.Layout, r.Stage, r.Mode)
	src := fmt.Sprintf("random, seed %d", r.Seed)
	if r.Inputs != "" {
		src = "from " + r.Inputs
	}
	fmt.Fprintf(&b, "heads %d/%d, dims %d/%d, inputs %s; widths: %s, rule %s\n",
		r.Heads[0], r.Heads[1], r.Dims[0], r.Dims[1], src, r.Profile, r.Rule)
	for _, rk := range r.Ranks {
		fmt.Fprintf(&b, "rank %d: %d tokens, %d segments\n", rk.Rank, rk.Tokens, rk.Segments)
		for _, wk := range rk.Walks {
			vh := "-"
			if wk.VH != nil {
				vh = fmt.Sprint(*wk.VH)
			}
			fmt.Fprintf(&b, "  %-8s n_walk %-3d vh %-4s %s\n", wk.Walk, wk.NWalk, vh, wk.Reason)
		}
	}
	fmt.Fprintf(&b, "checksums: o %.9g; grads %.9g (", r.ChecksumOut, r.ChecksumGrad)
	names := gradNames(r)
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.6g", n, r.Checksums[n])
	}
	b.WriteString(")\n")
	fmt.Fprintf(&b, "relative error vs naive float64 recurrence: out %.3g, grads %.3g (", r.MaxRelErrOut, r.MaxRelErrGrad)
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2g", n, r.RelErr[n])
	}
	b.WriteString(")\n")
	fmt.Fprintf(&b, "time: %.2f s (backend %.2f s, naive reference %.2f s)\n", r.Seconds, r.SecondsBackend, r.SecondsRef)
	_, err := io.WriteString(w, b.String())
	return err
}

func gradNames(r *runReport) []string {
	names := []string{"dq", "dk", "dv", "dg", "dbeta"}
	if _, ok := r.Checksums["dconv_w"]; ok {
		names = append(names, "dconv_w")
	}
	return names
}

// runBar is the progress bar on stderr: one step per stage per rank, and one
// for the naive reference.
type runBar struct {
	mu  sync.Mutex
	bar *progressbar.ProgressBar
}

func (o *runOptions) newBar(w io.Writer, plan *kcp.Plan) *runBar {
	if o.noProgress {
		return &runBar{}
	}
	steps := len(kcp.ForwardStages) + len(kcp.BackwardStages)
	if o.mode == "b3" {
		steps += len(kcp.RecomputeStages)
	}
	total := steps*len(plan.Ranks) + 1
	return &runBar{bar: progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("forward"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionThrottle(100*time.Millisecond),
	)}
}

func (b *runBar) step(rank int, stage string) {
	if b.bar == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bar.Describe(fmt.Sprintf("rank %d: %s", rank, stage))
	_ = b.bar.Add(1)
}

func (b *runBar) describe(s string) {
	if b.bar == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bar.Describe(s)
}

func (b *runBar) finish() {
	if b.bar == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.bar.Add(1)
	_ = b.bar.Finish()
}
