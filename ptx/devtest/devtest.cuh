// devtest.cuh: what the device-side kernel checks of ptx/devtest share (CUDA runtime API, nvcc on the
// GPU machine): error checks, uploads, segment layouts with random inputs, normwise errors, event
// timing. Not part of the blobs (ptxgen builds ptx/src only).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#define CK(x)                                                                                  \
	do {                                                                                       \
		cudaError_t e_ = (x);                                                                  \
		if (e_ != cudaSuccess) {                                                               \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(2);                                                                           \
		}                                                                                      \
	} while (0)

namespace devtest {

constexpr int D = 128, C = 64;

// Chunks: segments of chunk lengths laid out back to back (the kcp chunk and segment tables).
struct Chunks {
	int T = 0, NC = 0, NS = 0;
	std::vector<int> tok0, len, seg0, segn;
	explicit Chunks(const std::vector<std::vector<int>>& segs) {
		NS = (int)segs.size();
		for (auto& sg : segs) {
			seg0.push_back(NC);
			segn.push_back((int)sg.size());
			for (int n : sg) {
				tok0.push_back(T);
				len.push_back(n);
				T += n;
				NC++;
			}
		}
	}
};

inline void fill_normal(std::vector<float>& v, std::mt19937& rng, float scale) {
	std::normal_distribution<float> nd(0.f, 1.f);
	for (auto& x : v) x = scale * nd(rng);
}

// unit_rows: rows of D random unit vectors.
inline void unit_rows(std::vector<float>& v, std::mt19937& rng) {
	std::normal_distribution<float> nd(0.f, 1.f);
	for (size_t r = 0; r < v.size() / D; ++r) {
		double ss = 0;
		for (int k = 0; k < D; ++k) {
			v[r * D + k] = nd(rng);
			ss += (double)v[r * D + k] * v[r * D + k];
		}
		for (int k = 0; k < D; ++k) v[r * D + k] = (float)(v[r * D + k] / std::sqrt(ss));
	}
}

// gates: in-chunk cumulative log decays in (-0.12, -0.002) a token, [T, HV].
inline std::vector<float> gates(const Chunks& c, int HV, std::mt19937& rng) {
	std::uniform_real_distribution<float> ud(-0.12f, -0.002f);
	std::vector<float> g((size_t)c.T * HV);
	for (int ci = 0; ci < c.NC; ++ci)
		for (int h = 0; h < HV; ++h) {
			float acc = 0.f;
			for (int i = 0; i < c.len[ci]; ++i) {
				acc += ud(rng);
				g[(size_t)(c.tok0[ci] + i) * HV + h] = acc;
			}
		}
	return g;
}

template <class T>
T* up(const std::vector<T>& v) {
	T* d;
	CK(cudaMalloc(&d, v.size() * sizeof(T)));
	CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
	return d;
}

template <class T>
std::vector<T> down(const T* d, size_t n) {
	std::vector<T> v(n);
	CK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
	return v;
}

inline float bf(uint16_t x) {
	uint32_t u = (uint32_t)x << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

inline uint16_t to_bf(float f) {  // round to nearest even (finite inputs)
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

// err: normwise relative error of got against ref (NaN if any got is not finite).
inline double err(const std::vector<float>& got, const std::vector<float>& ref) {
	double num = 0, den = 0;
	for (size_t i = 0; i < ref.size(); ++i) {
		if (!std::isfinite(got[i])) return NAN;
		num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
		den += double(ref[i]) * ref[i];
	}
	return std::sqrt(num / den);
}

// time_ms: the median of reps CUDA-event timings of launch after two warm-ups, and the min and max.
inline void time_ms(const std::function<void()>& launch, int reps, float& med, float& lo, float& hi) {
	cudaEvent_t a, b;
	CK(cudaEventCreate(&a));
	CK(cudaEventCreate(&b));
	std::vector<float> ms;
	for (int r = 0; r < reps + 2; ++r) {
		CK(cudaEventRecord(a));
		launch();
		CK(cudaEventRecord(b));
		CK(cudaEventSynchronize(b));
		float x;
		CK(cudaEventElapsedTime(&x, a, b));
		if (r >= 2) ms.push_back(x);
	}
	CK(cudaGetLastError());
	std::sort(ms.begin(), ms.end());
	med = ms[ms.size() / 2], lo = ms.front(), hi = ms.back();
	CK(cudaEventDestroy(a));
	CK(cudaEventDestroy(b));
}

// timeline_print: the per-phase cycles of a walk's GDNKCP_*_MARK timeline (walk_mark below): for each phase
// the median over chunks 2 .. NC - 3 of role's mark `to` (of the same chunk, or of the next one with next)
// minus its mark `from`. buf: [2 roles][marks][NC] clock64 values, -1 where a mark never fired.
struct Phase {
	int role, from, to;
	bool next;
	const char* name;
};
inline void timeline_print(const char* tag, const char* what, const std::vector<long long>& tl, int marks, int NC,
                           const std::vector<Phase>& phases) {
	int khz = 0;
	CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
	auto at = [&](int role, int slot, int ci) { return tl[((size_t)role * marks + slot) * NC + ci]; };
	if (NC < 6 || at(0, 0, 2) < 0) {
		printf("[%s] %s timeline: no marks (ptx/src has no timeline hooks: ptx/staging/gdn_walk-timeline.patch)\n", tag, what);
		return;
	}
	auto med = [&](const Phase& f) {
		std::vector<long long> v;
		for (int ci = 2; ci + 3 < NC; ++ci) v.push_back(at(f.role, f.to, ci + (f.next ? 1 : 0)) - at(f.role, f.from, ci));
		std::sort(v.begin(), v.end());
		return v[v.size() / 2];
	};
	printf("[%s] %s timeline, vh 64, %d chunks (median cycles a chunk; SM clock %d MHz):\n", tag, what, NC, khz / 1000);
	for (const Phase& f : phases) printf("[%s]   %-9s %-34s %6lld\n", tag, f.role ? "warp 4" : "warp 0", f.name, med(f));
	const long long chunk = med(Phase{0, 0, 0, true, ""});
	printf("[%s]   chunk (mark 0 to mark 0) %6lld cycles, %.2f us\n", tag, chunk, chunk * 1e3 / khz);
}

}  // namespace devtest

#ifdef GDNKCP_WALK_TIMELINE
// The timeline recorder (scripts/walk-check.sh with VARIANTS='tl=-DGDNKCP_WALK_TIMELINE'): clock64() at a
// walk's mark hooks (GDNKCP_WALK_MARK in the state walk, GDNKCP_TAPE_MARK in the tape walk: the hooks of
// ptx/staging/gdn_walk-timeline.patch until it lands), by lane 0 of warp 0 and of warp 4 of block (0, 0, 0),
// one row of chunks a slot. The store is predicated in PTX, not branched around, so that no branch sits
// between a wgmma and its wait. timeline_run sets the buffer up, runs the launch once and returns it.
constexpr int kTimelineMarks = 12;
__constant__ long long* c_tl;
__constant__ int c_tl_chunks;
__device__ __forceinline__ void walk_mark(int slot, int ci) {
	const int w = threadIdx.x >> 5;
	const unsigned on = (blockIdx.x | blockIdx.y | blockIdx.z) == 0 && (threadIdx.x & 31) == 0 && (w == 0 || w == 4) &&
	                    ci < c_tl_chunks;
	long long t;
	asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
	long long* at = c_tl + ((long long)((w >> 2) & 1) * kTimelineMarks + slot) * c_tl_chunks + ci;
	asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %0, 0;\n\t@q st.global.s64 [%1], %2;\n\t}" ::"r"(on), "l"(at), "l"(t));
}
#define GDNKCP_WALK_MARK(slot, ci) walk_mark(slot, ci)
#define GDNKCP_TAPE_MARK(slot, ci) walk_mark(slot, ci)
namespace devtest {
inline std::vector<long long> timeline_run(int NC, const std::function<void()>& launch) {
	long long* buf;
	const size_t n = (size_t)2 * kTimelineMarks * NC;
	CK(cudaMalloc(&buf, sizeof(long long) * n));
	CK(cudaMemset(buf, 0xff, sizeof(long long) * n));
	CK(cudaMemcpyToSymbol(c_tl, &buf, sizeof(buf)));
	CK(cudaMemcpyToSymbol(c_tl_chunks, &NC, sizeof(NC)));
	launch();
	CK(cudaDeviceSynchronize());
	std::vector<long long> tl(n);
	CK(cudaMemcpy(tl.data(), buf, n * sizeof(long long), cudaMemcpyDeviceToHost));
	const int off = 0;  // the marks off again before buf is freed: later launches record nothing
	CK(cudaMemcpyToSymbol(c_tl_chunks, &off, sizeof(off)));
	CK(cudaFree(buf));
	return tl;
}
}  // namespace devtest
#endif
