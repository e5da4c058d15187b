package kcp

import (
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tensor scans run in blocks of checkBlock on every core and report the
// element a scan in index order finds first, whichever block finishes first.
func TestFirstElement(t *testing.T) {
	n := 3*checkBlock + 17
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	for _, tc := range []struct {
		name string
		bad  map[int]float32
		want int
	}{
		{"none", nil, -1},
		{"first element", map[int]float32{0: nan}, 0},
		{"last element", map[int]float32{n - 1: inf}, n - 1},
		{"two blocks: the lower wins", map[int]float32{2*checkBlock + 5: nan, checkBlock + 9: inf}, checkBlock + 9},
		{"one block, two elements", map[int]float32{checkBlock - 1: nan, checkBlock - 2: inf}, checkBlock - 2},
		{"every block", map[int]float32{3 * checkBlock: nan, 2 * checkBlock: nan, checkBlock: nan, 7: inf}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := make([]float32, n)
			for i := range data {
				data[i] = float32(i%7) - 3
			}
			for i, v := range tc.bad {
				data[i] = v
			}
			got := firstElement(data, func(v float32) bool { return math.Float32bits(v)&0x7f800000 == 0x7f800000 })
			assert.Equal(t, tc.want, got)
			sh := TensorShape{Name: "x", Dims: "[N]", Shape: []int{n}}
			err := checkTensor(sh, data, true)
			if tc.want < 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "x [N]: element "+strconv.Itoa(tc.want)+" ")
			require.NoError(t, checkTensor(sh, data, false), "finiteness not asked for")
		})
	}
	assert.Equal(t, -1, firstElement(nil, func(float32) bool { return true }))
	// The finiteness test is exactly NaN or ±Inf: the largest finite float32 and the smallest subnormal pass.
	sh := TensorShape{Name: "x", Dims: "[N]", Shape: []int{4}}
	require.NoError(t, checkTensor(sh, []float32{math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 0}, true))
	require.ErrorContains(t, checkTensor(sh, []float32{0, 0, float32(math.Inf(1)), 0}, true), "element 2 ([2]) is +Inf")
}
