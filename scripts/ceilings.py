"""Measure the two ceilings of the GPU machine (METHOD.md): device-to-device copy bandwidth
(bytes read + written) and the bf16 matrix rate on random data. CUDA-event medians after warm-up.
Run there: python3 scripts/ceilings.py"""
import statistics
import torch


def median_ms(fn, warmup=5, reps=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


n = 1 << 30  # 2 GiB of bf16 per buffer
src = torch.randn(n, dtype=torch.bfloat16, device="cuda")
dst = torch.empty_like(src)
ms = median_ms(lambda: dst.copy_(src))
copy_tbs = 2 * src.numel() * 2 / (ms * 1e-3) / 1e12
m = 8192
a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
ms_mm = median_ms(lambda: a @ b)
tflops = 2 * m**3 / (ms_mm * 1e-3) / 1e12
print(f"ceiling copy_d2d {copy_tbs:.2f} TB/s ({ms:.3f} ms for 2x{src.numel()*2/2**30:.0f} GiB)")
print(f"ceiling bf16_gemm_8192 {tflops:.0f} TFLOP/s ({ms_mm:.3f} ms)")
