package kcp

import (
	"fmt"
	"math/bits"
)

// ScalePack returns pack p with its documents scaled to tokens tokens in
// all, keeping their proportions (largest-remainder rounding, every document
// at least one token). The name gets an "@tokens" suffix. Documents must
// have at least one token each, and neither p nor the result more than
// MaxTokens.
func ScalePack(p Pack, tokens int) (Pack, error) {
	if len(p.Docs) == 0 {
		return Pack{}, fmt.Errorf("kcp: scale pack %s: no documents", p.Name)
	}
	if tokens < len(p.Docs) {
		return Pack{}, fmt.Errorf("kcp: scale pack %s to %d tokens: fewer tokens than its %d documents", p.Name, tokens, len(p.Docs))
	}
	if tokens > MaxTokens {
		return Pack{}, fmt.Errorf("kcp: scale pack %s to %d tokens: more than %d", p.Name, tokens, MaxTokens)
	}
	total := 0
	for i, d := range p.Docs {
		if d < 1 {
			return Pack{}, fmt.Errorf("kcp: scale pack %s: document %d has %d tokens, need at least 1", p.Name, i, d)
		}
		if total += d; d > MaxTokens || total > MaxTokens {
			return Pack{}, fmt.Errorf("kcp: scale pack %s: more than %d tokens", p.Name, MaxTokens)
		}
	}
	docs := make([]int, len(p.Docs))
	rem := make([]int, len(p.Docs))
	sum := 0
	for i, d := range p.Docs {
		// d tokens / total in 128 bits: both factors reach 2^40. The quotient
		// is at most tokens, as d <= total.
		hi, lo := bits.Mul64(uint64(d), uint64(tokens))
		q, r := bits.Div64(hi, lo, uint64(total))
		docs[i] = max(1, int(q))
		rem[i] = int(r)
		sum += docs[i]
	}
	// Documents raised to one token may overshoot: take back from the
	// largest (the earlier one on ties).
	for sum > tokens {
		big := 0
		for i := range docs {
			if docs[i] > docs[big] {
				big = i
			}
		}
		docs[big]--
		sum--
	}
	// Hand out what rounding down left, largest remainder first (ties to the
	// earlier document).
	for sum < tokens {
		best := 0
		for i := range rem {
			if rem[i] > rem[best] {
				best = i
			}
		}
		docs[best]++
		rem[best] = -1
		sum++
	}
	return Pack{Name: fmt.Sprintf("%s@%d", p.Name, tokens), Tokens: sum, Docs: docs}, nil
}

// DefaultRunTokens is the size of the default pack of `kcp run`.
const DefaultRunTokens = 2048

// DefaultRunPack is the pack `kcp run` uses when given none: P1's six
// documents scaled to DefaultRunTokens tokens.
func DefaultRunPack() Pack {
	p1, err := PackByName("P1")
	if err != nil {
		panic(err) // P1 is in the built-in table
	}
	p, err := ScalePack(p1, DefaultRunTokens)
	if err != nil {
		panic(err) // 2048 tokens over six documents always scales
	}
	return p
}
