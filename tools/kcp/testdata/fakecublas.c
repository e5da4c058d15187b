// fakecublas.c: the four cuBLAS functions kcp bench's matrix-rate measurement calls, for the fake-driver
// tests (internal/fakecuda, whose device memory is host memory): cublasGemmEx writes C's first element as
// the bf16 of A's first times B's first times k (a value, not the poison), counts its calls, and checks
// the arguments the measurement must pass. FAKECUBLAS_FAIL=create makes cublasCreate_v2 fail.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int handles, gemms, bad;

int fakecublas_gemms(void) { return gemms; }
int fakecublas_handles(void) { return handles; }
int fakecublas_bad(void) { return bad; }

int cublasCreate_v2(uintptr_t* h) {
	const char* f = getenv("FAKECUBLAS_FAIL");
	if (f && strcmp(f, "create") == 0) return 1;  // CUBLAS_STATUS_NOT_INITIALIZED
	*h = 0x1000 + ++handles;
	return 0;
}
int cublasDestroy_v2(uintptr_t h) {
	if (h == 0) return 7;  // CUBLAS_STATUS_INVALID_VALUE
	handles--;
	return 0;
}
int cublasSetStream_v2(uintptr_t h, uintptr_t s) { return h == 0 ? 7 : 0; }
int cublasGemmEx(uintptr_t h, int ta, int tb, int m, int n, int k, const void* alpha, const void* a, int at, int lda,
                 const void* b, int bt, int ldb, const void* beta, void* c, int ct, int ldc, int compute, int algo) {
	if (h == 0 || ta != 0 || tb != 0 || m <= 0 || n <= 0 || k <= 0 || !alpha || !beta || !a || !b || !c || at != 14 ||
	    bt != 14 || ct != 14 || lda < m || ldb < k || ldc < m || compute != 68 || *(const float*)alpha != 1.0f ||
	    *(const float*)beta != 0.0f) {
		bad++;
		return 7;
	}
	gemms++;
	uint16_t* cc = (uint16_t*)c;
	cc[0] = 0x4000;  // 2.0: not the poison
	cc[1] = 0x4000;
	return 0;
}
