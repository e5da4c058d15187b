// Package convref is the CPU reference of the depthwise causal conv1d + SiLU
// forward (DESIGN.md §3), taking the same arrays as the CUDA entry
// gdn_conv1d_silu_fwd:
//
//	x         bf16 [T, C]        the rank's tokens, channels innermost
//	w         bf16 [C, Width]    per-channel taps, oldest token first
//	halo      bf16 [nseg, Halo, C] the Halo tokens before each segment in its
//	                             document, oldest first (zeros at a document start)
//	segStart  int32 [nseg]       local start of each segment
//	segLen    int32 [nseg]       length of each segment
//	tokSeg    int32 [T]          the segment of each local token
//
// and y_t[c] = silu(sum_{i<Width} w[c,i] * x_{t-Halo+i}[c]), where a token
// before the segment's start is read from the segment's halo rows. The sum is
// taken in float64 on the bf16 inputs; the result is also rounded to bf16.
package convref

import (
	"errors"
	"fmt"
	"math"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

const (
	// Width is the number of taps of the conv.
	Width = 4
	// Halo is the number of tokens before a segment that the conv reads.
	Halo = Width - 1
)

// Result is the reference output.
type Result struct {
	// Y is Exact rounded to bf16, [T, C].
	Y []bf16.BF16
	// Exact is silu of the float64 sum, before rounding, [T, C].
	Exact []float64
	// Scale is sum_i |w[c,i] * x_{t-Halo+i}[c]| per output, [T, C]: the
	// rounding error of an fp32 accumulation is proportional to it.
	Scale []float64
	// T and C are the shape of the output.
	T, C int
}

// Conv1dSiLU computes the reference output. It returns an error when an
// array's length does not match T, C and nseg, or when the segment tables
// disagree (a token outside its segment, a segment outside the buffer).
func Conv1dSiLU(x, w, halo []bf16.BF16, segStart, segLen, tokSeg []int32, T, C, nseg int) (*Result, error) {
	if err := Validate(x, w, halo, segStart, segLen, tokSeg, T, C, nseg); err != nil {
		return nil, err
	}
	r := &Result{
		Y:     make([]bf16.BF16, T*C),
		Exact: make([]float64, T*C),
		Scale: make([]float64, T*C),
		T:     T,
		C:     C,
	}
	for t := 0; t < T; t++ {
		s := int(tokSeg[t])
		j := t - int(segStart[s]) // position inside the segment
		for c := 0; c < C; c++ {
			acc, scale := 0.0, 0.0
			for i := 0; i < Width; i++ {
				q := j - Halo + i
				var xv bf16.BF16
				if q >= 0 {
					xv = x[(int(segStart[s])+q)*C+c]
				} else {
					xv = halo[(s*Halo+q+Halo)*C+c]
				}
				p := float64(w[c*Width+i].Float32()) * float64(xv.Float32())
				acc += p
				scale += math.Abs(p)
			}
			y := SiLU(acc)
			r.Exact[t*C+c] = y
			r.Scale[t*C+c] = scale
			r.Y[t*C+c] = bf16.Float32ToBF16(float32(y))
		}
	}
	return r, nil
}

// SiLU is a / (1 + exp(-a)).
func SiLU(a float64) float64 { return a / (1 + math.Exp(-a)) }

// Validate checks the shapes and the segment tables the way a host must
// before launching the kernel.
func Validate(x, w, halo []bf16.BF16, segStart, segLen, tokSeg []int32, T, C, nseg int) error {
	if T < 0 || C < 0 || nseg < 0 {
		return fmt.Errorf("convref: negative shape T=%d C=%d nseg=%d", T, C, nseg)
	}
	for _, l := range []struct {
		name      string
		got, want int
	}{
		{"x", len(x), T * C},
		{"w", len(w), C * Width},
		{"halo", len(halo), nseg * Halo * C},
		{"seg_start", len(segStart), nseg},
		{"seg_len", len(segLen), nseg},
		{"tok_seg", len(tokSeg), T},
	} {
		if l.got != l.want {
			return fmt.Errorf("convref: %s has %d elements, want %d (T=%d C=%d nseg=%d)", l.name, l.got, l.want, T, C, nseg)
		}
	}
	for s := 0; s < nseg; s++ {
		st, ln := int(segStart[s]), int(segLen[s])
		if st < 0 || ln < 0 || st+ln > T {
			return fmt.Errorf("convref: segment %d [%d, %d+%d) is outside the buffer of %d tokens", s, st, st, ln, T)
		}
		for t := st; t < st+ln; t++ {
			if int(tokSeg[t]) != s {
				return fmt.Errorf("convref: token %d lies in segment %d but tok_seg says %d", t, s, tokSeg[t])
			}
		}
	}
	for t := 0; t < T; t++ {
		s := int(tokSeg[t])
		if s < 0 || s >= nseg {
			return fmt.Errorf("convref: tok_seg[%d] = %d, want 0..%d", t, s, nseg-1)
		}
		if st, ln := int(segStart[s]), int(segLen[s]); t < st || t >= st+ln {
			return fmt.Errorf("convref: token %d is outside its segment %d [%d, %d)", t, s, st, st+ln)
		}
	}
	return nil
}

// SegmentTables returns the tables for consecutive segments of the given
// lengths that fill a buffer of sum(lens) tokens in order.
func SegmentTables(lens []int) (segStart, segLen, tokSeg []int32, err error) {
	segStart = make([]int32, len(lens))
	segLen = make([]int32, len(lens))
	at := 0
	for s, l := range lens {
		if l < 0 {
			return nil, nil, nil, fmt.Errorf("convref: segment %d has negative length %d", s, l)
		}
		if at+l > math.MaxInt32 {
			return nil, nil, nil, errors.New("convref: more than 2^31-1 tokens")
		}
		segStart[s], segLen[s] = int32(at), int32(l)
		for range l {
			tokSeg = append(tokSeg, int32(s))
		}
		at += l
	}
	if tokSeg == nil {
		tokSeg = []int32{}
	}
	return segStart, segLen, tokSeg, nil
}

// Tolerance is the largest |got - Exact| accepted for an output with the
// given exact value and scale: half a bf16 ulp for the final rounding, plus
// 2^-20 of Scale and of |Exact| for fp32 accumulation, fp32 expf and the
// division (each a few fp32 ulps).
func Tolerance(exact, scale float64) float64 {
	return 0.5*ulpBF16(exact) + math.Ldexp(scale+math.Abs(exact), -20)
}

// ulpBF16 is the spacing of bf16 values at |v| (bf16 keeps 8 significant bits).
func ulpBF16(v float64) float64 {
	const minULP = -133 // the smallest bf16 subnormal is 2^-133
	if v == 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return math.Ldexp(1, minULP)
	}
	_, e := math.Frexp(v) // |v| = f * 2^e, f in [0.5, 1)
	if e-8 < minULP {
		return math.Ldexp(1, minULP)
	}
	return math.Ldexp(1, e-8)
}

// Compare checks got (the kernel's y, [T, C]) against the reference within
// Tolerance. The error names the first bad element by token and channel and
// says how many are bad.
func (r *Result) Compare(got []bf16.BF16) error {
	if len(got) != len(r.Y) {
		return fmt.Errorf("convref: got %d outputs, want %d", len(got), len(r.Y))
	}
	bad, first := 0, -1
	for i, g := range got {
		gf := float64(g.Float32())
		if g.IsNaN() || math.Abs(gf-r.Exact[i]) > Tolerance(r.Exact[i], r.Scale[i]) {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	if bad == 0 {
		return nil
	}
	t, c := first/max(r.C, 1), first%max(r.C, 1)
	return fmt.Errorf("convref: %d of %d outputs differ; first at token %d channel %d: got %g (%#04x), want %g (bf16 %#04x), tolerance %g",
		bad, len(got), t, c, got[first].Float32(), uint16(got[first]), r.Exact[first], uint16(r.Y[first]), Tolerance(r.Exact[first], r.Scale[first]))
}
