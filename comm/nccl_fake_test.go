package comm

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeNCCLSource is a stand-in libnccl with the signatures of nccl.h. It checks what arrives (the
// 128-byte id by value above all: its bytes, and the int after it) and records the calls, so the test
// covers the calling convention purego uses without NCCL or a GPU.
const fakeNCCLSource = `
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { size_t size; unsigned int magic; unsigned int version; int blocking; int cgaClusterSize; } cfg_t;

static ncclUniqueId lastId;
static int lastNranks = -1, lastRank = -1, lastBlocking = -1, lastCfgSize = -1, lastCfgVersion = -1, lastCga = 0;
static int asyncState = 0, groupDepth = 0, aborts = 0, destroys = 0, finalizes = 0;
static uintptr_t ag[6];

int ncclGetVersion(int* v) { *v = 22803; return 0; }
int ncclGetUniqueId(ncclUniqueId* id) { for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 7 + 3); return 0; }
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
	lastId = id; lastNranks = nranks; lastRank = rank;
	if (rank < 0 || rank >= nranks) return 4;
	*comm = (void*)(uintptr_t)(0x10000 + 256 * nranks + rank);
	return 0;
}
int ncclCommInitRankConfig(void** comm, int nranks, ncclUniqueId id, int rank, cfg_t* cfg) {
	lastId = id; lastNranks = nranks; lastRank = rank;
	if (cfg->magic != 0xcafebeef) return 4;
	lastBlocking = cfg->blocking; lastCfgSize = (int)cfg->size; lastCfgVersion = (int)cfg->version; lastCga = cfg->cgaClusterSize;
	*comm = (void*)(uintptr_t)(0x20000 + 256 * nranks + rank);
	return cfg->blocking ? 0 : 7;
}
int ncclAllGather(const void* send, void* recv, size_t count, int dt, void* comm, void* stream) {
	ag[0] = (uintptr_t)send; ag[1] = (uintptr_t)recv; ag[2] = count; ag[3] = (uintptr_t)dt; ag[4] = (uintptr_t)comm; ag[5] = (uintptr_t)stream;
	return count == 0 ? 4 : 0;
}
int ncclGroupStart(void) { groupDepth++; return 0; }
int ncclGroupEnd(void) { groupDepth--; return 0; }
int ncclCommGetAsyncError(void* comm, int* st) { *st = asyncState; return comm ? 0 : 4; }
int ncclCommFinalize(void* comm) { finalizes++; return 7; }
int ncclCommAbort(void* comm) { aborts++; return 0; }
int ncclCommDestroy(void* comm) { destroys++; return 0; }
const char* ncclGetErrorString(int rc) {
	switch (rc) {
	case 0: return "fake: no error";
	case 4: return "fake: invalid argument";
	case 6: return "fake: remote error";
	default: return "fake: other";
	}
}
const char* ncclGetLastError(void* comm) { return "fake: last error"; }

void fakeSetAsync(int st) { asyncState = st; }
void fakeLastId(char* out) { memcpy(out, lastId.internal, 128); }
int fakeGet(int what) {
	switch (what) {
	case 0: return lastNranks;
	case 1: return lastRank;
	case 2: return lastBlocking;
	case 3: return lastCfgSize;
	case 4: return lastCfgVersion;
	case 5: return lastCga;
	case 6: return groupDepth;
	case 7: return aborts;
	case 8: return destroys;
	case 9: return finalizes;
	}
	return -1;
}
uintptr_t fakeAllGatherArg(int i) { return ag[i]; }
`

// fakeNCCL builds the fake library and points the package at it until the test ends. It skips where
// there is no C compiler (CI images without one) or on other platforms than linux/amd64, the one whose
// struct-by-value convention this checks.
func fakeNCCL(t *testing.T) (api *ncclAPI, lib uintptr) {
	t.Helper()
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("the fake NCCL checks linux/amd64's calling convention; this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("needs a C compiler (cc) to build the fake NCCL library")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fakenccl.c")
	so := filepath.Join(dir, "libfakenccl.so")
	require.NoError(t, os.WriteFile(src, []byte(fakeNCCLSource), 0o644))
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", so, src).CombinedOutput()
	require.NoError(t, err, "building the fake NCCL: %s", out)
	t.Setenv(EnvNCCLNVLSEnable, "0")
	api = withNCCL(t, so)
	lib, err = purego.Dlopen(so, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	require.NoError(t, err)
	return api, lib
}

// fakeFunc binds one of the fake library's control functions.
func fakeFunc[F any](t *testing.T, lib uintptr, name string) F {
	t.Helper()
	var f F
	addr, err := purego.Dlsym(lib, name)
	require.NoError(t, err)
	purego.RegisterFunc(&f, addr)
	return f
}

func TestNCCLBindingWithFakeLibrary(t *testing.T) {
	api, lib := fakeNCCL(t)
	get := fakeFunc[func(int32) int32](t, lib, "fakeGet")
	lastID := fakeFunc[func(*byte)](t, lib, "fakeLastId")
	setAsync := fakeFunc[func(int32)](t, lib, "fakeSetAsync")
	agArg := fakeFunc[func(int32) uintptr](t, lib, "fakeAllGatherArg")

	v, err := NCCLVersion()
	require.NoError(t, err)
	assert.Equal(t, 22803, v)

	id, err := NewUniqueID()
	require.NoError(t, err)
	for i, b := range id.Bytes() {
		require.Equal(t, byte(i*7+3), b, "byte %d of the id ncclGetUniqueId wrote", i)
	}

	// The id travels by value: every byte and the rank after it arrive intact.
	var odd UniqueID
	for i := range odd.internal {
		odd.internal[i] = byte(255 - i)
	}
	tests := []struct {
		name   string
		id     UniqueID
		nranks int
		rank   int
		cfg    *ncclConfig
		handle uintptr
	}{
		{"init rank", id, 4, 3, nil, 0x10000 + 256*4 + 3},
		{"init rank, other id", odd, 8, 5, nil, 0x10000 + 256*8 + 5},
		{"init rank config, non-blocking", odd, 2, 1, newNCCLConfig(false), 0x20000 + 256*2 + 1},
		{"init rank config, blocking", id, 3, 0, newNCCLConfig(true), 0x20000 + 256*3 + 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			comm, err := api.initRank(tc.nranks, tc.rank, tc.id, tc.cfg)
			require.NoError(t, err)
			assert.Equal(t, tc.handle, comm)
			var got [UniqueIDBytes]byte
			lastID(&got[0])
			assert.Equal(t, tc.id.internal, got, "the id as the C function received it")
			assert.Equal(t, int32(tc.nranks), get(0))
			assert.Equal(t, int32(tc.rank), get(1))
			if tc.cfg != nil {
				assert.Equal(t, int32(tc.cfg.blocking), get(2))
				assert.Equal(t, int32(unsafe.Sizeof(ncclConfig{})), get(3))
				assert.Equal(t, int32(ncclConfigVersion), get(4))
				assert.Equal(t, int32(ncclConfigUndefInt), get(5))
			}
		})
	}
	assert.True(t, api.hasConfigInit())

	// A failing init carries NCCL's description and last error.
	_, err = api.initRank(2, 7, id, nil)
	var ne *NCCLError
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, &NCCLError{Call: "ncclCommInitRank", Code: NCCLInvalidArgument, Name: "ncclInvalidArgument",
		Message: "fake: invalid argument", Last: "fake: last error"}, ne)

	// All-gather arguments, in order; ncclInProgress is not an error.
	require.NoError(t, api.allGatherRaw(0x1000, 0x2000, 12, NCCLFloat32, 0x3000, 0x4000))
	for i, want := range []uintptr{0x1000, 0x2000, 12, uintptr(NCCLFloat32), 0x3000, 0x4000} {
		assert.Equal(t, want, agArg(int32(i)), "ncclAllGather argument %d", i)
	}
	assert.True(t, IsNCCLCode(api.allGatherRaw(0x1000, 0x2000, 0, NCCLUint8, 0x3000, 0), NCCLInvalidArgument))

	// Async state, finalize (pending), abort, destroy.
	setAsync(int32(NCCLRemoteError))
	st, err := api.asyncState(0x5000)
	require.NoError(t, err)
	assert.Equal(t, NCCLRemoteError, st)
	setAsync(0)
	_, err = api.asyncState(0)
	assert.True(t, IsNCCLCode(err, NCCLInvalidArgument))
	rc, err := api.commCall(&api.commFinalize, 0x5000)
	require.NoError(t, err)
	assert.Equal(t, NCCLInProgress, rc)
	_, err = api.commCall(&api.commAbort, 0x5000)
	require.NoError(t, err)
	_, err = api.commCall(&api.commDestroy, 0x5000)
	require.NoError(t, err)
	assert.Equal(t, []int32{1, 1, 1}, []int32{get(7), get(8), get(9)})

	// Group: start, fn, end, balanced.
	depth := int32(-1)
	rc, err = api.group(func() error { depth = get(6); return nil })
	require.NoError(t, err)
	assert.Equal(t, NCCLSuccess, rc)
	assert.Equal(t, int32(1), depth)
	assert.Equal(t, int32(0), get(6))
}

// cGetenv reads an environment variable through the C library's getenv, as NCCL does; ok is false
// when the variable is unset there or libc cannot be opened (then the check is skipped).
func cGetenv(t *testing.T, name string) (string, bool) {
	t.Helper()
	lib, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Logf("libc.so.6 not available, C environment not checked: %v", err)
		return "", false
	}
	var getenv func(string) *byte
	addr, err := purego.Dlsym(lib, "getenv")
	require.NoError(t, err)
	purego.RegisterFunc(&getenv, addr)
	p := getenv(name)
	if p == nil {
		t.Errorf("C getenv(%q) = NULL", name)
		return "", false
	}
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b), true
}
