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
	_, err = ScalePack(Pack{Name: "x"}, 10)
	require.ErrorContains(t, err, "no documents")
}
