// emu.cpp: the fiber scheduler of emu.h.
#include "emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

dim3 gridDim, blockDim, blockIdx, threadIdx;

namespace emu {
namespace {

enum State { kReady, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Fiber {
  ucontext_t ctx;
  State state;
  dim3 tid;
  unsigned lin;  // linear thread index: x + y*bx + z*bx*by
};

constexpr size_t kStack = 256 << 10;  // per fiber, with a guard page below
constexpr unsigned kMaxThreads = 1024;

std::vector<std::pair<unsigned*, size_t>>& smems() {
  static std::vector<std::pair<unsigned*, size_t>> s;
  return s;
}

Fiber fibers[kMaxThreads];
char* stacks = nullptr;
size_t page = 4096;
ucontext_t scheduler;
int current = -1;  // the running fiber, -1 in the scheduler
const std::function<void()>* body = nullptr;
unsigned slots[kMaxThreads / 32][32];
std::string cur_label;
bool in_block = false;

void entry(int i) {
  (*body)();
  fibers[i].state = kDone;  // uc_link returns to the scheduler
}

void yield(State s) {
  Fiber& f = fibers[current];
  f.state = s;
  if (swapcontext(&f.ctx, &scheduler) != 0) fail("swapcontext failed");
}

void alloc_stacks() {
  if (stacks) return;
  page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t total = kMaxThreads * kStack;
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) fail("cannot map the fiber stacks");
  stacks = static_cast<char*>(p);
  for (unsigned i = 0; i < kMaxThreads; ++i)  // a stack overflow faults instead of corrupting
    if (mprotect(stacks + i * kStack, page, PROT_NONE) != 0) fail("cannot protect a stack guard page");
}

// run_block runs every fiber of the current block to its end, in ascending
// thread order between barriers, or descending when reverse is set.
void run_block(unsigned n, bool reverse, Stats& st) {
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.state = kReady;
    f.lin = i;
    f.tid = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    if (getcontext(&f.ctx) != 0) fail("getcontext failed");
    f.ctx.uc_stack.ss_sp = stacks + i * kStack + page;
    f.ctx.uc_stack.ss_size = kStack - page;
    f.ctx.uc_link = &scheduler;
    makecontext(&f.ctx, reinterpret_cast<void (*)()>(entry), 1, static_cast<int>(i));
  }
  for (;;) {
    for (unsigned x = 0; x < n; ++x) {
      const unsigned i = reverse ? n - 1 - x : x;
      if (fibers[i].state != kReady) continue;
      current = static_cast<int>(i);
      threadIdx = fibers[i].tid;
      if (swapcontext(&scheduler, &fibers[i].ctx) != 0) fail("swapcontext failed");
    }
    current = -1;
    unsigned done = 0, at_block = 0, at_warp = 0;
    for (unsigned i = 0; i < n; ++i) {
      done += fibers[i].state == kDone;
      at_block += fibers[i].state == kAtBlockBarrier;
      at_warp += fibers[i].state == kAtWarpBarrier;
    }
    if (done == n) return;
    bool released = false;
    for (unsigned w = 0; w * 32 < n; ++w) {
      const unsigned l0 = w * 32, l1 = std::min(n, l0 + 32);
      bool all = true;
      for (unsigned i = l0; i < l1; ++i) all = all && fibers[i].state == kAtWarpBarrier;
      if (!all) continue;
      for (unsigned i = l0; i < l1; ++i) fibers[i].state = kReady;
      released = true;
      ++st.warp_syncs;
    }
    if (!released && at_block == n) {
      for (unsigned i = 0; i < n; ++i) fibers[i].state = kReady;
      released = true;
      ++st.syncthreads;
    }
    if (!released) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "barrier divergence: of %u threads, %u wait at __syncthreads, %u at a warp barrier "
               "(shuffle or __syncwarp) whose warp is incomplete, %u have exited",
               n, at_block, at_warp, done);
      fail(msg);
    }
  }
}

}  // namespace

void register_smem(void* p, size_t bytes) { smems().emplace_back(static_cast<unsigned*>(p), bytes / 4); }

[[noreturn]] void fail(const std::string& what) {
  fprintf(stderr, "emu: %s", cur_label.c_str());
  if (in_block) fprintf(stderr, " block (%u,%u,%u)", blockIdx.x, blockIdx.y, blockIdx.z);
  if (current >= 0) fprintf(stderr, " thread %u", fibers[current].lin);
  fprintf(stderr, ": %s\n", what.c_str());
  fflush(stdout);
  fflush(stderr);
  _exit(3);
}

void block_barrier() {
  if (current < 0) fail("__syncthreads() outside a launch");
  yield(kAtBlockBarrier);
}

void warp_barrier(unsigned mask) {
  if (current < 0) fail("warp barrier outside a launch");
  if (mask != 0xffffffffu) fail("only full-warp masks (0xffffffff) are emulated");
  yield(kAtWarpBarrier);
}

unsigned* warp_slots() { return slots[fibers[current].lin / 32]; }
unsigned lane_id() { return fibers[current].lin % 32; }

Stats launch(const std::string& label, dim3 grid, dim3 block, size_t smem, const std::function<void()>& kernel) {
  cur_label = label;
  Stats st;
  const unsigned long long n = 1ull * block.x * block.y * block.z;
  if (n == 0 || n > kMaxThreads) fail("block of " + std::to_string(n) + " threads (1..1024)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) fail("empty grid");
  if (grid.y > 65535 || grid.z > 65535) fail("grid.y and grid.z must be at most 65535");
  if (smem > kMaxDynamicSmem)
    fail("asks for " + std::to_string(smem) + " bytes of dynamic shared memory, more than the device's " +
         std::to_string(kMaxDynamicSmem));
  alloc_stacks();
  gridDim = grid;
  blockDim = block;
  body = &kernel;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        for (auto& s : smems()) std::fill_n(s.first, s.second, kSmemFill);
        in_block = true;
        run_block(static_cast<unsigned>(n), st.blocks % 2 == 1, st);
        for (auto& s : smems())
          for (size_t i = smem / 4; i < s.second; ++i)
            if (s.first[i] != kSmemFill)
              fail("wrote shared memory at byte " + std::to_string(4 * i) + ", beyond the launch's " +
                   std::to_string(smem) + " bytes");
        in_block = false;
        ++st.blocks;
      }
  body = nullptr;
  return st;
}

}  // namespace emu
