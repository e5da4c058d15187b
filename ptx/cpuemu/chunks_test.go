package cpuemu

import (
	"math"
	"math/rand/v2"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
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

// rowValues reads an fp32 output b of per values a token: for each chunk in
// order, each of heads heads, each of the chunk's rows, the width values at
// head h's h*width, as float64 (the order the tests' references use).
func (c gappedChunks) rowValues(b []byte, heads, width, per int) []float64 {
	var vals []float64
	for ci := range c.tok0 {
		for h := 0; h < heads; h++ {
			for i := 0; i < int(c.clen[ci]); i++ {
				for x := 0; x < width; x++ {
					vals = append(vals, float64(f32Of(b, (int(c.tok0[ci])+i)*per+h*width+x)))
				}
			}
		}
	}
	return vals
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

// normalRows returns rows rows of dHead N(0, 1) values (rows a multiple of
// T, token-major), NaN in the rows of gap tokens.
func (c gappedChunks) normalRows(rng *rand.Rand, rows int) []float32 {
	nan32 := float32(math.NaN())
	out := make([]float32, rows*dHead)
	per := rows / c.T
	for r := 0; r < rows; r++ {
		for x := 0; x < dHead; x++ {
			if c.owned[r/per] {
				out[r*dHead+x] = float32(rng.NormFloat64())
			} else {
				out[r*dHead+x] = nan32
			}
		}
	}
	return out
}

// gradsInputs are the per-value-head inputs of the chunk gradients' tests:
// V', dV' and dO (bf16) N(0, 1); v (bf16, rows of HV*128 + pad, the padding
// poisoned); gcum (in-chunk cumsums of g in [-0.3, -0.01]) and beta in
// [0.02, 0.98]; the chunk start states H and end adjoints D. Gap tokens hold
// NaN.
type gradsInputs struct {
	vnew, dvnew, gcum, beta, h, dChunk []float32
	dout, v                            []bf16.BF16
	vStride                            int
}

// newGradsInputs draws gradsInputs for HV value heads over the chunks c.
func newGradsInputs(c gappedChunks, rng *rand.Rand, HV, vPad int, seed uint64) gradsInputs {
	T, NC := c.T, len(c.tok0)
	nan32 := float32(math.NaN())
	gi := gradsInputs{vnew: c.normalRows(rng, T*HV), dvnew: c.normalRows(rng, T*HV)}
	doutF := c.normalRows(rng, T*HV)
	gi.dout = make([]bf16.BF16, len(doutF))
	for i, x := range doutF {
		gi.dout[i] = bf16.Float32ToBF16(x) // NaN stays NaN
	}
	gi.vStride = HV*dHead + vPad
	gi.v = make([]bf16.BF16, T*gi.vStride)
	for i := range gi.v {
		gi.v[i] = bf16.BF16(poisonBF16)
	}
	gi.gcum, gi.beta = make([]float32, T*HV), make([]float32, T*HV)
	for i := range gi.gcum {
		gi.gcum[i], gi.beta[i] = nan32, nan32
	}
	for ci := range c.tok0 {
		t0, n := int(c.tok0[ci]), int(c.clen[ci])
		for h := 0; h < HV; h++ {
			var acc float32
			for i := 0; i < n; i++ {
				acc += float32(-0.01 - 0.29*rng.Float64())
				gi.gcum[(t0+i)*HV+h] = acc
				gi.beta[(t0+i)*HV+h] = float32(0.02 + 0.96*rng.Float64())
				for x := 0; x < dHead; x++ {
					gi.v[(t0+i)*gi.vStride+h*dHead+x] = bf16.Float32ToBF16(float32(rng.NormFloat64()))
				}
			}
		}
	}
	gi.h = randomStates(NC*HV, seed+100)
	gi.dChunk = randomStates(NC*HV, seed+200)
	return gi
}
