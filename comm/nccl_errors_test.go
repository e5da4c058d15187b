package comm

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// withNCCL points the package at a library of the given names until the test ends.
func withNCCL(t *testing.T, names ...string) *ncclAPI {
	t.Helper()
	saved := ncclLib
	t.Cleanup(func() { ncclLib = saved })
	ncclLib = newNCCLAPI(names)
	return ncclLib
}

func TestNCCLErrorFormatting(t *testing.T) {
	tests := []struct {
		code NCCLResult
		name string
		msg  string
	}{
		{NCCLSuccess, "ncclSuccess", "no error"},
		{NCCLUnhandledCudaError, "ncclUnhandledCudaError", "unhandled cuda error"},
		{NCCLSystemError, "ncclSystemError", "unhandled system error"},
		{NCCLInternalError, "ncclInternalError", "internal error"},
		{NCCLInvalidArgument, "ncclInvalidArgument", "invalid argument"},
		{NCCLInvalidUsage, "ncclInvalidUsage", "invalid usage"},
		{NCCLRemoteError, "ncclRemoteError", "remote process exited or there was a network error"},
		{NCCLInProgress, "ncclInProgress", "NCCL operation in progress"},
		{NCCLTimeout, "ncclTimeout", "operation timed out"},
		{NCCLResult(42), "ncclResult(42)", "unknown NCCL result"},
	}
	// No library: the messages are this package's own, and there is no last error.
	api := newNCCLAPI([]string{"libnccl-gdnkcp-test-missing.so"})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.name, tc.code.String())
			e := api.newError("ncclCommInitRank", tc.code, 0)
			assert.Equal(t, &NCCLError{Call: "ncclCommInitRank", Code: tc.code, Name: tc.name, Message: tc.msg}, e)
			assert.Equal(t, fmt.Sprintf("ncclCommInitRank: %s (%d): %s", tc.name, int32(tc.code), tc.msg), e.Error())
			wrapped := fmt.Errorf("context: %w", e)
			assert.True(t, IsNCCLCode(wrapped, tc.code))
			assert.False(t, IsNCCLCode(wrapped, tc.code+100))
		})
	}
	e := &NCCLError{Call: "ncclAllGather", Code: NCCLRemoteError, Name: "ncclRemoteError", Message: "remote",
		Last: "peer 1 closed the connection"}
	assert.Equal(t, "ncclAllGather: ncclRemoteError (6): remote; last NCCL error: peer 1 closed the connection", e.Error())
	assert.Nil(t, api.check("ncclGroupStart", NCCLSuccess, 0))
	assert.False(t, IsNCCLCode(errors.New("plain"), NCCLSystemError))
}

func TestNCCLDataTypes(t *testing.T) {
	tests := []struct {
		dt   NCCLDataType
		size int
		name string
	}{
		{NCCLInt8, 1, "ncclInt8"}, {NCCLUint8, 1, "ncclUint8"}, {NCCLInt32, 4, "ncclInt32"},
		{NCCLUint32, 4, "ncclUint32"}, {NCCLInt64, 8, "ncclInt64"}, {NCCLUint64, 8, "ncclUint64"},
		{NCCLFloat16, 2, "ncclFloat16"}, {NCCLFloat32, 4, "ncclFloat32"}, {NCCLFloat64, 8, "ncclFloat64"},
		{NCCLBfloat16, 2, "ncclBfloat16"}, {NCCLDataType(10), 0, "ncclDataType(10)"},
		{NCCLDataType(-1), 0, "ncclDataType(-1)"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.size, tc.dt.Size(), tc.name)
		assert.Equal(t, tc.name, tc.dt.String())
	}
}

func TestNCCLVersionString(t *testing.T) {
	for code, want := range map[int]string{22803: "2.28.3", 21400: "2.14.0", 2708: "2.7.8", 30001: "3.0.1"} {
		assert.Equal(t, want, NCCLVersionString(code), code)
	}
}

func TestNoNCCL(t *testing.T) {
	t.Setenv(EnvNCCLNVLSEnable, "0")
	withNCCL(t, "libnccl-gdnkcp-test-missing.so.2", "libnccl-gdnkcp-test-missing.so")

	_, err := NCCLVersion()
	require.ErrorIs(t, err, ErrNoNCCL)
	assert.Contains(t, err.Error(), "tried libnccl-gdnkcp-test-missing.so.2, libnccl-gdnkcp-test-missing.so")

	_, err = NewUniqueID()
	require.ErrorIs(t, err, ErrNoNCCL)
	assert.Contains(t, err.Error(), "comm: new NCCL unique id")

	// Argument errors come first; then the missing library, before any CUDA context is touched.
	var id UniqueID
	id.internal[0] = 1
	_, err = newNCCLComm(t.Context(), ncclLib, nil, id, 2, 0, NCCLOptions{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nil CUDA context")

	_, err = NewLocalNCCL(nil)
	assert.EqualError(t, err, "comm: NewLocalNCCL: no contexts")

	// A missing symbol in a library that opens: the C library itself stands in for NCCL.
	if _, err := os.Stat("/lib/x86_64-linux-gnu/libc.so.6"); err == nil {
		api := withNCCL(t, "libc.so.6")
		_, err := NCCLVersion()
		var se *NCCLSymbolError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, "ncclGetVersion", se.Name)
		assert.Equal(t, "libc.so.6", se.Library)
		assert.Contains(t, err.Error(), "comm: symbol ncclGetVersion not found in libc.so.6")
		assert.False(t, api.hasConfigInit())
	}
}

func TestEnsureNVLSOff(t *testing.T) {
	tests := []struct {
		name    string
		set     bool
		value   string
		want    string
		wantErr string
	}{
		{name: "unset becomes 0", want: "0"},
		{name: "0 stays", set: true, value: "0", want: "0"},
		{name: "padded 0 stays", set: true, value: " 0 ", want: " 0 "},
		{name: "1 refused", set: true, value: "1", want: "1",
			wantErr: `comm: NCCL_NVLS_ENABLE="1": gdnkcp keeps NVLink multicast (NVLS) off; unset it or set it to 0`},
		{name: "empty refused", set: true, value: "", want: "",
			wantErr: `comm: NCCL_NVLS_ENABLE="": gdnkcp keeps NVLink multicast (NVLS) off; unset it or set it to 0`},
		{name: "word refused", set: true, value: "off", want: "off",
			wantErr: `NCCL_NVLS_ENABLE="off"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvNCCLNVLSEnable, "placeholder") // restored when the test ends
			if tc.set {
				require.NoError(t, os.Setenv(EnvNCCLNVLSEnable, tc.value))
			} else {
				require.NoError(t, os.Unsetenv(EnvNCCLNVLSEnable))
			}
			err := EnsureNVLSOff()
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			v, ok := os.LookupEnv(EnvNCCLNVLSEnable)
			assert.True(t, ok)
			assert.Equal(t, tc.want, v)
			if !tc.set {
				// NCCL reads the C environment: check that it sees the 0 too.
				if cv, ok := cGetenv(t, EnvNCCLNVLSEnable); ok {
					assert.Equal(t, "0", cv, "libc getenv")
				}
			}
		})
	}

	// Every NCCL entry point refuses to start with NVLS asked for, before opening the library.
	t.Setenv(EnvNCCLNVLSEnable, "1")
	withNCCL(t, "libnccl-gdnkcp-test-missing.so")
	_, err := NewUniqueID()
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNoNCCL)
	assert.Contains(t, err.Error(), "keeps NVLink multicast (NVLS) off")
}
