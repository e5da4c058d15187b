// Runs gdn_conv1d_silu_fwd and gdn_poison_u32 from ptx/src on the CPU
// emulator (emu.h) with the launch shapes of each case, and writes each case's
// inputs and outputs to DIR/caseN.bin for the Go test to compare with
// internal/convref. Usage: harness DIR
// (The GDN kernels run through runner.cpp, with inputs written by the Go test.)
#include "conv1d.cu"
#include "emu.h"
#include "util.cu"

#include <stdint.h>
#include <stdio.h>
#include <vector>

static uint64_t rng_state = 88172645463325252ull;
static double urand() {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static unsigned short bf(double v) { return __float2bfloat16_rn(static_cast<float>(v)).x; }

template <typename F>
static void launch(const char* label, unsigned grid, unsigned block, F kernel) {
  emu::launch(label, {grid, 1, 1}, {block, 1, 1}, 0, kernel);
}

struct Case {
  int C;
  std::vector<int> lens;  // segment lengths, in buffer order
  unsigned grid;          // 0: one work item per thread
  unsigned block;
  int misalign;           // elements by which x is shifted off 16-byte alignment
  int bad_token;          // token given an out-of-range segment, or -1
  bool zero_halo;
};

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: harness DIR\n");
    return 2;
  }
  const std::vector<Case> cases = {
      {64, {5, 1, 0, 40, 3, 20}, 1, 32, 0, -1, false},  // vector path, heavy grid-stride
      {64, {5, 1, 0, 40, 3, 20}, 0, 256, 0, -1, true},  // vector path, one item per thread
      {20, {7, 2, 33, 1}, 3, 64, 0, -1, false},         // C % 8 != 0: scalar path
      {64, {17, 16, 15, 2}, 2, 128, 1, -1, false},      // misaligned x: scalar path
      {8, {1, 1, 1, 1, 30}, 1, 1, 0, -1, false},        // one thread, segments shorter than the halo
      {24, {10, 10}, 0, 256, 0, 12, false},             // a token with a bad segment index is skipped
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& cs = cases[ci];
    const int C = cs.C, nseg = static_cast<int>(cs.lens.size());
    int T = 0;
    std::vector<int> ss, sl, ts;
    for (int s = 0; s < nseg; ++s) {
      ss.push_back(T);
      sl.push_back(cs.lens[s]);
      for (int i = 0; i < cs.lens[s]; ++i) ts.push_back(s);
      T += cs.lens[s];
    }
    if (cs.bad_token >= 0) ts[cs.bad_token] = 99;
    std::vector<unsigned short> xs(T * C + 16), ws(C * 4 + 16), hs(nseg * 3 * C + 16), ys(T * C + 16);
    auto align16 = [](unsigned short* p) {
      return reinterpret_cast<unsigned short*>((reinterpret_cast<uintptr_t>(p) + 15) & ~uintptr_t(15));
    };
    unsigned short* x = align16(xs.data()) + cs.misalign;
    unsigned short* w = align16(ws.data());
    unsigned short* h = align16(hs.data());
    unsigned short* y = align16(ys.data());
    for (int i = 0; i < T * C; ++i) x[i] = bf(urand() * 8 - 4);
    for (int i = 0; i < C * 4; ++i) w[i] = bf(urand() * 2 - 1);
    for (int i = 0; i < nseg * 3 * C; ++i) h[i] = cs.zero_halo ? 0 : bf(urand() * 8 - 4);

    // Poison y (as 32-bit words) with the poison kernel, then run the conv.
    unsigned* y32 = reinterpret_cast<unsigned*>(y);
    const unsigned long long words = (static_cast<unsigned long long>(T) * C + 1) / 2;
    launch("poison", 2, 7, [&] { gdn_poison_u32(y32, words, 0xFFFFFFFFu); });

    const int groups = (C % 8 == 0 && cs.misalign == 0) ? C / 8 : C;
    const long long items = static_cast<long long>(groups) * ((T + 15) / 16);
    const unsigned grid = cs.grid ? cs.grid : static_cast<unsigned>((items + cs.block - 1) / cs.block);
    auto* xb = reinterpret_cast<const __nv_bfloat16*>(x);
    auto* wb = reinterpret_cast<const __nv_bfloat16*>(w);
    auto* hb = reinterpret_cast<const __nv_bfloat16*>(h);
    auto* yb = reinterpret_cast<__nv_bfloat16*>(y);
    launch("conv", grid, cs.block, [&] { gdn_conv1d_silu_fwd(xb, wb, hb, ss.data(), sl.data(), ts.data(), yb, T, C, nseg); });

    char name[4096];
    snprintf(name, sizeof name, "%s/case%zu.bin", argv[1], ci);
    FILE* f = fopen(name, "wb");
    if (!f) {
      perror(name);
      return 1;
    }
    const int hdr[4] = {T, C, nseg, cs.bad_token};
    fwrite(hdr, 4, 4, f);
    fwrite(x, 2, T * C, f);
    fwrite(w, 2, C * 4, f);
    fwrite(h, 2, nseg * 3 * C, f);
    fwrite(ss.data(), 4, nseg, f);
    fwrite(sl.data(), 4, nseg, f);
    fwrite(ts.data(), 4, T, f);
    fwrite(y, 2, T * C, f);
    fclose(f);
    printf("case %zu: T=%d C=%d nseg=%d grid=%u block=%u lanes=%d\n", ci, T, C, nseg, grid, cs.block, C / groups);
  }
  return 0;
}
