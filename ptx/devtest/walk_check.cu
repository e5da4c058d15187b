// walk_check.cu: a device-side check and timing of gdn_state_walk_mma16 outside kcp, for the sm_90a
// wgmma body (gdn_walk_wgmma.cu) and, built with -DGDNKCP_NO_WGMMA, the mma.sync body. Run by
// scripts/walk-check.sh on the GPU machine (nvcc there; no Go needed).
//
// Check: three segments (5 full chunks; one chunk of 17 tokens; chunks of 64, 64 and 40 tokens), HV 6
// over HQK 2, random W, U, unit kn rows, in-chunk cumulative gates, random start states. Every output
// (h_out, vnew, final_state, h16, vnew16) poisoned with NaN first, then compared normwise with a float64
// recurrence on the same fp32 inputs; vh 64 and vh 128 must agree bit for bit; three runs too.
// Timing: one segment of NC chunks (default 512: 32,768 tokens), HV 48 / HQK 16, vh 64 and vh 128,
// the forward's outputs (h16, vnew16) and the backward's (all four): CUDA-event medians of 7 after 2
// warm-ups. Prints "check ok" / "check FAILED" and a table.
#include "devtest.cuh"

#include "../src/gdn_walk_mma.cu"

using namespace devtest;

struct Problem {
	Chunks c;
	int HV, HQK;
	std::vector<float> w, u, kn, gcum, start;
};

static Problem make(const std::vector<std::vector<int>>& segs, int HV, int HQK, unsigned seed) {
	Problem p{Chunks(segs), HV, HQK};
	std::mt19937 rng(seed);
	const size_t T = p.c.T;
	p.w.resize(T * HV * D), p.u.resize(T * HV * D), p.kn.resize(T * HQK * D), p.start.resize((size_t)p.c.NS * HV * D * D);
	fill_normal(p.w, rng, 0.09f);
	fill_normal(p.u, rng, 1.f);
	unit_rows(p.kn, rng);
	p.gcum = gates(p.c, HV, rng);
	fill_normal(p.start, rng, 0.3f);
	return p;
}

struct Outs {
	std::vector<float> h, vnew, fin;
	std::vector<uint16_t> h16, v16;
};

// reference: the recurrence in float64 on the fp32 inputs (Kt as the walk forms it: kn * e in fp32).
static Outs reference(const Problem& p) {
	Outs o;
	o.h.assign((size_t)p.c.NC * p.HV * D * D, 0.f);
	o.vnew.assign((size_t)p.c.T * p.HV * D, 0.f);
	o.fin.assign((size_t)p.c.NS * p.HV * D * D, 0.f);
	std::vector<double> S(D * D), V(C * D), Kt(C * D);
	for (int sg = 0; sg < p.c.NS; ++sg)
		for (int h = 0; h < p.HV; ++h) {
			const int qh = h / (p.HV / p.HQK);
			for (int e = 0; e < D * D; ++e) S[e] = p.start[((size_t)sg * p.HV + h) * D * D + e];
			for (int ci = 0; ci < p.c.segn[sg]; ++ci) {
				const int c = p.c.seg0[sg] + ci, t0 = p.c.tok0[c], n = p.c.len[c];
				for (int e = 0; e < D * D; ++e) o.h[((size_t)c * p.HV + h) * D * D + e] = (float)S[e];
				const float gl = p.gcum[(size_t)(t0 + n - 1) * p.HV + h];
				for (int i = 0; i < n; ++i) {
					const float f = expf(gl - p.gcum[(size_t)(t0 + i) * p.HV + h]);
					for (int k = 0; k < D; ++k) Kt[i * D + k] = (double)(p.kn[((size_t)(t0 + i) * p.HQK + qh) * D + k] * f);
					for (int v = 0; v < D; ++v) {
						double a = p.u[((size_t)(t0 + i) * p.HV + h) * D + v];
						for (int k = 0; k < D; ++k) a -= (double)p.w[((size_t)(t0 + i) * p.HV + h) * D + k] * S[k * D + v];
						V[i * D + v] = a;
						o.vnew[((size_t)(t0 + i) * p.HV + h) * D + v] = (float)a;
					}
				}
				const double dec = std::exp((double)gl);
				for (int k = 0; k < D; ++k)
					for (int v = 0; v < D; ++v) {
						double a = dec * S[k * D + v];
						for (int i = 0; i < n; ++i) a += Kt[i * D + k] * V[i * D + v];
						S[k * D + v] = a;
					}
			}
			for (int e = 0; e < D * D; ++e) o.fin[((size_t)sg * p.HV + h) * D * D + e] = (float)S[e];
		}
	return o;
}

struct Dev {
	float *w, *u, *kn, *gcum, *start, *h, *vnew, *fin;
	uint16_t *h16, *v16;
	int *tok0, *len, *seg0, *segn;
	size_t nh, nv, nf, nh16, nv16;
};

static Dev upload(const Problem& p) {
	Dev d;
	d.w = up(p.w), d.u = up(p.u), d.kn = up(p.kn), d.gcum = up(p.gcum), d.start = up(p.start);
	d.tok0 = up(p.c.tok0), d.len = up(p.c.len), d.seg0 = up(p.c.seg0), d.segn = up(p.c.segn);
	d.nh = (size_t)p.c.NC * p.HV * D * D, d.nv = (size_t)p.c.T * p.HV * D, d.nf = (size_t)p.c.NS * p.HV * D * D;
	d.nh16 = d.nh, d.nv16 = (size_t)p.c.NC * p.HV * D * C;
	CK(cudaMalloc(&d.h, d.nh * 4));
	CK(cudaMalloc(&d.vnew, d.nv * 4));
	CK(cudaMalloc(&d.fin, d.nf * 4));
	CK(cudaMalloc(&d.h16, d.nh16 * 2));
	CK(cudaMalloc(&d.v16, d.nv16 * 2));
	return d;
}

static void launch(const Problem& p, const Dev& d, int vh, bool fp32, cudaStream_t st = 0) {
	dim3 grid(128 / vh, p.c.NS, p.HV);
	const int smem = gdnkcp::walkmma::walk_mma_smem(vh);
	gdnkcp::walkmma::gdn_state_walk_mma16<<<grid, 256, smem, st>>>(
	    d.w, d.u, d.kn, d.gcum, d.tok0, d.len, d.seg0, d.segn, d.start, fp32 ? d.h : nullptr, fp32 ? d.vnew : nullptr,
	    d.fin, reinterpret_cast<__nv_bfloat16*>(d.h16), reinterpret_cast<__nv_bfloat16*>(d.v16), p.HQK, p.HV, vh);
}

static void poison(const Dev& d) {
	CK(cudaMemset(d.h, 0xff, d.nh * 4));
	CK(cudaMemset(d.vnew, 0xff, d.nv * 4));
	CK(cudaMemset(d.fin, 0xff, d.nf * 4));
	CK(cudaMemset(d.h16, 0xff, d.nh16 * 2));
	CK(cudaMemset(d.v16, 0xff, d.nv16 * 2));
}

#ifdef GDNKCP_WALK_TIMELINE
// timeline runs the walk once at vh 64 (h16 + v16) with the marks on and prints its phases (the state warp:
// warp 0; a converting warp: warp 4; from mark 8 to the next chunk's mark 0: the wait at the barrier).
static void timeline(const Problem& p, const Dev& d, const char* tag) {
	const int NC = p.c.NC;
	const std::vector<long long> tl = timeline_run(NC, [&] { launch(p, d, 64, false); });
	timeline_print(tag, "state walk", tl, kTimelineMarks, NC,
	               {{0, 0, 1, false, "split S, issue (1)"},
	                {0, 1, 2, false, "H stores"},
	                {0, 2, 3, false, "wait (1), + U"},
	                {0, 3, 4, false, "split V', decay, issue (2)"},
	                {0, 4, 5, false, "V' stores"},
	                {0, 5, 6, false, "wait (2)"},
	                {0, 6, 7, false, "cp.async wait"},
	                {0, 7, 8, false, "load U, copies, gates"},
	                {0, 8, 0, true, "barrier"},
	                {1, 0, 7, false, "convert (from the barrier)"},
	                {1, 7, 8, false, "copies, gates"},
	                {1, 8, 0, true, "barrier"}});
}
#endif

static Outs fetch(const Dev& d) {
	Outs o;
	o.h.resize(d.nh), o.vnew.resize(d.nv), o.fin.resize(d.nf), o.h16.resize(d.nh16), o.v16.resize(d.nv16);
	CK(cudaMemcpy(o.h.data(), d.h, d.nh * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(o.vnew.data(), d.vnew, d.nv * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(o.fin.data(), d.fin, d.nf * 4, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(o.h16.data(), d.h16, d.nh16 * 2, cudaMemcpyDeviceToHost));
	CK(cudaMemcpy(o.v16.data(), d.v16, d.nv16 * 2, cudaMemcpyDeviceToHost));
	return o;
}

static bool same(const Outs& a, const Outs& b) {
	return a.h == b.h && a.fin == b.fin && a.h16 == b.h16 && a.v16 == b.v16 &&
	       memcmp(a.vnew.data(), b.vnew.data(), a.vnew.size() * 4) == 0;
}

int main(int argc, char** argv) {
	const int NCt = argc > 1 ? atoi(argv[1]) : 512;
	const char* tag = argc > 2 ? argv[2] : "?";
	CK(cudaFuncSetAttribute(gdnkcp::walkmma::gdn_state_walk_mma16, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                        gdnkcp::walkmma::walk_mma_smem(64)));
	bool ok = true;
	{
		Problem p = make({{64, 64, 64, 64, 64}, {17}, {64, 64, 40}}, 6, 2, 7);
		Outs ref = reference(p);
		Dev d = upload(p);
		Outs o[2];
		for (int k = 0; k < 2; ++k) {
			poison(d);
			launch(p, d, k ? 128 : 64, true);
			CK(cudaDeviceSynchronize());
			o[k] = fetch(d);
		}
		// vnew rows of tokens no chunk covers: none here (chunks tile T); h16 / v16 to floats against ref.
		std::vector<float> h16f(o[0].h16.size()), refh16(o[0].h16.size()), v16f(o[0].v16.size()), refv16(o[0].v16.size(), 0.f);
		for (int c = 0; c < p.c.NC; ++c)
			for (int h = 0; h < p.HV; ++h)
				for (int v = 0; v < D; ++v) {
					for (int k = 0; k < D; ++k) {
						const size_t e = (((size_t)c * p.HV + h) * D + v) * D + k;
						h16f[e] = bf(o[0].h16[e]);
						refh16[e] = ref.h[((size_t)c * p.HV + h) * D * D + k * D + v];
					}
					for (int i = 0; i < C; ++i) {
						const size_t e = (((size_t)c * p.HV + h) * D + v) * C + i;
						v16f[e] = bf(o[0].v16[e]);
						if (i < p.c.len[c]) refv16[e] = ref.vnew[((size_t)(p.c.tok0[c] + i) * p.HV + h) * D + v];
						else if (o[0].v16[e] != 0) ok = false, printf("vnew16 chunk %d token %d not zero\n", c, i);
					}
				}
		const double eh = err(o[0].h, ref.h), ev = err(o[0].vnew, ref.vnew), ef = err(o[0].fin, ref.fin);
		const double eh16 = err(h16f, refh16), ev16 = err(v16f, refv16);
		const bool widths = same(o[0], o[1]);
		poison(d);
		launch(p, d, 64, true);
		CK(cudaDeviceSynchronize());
		const bool rerun = same(o[0], fetch(d));
		printf("[%s] errors (normwise vs float64): h %.2e  vnew %.2e  final %.2e  h16 %.2e  vnew16 %.2e; vh64==vh128 %s; rerun %s\n",
		       tag, eh, ev, ef, eh16, ev16, widths ? "bitwise" : "DIFFER", rerun ? "bitwise" : "DIFFER");
		ok = ok && eh < 3e-5 && ev < 3e-5 && ef < 3e-5 && eh16 < 5e-3 && ev16 < 5e-3 && widths && rerun;
	}
	printf("[%s] check %s\n", tag, ok ? "ok" : "FAILED");
	{
		std::vector<int> sg(NCt, 64);
		Problem p = make({sg}, 48, 16, 11);
		Dev d = upload(p);
		for (int fp32 = 0; fp32 < 2; ++fp32)
			for (int vh : {64, 128}) {
				float med, lo, hi;
				time_ms([&] { launch(p, d, vh, fp32); }, 7, med, lo, hi);
				printf("[%s] time %d chunks HV 48 vh %3d %-14s median %.3f ms (min %.3f max %.3f) %.2f us/chunk\n", tag, NCt, vh,
				       fp32 ? "h16+v16+fp32" : "h16+v16", med, lo, hi, 1000.0 * med / NCt);
			}
#ifdef GDNKCP_WALK_TIMELINE
		timeline(p, d, tag);
#endif
	}
	return ok ? 0 : 1;
}
