// Package cpuemu holds only a test: it compiles the kernels of ptx/src as
// ordinary C++ with the host compiler (g++ or clang++), against stand-in CUDA
// headers in testdata, runs every thread of a launch in turn, and compares
// the outputs with the CPU reference internal/convref. It checks the
// kernels' indexing, halo handling, vector and scalar paths and grid-stride
// loops on any machine; arithmetic that only the GPU has (expf, fma
// contraction) is covered by the GPU test. The test skips when no C++
// compiler is installed.
package cpuemu
