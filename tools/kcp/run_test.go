package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/internal/npy"
	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
)

// small is a fast run: tiny heads over a short pack.
var small = []string{"--docs", "70,5,130", "--cp", "3", "--layout", "D", "--hqk", "2", "--hv", "4", "--dk", "16", "--dv", "16", "--no-progress"}

func runKCP(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func runJSON(t *testing.T, args ...string) runReport {
	t.Helper()
	out, stderr, code := runKCP(t, append([]string{"run", "--json"}, args...)...)
	require.Equal(t, 0, code, stderr)
	var rep runReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "stdout must hold only JSON: %q", out)
	return rep
}

func TestRunJSON(t *testing.T) {
	for _, mode := range []string{"b1", "b3"} {
		for _, stage := range []string{"core", "module"} {
			rep := runJSON(t, append(small, "--mode", mode, "--stage", stage)...)
			require.Equal(t, "cpu", rep.Backend)
			require.Equal(t, mode, rep.Mode)
			require.Equal(t, stage, rep.Stage)
			require.Equal(t, 205, rep.Tokens)
			require.Len(t, rep.Ranks, 3)
			require.Less(t, rep.MaxRelErrOut, 1e-10)
			require.Less(t, rep.MaxRelErrGrad, 1e-10)
			require.NotZero(t, rep.ChecksumOut)
			require.NotZero(t, rep.ChecksumGrad)
			_, hasConv := rep.Checksums["dconv_w"]
			require.Equal(t, stage == "module", hasConv)
		}
	}
}

// The same inputs give the same checksums in B1 and B3, at both forced
// widths: bitwise determinism seen from the CLI.
func TestRunDeterministic(t *testing.T) {
	a := runJSON(t, small...)
	for _, extra := range [][]string{{"--mode", "b3"}, {"--force-vh", "64"}, {"--force-vh", "128"}, {"--rule", "a"}} {
		b := runJSON(t, append(small, extra...)...)
		require.Equal(t, math.Float64bits(a.ChecksumOut), math.Float64bits(b.ChecksumOut), "%v", extra)
		require.Equal(t, math.Float64bits(a.ChecksumGrad), math.Float64bits(b.ChecksumGrad), "%v", extra)
	}
}

func TestRunText(t *testing.T) {
	out, stderr, code := runKCP(t, append([]string{"run"}, small...)...)
	require.Equal(t, 0, code, stderr)
	for _, want := range []string{"kcp run: backend cpu", "rank 2:", "summary", "tape", "checksums:", "relative error vs naive", "time:"} {
		require.Contains(t, out, want)
	}
}

// --dump writes every tensor; --inputs reads them back and reproduces the run.
func TestRunDumpInputs(t *testing.T) {
	dir := t.TempDir()
	a := runJSON(t, append(small, "--dump", dir, "--seed", "5")...)
	for _, name := range []string{"q", "k", "v", "g", "beta", "conv_w", "dout", "o", "dq", "dk", "dv", "dg", "dbeta", "dconv_w", "meta"} {
		ext := ".npy"
		if name == "meta" {
			ext = ".json"
		}
		require.FileExists(t, filepath.Join(dir, name+ext))
	}
	q, err := npy.ReadFile(filepath.Join(dir, "q.npy"))
	require.NoError(t, err)
	require.Equal(t, []int{205, 2, 16}, q.Shape)
	b := runJSON(t, "--inputs", dir, "--no-progress")
	require.Equal(t, a.Docs, b.Docs)
	require.Equal(t, a.CP, b.CP)
	require.Equal(t, math.Float64bits(a.ChecksumOut), math.Float64bits(b.ChecksumOut))
	require.Equal(t, math.Float64bits(a.ChecksumGrad), math.Float64bits(b.ChecksumGrad))
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	runJSON(t, append(small, "--dump", dir)...)
	// A wrong shape, a NaN, a missing file.
	bad := t.TempDir()
	copyDir(t, dir, bad)
	require.NoError(t, npy.WriteFile(filepath.Join(bad, "g.npy"), []int{205, 3}, make([]float32, 205*3)))
	_, stderr, code := runKCP(t, "run", "--inputs", bad, "--no-progress")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "g.npy: shape [205 3], want [205 4] [T, HV]")

	nan := t.TempDir()
	copyDir(t, dir, nan)
	beta := make([]float32, 205*4)
	beta[7] = float32(math.Inf(1))
	require.NoError(t, npy.WriteFile(filepath.Join(nan, "beta.npy"), []int{205, 4}, beta))
	_, stderr, code = runKCP(t, "run", "--inputs", nan, "--no-progress")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "beta [T, HV]: element 7")

	missing := t.TempDir()
	copyDir(t, dir, missing)
	require.NoError(t, os.Remove(filepath.Join(missing, "dout.npy")))
	_, stderr, code = runKCP(t, "run", "--inputs", missing, "--no-progress")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "dout.npy")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--reps", "0"}, "need at least one timed repetition"},
		{[]string{"--split-priority", "--single-width"}, "--split-priority: no walk splits with --single-width"},
		{[]string{"--backend", "tpu"}, "want auto, cpu or gpu"},
		{[]string{"--mode", "b2"}, "want b1 or b3"},
		{[]string{"--stage", "attn"}, "unknown stage"},
		{[]string{"--pack", "P9"}, "unknown pack"},
		{[]string{"--pack", "P1@x"}, "not a token count"},
		{[]string{"--docs", "10,-1"}, "length"},
		{[]string{"--cp", "0", "--docs", "10"}, "0 ranks, need 1..64"},
		{[]string{"--hv", "5", "--hqk", "2", "--docs", "10"}, "multiple"},
		{[]string{"--arch", "sm_42", "--docs", "10"}, "sm_42"},
		{[]string{"--force-vh", "32", "--docs", "10", "--dk", "16", "--dv", "16"}, "ForceVH 32"},
	} {
		_, stderr, code := runKCP(t, append([]string{"run", "--no-progress"}, tc.args...)...)
		require.Equal(t, 1, code, "%v", tc.args)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), raw, 0o644))
	}
}

// --backend gpu without a CUDA driver, or with a driver library and no GPU,
// is a clear error, and auto falls back to the CPU backend saying why
// (skipped where a GPU is present).
func TestRunGPUNoDriver(t *testing.T) {
	_, derr := loader.DeviceCount()
	var gpuErr, autoChoice string
	switch {
	case errors.Is(derr, loader.ErrNoDriver):
		gpuErr, autoChoice = "--backend gpu: no CUDA driver on this machine", "auto: cpu (no CUDA driver)"
	case loader.IsCode(derr, loader.ErrorNoDevice):
		gpuErr, autoChoice = "--backend gpu: the CUDA driver sees no GPU on this machine", "auto: cpu (a CUDA driver library but no GPU)"
	default:
		t.Skipf("a CUDA device is present (%v): the no-driver error is not testable here", derr)
	}
	_, stderr, code := runKCP(t, "run", "--backend", "gpu", "--docs", "100,30", "--cp", "2", "--no-progress")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, gpuErr)
	require.Contains(t, stderr, "use --backend cpu")
	rep := runJSON(t, "--docs", "100,30", "--cp", "2", "--no-progress", "--hqk", "1", "--hv", "1")
	require.Equal(t, "cpu", rep.Backend)
	require.Equal(t, autoChoice, rep.BackendChoice)
}

// auto picks gpu only when a usable GPU is present and the run is one the
// GPU backend does (dims 128), in either mode.
func TestRunChooseBackend(t *testing.T) {
	saved := probeGPU
	t.Cleanup(func() { probeGPU = saved })
	plan128, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{10}, Ranks: 1, Layout: kcp.LayoutC})
	require.NoError(t, err)
	plan16, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{10}, Ranks: 1, Layout: kcp.LayoutC, HQK: 1, HV: 1, DK: 16, DV: 16})
	require.NoError(t, err)
	gpu := func(int, string) (*archdetect.Profile, error) {
		return &archdetect.Profile{Name: "Test GPU", Target: "sm_90a", Variant: "sm_90a", SMs: 132}, nil
	}
	none := func(int, string) (*archdetect.Profile, error) { return nil, errors.New("no GPU here") }
	for _, tc := range []struct {
		name, backend, mode string
		plan                *kcp.Plan
		probe               func(int, string) (*archdetect.Profile, error)
		want, why           string
	}{
		{"gpu present", "auto", "b1", plan128, gpu, "gpu", "auto: gpu (GPU 0: Test GPU"},
		{"no gpu", "auto", "b1", plan128, none, "cpu", "auto: cpu (no usable GPU: no GPU here)"},
		{"small dims", "auto", "b1", plan16, gpu, "cpu", "dims 128"},
		{"b3", "auto", "b3", plan128, gpu, "gpu", "auto: gpu (GPU 0: Test GPU"},
		{"explicit cpu", "cpu", "b1", plan128, gpu, "cpu", ""},
		{"explicit gpu", "gpu", "b1", plan16, none, "gpu", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			probeGPU = tc.probe
			o := runOptions{backend: tc.backend, mode: tc.mode}
			got, why := o.chooseBackend(tc.plan)
			require.Equal(t, tc.want, got)
			if tc.why == "" {
				require.Empty(t, why)
			} else {
				require.Contains(t, why, tc.why)
			}
		})
	}
}

// The GPU backend's flags are an error with --backend cpu and a note on
// stderr where auto falls back to the CPU (small dims: on any machine).
func TestRunGPUFlagsOnCPU(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		code     int
		stderr   string
		noStderr string
	}{
		{"explicit cpu", []string{"--backend", "cpu", "--serial-ranks", "--reps", "2"}, 1,
			"--reps, --serial-ranks: GPU backend flags, and --backend cpu runs the CPU reference", ""},
		{"explicit cpu, placement flag", []string{"--backend", "cpu", "--devices", "0"}, 1, "--devices: GPU backend flags", ""},
		{"auto falls back", []string{"--single-width", "--timeout", "1m"}, 0,
			"kcp run: auto: cpu (the GPU kernels need dims 128, these are 16/16); --single-width, --timeout not used", ""},
		{"no GPU flag", []string{"--backend", "cpu", "--force-vh", "64"}, 0, "", "not used"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runKCP(t, append(append([]string{"run"}, small...), tc.args...)...)
			require.Equal(t, tc.code, code, stderr)
			if tc.stderr != "" {
				require.Contains(t, stderr, tc.stderr)
			}
			if tc.noStderr != "" {
				require.NotContains(t, stderr, tc.noStderr)
			}
		})
	}
}

// --check=false skips the naive reference: the errors are null in the JSON,
// the checksums are those of the checked run.
func TestRunNoCheck(t *testing.T) {
	a := runJSON(t, small...)
	out, stderr, code := runKCP(t, append([]string{"run", "--json", "--check=false"}, small...)...)
	require.Equal(t, 0, code, stderr)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &raw))
	require.Nil(t, raw["max_rel_err_out"])
	require.Nil(t, raw["max_rel_err_grad"])
	require.NotNil(t, raw["checksum_grad"])
	var b runReport
	require.NoError(t, json.Unmarshal([]byte(out), &b))
	require.Equal(t, math.Float64bits(a.ChecksumOut), math.Float64bits(b.ChecksumOut))
	require.Equal(t, math.Float64bits(a.ChecksumGrad), math.Float64bits(b.ChecksumGrad))
	text, stderr, code := runKCP(t, append([]string{"run", "--check=false"}, small...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, text, "not checked (--check=false)")
}

// A forward-only report (no gradients): gradient fields are null in the
// JSON and the text has no gradient line.
func TestRunForwardOnlyReport(t *testing.T) {
	rep := &runReport{
		Backend: "cpu", Pack: "custom", Docs: []int{10}, Tokens: 10, CP: 1, Layout: "C", Stage: "core", Mode: "b1",
		MaxRelErrOut: 1.5e-3, ChecksumOut: 4.25, RelErr: map[string]float64{"o": 1.5e-3}, Checksums: map[string]float64{"o": 4.25},
		Note: "forward only", noGrads: true,
	}
	raw, err := json.Marshal(rep)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(raw, &m))
	require.Nil(t, m["max_rel_err_grad"])
	require.Nil(t, m["checksum_grad"])
	require.Equal(t, 1.5e-3, m["max_rel_err_out"])
	var b strings.Builder
	require.NoError(t, writeRunText(&b, rep))
	for _, want := range []string{"backend cpu", "checksums: o 4.25\n", "out 0.0015\n", "gradients: forward only"} {
		require.Contains(t, b.String(), want)
	}
	require.NotContains(t, b.String(), "grads")
}

// gpuReport takes per-rank medians over the repetitions, the slowest
// rank's median total and its exchange share; the text lists every rank.
func TestRunGPUReport(t *testing.T) {
	timing := func(rank int, stages ...float64) kcp.RankTiming {
		tm := kcp.RankTiming{Rank: rank}
		for i, ms := range stages {
			name := fmt.Sprintf("stage %d", i)
			if i == 1 {
				name = "exchange summaries"
			}
			tm.Stages = append(tm.Stages, kcp.StageTime{Stage: name, Millis: ms})
			tm.TotalMillis += ms
		}
		return tm
	}
	step := func(scale float64) *gpuStep {
		return &gpuStep{
			phases: [][]kcp.RankTiming{
				{timing(0, 1*scale, 1), timing(1, 2*scale, 1)}, // forward
				{timing(0, 3*scale), timing(1, 1*scale)},       // backward
			},
			names: []string{"forward", "backward"}, peak: []int64{1 << 30, 2 << 30}, blob: "sm_90a",
		}
	}
	// Rank 0 totals 4s+1, rank 1 3s+1: rank 0 is the slowest in every repetition.
	gi := gpuReport("GPU 0: Test", "fp32", 1, []int{0, 1}, []*gpuStep{step(1), step(3), step(2)})
	require.Equal(t, 3, gi.Reps)
	require.Equal(t, 0, gi.SlowestRank)
	require.InDelta(t, 9.0, gi.SlowestMs, 1e-12) // median of 5, 13, 9
	require.Len(t, gi.Ranks, 2)
	require.InDelta(t, 3.0, gi.Ranks[0].ForwardMs, 1e-12)  // median of 2, 4, 3
	require.InDelta(t, 6.0, gi.Ranks[0].BackwardMs, 1e-12) // median of 3, 9, 6
	require.InDelta(t, 1.0, gi.Ranks[0].ExchangeMs, 1e-12)
	require.InDelta(t, 1.0/9, gi.ExchangeShare, 1e-12)
	require.Equal(t, int64(2<<30), gi.Ranks[1].PeakBytes)
	require.Equal(t, "forward: exchange summaries", gi.Ranks[1].Stages[1].Stage)
	rep := &runReport{Backend: "gpu", Mode: "b1", GPU: gi, RelErr: map[string]float64{}, Checksums: map[string]float64{}}
	var b strings.Builder
	require.NoError(t, writeRunText(&b, rep))
	for _, want := range []string{"gpu B1 (fp32 forward kernels, blob sm_90a): slowest rank 0, 9.000 ms (median of 3 after 1 warm-up",
		"exchanges 11.1%", "rank 1: total 7.000 ms = forward 5.000 + backward 2.000 ms; exchanges 1.000 ms; kernels 6.000 ms; peak device memory 2.000 GiB"} {
		require.Contains(t, b.String(), want)
	}
}

// A rank's kernels are its stages but the exchanges and the uploads; the
// report names the rank with the most, and --serial-ranks prints them.
func TestRunGPUReportKernels(t *testing.T) {
	timing := func(rank int, stages map[string]float64, order ...string) kcp.RankTiming {
		tm := kcp.RankTiming{Rank: rank}
		for _, name := range order {
			tm.Stages = append(tm.Stages, kcp.StageTime{Stage: name, Millis: stages[name]})
			tm.TotalMillis += stages[name]
		}
		return tm
	}
	fwd := []string{"upload", "prep", "exchange summaries", "state walk"}
	bwd := []string{"upload", "tape walk", "exchange offsets"}
	step := &gpuStep{
		phases: [][]kcp.RankTiming{
			{timing(0, map[string]float64{"upload": 50, "prep": 2, "exchange summaries": 900, "state walk": 3}, fwd...),
				timing(1, map[string]float64{"upload": 90, "prep": 2, "exchange summaries": 10, "state walk": 4}, fwd...)},
			{timing(0, map[string]float64{"upload": 70, "tape walk": 3, "exchange offsets": 5}, bwd...),
				timing(1, map[string]float64{"upload": 80, "tape walk": 3.5, "exchange offsets": 5}, bwd...)},
		},
		names: []string{"forward", "backward"}, peak: []int64{1, 1}, blob: "sm_90a",
	}
	gi := gpuReport("GPU 0: Test", "v5", 0, []int{0, 1}, []*gpuStep{step})
	require.Equal(t, 0, gi.SlowestRank) // 1,028 ms against 194.5, most of it a wait
	require.InDelta(t, 8.0, gi.Ranks[0].KernelsMs, 1e-12)
	require.InDelta(t, 9.5, gi.Ranks[1].KernelsMs, 1e-12)
	require.Equal(t, 1, gi.KernelsRank)
	require.InDelta(t, 9.5, gi.KernelsMs, 1e-12)
	for _, serial := range []bool{false, true} {
		gi.SerialRanks = serial
		var b strings.Builder
		require.NoError(t, writeRunText(&b, &runReport{Backend: "gpu", Mode: "b1", GPU: gi, RelErr: map[string]float64{}, Checksums: map[string]float64{}}))
		require.Contains(t, b.String(), "exchanges 15.000 ms; kernels 9.500 ms;")
		line := "gpu kernels alone (every stage but the exchanges and uploads): slowest rank 1, 9.500 ms"
		if serial {
			require.Contains(t, b.String(), line)
		} else {
			require.NotContains(t, b.String(), line)
		}
	}
}

// dumpForward writes what a GPU run dumps (inputs, dout, o as float32, no
// gradients); --inputs reads it back like any dump.
func TestRunDumpForward(t *testing.T) {
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{70, 5, 130}, Ranks: 3, Layout: kcp.LayoutD, HQK: 2, HV: 4, DK: 16, DV: 16})
	require.NoError(t, err)
	in, dout := kcp.RandomInputs(plan, kcp.StageModule, 9)
	o := make([]float32, plan.OutputShape().Size())
	for i := range o {
		o[i] = float32(i%7) - 3
	}
	dir := t.TempDir()
	rep := &runReport{Backend: "gpu", Pack: "custom", Mode: "b1", Seed: 9, Profile: "sm_90a/132", Rule: "B", GPU: &runGPU{Blob: "compute_80"}}
	require.NoError(t, dumpRun(dir, rep, plan, kcp.StageModule, in, dout, o, "float32 holding bf16 values", nil))
	a, err := npy.ReadFile(filepath.Join(dir, "o.npy"))
	require.NoError(t, err)
	require.Equal(t, []int{205, 4, 16}, a.Shape)
	got, err := a.Float32()
	require.NoError(t, err)
	require.Equal(t, o, got)
	require.NoFileExists(t, filepath.Join(dir, "dq.npy"))
	meta, err := readMeta(dir)
	require.NoError(t, err)
	require.Equal(t, "gpu", meta.Backend)
	require.Equal(t, "compute_80", meta.Flags["blob"])
	require.Contains(t, meta.DTypes["o"], "float32 holding bf16 values")
	back := runJSON(t, "--inputs", dir, "--no-progress", "--backend", "cpu")
	require.Equal(t, []int{70, 5, 130}, back.Docs)
	require.Equal(t, "module", back.Stage)
}

// checksum sums blocks of checksumBlock in index order on every core and the
// block sums in block order: below one block it is the plain sum in index
// order, above it the same value on every call, and the partial sums' order
// shows (the order is the definition, not an accident of scheduling).
func TestChecksum(t *testing.T) {
	inOrder := func(x []float64) float64 {
		var s float64
		for _, v := range x {
			s += v
		}
		return s
	}
	blocks := func(x []float64) float64 {
		var s float64
		for lo := 0; lo < len(x); lo += checksumBlock {
			s += inOrder(x[lo:min(lo+checksumBlock, len(x))])
		}
		return s
	}
	for _, n := range []int{0, 1, 1000, checksumBlock, checksumBlock + 1, 3*checksumBlock + 12345} {
		x := make([]float64, n)
		for i := range x {
			x[i] = math.Sin(float64(i)) * math.Pow(10, float64(i%9)-4) // magnitudes 1e-4 .. 1e4: rounding shows
		}
		got := checksum(x)
		assert.Equal(t, math.Float64bits(blocks(x)), math.Float64bits(got), "n %d", n)
		if n <= checksumBlock {
			assert.Equal(t, math.Float64bits(inOrder(x)), math.Float64bits(got), "n %d: one block is the plain sum", n)
		}
		for range 3 {
			assert.Equal(t, math.Float64bits(got), math.Float64bits(checksum(x)), "n %d: repeatable", n)
		}
	}
}
