package cpuemu

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// The build: the emulator and the kernels are compiled once per test binary,
// each object in parallel, into buildDir (removed by TestMain).
var (
	buildDir  string
	buildOnce sync.Once
	builds    map[string]error // binary name -> build error
	buildLogs = map[string]string{}
)

// cxxFlags: -O2 for speed, -ffp-contract=off so that the host compiler fuses
// no a*b+c on its own (the kernels' fmaf calls are the only fused operations).
var cxxFlags = []string{"-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-Wall",
	"-Wno-unknown-pragmas", "-Werror", "-Itestdata"}

// The binaries and their objects. runner_all exists only when
// ptx/src/gdn_bwd.cu does; runner_mma holds the tensor-core test kernels;
// the runner_*_mma* binaries the tensor-core kernels of ptx/src (v4 / v5,
// docs/mma-kernels.md), one file each (runner_mma16: the v5 walks and
// output together).
var binaries = map[string][]string{
	"harness":              {"emu", "harness"},
	"runner_fwd":           {"emu", "runner", "selftest", "kernels_fwd"},
	"runner_all":           {"emu", "runner", "selftest", "kernels_all"},
	"runner_mma":           {"emu", "runner", "mma_kernels"},
	"runner_walk_mma":      {"emu", "runner", "kernels_walk_mma"},
	"runner_bwalk_mma":     {"emu", "runner", "kernels_bwalk_mma"},
	"runner_bwalk_mma_wg":  {"emu", "runner", "kernels_bwalk_mma_wg"},
	"runner_prep_mma":      {"emu", "runner", "kernels_prep_mma"},
	"runner_output_mma":    {"emu", "runner", "kernels_output_mma"},
	"runner_mma16":         {"emu", "runner", "kernels_mma16"},
	"runner_mma16_wg":      {"emu", "runner", "kernels_mma16_wg"},
	"runner_dvlocal_mma":   {"emu", "runner", "kernels_dvlocal_mma"},
	"runner_grads_mma":     {"emu", "runner", "kernels_grads_mma"},
	"runner_grads_mma5":    {"emu", "runner", "kernels_grads_mma5"},
	"runner_grads_mma5_wg": {"emu", "runner", "kernels_grads_mma5_wg"},
}

// skipBinary reports binaries whose sources are absent.
func skipBinary(b string) bool {
	return (b == "runner_all" && !haveBackward()) || (strings.HasSuffix(b, "_wg") && !haveEmuWGMMA())
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func compiler(t *testing.T) string {
	t.Helper()
	for _, c := range []string{"g++", "clang++"} {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	t.Skip("no C++ compiler (g++ or clang++): the CPU emulation of the kernels is skipped")
	return ""
}

// srcDir is the kernel sources: ptx/src, or the directory that the
// environment variable CPUEMU_SRC names (to try a candidate kernel file
// before it lands in ptx/src).
func srcDir() string {
	if d := os.Getenv("CPUEMU_SRC"); d != "" {
		return d
	}
	return "../src"
}

// haveEmuWGMMA reports whether the sources' wgmma.cuh can run on the emulator
// (it routes its wrappers to the emulator where GDNKCP_EMU_WGMMA is defined).
func haveEmuWGMMA() bool {
	b, err := os.ReadFile(filepath.Join(srcDir(), "wgmma.cuh"))
	return err == nil && strings.Contains(string(b), "GDNKCP_EMU_WGMMA")
}

// haveBackward reports whether the sources hold the backward kernels.
func haveBackward() bool {
	_, err := os.Stat(filepath.Join(srcDir(), "gdn_bwd.cu"))
	return err == nil
}

// built returns the path of a built binary, building all of them on the
// first call; it skips without a compiler and fails when that binary did not
// build.
func built(t *testing.T, name string) string {
	t.Helper()
	cxx := compiler(t)
	buildOnce.Do(func() { buildAll(cxx) })
	err, ok := builds[name]
	require.True(t, ok, "no binary %s", name)
	require.NoError(t, err, "building %s:\n%s", name, buildLogs[name])
	return filepath.Join(buildDir, name)
}

// noteInputs opens every file under dirs from this process. The C++
// compiler, not the test binary, reads the kernel sources, so go test's
// result cache would not see an edited kernel and would replay the old
// result; files the test binary opens are part of the cache key.
func noteInputs(dirs ...string) {
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(path string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				if f, err := os.Open(path); err == nil {
					_ = f.Close()
				}
			}
			return nil
		})
	}
}

func buildAll(cxx string) {
	builds = map[string]error{}
	dir, err := os.MkdirTemp("", "cpuemu")
	if err != nil {
		for b := range binaries {
			builds[b] = err
		}
		return
	}
	buildDir = dir
	src, _ := filepath.Abs(srcDir())
	noteInputs(src, "testdata")
	objs := map[string]bool{}
	for b, objList := range binaries {
		if skipBinary(b) {
			continue
		}
		for _, o := range objList {
			objs[o] = true
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	objErr := map[string]error{}
	for o := range objs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append(append([]string{}, cxxFlags...), "-I"+src, "-c", filepath.Join("testdata", o+".cpp"),
				"-o", filepath.Join(dir, o+".o"))
			out, err := exec.Command(cxx, args...).CombinedOutput()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				objErr[o] = fmt.Errorf("compiling %s: %w\n%s", o, err, out)
			}
		}()
	}
	wg.Wait()
	for b, objList := range binaries {
		if skipBinary(b) {
			continue
		}
		var args []string
		var errs []string
		for _, o := range objList {
			if e := objErr[o]; e != nil {
				errs = append(errs, e.Error())
			}
			args = append(args, filepath.Join(dir, o+".o"))
		}
		if len(errs) > 0 {
			builds[b] = fmt.Errorf("%s did not compile", b)
			buildLogs[b] = strings.Join(errs, "\n")
			continue
		}
		out, err := exec.Command(cxx, append(args, "-o", filepath.Join(dir, b), "-lm")...).CombinedOutput()
		builds[b] = err
		buildLogs[b] = string(out)
	}
}

// ---- jobs -------------------------------------------------------------------------------------

// Poison patterns of the outputs (the GPU backend's: kcp.PoisonBF16x2 and
// the fp32 one of docs/gpu-backward.md).
const (
	poisonF32    uint32 = 0x7fc0dead
	poisonBF16x2 uint32 = 0x7fc17fc1
	poisonBF16   uint16 = 0x7fc1
)

// job is a list of runner.cpp commands with the files they read.
type job struct {
	t     *testing.T
	dir   string
	lines []string
	size  map[string]int
	outs  []string
	env   []string // added to the runner's environment (e.g. EMU_CP_ASYNC=deferred)
}

func newJob(t *testing.T) *job {
	return &job{t: t, dir: t.TempDir(), size: map[string]int{}}
}

func (j *job) alloc(name string, bytes int) {
	require.NotContains(j.t, j.size, name, "buffer %s twice", name)
	j.size[name] = bytes
	j.lines = append(j.lines, fmt.Sprintf("alloc %s %d", name, bytes))
}

func (j *job) load(name string, data []byte) {
	j.alloc(name, len(data))
	file := name + ".in"
	require.NoError(j.t, os.WriteFile(filepath.Join(j.dir, file), data, 0o644))
	j.lines = append(j.lines, fmt.Sprintf("load %s %s", name, file))
}

func (j *job) f32(name string, v []float32) { j.load(name, f32Bytes(v)) }
func (j *job) i32(name string, v []int32)   { j.load(name, i32Bytes(v)) }
func (j *job) bf16(name string, v []bf16.BF16) {
	j.load(name, bf16.Bytes(v))
}

// out allocates an output buffer of bytes, saved when the job has run.
func (j *job) out(name string, bytes int) {
	j.alloc(name, bytes)
	j.outs = append(j.outs, name)
}

// poison fills buffer name with pattern through the poison kernel
// (gdn_poison_u32), as the GPU backend does before a launch.
func (j *job) poison(name string, pattern uint32) {
	words := j.size[name] / 4
	require.Equal(j.t, words*4, j.size[name], "poison: %s is not whole words", name)
	if words == 0 {
		return
	}
	j.launch("poison:"+name, "gdn_poison_u32", [3]int{min((words+255)/256, 16), 1, 1}, 256, "0",
		buf(name), u64(uint64(words)), u32(pattern))
}

// launch adds a launch; smem is a byte count or a constant of the source.
func (j *job) launch(label, kernel string, grid [3]int, block int, smem string, args ...string) {
	j.lines = append(j.lines, fmt.Sprintf("launch %s %s %d %d %d %d %s %s", label, kernel, grid[0], grid[1], grid[2],
		block, smem, strings.Join(args, " ")))
}

// subset returns a job on j's inputs (and directory) that runs only the
// launches whose label keep accepts (and every poison launch) and saves only
// the outputs named in outs; running it overwrites j's saved outputs, so read
// j's result first.
func (j *job) subset(keep func(label string) bool, outs []string) *job {
	s := &job{t: j.t, dir: j.dir, size: j.size, env: append([]string{}, j.env...)}
	for _, l := range j.lines {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "launch" && !strings.HasPrefix(f[1], "poison:") && !keep(f[1]) {
			continue
		}
		s.lines = append(s.lines, l)
	}
	for _, o := range outs {
		require.Contains(j.t, j.outs, o, "subset: %s is not an output of the job", o)
	}
	s.outs = append([]string{}, outs...)
	return s
}

// Launch arguments.
func buf(name string) string              { return "b:" + name }
func nullBuf() string                     { return "b:-" }
func bufAt(name string, bytes int) string { return fmt.Sprintf("b:%s+%d", name, bytes) }
func i32a(v int) string                   { return "i:" + strconv.Itoa(v) }
func u32(v uint32) string                 { return "w:" + strconv.FormatUint(uint64(v), 10) }
func u64(v uint64) string                 { return "u:" + strconv.FormatUint(v, 10) }
func f32a(v float32) string               { return fmt.Sprintf("f:%08x", math.Float32bits(v)) }
func ceilDiv(a, b int) int                { return (a + b - 1) / b }
func grid1(x int) [3]int                  { return [3]int{x, 1, 1} }
func grid3(x, y, z int) [3]int            { return [3]int{x, y, z} }
func smemOf(name string, vh int) string   { return fmt.Sprintf("%s(%d)", name, vh) }
func f32Of(b []byte, i int) float32       { return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])) }
func bf16Of(b []byte, i int) bf16.BF16    { return bf16.BF16(binary.LittleEndian.Uint16(b[2*i:])) }

// result holds the saved outputs of a job.
type result struct {
	t   *testing.T
	raw map[string][]byte
	log string
}

// exec runs the job on binary bin.
func (j *job) exec(bin string) ([]byte, error) {
	lines := append([]string{}, j.lines...)
	for _, o := range j.outs {
		lines = append(lines, fmt.Sprintf("save %s %s.out", o, o))
	}
	file := filepath.Join(j.dir, "job.txt")
	require.NoError(j.t, os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	cmd := exec.Command(bin, file)
	if len(j.env) > 0 {
		cmd.Env = append(os.Environ(), j.env...)
	}
	return cmd.CombinedOutput()
}

// runFail runs a job that must fail and returns the runner's output.
func (j *job) runFail(bin string) string {
	out, err := j.exec(bin)
	require.Error(j.t, err, "the runner should have failed:\n%s", out)
	return string(out)
}

// run runs the job on binary bin and reads every output.
func (j *job) run(bin string) *result {
	out, err := j.exec(bin)
	require.NoError(j.t, err, "runner:\n%s", out)
	r := &result{t: j.t, raw: map[string][]byte{}, log: string(out)}
	for _, o := range j.outs {
		b, err := os.ReadFile(filepath.Join(j.dir, o+".out"))
		require.NoError(j.t, err)
		require.Len(j.t, b, j.size[o], "output %s", o)
		r.raw[o] = b
	}
	return r
}

// f32s returns output name as float32s, checking that no element still
// holds the poison (never written) and that none is NaN or Inf.
func (r *result) f32s(name string) []float32 {
	b := r.raw[name]
	require.NotNil(r.t, b, "no output %s", name)
	out := make([]float32, len(b)/4)
	unwritten, bad := 0, 0
	for i := range out {
		u := binary.LittleEndian.Uint32(b[4*i:])
		out[i] = math.Float32frombits(u)
		switch {
		case u == poisonF32:
			unwritten++
		case math.IsNaN(float64(out[i])) || math.IsInf(float64(out[i]), 0):
			bad++
		}
	}
	require.Zero(r.t, unwritten, "%s: %d of %d elements never written (still poisoned)", name, unwritten, len(out))
	require.Zero(r.t, bad, "%s: %d of %d elements NaN or Inf", name, bad, len(out))
	return out
}

// bf16s returns output name as bf16, with the checks of f32s.
func (r *result) bf16s(name string) []bf16.BF16 {
	b := r.raw[name]
	require.NotNil(r.t, b, "no output %s", name)
	out := make([]bf16.BF16, len(b)/2)
	unwritten, bad := 0, 0
	for i := range out {
		out[i] = bf16Of(b, i)
		switch {
		case uint16(out[i]) == poisonBF16:
			unwritten++
		case out[i].IsNaN() || out[i]&0x7fff == 0x7f80:
			bad++
		}
	}
	require.Zero(r.t, unwritten, "%s: %d of %d elements never written (still poisoned)", name, unwritten, len(out))
	require.Zero(r.t, bad, "%s: %d of %d elements NaN or Inf", name, bad, len(out))
	return out
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*max(len(v), 1)) // never an empty buffer
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// ---- comparisons --------------------------------------------------------------------------------

// relErr is the normwise relative error ||got - want|| / ||want|| (Frobenius).
func relErr(got, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var d, w float64
	for i := range want {
		d += (got[i] - want[i]) * (got[i] - want[i])
		w += want[i] * want[i]
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}

// errTable collects the errors of one test for the log.
type errTable struct {
	mu   sync.Mutex
	errs map[string]float64
}

func (e *errTable) note(name string, v float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.errs == nil {
		e.errs = map[string]float64{}
	}
	e.errs[name] = max(e.errs[name], v)
}

// requireRel checks relErr(got, want) < tol and notes it.
func requireRel(t *testing.T, et *errTable, name string, got, want []float64, tol float64) {
	t.Helper()
	e := relErr(got, want)
	et.note(name, e)
	require.Lessf(t, e, tol, "%s: relative error %.3g (tolerance %.1g)", name, e, tol)
}

func (e *errTable) log(t *testing.T) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var names []string
	for n := range e.errs {
		names = append(names, n)
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, n := range names {
		fmt.Fprintf(&sb, "  %-22s %.3g\n", n, e.errs[n])
	}
	t.Logf("max relative errors:\n%s", sb.String())
}

func widen(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func bf16Widen(v []bf16.BF16) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x.Float32())
	}
	return out
}
