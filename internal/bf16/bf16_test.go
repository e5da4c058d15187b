package bf16

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFloat32ToBF16(t *testing.T) {
	tests := []struct {
		name string
		in   uint32 // float32 bits
		want BF16
	}{
		{"one", 0x3F800000, 0x3F80},
		{"minus two", 0xC0000000, 0xC000},
		{"zero", 0x00000000, 0x0000},
		{"minus zero", 0x80000000, 0x8000},
		{"below half rounds down", 0x3F807FFF, 0x3F80},
		{"tie to even stays", 0x3F808000, 0x3F80},
		{"tie to even goes up", 0x3F818000, 0x3F82},
		{"above half rounds up", 0x3F808001, 0x3F81},
		{"negative rounds by magnitude", 0xBF80C000, 0xBF81},
		{"carry into exponent", 0x3FFFFFFF, 0x4000},
		{"largest finite rounds to inf", 0x7F7FFFFF, PosInf},
		{"largest bf16 stays", 0x7F7F0000, 0x7F7F},
		{"just below overflow tie", 0x7F7F7FFF, 0x7F7F},
		{"inf", 0x7F800000, PosInf},
		{"minus inf", 0xFF800000, NegInf},
		{"quiet nan", 0x7FC00000, NaN},
		{"signalling nan low bits only", 0x7F800001, NaN},
		{"negative nan", 0xFFC00001, NaN},
		{"smallest subnormal rounds to zero", 0x00000001, 0x0000},
		{"subnormal tie to even down", 0x00008000, 0x0000},
		{"subnormal tie to even up", 0x00018000, 0x0002},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Float32ToBF16(math.Float32frombits(tc.in))
			assert.Equalf(t, tc.want, got, "Float32ToBF16(%#08x) = %#04x, want %#04x", tc.in, uint16(got), uint16(tc.want))
		})
	}
}

func TestRoundTripEveryBF16(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		b := BF16(i)
		f := BF16ToFloat32(b)
		require.Equal(t, uint32(i)<<16, math.Float32bits(f), "widening %#04x", i)
		got := Float32ToBF16(f)
		if b.IsNaN() {
			require.Equal(t, NaN, got, "NaN %#04x", i)
			continue
		}
		require.Equal(t, b, got, "round trip of %#04x", i)
	}
}

func TestRoundIsNearest(t *testing.T) {
	// For many float32 values the rounded value is at least as close as both
	// bf16 neighbours of the truncated value.
	for i := uint32(0); i < 1<<18; i++ {
		u := (i*4099 + 0x3F000000) & 0x7F7EFFFF // finite, below the largest bf16
		f := math.Float32frombits(u)
		r := Float32ToBF16(f)
		require.NotEqualf(t, PosInf, r, "%#08x", u)
		lo := BF16(u >> 16)
		hi := lo + 1
		dr := math.Abs(float64(r.Float32()) - float64(f))
		require.LessOrEqualf(t, dr, math.Abs(float64(lo.Float32())-float64(f)), "%#08x", u)
		require.LessOrEqualf(t, dr, math.Abs(float64(hi.Float32())-float64(f)), "%#08x", u)
	}
}

func TestSlicesAndBytes(t *testing.T) {
	in := []float32{1, -2.5, 3.140625, 0, float32(math.Inf(-1))}
	b := FromFloat32s(in)
	assert.Equal(t, []BF16{0x3F80, 0xC020, 0x4049, 0x0000, NegInf}, b)
	assert.Equal(t, in, ToFloat32s(b))
	raw := Bytes(b)
	assert.Equal(t, []byte{0x80, 0x3F, 0x20, 0xC0, 0x49, 0x40, 0x00, 0x00, 0x80, 0xFF}, raw)
	back, err := FromBytes(raw)
	require.NoError(t, err)
	assert.Equal(t, b, back)
	_, err = FromBytes(raw[:3])
	assert.ErrorContains(t, err, "3 bytes")
	assert.Equal(t, float32(1), Round(1.001))
}

func TestULPDistance(t *testing.T) {
	tests := []struct {
		name string
		a, b BF16
		want int
	}{
		{"equal", 0x3F80, 0x3F80, 0},
		{"zeros", 0x0000, 0x8000, 0},
		{"neighbours", 0x3F80, 0x3F81, 1},
		{"across zero", 0x0001, 0x8001, 2},
		{"negative neighbours", 0xBF81, 0xBF80, 1},
		{"nan", NaN, 0x3F80, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ULPDistance(tc.a, tc.b))
			assert.Equal(t, tc.want, ULPDistance(tc.b, tc.a))
		})
	}
}
