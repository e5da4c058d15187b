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
	d.cuInit.name = "cuInit"
	d.cuGetErrorName.name = "cuGetErrorName"
	d.cuGetErrorString.name = "cuGetErrorString"

	d.cuDeviceGetCount.name = "cuDeviceGetCount"
	d.cuDeviceGet.name = "cuDeviceGet"
	d.cuDeviceGetName.name = "cuDeviceGetName"
	d.cuDeviceGetAttribute.name = "cuDeviceGetAttribute"
	d.cuDeviceTotalMem.name = "cuDeviceTotalMem_v2"
	d.cuDeviceCanAccessPeer.name = "cuDeviceCanAccessPeer"

	d.cuDevicePrimaryCtxRetain.name = "cuDevicePrimaryCtxRetain"
	d.cuDevicePrimaryCtxRelease.name = "cuDevicePrimaryCtxRelease_v2"
	d.cuCtxGetCurrent.name = "cuCtxGetCurrent"
	d.cuCtxSetCurrent.name = "cuCtxSetCurrent"
	d.cuCtxSynchronize.name = "cuCtxSynchronize"
	d.cuCtxEnablePeerAccess.name = "cuCtxEnablePeerAccess"

	d.cuMemGetInfo.name = "cuMemGetInfo_v2"
	d.cuMemAlloc.name = "cuMemAlloc_v2"
	d.cuMemFree.name = "cuMemFree_v2"
	d.cuMemcpyHtoD.name = "cuMemcpyHtoD_v2"
	d.cuMemcpyDtoH.name = "cuMemcpyDtoH_v2"
	d.cuMemcpyDtoD.name = "cuMemcpyDtoD_v2"
	d.cuMemcpyHtoDAsync.name = "cuMemcpyHtoDAsync_v2"
	d.cuMemcpyDtoHAsync.name = "cuMemcpyDtoHAsync_v2"
	d.cuMemcpyDtoDAsync.name = "cuMemcpyDtoDAsync_v2"
	d.cuMemcpyPeerAsync.name = "cuMemcpyPeerAsync"
	d.cuMemsetD8.name = "cuMemsetD8_v2"
	d.cuMemsetD32.name = "cuMemsetD32_v2"
	d.cuMemsetD8Async.name = "cuMemsetD8Async"
	d.cuMemsetD32Async.name = "cuMemsetD32Async"
	d.cuMemHostAlloc.name = "cuMemHostAlloc"
	d.cuMemFreeHost.name = "cuMemFreeHost"

	d.cuStreamCreate.name = "cuStreamCreate"
	d.cuStreamDestroy.name = "cuStreamDestroy_v2"
	d.cuStreamSynchronize.name = "cuStreamSynchronize"
	d.cuStreamQuery.name = "cuStreamQuery"
	d.cuStreamWaitEvent.name = "cuStreamWaitEvent"

	d.cuEventCreate.name = "cuEventCreate"
	d.cuEventRecord.name = "cuEventRecord"
	d.cuEventSynchronize.name = "cuEventSynchronize"
	d.cuEventQuery.name = "cuEventQuery"
	d.cuEventDestroy.name = "cuEventDestroy_v2"
	d.cuEventElapsedTimeV2.name = "cuEventElapsedTime_v2"
	d.cuEventElapsedTimeV1.name = "cuEventElapsedTime"

	d.cuModuleLoadDataEx.name = "cuModuleLoadDataEx"
	d.cuModuleUnload.name = "cuModuleUnload"
	d.cuModuleGetFunction.name = "cuModuleGetFunction"
	d.cuFuncGetAttribute.name = "cuFuncGetAttribute"
	d.cuFuncSetAttribute.name = "cuFuncSetAttribute"
	d.cuLaunchKernel.name = "cuLaunchKernel"
	return d
}

// drv is the process's driver. Tests may replace it (not in parallel) to
// point the package at a library that does not exist.
var drv = newDriver(newLibrary(defaultLibraryNames))

// ready opens the library and runs cuInit(0), once. Every exported entry
// point calls it first.
func (d *driver) ready() error {
	d.initOnce.Do(func() {
		fn, err := d.cuInit.get(d.lib)
		if err != nil {
			d.initErr = err
			return
		}
		d.initErr = d.check("cuInit", fn(0))
	})
	return d.initErr
}
