// Package stats holds the summary statistics the benchmarks report.
package stats

import "slices"

// Median is the median of xs: the middle value, or the mean of the middle
// two for an even count; 0 for none. xs is not changed.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
