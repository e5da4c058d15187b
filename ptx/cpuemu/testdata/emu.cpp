// emu.cpp: the fiber scheduler of emu.h.
#include "emu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

dim3 gridDim, blockDim, blockIdx, threadIdx;

namespace emu {
namespace {

enum State { kReady, kAtBlockBarrier, kAtWarpBarrier, kAtNamedBarrier, kArrived, kDone };

// A cp.async in flight (EMU_CP_ASYNC=deferred): its source bytes, read at issue.
struct Copy {
  unsigned char* dst;
  unsigned char data[16];
};

// A wgmma held back until its wait (EMU_WGMMA=deferred), as one of two kinds
// of entry: an accumulator entry (d set) holds the latest value of the
// accumulators d (chained wgmmas on d update it); a check entry (d null), one
// per wgmma, holds the B operand it read, read again at the wait.
struct Wgmma {
  float* d;
  std::vector<float> val;
  unsigned long long desc;
  int n;
  std::vector<unsigned short> b;
  bool trans;      // B MN-major (wgmma_rs_t)
  int group = -1;  // the commit group (wgmma_commit numbers them from 0); -1: not committed yet
};

// Switching between fibers. glibc's swapcontext also saves and restores the
// signal mask, two system calls a switch; the tensor-core kernels switch at
// every warp collective, and those calls took ~90% of a runner's time. On
// x86-64 emu_switch saves only what the ABI makes the callee keep (rbx, rbp,
// r12-r15 on the old stack, then rsp); the kernels never change the MXCSR or
// the x87 control word, so those are not saved. Elsewhere ucontext is used.
#if defined(__x86_64__)
extern "C" void emu_switch(void** save_sp, void* to_sp);
asm(R"(
  .text
  .p2align 4
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");
struct Context {
  void* sp = nullptr;
};
#else
struct Context {
  ucontext_t uc;
};
#endif

struct Fiber {
  Context ctx;
  State state;
  dim3 tid;
  unsigned lin;                             // linear thread index: x + y*bx + z*bx*by
  unsigned bar_id = 0, bar_count = 0;       // the named barrier it waits at (kAtNamedBarrier)
  std::vector<Copy> uncommitted;            // cp.async since the last commit
  std::deque<std::vector<Copy>> groups;     // committed, oldest first
  std::vector<Wgmma> wgmmas;                // EMU_WGMMA=deferred: issued, not yet waited for
  int wgmma_groups = 0;                     // the commit groups closed so far
};


// The warp-collective tensor-core instructions' exchange: each lane's
// fragment registers or row address, and which instruction it is at.
enum Op { kNoOp = 0, kMma, kLdmatrix, kLdmatrixTrans, kWgmma, kStmatrix };
struct Exchange {
  unsigned a[32][4];
  unsigned b[32][2];
  const void* addr[32];
  unsigned long long desc[32];
  int n[32], scale_d[32];
  int op[32];
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
Context scheduler;
int current = -1;  // the running fiber, -1 in the scheduler
const std::function<void()>* body = nullptr;
unsigned slots[kMaxThreads / 32][32];
Exchange exchange[kMaxThreads / 32];
std::string cur_label;
bool in_block = false;
// bar.arrive: arrivals at each named barrier's current phase, and the count they named.
unsigned arrived[16], arrive_count[16];
bool cp_async_deferred = false;  // EMU_CP_ASYNC=deferred
bool wgmma_deferred = false;     // EMU_WGMMA=deferred
const unsigned char* window = nullptr;  // the dynamic shared memory that cvta_shared addresses
size_t window_bytes = 0;
Stats* cur_stats = nullptr;

void land(const std::vector<Copy>& g) {
  for (const Copy& c : g) memcpy(c.dst, c.data, 16);
}

void entry(int i) {
  (*body)();
  Fiber& f = fibers[i];  // copies still in flight land when the thread exits
  for (const auto& g : f.groups) land(g);
  land(f.uncommitted);
  f.groups.clear();
  f.uncommitted.clear();
  if (!f.wgmmas.empty()) fail("the thread exits with a wgmma not waited for (wgmma.wait_group)");
  f.state = kDone;
}

// switch_to saves the running context in from and resumes to.
inline void switch_to(Context& from, Context& to) {
#if defined(__x86_64__)
  emu_switch(&from.sp, to.sp);
#else
  if (swapcontext(&from.uc, &to.uc) != 0) fail("swapcontext failed");
#endif
}

#if defined(__x86_64__)
// fiber_main is where a new fiber's first switch returns to (start_fiber
// leaves its address where emu_switch's ret finds it); it never returns.
[[noreturn]] void fiber_main() {
  const int i = current;
  entry(i);
  switch_to(fibers[i].ctx, scheduler);
  fail("a finished thread was resumed");
}
#endif

// start_fiber makes fiber i start at entry(i) on its own stack when first
// switched to, and return to the scheduler when entry returns.
void start_fiber(unsigned i) {
#if defined(__x86_64__)
  void** sp = reinterpret_cast<void**>(stacks + (i + 1) * kStack);  // page aligned
  *--sp = nullptr;                                         // fiber_main's return address, never used
  *--sp = reinterpret_cast<void*>(&fiber_main);            // emu_switch's ret: rsp = 8 mod 16 at entry
  for (int r = 0; r < 6; ++r) *--sp = nullptr;             // r15, r14, r13, r12, rbx, rbp
  fibers[i].ctx.sp = sp;
#else
  ucontext_t& uc = fibers[i].ctx.uc;
  if (getcontext(&uc) != 0) fail("getcontext failed");
  uc.uc_stack.ss_sp = stacks + i * kStack + page;  // above the guard page
  uc.uc_stack.ss_size = kStack - page;
  uc.uc_link = &scheduler.uc;  // entry's return goes back to the scheduler
  makecontext(&uc, reinterpret_cast<void (*)()>(entry), 1, static_cast<int>(i));
#endif
}

void yield(State s) {
  Fiber& f = fibers[current];
  f.state = s;
  switch_to(f.ctx, scheduler);
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

// run_block runs every fiber of the current block to its end, warp by warp
// and in ascending thread order between barriers, or descending when reverse
// is set; each warp runs ahead to its next __syncthreads before the next one
// starts.
void run_block(unsigned n, bool reverse, Stats& st) {
  for (unsigned i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.state = kReady;
    f.lin = i;
    f.uncommitted.clear();
    f.groups.clear();
    f.wgmmas.clear();
    f.wgmma_groups = 0;
    f.tid = {i % blockDim.x, (i / blockDim.x) % blockDim.y, i / (blockDim.x * blockDim.y)};
    start_fiber(i);
  }
  std::fill_n(arrived, 16, 0u);
  std::fill_n(arrive_count, 16, 0u);
  const unsigned nw = (n + 31) / 32;
  for (;;) {
    // A thread that did bar.arrive goes on in the next round, after this round's other warps (among them,
    // in ascending order, the consumers its arrival released): a producer that arrives before it writes
    // is then seen by the consumers that read first.
    for (unsigned i = 0; i < n; ++i)
      if (fibers[i].state == kArrived) fibers[i].state = kReady;
    for (unsigned xw = 0; xw < nw; ++xw) {
      const unsigned w = reverse ? nw - 1 - xw : xw;
      const unsigned l0 = w * 32, l1 = std::min(n, l0 + 32);
      // A warp runs ahead to its next __syncthreads (or its end): its warp
      // barriers are released as soon as all its lanes reach them. Warps are
      // then as far apart as a __syncthreads lets them be, so a hazard between
      // warps (a stage refilled while another warp still reads it) shows.
      for (;;) {
        for (unsigned x = l0; x < l1; ++x) {
          const unsigned i = reverse ? l1 - 1 - (x - l0) : x;
          if (fibers[i].state != kReady) continue;
          current = static_cast<int>(i);
          threadIdx = fibers[i].tid;
          switch_to(scheduler, fibers[i].ctx);
        }
        bool all = true;
        for (unsigned i = l0; i < l1; ++i) all = all && fibers[i].state == kAtWarpBarrier;
        if (!all) break;
        for (unsigned i = l0; i < l1; ++i) fibers[i].state = kReady;
        ++st.warp_syncs;
      }
    }
    current = -1;
    unsigned done = 0, at_block = 0, at_warp = 0, at_named = 0;
    for (unsigned i = 0; i < n; ++i) {
      done += fibers[i].state == kDone;
      at_named += fibers[i].state == kAtNamedBarrier;
      at_block += fibers[i].state == kAtBlockBarrier;
      at_warp += fibers[i].state == kAtWarpBarrier;
    }
    if (done == n) return;
    // A bar.arrive that completed a named barrier's phase readied its waiting threads (perhaps of a warp
    // already passed this round): run them first.
    if (done + at_named + at_block + at_warp < n) continue;  // ready or just arrived
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
    // A named barrier (bar.sync id, count) is released once count threads, whole warps, wait at it or
    // arrived at it (bar.arrive); every thread at it must name the same count.
    for (unsigned id = 1; id < 16 && !released; ++id) {
      unsigned at = 0, count = arrive_count[id];
      for (unsigned i = 0; i < n; ++i) {
        if (fibers[i].state != kAtNamedBarrier || fibers[i].bar_id != id) continue;
        if ((at > 0 || arrived[id] > 0) && fibers[i].bar_count != count)
          fail("named barrier " + std::to_string(id) + ": threads name counts " + std::to_string(count) + " and " +
               std::to_string(fibers[i].bar_count));
        count = fibers[i].bar_count;
        ++at;
      }
      if (at == 0) continue;
      if (at + arrived[id] > count)
        fail("named barrier " + std::to_string(id) + ": " + std::to_string(at) + " threads wait at it and " +
             std::to_string(arrived[id]) + " arrived, count " + std::to_string(count));
      if (at + arrived[id] < count) continue;
      for (unsigned i = 0; i < n; ++i)
        if (fibers[i].state == kAtNamedBarrier && fibers[i].bar_id == id) fibers[i].state = kReady;
      arrived[id] = 0;
      released = true;
      ++st.named_syncs;
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
               "(shuffle or __syncwarp) whose warp is incomplete, %u at a named barrier (bar.sync) short of its "
               "count, %u have exited",
               n, at_block, at_warp, at_named, done);
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

void named_barrier(unsigned id, unsigned count) {
  if (current < 0) fail("bar.sync outside a launch");
  if (id == 0 || id >= 16) fail("bar.sync " + std::to_string(id) + ": the emulator takes named barriers 1..15");
  if (count == 0 || count % 32 != 0) fail("bar.sync with " + std::to_string(count) + " threads: a multiple of 32");
  fibers[current].bar_id = id;
  fibers[current].bar_count = count;
  yield(kAtNamedBarrier);
}

void named_arrive(unsigned id, unsigned count) {
  if (current < 0) fail("bar.arrive outside a launch");
  if (id == 0 || id >= 16) fail("bar.arrive " + std::to_string(id) + ": the emulator takes named barriers 1..15");
  if (count == 0 || count % 32 != 0) fail("bar.arrive with " + std::to_string(count) + " threads: a multiple of 32");
  if (arrived[id] > 0 && arrive_count[id] != count)
    fail("named barrier " + std::to_string(id) + ": threads name counts " + std::to_string(arrive_count[id]) + " and " +
         std::to_string(count));
  unsigned at = 0;
  for (const Fiber& f : fibers) {
    if (&f - fibers >= static_cast<long>(blockDim.x * blockDim.y * blockDim.z)) break;
    if (f.state != kAtNamedBarrier || f.bar_id != id) continue;
    if (f.bar_count != count)
      fail("named barrier " + std::to_string(id) + ": threads name counts " + std::to_string(f.bar_count) + " and " +
           std::to_string(count));
    ++at;
  }
  arrive_count[id] = count;
  if (at + arrived[id] + 1 > count)
    fail("bar.arrive at named barrier " + std::to_string(id) + ": " + std::to_string(at) + " threads wait at it and " +
         std::to_string(arrived[id] + 1) + " arrived, count " + std::to_string(count) +
         " (an arrival a phase ahead of the threads that sync)");
  ++arrived[id];
  if (at + arrived[id] == count) {
    // The phase completes at this arrival: the waiting threads go on (the arriving one never waits).
    for (Fiber& f : fibers) {
      if (&f - fibers >= static_cast<long>(blockDim.x * blockDim.y * blockDim.z)) break;
      if (f.state == kAtNamedBarrier && f.bar_id == id) f.state = kReady;
    }
    arrived[id] = 0;
    if (cur_stats) ++cur_stats->named_syncs;
  }
  yield(kArrived);  // resumed in the next round (run_block)
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
  const char* mode = getenv("EMU_CP_ASYNC");
  if (mode && strcmp(mode, "deferred") != 0 && strcmp(mode, "immediate") != 0 && mode[0] != 0)
    fail(std::string("EMU_CP_ASYNC=") + mode + ": use deferred or immediate");
  cp_async_deferred = mode && strcmp(mode, "deferred") == 0;
  const char* wmode = getenv("EMU_WGMMA");
  if (wmode && strcmp(wmode, "deferred") != 0 && strcmp(wmode, "immediate") != 0 && wmode[0] != 0)
    fail(std::string("EMU_WGMMA=") + wmode + ": use deferred or immediate");
  wgmma_deferred = wmode && strcmp(wmode, "deferred") == 0;
  window = nullptr;
  window_bytes = 0;
  for (auto& x : exchange) std::fill_n(x.op, 32, static_cast<int>(kNoOp));
  cur_stats = &st;
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
  cur_stats = nullptr;
  return st;
}

// ---- the tensor-core path (ptx/src/mma.cuh) -----------------------------------------------------

namespace {

const char* op_name(int op) {
  switch (op) {
    case kMma:
      return "mma.sync.m16n8k16";
    case kLdmatrix:
      return "ldmatrix.x4";
    case kLdmatrixTrans:
      return "ldmatrix.x4.trans";
    case kWgmma:
      return "wgmma.mma_async";
    case kStmatrix:
      return "stmatrix.x4";
    default:
      return "no tensor-core instruction (a shuffle, __syncwarp or another barrier)";
  }
}

// enter posts this lane at instruction op of its warp's exchange; the warp
// must be complete (32 lanes).
Exchange& enter(int op) {
  if (current < 0) fail(std::string(op_name(op)) + " outside a launch");
  const unsigned lin = fibers[current].lin, n = blockDim.x * blockDim.y * blockDim.z;
  if (lin / 32 * 32 + 32 > n)
    fail(std::string(op_name(op)) + " in a warp of fewer than 32 threads (block of " + std::to_string(n) + ")");
  Exchange& x = exchange[lin / 32];
  x.op[lin % 32] = op;
  return x;
}

// meet waits for the warp and checks that every lane is at the same instruction.
void meet(Exchange& x, int op) {
  warp_barrier(0xffffffffu);
  for (unsigned l = 0; l < 32; ++l)
    if (x.op[l] != op)
      fail(std::string(op_name(op)) + ": lane " + std::to_string(l) + " of the warp is at " + op_name(x.op[l]) +
           " (all lanes must execute the same warp-collective instruction)");
}

// leave waits until every lane has read the exchange, then frees this lane's slot.
void leave(Exchange& x) {
  warp_barrier(0xffffffffu);
  x.op[lane_id()] = kNoOp;
}

float bf16_at(unsigned reg, unsigned half) {
  const unsigned u = half ? (reg & 0xffff0000u) : (reg << 16);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// fragment_a rebuilds a warp's 16x16 A operand from every lane's four fragment registers (the
// m16n8k16 layout of mma.cuh, which wgmma's register A keeps within a warp).
void fragment_a(const Exchange& x, float A[16][16]) {
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned g = l / 4, t = l % 4;
    for (unsigned r = 0; r < 4; ++r) {
      const unsigned row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
      A[row][col] = bf16_at(x.a[l][r], 0);
      A[row][col + 1] = bf16_at(x.a[l][r], 1);
    }
  }
}

unsigned short u16_at(const void* row, unsigned i) {
  unsigned short v;
  memcpy(&v, static_cast<const unsigned char*>(row) + 2 * i, 2);
  return v;
}

}  // namespace

void mma_bf16_16816(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  Exchange& x = enter(kMma);
  const unsigned lane = lane_id();
  for (int i = 0; i < 4; ++i) x.a[lane][i] = a[i];
  for (int i = 0; i < 2; ++i) x.b[lane][i] = b[i];
  meet(x, kMma);
  // A (row-major 16x16) and B (16x8) from every lane's fragments (layout: mma.cuh).
  float A[16][16], B[16][8];
  fragment_a(x, A);
  for (unsigned l = 0; l < 32; ++l) {
    const unsigned g = l / 4, t = l % 4;
    for (unsigned r = 0; r < 2; ++r) {
      const unsigned k = 2 * t + 8 * r;
      B[k][g] = bf16_at(x.b[l][r], 0);
      B[k + 1][g] = bf16_at(x.b[l][r], 1);
    }
  }
  const unsigned g = lane / 4, t = lane % 4;
  float out[4];
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float acc = c[i];
    for (unsigned k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];  // the product is exact
    out[i] = acc;
  }
  if (lane == 0 && cur_stats) ++cur_stats->mmas;
  leave(x);
  for (int i = 0; i < 4; ++i) d[i] = out[i];  // d may be c
}

void ldmatrix_x4(unsigned r[4], const void* p, bool trans) {
  const int op = trans ? kLdmatrixTrans : kLdmatrix;
  Exchange& x = enter(op);
  if (reinterpret_cast<uintptr_t>(p) & 15) fail(std::string(op_name(op)) + ": a row address is not 16-byte aligned");
  const unsigned lane = lane_id();
  x.addr[lane] = p;
  meet(x, op);
  const unsigned g = lane / 4, t = lane % 4;
  unsigned out[4];
  for (unsigned m = 0; m < 4; ++m) {
    unsigned lo, hi;
    if (!trans) {  // row g of matrix m, columns 2t, 2t+1
      lo = u16_at(x.addr[8 * m + g], 2 * t);
      hi = u16_at(x.addr[8 * m + g], 2 * t + 1);
    } else {  // rows 2t, 2t+1 of matrix m, column g
      lo = u16_at(x.addr[8 * m + 2 * t], g);
      hi = u16_at(x.addr[8 * m + 2 * t + 1], g);
    }
    out[m] = lo | (hi << 16);
  }
  if (lane == 0 && cur_stats) ++cur_stats->ldmatrix;
  leave(x);
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}

void stmatrix_x4(void* p, const unsigned r[4]) {
  Exchange& x = enter(kStmatrix);
  if (reinterpret_cast<uintptr_t>(p) & 15) fail("stmatrix.x4: a row address is not 16-byte aligned");
  const unsigned lane = lane_id();
  x.addr[lane] = p;
  for (int i = 0; i < 4; ++i) x.a[lane][i] = r[i];
  meet(x, kStmatrix);
  // Each lane writes its own elements, row g of matrix m, columns 2t and 2t + 1, at the row address lane
  // 8 m + g gave, between the meetings: the warp's stores are all done when any lane leaves, as the one
  // instruction's are on the GPU. The 32 lanes' elements of a matrix are disjoint.
  const unsigned g = lane / 4, t = lane % 4;
  for (unsigned m = 0; m < 4; ++m) memcpy(static_cast<unsigned char*>(const_cast<void*>(x.addr[8 * m + g])) + 4 * t, &r[m], 4);
  leave(x);
}

// copy16: a cp.async of 16 bytes, the source's (full) or zeros (not full: the source is not read, as
// cp.async with src-size 0 reads nothing), at once or deferred to its group's wait.
static void copy16(void* smem, const void* gmem, bool full) {
  if (current < 0) fail("cp.async outside a launch");
  if ((reinterpret_cast<uintptr_t>(smem) | reinterpret_cast<uintptr_t>(gmem)) & 15)
    fail("cp.async: the shared and global addresses must be 16-byte aligned");
  if (cur_stats) ++cur_stats->cp_async;
  unsigned char data[16] = {0};
  if (full) memcpy(data, gmem, 16);
  if (!cp_async_deferred) {
    memcpy(smem, data, 16);
    return;
  }
  Copy c;
  c.dst = static_cast<unsigned char*>(smem);
  memcpy(c.data, data, 16);
  for (int i = 0; i < 4; ++i) memcpy(c.dst + 4 * i, &kSmemFill, 4);  // in flight: undefined
  fibers[current].uncommitted.push_back(c);
}

void cp_async16(void* smem, const void* gmem) { copy16(smem, gmem, true); }

void cp_async16_zfill(void* smem, const void* gmem, bool full) {
  if (gmem == nullptr) fail("cp.async with src-size: the global address must be a valid one even when nothing is read");
  copy16(smem, gmem, full);
}

void cp_async_commit() {
  if (current < 0) fail("cp.async.commit_group outside a launch");
  Fiber& f = fibers[current];
  if (!cp_async_deferred) return;
  f.groups.push_back(std::move(f.uncommitted));
  f.uncommitted.clear();
}

void cp_async_wait(int n) {
  if (current < 0) fail("cp.async.wait_group outside a launch");
  if (n < 0) fail("cp.async.wait_group with a negative count");
  Fiber& f = fibers[current];
  while (f.groups.size() > static_cast<size_t>(n)) {
    land(f.groups.front());
    f.groups.pop_front();
  }
}

// ---- the wgmma path (ptx/src/wgmma.cuh, GDNKCP_EMU_WGMMA) ----------------------------------------

unsigned long long cvta_shared(const void* p) {
  if (current < 0) fail("__cvta_generic_to_shared outside a launch");
  const unsigned char* q = static_cast<const unsigned char*>(p);
  for (auto& sm : smems()) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(sm.first);
    if (q >= base && q <= base + 4 * sm.second) {
      if (window != nullptr && window != base) fail("__cvta_generic_to_shared: two dynamic shared memories in one launch");
      window = base;
      window_bytes = 4 * sm.second;
      return static_cast<unsigned long long>(q - base);
    }
  }
  fail("__cvta_generic_to_shared: the address is not in dynamic shared memory");
}

namespace {

// wgmma_b reads the B operand (16 x n bf16, 128-byte swizzle) that desc describes: K-major (for each
// column its 16 k values contiguous, rows of 128 bytes, 8-row atoms the stride byte offset apart) or, with
// trans (imm-trans-b 1), MN-major (for each k its n values contiguous, 64 of them a 128-byte row, rows
// k % 8 of an atom 128 bytes apart, the next 8 k the stride byte offset on, the next 64 columns the
// leading byte offset on).
std::vector<unsigned short> wgmma_b(unsigned long long desc, int n, bool trans) {
  if (window == nullptr) fail("wgmma: no descriptor address came from __cvta_generic_to_shared");
  if ((desc >> 62) != 1) fail("wgmma: only the 128-byte swizzle (descriptor mode 1) is emulated");
  if (((desc >> 49) & 7) != 0) fail("wgmma: a descriptor base offset other than 0");
  const size_t start = (desc & 0x3fff) << 4, lbo = ((desc >> 16) & 0x3fff) << 4, sbo = ((desc >> 32) & 0x3fff) << 4;
  if (trans && n > 64 && lbo < 1024) fail("wgmma: an MN-major B wider than 64 needs a leading byte offset");
  std::vector<unsigned short> b(16 * static_cast<size_t>(n));
  for (int col = 0; col < n; ++col)
    for (int k = 0; k < 16; ++k) {
      const size_t u = trans ? start + (col / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + 2 * (col % 64)
                             : start + (col / 8) * sbo + (col % 8) * 128 + 2 * k;
      const size_t a = u ^ (((u >> 7) & 7) << 4);
      if (a + 2 > window_bytes) fail("wgmma: B reaches past the dynamic shared memory");
      memcpy(&b[static_cast<size_t>(k) * n + col], window + a, 2);
    }
  return b;
}

void wgmma_rs_any(float* d, int n, const unsigned a[4], unsigned long long desc, int scale_d, bool trans) {
  Exchange& x = enter(kWgmma);
  if (n % 8 != 0 || n < 8 || n > 256) fail("wgmma: N must be a multiple of 8 in 8..256");
  const unsigned lane = lane_id();
  for (int i = 0; i < 4; ++i) x.a[lane][i] = a[i];
  x.desc[lane] = desc;
  x.n[lane] = n;
  x.scale_d[lane] = scale_d;
  meet(x, kWgmma);
  for (unsigned l = 0; l < 32; ++l)
    if (x.desc[l] != x.desc[0] || x.n[l] != x.n[0] || (x.scale_d[l] != 0) != (x.scale_d[0] != 0))
      fail("wgmma: the lanes of a warp pass different descriptors, shapes or scale-d");
  float A[16][16];
  fragment_a(x, A);
  if (lane == 0 && cur_stats) ++cur_stats->wgmmas;
  leave(x);
  const std::vector<unsigned short> b = wgmma_b(desc, n, trans);
  Fiber& f = fibers[current];
  // The accumulators' input: a held result for the same D (a chained wgmma), else D itself.
  Wgmma* held = nullptr;
  for (auto& w : f.wgmmas)
    if (w.d == d) held = &w;
  if (held != nullptr && static_cast<int>(held->val.size()) != n / 2) fail("wgmma: a chained wgmma changes N");
  const unsigned g = lane / 4, t = lane % 4;
  std::vector<float> out(n / 2);
  for (int j = 0; j < n / 8; ++j)
    for (unsigned r = 0; r < 4; ++r) {
      const unsigned row = g + 8 * (r / 2), col = 8 * j + 2 * t + r % 2;
      const int i = 4 * j + static_cast<int>(r);
      float acc = scale_d == 0 ? 0.f : (held ? held->val[i] : d[i]);
      for (unsigned k = 0; k < 16; ++k) acc += A[row][k] * bf16_at(b[k * n + col], 0);  // the product is exact
      out[i] = acc;
    }
  if (!wgmma_deferred) {
    for (int i = 0; i < n / 2; ++i) d[i] = out[i];
    return;
  }
  if (held == nullptr) {
    f.wgmmas.push_back(Wgmma{d, {}, 0, n, {}, false});
    held = &f.wgmmas.back();
  }
  held->val = out;
  held->group = -1;  // D is final only when this wgmma's group is waited for
  // Checked for every wgmma of the group: B must not change before the wait.
  f.wgmmas.push_back(Wgmma{nullptr, {}, desc, n, b, trans});
  for (int i = 0; i < n / 2; ++i) memcpy(&d[i], &kSmemFill, 4);  // in flight: undefined
}

}  // namespace

void wgmma_rs(float* d, int n, const unsigned a[4], unsigned long long desc, int scale_d) {
  wgmma_rs_any(d, n, a, desc, scale_d, false);
}

void wgmma_rs_t(float* d, int n, const unsigned a[4], unsigned long long desc, int scale_d) {
  wgmma_rs_any(d, n, a, desc, scale_d, true);
}


void wgmma_fence() {
  if (current < 0) fail("wgmma.fence outside a launch");
}

void wgmma_commit() {
  if (current < 0) fail("wgmma.commit_group outside a launch");
  Fiber& f = fibers[current];
  for (Wgmma& w : f.wgmmas)
    if (w.group < 0) w.group = f.wgmma_groups;
  ++f.wgmma_groups;  // an empty group counts too, as on the GPU
}

void wgmma_wait(int n) {
  if (current < 0) fail("wgmma.wait_group outside a launch");
  if (n < 0) fail("wgmma.wait_group with a negative count");
  Fiber& f = fibers[current];
  // wait_group n: every group but the newest n done (0: everything issued, committed or not, as before).
  const int older = f.wgmma_groups - n;
  auto done = [&](const Wgmma& w) { return n == 0 || (w.group >= 0 && w.group < older); };
  for (const Wgmma& w : f.wgmmas) {
    if (done(w) && w.d == nullptr && wgmma_b(w.desc, w.n, w.trans) != w.b)
      fail("wgmma: shared memory under an in-flight wgmma changed before its wait");
  }
  std::vector<Wgmma> rest;
  for (Wgmma& w : f.wgmmas) {
    if (!done(w)) {
      rest.push_back(std::move(w));
      continue;
    }
    if (w.d != nullptr)
      for (size_t i = 0; i < w.val.size(); ++i) w.d[i] = w.val[i];
  }
  f.wgmmas = std::move(rest);
}

}  // namespace emu
