package loader

import (
	"bytes"
	"runtime"
	"unsafe"
)

// CUjit_option values used by moduleLoadData.
const (
	jitInfoLogBuffer           = 3
	jitInfoLogBufferSizeBytes  = 4
	jitErrorLogBuffer          = 5
	jitErrorLogBufferSizeBytes = 6
	jitLogVerbose              = 12
)

// JITLogBytes is the size of each of the JIT info and error log buffers.
const JITLogBytes = 64 << 10

// moduleLoadData calls cuModuleLoadDataEx with 64 KiB info and error log
// buffers and verbose logging. The option values travel in the pointer
// slots, as the driver expects; the arrays and buffers are pinned for the
// call. It returns both logs whatever the outcome.
func (d *driver) moduleLoadData(image []byte) (mod uintptr, infoLog, errLog string, err error) {
	f, err := d.cuModuleLoadDataEx.Get(d.lib.Library)
	if err != nil {
		return 0, "", "", err
	}
	info := make([]byte, JITLogBytes)
	elog := make([]byte, JITLogBytes)
	opts := []int32{jitInfoLogBuffer, jitInfoLogBufferSizeBytes, jitErrorLogBuffer, jitErrorLogBufferSizeBytes, jitLogVerbose}
	vals := []uintptr{
		uintptr(unsafe.Pointer(&info[0])), JITLogBytes,
		uintptr(unsafe.Pointer(&elog[0])), JITLogBytes,
		1,
	}
	var pin runtime.Pinner
	pin.Pin(&info[0])
	pin.Pin(&elog[0])
	pin.Pin(&opts[0])
	pin.Pin(&vals[0])
	pin.Pin(&image[0])
	rc := f(&mod, unsafe.Pointer(&image[0]), uint32(len(opts)), unsafe.Pointer(&opts[0]), unsafe.Pointer(&vals[0]))
	pin.Unpin()
	// On return the size slots hold the bytes written; cut at the NUL too.
	infoLog = logText(info, vals[1])
	errLog = logText(elog, vals[3])
	return mod, infoLog, errLog, d.check(d.cuModuleLoadDataEx.Name, rc)
}

// logText returns the text of a JIT log buffer, of at most n bytes.
func logText(buf []byte, n uintptr) string {
	if n < uintptr(len(buf)) {
		buf = buf[:n]
	}
	if i := bytes.IndexByte(buf, 0); i >= 0 {
		buf = buf[:i]
	}
	return string(bytes.TrimRight(buf, "\n"))
}

func (d *driver) moduleUnload(mod uintptr) error {
	f, err := d.cuModuleUnload.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuModuleUnload.Name, f(mod))
}

func (d *driver) moduleGetFunction(mod uintptr, name string) (uintptr, error) {
	f, err := d.cuModuleGetFunction.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var fn uintptr
	return fn, d.check(d.cuModuleGetFunction.Name, f(&fn, mod, name))
}

func (d *driver) funcGetAttribute(fn uintptr, attr FuncAttribute) (int, error) {
	f, err := d.cuFuncGetAttribute.Get(d.lib.Library)
	if err != nil {
		return 0, err
	}
	var v int32
	return int(v), d.check(d.cuFuncGetAttribute.Name, f(&v, int32(attr), fn))
}

func (d *driver) funcSetAttribute(fn uintptr, attr FuncAttribute, v int) error {
	f, err := d.cuFuncSetAttribute.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuFuncSetAttribute.Name, f(fn, int32(attr), int32(v)))
}

// launchKernel calls cuLaunchKernel; params is the void** argument array,
// which the caller keeps pinned.
func (d *driver) launchKernel(fn uintptr, grid, block [3]uint32, shared uint32, stream uintptr, params unsafe.Pointer) error {
	f, err := d.cuLaunchKernel.Get(d.lib.Library)
	if err != nil {
		return err
	}
	return d.check(d.cuLaunchKernel.Name, f(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, params, nil))
}
