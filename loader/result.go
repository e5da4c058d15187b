package loader

import (
	"errors"
	"fmt"
	"unsafe"
)

// ErrorCode is a CUresult, the status every driver function returns.
type ErrorCode int32

// The CUresult codes callers test for with IsCode. Values are the driver's.
const (
	Success                       ErrorCode = 0
	ErrorInvalidValue             ErrorCode = 1
	ErrorOutOfMemory              ErrorCode = 2
	ErrorNotInitialized           ErrorCode = 3
	ErrorDeinitialized            ErrorCode = 4
	ErrorStubLibrary              ErrorCode = 34
	ErrorNoDevice                 ErrorCode = 100
	ErrorInvalidDevice            ErrorCode = 101
	ErrorInvalidImage             ErrorCode = 200
	ErrorInvalidContext           ErrorCode = 201
	ErrorNoBinaryForGPU           ErrorCode = 209
	ErrorPeerAccessUnsupported    ErrorCode = 217
	ErrorInvalidPTX               ErrorCode = 218
	ErrorUnsupportedPTXVersion    ErrorCode = 222
	ErrorInvalidSource            ErrorCode = 300
	ErrorInvalidHandle            ErrorCode = 400
	ErrorNotFound                 ErrorCode = 500
	ErrorNotReady                 ErrorCode = 600
	ErrorIllegalAddress           ErrorCode = 700
	ErrorLaunchOutOfResources     ErrorCode = 701
	ErrorLaunchTimeout            ErrorCode = 702
	ErrorPeerAccessAlreadyEnabled ErrorCode = 704
	ErrorPeerAccessNotEnabled     ErrorCode = 705
	ErrorContextIsDestroyed       ErrorCode = 709
	ErrorMisalignedAddress        ErrorCode = 716
	ErrorLaunchFailed             ErrorCode = 719
	ErrorNotPermitted             ErrorCode = 800
	ErrorNotSupported             ErrorCode = 801
	ErrorUnknown                  ErrorCode = 999
)

// codeNames backs String when the driver cannot name a code itself.
var codeNames = map[ErrorCode]string{
	Success:                       "CUDA_SUCCESS",
	ErrorInvalidValue:             "CUDA_ERROR_INVALID_VALUE",
	ErrorOutOfMemory:              "CUDA_ERROR_OUT_OF_MEMORY",
	ErrorNotInitialized:           "CUDA_ERROR_NOT_INITIALIZED",
	ErrorDeinitialized:            "CUDA_ERROR_DEINITIALIZED",
	ErrorStubLibrary:              "CUDA_ERROR_STUB_LIBRARY",
	ErrorNoDevice:                 "CUDA_ERROR_NO_DEVICE",
	ErrorInvalidDevice:            "CUDA_ERROR_INVALID_DEVICE",
	ErrorInvalidImage:             "CUDA_ERROR_INVALID_IMAGE",
	ErrorInvalidContext:           "CUDA_ERROR_INVALID_CONTEXT",
	ErrorNoBinaryForGPU:           "CUDA_ERROR_NO_BINARY_FOR_GPU",
	ErrorPeerAccessUnsupported:    "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	ErrorInvalidPTX:               "CUDA_ERROR_INVALID_PTX",
	ErrorUnsupportedPTXVersion:    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	ErrorInvalidSource:            "CUDA_ERROR_INVALID_SOURCE",
	ErrorInvalidHandle:            "CUDA_ERROR_INVALID_HANDLE",
	ErrorNotFound:                 "CUDA_ERROR_NOT_FOUND",
	ErrorNotReady:                 "CUDA_ERROR_NOT_READY",
	ErrorIllegalAddress:           "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrorLaunchOutOfResources:     "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	ErrorLaunchTimeout:            "CUDA_ERROR_LAUNCH_TIMEOUT",
	ErrorPeerAccessAlreadyEnabled: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	ErrorPeerAccessNotEnabled:     "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	ErrorContextIsDestroyed:       "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	ErrorMisalignedAddress:        "CUDA_ERROR_MISALIGNED_ADDRESS",
	ErrorLaunchFailed:             "CUDA_ERROR_LAUNCH_FAILED",
	ErrorNotPermitted:             "CUDA_ERROR_NOT_PERMITTED",
	ErrorNotSupported:             "CUDA_ERROR_NOT_SUPPORTED",
	ErrorUnknown:                  "CUDA_ERROR_UNKNOWN",
}

// fallbackName is the code's CUDA_ERROR_* name from this package's table.
func (c ErrorCode) fallbackName() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", int32(c))
}

// String returns the code's CUDA_ERROR_* name as this package knows it.
func (c ErrorCode) String() string { return c.fallbackName() }

// Error is a failed driver call.
type Error struct {
	Call    string    // the driver function, e.g. "cuModuleGetFunction"
	Code    ErrorCode // the CUresult
	Name    string    // cuGetErrorName, e.g. "CUDA_ERROR_NOT_FOUND"
	Message string    // cuGetErrorString, e.g. "named symbol not found"
}

// Error renders "call: NAME (code): message".
func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = e.Code.fallbackName()
	}
	s := fmt.Sprintf("%s: %s (%d)", e.Call, name, int32(e.Code))
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// IsCode reports whether err is, or wraps, an *Error with the given code.
func IsCode(err error, code ErrorCode) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// newError describes a failed call, asking the driver to name the code.
// The names are the driver's static strings; when it cannot be asked, the
// package's own table names the code.
func (d *driver) newError(call string, rc ErrorCode) *Error {
	e := &Error{Call: call, Code: rc}
	if fn, err := d.cuGetErrorName.Get(d.lib.Library); err == nil {
		var p *byte
		if fn(rc, &p) == Success {
			e.Name = cString(p)
		}
	}
	if fn, err := d.cuGetErrorString.Get(d.lib.Library); err == nil {
		var p *byte
		if fn(rc, &p) == Success {
			e.Message = cString(p)
		}
	}
	if e.Name == "" {
		e.Name = rc.fallbackName()
	}
	return e
}

// check turns a CUresult into nil or an *Error.
func (d *driver) check(call string, rc ErrorCode) error {
	if rc == Success {
		return nil
	}
	return d.newError(call, rc)
}

// cString copies a NUL-terminated C string (at most 4096 bytes).
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := 0; i < 4096; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
