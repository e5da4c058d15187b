// registry.h: the kernels and named constants that runner.cpp can launch and
// resolve. A kernel is registered with its real C++ signature; a launch's
// arguments are checked against it (count and kind: pointer, int, unsigned,
// long long, unsigned long long, float), so a job written to the documented
// ABI fails loudly where the source disagrees.
#pragma once
#include <stddef.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "emu.h"

namespace emu {

// Arg is one launch argument: kind 'b' (device pointer), 'i' (int32), 'w'
// (uint32), 'l' (int64), 'u' (uint64) or 'f' (float).
struct Arg {
  char kind;
  void* ptr;
  long long i;
  unsigned long long u;
  float f;
};

template <typename T>
struct Param;
template <typename T>
struct Param<T*> {
  static constexpr char kind = 'b';
  static T* get(const Arg& a) { return static_cast<T*>(a.ptr); }
};
template <>
struct Param<int> {
  static constexpr char kind = 'i';
  static int get(const Arg& a) { return static_cast<int>(a.i); }
};
template <>
struct Param<unsigned> {
  static constexpr char kind = 'w';
  static unsigned get(const Arg& a) { return static_cast<unsigned>(a.u); }
};
template <>
struct Param<long long> {
  static constexpr char kind = 'l';
  static long long get(const Arg& a) { return a.i; }
};
template <>
struct Param<unsigned long long> {
  static constexpr char kind = 'u';
  static unsigned long long get(const Arg& a) { return a.u; }
};
template <>
struct Param<float> {
  static constexpr char kind = 'f';
  static float get(const Arg& a) { return a.f; }
};

// Kernel binds a launch's arguments to one kernel.
struct Kernel {
  std::string kinds;  // the parameter kinds, in order
  std::function<std::function<void()>(const std::vector<Arg>&)> bind;
};

template <typename... P, size_t... I>
std::function<void()> bind_args(void (*f)(P...), const std::vector<Arg>& a, std::index_sequence<I...>) {
  return [f, a] { f(Param<P>::get(a[I])...); };
}

template <typename... P>
Kernel make_kernel(void (*f)(P...)) {
  Kernel k;
  k.kinds = std::string{Param<P>::kind...};
  k.bind = [f](const std::vector<Arg>& a) { return bind_args(f, a, std::index_sequence_for<P...>{}); };
  return k;
}

inline std::map<std::string, Kernel>& kernels() {
  static std::map<std::string, Kernel> k;
  return k;
}
inline std::map<std::string, long long>& symbols() {
  static std::map<std::string, long long> s;
  return s;
}

// Registrar adds kernels and named constants (dynamic shared memory sizes)
// at static initialisation.
struct Registrar {
  Registrar(std::vector<std::pair<std::string, Kernel>> ks, std::vector<std::pair<std::string, long long>> syms) {
    for (auto& k : ks) kernels()[k.first] = k.second;
    for (auto& s : syms) symbols()[s.first] = s.second;
  }
};

}  // namespace emu

// EMU_KERNEL(ns, name): the entry ns::name under its own name.
#define EMU_KERNEL(ns, name) \
  { #name, emu::make_kernel(&ns::name) }
