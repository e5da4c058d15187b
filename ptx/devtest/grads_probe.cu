// grads_probe.cu: times gdn_chunk_grads_mma5 outside kcp on the backward's 32K shape (NC chunks of 64 tokens,
// default 512; HQK 16, HV 48; bf16 dq, dk, dv as the core stage writes them; l2norm on), random inputs, a
// CUDA-event median of 7 after 2 warm-ups. Built by scripts/grads-probe.sh on the GPU machine once per
// GDNKCP_GRADS_PROBE level of ptx/devtest/grads-probe.patch (0: the kernels as they are in ptx/src), to
// measure what the chunk gradients' operand loads cost before anything is built for them. Only level 0
// computes the gradients; the others time kernels whose operands are the wrong bytes. It times both
// gdn_chunk_grads_mma5 and gdn_chunk_grads_mma6 (V' and dV' as token slots, here random ones).
#include "devtest.cuh"

#include "gdn_chunk_grads_mma5.cu"

using namespace devtest;

int main(int argc, char** argv) {
	const int NC = argc > 1 ? atoi(argv[1]) : 512;
	const char* tag = argc > 2 ? argv[2] : "?";
	const int HQK = 16, HV = 48, T = NC * C;
	std::mt19937 rng(7);
	Chunks ch({std::vector<int>(NC, C)});
	auto rnd = [&](size_t n, float s) {
		std::vector<float> v(n);
		fill_normal(v, rng, s);
		return v;
	};
	auto rbf = [&](size_t n, float s) {
		std::vector<float> f = rnd(n, s);
		std::vector<uint16_t> v(n);
		for (size_t i = 0; i < n; ++i) v[i] = to_bf(f[i]);
		return v;
	};
	std::vector<float> qn((size_t)T * HQK * D), kn((size_t)T * HQK * D);
	unit_rows(qn, rng);
	unit_rows(kn, rng);
	float* d_qn = up(qn);
	float* d_kn = up(kn);
	uint16_t* d_v = up(rbf((size_t)T * HV * D, 1.f));
	float* d_g = up(gates(ch, HV, rng));
	std::vector<float> beta((size_t)T * HV);
	std::uniform_real_distribution<float> ub(0.1f, 0.9f);
	for (auto& x : beta) x = ub(rng);
	float* d_beta = up(beta);
	float* d_h = up(rnd((size_t)NC * HV * D * D, 0.3f));
	float* d_vnew = up(rnd((size_t)T * HV * D, 1.f));
	float* d_d = up(rnd((size_t)NC * HV * D * D, 0.3f));
	float* d_dvnew = up(rnd((size_t)T * HV * D, 1.f));
	uint16_t* d_dout = up(rbf((size_t)T * HV * D, 1.f));
	int* d_tok0 = up(ch.tok0);
	int* d_len = up(ch.len);
	std::vector<float> rstd((size_t)T * HQK);
	std::uniform_real_distribution<float> ur(0.5f, 2.f);
	for (auto& x : rstd) x = ur(rng);
	float* d_qr = up(rstd);
	float* d_kr = up(rstd);
	uint16_t *d_dq16, *d_dk16, *d_dv16;
	float *d_dg, *d_dbeta;
	CK(cudaMalloc(&d_dq16, (size_t)T * HQK * D * 2));
	CK(cudaMalloc(&d_dk16, (size_t)T * HQK * D * 2));
	CK(cudaMalloc(&d_dv16, (size_t)T * HV * D * 2));
	CK(cudaMalloc(&d_dg, (size_t)T * HV * 4));
	CK(cudaMalloc(&d_dbeta, (size_t)T * HV * 4));
	using namespace gdnkcp::gradmma;
	CK(cudaFuncSetAttribute(gdn_chunk_grads_mma5, cudaFuncAttributeMaxDynamicSharedMemorySize, kGradMMA5Smem));
	auto launch = [&] {
		gdn_chunk_grads_mma5<<<dim3(NC, HQK), kThreads, kGradMMA5Smem>>>(
		    d_qn, d_kn, reinterpret_cast<const __nv_bfloat16*>(d_v), HV * D, d_g, d_beta, d_h, d_vnew, d_d, d_dvnew,
		    reinterpret_cast<const __nv_bfloat16*>(d_dout), d_tok0, d_len, d_qr, d_kr, nullptr, nullptr, HQK * D, nullptr,
		    HV * D, d_dg, d_dbeta, HQK, HV, 1.f / std::sqrt((float)D), 1, reinterpret_cast<__nv_bfloat16*>(d_dq16),
		    reinterpret_cast<__nv_bfloat16*>(d_dk16), reinterpret_cast<__nv_bfloat16*>(d_dv16));
	};
	float* d_vp = up(rnd((size_t)NC * HV * D * C, 1.f));
	float* d_dvp = up(rnd((size_t)NC * HV * D * C, 1.f));
	CK(cudaFuncSetAttribute(gdn_chunk_grads_mma6, cudaFuncAttributeMaxDynamicSharedMemorySize, kGradMMA5Smem));
	auto launch6 = [&] {
		gdn_chunk_grads_mma6<<<dim3(NC, HQK), kThreads, kGradMMA5Smem>>>(
		    d_qn, d_kn, reinterpret_cast<const __nv_bfloat16*>(d_v), HV * D, d_g, d_beta, d_h,
		    d_vp, d_d, d_dvp,
		    reinterpret_cast<const __nv_bfloat16*>(d_dout), d_tok0, d_len, d_qr, d_kr, nullptr, nullptr, HQK * D, nullptr,
		    HV * D, d_dg, d_dbeta, HQK, HV, 1.f / std::sqrt((float)D), 1, reinterpret_cast<__nv_bfloat16*>(d_dq16),
		    reinterpret_cast<__nv_bfloat16*>(d_dk16), reinterpret_cast<__nv_bfloat16*>(d_dv16));
	};
	{
		float med6, lo6, hi6;
		launch6();
		CK(cudaDeviceSynchronize());
		time_ms(launch6, 7, med6, lo6, hi6);
		printf("[%s] chunk grads mma6 (token slots) %d chunks median %.3f ms (min %.3f max %.3f)\n", tag, NC, med6, lo6, hi6);
	}
	launch();
	CK(cudaDeviceSynchronize());
	std::vector<float> dg = down(d_dg, (size_t)T * HV);
	double s = 0;
	for (float x : dg) s += std::fabs(x);
	float med, lo, hi;
	time_ms(launch, 7, med, lo, hi);
	printf("[%s] chunk grads %d chunks HQK %d HV %d median %.3f ms (min %.3f max %.3f) %.2f us/CTA-round; |dg| sum %.4g\n", tag,
	       NC, HQK, HV, med, lo, hi, 1000.0 * med / std::ceil(NC * HQK / 132.0), s);
	return 0;
}
