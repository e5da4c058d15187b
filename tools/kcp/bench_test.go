package main

import (
	"github.com/gdnkcp/gdnkcp/loader"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteBench checks the bench table: the headline with the floors, the
// peak memory and the walk width (forced or decided), then the stages.
func TestWriteBench(t *testing.T) {
	base := benchRow{Kernels: "v5", Mode: "core", Tokens: 32768, Docs: []int{32768}, Blob: "sm_90a", Reps: 5,
		MedianMillis: 6.35, MinMillis: 6.3, MemFloor: 0.256, FlopFloor: 0.376, PeakBytes: 4 << 30, CopyTBs: 4.24, CopyMeas: true, MMATFLOPs: 758,
		Stages: map[string]float64{"prep": 1.3, "state walk": 3.2}, StageOrder: []string{"prep", "state walk"}}
	for _, tc := range []struct {
		name           string
		stateVH, force int
		want, wantNot  string
	}{
		{"decided", 64, 0, "; state walk at vh 64\n", "forced"},
		{"forced", 64, 128, "; every walk at vh 128 (forced)\n", "state walk at"},
		{"unknown", 0, 0, "peak device memory 4.00 GiB\n", "vh"},
		{"launch order", 64, 0, "; walks in launch order (--launch-order); state walk at vh 64\n", "forced"},
		{"mixed tape", 64, 0, "; tape walk split, 72 (segment, head) walks at vh 128; state walk at vh 64\n", "not split"},
		{"split on prioritised streams", 64, 0, "; state walk split, 24 (segment, head) walks at vh 128 (vh 128 on a prioritised stream); tape walk split, 72 (segment, head) walks at vh 128 (vh 128 on a prioritised stream); state walk at vh 64\n", "not split"},
		{"single width", 64, 0, "; every walk at one width (--single-width); state walk at vh 64\n", "walks at vh 128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			r.StateVH, r.ForceVH = tc.stateVH, tc.force
			r.LaunchOrder = tc.name == "launch order"
			r.SingleWidth = tc.name == "single width"
			switch tc.name {
			case "mixed tape":
				r.Split = map[string]int{"tape": 72}
			case "split on prioritised streams":
				r.Split, r.SplitPrio = map[string]int{"state": 24, "tape": 72}, true
			}
			var b strings.Builder
			require.NoError(t, writeBench(&b, []benchRow{r}))
			out := b.String()
			assert.True(t, strings.HasPrefix(out, "core, v5 kernels, 32768 tokens in 1 documents, blob sm_90a, median of 5: 6.350 ms (min 6.300); floors: memory 0.256 ms (4.24 TB/s, measured), compute 0.376 ms (758 TFLOP/s, given)"), out)
			assert.Contains(t, out, tc.want)
			assert.NotContains(t, strings.SplitN(out, "\n", 2)[0], tc.wantNot)
			assert.Contains(t, out, "  prep                            1.300 ms\n  state walk                      3.200 ms\n")
		})
	}
}

// TestBenchSplitPriorityFlag: --split-priority without a split to launch,
// and --split with an unknown walk, are errors before any GPU work.
func TestBenchSplitPriorityFlag(t *testing.T) {
	_, stderr, code := execute("bench", "--split-priority", "--single-width")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "--split-priority: no walk splits with --single-width unless --split forces one")
	_, stderr, code = execute("bench", "--split", "stat=4")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, `--split stat=4: sched: unknown walk "stat"`)
}

// TestBenchForceVHFlag: a width other than 64 or 128 is an error before any
// GPU work.
func TestBenchForceVHFlag(t *testing.T) {
	_, stderr, code := execute("bench", "--force-vh", "96")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "--force-vh 96: want 64 or 128")
}

// TestBenchKernelsAutoWithoutGPU: --kernels auto on a machine without a
// usable GPU says so (no driver, or a driver that sees no GPU), not a panic
// or an unknown-set error.
func TestBenchKernelsAutoWithoutGPU(t *testing.T) {
	if _, err := loader.DeviceCount(); err == nil {
		t.Skip("a GPU is present: the bench would run")
	}
	_, stderr, code := execute("bench", "--kernels", "auto", "--docs", "64", "--reps", "1", "--warmup", "0")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, stderr, "--kernels auto: bench needs a usable CUDA GPU")
	assert.NotContains(t, stderr, "kernel set")
}
