package comm

// The raw NCCL binding: libnccl opened at run time with purego (no cgo, no headers; internal/dlib), one
// lazily resolved entry per function, ncclResult_t turned into *NCCLError. The calls follow nccl.h of
// NCCL 2.28; they ran against NCCL 2.28.3 on two H200s (docs/perf-notes.md, 2026-11-29), and the tests
// check them against a fake libnccl built from C (nccl_fake_test.go): the calling convention, the
// 128-byte ncclUniqueId passed by value included, on linux/amd64.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/gdnkcp/gdnkcp/internal/dlib"
)

// The binding passes size_t and handles as uintptr: 64-bit builds only.
var _ [unsafe.Sizeof(uintptr(0)) - 8]struct{}

// defaultNCCLNames are the names tried, in order, to open NCCL.
var defaultNCCLNames = []string{"libnccl.so.2", "libnccl.so"}

// EnvNCCLLibrary names the NCCL library to open in place of libnccl.so.2 and
// libnccl.so: a path, or a name dlopen resolves. It is read once, when the
// package initialises. The tests point it at a stand-in NCCL
// (internal/fakenccl) to run the ranks of one process over NCCL on fake
// devices.
const EnvNCCLLibrary = "GDNKCP_NCCL_LIBRARY"

// ncclLibraryNames is what NCCL is opened under: EnvNCCLLibrary's value
// where it is set, else defaultNCCLNames.
func ncclLibraryNames() []string {
	if v := os.Getenv(EnvNCCLLibrary); v != "" {
		return []string{v}
	}
	return defaultNCCLNames
}

// NCCLSymbolError says that the opened NCCL library lacks a function, typically because it is older
// than the function.
type NCCLSymbolError struct {
	Name    string // the NCCL function, e.g. "ncclCommInitRankConfig"
	Library string // the library searched
	Err     error  // what dlsym said
}

// Error names the function and the library.
func (e *NCCLSymbolError) Error() string {
	return fmt.Sprintf("comm: symbol %s not found in %s: %v", e.Name, e.Library, e.Err)
}

// Unwrap returns dlsym's error.
func (e *NCCLSymbolError) Unwrap() error { return e.Err }

// ncclProc is one NCCL function, resolved on first use and then cached (dlib.Proc: Name is the symbol,
// Get binds it from the library, which is opened once, on first use). F is the Go signature purego calls
// it with.
type ncclProc[F any] = dlib.Proc[F]

// newNCCLLibrary is NCCL tried under names: a failed open wraps ErrNoNCCL, a missing symbol is an
// *NCCLSymbolError.
func newNCCLLibrary(names []string) *dlib.Library {
	return dlib.New(names, ErrNoNCCL, func(symbol, name string, err error) error {
		return &NCCLSymbolError{Name: symbol, Library: name, Err: err}
	}, "comm: cannot bind NCCL function")
}

// ncclConfig is the head of ncclConfig_t: the fields NCCL 2.14 knew. NCCL copies min(size,
// sizeof(ncclConfig_t)) bytes of it over its defaults and, since version says 2.14, resets every later
// field to its default, so this prefix stays valid for newer libraries.
type ncclConfig struct {
	size           uintptr // size_t: sizeof this struct
	magic          uint32  // NCCL_API_MAGIC
	version        uint32  // NCCL_VERSION(2,14,0)
	blocking       int32   // 0: every NCCL call of the communicator may return ncclInProgress
	cgaClusterSize int32   // NCCL_CONFIG_UNDEF_INT: NCCL's default
}

const (
	ncclAPIMagic       = 0xcafebeef
	ncclConfigVersion  = 21400 // NCCL_VERSION(2,14,0)
	ncclConfigUndefInt = -1 << 31
)

// newNCCLConfig returns a config that asks for a blocking or non-blocking communicator.
func newNCCLConfig(blocking bool) *ncclConfig {
	c := &ncclConfig{magic: ncclAPIMagic, version: ncclConfigVersion, cgaClusterSize: ncclConfigUndefInt}
	c.size = unsafe.Sizeof(*c)
	if blocking {
		c.blocking = 1
	}
	return c
}

// ncclAPI holds the raw NCCL functions of one library, each resolved on first use. ncclComm_t and
// cudaStream_t travel as uintptr, ncclUniqueId by value as [UniqueID].
type ncclAPI struct {
	lib *dlib.Library

	getVersion         ncclProc[func(v *int32) NCCLResult]
	getUniqueID        ncclProc[func(id *UniqueID) NCCLResult]
	commInitRank       ncclProc[func(comm *uintptr, nranks int32, id UniqueID, rank int32) NCCLResult]
	commInitRankConfig ncclProc[func(comm *uintptr, nranks int32, id UniqueID, rank int32, cfg *ncclConfig) NCCLResult]
	allGather          ncclProc[func(send, recv, count uintptr, dt NCCLDataType, comm, stream uintptr) NCCLResult]
	groupStart         ncclProc[func() NCCLResult]
	groupEnd           ncclProc[func() NCCLResult]
	commGetAsyncError  ncclProc[func(comm uintptr, state *NCCLResult) NCCLResult]
	commFinalize       ncclProc[func(comm uintptr) NCCLResult]
	commAbort          ncclProc[func(comm uintptr) NCCLResult]
	commDestroy        ncclProc[func(comm uintptr) NCCLResult]
	getErrorString     ncclProc[func(r NCCLResult) string]
	getLastError       ncclProc[func(comm uintptr) string]
}

// newNCCLAPI names every NCCL function this package uses.
func newNCCLAPI(names []string) *ncclAPI {
	a := &ncclAPI{lib: newNCCLLibrary(names)}
	a.getVersion.Name = "ncclGetVersion"
	a.getUniqueID.Name = "ncclGetUniqueId"
	a.commInitRank.Name = "ncclCommInitRank"
	a.commInitRankConfig.Name = "ncclCommInitRankConfig"
	a.allGather.Name = "ncclAllGather"
	a.groupStart.Name = "ncclGroupStart"
	a.groupEnd.Name = "ncclGroupEnd"
	a.commGetAsyncError.Name = "ncclCommGetAsyncError"
	a.commFinalize.Name = "ncclCommFinalize"
	a.commAbort.Name = "ncclCommAbort"
	a.commDestroy.Name = "ncclCommDestroy"
	a.getErrorString.Name = "ncclGetErrorString"
	a.getLastError.Name = "ncclGetLastError"
	return a
}

// ncclLib is the process's NCCL. Tests may replace it (not in parallel) to point the package at a
// library that does not exist, or at a fake.
var ncclLib = newNCCLAPI(ncclLibraryNames())

// ready checks the environment NCCL will read (see [EnsureNVLSOff]) and opens the library.
func (a *ncclAPI) ready() error {
	if err := EnsureNVLSOff(); err != nil {
		return err
	}
	_, err := a.lib.Open()
	return err
}

// newError builds the *NCCLError of a failed call, asking NCCL for its description and last error
// where it can. comm may be 0.
func (a *ncclAPI) newError(call string, rc NCCLResult, comm uintptr) *NCCLError {
	e := &NCCLError{Call: call, Code: rc, Name: rc.String(), Message: rc.fallbackMessage()}
	if f, err := a.getErrorString.Get(a.lib); err == nil {
		if s := f(rc); s != "" {
			e.Message = s
		}
	}
	if f, err := a.getLastError.Get(a.lib); err == nil {
		e.Last = f(comm)
	}
	return e
}

// check turns a result into nil or an *NCCLError.
func (a *ncclAPI) check(call string, rc NCCLResult, comm uintptr) error {
	if rc == NCCLSuccess {
		return nil
	}
	return a.newError(call, rc, comm)
}

// version calls ncclGetVersion.
func (a *ncclAPI) version() (int, error) {
	if err := a.ready(); err != nil {
		return 0, err
	}
	f, err := a.getVersion.Get(a.lib)
	if err != nil {
		return 0, err
	}
	var v int32
	if err := a.check("ncclGetVersion", f(&v), 0); err != nil {
		return 0, err
	}
	return int(v), nil
}

// uniqueID calls ncclGetUniqueId.
func (a *ncclAPI) uniqueID() (UniqueID, error) {
	var id UniqueID
	if err := a.ready(); err != nil {
		return id, err
	}
	f, err := a.getUniqueID.Get(a.lib)
	if err != nil {
		return id, err
	}
	return id, a.check("ncclGetUniqueId", f(&id), 0)
}

// initRank creates this rank's communicator. With cfg nil it calls ncclCommInitRank (a blocking
// communicator: the call returns once every rank has joined); otherwise ncclCommInitRankConfig with
// cfg, and for a non-blocking cfg a result of ncclInProgress is not an error: the communicator is
// returned and the caller waits on ncclCommGetAsyncError. The communicator is returned even with an
// error, when NCCL set it, so that the caller can abort it. The caller has made the rank's CUDA context
// current on this locked thread.
func (a *ncclAPI) initRank(nranks, rank int, id UniqueID, cfg *ncclConfig) (uintptr, error) {
	var comm uintptr
	if cfg == nil {
		f, err := a.commInitRank.Get(a.lib)
		if err != nil {
			return 0, err
		}
		return comm, a.check("ncclCommInitRank", f(&comm, int32(nranks), id, int32(rank)), comm)
	}
	f, err := a.commInitRankConfig.Get(a.lib)
	if err != nil {
		return 0, err
	}
	rc := f(&comm, int32(nranks), id, int32(rank), cfg)
	if rc == NCCLInProgress && cfg.blocking == 0 {
		return comm, nil
	}
	return comm, a.check("ncclCommInitRankConfig", rc, comm)
}

// hasConfigInit reports whether the library has ncclCommInitRankConfig (NCCL >= 2.14), needed for a
// non-blocking communicator.
func (a *ncclAPI) hasConfigInit() bool {
	_, err := a.commInitRankConfig.Get(a.lib)
	return err == nil
}

// allGatherRaw calls ncclAllGather; ncclInProgress (a non-blocking communicator still enqueuing) is
// not an error.
func (a *ncclAPI) allGatherRaw(send, recv uintptr, count int, dt NCCLDataType, comm, stream uintptr) error {
	f, err := a.allGather.Get(a.lib)
	if err != nil {
		return err
	}
	rc := f(send, recv, uintptr(count), dt, comm, stream)
	if rc == NCCLInProgress {
		return nil
	}
	return a.check("ncclAllGather", rc, comm)
}

// asyncState calls ncclCommGetAsyncError: the communicator's state (ncclSuccess, ncclInProgress or an
// error), or the error of the query itself.
func (a *ncclAPI) asyncState(comm uintptr) (NCCLResult, error) {
	f, err := a.commGetAsyncError.Get(a.lib)
	if err != nil {
		return 0, err
	}
	var st NCCLResult
	if err := a.check("ncclCommGetAsyncError", f(comm, &st), comm); err != nil {
		return 0, err
	}
	return st, nil
}

// commCall calls one of the func(comm) functions: ncclCommFinalize, ncclCommAbort, ncclCommDestroy.
// ncclInProgress is returned as is (not an error) for the caller to wait on.
func (a *ncclAPI) commCall(p *ncclProc[func(uintptr) NCCLResult], comm uintptr) (NCCLResult, error) {
	f, err := p.Get(a.lib)
	if err != nil {
		return 0, err
	}
	rc := f(comm)
	if rc == NCCLInProgress {
		return rc, nil
	}
	return rc, a.check(p.Name, rc, comm)
}

// group calls ncclGroupStart, fn and ncclGroupEnd on one locked OS thread (NCCL's group state is per
// thread). fn may only enqueue: a collective of a group starts at ncclGroupEnd. A non-blocking
// communicator's ncclGroupEnd may return ncclInProgress, which is returned as is for the caller to
// wait on with ncclCommGetAsyncError. Bound for batching several collectives later; unused today.
func (a *ncclAPI) group(fn func() error) (NCCLResult, error) {
	start, err := a.groupStart.Get(a.lib)
	if err != nil {
		return 0, err
	}
	end, err := a.groupEnd.Get(a.lib)
	if err != nil {
		return 0, err
	}
	if err := a.check("ncclGroupStart", start(), 0); err != nil {
		return 0, err
	}
	ferr := fn()
	rc := end()
	if rc == NCCLInProgress {
		return rc, ferr
	}
	return rc, errors.Join(ferr, a.check("ncclGroupEnd", rc, 0))
}

// NCCLVersion returns ncclGetVersion of the NCCL library, e.g. 22803 for NCCL 2.28.3, or an error
// wrapping [ErrNoNCCL] when there is none. It also applies [EnsureNVLSOff].
func NCCLVersion() (int, error) {
	return ncclLib.version()
}

// NCCLVersionString renders an ncclGetVersion code: 22803 -> "2.28.3" (codes before 2.9 were
// major*1000+minor*100+patch: 2708 -> "2.7.8").
func NCCLVersionString(code int) string {
	if code < 10000 {
		return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
}

// EnsureNVLSOff keeps NVLink multicast (NVLS) off, as gdnkcp requires on every machine: when
// NCCL_NVLS_ENABLE is unset it sets NCCL_NVLS_ENABLE=0 in this process's environment (which NCCL reads
// when it initializes; in CGO_ENABLED=0 builds purego's runtime shim forwards os.Setenv to the C
// environment that NCCL's getenv reads). When it is set to 0 it does nothing; set to anything else, it
// returns an error and changes nothing, rather than silently overriding an explicit choice. Every NCCL
// entry point of this package calls it first. gdnkcp never calls cuMulticastCreate either.
func EnsureNVLSOff() error {
	v, ok := os.LookupEnv(EnvNCCLNVLSEnable)
	if !ok {
		if err := os.Setenv(EnvNCCLNVLSEnable, "0"); err != nil {
			return fmt.Errorf("comm: setting %s=0: %w", EnvNCCLNVLSEnable, err)
		}
		return nil
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n == 0 {
		return nil
	}
	return fmt.Errorf("comm: %s=%q: gdnkcp keeps NVLink multicast (NVLS) off; unset it or set it to 0",
		EnvNCCLNVLSEnable, v)
}
