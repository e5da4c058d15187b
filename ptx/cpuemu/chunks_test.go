package cpuemu

import (
	"math"
	"math/rand/v2"
)

// gappedChunks lays out chunks for the chunk-parallel kernels' tests: each
// chunk is followed by gap tokens that no chunk owns, whose inputs the tests
// fill with NaN (a kernel that reads past a chunk's end computes NaN) and
// whose outputs they poison (one that writes past it changes the poison).
type gappedChunks struct {
	tok0, clen []int32 // first token and length of each chunk
	T          int     // tokens, gaps included
	owned      []bool  // [T]: the token belongs to a chunk
}

// newGappedChunks places chunks of the given lengths, each followed by gap
// tokens.
func newGappedChunks(lens []int, gap int) gappedChunks {
	var c gappedChunks
	for _, n := range lens {
		c.tok0 = append(c.tok0, int32(c.T))
		c.clen = append(c.clen, int32(n))
		c.T += n + gap
	}
	c.owned = make([]bool, c.T)
	for ci := range c.tok0 {
		for i := 0; i < int(c.clen[ci]); i++ {
			c.owned[int(c.tok0[ci])+i] = true
		}
	}
	return c
}

// unitRows returns rows l2-normalised random rows of dHead values (rows a
// multiple of T, token-major), NaN in the rows of gap tokens.
func (c gappedChunks) unitRows(rng *rand.Rand, rows int) []float32 {
	nan32 := float32(math.NaN())
	out := make([]float32, rows*dHead)
	per := rows / c.T
	for r := 0; r < rows; r++ {
		row := out[r*dHead : (r+1)*dHead]
		if !c.owned[r/per] {
			for x := range row {
				row[x] = nan32
			}
			continue
		}
		raw := make([]float64, dHead)
		var ss float64
		for x := range raw {
			raw[x] = rng.NormFloat64()
			ss += raw[x] * raw[x]
		}
		for x := range row {
			row[x] = float32(raw[x] / math.Sqrt(ss))
		}
	}
	return out
}
