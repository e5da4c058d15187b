package kcp

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/gdnkcp/gdnkcp/sched"
)

// Layout is how a pack is cut over the ranks (DESIGN.md §3).
type Layout string

// The layouts.
const (
	// LayoutC is contiguous: parts = split(T, R); rank r holds part r.
	LayoutC Layout = "C"
	// LayoutZ is the whole-buffer zigzag: parts = split(T, 2R); rank r holds
	// part r, then part 2R-1-r.
	LayoutZ Layout = "Z"
	// LayoutD is the per-document zigzag, ragged: every document is cut by
	// split(L_d, 2R); rank r holds, document by document, piece r then piece
	// 2R-1-r.
	LayoutD Layout = "D"
)

// Layouts returns C, Z and D.
func Layouts() []Layout { return []Layout{LayoutC, LayoutZ, LayoutD} }

// ParseLayout reads "C", "Z" or "D" (either case).
func ParseLayout(s string) (Layout, error) {
	l := Layout(strings.ToUpper(strings.TrimSpace(s)))
	if l == LayoutC || l == LayoutZ || l == LayoutD {
		return l, nil
	}
	return "", fmt.Errorf("kcp: unknown layout %q (want C, Z or D)", s)
}

// Plan limits and defaults.
const (
	MaxRanks   = 64      // the most ranks a plan takes
	ChunkSize  = 64      // the only supported chunk size
	DefaultHQK = 16      // query/key heads when PlanConfig.HQK is 0
	DefaultHV  = 48      // value heads when PlanConfig.HV is 0
	DefaultDK  = 128     // key head dim when PlanConfig.DK is 0
	DefaultDV  = 128     // value head dim when PlanConfig.DV is 0
	ConvHalo   = 3       // tokens of conv halo (conv width 4)
	MaxTokens  = 1 << 40 // the most tokens a pack may hold
)

// HeadDims returns the supported head dims: 128 (the GPU kernels' only size)
// and 16, 32 and 64, which the CPU reference backend accepts for small tests.
// DK and DV are checked separately.
func HeadDims() []int { return []int{16, 32, 64, 128} }

// PlanConfig says what to plan. Zero head counts, head dims and chunk size take
// their defaults.
type PlanConfig struct {
	Docs   []int  // document lengths in tokens, in pack order; each >= 1
	Ranks  int    // CP ranks R, 1..MaxRanks
	Layout Layout // LayoutC, LayoutZ or LayoutD
	HQK    int    // query/key heads (default 16)
	HV     int    // value heads, a multiple of HQK (default 48)
	DK, DV int    // key and value head dims, each one of HeadDims() (default 128); the GPU backend needs 128
	Chunk  int    // chunk size; only 64 (the default) is supported
}

// normalize returns a copy with the defaults filled in, or the first problem.
func (c PlanConfig) normalize() (PlanConfig, error) {
	c.Docs = slices.Clone(c.Docs)
	if len(c.Docs) == 0 {
		return c, errors.New("kcp: plan: no documents")
	}
	total := 0
	for i, l := range c.Docs {
		if l <= 0 {
			return c, fmt.Errorf("kcp: plan: document %d has length %d, need at least 1 token", i, l)
		}
		if total += l; l > MaxTokens || total > MaxTokens {
			return c, fmt.Errorf("kcp: plan: more than %d tokens", MaxTokens)
		}
	}
	if c.Ranks < 1 || c.Ranks > MaxRanks {
		return c, fmt.Errorf("kcp: plan: %d ranks, need 1..%d", c.Ranks, MaxRanks)
	}
	l, err := ParseLayout(string(c.Layout))
	if err != nil {
		return c, fmt.Errorf("kcp: plan: unknown layout %q (want C, Z or D)", string(c.Layout))
	}
	c.Layout = l
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.HQK, DefaultHQK)
	def(&c.HV, DefaultHV)
	def(&c.DK, DefaultDK)
	def(&c.DV, DefaultDV)
	def(&c.Chunk, ChunkSize)
	if c.HQK < 1 || c.HV < 1 {
		return c, fmt.Errorf("kcp: plan: head counts HQK %d, HV %d, need at least 1", c.HQK, c.HV)
	}
	if c.HV%c.HQK != 0 {
		return c, fmt.Errorf("kcp: plan: HV %d is not a multiple of HQK %d", c.HV, c.HQK)
	}
	for _, d := range []struct {
		name string
		v    int
	}{{"DK", c.DK}, {"DV", c.DV}} {
		if !slices.Contains(HeadDims(), d.v) {
			return c, fmt.Errorf("kcp: plan: head dim %s = %d is not supported (want 128; 16, 32 or 64 for CPU tests)",
				d.name, d.v)
		}
	}
	if c.Chunk != ChunkSize {
		return c, fmt.Errorf("kcp: plan: chunk size %d is not supported (only %d)", c.Chunk, ChunkSize)
	}
	return c, nil
}

// Range is the global token range [Start, End).
type Range struct {
	Start, End int // global token offsets
}

// Len is End - Start.
func (r Range) Len() int { return r.End - r.Start }

// SegRef names a segment: Segments[Seg] of rank Rank.
type SegRef struct {
	Rank int // the rank holding the segment
	Seg  int // index into that rank's Segments
}

// HaloPiece is a run of conv-halo tokens: Count tokens from Offset on, in
// segment Seg of rank Rank.
type HaloPiece struct {
	Rank   int // the rank holding the tokens
	Seg    int // index into that rank's Segments
	Offset int // first token, counted from the segment's start
	Count  int // tokens, 1..3
}

// Segment is a maximal run of a rank's buffer that belongs to one document and
// is contiguous in the global buffer.
type Segment struct {
	Doc        int // document index in the pack
	Start      int // global token offset
	Len        int // tokens
	Chunks     int // ceil(Len/64), counted from the segment's own start
	LocalStart int // offset in the rank's buffer
	DocOffset  int // offset of Start within the document
	// Pred and Succ are the neighbours in the document's chain, nil at the
	// chain's ends.
	Pred, Succ *SegRef
	// Halo is where the conv halo lives: the min(3, DocOffset) tokens right
	// before the segment in its document, in global order. A piece may lie on
	// another rank, and when earlier segments are shorter than 3 tokens the
	// halo spans several of them. Empty when the segment starts its document.
	Halo []HaloPiece
}

// End is Start + Len.
func (s *Segment) End() int { return s.Start + s.Len }

// HaloLen is the number of halo tokens, min(3, DocOffset).
func (s *Segment) HaloLen() int {
	n := 0
	for _, h := range s.Halo {
		n += h.Count
	}
	return n
}

// RankPlan is one rank's share of a plan.
type RankPlan struct {
	// Rank is the rank's index.
	Rank int
	// Parts are the global ranges the layout gives the rank, in buffer order;
	// empty parts are left out.
	Parts []Range
	// Tokens is the rank's buffer length.
	Tokens int
	// Segments, in buffer order.
	Segments []Segment
	// The walk lists, as indices into Segments in buffer order: Summary holds
	// the segments with a chain successor, State all of them, Offset those
	// with a chain predecessor, Tape all of them.
	Summary, State, Offset, Tape []int
}

// Walk returns the walk list of kind k (nil for an unknown kind).
func (rp *RankPlan) Walk(k sched.WalkKind) []int {
	if rp == nil {
		return nil
	}
	switch k {
	case sched.Summary:
		return rp.Summary
	case sched.State:
		return rp.State
	case sched.Offset:
		return rp.Offset
	case sched.Tape:
		return rp.Tape
	}
	return nil
}

// WalkChains returns the chunk counts of the segments of walk list k, in
// walk-list order: the chains the width rule schedules.
func (rp *RankPlan) WalkChains(k sched.WalkKind) []int {
	w := rp.Walk(k)
	out := make([]int, len(w))
	for i, s := range w {
		out[i] = rp.Segments[s].Chunks
	}
	return out
}

// Plan is how a pack is laid out over the ranks. A Plan is read-only once
// built and safe for concurrent use.
type Plan struct {
	// Config is the configuration with its defaults filled in.
	Config PlanConfig
	// Tokens is the pack's total T.
	Tokens int
	// DocStarts[d] is document d's global start.
	DocStarts []int
	// Ranks holds every rank's share, indexed by rank.
	Ranks []RankPlan
	// Chains[d] is document d's chain: its segments sorted by global start.
	Chains [][]SegRef

	widths sync.Map // widthKey -> sched.Decision
}

// errNilPlan is what the methods of a nil *Plan that return an error return.
var errNilPlan = errors.New("kcp: plan is nil")

// Segment returns the segment ref names, or nil where the plan has none
// (a nil plan, a rank or segment index out of range).
func (p *Plan) Segment(ref SegRef) *Segment {
	if p == nil || ref.Rank < 0 || ref.Rank >= len(p.Ranks) || ref.Seg < 0 || ref.Seg >= len(p.Ranks[ref.Rank].Segments) {
		return nil
	}
	return &p.Ranks[ref.Rank].Segments[ref.Seg]
}

// split cuts n into m consecutive parts; part i has floor(n/m) + (1 if i < n
// mod m) and starts at the returned offset.
func split(n, m, i int) (start, size int) {
	q, r := n/m, n%m
	size = q
	if i < r {
		size++
	}
	return i*q + min(i, r), size
}

// NewPlan lays out cfg's documents over cfg.Ranks ranks. It returns an error,
// and no plan, for: no documents, a length below 1, Ranks outside 1..64, an
// unknown layout, head counts below 1 or HV not a multiple of HQK, an
// unsupported head dim, a chunk size other than 64, or more than MaxTokens
// tokens in all.
//
// A rank may hold no tokens (layout C or Z with fewer tokens than parts): it
// then has no segments and empty walk lists.
func NewPlan(cfg PlanConfig) (*Plan, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	p := &Plan{Config: cfg, DocStarts: make([]int, len(cfg.Docs))}
	for d, l := range cfg.Docs {
		p.DocStarts[d] = p.Tokens
		p.Tokens += l
	}
	R := cfg.Ranks
	p.Ranks = make([]RankPlan, R)
	for r := range p.Ranks {
		rp := &p.Ranks[r]
		rp.Rank = r
		add := func(start, size int) {
			if size > 0 {
				rp.Parts = append(rp.Parts, Range{start, start + size})
			}
		}
		switch cfg.Layout {
		case LayoutC:
			add(split(p.Tokens, R, r))
		case LayoutZ:
			add(split(p.Tokens, 2*R, r))
			add(split(p.Tokens, 2*R, 2*R-1-r))
		case LayoutD:
			for d, l := range cfg.Docs {
				s, n := split(l, 2*R, r)
				add(p.DocStarts[d]+s, n)
				s, n = split(l, 2*R, 2*R-1-r)
				add(p.DocStarts[d]+s, n)
			}
		}
		for _, part := range rp.Parts {
			p.appendSegments(rp, part)
		}
		for i := range rp.Segments {
			rp.Segments[i].Chunks = (rp.Segments[i].Len + ChunkSize - 1) / ChunkSize
		}
	}
	p.link()
	for r := range p.Ranks {
		rp := &p.Ranks[r]
		for i := range rp.Segments {
			s := &rp.Segments[i]
			if s.Succ != nil {
				rp.Summary = append(rp.Summary, i)
			}
			rp.State = append(rp.State, i)
			if s.Pred != nil {
				rp.Offset = append(rp.Offset, i)
			}
			rp.Tape = append(rp.Tape, i)
			s.Halo = p.halo(s)
		}
	}
	return p, nil
}

// appendSegments appends the global range part to rp's buffer, cut at
// document boundaries, merging with the previous segment where the same
// document continues in the global buffer.
func (p *Plan) appendSegments(rp *RankPlan, part Range) {
	// The document holding part.Start: the last one starting at or before it.
	d := sort.SearchInts(p.DocStarts, part.Start+1) - 1
	for pos := part.Start; pos < part.End; d++ {
		end := min(part.End, p.DocStarts[d]+p.Config.Docs[d])
		if n := len(rp.Segments); n > 0 && rp.Segments[n-1].Doc == d && rp.Segments[n-1].End() == pos {
			rp.Segments[n-1].Len += end - pos
		} else {
			rp.Segments = append(rp.Segments, Segment{
				Doc: d, Start: pos, Len: end - pos, LocalStart: rp.Tokens, DocOffset: pos - p.DocStarts[d],
			})
		}
		rp.Tokens += end - pos
		pos = end
	}
}

// link builds every document's chain and the Pred/Succ references.
func (p *Plan) link() {
	p.Chains = make([][]SegRef, len(p.Config.Docs))
	for r := range p.Ranks {
		for i, s := range p.Ranks[r].Segments {
			p.Chains[s.Doc] = append(p.Chains[s.Doc], SegRef{r, i})
		}
	}
	for _, chain := range p.Chains {
		slices.SortFunc(chain, func(a, b SegRef) int { return p.Segment(a).Start - p.Segment(b).Start })
		for i := range chain {
			s := p.Segment(chain[i])
			if i > 0 {
				pred := chain[i-1]
				s.Pred = &pred
			}
			if i+1 < len(chain) {
				succ := chain[i+1]
				s.Succ = &succ
			}
		}
	}
}

// halo walks back along s's chain for the min(3, DocOffset) tokens before it.
func (p *Plan) halo(s *Segment) []HaloPiece {
	need := min(ConvHalo, s.DocOffset)
	if need == 0 {
		return nil
	}
	var pieces []HaloPiece
	for ref := s.Pred; need > 0; ref = p.Segment(*ref).Pred {
		src := p.Segment(*ref)
		n := min(need, src.Len)
		pieces = append(pieces, HaloPiece{Rank: ref.Rank, Seg: ref.Seg, Offset: src.Len - n, Count: n})
		need -= n
	}
	slices.Reverse(pieces)
	return pieces
}
