package loader

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPrepareImage(t *testing.T) {
	ptx := ".version 8.0\n.target sm_80\n.address_size 64\n"
	roomy := make([]byte, len(ptx), len(ptx)+16)
	copy(roomy, ptx)
	elf := []byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0x41}
	fat := []byte{0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0}

	tests := []struct {
		name     string
		in       []byte
		kind     ImageKind
		want     []byte
		sameData bool // the input is passed through, not copied
	}{
		{"ptx without NUL", []byte(ptx), ImagePTX, append([]byte(ptx), 0), false},
		{"ptx with spare capacity", roomy, ImagePTX, append([]byte(ptx), 0), false},
		{"ptx with NUL", append([]byte(ptx), 0), ImagePTX, append([]byte(ptx), 0), true},
		{"cubin", elf, ImageCubin, elf, true},
		{"fatbin", fat, ImageFatbin, fat, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := append([]byte(nil), tc.in...)
			out, kind, err := prepareImage(tc.in)
			require.NoError(t, err)
			assert.Equal(t, tc.kind, kind)
			assert.Equal(t, tc.want, out)
			assert.Equal(t, before, tc.in, "the caller's bytes are unchanged")
			assert.Equal(t, tc.sameData, &out[0] == &tc.in[0])
			if !tc.sameData && cap(tc.in) > len(tc.in) {
				spare := tc.in[:cap(tc.in)][len(tc.in)]
				assert.Zero(t, spare, "nothing was written past the caller's length")
				assert.NotSame(t, &out[0], &tc.in[0])
			}
		})
	}
	_, _, err := prepareImage(nil)
	assert.ErrorContains(t, err, "empty module image")
}

func TestImageKindString(t *testing.T) {
	assert.Equal(t, "ptx", ImagePTX.String())
	assert.Equal(t, "cubin", ImageCubin.String())
	assert.Equal(t, "fatbin", ImageFatbin.String())
	assert.Equal(t, "ImageKind(9)", ImageKind(9).String())
}

func TestJITErrorFormat(t *testing.T) {
	cause := &Error{Call: "cuModuleLoadDataEx", Code: ErrorInvalidPTX, Name: "CUDA_ERROR_INVALID_PTX", Message: "a PTX JIT compilation failed"}
	e := &JITError{Kind: ImagePTX, Size: 120, Err: cause, Log: "ptxas application ptx input, line 7; error   : Unknown symbol 'nope'"}
	assert.Equal(t, "loader: load ptx module (120 bytes): cuModuleLoadDataEx: CUDA_ERROR_INVALID_PTX (218): a PTX JIT compilation failed\n"+
		"JIT error log:\nptxas application ptx input, line 7; error   : Unknown symbol 'nope'", e.Error())
	assert.True(t, IsCode(e, ErrorInvalidPTX))
	var got *Error
	assert.True(t, errors.As(e, &got))
	assert.NotContains(t, (&JITError{Kind: ImageCubin, Err: cause}).Error(), "JIT error log")
}

func TestLogText(t *testing.T) {
	buf := make([]byte, 32)
	copy(buf, "info line\n\x00garbage")
	assert.Equal(t, "info line", logText(buf, 32))
	assert.Equal(t, "info", logText(buf, 4))
	assert.Equal(t, "", logText(make([]byte, 8), 8))
}
