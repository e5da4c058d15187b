// Package bf16 converts between float32 and bfloat16 (the upper 16 bits of
// an IEEE-754 binary32) the way the CUDA kernels do: round to nearest, ties to
// even, with every NaN mapped to the canonical NaN 0x7FFF that the hardware
// conversion (cvt.rn.bf16.f32) produces.
//
// Device buffers hold bf16 as little-endian 16-bit words; Bytes and FromBytes
// convert slices to and from that layout.
package bf16

import (
	"encoding/binary"
	"fmt"
	"math"
)

// BF16 is one bfloat16 value, stored as its bit pattern.
type BF16 uint16

// Well-known bit patterns.
const (
	// NaN is the canonical NaN that the conversion produces for every NaN input.
	NaN BF16 = 0x7FFF
	// PosInf is +Inf.
	PosInf BF16 = 0x7F80
	// NegInf is -Inf.
	NegInf BF16 = 0xFF80
)

// Float32ToBF16 rounds f to the nearest bfloat16, ties to even. Values too
// large for bf16 round to ±Inf; NaN becomes NaN (0x7FFF).
func Float32ToBF16(f float32) BF16 {
	u := math.Float32bits(f)
	if u&0x7FFFFFFF > 0x7F800000 {
		return NaN
	}
	// Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even;
	// a carry into the exponent gives the next binade or Inf, as it should.
	u += 0x7FFF + (u>>16)&1
	return BF16(u >> 16)
}

// BF16ToFloat32 widens b to float32 exactly.
func BF16ToFloat32(b BF16) float32 {
	return math.Float32frombits(uint32(b) << 16)
}

// Float32 widens b to float32 exactly.
func (b BF16) Float32() float32 { return BF16ToFloat32(b) }

// IsNaN reports whether b is a NaN.
func (b BF16) IsNaN() bool { return b&0x7FFF > 0x7F80 }

// FromFloat32s rounds every element of f to bf16.
func FromFloat32s(f []float32) []BF16 {
	out := make([]BF16, len(f))
	for i, v := range f {
		out[i] = Float32ToBF16(v)
	}
	return out
}

// ToFloat32s widens every element of b to float32.
func ToFloat32s(b []BF16) []float32 {
	out := make([]float32, len(b))
	for i, v := range b {
		out[i] = BF16ToFloat32(v)
	}
	return out
}

// Round returns f rounded to bf16 and widened back: the value a kernel sees
// after the host stores f as bf16.
func Round(f float32) float32 { return BF16ToFloat32(Float32ToBF16(f)) }

// Bytes returns b as little-endian 16-bit words, the device layout.
func Bytes(b []BF16) []byte {
	out := make([]byte, 2*len(b))
	for i, v := range b {
		binary.LittleEndian.PutUint16(out[2*i:], uint16(v))
	}
	return out
}

// FromBytes decodes little-endian 16-bit words. The length must be even.
func FromBytes(p []byte) ([]BF16, error) {
	if len(p)%2 != 0 {
		return nil, fmt.Errorf("bf16: %d bytes is not a whole number of 2-byte values", len(p))
	}
	out := make([]BF16, len(p)/2)
	for i := range out {
		out[i] = BF16(binary.LittleEndian.Uint16(p[2*i:]))
	}
	return out, nil
}

// ULPDistance is how many representable bf16 values lie between a and b
// (0 when equal, +0 and -0 count as equal). It returns -1 when either is NaN.
func ULPDistance(a, b BF16) int {
	if a.IsNaN() || b.IsNaN() {
		return -1
	}
	ka, kb := orderKey(a), orderKey(b)
	if ka > kb {
		return ka - kb
	}
	return kb - ka
}

// orderKey maps a non-NaN bf16 to an integer that is monotonic in its value,
// with +0 and -0 on the same key.
func orderKey(b BF16) int {
	if b&0x8000 != 0 {
		return -int(b & 0x7FFF)
	}
	return int(b)
}
