package kcp

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzScalePack feeds ScalePack arbitrary packs (document lengths from docs,
// four bytes each, signed) and token counts. It must never panic nor spin:
// it returns an error, or a pack of the same documents, each at least one
// token, that sum to tokens.
func FuzzScalePack(f *testing.F) {
	le := func(ns ...int32) []byte {
		b := make([]byte, 4*len(ns))
		for i, n := range ns {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(n))
		}
		return b
	}
	f.Add(le(40000, 45000, 35908), 4096)
	f.Add(le(1, 1, 1), 3)
	f.Add(le(100, 1), 2)
	f.Add(le(0), 10)
	f.Add(le(-5, 10), 10)
	f.Add(le(1<<30, 1<<30), 1<<40)
	f.Add(le(1<<30), 1<<62)
	f.Add(le(7), -1)
	f.Fuzz(func(t *testing.T, docs []byte, tokens int) {
		if len(docs) > 256 {
			docs = docs[:256]
		}
		var lens []int
		for i := 0; i+4 <= len(docs); i += 4 {
			lens = append(lens, int(int32(binary.LittleEndian.Uint32(docs[i:]))))
		}
		p, err := ScalePack(Pack{Name: "F", Docs: lens}, tokens)
		if err != nil {
			require.Contains(t, err.Error(), "kcp: scale pack F")
			return
		}
		require.Len(t, p.Docs, len(lens))
		sum := 0
		for _, d := range p.Docs {
			require.GreaterOrEqual(t, d, 1)
			sum += d
		}
		require.Equal(t, tokens, sum)
		require.Equal(t, tokens, p.Tokens)
	})
}
