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

}  // namespace devtest
