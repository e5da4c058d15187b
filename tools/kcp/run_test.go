package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/npy"
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
		{[]string{"--backend", "gpu"}, "GPU backend is not built yet"},
		{[]string{"--backend", "tpu"}, "want cpu or gpu"},
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
