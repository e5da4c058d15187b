package comm

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrNoNCCL is returned (wrapped) by every NCCL entry point when the NCCL library cannot be opened
// (libnccl.so.2, then libnccl.so). Test for it with errors.Is; callers fall back to the loopback.
var ErrNoNCCL = errors.New("comm: NCCL library not found")

// ErrTimeout is matched (errors.Is) by the error of an NCCL collective or init that did not complete
// within its timeout: [NCCLComm.Timeout] when the context has no deadline.
var ErrTimeout = errors.New("timed out")

// NCCLResult is an ncclResult_t, the status every NCCL function returns.
type NCCLResult int32

// The ncclResult_t values. NCCLTimeout only exists in recent NCCL headers; libraries that lack it never
// return it.
const (
	NCCLSuccess            NCCLResult = 0
	NCCLUnhandledCudaError NCCLResult = 1
	NCCLSystemError        NCCLResult = 2
	NCCLInternalError      NCCLResult = 3
	NCCLInvalidArgument    NCCLResult = 4
	NCCLInvalidUsage       NCCLResult = 5
	NCCLRemoteError        NCCLResult = 6
	NCCLInProgress         NCCLResult = 7
	NCCLTimeout            NCCLResult = 8
)

// ncclResultNames are the C names of the results, for String.
var ncclResultNames = map[NCCLResult]string{
	NCCLSuccess:            "ncclSuccess",
	NCCLUnhandledCudaError: "ncclUnhandledCudaError",
	NCCLSystemError:        "ncclSystemError",
	NCCLInternalError:      "ncclInternalError",
	NCCLInvalidArgument:    "ncclInvalidArgument",
	NCCLInvalidUsage:       "ncclInvalidUsage",
	NCCLRemoteError:        "ncclRemoteError",
	NCCLInProgress:         "ncclInProgress",
	NCCLTimeout:            "ncclTimeout",
}

// ncclResultMessages stand in for ncclGetErrorString when the library cannot be asked.
var ncclResultMessages = map[NCCLResult]string{
	NCCLSuccess:            "no error",
	NCCLUnhandledCudaError: "unhandled cuda error",
	NCCLSystemError:        "unhandled system error",
	NCCLInternalError:      "internal error",
	NCCLInvalidArgument:    "invalid argument",
	NCCLInvalidUsage:       "invalid usage",
	NCCLRemoteError:        "remote process exited or there was a network error",
	NCCLInProgress:         "NCCL operation in progress",
	NCCLTimeout:            "operation timed out",
}

// String returns the result's C name, e.g. "ncclSystemError", or "ncclResult(42)" for a value this
// package does not know.
func (r NCCLResult) String() string {
	if n, ok := ncclResultNames[r]; ok {
		return n
	}
	return "ncclResult(" + strconv.Itoa(int(r)) + ")"
}

// fallbackMessage is a short description of the result when ncclGetErrorString is not available.
func (r NCCLResult) fallbackMessage() string {
	if m, ok := ncclResultMessages[r]; ok {
		return m
	}
	return "unknown NCCL result"
}

// NCCLError is a failed NCCL call, or an asynchronous error reported by ncclCommGetAsyncError.
type NCCLError struct {
	Call    string     // the NCCL function, e.g. "ncclCommInitRank"
	Code    NCCLResult // the ncclResult_t
	Name    string     // the result's C name, e.g. "ncclSystemError"
	Message string     // ncclGetErrorString, or this package's description when NCCL cannot be asked
	Last    string     // ncclGetLastError: NCCL's last error text, when it has one (it may concern an earlier call)
}

// Error renders "call: Name (code): message[; last NCCL error: ...]".
func (e *NCCLError) Error() string {
	s := fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, int32(e.Code), e.Message)
	if e.Last != "" {
		s += "; last NCCL error: " + e.Last
	}
	return s
}

// IsNCCLCode reports whether err is, or wraps, an [*NCCLError] with the given code.
func IsNCCLCode(err error, code NCCLResult) bool {
	var e *NCCLError
	return errors.As(err, &e) && e.Code == code
}

// NCCLDataType is an ncclDataType_t, the element type of a collective's buffers.
type NCCLDataType int32

// The ncclDataType_t values of NCCL 2.x.
const (
	NCCLInt8     NCCLDataType = 0
	NCCLUint8    NCCLDataType = 1
	NCCLInt32    NCCLDataType = 2
	NCCLUint32   NCCLDataType = 3
	NCCLInt64    NCCLDataType = 4
	NCCLUint64   NCCLDataType = 5
	NCCLFloat16  NCCLDataType = 6
	NCCLFloat32  NCCLDataType = 7
	NCCLFloat64  NCCLDataType = 8
	NCCLBfloat16 NCCLDataType = 9
)

// Size returns the element size in bytes, or 0 for a type this package does not know.
func (t NCCLDataType) Size() int {
	switch t {
	case NCCLInt8, NCCLUint8:
		return 1
	case NCCLFloat16, NCCLBfloat16:
		return 2
	case NCCLInt32, NCCLUint32, NCCLFloat32:
		return 4
	case NCCLInt64, NCCLUint64, NCCLFloat64:
		return 8
	}
	return 0
}

// String returns the type's C name, e.g. "ncclFloat32".
func (t NCCLDataType) String() string {
	names := [...]string{"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
		"ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16"}
	if t >= 0 && int(t) < len(names) {
		return names[t]
	}
	return "ncclDataType(" + strconv.Itoa(int(t)) + ")"
}

// NCCLRedOp is an ncclRedOp_t, the reduction of a reducing collective. gdnkcp's exchange only
// all-gathers (reductions would fix no order across ranks); the values are here for completeness.
type NCCLRedOp int32

// The built-in ncclRedOp_t values.
const (
	NCCLSum  NCCLRedOp = 0
	NCCLProd NCCLRedOp = 1
	NCCLMax  NCCLRedOp = 2
	NCCLMin  NCCLRedOp = 3
	NCCLAvg  NCCLRedOp = 4
)
