package loader

import (
	"sync"
	"unsafe"
)

// The binding passes CUdeviceptr and size_t as uintptr: 64-bit builds only.
var _ [unsafe.Sizeof(uintptr(0)) - 8]struct{}

// driver holds the raw driver functions of one library, each resolved on
// first use. Handles (CUcontext, CUstream, CUevent, CUmodule, CUfunction)
// are opaque driver pointers and travel as uintptr; CUdevice is an int32;
// CUdeviceptr and size_t are uintptr (64-bit builds only).
type driver struct {
	lib *library

	initOnce sync.Once
	initErr  error

	cuInit           proc[func(flags uint32) ErrorCode]
	cuGetErrorName   proc[func(rc ErrorCode, s **byte) ErrorCode]
	cuGetErrorString proc[func(rc ErrorCode, s **byte) ErrorCode]

	cuDeviceGetCount      proc[func(n *int32) ErrorCode]
	cuDeviceGet           proc[func(dev *int32, ordinal int32) ErrorCode]
	cuDeviceGetName       proc[func(name *byte, n int32, dev int32) ErrorCode]
	cuDeviceGetAttribute  proc[func(v *int32, attr int32, dev int32) ErrorCode]
	cuDeviceTotalMem      proc[func(bytes *uintptr, dev int32) ErrorCode]
	cuDeviceCanAccessPeer proc[func(can *int32, dev, peer int32) ErrorCode]

	cuDevicePrimaryCtxRetain  proc[func(ctx *uintptr, dev int32) ErrorCode]
	cuDevicePrimaryCtxRelease proc[func(dev int32) ErrorCode]
	cuCtxGetCurrent           proc[func(ctx *uintptr) ErrorCode]
	cuCtxSetCurrent           proc[func(ctx uintptr) ErrorCode]
	cuCtxSynchronize          proc[func() ErrorCode]
	cuCtxEnablePeerAccess     proc[func(peer uintptr, flags uint32) ErrorCode]

	cuMemGetInfo      proc[func(free, total *uintptr) ErrorCode]
	cuMemAlloc        proc[func(ptr *uintptr, n uintptr) ErrorCode]
	cuMemFree         proc[func(ptr uintptr) ErrorCode]
	cuMemcpyHtoD      proc[func(dst uintptr, src unsafe.Pointer, n uintptr) ErrorCode]
	cuMemcpyDtoH      proc[func(dst unsafe.Pointer, src uintptr, n uintptr) ErrorCode]
	cuMemcpyDtoD      proc[func(dst, src uintptr, n uintptr) ErrorCode]
	cuMemcpyHtoDAsync proc[func(dst uintptr, src unsafe.Pointer, n uintptr, stream uintptr) ErrorCode]
	cuMemcpyDtoHAsync proc[func(dst unsafe.Pointer, src uintptr, n uintptr, stream uintptr) ErrorCode]
	cuMemcpyDtoDAsync proc[func(dst, src uintptr, n uintptr, stream uintptr) ErrorCode]
	cuMemcpyPeerAsync proc[func(dst, dstCtx, src, srcCtx uintptr, n uintptr, stream uintptr) ErrorCode]
	cuMemsetD8        proc[func(dst uintptr, v uint8, n uintptr) ErrorCode]
	cuMemsetD32       proc[func(dst uintptr, v uint32, n uintptr) ErrorCode]
	cuMemsetD8Async   proc[func(dst uintptr, v uint8, n uintptr, stream uintptr) ErrorCode]
	cuMemsetD32Async  proc[func(dst uintptr, v uint32, n uintptr, stream uintptr) ErrorCode]
	cuMemHostAlloc    proc[func(p *unsafe.Pointer, n uintptr, flags uint32) ErrorCode]
	cuMemFreeHost     proc[func(p unsafe.Pointer) ErrorCode]

	cuStreamCreate      proc[func(s *uintptr, flags uint32) ErrorCode]
	cuStreamCreatePrio  proc[func(s *uintptr, flags uint32, priority int32) ErrorCode]
	cuCtxStreamPrios    proc[func(least, greatest *int32) ErrorCode]
	cuStreamDestroy     proc[func(s uintptr) ErrorCode]
	cuStreamSynchronize proc[func(s uintptr) ErrorCode]
	cuStreamQuery       proc[func(s uintptr) ErrorCode]
	cuStreamWaitEvent   proc[func(s, ev uintptr, flags uint32) ErrorCode]

	cuEventCreate        proc[func(ev *uintptr, flags uint32) ErrorCode]
	cuEventRecord        proc[func(ev, s uintptr) ErrorCode]
	cuEventSynchronize   proc[func(ev uintptr) ErrorCode]
	cuEventQuery         proc[func(ev uintptr) ErrorCode]
	cuEventDestroy       proc[func(ev uintptr) ErrorCode]
	cuEventElapsedTimeV2 proc[func(ms *float32, start, end uintptr) ErrorCode]
	cuEventElapsedTimeV1 proc[func(ms *float32, start, end uintptr) ErrorCode]

	cuModuleLoadDataEx  proc[func(mod *uintptr, image unsafe.Pointer, nopt uint32, opts, vals unsafe.Pointer) ErrorCode]
	cuModuleUnload      proc[func(mod uintptr) ErrorCode]
	cuModuleGetFunction proc[func(fn *uintptr, mod uintptr, name string) ErrorCode]
	cuFuncGetAttribute  proc[func(v *int32, attr int32, fn uintptr) ErrorCode]
	cuFuncSetAttribute  proc[func(fn uintptr, attr int32, v int32) ErrorCode]
	cuLaunchKernel      proc[func(fn uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) ErrorCode]
}

// newDriver names every function of the driver ABI this package uses; the
// explicit _v2 names pin the 64-bit ABI versions.
func newDriver(lib *library) *driver {
	d := &driver{lib: lib}
	d.cuInit.Name = "cuInit"
	d.cuGetErrorName.Name = "cuGetErrorName"
	d.cuGetErrorString.Name = "cuGetErrorString"

	d.cuDeviceGetCount.Name = "cuDeviceGetCount"
	d.cuDeviceGet.Name = "cuDeviceGet"
	d.cuDeviceGetName.Name = "cuDeviceGetName"
	d.cuDeviceGetAttribute.Name = "cuDeviceGetAttribute"
	d.cuDeviceTotalMem.Name = "cuDeviceTotalMem_v2"
	d.cuDeviceCanAccessPeer.Name = "cuDeviceCanAccessPeer"

	d.cuDevicePrimaryCtxRetain.Name = "cuDevicePrimaryCtxRetain"
	d.cuDevicePrimaryCtxRelease.Name = "cuDevicePrimaryCtxRelease_v2"
	d.cuCtxGetCurrent.Name = "cuCtxGetCurrent"
	d.cuCtxSetCurrent.Name = "cuCtxSetCurrent"
	d.cuCtxSynchronize.Name = "cuCtxSynchronize"
	d.cuCtxEnablePeerAccess.Name = "cuCtxEnablePeerAccess"

	d.cuMemGetInfo.Name = "cuMemGetInfo_v2"
	d.cuMemAlloc.Name = "cuMemAlloc_v2"
	d.cuMemFree.Name = "cuMemFree_v2"
	d.cuMemcpyHtoD.Name = "cuMemcpyHtoD_v2"
	d.cuMemcpyDtoH.Name = "cuMemcpyDtoH_v2"
	d.cuMemcpyDtoD.Name = "cuMemcpyDtoD_v2"
	d.cuMemcpyHtoDAsync.Name = "cuMemcpyHtoDAsync_v2"
	d.cuMemcpyDtoHAsync.Name = "cuMemcpyDtoHAsync_v2"
	d.cuMemcpyDtoDAsync.Name = "cuMemcpyDtoDAsync_v2"
	d.cuMemcpyPeerAsync.Name = "cuMemcpyPeerAsync"
	d.cuMemsetD8.Name = "cuMemsetD8_v2"
	d.cuMemsetD32.Name = "cuMemsetD32_v2"
	d.cuMemsetD8Async.Name = "cuMemsetD8Async"
	d.cuMemsetD32Async.Name = "cuMemsetD32Async"
	d.cuMemHostAlloc.Name = "cuMemHostAlloc"
	d.cuMemFreeHost.Name = "cuMemFreeHost"

	d.cuStreamCreate.Name = "cuStreamCreate"
	d.cuStreamCreatePrio.Name = "cuStreamCreateWithPriority"
	d.cuCtxStreamPrios.Name = "cuCtxGetStreamPriorityRange"
	d.cuStreamDestroy.Name = "cuStreamDestroy_v2"
	d.cuStreamSynchronize.Name = "cuStreamSynchronize"
	d.cuStreamQuery.Name = "cuStreamQuery"
	d.cuStreamWaitEvent.Name = "cuStreamWaitEvent"

	d.cuEventCreate.Name = "cuEventCreate"
	d.cuEventRecord.Name = "cuEventRecord"
	d.cuEventSynchronize.Name = "cuEventSynchronize"
	d.cuEventQuery.Name = "cuEventQuery"
	d.cuEventDestroy.Name = "cuEventDestroy_v2"
	d.cuEventElapsedTimeV2.Name = "cuEventElapsedTime_v2"
	d.cuEventElapsedTimeV1.Name = "cuEventElapsedTime"

	d.cuModuleLoadDataEx.Name = "cuModuleLoadDataEx"
	d.cuModuleUnload.Name = "cuModuleUnload"
	d.cuModuleGetFunction.Name = "cuModuleGetFunction"
	d.cuFuncGetAttribute.Name = "cuFuncGetAttribute"
	d.cuFuncSetAttribute.Name = "cuFuncSetAttribute"
	d.cuLaunchKernel.Name = "cuLaunchKernel"
	return d
}

// drv is the process's driver. Tests may replace it (not in parallel) to
// point the package at a library that does not exist.
var drv = newDriver(newLibrary(libraryNames()))

// ready opens the library and runs cuInit(0), once. Every exported entry
// point calls it first.
func (d *driver) ready() error {
	d.initOnce.Do(func() {
		fn, err := d.cuInit.Get(d.lib.Library)
		if err != nil {
			d.initErr = err
			return
		}
		d.initErr = d.check("cuInit", fn(0))
	})
	return d.initErr
}
