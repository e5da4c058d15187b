package loader

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"driver names", &Error{Call: "cuModuleGetFunction", Code: ErrorNotFound, Name: "CUDA_ERROR_NOT_FOUND", Message: "named symbol not found"},
			"cuModuleGetFunction: CUDA_ERROR_NOT_FOUND (500): named symbol not found"},
		{"fallback name", &Error{Call: "cuMemAlloc_v2", Code: ErrorOutOfMemory},
			"cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2)"},
		{"unknown code", &Error{Call: "cuX", Code: 12345},
			"cuX: CUresult(12345) (12345)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.err.Error())
		})
	}
}

func TestIsCode(t *testing.T) {
	base := &Error{Call: "cuModuleLoadDataEx", Code: ErrorInvalidPTX}
	tests := []struct {
		name string
		err  error
		code ErrorCode
		want bool
	}{
		{"direct", base, ErrorInvalidPTX, true},
		{"other code", base, ErrorNotFound, false},
		{"wrapped", fmt.Errorf("ctx: %w", base), ErrorInvalidPTX, true},
		{"jit error", &JITError{Kind: ImagePTX, Err: base, Log: "x"}, ErrorInvalidPTX, true},
		{"nil", nil, ErrorInvalidPTX, false},
		{"plain", errors.New("no"), ErrorInvalidPTX, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, IsCode(tc.err, tc.code))
		})
	}
}

func TestErrorCodeString(t *testing.T) {
	assert.Equal(t, "CUDA_ERROR_INVALID_CONTEXT", ErrorInvalidContext.String())
	assert.Equal(t, "CUDA_SUCCESS", Success.String())
	assert.Equal(t, "CUresult(4242)", ErrorCode(4242).String())
	for code, name := range codeNames {
		assert.Contains(t, name, "CUDA_", "code %d", code)
	}
}

func TestSymbolError(t *testing.T) {
	e := &SymbolError{Name: "cuEventElapsedTime_v2", Library: "libcuda.so.1", DriverVersion: 12040, Err: errors.New("undefined symbol")}
	assert.ErrorIs(t, e, ErrMissingSymbol)
	assert.NotErrorIs(t, e, ErrNoDriver)
	assert.Equal(t, "loader: symbol cuEventElapsedTime_v2 not found in libcuda.so.1 (driver version 12040 (CUDA 12.4)): undefined symbol", e.Error())
	assert.Contains(t, (&SymbolError{Name: "cuX", Err: errors.New("e")}).Error(), "driver version unknown")
}

func TestCString(t *testing.T) {
	b := []byte("CUDA_ERROR_NOT_FOUND\x00trailing")
	assert.Equal(t, "CUDA_ERROR_NOT_FOUND", cString(&b[0]))
	assert.Equal(t, "", cString(nil))
}
