// runner.cpp: runs a job of kernel launches on the emulator (emu.h) and saves
// the buffers the job names. The Go test writes the job; it holds one
// command a line:
//
//   alloc NAME BYTES                 a device buffer (contents: the pattern 0x7fbadbad)
//   load NAME FILE                   FILE's bytes into NAME (sizes must agree)
//   fill NAME HEX32                  NAME filled with a 32-bit pattern
//   launch LABEL KERNEL GX GY GZ BLOCK SMEM ARG...
//   save NAME FILE
//
// SMEM is a byte count or a constant the kernels' source names (kPrepSmem,
// walk_smem(64), ...). An ARG is b:NAME or b:NAME+BYTES (a pointer into a
// buffer), b:- (a null pointer), i:N (int), w:N (unsigned), l:N (long long), u:N (unsigned long
// long) or f:HEX32 (float bits). Every buffer sits between two guard zones of
// 64 KiB holding the pattern 0x7fbadbad (a NaN), checked after each launch: a
// write out of bounds is reported, a read gets NaN. Buffers are 256-byte
// aligned, as cudaMalloc's are.
//
// Usage: runner JOBFILE (relative file names are relative to the job's
// directory). Prints one line per launch; on an error, prints it and exits
// non-zero.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>

#include "registry.h"

namespace {

constexpr size_t kGuard = 64 << 10;
constexpr unsigned kGuardFill = 0x7fbadbadu;

struct Buffer {
  std::unique_ptr<unsigned[]> raw;
  unsigned char* data;
  size_t bytes;
  size_t guard_words() const { return kGuard / 4; }
};

std::map<std::string, Buffer> buffers;
std::string dir;

[[noreturn]] void die(const std::string& msg) {
  fprintf(stderr, "runner: %s\n", msg.c_str());
  exit(2);
}

std::string path_of(const std::string& f) { return f.empty() || f[0] == '/' ? f : dir + "/" + f; }

Buffer& buffer(const std::string& name) {
  auto it = buffers.find(name);
  if (it == buffers.end()) die("no buffer " + name);
  return it->second;
}

void check_guards(const std::string& label) {
  for (auto& [name, b] : buffers) {
    const unsigned* lo = reinterpret_cast<const unsigned*>(b.data) - kGuard / 4;
    const unsigned* hi = reinterpret_cast<const unsigned*>(b.data + ((b.bytes + 3) & ~size_t(3)));
    for (size_t i = 0; i < kGuard / 4; ++i) {
      if (lo[i] != kGuardFill)
        die(label + ": wrote " + std::to_string(kGuard - 4 * i) + " bytes before the start of buffer " + name);
      if (hi[i] != kGuardFill)
        die(label + ": wrote at byte " + std::to_string(4 * i) + " past the end of buffer " + name);
    }
    // The tail of the last word, when the size is not a multiple of 4.
    for (size_t i = b.bytes; i < ((b.bytes + 3) & ~size_t(3)); ++i)
      if (b.data[i] != reinterpret_cast<const unsigned char*>(&kGuardFill)[i % 4])
        die(label + ": wrote past the end of buffer " + name);
  }
}

void alloc(const std::string& name, size_t bytes) {
  if (buffers.count(name)) die("buffer " + name + " allocated twice");
  Buffer b;
  const size_t words = (2 * kGuard + bytes + 3) / 4 + 64;
  b.raw.reset(new unsigned[words]);
  std::fill_n(b.raw.get(), words, kGuardFill);
  uintptr_t p = reinterpret_cast<uintptr_t>(b.raw.get()) + kGuard;
  p = (p + 255) & ~uintptr_t(255);
  b.data = reinterpret_cast<unsigned char*>(p);
  b.bytes = bytes;
  buffers[name] = std::move(b);
}

emu::Arg parse_arg(const std::string& tok) {
  emu::Arg a{};
  if (tok.size() < 2 || tok[1] != ':') die("bad argument " + tok);
  a.kind = tok[0];
  const std::string v = tok.substr(2);
  switch (a.kind) {
    case 'b': {
      if (v == "-") {  // a null pointer
        a.ptr = nullptr;
        break;
      }
      const size_t plus = v.find('+');
      const std::string name = v.substr(0, plus);
      const size_t off = plus == std::string::npos ? 0 : std::stoull(v.substr(plus + 1));
      Buffer& b = buffer(name);
      if (off > b.bytes) die("argument " + tok + " points past its buffer");
      a.ptr = b.data + off;
      break;
    }
    case 'i':
    case 'l':
      a.i = std::stoll(v);
      break;
    case 'w':
    case 'u':
      a.u = std::stoull(v);
      break;
    case 'f': {
      const unsigned bits = static_cast<unsigned>(std::stoul(v, nullptr, 16));
      memcpy(&a.f, &bits, 4);
      break;
    }
    default:
      die("bad argument kind in " + tok);
  }
  return a;
}

size_t smem_of(const std::string& tok) {
  if (!tok.empty() && tok[0] >= '0' && tok[0] <= '9') return std::stoull(tok);
  auto it = emu::symbols().find(tok);
  if (it == emu::symbols().end()) die("unknown shared memory constant " + tok);
  return static_cast<size_t>(it->second);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) die("usage: runner JOBFILE");
  const std::string job = argv[1];
  dir = job.substr(0, job.find_last_of('/') == std::string::npos ? 0 : job.find_last_of('/'));
  if (dir.empty()) dir = ".";
  std::ifstream in(job);
  if (!in) die("cannot read " + job);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string cmd;
    if (!(ls >> cmd) || cmd[0] == '#') continue;
    if (cmd == "alloc") {
      std::string name;
      size_t bytes;
      if (!(ls >> name >> bytes)) die("bad line: " + line);
      alloc(name, bytes);
    } else if (cmd == "load" || cmd == "save") {
      std::string name, file;
      if (!(ls >> name >> file)) die("bad line: " + line);
      Buffer& b = buffer(name);
      if (cmd == "load") {
        FILE* f = fopen(path_of(file).c_str(), "rb");
        if (!f) die("cannot open " + file);
        const size_t got = fread(b.data, 1, b.bytes, f);
        const bool extra = fgetc(f) != EOF;
        fclose(f);
        if (got != b.bytes || extra) die(file + " does not hold the " + std::to_string(b.bytes) + " bytes of " + name);
      } else {
        FILE* f = fopen(path_of(file).c_str(), "wb");
        if (!f || fwrite(b.data, 1, b.bytes, f) != b.bytes || fclose(f) != 0) die("cannot write " + file);
      }
    } else if (cmd == "fill") {
      std::string name, hex;
      if (!(ls >> name >> hex)) die("bad line: " + line);
      Buffer& b = buffer(name);
      const unsigned v = static_cast<unsigned>(std::stoul(hex, nullptr, 16));
      for (size_t i = 0; i < b.bytes; ++i) b.data[i] = reinterpret_cast<const unsigned char*>(&v)[i % 4];
    } else if (cmd == "launch") {
      std::string label, kname, smem_tok;
      dim3 grid{}, block{1, 1, 1};
      if (!(ls >> label >> kname >> grid.x >> grid.y >> grid.z >> block.x >> smem_tok)) die("bad line: " + line);
      auto it = emu::kernels().find(kname);
      if (it == emu::kernels().end()) die(label + ": no kernel " + kname + " in this build");
      std::vector<emu::Arg> args;
      std::string tok;
      std::string kinds;
      while (ls >> tok) {
        args.push_back(parse_arg(tok));
        kinds += args.back().kind;
      }
      if (kinds != it->second.kinds)
        die(label + ": " + kname + " takes parameters of kinds " + it->second.kinds + ", the job passes " + kinds +
            " (b pointer, i int, w unsigned, l long long, u unsigned long long, f float)");
      const size_t smem = smem_of(smem_tok);
      const auto fn = it->second.bind(args);
      const auto t0 = std::chrono::steady_clock::now();
      const emu::Stats st = emu::launch(label + " (" + kname + ")", grid, block, smem, fn);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      check_guards(label + " (" + kname + ")");
      printf("%-16s %-22s grid (%u,%u,%u) x %u smem %zu: %llu blocks, %llu __syncthreads, %llu warp barriers, %.1f ms",
             label.c_str(), kname.c_str(), grid.x, grid.y, grid.z, block.x, smem, st.blocks, st.syncthreads,
             st.warp_syncs, ms);
      if (st.wgmmas > 0) printf(", %llu wgmma (warp)", st.wgmmas);
      printf("\n");
    } else {
      die("unknown command: " + line);
    }
  }
  return 0;
}
