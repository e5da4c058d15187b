package gdnref

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/mat"
)

// ChunkSize is the chunk length C of the chunked form; chunks are counted from a segment's own start.
const ChunkSize = 64

// L2NormEps is the epsilon inside the in-kernel l2norm: x / sqrt(sum x² + L2NormEps).
const L2NormEps = 1e-6

// Head holds the inputs of one value head over T consecutive tokens of one document (a whole document or one
// segment of it). Q and K are the rows of the QK head that this value head reads (see QKHead); they are the
// values before the in-kernel l2norm.
type Head struct {
	Q    *mat.Dense // T x K queries
	K    *mat.Dense // T x K keys
	V    *mat.Dense // T x V values
	G    []float64  // T log decays (<= 0 in the model; any value is accepted)
	Beta []float64  // T write strengths
}

// Dims returns the token count T and the key and value dims of h, checking that they agree.
func (h Head) Dims() (t, dk, dv int, err error) {
	if h.Q == nil || h.K == nil || h.V == nil {
		return 0, 0, 0, fmt.Errorf("gdnref: head: Q, K and V must be set")
	}
	t, dk = h.Q.Dims()
	if r, c := h.K.Dims(); r != t || c != dk {
		return 0, 0, 0, fmt.Errorf("gdnref: head: K is %dx%d, want %dx%d (as Q)", r, c, t, dk)
	}
	r, dv := h.V.Dims()
	if r != t {
		return 0, 0, 0, fmt.Errorf("gdnref: head: V has %d rows, want %d (as Q)", r, t)
	}
	if len(h.G) != t {
		return 0, 0, 0, fmt.Errorf("gdnref: head: G has %d entries, want %d", len(h.G), t)
	}
	if len(h.Beta) != t {
		return 0, 0, 0, fmt.Errorf("gdnref: head: Beta has %d entries, want %d", len(h.Beta), t)
	}
	return t, dk, dv, nil
}

// Options are the kernel options. The zero value is the module's default: scale 1/sqrt(K), l2norm on.
type Options struct {
	Scale    float64 // output scale; 0 means 1/sqrt(K)
	NoL2Norm bool    // true turns the in-kernel l2norm of q and k off
}

// scaleFor returns the effective scale for key dim dk.
func (o Options) scaleFor(dk int) float64 {
	if o.Scale != 0 {
		return o.Scale
	}
	return 1 / math.Sqrt(float64(dk))
}

// Grads are the gradients of a loss with respect to the inputs of one head.
type Grads struct {
	DQ, DK *mat.Dense // T x K, with respect to q and k before the l2norm
	DV     *mat.Dense // T x V
	DG     []float64  // T
	DBeta  []float64  // T
	DS0    *mat.Dense // K x V, with respect to the initial (segment start) state
}

// checkState checks that s is nil or r x c.
func checkState(name string, s *mat.Dense, r, c int) error {
	if s == nil {
		return nil
	}
	if sr, sc := s.Dims(); sr != r || sc != c {
		return fmt.Errorf("gdnref: %s is %dx%d, want %dx%d", name, sr, sc, r, c)
	}
	return nil
}

// checkOut checks that the output buffer m is set and r x c.
func checkOut(name string, m *mat.Dense, r, c int) error {
	if m == nil {
		return fmt.Errorf("gdnref: %s must be set (%dx%d)", name, r, c)
	}
	return checkState(name, m, r, c)
}

// QKHead returns the QK head that value head vh reads under grouped value attention (GVA):
// vh / (hv / hqk), for hv value heads and hqk QK heads (hv must be a multiple of hqk).
func QKHead(vh, hv, hqk int) (int, error) {
	if hqk <= 0 || hv <= 0 || hv%hqk != 0 {
		return 0, fmt.Errorf("gdnref: GVA needs hv (%d) to be a positive multiple of hqk (%d)", hv, hqk)
	}
	if vh < 0 || vh >= hv {
		return 0, fmt.Errorf("gdnref: value head %d out of range [0, %d)", vh, hv)
	}
	return vh / (hv / hqk), nil
}

// SumOverValueHeads folds per-value-head gradients of q or k (perValue[vh], hv entries of equal shape) into
// per-QK-head gradients: out[h] = perValue[h*G] + perValue[h*G+1] + ... + perValue[h*G+G-1], G = hv/hqk,
// added in that order (left to right), so the result is deterministic.
func SumOverValueHeads(perValue []*mat.Dense, hqk int) ([]*mat.Dense, error) {
	hv := len(perValue)
	if _, err := QKHead(0, hv, hqk); err != nil {
		return nil, err
	}
	r, c := perValue[0].Dims()
	group := hv / hqk
	out := make([]*mat.Dense, hqk)
	for h := range out {
		acc := mat.NewDense(r, c, nil)
		for j := 0; j < group; j++ {
			g := perValue[h*group+j]
			if gr, gc := g.Dims(); gr != r || gc != c {
				return nil, fmt.Errorf("gdnref: value head %d gradient is %dx%d, want %dx%d", h*group+j, gr, gc, r, c)
			}
			acc.Add(acc, g)
		}
		out[h] = acc
	}
	return out, nil
}
