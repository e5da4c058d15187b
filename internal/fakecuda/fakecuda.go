// Package fakecuda builds and drives a stand-in CUDA driver library for
// host-side tests on machines without a GPU (csrc/fakecuda.c): the driver
// functions package loader binds, with device memory in host memory, counted
// handles, kernel launches that do nothing, every call counted, any call made
// to fail once on demand, and a count of what is still held. Tests point the
// loader at it through loader.EnvLibrary, in a child process (the loader
// reads the variable once), and fail a run at every driver call to require
// errors, not crashes, and nothing left behind.
package fakecuda

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/ebitengine/purego"

	"github.com/gdnkcp/gdnkcp/internal/cshared"
)

//go:embed csrc/fakecuda.c
var source string

// ErrUnsupported is returned by Build where the fake cannot be built: no C
// compiler (cc), or another platform than linux/amd64 and linux/arm64.
var ErrUnsupported = errors.New("fakecuda: cannot build the fake CUDA driver here")

// CUDA error codes a test injects (CUresult).
const (
	ErrorInvalidValue = 1
	ErrorOutOfMemory  = 2
	ErrorLaunchFailed = 719
)

// Build compiles the fake driver into dir and returns the library's path.
func Build(dir string) (string, error) {
	so, err := cshared.Build(dir, "fakecuda", source)
	if errors.Is(err, cshared.ErrUnsupported) {
		return "", fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	if err != nil {
		return "", fmt.Errorf("fakecuda: %w", err)
	}
	return so, nil
}

// Lib is the fake's controls, bound from the library at a path. dlopen gives
// one handle a library, so they act on the driver the loader opened from the
// same path.
type Lib struct {
	fail     func(name string, n int64, code int32)
	calls    func(name string) int64
	live     func(what int32) int64
	logLen   func() int64
	dropped  func() int64
	clearLog func()
	logAt    func(i int64, a, b *uintptr, g *[3]uint32) int32
	funcName func(fn uintptr, out *byte, n int32)
	priority func(s uintptr) int32
}

// Open binds the controls of the fake at path.
func Open(path string) (*Lib, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("fakecuda: %w", err)
	}
	l := &Lib{}
	for _, f := range []struct {
		ptr  any
		name string
	}{{&l.fail, "fake_fail"}, {&l.calls, "fake_calls"}, {&l.live, "fake_live"}, {&l.logLen, "fake_log_len"},
		{&l.dropped, "fake_log_dropped"}, {&l.clearLog, "fake_log_clear"},
		{&l.logAt, "fake_log_at"}, {&l.funcName, "fake_func_name"}, {&l.priority, "fake_stream_priority"}} {
		addr, err := purego.Dlsym(h, f.name)
		if err != nil {
			return nil, fmt.Errorf("fakecuda: %s: %w", path, err)
		}
		purego.RegisterFunc(f.ptr, addr)
	}
	return l, nil
}

// Fail makes the nth call of the driver function name from now (1 for the
// next) return code, once; n 0 disarms.
func (l *Lib) Fail(name string, n int, code int) { l.fail(name, int64(n), int32(code)) }

// Calls is how many times name was called, -1 where never.
func (l *Lib) Calls(name string) int { return int(l.calls(name)) }

// Held is what the fake's driver holds for its callers.
type Held struct {
	Allocs, Bytes int64 // device allocations and their bytes
	HostBuffers   int64 // page-locked host buffers
	Streams       int64
	Events        int64
	Modules       int64
	Contexts      int64 // primary-context retains not released
}

// Held returns what is held now.
func (l *Lib) Held() Held {
	return Held{Allocs: l.live(0), Bytes: l.live(1), HostBuffers: l.live(2), Streams: l.live(3), Events: l.live(4),
		Modules: l.live(5), Contexts: l.live(6)}
}

// BadFrees is how many frees named memory the fake never handed out (or
// handed out and took back already).
func (l *Lib) BadFrees() int { return int(l.live(7)) }

// Failures is how many injected failures the fake has returned.
func (l *Lib) Failures() int { return int(l.live(8)) }

// Op is one entry of the fake's stream-order log: a launch, an event record
// or a stream's wait for an event, in the order the driver was called.
type Op struct {
	Kind     OpKind
	Function string    // a launch's kernel
	Grid     [3]uint32 // a launch's grid
	Stream   uintptr   // the stream launched on, recorded on or made to wait
	Event    uintptr   // the event recorded or waited for
}

// OpKind says what an Op is.
type OpKind int

// The kinds of Op.
const (
	OpLaunch OpKind = 1 // cuLaunchKernel
	OpRecord OpKind = 2 // cuEventRecord
	OpWait   OpKind = 3 // cuStreamWaitEvent
)

// Log returns the stream-order log from entry from on (at most 65,536
// entries are kept from the library's start or the last ClearLog; LogDropped
// counts the rest).
func (l *Lib) Log(from int) []Op {
	n := int(l.logLen())
	ops := make([]Op, 0, max(0, n-from))
	name := make([]byte, 64)
	for i := from; i < n; i++ {
		var a, b uintptr
		var g [3]uint32
		switch OpKind(l.logAt(int64(i), &a, &b, &g)) {
		case OpLaunch:
			l.funcName(a, &name[0], int32(len(name)))
			ops = append(ops, Op{Kind: OpLaunch, Function: cstring(name), Grid: g, Stream: b})
		case OpRecord:
			ops = append(ops, Op{Kind: OpRecord, Event: a, Stream: b})
		case OpWait:
			ops = append(ops, Op{Kind: OpWait, Stream: a, Event: b})
		}
	}
	return ops
}

// LogLen is the stream-order log's length: Log(LogLen()) later is what came
// after.
func (l *Lib) LogLen() int { return int(l.logLen()) }

// LogDropped is how many entries came after the log was full (65,536) and
// were not kept, since the start or ClearLog: a test that reads the log
// checks it is 0.
func (l *Lib) LogDropped() int { return int(l.dropped()) }

// ClearLog empties the stream-order log and its dropped count (function
// names and stream priorities are kept).
func (l *Lib) ClearLog() { l.clearLog() }

// StreamPriority is the priority stream s was created with
// (cuStreamCreateWithPriority), 0 for other streams.
func (l *Lib) StreamPriority(s uintptr) int { return int(l.priority(s)) }

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// EnvLibrary is loader.EnvLibrary's name (package loader's tests import this
// one, so it cannot import loader; TestFakeDriver checks that they agree).
const EnvLibrary = "GDNKCP_CUDA_LIBRARY"

// EnvAlways, set, makes RunChild run its test where a CUDA driver is
// installed too (by default it skips there: the GPU tests run on such
// machines, and their time is scarce).
const EnvAlways = "GDNKCP_FAKECUDA_ALWAYS"

// childEnv marks a test's child process (RunChild) and holds the fake's path.
const childEnv = "GDNKCP_TEST_FAKECUDA_CHILD"

// InChild returns the fake driver's path in a child process RunChild
// started, "" elsewhere.
func InChild() string { return os.Getenv(childEnv) }

// RunChild builds the fake driver and runs test (a test function's name)
// again in a child process of the test binary, pointed at the fake through
// EnvLibrary, with env added; t fails with the child's output where the child
// fails, and is skipped where the fake cannot be built or (without
// EnvAlways) where a real driver is installed. It returns the
// child's output. The child finds the fake's path with InChild.
func RunChild(t testing.TB, test string, env ...string) string {
	t.Helper()
	if h, err := purego.Dlopen("libcuda.so.1", purego.RTLD_LAZY); err == nil && os.Getenv(EnvAlways) == "" {
		_ = purego.Dlclose(h)
		t.Skipf("a CUDA driver is installed: the GPU tests cover this machine, and the device time is theirs (%s=1 runs the fake-driver tests anyway)", EnvAlways)
	}
	so, err := Build(t.TempDir())
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("the fake CUDA driver: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd.Env = append(append(os.Environ(), EnvLibrary+"="+so, childEnv+"="+so), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s in a child process on the fake driver: %v\n%s", test, err, out)
	}
	return string(out)
}
