package loader

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type pair struct {
	A int32
	B float32
}

type withPtr struct {
	A int32
	P *int32
}

func TestElemSize(t *testing.T) {
	tests := []struct {
		name string
		size func() (int, error)
		want int // 0: an error is expected
	}{
		{"float32", elemSize[float32], 4},
		{"uint16 (bf16 bits)", elemSize[uint16], 2},
		{"complex128", elemSize[complex128], 16},
		{"array", elemSize[[3]uint16], 6},
		{"struct", elemSize[pair], 8},
		{"int", elemSize[int], 0},
		{"uintptr", elemSize[uintptr], 0},
		{"pointer", elemSize[*int32], 0},
		{"string", elemSize[string], 0},
		{"struct with pointer", elemSize[withPtr], 0},
		{"empty struct", elemSize[struct{}], 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, err := tc.size()
			if tc.want == 0 {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, n)
		})
	}
}

func TestSliceBytes(t *testing.T) {
	s := []float32{1, 2, 3}
	b, err := sliceBytes("op", s, 12)
	require.NoError(t, err)
	assert.Len(t, b, 12)
	assert.Same(t, &b[0], (*byte)(anyPtr(&s[0])))

	_, err = sliceBytes("CopyToDevice", s, 16)
	assert.EqualError(t, err, "loader: CopyToDevice: 3 elements of 4 bytes are 12 bytes, the buffer has 16")
	_, err = sliceBytes("op", []int{1}, 8)
	assert.ErrorContains(t, err, "not a fixed-size plain type")

	freed := &Buffer{size: 12}
	freed.root = freed
	freed.freed.Store(true)
	assert.ErrorIs(t, CopyToDevice(freed, s), ErrClosed)
	assert.ErrorIs(t, CopyFromDevice(freed, s), ErrClosed)
}
