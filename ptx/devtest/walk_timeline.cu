// walk_timeline.cu: the v5 core stage's plane walks at vh 64 outside kcp, the tape walk (gdn_tape_walk_planes,
// ptx/src/gdn_tape_planes.cu) and the state walk (gdn_state_walk_planes, gdn_walk_planes.cu), for two questions
// ncu's samples cannot answer: how long each phase of a chunk takes for a state warp (warp 0) and for a copying
// warp (warp 4), and which of the two ends a chunk last, so that the other waits at the next barrier. Run by
// scripts/walk-timeline.sh on the GPU machine (nvcc there; no Go needed). Arguments: NC (chunks), a tag, and
// which walks: tape, state or both (the default).
//
// Inputs: one segment of NC chunks of 64 tokens (default 512: 32,768 tokens, kcp bench's one-document pack),
// HV 48 over HQK 16, every buffer filled on the device with bounded pseudo-random values (-W's planes, k's and
// q's bf16 rows with their rstd, in-chunk cumulative gates, dvl, dO, the terminal adjoint), the outputs of the
// core stage only (the tape walk's bf16 D^T and dV'^T and start adjoint; the state walk, on the same buffers as
// U^T, start state, H and V', its bf16 H^T and V'^T and final state). Nothing is checked against a reference:
// kcp's GPU tests and the emulator do that; this run only times. Prints, per walk:
//   - its CUDA-event median of 10 after 2 warm-ups (compare kcp bench's "bwd tape walk" / "fwd state walk");
//   - built with -DGDNKCP_WALK_TIMELINE and the hooks of ptx/staging/walk_marks.patch (the tape walk's marks
//     7-9, the state walk's 8; the others are in ptx/src): each phase's median cycles a chunk for both warps
//     (devtest::timeline_print), and the median over chunks of (warp 4's end-of-chunk mark - warp 0's):
//     positive where the copiers end the chunk last;
//   - built with -DGDNKCP_WALK_W128: both walks' times at vh 128 as well.
#include "devtest.cuh"

#include <cuda_bf16.h>

#include "../src/gdn_tape_planes.cu"

using namespace devtest;

// A hash of (i, seed) to a uniform value in [-1, 1).
__device__ __forceinline__ float uhash(unsigned long long i, unsigned seed) {
	unsigned long long x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
	x ^= x >> 31;
	x *= 0x94D049BB133111EBull;
	x ^= x >> 29;
	return (float)(x >> 40) * (2.f / 16777216.f) - 1.f;
}

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, float scale, unsigned seed) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = __float2bfloat16(scale * uhash(i, seed));
}

__global__ void fill_f32(float* p, size_t n, float scale, float offset, unsigned seed) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = offset + scale * uhash(i, seed);
}

// gcum[t][h]: in-chunk cumulative log decays, -(0.03 +- 0.02) a token from the chunk's start.
__global__ void fill_gates(float* g, int T, int HV) {
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)T * HV; i += (size_t)gridDim.x * blockDim.x) {
		const int t = (int)(i / HV);
		g[i] = -(0.03f + 0.02f * uhash(i, 7)) * (float)(t % 64 + 1);
	}
}

template <class T>
static T* alloc(size_t n) {
	T* p;
	CK(cudaMalloc(&p, n * sizeof(T)));
	return p;
}

#ifdef GDNKCP_WALK_TIMELINE
// ends: the median over chunks of (warp 4's mark `end` - warp 0's) and how many chunks the copiers end last.
static void ends(const char* tag, const std::vector<long long>& tl, int NC, int end) {
	auto at = [&](int role, int slot, int ci) { return tl[((size_t)role * kTimelineMarks + slot) * NC + ci]; };
	if (at(0, end, 2) < 0 || at(1, end, 2) < 0) {
		printf("[%s]   no end-of-chunk mark %d (ptx/staging/walk_marks.patch not applied?)\n", tag, end);
		return;
	}
	std::vector<long long> dlt;
	int later = 0;
	for (int ci = 2; ci + 3 < NC; ++ci) {
		const long long d = at(1, end, ci) - at(0, end, ci);
		dlt.push_back(d);
		later += d > 0 ? 1 : 0;
	}
	std::sort(dlt.begin(), dlt.end());
	printf("[%s]   warp 4's mark %d - warp 0's: median %lld cycles (quartiles %lld / %lld); the copiers end %d of %zu "
	       "chunks last\n",
	       tag, end, dlt[dlt.size() / 2], dlt[dlt.size() / 4], dlt[3 * dlt.size() / 4], later, dlt.size());
}
#endif

// timed: a walk's CUDA-event time (median of 10 after 2 warm-ups), how many of the first 4096 bf16 values of
// its output out are finite, and, in the timeline build, its phases' cycles and which role ends a chunk last
// (mark end).
static void timed(const char* tag, const char* name, const char* what, int NC, const dim3& grid, int smem,
                  const __nv_bfloat16* out, const std::function<void()>& launch, const std::vector<Phase>& phases,
                  int end) {
	float med, lo, hi;
	time_ms(launch, 10, med, lo, hi);
	printf("[%s] %s vh %d, %d chunks (%d CTAs, %d bytes of shared memory): %.3f ms (median of 10; %.3f - %.3f)\n", tag,
	       name, (int)(D / grid.x), NC, (int)(grid.x * grid.y * grid.z), smem, med, lo, hi);  // grid.x = 128 / vh
	const std::vector<uint16_t> o = down(reinterpret_cast<const uint16_t*>(out), 4096);
	int finite = 0;
	for (uint16_t x : o) finite += std::isfinite(bf(x)) ? 1 : 0;
	printf("[%s] %s: %d of its output's first 4096 bf16 values finite\n", tag, what, finite);
#ifdef GDNKCP_WALK_TIMELINE
	const std::vector<long long> tl = timeline_run(NC, launch);
	timeline_print(tag, what, tl, kTimelineMarks, NC, phases);
	ends(tag, tl, NC, end);
#else
	(void)phases, (void)end;
#endif
}

int main(int argc, char** argv) {
	const int NC = argc > 1 ? atoi(argv[1]) : 512;
	const char* tag = argc > 2 ? argv[2] : "walk";
	const char* which = argc > 3 ? argv[3] : "both";
	const bool doTape = strcmp(which, "state") != 0, doState = strcmp(which, "tape") != 0;
	if (NC < 6) {
		fprintf(stderr, "walk_timeline: NC must be at least 6 (got %d)\n", NC);
		return 2;
	}
	const int HV = 48, HQK = 16, T = NC * C, VH = 64, NS = 1;
	const int stride = HQK * D;  // k's and q's rows: every QK head's 128 elements
	const float scale = 1.f / std::sqrt((float)D);
	std::vector<int> tok0(NC), len(NC, C), seg0{0}, segn{NC};
	for (int c = 0; c < NC; ++c) tok0[c] = c * C;
	int *d_tok0 = up(tok0), *d_len = up(len), *d_seg0 = up(seg0), *d_segn = up(segn);

	__nv_bfloat16* wp = alloc<__nv_bfloat16>((size_t)NC * HV * gdnkcp::walkplanes::kWBytes / 2);
	__nv_bfloat16* k = alloc<__nv_bfloat16>((size_t)T * stride);
	__nv_bfloat16* q = alloc<__nv_bfloat16>((size_t)T * stride);
	__nv_bfloat16* dout = alloc<__nv_bfloat16>((size_t)T * HV * D);
	float* k_rstd = alloc<float>((size_t)T * HQK);
	float* q_rstd = alloc<float>((size_t)T * HQK);
	float* gcum = alloc<float>((size_t)T * HV);
	float* dvl = alloc<float>((size_t)T * HV * D);
	float* dend = alloc<float>((size_t)NS * HV * D * D);
	float* dstart = alloc<float>((size_t)NS * HV * D * D);
	__nv_bfloat16* d16 = alloc<__nv_bfloat16>((size_t)NC * HV * D * D);
	__nv_bfloat16* dvnew16 = alloc<__nv_bfloat16>((size_t)NC * HV * D * C);
	// -W's planes small (hi and lo alike: a timing run), k and q uniform in [-1, 1) with rstd ~ 1 / ||row||.
	fill_bf16<<<1024, 256>>>(wp, (size_t)NC * HV * gdnkcp::walkplanes::kWBytes / 2, 0.02f, 1);
	fill_bf16<<<1024, 256>>>(k, (size_t)T * stride, 1.f, 2);
	fill_bf16<<<1024, 256>>>(q, (size_t)T * stride, 1.f, 3);
	fill_bf16<<<1024, 256>>>(dout, (size_t)T * HV * D, 1.f, 4);
	fill_f32<<<1024, 256>>>(k_rstd, (size_t)T * HQK, 0.01f, 0.153f, 5);
	fill_f32<<<1024, 256>>>(q_rstd, (size_t)T * HQK, 0.01f, 0.153f, 6);
	fill_gates<<<1024, 256>>>(gcum, T, HV);
	fill_f32<<<1024, 256>>>(dvl, (size_t)T * HV * D, 1.f, 0.f, 8);
	fill_f32<<<1024, 256>>>(dend, (size_t)NS * HV * D * D, 0.3f, 0.f, 9);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());

	if (doTape) {
		const int smem = gdnkcp::tapep::tape_planes_smem(VH);
		CK(cudaFuncSetAttribute(gdnkcp::tapep::gdn_tape_walk_planes, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
		const dim3 grid(D / VH, NS, HV);
		// Marks: 0 past the chunk's barrier (both); 7 the next copies issued (both); 8 the previous chunk's outputs
		// stored (copiers); 9 the chunk's work done (both); state warps 1-6 as in gdn_tape_planes.cu.
		timed(tag, "gdn_tape_walk_planes", "tape walk", NC, grid, smem, d16,
		      [&] {
			      gdnkcp::tapep::gdn_tape_walk_planes<<<grid, 256, smem>>>(
			          wp, k, stride, k_rstd, q, stride, q_rstd, gcum, dvl, dout, d_tok0, d_len, d_seg0, d_segn, dend, nullptr,
			          nullptr, dstart, HQK, HV, VH, scale, nullptr, dvnew16, d16, nullptr);
		      },
		      {{0, 0, 7, false, "barrier -> dO copies issued"},
		       {0, 7, 1, false, "-> D split, (1) issued"},
		       {0, 1, 2, false, "-> D^T staged, dvl read (DOF_FIRST: dOf issued)"},
		       {0, 2, 3, false, "-> (1) waited, (dvl read,) dV' formed"},
		       {0, 3, 4, false, "-> splits, (2) issued (no DVL_AHEAD: dvl copies)"},
		       {0, 4, 5, false, "-> dV'^T staged"},
		       {0, 5, 6, false, "-> (2) waited"},
		       {0, 6, 9, false, "-> chunk done"},
		       {0, 9, 0, true, "-> next barrier passed (waiting)"},
		       {1, 0, 7, false, "barrier -> copies issued"},
		       {1, 7, 8, false, "-> outputs stored"},
		       {1, 8, 9, false, "-> factors, chunk done"},
		       {1, 9, 0, true, "-> next barrier passed (waiting)"}},
		      9);
	}
	if (doState) {
		// The state walk on the same buffers: U^T in dvl's, the start state in dend's, H^T / V'^T in d16 / dvnew16.
		const int smem = gdnkcp::walkp::walk_planes_smem(VH);
		CK(cudaFuncSetAttribute(gdnkcp::walkp::gdn_state_walk_planes, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
		const dim3 grid(D / VH, NS, HV);
		// Marks: 0 past the chunk's barrier (both); 7 the next copies issued and (copiers) the previous chunk's
		// outputs stored (both); 8 the chunk's work done (both); state warps 1-6 as in gdn_walk_planes.cu.
		timed(tag, "gdn_state_walk_planes", "state walk", NC, grid, smem, d16,
		      [&] {
			      gdnkcp::walkp::gdn_state_walk_planes<<<grid, 256, smem>>>(wp, k, stride, k_rstd, dvl, gcum, d_tok0, d_len,
			                                                                d_seg0, d_segn, dend, nullptr, nullptr, dstart, d16,
			                                                                dvnew16, HQK, HV, VH, nullptr, nullptr);
		      },
		      {{0, 0, 7, false, "barrier -> U copies issued"},
		       {0, 7, 1, false, "-> S split, (1) issued"},
		       {0, 1, 2, false, "-> H^T staged"},
		       {0, 2, 3, false, "-> U read, (1) waited, U added"},
		       {0, 3, 4, false, "-> V' split, S decayed, (2) issued"},
		       {0, 4, 5, false, "-> V'^T staged"},
		       {0, 5, 6, false, "-> (2) waited"},
		       {0, 6, 8, false, "-> chunk done"},
		       {0, 8, 0, true, "-> next barrier passed (waiting)"},
		       {1, 0, 7, false, "barrier -> copies issued, outputs stored"},
		       {1, 7, 8, false, "-> factors, chunk done"},
		       {1, 8, 0, true, "-> next barrier passed (waiting)"}},
		      8);
	}
#if defined(GDNKCP_WALK_W128) && !defined(GDNKCP_WALK_TIMELINE)
	// With -DGDNKCP_WALK_W128 (scripts/walk-timeline.sh's third build): both walks at vh 128 too, through timed
	// without phases (every warp is a state warp and a copier there, so the timeline's two roles do not apply):
	// a change to the walks' shared code moves both widths, which the width rule weighs.
	const int VW = 128;
	const dim3 gridW(D / VW, NS, HV);
	if (doTape) {
		const int smem = gdnkcp::tapep::tape_planes_smem(VW);
		CK(cudaFuncSetAttribute(gdnkcp::tapep::gdn_tape_walk_planes_w128, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
		timed(tag, "gdn_tape_walk_planes_w128", "tape walk (vh 128)", NC, gridW, smem, d16,
		      [&] {
			      gdnkcp::tapep::gdn_tape_walk_planes_w128<<<gridW, 256, smem>>>(
			          wp, k, stride, k_rstd, q, stride, q_rstd, gcum, dvl, dout, d_tok0, d_len, d_seg0, d_segn, dend, nullptr,
			          nullptr, dstart, HQK, HV, VW, scale, nullptr, dvnew16, d16, nullptr);
		      },
		      {}, 0);
	}
	if (doState) {
		const int smem = gdnkcp::walkp::walk_planes_smem(VW);
		CK(cudaFuncSetAttribute(gdnkcp::walkp::gdn_state_walk_planes, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
		timed(tag, "gdn_state_walk_planes", "state walk (vh 128)", NC, gridW, smem, d16,
		      [&] {
			      gdnkcp::walkp::gdn_state_walk_planes<<<gridW, 256, smem>>>(wp, k, stride, k_rstd, dvl, gcum, d_tok0, d_len,
			                                                                 d_seg0, d_segn, dend, nullptr, nullptr, dstart, d16,
			                                                                 dvnew16, HQK, HV, VW, nullptr, nullptr);
		      },
		      {}, 0);
	}
	CK(cudaGetLastError());
#endif
	printf("[%s] ok\n", tag);
	return 0;
}
