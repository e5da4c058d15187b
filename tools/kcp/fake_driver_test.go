package main

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/fakecuda"
	"github.com/gdnkcp/gdnkcp/internal/fakenccl"
)

// TestLaunchOnFakes runs `kcp launch --nproc 2` over `kcp run` (core B1, module B3) on the fake
// driver (two fake devices) and the fake NCCL, whose groups span processes
// where NCCL_COMM_ID names them: each process runs its rank through
// comm.NewNCCLCommFromEnv and the device all-gathers, and the two ranks'
// digests equal those of the same plan run in one process through the
// loopback. The kernels do not run on the fake, so the digests show that
// every rank ran and its results came back, not the bytes exchanged
// (comm's TestNCCLGPUProcessPerRank checks those on the same fakes).
func TestLaunchOnFakes(t *testing.T) {
	if fakecuda.InChild() == "" {
		so, err := fakenccl.Build(t.TempDir())
		if errors.Is(err, fakenccl.ErrUnsupported) {
			t.Skipf("the fake NCCL: %v", err)
		}
		require.NoError(t, err)
		fakecuda.RunChild(t, "TestLaunchOnFakes", "FAKECUDA_DEVICES=2", fakenccl.EnvLibrary+"="+so, "FAKENCCL_DIR="+t.TempDir())
		return
	}
	digests := func(out string) map[string]string {
		d := map[string]string{}
		for _, m := range regexp.MustCompile(`(?m)^(?:\[rank \d+\] )?  rank (\d+) digest ([0-9a-f]{64})$`).FindAllStringSubmatch(out, -1) {
			d[m[1]] = m[2]
		}
		return d
	}
	t.Setenv(launchHelperEnv, t.TempDir())
	// The core stage in B1 exchanges the summaries and offsets; the module stage in B3 the conv halo
	// and the conv gradients too (through host memory), and recomputes.
	for _, sm := range [][2]string{{"core", "b1"}, {"module", "b3"}} {
		args := []string{"run", "--backend", "gpu", "--pack", "P1@4096", "--layout", "Z", "--stage", sm[0], "--mode", sm[1],
			"--check=false", "--no-progress"}
		stdout, stderr, code := execute(append(args, "--cp", "2", "--devices", "0", "--comm", "loopback")...)
		require.Equal(t, 0, code, "%v: %s", sm, stderr)
		want := digests(stdout)
		require.Len(t, want, 2, "%v: %s", sm, stdout)
		stdout, stderr, code = execute(append([]string{"launch", "--nproc", "2", "--timeout", "2m", "--"},
			helperArgs(append([]string{"kcp"}, args...)...)...)...)
		require.Equal(t, 0, code, "%v: %s\n%s", sm, stdout, stderr)
		assert.Contains(t, stdout, "[rank 1] gpu ranks on devices [-1 1], exchanging through communicator (device exchange)", "%v", sm)
		assert.Equal(t, want, digests(stdout), "%v: %s", sm, stdout)
	}
}

// TestCLIOnFakeDriver runs the GPU commands the device scripts call
// (scripts/split-walks.sh's `kcp bench` variants and CP run, width-sweep's
// forced widths, knob-sweep's text report, ab-bits' dump) on
// internal/fakecuda's stand-in driver, on any machine with a C compiler (in a
// child process: the loader reads loader.EnvLibrary once): each exits 0 with
// the JSON the scripts read, the split walks where the flags ask for them;
// `kcp devices` shows the fake device; and a `kcp run` whose device
// allocation fails exits 1 with the driver's error, not a panic. The kernels
// do not run (the fake's launches do nothing): the times and results are
// not checked here.
func TestCLIOnFakeDriver(t *testing.T) {
	so := fakecuda.InChild()
	if so == "" {
		fakecuda.RunChild(t, "TestCLIOnFakeDriver")
		return
	}
	// cuBLAS is not the fake's: the matrix-rate measurement finds none and falls back (whatever this
	// machine has installed).
	t.Setenv(envCublas, "/nonexistent/libcublas.so")
	fk, err := fakecuda.Open(so)
	require.NoError(t, err)

	stdout, stderr, code := execute("devices")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "Fake NVIDIA H200 (fakecuda)")

	// scripts/split-walks.sh's variants, on its three documents scaled down to 10, 11 and 9 chunks (where
	// sched.MixedWalk splits the state and tape walks as on the full pack: 24 heads of each chain at vh 128).
	bench := []struct {
		mode, flags string
		split       map[string]int // walks at vh 128 the JSON reports (nil: none)
		docs        string         // default 640,704,576
	}{
		{"core+bwd", "--single-width", nil, ""},
		{"core+bwd", "", map[string]int{"state": 72, "tape": 72}, ""},
		{"core+bwd", "--split-priority", map[string]int{"state": 72, "tape": 72}, ""},
		{"core+bwd", "--split state=36", map[string]int{"state": 108, "tape": 72}, ""},
		{"core", "--single-width", nil, ""},
		{"core", "", map[string]int{"state": 72}, ""},
		{"core", "--split state=36", map[string]int{"state": 108}, ""},
		// Four equal documents (4 x 256 chunks scaled down): the state and
		// tape walks' models, capped at half the heads, find no split (the
		// uncapped model put 30 heads of each chain at vh 128: both walks
		// slower on an H100).
		{"core+bwd", "", nil, "256,256,256,256"},
	}
	for _, b := range bench {
		docs := b.docs
		if docs == "" {
			docs = "640,704,576"
		}
		args := []string{"bench", "--docs", docs, "--kernels", "v5", "--modes", b.mode, "--reps", "1", "--json"}
		args = append(args, strings.Fields(b.flags)...)
		stdout, stderr, code := execute(args...)
		require.Equal(t, 0, code, "%v: %s", args, stderr)
		var rows []benchRow
		require.NoError(t, json.Unmarshal([]byte(stdout), &rows), "%v", args)
		require.Len(t, rows, 1)
		assert.Equal(t, b.mode, rows[0].Mode)
		assert.Equal(t, b.split, rows[0].Split, "%v: split walks", args)
		// The memory floor's bandwidth, measured in the run: the fake times every copy at 0.125 ms.
		assert.True(t, rows[0].CopyMeas, "%v", args)
		assert.InDelta(t, 2*float64(copyBytes)/0.125e-3/1e12, rows[0].CopyTBs, 1e-9, "%v", args)
		assert.Contains(t, stderr, "device copy bandwidth 8.59 TB/s")
		assert.False(t, rows[0].MMAMeas, "%v", args)
		assert.Equal(t, float64(defaultMMATFLOPs), rows[0].MMATFLOPs, "%v", args)
		assert.Contains(t, rows[0].MMANote, "not measured (cuBLAS library not found (tried /nonexistent/libcublas.so)")
		assert.Contains(t, stderr, "bf16 matrix rate not measured")
		state := "state walk"
		if b.mode == "core+bwd" {
			state = "fwd state walk"
			assert.Contains(t, rows[0].Stages, "bwd tape walk", "%v", args)
		}
		assert.Contains(t, rows[0].Stages, state, "%v", args)
	}

	// CP_PACK's run, scaled down: the fields its summary reads.
	stdout, stderr, code = execute("run", "--backend", "gpu", "--pack", "P1@4096", "--cp", "4", "--layout", "Z", "--stage", "core",
		"--mode", "b1", "--check=false", "--reps", "1", "--warmup", "0", "--json", "--no-progress")
	require.Equal(t, 0, code, stderr)
	type cpReport struct {
		GPU struct {
			Kernels       string            `json:"kernels"`
			KernelsChoice string            `json:"kernels_choice"`
			SlowestRank   int               `json:"slowest_rank"`
			SlowestMs     float64           `json:"slowest_ms"`
			SerialRanks   bool              `json:"serial_ranks"`
			Digests       map[string]string `json:"digests"`
			Ranks         []struct {
				Rank   int `json:"rank"`
				Stages []struct {
					Stage string  `json:"stage"`
					Ms    float64 `json:"ms"`
				} `json:"stages"`
			} `json:"ranks"`
		} `json:"gpu"`
	}
	var rep cpReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &rep))
	require.Len(t, rep.GPU.Ranks, 4)
	assert.False(t, rep.GPU.SerialRanks)
	// --kernels auto (the default): NewGPU's choice, and why.
	assert.Equal(t, "v5", rep.GPU.Kernels)
	assert.Contains(t, rep.GPU.KernelsChoice, "auto: v5 (the fastest set")
	var stages []string
	for _, s := range rep.GPU.Ranks[1].Stages {
		stages = append(stages, s.Stage)
	}
	assert.Contains(t, stages, "backward: offset walk")
	assert.Contains(t, stages, "backward: tape walk")
	// The same run with the four ranks taking turns on the one device: the same digests, and the report says so.
	stdout, stderr, code = execute("run", "--backend", "gpu", "--pack", "P1@4096", "--cp", "4", "--layout", "Z", "--stage", "core",
		"--mode", "b1", "--check=false", "--reps", "1", "--warmup", "0", "--json", "--no-progress", "--serial-ranks")
	require.Equal(t, 0, code, stderr)
	var serial cpReport
	require.NoError(t, json.Unmarshal([]byte(stdout), &serial))
	assert.True(t, serial.GPU.SerialRanks)
	require.Len(t, serial.GPU.Digests, 4)
	assert.Equal(t, rep.GPU.Digests, serial.GPU.Digests)
	stdout, stderr, code = execute("run", "--backend", "gpu", "--pack", "P1@4096", "--cp", "4", "--layout", "Z", "--stage", "core",
		"--mode", "b3", "--check=false", "--no-progress", "--serial-ranks")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "ran their stages one at a time (--serial-ranks)")
	assert.Contains(t, stdout, "gpu kernels alone (every stage but the exchanges and uploads): slowest rank")
	// Ranks holding no tokens (one token over four ranks) have digests too, the same one (they hash nothing):
	// before the thirty-seventh session the run failed at "rank 2 did not run in this process".
	for _, mode := range []string{"b1", "b3"} {
		stdout, stderr, code = execute("run", "--backend", "gpu", "--docs", "1", "--cp", "4", "--layout", "C", "--stage", "module",
			"--mode", mode, "--check=false", "--json", "--no-progress")
		require.Equal(t, 0, code, "%s: %s", mode, stderr)
		var tiny cpReport
		require.NoError(t, json.Unmarshal([]byte(stdout), &tiny))
		require.Len(t, tiny.GPU.Digests, 4, mode)
		assert.Equal(t, tiny.GPU.Digests["1"], tiny.GPU.Digests["3"], "%s: the empty ranks' digests", mode)
		assert.Equal(t, tiny.GPU.Digests["2"], tiny.GPU.Digests["3"], "%s: the empty ranks' digests", mode)
		assert.NotEqual(t, tiny.GPU.Digests["0"], tiny.GPU.Digests["3"], mode)
	}

	// scripts/width-sweep.sh's forced widths (both modes in one call), knob-sweep's text report and
	// ab-bits.sh's dump.
	for _, vh := range []string{"64", "128"} {
		stdout, stderr, code := execute("bench", "--docs", "640,704,576", "--kernels", "v5", "--modes", "core,core+bwd", "--reps", "1",
			"--warmup", "2", "--force-vh", vh, "--json")
		require.Equal(t, 0, code, "--force-vh %s: %s", vh, stderr)
		var rows []benchRow
		require.NoError(t, json.Unmarshal([]byte(stdout), &rows))
		require.Len(t, rows, 2, "--force-vh %s: a row a mode", vh)
	}
	stdout, stderr, code = execute("bench", "--docs", "640", "--kernels", "v5", "--modes", "core", "--reps", "1", "--warmup", "2")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "median")
	dump := t.TempDir()
	_, stderr, code = execute("run", "--backend", "gpu", "--check=false", "--no-progress", "--seed", "7", "--pack", "P1@2048",
		"--dump", dump)
	require.Equal(t, 0, code, stderr)
	for _, f := range []string{"meta.json", "o.npy", "dq.npy", "dconv_w.npy"} {
		assert.FileExists(t, filepath.Join(dump, f))
	}

	// The matrix rate through a fake cuBLAS (testdata/fakecublas.c): measured (the fake times every GEMM
	// at 0.125 ms), its handle destroyed; a cuBLAS that fails falls back to the default with the reason.
	cublas := filepath.Join(t.TempDir(), "libfakecublas.so")
	out, err := exec.Command("cc", "-shared", "-fPIC", "-O1", "-o", cublas, "testdata/fakecublas.c").CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Setenv(envCublas, cublas)
	stdout, stderr, code = execute("bench", "--docs", "640", "--kernels", "v5", "--modes", "core", "--reps", "1", "--json")
	require.Equal(t, 0, code, stderr)
	var mrows []benchRow
	require.NoError(t, json.Unmarshal([]byte(stdout), &mrows))
	require.Len(t, mrows, 1)
	assert.True(t, mrows[0].MMAMeas, "%s", stderr)
	assert.InDelta(t, 2*float64(gemmDim*gemmDim*gemmDim)/0.125e-3/1e12, mrows[0].MMATFLOPs, 1e-6)
	assert.Empty(t, mrows[0].MMANote)
	assert.Contains(t, stderr, "bf16 matrix rate 8796 TFLOP/s")
	lib, err := purego.Dlopen(cublas, purego.RTLD_NOW|purego.RTLD_GLOBAL) // the handle the bench opened
	require.NoError(t, err)
	var gemms, handles func() int32
	purego.RegisterLibFunc(&gemms, lib, "fakecublas_gemms")
	purego.RegisterLibFunc(&handles, lib, "fakecublas_handles")
	assert.Equal(t, int32(7), gemms(), "2 warm-up and 5 timed GEMMs")
	assert.Zero(t, handles(), "the cuBLAS handle destroyed")
	t.Setenv("FAKECUBLAS_FAIL", "create")
	_, stderr, code = execute("bench", "--docs", "640", "--kernels", "v5", "--modes", "core", "--reps", "1")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "bf16 matrix rate not measured (cublasCreate_v2: cublasStatus_t 1): 758 TFLOP/s")
	t.Setenv(envCublas, "/nonexistent/libcublas.so")

	// The copy measurement's own failure: exit 1, saying what failed, nothing left held; a given
	// bandwidth skips it.
	held := fk.Held()
	fk.Fail("cuMemcpyDtoDAsync_v2", 1, fakecuda.ErrorLaunchFailed)
	_, stderr, code = execute("bench", "--docs", "640", "--kernels", "v5", "--modes", "core", "--reps", "1")
	fk.Fail("", 0, 0)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "measuring the device copy bandwidth (--copy-tbs 0): ")
	assert.Contains(t, stderr, "cuMemcpyDtoDAsync_v2")
	assert.Equal(t, held, fk.Held(), "the measurement's buffers, stream and events released")
	stdout, stderr, code = execute("bench", "--docs", "640", "--kernels", "v5", "--modes", "core", "--reps", "1", "--copy-tbs", "4")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "(4.00 TB/s, given)")
	assert.Contains(t, stdout, "(758 TFLOP/s, not measured)")
	assert.NotContains(t, stderr, "device copy bandwidth")

	// A device allocation that fails: exit 1, the driver's error, no panic.
	failures := fk.Failures()
	fk.Fail("cuMemAlloc_v2", 40, fakecuda.ErrorOutOfMemory)
	_, stderr, code = execute("run", "--backend", "gpu", "--pack", "P1@4096", "--cp", "2", "--no-progress")
	fk.Fail("", 0, 0)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY")
	assert.NotContains(t, stderr, "panic")
	assert.Equal(t, failures+1, fk.Failures(), "the one failure injected")
}
