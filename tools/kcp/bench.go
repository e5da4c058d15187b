package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
)

func init() { register(newBenchCmd) }

type benchOptions struct {
	docs, kernels, blob string
	reps, warmup        int
	copyTBs, mmaTFLOPs  float64
	json                bool
}

// The core stages a bench times: l2norm to O on one rank (conv and uploads excluded).
var benchStages = []string{"l2norm", "prep", "summary walk", "compose", "state walk", "output"}

func newBenchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench [flags]",
		Short: "Time the GPU forward of the GDN core on one rank (CUDA-event medians after warm-up)",
		Long: `bench runs the GPU forward of the GDN core (l2norm of q and k to the output O; the conv is
not included) on one rank, heads 16/48, dims 128, random inputs, and reports the median over --reps runs
after --warmup runs of each stage's CUDA-event time and of their sum, next to the memory and compute
floors (bytes moved and FLOPs of the chunked algorithm over the measured copy bandwidth and bf16
matrix rate, docs/perf-notes.md).`,
		Example: `  kcp bench
  kcp bench --docs 40000,45000,35908 --kernels tc`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.docs, "docs", "32768", "document lengths, comma-separated (one rank holds them all)")
	f.StringVar(&o.kernels, "kernels", "fp32,tc", "kernel sets to time, comma-separated: fp32 (CUDA cores), tc (tensor cores)")
	f.StringVar(&o.blob, "blob", "", "force a blob slot (e.g. compute_80)")
	f.IntVar(&o.reps, "reps", 20, "timed runs")
	f.IntVar(&o.warmup, "warmup", 3, "untimed runs first")
	f.Float64Var(&o.copyTBs, "copy-tbs", 4.24, "device copy bandwidth for the memory floor, TB/s (bytes read + written)")
	f.Float64Var(&o.mmaTFLOPs, "mma-tflops", 758, "bf16 matrix rate for the compute floor, TFLOP/s")
	f.BoolVar(&o.json, "json", false, "write JSON to stdout")
	return cmd
}

type benchRow struct {
	Kernels      string             `json:"kernels"`
	Tokens       int                `json:"tokens"`
	Docs         []int              `json:"docs"`
	Blob         string             `json:"blob"`
	Reps         int                `json:"reps"`
	MedianMillis float64            `json:"median_ms"`
	MinMillis    float64            `json:"min_ms"`
	Stages       map[string]float64 `json:"stage_median_ms"`
	MemFloor     float64            `json:"memory_floor_ms"`
	FlopFloor    float64            `json:"compute_floor_ms"`
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (o *benchOptions) run(cmd *cobra.Command) error {
	docs, err := parseDocs(o.docs)
	if err != nil {
		return err
	}
	if o.reps < 1 || o.warmup < 0 {
		return fmt.Errorf("--reps %d, --warmup %d: need at least one timed run", o.reps, o.warmup)
	}
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: docs, Ranks: 1, Layout: kcp.LayoutC})
	if err != nil {
		return err
	}
	in, _ := kcp.RandomInputs(plan, kcp.StageCore, 1)
	var rows []benchRow
	for _, k := range strings.Split(o.kernels, ",") {
		k = strings.TrimSpace(k)
		if k != "fp32" && k != "tc" {
			return fmt.Errorf("--kernels: %q is not fp32 or tc", k)
		}
		row, err := o.benchOne(cmd, plan, in, k)
		if err != nil {
			return err
		}
		rows = append(rows, row)
	}
	if o.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", " ")
		return enc.Encode(rows)
	}
	return writeBench(cmd.OutOrStdout(), rows)
}

func (o *benchOptions) benchOne(cmd *cobra.Command, plan *kcp.Plan, in *kcp.Inputs, kernels string) (benchRow, error) {
	g, err := kcp.NewGPU(plan, kcp.GPUOptions{Blob: o.blob, TensorCoreWalks: kernels == "tc", TensorCoreChunk: kernels == "tc"})
	if err != nil {
		if errors.Is(err, loader.ErrNoDriver) {
			return benchRow{}, fmt.Errorf("bench needs a CUDA GPU: %w", err)
		}
		return benchRow{}, err
	}
	defer g.Close()
	row := benchRow{Kernels: kernels, Tokens: plan.Tokens, Docs: plan.Config.Docs, Reps: o.reps, Stages: map[string]float64{}}
	stageTimes := map[string][]float64{}
	var totals []float64
	for i := 0; i < o.warmup+o.reps; i++ {
		fw, err := g.Forward(context.Background(), in)
		if err != nil {
			return row, err
		}
		row.Blob = fw.Blob
		if i >= o.warmup {
			total := 0.0
			for _, st := range fw.Timing[0].Stages {
				if slices.Contains(benchStages, st.Stage) {
					stageTimes[st.Stage] = append(stageTimes[st.Stage], st.Millis)
					total += st.Millis
				}
			}
			totals = append(totals, total)
		}
		if err := fw.Close(); err != nil {
			return row, err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "\rbench %s: run %d of %d", kernels, i+1, o.warmup+o.reps)
	}
	fmt.Fprintln(cmd.ErrOrStderr())
	row.MedianMillis = median(totals)
	row.MinMillis = slices.Min(totals)
	for s, ts := range stageTimes {
		row.Stages[s] = median(ts)
	}
	T := float64(plan.Tokens)
	bytes := T * (2*16*128*2 + 48*128*2 + 2*48*4 + 48*128*2)
	chunks := 0
	for _, seg := range plan.Ranks[0].Segments {
		chunks += seg.Chunks
	}
	flops := float64(chunks) * 48 * 11.6e6
	row.MemFloor = bytes / (o.copyTBs * 1e12) * 1e3
	row.FlopFloor = flops / (o.mmaTFLOPs * 1e12) * 1e3
	return row, nil
}

func writeBench(w io.Writer, rows []benchRow) error {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "%s kernels, %d tokens in %d documents, blob %s, median of %d: %.3f ms (min %.3f); floors: memory %.3f ms, compute %.3f ms\n",
			r.Kernels, r.Tokens, len(r.Docs), r.Blob, r.Reps, r.MedianMillis, r.MinMillis, r.MemFloor, r.FlopFloor)
		for _, s := range benchStages {
			if v, ok := r.Stages[s]; ok {
				fmt.Fprintf(&b, "  %-14s %8.3f ms\n", s, v)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
