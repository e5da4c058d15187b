package kcp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/gdnkcp/gdnkcp/internal/bf16"
)

// Stage says what a run covers: the GDN core alone, or the module (the
// depthwise causal conv1d + SiLU over the q|k|v channels, then the GDN).
type Stage string

// The stages.
const (
	StageCore   Stage = "core"
	StageModule Stage = "module"
)

// ParseStage parses "core" or "module".
func ParseStage(s string) (Stage, error) {
	switch Stage(s) {
	case StageCore, StageModule:
		return Stage(s), nil
	}
	return "", fmt.Errorf("kcp: unknown stage %q (want core or module)", s)
}

// ConvWidth is the width of the causal conv in front of the GDN.
const ConvWidth = 4

// Inputs are a layer's inputs for a whole pack, in global document order
// (T = Plan.Tokens tokens), not sharded. Row-major, heads inside tokens.
// The bf16 tensors (Q, K, V, ConvW) hold float32 values that are exactly
// representable in bf16; RoundBF16 makes them so.
//
// A backend keeps references to these slices from Forward until Backward
// returns: the caller must not modify them in between.
type Inputs struct {
	Q, K  []float32 // [T, HQK, DK]; for StageModule the pre-conv projections
	V     []float32 // [T, HV, DV]; for StageModule the pre-conv projection
	G     []float32 // [T, HV] log decay (<= 0)
	Beta  []float32 // [T, HV]
	ConvW []float32 // [ConvChannels, 4], StageModule only: y_t = silu(sum_i w[c,i] x_{t-3+i})
}

// Output is a forward's output for the whole pack, in global document order.
type Output struct {
	O []float64 // [T, HV, DV]
}

// Grads are the gradients of a backward for the whole pack, in global
// document order, with the shapes of the matching inputs. For StageModule, DQ,
// DK and DV are the gradients of the pre-conv projections and DConvW is set.
type Grads struct {
	DQ, DK []float64 // [T, HQK, DK]
	DV     []float64 // [T, HV, DV]
	DG     []float64 // [T, HV]
	DBeta  []float64 // [T, HV]
	DConvW []float64 // [ConvChannels, 4], StageModule only
}

// ConvChannels is the number of conv channels, q|k|v: 2*HQK*DK + HV*DV.
func (p *Plan) ConvChannels() int {
	if p == nil {
		return 0
	}
	c := p.Config
	return 2*c.HQK*c.DK + c.HV*c.DV
}

// TensorShape is a named tensor's shape with a description of its dims.
type TensorShape struct {
	Name  string
	Shape []int
	Dims  string // e.g. "[T, H_qk, K]"
}

// Size is the product of the dims.
func (s TensorShape) Size() int {
	n := 1
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// InputShapes returns the shapes Inputs must have for this plan and stage,
// in the order q, k, v, g, beta (, conv_w).
func (p *Plan) InputShapes(stage Stage) []TensorShape {
	if p == nil {
		return nil
	}
	c, t := p.Config, p.Tokens
	s := []TensorShape{
		{"q", []int{t, c.HQK, c.DK}, "[T, H_qk, K]"},
		{"k", []int{t, c.HQK, c.DK}, "[T, H_qk, K]"},
		{"v", []int{t, c.HV, c.DV}, "[T, HV, V]"},
		{"g", []int{t, c.HV}, "[T, HV]"},
		{"beta", []int{t, c.HV}, "[T, HV]"},
	}
	if stage == StageModule {
		s = append(s, TensorShape{"conv_w", []int{p.ConvChannels(), ConvWidth}, "[2*H_qk*K + HV*V, 4]"})
	}
	return s
}

// OutputShape is the shape of the output o and of its gradient dout.
func (p *Plan) OutputShape() TensorShape {
	if p == nil {
		return TensorShape{}
	}
	c := p.Config
	return TensorShape{"o", []int{p.Tokens, c.HV, c.DV}, "[T, HV, V]"}
}

func (in *Inputs) tensors() []([]float32) {
	return [][]float32{in.Q, in.K, in.V, in.G, in.Beta, in.ConvW}
}

// Validate checks every tensor's length against the plan and stage, that g,
// a log-decay, is nowhere above 0 (DESIGN.md §2: the kernels take
// exp(gamma) <= 1, and fp32 overflows where a chunk's growth passes
// e^88), and, when checkFinite is set, that no element is NaN or Inf. Errors
// name the tensor, its expected shape and the element.
func (in *Inputs) Validate(p *Plan, stage Stage, checkFinite bool) error {
	if in == nil {
		return fmt.Errorf("kcp: inputs are nil")
	}
	if p == nil {
		return errNilPlan
	}
	if _, err := ParseStage(string(stage)); err != nil {
		return err
	}
	ts := in.tensors()
	for i, sh := range p.InputShapes(stage) {
		if err := checkTensor(sh, ts[i], checkFinite); err != nil {
			return err
		}
	}
	if stage == StageCore && in.ConvW != nil {
		return fmt.Errorf("kcp: conv_w is set but the stage is core (conv weights belong to the module stage)")
	}
	gs := p.InputShapes(stage)[3]
	if i := firstElement(in.G, func(v float32) bool { return v > 0 }); i >= 0 {
		return fmt.Errorf("kcp: g %s: element %d (%s) is %v: g is a log-decay, at most 0", gs.Dims, i, index(gs.Shape, i), in.G[i])
	}
	return nil
}

// checkBlock is the elements a goroutine of a tensor scan (checkTensor,
// firstElement) takes: 1 Mi of them, so a tensor of billions runs on every
// core (the inputs of a 240K-token pack took 14 s in one goroutine).
const checkBlock = 1 << 20

func checkTensor(sh TensorShape, data []float32, checkFinite bool) error {
	if len(data) != sh.Size() {
		return fmt.Errorf("kcp: %s has %d elements, want %v %s = %d", sh.Name, len(data), sh.Shape, sh.Dims, sh.Size())
	}
	if checkFinite {
		// NaN and ±Inf are the float32s whose exponent bits are all ones.
		if i := firstElement(data, func(v float32) bool { return math.Float32bits(v)&0x7f800000 == 0x7f800000 }); i >= 0 {
			return fmt.Errorf("kcp: %s %s: element %d (%s) is %v", sh.Name, sh.Dims, i, index(sh.Shape, i), data[i])
		}
	}
	return nil
}

// firstElement is the index of data's first element for which bad holds, or
// -1: blocks of checkBlock scanned in parallel, the lowest index of any block
// reported (the index a scan in order finds).
func firstElement(data []float32, bad func(float32) bool) int {
	n := (len(data) + checkBlock - 1) / checkBlock
	first := make([]int, n)
	_ = parallel(n, func(b int) error {
		first[b] = -1
		lo := b * checkBlock
		for i, v := range data[lo:min(lo+checkBlock, len(data))] {
			if bad(v) {
				first[b] = lo + i
				break
			}
		}
		return nil
	})
	for _, i := range first {
		if i >= 0 {
			return i
		}
	}
	return -1
}

// index formats flat index i of shape as a multi-index.
func index(shape []int, i int) string {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		idx[d] = i % shape[d]
		i /= shape[d]
	}
	return fmt.Sprint(idx)
}

// CheckDOut checks dout's length against the plan (and finiteness when asked).
func (p *Plan) CheckDOut(dout []float32, checkFinite bool) error {
	if p == nil {
		return errNilPlan
	}
	sh := p.OutputShape()
	sh.Name = "dout"
	return checkTensor(sh, dout, checkFinite)
}

// RoundBF16 rounds every bf16 tensor of in (Q, K, V, ConvW) to the nearest
// bf16 value, in place.
func (in *Inputs) RoundBF16() {
	if in == nil {
		return
	}
	for _, t := range [][]float32{in.Q, in.K, in.V, in.ConvW} {
		for i, v := range t {
			t[i] = bf16.Round(v)
		}
	}
}

// RandomInputs draws inputs for plan and stage from seed: q, k, v and dout
// normal (bf16-rounded), g = -softplus-like log decays in (-1, 0), beta in
// (0, 1), conv weights around 1/2 for the current token. The same seed gives
// the same inputs.
func RandomInputs(p *Plan, stage Stage, seed uint64) (*Inputs, []float32) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	sh := p.InputShapes(stage)
	in := &Inputs{
		Q: randomNormalBF16(sh[0].Size(), seed, 0),
		K: randomNormalBF16(sh[1].Size(), seed, 1),
		V: randomNormalBF16(sh[2].Size(), seed, 2),
	}
	in.G = make([]float32, sh[3].Size())
	in.Beta = make([]float32, sh[4].Size())
	for i := range in.G {
		in.G[i] = float32(-0.02 - 0.3*rng.Float64()*rng.Float64())
		in.Beta[i] = float32(0.05 + 0.9*rng.Float64())
	}
	if stage == StageModule {
		c := p.ConvChannels()
		in.ConvW = make([]float32, c*ConvWidth)
		for ch := 0; ch < c; ch++ {
			for i := 0; i < ConvWidth; i++ {
				w := 0.25 * rng.NormFloat64()
				if i == ConvWidth-1 {
					w += 0.5
				}
				in.ConvW[ch*ConvWidth+i] = bf16.Round(float32(w))
			}
		}
	}
	dout := randomNormalBF16(p.OutputShape().Size(), seed, 3)
	return in, dout
}

// randomBlock is the number of values randomNormalBF16 draws from one
// generator.
const randomBlock = 1 << 16

// randomNormalBF16 returns n standard normal values rounded to bf16: block
// b of randomBlock values comes from its own PCG stream (seed; tensor, b),
// so the values do not depend on how many goroutines fill the blocks (all
// cores do: a full-size pack holds billions of values).
func randomNormalBF16(n int, seed uint64, tensor int) []float32 {
	out := make([]float32, n)
	blocks := (n + randomBlock - 1) / randomBlock
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), blocks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := int(next.Add(1) - 1); b < blocks; b = int(next.Add(1) - 1) {
				rng := rand.New(rand.NewPCG(seed, uint64(tensor)<<48|uint64(b)))
				for i := b * randomBlock; i < min(n, (b+1)*randomBlock); i++ {
					out[i] = bf16.Round(float32(rng.NormFloat64()))
				}
			}
		}()
	}
	wg.Wait()
	return out
}
