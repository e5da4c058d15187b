package stats

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"none", nil, 0},
		{"one", []float64{3.5}, 3.5},
		{"odd, unsorted", []float64{5, 1, 3}, 3},
		{"even: the middle two's mean", []float64{4, 1, 3, 2}, 2.5},
		{"repeats", []float64{2, 2, 9, 2}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.xs...)
			assert.Equal(t, tc.want, Median(tc.xs))
			assert.Equal(t, in, tc.xs, "the input is not reordered")
		})
	}
}
