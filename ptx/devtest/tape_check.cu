// tape_check.cu: a device-side check and timing of gdn_tape_walk_mma outside kcp: the sm_90a wgmma body
// (gdn_bwalk_wgmma.cu, where the sources have it) and, built with -DGDNKCP_NO_WGMMA, the mma.sync body.
// Run by scripts/walk-check.sh on the GPU machine (nvcc there; no Go needed).
//
// Check: segments of 4 full chunks, one chunk of 9 tokens, chunks of 64, 64 and 33 tokens; HV 6 over HQK
// 2; random W, Kt, unit q rows, in-chunk cumulative gates, dV'_local, bf16 dO and terminal adjoints.
// d_chunk, dvnew and dstart poisoned first, then compared normwise with the float64 recurrence
//   dV'_i = dvl_i + Kt_i D,   D <- e^gl D - W^T dV' + Qg^T dO,   Qg_i = q_i fp32(scale e^gamma_i)
// on the same fp32 / bf16 inputs; vh 64 and vh 128 must agree bit for bit, and a rerun too; the same runs
// write D^T as bf16 (d16), which must be the rn rounding of their fp32 D, element for element.
// Timing: one segment of NC chunks (default 512: 32,768 tokens), HV 48 / HQK 16, vh 64 and 128, the
// backward's outputs three ways (fp32 rows, dV' token slots, and kcp's v5 core stage: D^T and dV'^T only as
// bf16): CUDA-event medians of 7 after 2 warm-ups. Prints "check ok" / "check FAILED".
#include "devtest.cuh"

#include "../src/gdn_bwalk_mma.cu"

using namespace devtest;

struct Problem {
	Chunks c;
	int HV, HQK;
	float scale;
	std::vector<float> w, kt, qn, gcum, dvl, dend;
	std::vector<uint16_t> dout;
};

static Problem make(const std::vector<std::vector<int>>& segs, int HV, int HQK, unsigned seed) {
	Problem p{Chunks(segs), HV, HQK, 1.f / std::sqrt((float)D)};
	std::mt19937 rng(seed);
	const size_t T = p.c.T;
	p.w.resize(T * HV * D), p.kt.resize(T * HV * D), p.qn.resize(T * HQK * D), p.dvl.resize(T * HV * D);
	p.dend.resize((size_t)p.c.NS * HV * D * D);
	fill_normal(p.w, rng, 0.09f);
	fill_normal(p.kt, rng, 0.09f);
	unit_rows(p.qn, rng);
	p.gcum = gates(p.c, HV, rng);
	fill_normal(p.dvl, rng, 1.f);
	fill_normal(p.dend, rng, 0.3f);
	std::vector<float> o(T * HV * D);
	fill_normal(o, rng, 1.f);
	p.dout.resize(o.size());
	for (size_t i = 0; i < o.size(); ++i) p.dout[i] = to_bf(o[i]);
	return p;
}

struct Outs {
	std::vector<float> dchunk, dvnew, dstart;
	std::vector<uint16_t> d16;  // the device runs only (Both): D^T as bf16
};

static Outs reference(const Problem& p) {
	const Chunks& c = p.c;
	const int HV = p.HV;
	Outs o;
	o.dchunk.assign((size_t)c.NC * HV * D * D, 0.f);
	o.dvnew.assign((size_t)c.T * HV * D, 0.f);
	o.dstart.assign((size_t)c.NS * HV * D * D, 0.f);
	std::vector<double> Dm(D * D), V(C * D), Qg(C * D);
	for (int sg = 0; sg < c.NS; ++sg)
		for (int h = 0; h < HV; ++h) {
			const int qh = h / (HV / p.HQK);
			for (int e = 0; e < D * D; ++e) Dm[e] = p.dend[((size_t)sg * HV + h) * D * D + e];
			for (int ci = c.segn[sg] - 1; ci >= 0; --ci) {
				const int ch = c.seg0[sg] + ci, t0 = c.tok0[ch], n = c.len[ch];
				for (int e = 0; e < D * D; ++e) o.dchunk[((size_t)ch * HV + h) * D * D + e] = (float)Dm[e];
				const float gl = p.gcum[(size_t)(t0 + n - 1) * HV + h];
				for (int i = 0; i < n; ++i) {
					const size_t r = (size_t)(t0 + i) * HV + h;
					const float qf = p.scale * expf(p.gcum[r]);
					for (int k = 0; k < D; ++k) Qg[i * D + k] = (double)(p.qn[((size_t)(t0 + i) * p.HQK + qh) * D + k] * qf);
					for (int v = 0; v < D; ++v) {
						double a = p.dvl[r * D + v];
						for (int k = 0; k < D; ++k) a += (double)p.kt[r * D + k] * Dm[k * D + v];
						V[i * D + v] = a;
						o.dvnew[r * D + v] = (float)a;
					}
				}
				const double dec = std::exp((double)gl);
				for (int k = 0; k < D; ++k)
					for (int v = 0; v < D; ++v) {
						double a = dec * Dm[k * D + v];
						for (int i = 0; i < n; ++i) {
							const size_t r = (size_t)(t0 + i) * HV + h;
							a += -(double)p.w[r * D + k] * V[i * D + v] + Qg[i * D + k] * (double)bf(p.dout[r * D + v]);
						}
						Dm[k * D + v] = a;
					}
			}
			for (int e = 0; e < D * D; ++e) o.dstart[((size_t)sg * HV + h) * D * D + e] = (float)Dm[e];
		}
	return o;
}

struct Dev {
	float *w, *kt, *qn, *gcum, *dvl, *dend, *dchunk, *dvnew, *dstart;
	uint16_t* dout;
	float* dvnewp;  // dV' as token slots: 32 KB a (chunk, value head)
	uint16_t *d16, *dv16;  // D^T and dV'^T as bf16 (kcp's v5 core stage): 32 KB and 16 KB a (chunk, value head)
	int *tok0, *len, *seg0, *segn;
	size_t nc, nv, ns;
};

static Dev upload(const Problem& p) {
	Dev d;
	d.w = up(p.w), d.kt = up(p.kt), d.qn = up(p.qn), d.gcum = up(p.gcum), d.dvl = up(p.dvl), d.dend = up(p.dend);
	d.dout = up(p.dout);
	d.tok0 = up(p.c.tok0), d.len = up(p.c.len), d.seg0 = up(p.c.seg0), d.segn = up(p.c.segn);
	d.nc = (size_t)p.c.NC * p.HV * D * D, d.nv = (size_t)p.c.T * p.HV * D, d.ns = (size_t)p.c.NS * p.HV * D * D;
	CK(cudaMalloc(&d.dchunk, d.nc * 4));
	CK(cudaMalloc(&d.dvnew, d.nv * 4));
	CK(cudaMalloc(&d.dvnewp, (size_t)p.c.NC * p.HV * 32768));
	CK(cudaMalloc(&d.dstart, d.ns * 4));
	CK(cudaMalloc(&d.d16, d.nc * 2));
	CK(cudaMalloc(&d.dv16, (size_t)p.c.NC * p.HV * D * C * 2));
	return d;
}

// Mode: what the walk writes. Fp32: D and dV' as fp32 (d_chunk, dvnew rows); Slots: D as fp32, dV' only as
// token slots; Bf16: D^T and dV'^T only as bf16 (d16, dvnew16: kcp's v5 core stage); Both: Fp32 and d16
// together (the check compares d16 with d_chunk).
enum Mode { Fp32, Slots, Bf16, Both };
static const char* mode_name(Mode m) { return m == Fp32 ? "fp32 " : m == Slots ? "slots" : m == Bf16 ? "bf16 " : "both "; }

static void launch(const Problem& p, const Dev& d, int vh, Mode m = Fp32) {
	dim3 grid(128 / vh, p.c.NS, p.HV);
	const bool f32 = m == Fp32 || m == Both;
	gdnkcp::bwalkmma::gdn_tape_walk_mma<<<grid, 256, gdnkcp::bwalkmma::bwalk_mma_smem(vh)>>>(
	    d.w, d.kt, d.qn, d.gcum, d.dvl, reinterpret_cast<const __nv_bfloat16*>(d.dout), d.tok0, d.len, d.seg0, d.segn,
	    d.dend, m == Bf16 ? nullptr : d.dchunk, f32 ? d.dvnew : nullptr, d.dstart, p.HQK, p.HV, vh, p.scale,
	    m == Slots ? d.dvnewp : nullptr, m == Bf16 ? reinterpret_cast<__nv_bfloat16*>(d.dv16) : nullptr,
	    m == Bf16 || m == Both ? reinterpret_cast<__nv_bfloat16*>(d.d16) : nullptr, nullptr);
}

#ifdef GDNKCP_WALK_TIMELINE
// timeline runs the tape walk once at vh 64 with the marks on and prints its phases (warp 0 holds state,
// warp 4 does not at vh 64; both convert): chunk index ci counts from the segment's last chunk.
static void timeline(const Problem& p, const Dev& d, const char* tag) {
	const int NC = p.c.NC;
	const std::vector<long long> tl = timeline_run(NC, [&] { launch(p, d, 64); });
	timeline_print(tag, "tape walk", tl, kTimelineMarks, NC,
	               {{0, 0, 1, false, "split D, issue (1)"},
	                {0, 1, 2, false, "D stores"},
	                {0, 2, 3, false, "wait (1)"},
	                {0, 3, 4, false, "split dV', decay, issue (2)"},
	                {0, 4, 5, false, "dV' stores"},
	                {0, 5, 6, false, "wait (2)"},
	                {0, 6, 7, false, "load dvl"},
	                {0, 7, 8, false, "barrier (2)"},
	                {0, 8, 9, false, "convert"},
	                {0, 9, 10, false, "copies, gates"},
	                {0, 10, 0, true, "barrier (1)"},
	                {1, 0, 7, false, "idle through the products"},
	                {1, 7, 8, false, "barrier (2)"},
	                {1, 8, 9, false, "convert"},
	                {1, 9, 10, false, "copies, gates"},
	                {1, 10, 0, true, "barrier (1)"}});
}
#endif

static Outs run(const Problem& p, const Dev& d, int vh) {
	CK(cudaMemset(d.dchunk, 0xff, d.nc * 4));
	CK(cudaMemset(d.dvnew, 0xff, d.nv * 4));
	CK(cudaMemset(d.dstart, 0xff, d.ns * 4));
	CK(cudaMemset(d.d16, 0xff, d.nc * 2));
	launch(p, d, vh, Both);
	CK(cudaDeviceSynchronize());
	Outs o{down(d.dchunk, d.nc), down(d.dvnew, d.nv), down(d.dstart, d.ns), {}};
	o.d16.resize(d.nc);
	CK(cudaMemcpy(o.d16.data(), d.d16, d.nc * 2, cudaMemcpyDeviceToHost));
	return o;
}

static bool same(const Outs& a, const Outs& b) {
	auto eq = [](const std::vector<float>& x, const std::vector<float>& y) {
		return x.size() == y.size() && memcmp(x.data(), y.data(), x.size() * 4) == 0;
	};
	return eq(a.dchunk, b.dchunk) && eq(a.dvnew, b.dvnew) && eq(a.dstart, b.dstart) && a.d16 == b.d16;
}

int main(int argc, char** argv) {
	const int NCt = argc > 1 ? atoi(argv[1]) : 512;
	const char* tag = argc > 2 ? argv[2] : "?";
	CK(cudaFuncSetAttribute(gdnkcp::bwalkmma::gdn_tape_walk_mma, cudaFuncAttributeMaxDynamicSharedMemorySize,
	                        gdnkcp::bwalkmma::bwalk_mma_smem(64)));
	bool ok = true;
	{
		Problem p = make({{64, 64, 64, 64}, {9}, {64, 64, 33}}, 6, 2, 5);
		Outs ref = reference(p);
		Dev d = upload(p);
		Outs a = run(p, d, 64), b = run(p, d, 128), a2 = run(p, d, 64);
		const double ec = err(a.dchunk, ref.dchunk), ev = err(a.dvnew, ref.dvnew), es = err(a.dstart, ref.dstart);
		const bool widths = same(a, b), rerun = same(a, a2);
		// d16: every chunk's D^T as bf16, each element the rn rounding of the same run's fp32 D (d_chunk).
		long bad16 = 0;
		for (size_t blk = 0; blk < a.d16.size() / (D * D); ++blk)
			for (int v = 0; v < D; ++v)
				for (int k = 0; k < D; ++k)
					bad16 += a.d16[(blk * D + v) * D + k] != to_bf(a.dchunk[(blk * D + k) * D + v]);
		printf("[%s] tape d16 == bf16(d_chunk^T): %s (%ld of %zu differ)\n", tag, bad16 == 0 ? "yes" : "NO", bad16, a.d16.size());
		printf("[%s] tape errors (normwise vs float64): d_chunk %.2e  dvnew %.2e  dstart %.2e; vh64==vh128 %s; rerun %s\n", tag,
		       ec, ev, es, widths ? "bitwise" : "DIFFER", rerun ? "bitwise" : "DIFFER");
		ok = ec < 3e-5 && ev < 3e-5 && es < 3e-5 && widths && rerun && bad16 == 0;
	}
	printf("[%s] tape check %s\n", tag, ok ? "ok" : "FAILED");
	{
		std::vector<int> sg(NCt, 64);
		Problem p = make({sg}, 48, 16, 9);
		Dev d = upload(p);
		for (Mode m : {Fp32, Slots, Bf16})
			for (int vh : {64, 128}) {
				float med, lo, hi;
				time_ms([&] { launch(p, d, vh, m); }, 7, med, lo, hi);
				printf("[%s] tape time %d chunks HV 48 vh %3d dV' %s median %.3f ms (min %.3f max %.3f) %.2f us/chunk\n", tag,
				       NCt, vh, mode_name(m), med, lo, hi, 1000.0 * med / NCt);
			}
#ifdef GDNKCP_WALK_TIMELINE
		timeline(p, d, tag);
#endif
	}
	return ok ? 0 : 1;
}
