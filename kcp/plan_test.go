package kcp

import (
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/sched"
)

func TestNewPlanErrors(t *testing.T) {
	ok := PlanConfig{Docs: []int{100, 200}, Ranks: 2, Layout: LayoutD}
	with := func(f func(c *PlanConfig)) PlanConfig {
		c := ok
		c.Docs = slices.Clone(ok.Docs)
		f(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  PlanConfig
		msg  string
	}{
		{"no documents", with(func(c *PlanConfig) { c.Docs = nil }), "no documents"},
		{"empty documents", with(func(c *PlanConfig) { c.Docs = []int{} }), "no documents"},
		{"zero length", with(func(c *PlanConfig) { c.Docs = []int{5, 0} }), "document 1 has length 0"},
		{"negative length", with(func(c *PlanConfig) { c.Docs = []int{-3} }), "document 0 has length -3"},
		{"too many tokens", with(func(c *PlanConfig) { c.Docs = []int{MaxTokens, 1} }), "more than"},
		{"zero ranks", with(func(c *PlanConfig) { c.Ranks = 0 }), "0 ranks, need 1..64"},
		{"negative ranks", with(func(c *PlanConfig) { c.Ranks = -1 }), "-1 ranks"},
		{"65 ranks", with(func(c *PlanConfig) { c.Ranks = 65 }), "65 ranks, need 1..64"},
		{"unknown layout", with(func(c *PlanConfig) { c.Layout = "X" }), `unknown layout "X"`},
		{"empty layout", with(func(c *PlanConfig) { c.Layout = "" }), `unknown layout ""`},
		{"HV not a multiple of HQK", with(func(c *PlanConfig) { c.HV = 40 }), "HV 40 is not a multiple of HQK 16"},
		{"HV below HQK", with(func(c *PlanConfig) { c.HQK = 16; c.HV = 8 }), "HV 8 is not a multiple"},
		{"negative HV", with(func(c *PlanConfig) { c.HV = -48 }), "HV -48"},
		{"negative HQK", with(func(c *PlanConfig) { c.HQK = -1 }), "HQK -1"},
		{"DK 256", with(func(c *PlanConfig) { c.DK = 256 }), "head dim DK = 256 is not supported"},
		{"DV 96", with(func(c *PlanConfig) { c.DV = 96 }), "head dim DV = 96"},
		{"DK negative", with(func(c *PlanConfig) { c.DK = -128 }), "head dim DK = -128"},
		{"chunk 128", with(func(c *PlanConfig) { c.Chunk = 128 }), "chunk size 128 is not supported"},
		{"chunk negative", with(func(c *PlanConfig) { c.Chunk = -64 }), "chunk size -64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlan(tc.cfg)
			require.Error(t, err)
			assert.Nil(t, p, "nothing half-built")
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
	_, err := NewPlan(ok)
	require.NoError(t, err)
}

func TestNewPlanDefaultsAndOptions(t *testing.T) {
	docs := []int{10, 20}
	p, err := NewPlan(PlanConfig{Docs: docs, Ranks: 1, Layout: "d"})
	require.NoError(t, err)
	assert.Equal(t, PlanConfig{Docs: docs, Ranks: 1, Layout: LayoutD, HQK: 16, HV: 48, DK: 128, DV: 128, Chunk: 64}, p.Config)
	docs[0] = 99
	assert.Equal(t, 10, p.Config.Docs[0], "the plan keeps its own copy of the lengths")
	for _, dim := range HeadDims() {
		_, err := NewPlan(PlanConfig{Docs: []int{5}, Ranks: 3, Layout: LayoutZ, HQK: 2, HV: 6, DK: dim, DV: dim})
		assert.NoError(t, err, dim)
	}
	_, err = NewPlan(PlanConfig{Docs: []int{5}, Ranks: 64, Layout: LayoutC, Chunk: 64})
	assert.NoError(t, err)
}

func TestSplit(t *testing.T) {
	for n := 0; n < 40; n++ {
		for m := 1; m < 12; m++ {
			pos := 0
			for i := 0; i < m; i++ {
				s, size := split(n, m, i)
				want := n / m
				if i < n%m {
					want++
				}
				require.Equal(t, want, size)
				require.Equal(t, pos, s)
				pos += size
			}
			require.Equal(t, n, pos)
		}
	}
}

// A hand-checked plan: two documents over two ranks, layout D.
func TestPlanByHand(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{100, 30}, Ranks: 2, Layout: LayoutD})
	require.NoError(t, err)
	// split(100, 4) = 25 x 4; split(30, 4) = 8, 8, 7, 7.
	assert.Equal(t, []Range{{0, 25}, {75, 100}, {100, 108}, {123, 130}}, p.Ranks[0].Parts)
	assert.Equal(t, []Range{{25, 50}, {50, 75}, {108, 116}, {116, 123}}, p.Ranks[1].Parts)
	type seg struct{ doc, start, len, chunks, local int }
	get := func(rp RankPlan) []seg {
		var out []seg
		for _, s := range rp.Segments {
			out = append(out, seg{s.Doc, s.Start, s.Len, s.Chunks, s.LocalStart})
		}
		return out
	}
	assert.Equal(t, []seg{{0, 0, 25, 1, 0}, {0, 75, 25, 1, 25}, {1, 100, 8, 1, 50}, {1, 123, 7, 1, 58}}, get(p.Ranks[0]))
	assert.Equal(t, []seg{{0, 25, 50, 1, 0}, {1, 108, 15, 1, 50}}, get(p.Ranks[1]), "pieces 1 and 2 merge")
	assert.Equal(t, [][]SegRef{{{0, 0}, {1, 0}, {0, 1}}, {{0, 2}, {1, 1}, {0, 3}}}, p.Chains)
	r0, r1 := p.Ranks[0], p.Ranks[1]
	assert.Equal(t, []int{0, 2}, r0.Summary)
	assert.Equal(t, []int{1, 3}, r0.Offset)
	assert.Equal(t, []int{0, 1, 2, 3}, r0.State)
	assert.Equal(t, []int{0, 1, 2, 3}, r0.Tape)
	assert.Equal(t, []int{0, 1}, r1.Summary)
	assert.Equal(t, []int{0, 1}, r1.Offset)
	assert.Equal(t, &SegRef{1, 0}, r0.Segments[1].Pred)
	assert.Nil(t, r0.Segments[1].Succ)
	assert.Equal(t, []HaloPiece{{Rank: 1, Seg: 0, Offset: 47, Count: 3}}, r0.Segments[1].Halo)
	assert.Nil(t, r0.Segments[0].Halo)
	assert.Equal(t, []HaloPiece{{Rank: 0, Seg: 2, Offset: 5, Count: 3}}, r1.Segments[1].Halo)
	assert.Equal(t, []int{1, 1, 1, 1}, r0.WalkChains(sched.Tape))
	assert.Equal(t, 65, r0.Tokens)
	assert.Equal(t, 65, r1.Tokens)
}

// Halos that reach back over segments shorter than 3 tokens.
func TestHaloAcrossShortSegments(t *testing.T) {
	// One 7-token document, R = 4, D: split(7, 8) = 1,1,1,1,1,1,1,0.
	// Rank r holds token r and token 7-r (rank 0: only token 0).
	p, err := NewPlan(PlanConfig{Docs: []int{7}, Ranks: 4, Layout: LayoutD})
	require.NoError(t, err)
	// Token 6 is on rank 1 (piece 6 = 2R-1-1); its halo is tokens 3, 4, 5 on
	// ranks 3 (merged pieces 3 and 4: tokens 3-4) and 2 (token 5).
	seg := p.Ranks[1].Segments[1]
	require.Equal(t, 6, seg.Start)
	assert.Equal(t, []HaloPiece{{Rank: 3, Seg: 0, Offset: 0, Count: 2}, {Rank: 2, Seg: 1, Offset: 0, Count: 1}}, seg.Halo)
	// Token 2 (rank 2) reaches the document start: two tokens on ranks 0 and 1.
	seg = p.Ranks[2].Segments[0]
	require.Equal(t, 2, seg.Start)
	assert.Equal(t, []HaloPiece{{Rank: 0, Seg: 0, Offset: 0, Count: 1}, {Rank: 1, Seg: 0, Offset: 0, Count: 1}}, seg.Halo)
	assert.Equal(t, 2, seg.HaloLen())
	// Rank 0 holds piece 0 and the empty piece 7.
	assert.Equal(t, []Range{{0, 1}}, p.Ranks[0].Parts)
}

func TestEmptyRanks(t *testing.T) {
	p, err := NewPlan(PlanConfig{Docs: []int{2, 1}, Ranks: 8, Layout: LayoutC})
	require.NoError(t, err)
	for r, rp := range p.Ranks {
		if r < 3 {
			assert.Equal(t, 1, rp.Tokens)
			continue
		}
		assert.Zero(t, rp.Tokens)
		assert.Empty(t, rp.Parts)
		assert.Empty(t, rp.Segments)
		for _, k := range sched.WalkKinds() {
			assert.Empty(t, rp.Walk(k))
			d, err := p.Width(r, k, sched.Profile{Variant: sched.VariantSM100a, SMs: 148}, sched.RuleB)
			require.NoError(t, err)
			assert.Equal(t, 0, d.VH)
		}
	}
}

func randomDocs(r *rand.Rand) []int {
	docs := make([]int, 1+r.Intn(7))
	for i := range docs {
		switch r.Intn(4) {
		case 0:
			docs[i] = 1 + r.Intn(5)
		case 1:
			docs[i] = 1 + r.Intn(200)
		case 2:
			docs[i] = 64 * (1 + r.Intn(20))
		default:
			docs[i] = 1 + r.Intn(3000)
		}
	}
	return docs
}

// splitRanges is split(n, m) as ranges from base, built independently of
// split: the first n mod m parts take one token more.
func splitRanges(base, n, m int) []Range {
	out := make([]Range, m)
	pos := base
	for i := range out {
		size := n / m
		if i < n%m {
			size++
		}
		out[i] = Range{pos, pos + size}
		pos += size
	}
	return out
}

// expectedParts is what the layout gives rank r, empty parts left out.
func expectedParts(docs []int, R int, layout Layout, r int) []Range {
	T := 0
	for _, l := range docs {
		T += l
	}
	var out []Range
	add := func(rg Range) {
		if rg.Len() > 0 {
			out = append(out, rg)
		}
	}
	switch layout {
	case LayoutC:
		add(splitRanges(0, T, R)[r])
	case LayoutZ:
		parts := splitRanges(0, T, 2*R)
		add(parts[r])
		add(parts[2*R-1-r])
	case LayoutD:
		base := 0
		for _, l := range docs {
			pieces := splitRanges(base, l, 2*R)
			add(pieces[r])
			add(pieces[2*R-1-r])
			base += l
		}
	}
	return out
}

func checkPlan(t *testing.T, p *Plan) {
	t.Helper()
	cfg := p.Config
	R := cfg.Ranks
	// Per-token checks use plain comparisons: testify per token is too slow
	// for the 250k-token packs.
	docOf := make([]int, 0, p.Tokens)
	for d, l := range cfg.Docs {
		require.Equal(t, len(docOf), p.DocStarts[d])
		for range l {
			docOf = append(docOf, d)
		}
	}
	require.Equal(t, len(docOf), p.Tokens)
	seen := make([]int, p.Tokens)
	require.Len(t, p.Ranks, R)

	for r := range p.Ranks {
		rp := &p.Ranks[r]
		require.Equal(t, r, rp.Rank)
		// Parts are the layout's, in buffer order.
		require.Equal(t, expectedParts(cfg.Docs, R, cfg.Layout, r), rp.Parts, "rank %d parts", r)
		// The buffer, token by token, from the parts and from the segments.
		fromParts, fromSegs := make([]int, 0, rp.Tokens), make([]int, 0, rp.Tokens)
		for _, pt := range rp.Parts {
			for g := pt.Start; g < pt.End; g++ {
				fromParts = append(fromParts, g)
			}
		}
		local := 0
		for i, s := range rp.Segments {
			require.Equal(t, local, s.LocalStart, "rank %d seg %d local start", r, i)
			require.Greater(t, s.Len, 0)
			require.Equal(t, (s.Len+63)/64, s.Chunks)
			require.True(t, s.Chunks*64 >= s.Len && (s.Chunks-1)*64 < s.Len)
			require.Equal(t, s.Start-p.DocStarts[s.Doc], s.DocOffset)
			for g := s.Start; g < s.End(); g++ {
				if docOf[g] != s.Doc {
					t.Fatalf("rank %d seg %d: token %d is in document %d, not %d", r, i, g, docOf[g], s.Doc)
				}
				seen[g]++
				fromSegs = append(fromSegs, g)
			}
			local += s.Len
			if i > 0 {
				prev := rp.Segments[i-1]
				require.False(t, prev.Doc == s.Doc && prev.End() == s.Start,
					"rank %d segments %d and %d should have merged", r, i-1, i)
			}
			// Halo: the min(3, DocOffset) tokens before the segment in its document.
			var want, got []int
			for g := max(p.DocStarts[s.Doc], s.Start-ConvHalo); g < s.Start; g++ {
				want = append(want, g)
			}
			for _, h := range s.Halo {
				src := p.Segment(SegRef{h.Rank, h.Seg})
				require.Equal(t, s.Doc, src.Doc)
				require.Greater(t, h.Count, 0)
				require.LessOrEqual(t, h.Offset+h.Count, src.Len)
				for j := range h.Count {
					got = append(got, src.Start+h.Offset+j)
				}
			}
			require.Equal(t, want, got, "rank %d seg %d halo", r, i)
			require.Equal(t, len(want), s.HaloLen())
		}
		require.Equal(t, local, rp.Tokens)
		if !slices.Equal(fromParts, fromSegs) {
			t.Fatalf("rank %d: buffer from segments differs from buffer from parts", r)
		}

		// Walk lists.
		var summary, state, offset []int
		for i, s := range rp.Segments {
			if s.Succ != nil {
				summary = append(summary, i)
			}
			if s.Pred != nil {
				offset = append(offset, i)
			}
			state = append(state, i)
		}
		require.Equal(t, summary, rp.Summary)
		require.Equal(t, state, rp.State)
		require.Equal(t, offset, rp.Offset)
		require.Equal(t, state, rp.Tape)
		for _, k := range sched.WalkKinds() {
			chains := rp.WalkChains(k)
			require.Len(t, chains, len(rp.Walk(k)))
			for j, si := range rp.Walk(k) {
				require.Equal(t, rp.Segments[si].Chunks, chains[j])
			}
		}
	}
	for g, n := range seen {
		if n != 1 {
			t.Fatalf("token %d held %d times", g, n)
		}
	}

	// Chains: document order, covering each document, linked both ways.
	require.Len(t, p.Chains, len(cfg.Docs))
	for d, chain := range p.Chains {
		require.NotEmpty(t, chain)
		pos := p.DocStarts[d]
		chunks := 0
		for i, ref := range chain {
			s := p.Segment(ref)
			require.Equal(t, d, s.Doc)
			require.Equal(t, pos, s.Start, "doc %d chain link %d", d, i)
			pos = s.End()
			chunks += s.Chunks
			if i == 0 {
				require.Nil(t, s.Pred)
			} else {
				require.Equal(t, chain[i-1], *s.Pred)
			}
			if i == len(chain)-1 {
				require.Nil(t, s.Succ)
			} else {
				require.Equal(t, chain[i+1], *s.Succ)
			}
		}
		require.Equal(t, p.DocStarts[d]+cfg.Docs[d], pos, "doc %d covered", d)
		// Chunks count from each segment's start: at least ceil(L/64), at most
		// one more per cut.
		min := (cfg.Docs[d] + 63) / 64
		require.GreaterOrEqual(t, chunks, min)
		require.LessOrEqual(t, chunks, min+len(chain)-1)
	}
	segs := 0
	for _, rp := range p.Ranks {
		segs += len(rp.Segments)
	}
	n := 0
	for _, c := range p.Chains {
		n += len(c)
	}
	require.Equal(t, segs, n, "every segment is in one chain")

	switch cfg.Layout {
	case LayoutD:
		// Rank r holds exactly pieces r and 2R-1-r of every document.
		owner := make([]int, p.Tokens)
		for r, rp := range p.Ranks {
			for _, s := range rp.Segments {
				for g := s.Start; g < s.End(); g++ {
					owner[g] = r
				}
			}
		}
		for d, l := range cfg.Docs {
			for i, pc := range splitRanges(p.DocStarts[d], l, 2*R) {
				r := min(i, 2*R-1-i) // piece i goes to rank i or 2R-1-i
				for g := pc.Start; g < pc.End; g++ {
					if owner[g] != r {
						t.Fatalf("doc %d piece %d: token %d on rank %d, want %d", d, i, g, owner[g], r)
					}
				}
			}
		}
	case LayoutZ:
		// Parts R-1 and R are adjacent on rank R-1: where one document
		// continues across them, one segment covers the seam.
		parts := splitRanges(0, p.Tokens, 2*R)
		a, b := parts[R-1], parts[R]
		if a.Len() > 0 && b.Len() > 0 && docOf[a.End-1] == docOf[b.Start] {
			found := false
			for _, s := range p.Ranks[R-1].Segments {
				if s.Start < a.End && s.End() > b.Start {
					found = true
				}
			}
			require.True(t, found, "parts %d and %d not merged on rank %d", R-1, R, R-1)
		}
	}
}

func TestPlanInvariantsRandom(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for R := 1; R <= 16; R++ {
		for _, layout := range Layouts() {
			for it := 0; it < 25; it++ {
				docs := randomDocs(r)
				p, err := NewPlan(PlanConfig{Docs: docs, Ranks: R, Layout: layout})
				require.NoError(t, err)
				ok := t.Run(fmt.Sprintf("R%d/%s/%d", R, layout, it), func(t *testing.T) { checkPlan(t, p) })
				if !ok {
					t.Fatalf("docs %v R %d layout %s", docs, R, layout)
				}
			}
		}
	}
}

func TestPlanInvariantsPacks(t *testing.T) {
	for _, pk := range Packs() {
		for _, R := range []int{1, 2, 3, 4, 8, 16, 64} {
			for _, layout := range Layouts() {
				p, err := NewPlan(PlanConfig{Docs: pk.Docs, Ranks: R, Layout: layout})
				require.NoError(t, err)
				t.Run(fmt.Sprintf("%s/R%d/%s", pk.Name, R, layout), func(t *testing.T) { checkPlan(t, p) })
			}
		}
	}
}

// Z with one document: parts R-1 and R always merge into one segment.
func TestZMergesMiddleParts(t *testing.T) {
	for R := 1; R <= 16; R++ {
		p, err := NewPlan(PlanConfig{Docs: []int{1000}, Ranks: R, Layout: LayoutZ})
		require.NoError(t, err)
		mid := p.Ranks[R-1]
		require.Len(t, mid.Parts, 2)
		require.Len(t, mid.Segments, 1, "R=%d", R)
		assert.Equal(t, mid.Parts[0].Start, mid.Segments[0].Start)
		assert.Equal(t, mid.Parts[1].End, mid.Segments[0].End())
		for r := 0; r < R-1; r++ {
			assert.Len(t, p.Ranks[r].Segments, 2, "R=%d rank %d", R, r)
		}
	}
}

func TestWidthMemoized(t *testing.T) {
	pk, err := PackByName("P1")
	require.NoError(t, err)
	p, err := NewPlan(PlanConfig{Docs: pk.Docs, Ranks: 8, Layout: LayoutD})
	require.NoError(t, err)
	prof := sched.Profile{Variant: sched.VariantSM100a, SMs: 148}
	for r := range p.Ranks {
		for _, k := range sched.WalkKinds() {
			for _, rule := range sched.Rules() {
				want, err := sched.Decide(k, p.Ranks[r].WalkChains(k), 48, prof, rule)
				require.NoError(t, err)
				got, err := p.Width(r, k, prof, rule)
				require.NoError(t, err)
				assert.Equal(t, want, got)
			}
		}
	}
	// Concurrent readers all see the decision of the first call.
	var wg sync.WaitGroup
	q, err := NewPlan(PlanConfig{Docs: pk.Docs, Ranks: 8, Layout: LayoutD})
	require.NoError(t, err)
	res := make([]sched.Decision, 64)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := q.Width(i%8, sched.Tape, prof, sched.RuleB)
			assert.NoError(t, err)
			res[i] = d
		}()
	}
	wg.Wait()
	for i, d := range res {
		want, _ := p.Width(i%8, sched.Tape, prof, sched.RuleB)
		assert.Equal(t, want, d)
	}
	all, err := p.Decisions(prof, sched.RuleB)
	require.NoError(t, err)
	require.Len(t, all, 8)
	for r := range all {
		for _, k := range sched.WalkKinds() {
			d, _ := p.Width(r, k, prof, sched.RuleB)
			assert.Equal(t, d, all[r][k])
		}
	}

	_, err = p.Width(8, sched.State, prof, sched.RuleB)
	assert.ErrorContains(t, err, "rank 8 outside the plan's 8 ranks")
	_, err = p.Width(-1, sched.State, prof, sched.RuleB)
	assert.Error(t, err)
	_, err = p.Width(0, sched.State, sched.Profile{Variant: "sm_100a", SMs: 0}, sched.RuleB)
	assert.ErrorContains(t, err, "SM count 0")
	_, err = p.Decisions(sched.Profile{Variant: "sm_75", SMs: 40}, sched.RuleB)
	assert.ErrorContains(t, err, "unknown arch variant")
	_, err = p.Width(0, sched.WalkKind(4), prof, sched.RuleB)
	assert.ErrorContains(t, err, "unknown walk kind")
}
