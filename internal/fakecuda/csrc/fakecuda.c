// fakecuda.c (package internal/fakecuda builds it): a stand-in CUDA driver library (libcuda) for host-side
// tests on machines without a GPU. It has the driver functions and ABI versions package loader binds
// (loader/driver.go) and does what a host can: device memory is host memory (256-byte aligned, so device
// pointers are real pointers and the copies and memsets are memcpy / memset; a new allocation is filled
// with 0xa5 bytes, finite bf16 and fp32 values that are not kcp's poison, so the host's checks of what it
// downloads pass), streams, events, modules and functions are counted handles, kernel launches are checked
// against an H200's limits, logged and do nothing. What it adds for tests: every call is counted by name,
// any call can be made to fail once at its nth call after fake_fail (with a CUDA error code), fake_live
// reports the device memory, host buffers, streams, events, modules and primary contexts still held (so that
// a test can fail a run at every call and require errors, not crashes, and nothing left behind), and
// fake_log_at reads the log of launches, event records and stream waits (65,536 kept, fake_log_dropped
// counts the rest, fake_log_clear empties it). Environment: FAKECUDA_DEVICES (the
// device count, default 1, read by cuInit), FAKECUDA_TRACE (every allocation and free on stderr).
// Thread-safe: one mutex.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
enum {
	OK = 0,
	INVALID_VALUE = 1,
	OUT_OF_MEMORY = 2,
	NOT_INITIALIZED = 3,
	INVALID_DEVICE = 101,
	INVALID_HANDLE = 400,
	NOT_FOUND = 500,
	NOT_READY = 600,
	LAUNCH_FAILED = 719,
	UNKNOWN = 999,
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define LOCK pthread_mutex_lock(&mu)
#define UNLOCK pthread_mutex_unlock(&mu)

// ---- call counting and failure injection ----
#define MAXFN 96
static const char* fn_names[MAXFN];
static long fn_calls[MAXFN];
static int nfn;
static char fail_name[128];
static long fail_at;  // the nth call of fail_name from the arming (1-based); 0: none armed
static long fail_seen;
static CUresult fail_code;
static long failures;  // injected failures returned so far

// enter counts a call of name and returns the injected error for it, or OK. Called with mu held.
static CUresult enter(const char* name) {
	int i = 0;
	for (; i < nfn; i++)
		if (fn_names[i] == name || strcmp(fn_names[i], name) == 0) break;
	if (i == nfn && nfn < MAXFN) fn_names[nfn++] = name;
	if (i < MAXFN) fn_calls[i]++;
	if (fail_at > 0 && strcmp(fail_name, name) == 0 && ++fail_seen == fail_at) {
		fail_at = 0;
		failures++;
		return fail_code;
	}
	return OK;
}
#define ENTER(name)                       \
	CUresult rc_;                         \
	LOCK;                                 \
	rc_ = enter(name);                    \
	if (rc_ != OK) {                      \
		UNLOCK;                           \
		return rc_;                       \
	}
#define RETURN(v)                \
	do {                         \
		CUresult ret_ = (v);     \
		UNLOCK;                  \
		return ret_;             \
	} while (0)

// ---- the stream-order log: launches, event records and stream waits, in call order ----
enum { OP_LAUNCH = 1, OP_RECORD = 2, OP_WAIT = 3 };
typedef struct {
	int op;
	uintptr_t a, b;      // launch: function, stream; record: event, stream; wait: stream, event
	unsigned g[3];       // launch: grid
} logent;
#define MAXLOG 65536
static logent oplog[MAXLOG];
static long nlog, nlog_dropped;  // entries kept; entries past MAXLOG, counted and not kept
static void logop(int op, uintptr_t a, uintptr_t b, const unsigned* g) {
	if (nlog >= MAXLOG) {
		nlog_dropped++;
		return;
	}
	logent* e = &oplog[nlog++];
	e->op = op, e->a = a, e->b = b;
	for (int i = 0; i < 3; i++) e->g[i] = g ? g[i] : 0;
}
// function names by handle (cuModuleGetFunction), stream priorities by handle
#define MAXH 8192
static uintptr_t fn_handle[MAXH];
static char fn_name[MAXH][64];
static int nfh;
static uintptr_t prio_stream[MAXH];
static int prio_value[MAXH];
static int nprio;

// ---- what is held ----
static long live_allocs, live_bytes, live_host, live_streams, live_events, live_modules, live_ctx, bad_frees;
static int initialized;
static int ndevices = 1;
static uintptr_t next_handle = 0x1000;
static __thread uintptr_t current_ctx;

#define HDR 256
static const uint64_t kMagic = 0x6661636b63756461ull;  // "fackcuda"

static int trace = -1;  // FAKECUDA_TRACE set: every allocation and free on stderr
static void* fake_alloc(size_t n, long* counter) {
	void* p = 0;
	if (trace < 0) trace = getenv("FAKECUDA_TRACE") != 0;
	if (posix_memalign(&p, HDR, n + HDR) != 0) return 0;
	((uint64_t*)p)[0] = kMagic;
	((uint64_t*)p)[1] = n;
	memset((char*)p + HDR, 0xa5, n);  // neither zeros nor a value a test may count on
	live_bytes += (long)n;
	(*counter)++;
	if (trace) fprintf(stderr, "fakecuda: alloc %p %zu %s\n", (void*)((char*)p + HDR), n, counter == &live_host ? "host" : "dev");
	return (char*)p + HDR;
}
static int fake_free(void* q, long* counter) {
	if (!q) return 0;
	uint64_t* p = (uint64_t*)((char*)q - HDR);
	if (p[0] != kMagic) {
		bad_frees++;
		return -1;
	}
	p[0] = 0;
	if (trace > 0) fprintf(stderr, "fakecuda: free %p %llu %s\n", q, (unsigned long long)p[1], counter == &live_host ? "host" : "dev");
	live_bytes -= (long)p[1];
	(*counter)--;
	free(p);
	return 0;
}

// ---- the driver API ----
CUresult cuDriverGetVersion(int* v) {
	ENTER("cuDriverGetVersion");
	*v = 13000;
	RETURN(OK);
}
CUresult cuInit(unsigned flags) {
	ENTER("cuInit");
	const char* d = getenv("FAKECUDA_DEVICES");
	if (d) ndevices = atoi(d);
	initialized = 1;
	RETURN(flags == 0 ? OK : INVALID_VALUE);
}
static const char* err_name(CUresult rc) {
	switch (rc) {
	case OK: return "CUDA_SUCCESS";
	case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
	case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
	case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
	case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
	case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
	case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
	case NOT_READY: return "CUDA_ERROR_NOT_READY";
	case LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
	default: return 0;
	}
}
CUresult cuGetErrorName(CUresult rc, const char** s) {
	LOCK;
	enter("cuGetErrorName");  // never fails: the loader's error path calls it
	UNLOCK;
	*s = err_name(rc);
	return *s ? OK : INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult rc, const char** s) {
	LOCK;
	enter("cuGetErrorString");
	UNLOCK;
	*s = err_name(rc) ? "fake CUDA driver: injected error" : 0;
	return *s ? OK : INVALID_VALUE;
}

#define NEED_INIT \
	if (!initialized) RETURN(NOT_INITIALIZED)

CUresult cuDeviceGetCount(int* n) {
	ENTER("cuDeviceGetCount");
	NEED_INIT;
	*n = ndevices;
	RETURN(OK);
}
CUresult cuDeviceGet(int* dev, int ordinal) {
	ENTER("cuDeviceGet");
	NEED_INIT;
	if (ordinal < 0 || ordinal >= ndevices) RETURN(INVALID_DEVICE);
	*dev = ordinal;
	RETURN(OK);
}
CUresult cuDeviceGetName(char* name, int n, int dev) {
	ENTER("cuDeviceGetName");
	if (n > 0) {
		strncpy(name, "Fake NVIDIA H200 (fakecuda)", (size_t)n);
		name[n - 1] = 0;
	}
	RETURN(dev >= 0 && dev < ndevices ? OK : INVALID_DEVICE);
}
CUresult cuDeviceGetAttribute(int* v, int attr, int dev) {
	ENTER("cuDeviceGetAttribute");
	if (dev < 0 || dev >= ndevices) RETURN(INVALID_DEVICE);
	switch (attr) {  // an H200's values (CUdevice_attribute numbers)
	case 1: *v = 1024; break;                    // max threads a block
	case 2: case 3: *v = 1024; break;            // block dims x, y
	case 4: *v = 64; break;                      // block dim z
	case 5: *v = 2147483647; break;              // grid x
	case 6: case 7: *v = 65535; break;           // grid y, z
	case 8: *v = 49152; break;                   // shared memory a block
	case 9: *v = 65536; break;                   // constant memory
	case 10: *v = 32; break;                     // warp size
	case 12: case 82: *v = 65536; break;         // registers a block, an SM
	case 13: *v = 1980000; break;                // clock, kHz
	case 16: *v = 132; break;                    // SMs
	case 39: *v = 2048; break;                   // threads an SM
	case 41: case 95: *v = 1; break;             // unified addressing, cooperative launch
	case 75: *v = 9; break;                      // compute capability
	case 76: *v = 0; break;
	case 81: *v = 233472; break;                 // shared memory an SM
	case 97: *v = 232448; break;                 // opt-in shared memory a block
	default: *v = 0;
	}
	RETURN(OK);
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, int dev) {
	ENTER("cuDeviceTotalMem_v2");
	*bytes = (size_t)150754820096ull;
	RETURN(dev >= 0 && dev < ndevices ? OK : INVALID_DEVICE);
}
CUresult cuDeviceCanAccessPeer(int* can, int dev, int peer) {
	ENTER("cuDeviceCanAccessPeer");
	*can = dev != peer;
	RETURN(OK);
}

CUresult cuDevicePrimaryCtxRetain(uintptr_t* ctx, int dev) {
	ENTER("cuDevicePrimaryCtxRetain");
	NEED_INIT;
	if (dev < 0 || dev >= ndevices) RETURN(INVALID_DEVICE);
	*ctx = 0x100 + (uintptr_t)dev;
	live_ctx++;
	RETURN(OK);
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) {
	ENTER("cuDevicePrimaryCtxRelease_v2");
	live_ctx--;
	RETURN(OK);
}
CUresult cuCtxGetCurrent(uintptr_t* ctx) {
	ENTER("cuCtxGetCurrent");
	*ctx = current_ctx;
	RETURN(OK);
}
CUresult cuCtxSetCurrent(uintptr_t ctx) {
	ENTER("cuCtxSetCurrent");
	current_ctx = ctx;
	RETURN(OK);
}
CUresult cuCtxSynchronize(void) {
	ENTER("cuCtxSynchronize");
	RETURN(OK);
}
CUresult cuCtxEnablePeerAccess(uintptr_t peer, unsigned flags) {
	ENTER("cuCtxEnablePeerAccess");
	RETURN(OK);
}

CUresult cuMemGetInfo_v2(size_t* freeb, size_t* total) {
	ENTER("cuMemGetInfo_v2");
	*total = (size_t)150754820096ull;
	*freeb = *total - (size_t)live_bytes;
	RETURN(OK);
}
CUresult cuMemAlloc_v2(uintptr_t* ptr, size_t n) {
	ENTER("cuMemAlloc_v2");
	if (n == 0) RETURN(INVALID_VALUE);
	void* p = fake_alloc(n, &live_allocs);
	if (!p) RETURN(OUT_OF_MEMORY);
	*ptr = (uintptr_t)p;
	RETURN(OK);
}
CUresult cuMemFree_v2(uintptr_t ptr) {
	ENTER("cuMemFree_v2");
	RETURN(fake_free((void*)ptr, &live_allocs) == 0 ? OK : INVALID_VALUE);
}
CUresult cuMemHostAlloc(void** p, size_t n, unsigned flags) {
	ENTER("cuMemHostAlloc");
	*p = fake_alloc(n, &live_host);
	RETURN(*p ? OK : OUT_OF_MEMORY);
}
CUresult cuMemFreeHost(void* p) {
	ENTER("cuMemFreeHost");
	RETURN(fake_free(p, &live_host) == 0 ? OK : INVALID_VALUE);
}
#define COPY(name, dsttype, srctype)                                                 \
	CUresult name(dsttype dst, srctype src, size_t n) {                             \
		ENTER(#name);                                                               \
		memmove((void*)dst, (const void*)src, n);                                   \
		RETURN(OK);                                                                 \
	}
#define COPY_ASYNC(name, dsttype, srctype)                                           \
	CUresult name(dsttype dst, srctype src, size_t n, uintptr_t stream) {           \
		ENTER(#name);                                                               \
		memmove((void*)dst, (const void*)src, n);                                   \
		RETURN(OK);                                                                 \
	}
COPY(cuMemcpyHtoD_v2, uintptr_t, const void*)
COPY(cuMemcpyDtoH_v2, void*, uintptr_t)
COPY(cuMemcpyDtoD_v2, uintptr_t, uintptr_t)
COPY_ASYNC(cuMemcpyHtoDAsync_v2, uintptr_t, const void*)
COPY_ASYNC(cuMemcpyDtoHAsync_v2, void*, uintptr_t)
COPY_ASYNC(cuMemcpyDtoDAsync_v2, uintptr_t, uintptr_t)
CUresult cuMemcpyPeerAsync(uintptr_t dst, uintptr_t dctx, uintptr_t src, uintptr_t sctx, size_t n, uintptr_t stream) {
	ENTER("cuMemcpyPeerAsync");
	memmove((void*)dst, (const void*)src, n);
	RETURN(OK);
}
CUresult cuMemsetD8_v2(uintptr_t dst, unsigned char v, size_t n) {
	ENTER("cuMemsetD8_v2");
	memset((void*)dst, v, n);
	RETURN(OK);
}
CUresult cuMemsetD8Async(uintptr_t dst, unsigned char v, size_t n, uintptr_t stream) {
	ENTER("cuMemsetD8Async");
	memset((void*)dst, v, n);
	RETURN(OK);
}
CUresult cuMemsetD32_v2(uintptr_t dst, unsigned v, size_t n) {
	ENTER("cuMemsetD32_v2");
	for (size_t i = 0; i < n; i++) ((unsigned*)dst)[i] = v;
	RETURN(OK);
}
CUresult cuMemsetD32Async(uintptr_t dst, unsigned v, size_t n, uintptr_t stream) {
	ENTER("cuMemsetD32Async");
	for (size_t i = 0; i < n; i++) ((unsigned*)dst)[i] = v;
	RETURN(OK);
}

CUresult cuStreamCreate(uintptr_t* s, unsigned flags) {
	ENTER("cuStreamCreate");
	*s = next_handle++;
	live_streams++;
	RETURN(OK);
}
CUresult cuStreamCreateWithPriority(uintptr_t* s, unsigned flags, int prio) {
	ENTER("cuStreamCreateWithPriority");
	*s = next_handle++;
	live_streams++;
	if (nprio < MAXH) prio_stream[nprio] = *s, prio_value[nprio++] = prio;
	RETURN(OK);
}
CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
	ENTER("cuCtxGetStreamPriorityRange");
	*least = 0;
	*greatest = -5;
	RETURN(OK);
}
CUresult cuStreamDestroy_v2(uintptr_t s) {
	ENTER("cuStreamDestroy_v2");
	live_streams--;
	RETURN(OK);
}
CUresult cuStreamSynchronize(uintptr_t s) {
	ENTER("cuStreamSynchronize");
	RETURN(OK);
}
CUresult cuStreamQuery(uintptr_t s) {
	ENTER("cuStreamQuery");
	RETURN(OK);
}
CUresult cuStreamWaitEvent(uintptr_t s, uintptr_t ev, unsigned flags) {
	ENTER("cuStreamWaitEvent");
	logop(OP_WAIT, s, ev, 0);
	RETURN(OK);
}

CUresult cuEventCreate(uintptr_t* ev, unsigned flags) {
	ENTER("cuEventCreate");
	*ev = next_handle++;
	live_events++;
	RETURN(OK);
}
CUresult cuEventRecord(uintptr_t ev, uintptr_t s) {
	ENTER("cuEventRecord");
	logop(OP_RECORD, ev, s, 0);
	RETURN(OK);
}
CUresult cuEventSynchronize(uintptr_t ev) {
	ENTER("cuEventSynchronize");
	RETURN(OK);
}
CUresult cuEventQuery(uintptr_t ev) {
	ENTER("cuEventQuery");
	RETURN(OK);
}
CUresult cuEventDestroy_v2(uintptr_t ev) {
	ENTER("cuEventDestroy_v2");
	live_events--;
	RETURN(OK);
}
CUresult cuEventElapsedTime_v2(float* ms, uintptr_t a, uintptr_t b) {
	ENTER("cuEventElapsedTime_v2");
	*ms = 0.125f;
	RETURN(OK);
}
CUresult cuEventElapsedTime(float* ms, uintptr_t a, uintptr_t b) {
	ENTER("cuEventElapsedTime");
	*ms = 0.125f;
	RETURN(OK);
}

CUresult cuModuleLoadDataEx(uintptr_t* mod, const void* image, unsigned nopt, void* opts, void* vals) {
	ENTER("cuModuleLoadDataEx");
	if (!image) RETURN(INVALID_VALUE);
	*mod = next_handle++;
	live_modules++;
	RETURN(OK);
}
CUresult cuModuleUnload(uintptr_t mod) {
	ENTER("cuModuleUnload");
	live_modules--;
	RETURN(OK);
}
CUresult cuModuleGetFunction(uintptr_t* fn, uintptr_t mod, const char* name) {
	ENTER("cuModuleGetFunction");
	if (!name || !*name) RETURN(NOT_FOUND);
	*fn = next_handle++;
	if (nfh < MAXH) {
		fn_handle[nfh] = *fn;
		strncpy(fn_name[nfh], name, sizeof fn_name[0] - 1);
		nfh++;
	}
	RETURN(OK);
}
CUresult cuFuncGetAttribute(int* v, int attr, uintptr_t fn) {
	ENTER("cuFuncGetAttribute");
	switch (attr) {
	case 0: *v = 1024; break;   // max threads a block
	case 4: *v = 128; break;    // registers
	case 5: case 6: *v = 90; break;
	case 8: *v = 232448; break;  // max dynamic shared memory
	default: *v = 0;
	}
	RETURN(OK);
}
CUresult cuFuncSetAttribute(uintptr_t fn, int attr, int v) {
	ENTER("cuFuncSetAttribute");
	RETURN(attr == 8 && v > 232448 ? INVALID_VALUE : OK);
}
CUresult cuLaunchKernel(uintptr_t fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, uintptr_t stream, void** params, void** extra) {
	ENTER("cuLaunchKernel");
	if (gx == 0 || gy == 0 || gz == 0 || gx > 2147483647u || gy > 65535 || gz > 65535 || bx * by * bz > 1024 || shared > 232448)
		RETURN(INVALID_VALUE);  // an H200's limits
	const unsigned g[3] = {gx, gy, gz};
	logop(OP_LAUNCH, fn, stream, g);
	RETURN(OK);
}

// ---- the test's controls ----
// fake_fail arms one failure: the nth call of name from now returns code. n 0 disarms.
void fake_fail(const char* name, long n, int code) {
	LOCK;
	strncpy(fail_name, name, sizeof fail_name - 1);
	fail_at = n;
	fail_seen = 0;
	fail_code = code;
	UNLOCK;
}
// fake_calls: the calls of name so far (-1: none ever).
long fake_calls(const char* name) {
	long n = -1;
	LOCK;
	for (int i = 0; i < nfn; i++)
		if (strcmp(fn_names[i], name) == 0) n = fn_calls[i];
	UNLOCK;
	return n;
}
// fake_live: 0 device allocations, 1 their bytes, 2 host buffers, 3 streams, 4 events, 5 modules, 6 retained
// primary contexts, 7 frees of pointers the fake never handed out, 8 injected failures returned.
long fake_live(int what) {
	long v = -1;
	LOCK;
	if (trace > 0 && what == 0) fprintf(stderr, "fakecuda: live allocs %ld bytes %ld\n", live_allocs, live_bytes);
	switch (what) {
	case 0: v = live_allocs; break;
	case 1: v = live_bytes; break;
	case 2: v = live_host; break;
	case 3: v = live_streams; break;
	case 4: v = live_events; break;
	case 5: v = live_modules; break;
	case 6: v = live_ctx; break;
	case 7: v = bad_frees; break;
	case 8: v = failures; break;
	}
	UNLOCK;
	return v;
}

// fake_log_len: the stream-order log's entries so far (launches, event records, stream waits; at most 65,536:
// later ones are counted by fake_log_dropped).
long fake_log_len(void) {
	LOCK;
	long n = nlog;
	UNLOCK;
	return n;
}
// fake_log_dropped: the entries that did not fit since the start or the last fake_log_clear.
long fake_log_dropped(void) {
	LOCK;
	long n = nlog_dropped;
	UNLOCK;
	return n;
}
// fake_log_clear: empties the log (and the dropped count).
void fake_log_clear(void) {
	LOCK;
	nlog = 0, nlog_dropped = 0;
	UNLOCK;
}
// fake_log_at: entry i: its op (1 launch, 2 event record, 3 stream wait), a and b (launch: function, stream;
// record: event, stream; wait: stream, event) and a launch's grid into g[3]; 0 past the end.
int fake_log_at(long i, uintptr_t* a, uintptr_t* b, unsigned* g) {
	LOCK;
	if (i < 0 || i >= nlog) {
		UNLOCK;
		return 0;
	}
	logent e = oplog[i];
	UNLOCK;
	*a = e.a, *b = e.b;
	for (int k = 0; k < 3; k++) g[k] = e.g[k];
	return e.op;
}
// fake_func_name: the name cuModuleGetFunction gave function handle fn ("" where unknown) into out (n bytes).
void fake_func_name(uintptr_t fn, char* out, int n) {
	LOCK;
	out[0] = 0;
	for (int i = 0; i < nfh; i++)
		if (fn_handle[i] == fn) {
			strncpy(out, fn_name[i], (size_t)n - 1);
			out[n - 1] = 0;
		}
	UNLOCK;
}
// fake_stream_priority: the priority stream s was created with (cuStreamCreateWithPriority), or 0.
int fake_stream_priority(uintptr_t s) {
	int p = 0;
	LOCK;
	for (int i = 0; i < nprio; i++)
		if (prio_stream[i] == s) p = prio_value[i];
	UNLOCK;
	return p;
}
