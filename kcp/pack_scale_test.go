package kcp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestScalePack(t *testing.T) {
	p := DefaultRunPack()
	require.Equal(t, "P1@2048", p.Name)
	require.Equal(t, DefaultRunTokens, p.Tokens)
	require.Equal(t, []int{520, 152, 382, 69, 625, 300}, p.Docs)
	sum := 0
	for _, d := range p.Docs {
		sum += d
	}
	require.Equal(t, p.Tokens, sum)
	tiny, err := ScalePack(Pack{Name: "x", Docs: []int{1000, 1, 1}}, 3)
	require.NoError(t, err)
	require.Equal(t, []int{1, 1, 1}, tiny.Docs)
	_, err = ScalePack(Pack{Name: "x", Docs: []int{5, 5}}, 1)
	require.ErrorContains(t, err, "fewer tokens")
	for _, c := range []struct {
		name   string
		docs   []int
		tokens int
		err    string
	}{
		{"no documents", nil, 10, "scale pack x: no documents"},
		{"a zero-length document", []int{5, 0}, 10, "document 1 has 0 tokens, need at least 1"},
		{"a negative document", []int{-3, 9}, 10, "document 0 has -3 tokens"},
		{"too many tokens", []int{5}, MaxTokens + 1, "more than 1099511627776"},
		{"too large a pack", []int{MaxTokens, 1}, 10, "scale pack x: more than 1099511627776 tokens"},
	} {
		_, err := ScalePack(Pack{Name: "x", Docs: c.docs}, c.tokens)
		require.ErrorContains(t, err, c.err, c.name)
	}
	// Factors past 64 bits: 2^40 tokens over documents of 2^39 + 1 and 2^39 - 1.
	big, err := ScalePack(Pack{Name: "x", Docs: []int{1<<39 + 1, 1<<39 - 1}}, MaxTokens)
	require.NoError(t, err)
	require.Equal(t, []int{1<<39 + 1, 1<<39 - 1}, big.Docs)
}
