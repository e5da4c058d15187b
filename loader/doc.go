// Package loader is gdnkcp's binding to the CUDA driver API. It opens
// libcuda.so.1 (then libcuda.so) at run time through purego, so building it
// needs neither cgo nor a CUDA toolkit; a machine without a driver gets
// ErrNoDriver from every call instead of a build failure or a panic.
//
// The package has three layers, in the manner of cudarc:
//
//   - raw symbols (driver.go): one lazily resolved entry per driver function,
//     looked up once with dlsym; a missing symbol becomes a *SymbolError that
//     names the function and the driver version;
//   - results (result.go, calls_*.go): every CUresult becomes nil or an *Error
//     carrying the call, the code, cuGetErrorName and cuGetErrorString;
//   - the safe API: Device, Context, Buffer, HostBuffer, Stream, Event,
//     Module, Function, Args and Launch.
//
// CUDA contexts are current per OS thread while goroutines move between
// threads, so every call that needs a context locks its goroutine to its
// thread, makes the context current there (cuCtxSetCurrent only when another
// one is current), makes the call and unlocks. Context.Do runs several calls
// under one lock.
//
// Objects own driver resources and release them with Close or Free, which
// return errors. A runtime cleanup releases what was forgotten, as a safety
// net only; its errors are kept for TakeCleanupError.
//
// loader imports nothing of gdnkcp; kernel signatures arrive as []ParamSpec.
package loader
