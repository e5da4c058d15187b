package sched

import (
	"fmt"
	"slices"
)

// MixedMarginPercent is how far below the better single width a mixed launch
// must come by the model (Mixed.Makespan against Mixed.Single) for
// Mixed.Better to take it: the measured cost ratios it rests on spread by a
// few percent (CostRule's doc), and a split launch has two kernels to start.
const MixedMarginPercent = 2

// Mixed is one walk launch split between the two widths (MixedWalk): of
// every walked chain s (a segment, in walk-list order), the value heads h <
// Wide[s] run at vh = 128, T CTAs each, and the others at vh = 64, 2T CTAs
// each, as two launches that the GPU runs side by side; T is Tiles, the
// column sets a walk runs (1 for the state and tape walks, 2 for the summary
// and offset walks: P and Q, P^T and R). Both forms of a walk compute the
// same bits (DESIGN.md §4), so a mixed launch writes what either single
// width writes.
//
// The two launches reach their work through dispatch_cta (ptx/src/mma.cuh),
// which decodes order[block] with the launch's own grid dimensions: the vh =
// 128 launch is Grid128 = (T, S, W/S) over Order128, W = sum(Wide) (a
// multiple of S, so that the grid factors), and the vh = 64 launch is Grid64 =
// (2T, S, HV - W/S) over Order64. Order128 holds each vh = 128 CTA as its
// index x + T*(s + S*h) in the full vh = 128 launch order, Order64 each vh =
// 64 CTA as x + 2T*(s + S*h): the decoded head is h whatever the grid's z
// extent.
type Mixed struct {
	// Segments is S, the number of walked chains; HV the value heads; Tiles
	// T, the CTAs of a (chain, head) walk at vh = 128.
	Segments, HV, Tiles int
	// Wide holds, per chain, how many of its value heads (the first ones) run
	// at vh = 128.
	Wide []int
	// Order128 and Order64 are the two launches' CTAs in dispatch order.
	Order128, Order64 []int32
	// Makespan is the model's makespan of the split launch in cost units
	// (chunks times ChunkCost): the vh = 128 CTAs handed out first (their
	// launch goes first), then the vh = 64 CTAs, each onto the first of the
	// slots to come free.
	Makespan int
	// Single is the better single-width launch's makespan in the same units,
	// min(Narrow*M64, Wide*M128) over DispatchOrder's makespans, and
	// SingleVH its width (64 on a tie, as the cost rule takes).
	Single, SingleVH int
}

// Grid128 is the vh = 128 launch's grid: (T, S, W/S).
func (m *Mixed) Grid128() [3]int {
	if m == nil || m.Tiles*m.Segments == 0 {
		return [3]int{}
	}
	return [3]int{m.Tiles, m.Segments, len(m.Order128) / (m.Tiles * m.Segments)}
}

// Grid64 is the vh = 64 launch's grid: (2T, S, HV - W/S).
func (m *Mixed) Grid64() [3]int {
	if m == nil || m.Tiles*m.Segments == 0 {
		return [3]int{}
	}
	return [3]int{2 * m.Tiles, m.Segments, len(m.Order64) / (2 * m.Tiles * m.Segments)}
}

// Walks128 is W, the (chain, head) walks at vh = 128.
func (m *Mixed) Walks128() int {
	if m == nil || m.Tiles == 0 {
		return 0
	}
	return len(m.Order128) / m.Tiles
}

// Better reports whether the split launch beats the better single width by
// at least MixedMarginPercent by the model. A nil m is never better.
func (m *Mixed) Better() bool {
	return m != nil && 100*m.Makespan <= (100-MixedMarginPercent)*m.Single
}

// String says what the split is and what the model gives for it.
func (m *Mixed) String() string {
	if m == nil {
		return "no mixed launch"
	}
	return fmt.Sprintf("mixed: %d of %d (segment, head) walks at vh = 128 (per chain %v), makespan %d against %d at vh = %d (%.1f%%)",
		m.Walks128(), m.Segments*m.HV, m.Wide, m.Makespan, m.Single, m.SingleVH,
		100*float64(m.Makespan-m.Single)/float64(m.Single))
}

// MixedWalk finds a split of a walk launch between the widths (Mixed) with
// the least model makespan, over slots walk CTAs at once and cost's relative
// chunk costs. chains holds the walked chains' chunk counts in walk-list
// order; hv is the value heads; tiles the column sets of the walk (Mixed's
// T: 1 or 2).
//
// The splits tried: for every chain length t among chains and every k in
// 1..hv, k heads at vh = 128 of every chain that is at least t long, of every
// one at most t long, and of every one exactly t long, where the total is a
// multiple of S and neither 0 nor S*hv. Each is ordered by its lengths, the
// vh = 128 CTAs first (longest first) and then the vh = 64 CTAs (longest
// first); the best of them is also tried in the order of a multifit packing
// (first-fit decreasing under the smallest capacity that fits) with the vh =
// 128 CTAs moved to the front, and keeps that order where it finishes
// earlier. Ties keep the earlier candidate, so the answer is a function of
// the arguments alone.
//
// It returns nil (and no error) where the walk list is empty or no split is
// possible (hv = 1: the wide walks would have to be all S of them). Errors:
// slots < 1, hv < 1, tiles < 1, a chain below 1 chunk, costs below 1, more
// CTAs than an int32 indexes.
func MixedWalk(chains []int, hv, tiles, slots int, cost ChunkCost) (*Mixed, error) {
	return MixedWalkAtMost(chains, hv, hv, tiles, slots, cost)
}

// MixedWalkAtMost is MixedWalk trying only splits that put at most maxWide
// of a chain's hv value heads at vh = 128 (k in 1..maxWide; MixedWalk tries
// 1..hv): where the cost model is known to hold only for a few wide CTAs
// beside the narrow ones (CostRule.StateSplitLean, BackwardSplitMaxWidePercent).
// Errors: MixedWalk's, and maxWide outside [1, hv].
func MixedWalkAtMost(chains []int, hv, maxWide, tiles, slots int, cost ChunkCost) (*Mixed, error) {
	single, singleVH, err := mixedSingle("mixed walk", chains, hv, tiles, slots, cost)
	if err != nil || len(chains) == 0 {
		return nil, err
	}
	if maxWide < 1 || maxWide > hv {
		return nil, fmt.Errorf("sched: mixed walk: at most %d wide heads of %d, want 1..%d", maxWide, hv, hv)
	}
	S := len(chains)
	lengths := slices.Clone(chains)
	slices.Sort(lengths)
	lengths = slices.Compact(lengths)
	sel := []func(c, t int) bool{
		func(c, t int) bool { return c >= t },
		func(c, t int) bool { return c <= t },
		func(c, t int) bool { return c == t },
	}
	ev := newMixedEval(chains, hv, tiles, slots, cost)
	var best *Mixed
	wide := make([]int, S)
	for _, t := range lengths {
		for _, in := range sel {
			n := 0
			for _, c := range chains {
				if in(c, t) {
					n++
				}
			}
			for k := 1; k <= maxWide; k++ {
				if w := n * k; w%S != 0 || w == S*hv {
					continue
				}
				for s, c := range chains {
					wide[s] = 0
					if in(c, t) {
						wide[s] = k
					}
				}
				if span := ev.lengthOrderSpan(wide); best == nil || span < best.Makespan {
					best = &Mixed{Segments: S, HV: hv, Tiles: tiles, Wide: slices.Clone(wide), Makespan: span}
				}
			}
		}
	}
	if best == nil {
		return nil, nil
	}
	best.Order128, best.Order64, best.Makespan = ev.orders(best.Wide)
	best.Single, best.SingleVH = single, singleVH
	return best, nil
}

// SplitModelFor returns how p's width rule models walk kind split between
// the widths (CostRule.SplitFor with p.LeanForward) and whether it does:
// false where p's variant has no cost rule or that rule splits no such walk.
func (p Profile) SplitModelFor(kind WalkKind) (SplitModel, bool) {
	r, err := RulesFor(p.Variant)
	if err != nil || r.Cost == nil {
		return SplitModel{}, false
	}
	return r.Cost.SplitFor(kind, p.LeanForward)
}

// BestSplit is the model's best split of walk kind over chains (hv value
// heads) on p: MixedWalkAtMost by SplitModelFor's model over the cost rule's
// CTAsPerSM*SMs slots, whether or not it is Better; nil (and no error) where
// p's rule models no split of kind, or chains is empty.
func (p Profile) BestSplit(kind WalkKind, chains []int, hv int) (*Mixed, error) {
	sm, ok := p.SplitModelFor(kind)
	if !ok || len(chains) == 0 {
		return nil, nil
	}
	r, _ := RulesFor(p.Variant) // SplitModelFor found its cost rule
	return MixedWalkAtMost(chains, hv, sm.MaxWide(hv), kind.ColumnSets(), r.Cost.CTAsPerSM*p.SMs, sm.Cost)
}

// SplitWalk is the split wide gives a walk launch (Mixed, with wide[s] the
// value heads of chain s at vh = 128), ordered and costed as MixedWalk orders
// and costs its best: for tests and measurements that want a given split.
// Errors: MixedWalk's, a wide of another length than chains, a count outside
// [0, hv], and a total that is not a multiple of S or is 0 or S*hv (one
// width, not a split).
func SplitWalk(chains, wide []int, hv, tiles, slots int, cost ChunkCost) (*Mixed, error) {
	single, singleVH, err := mixedSingle("split walk", chains, hv, tiles, slots, cost)
	if err != nil {
		return nil, err
	}
	S := len(chains)
	if len(wide) != S {
		return nil, fmt.Errorf("sched: split walk: %d wide counts for %d chains", len(wide), S)
	}
	w := 0
	for s, k := range wide {
		if k < 0 || k > hv {
			return nil, fmt.Errorf("sched: split walk: chain %d: %d wide heads of %d", s, k, hv)
		}
		w += k
	}
	if S == 0 || w%S != 0 || w == 0 || w == S*hv {
		return nil, fmt.Errorf("sched: split walk: %d of %d walks wide: want a non-zero multiple of %d chains below all", w, S*hv, S)
	}
	m := &Mixed{Segments: S, HV: hv, Tiles: tiles, Wide: slices.Clone(wide), Single: single, SingleVH: singleVH}
	m.Order128, m.Order64, m.Makespan = newMixedEval(chains, hv, tiles, slots, cost).orders(wide)
	return m, nil
}

// mixedSingle checks MixedWalk's and SplitWalk's arguments and returns the
// better single width's makespan in cost units and that width (64 on a tie).
func mixedSingle(what string, chains []int, hv, tiles, slots int, cost ChunkCost) (span, vh int, err error) {
	switch {
	case slots < 1:
		return 0, 0, fmt.Errorf("sched: %s: %d slots, need at least 1", what, slots)
	case hv < 1:
		return 0, 0, fmt.Errorf("sched: %s: HV %d, need at least 1", what, hv)
	case tiles < 1:
		return 0, 0, fmt.Errorf("sched: %s: %d column tiles, need at least 1", what, tiles)
	case cost.Narrow < 1 || cost.Wide < 1:
		return 0, 0, fmt.Errorf("sched: %s: chunk costs %d / %d, need at least 1 each", what, cost.Narrow, cost.Wide)
	case 2*tiles*len(chains)*hv > 1<<31-1:
		return 0, 0, fmt.Errorf("sched: %s: %d chains x %d heads x %d tiles overflow an int32 index", what, len(chains), hv, tiles)
	}
	for i, c := range chains {
		if c < 1 {
			return 0, 0, fmt.Errorf("sched: %s: chain %d has %d chunks, need at least 1", what, i, c)
		}
	}
	_, m64, err := DispatchOrder(chains, hv, 2*tiles, slots)
	if err != nil {
		return 0, 0, fmt.Errorf("sched: %s: %w", what, err)
	}
	_, m128, err := DispatchOrder(chains, hv, tiles, slots)
	if err != nil {
		return 0, 0, fmt.Errorf("sched: %s: %w", what, err)
	}
	if w := cost.Wide * m128; w < cost.Narrow*m64 {
		return w, 128, nil
	}
	return cost.Narrow * m64, 64, nil
}

// mixedEval evaluates splits of one walk launch.
type mixedEval struct {
	chains    []int
	byLen     [][]int // chain indices grouped by length, longest first; ascending within a group
	hv, tiles int
	slots     int
	cost      ChunkCost
	lens      []int   // the current split's CTAs in length order: vh = 128 ones first, then vh = 64
	grid      []int32 // their indices in their own launch's full order
	order     []int32 // 0, 1, ..., len(lens)-1
	n128      int
}

func newMixedEval(chains []int, hv, tiles, slots int, cost ChunkCost) *mixedEval {
	e := &mixedEval{chains: chains, hv: hv, tiles: tiles, slots: slots, cost: cost}
	idx := make([]int, len(chains))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return chains[b] - chains[a] })
	for i, s := range idx {
		if i == 0 || chains[s] != chains[idx[i-1]] {
			e.byLen = append(e.byLen, nil)
		}
		e.byLen[len(e.byLen)-1] = append(e.byLen[len(e.byLen)-1], s)
	}
	return e
}

// build fills lens and grid with wide's CTAs in length order: the vh = 128
// CTAs x + T*(s + S*h) (h < wide[s]), then the vh = 64 CTAs x + 2T*(s + S*h)
// (h >= wide[s]), each part longest first and in launch order among equals
// (head, then chain, then column tile), which is a stable sort of launch
// order by length.
func (e *mixedEval) build(wide []int) {
	S := len(e.chains)
	e.lens, e.grid = e.lens[:0], e.grid[:0]
	for _, g := range e.byLen {
		for h := range e.hv {
			for _, s := range g {
				if h < wide[s] {
					for x := range e.tiles {
						e.lens = append(e.lens, e.cost.Wide*e.chains[s])
						e.grid = append(e.grid, int32(x+e.tiles*(s+S*h)))
					}
				}
			}
		}
	}
	e.n128 = len(e.lens)
	for _, g := range e.byLen {
		for h := range e.hv {
			for _, s := range g {
				if h >= wide[s] {
					for x := range 2 * e.tiles {
						e.lens = append(e.lens, e.cost.Narrow*e.chains[s])
						e.grid = append(e.grid, int32(x+2*e.tiles*(s+S*h)))
					}
				}
			}
		}
	}
	for i := len(e.order); i < len(e.lens); i++ {
		e.order = append(e.order, int32(i))
	}
}

func (e *mixedEval) length(i int32) int { return e.lens[i] }

// lengthOrderSpan is the makespan of wide's split handed out in length order.
func (e *mixedEval) lengthOrderSpan(wide []int) int {
	e.build(wide)
	return listMakespanOf(e.order[:len(e.lens)], e.length, e.slots)
}

// orders returns wide's two dispatch orders and their makespan: length
// order, or the multifit order with its vh = 128 CTAs moved to the front
// where that finishes earlier.
func (e *mixedEval) orders(wide []int) (o128, o64 []int32, span int) {
	e.build(wide)
	order := slices.Clone(e.order[:len(e.lens)])
	span = listMakespanOf(order, e.length, e.slots)
	if mf := multifitOrder(lptOrder(e.lens), e.length, e.slots, span); mf != nil {
		front := make([]int32, 0, len(mf))
		for _, i := range mf {
			if int(i) < e.n128 {
				front = append(front, i)
			}
		}
		for _, i := range mf {
			if int(i) >= e.n128 {
				front = append(front, i)
			}
		}
		if m := listMakespanOf(front, e.length, e.slots); m < span {
			order, span = front, m
		}
	}
	o128 = make([]int32, 0, e.n128)
	o64 = make([]int32, 0, len(order)-e.n128)
	for _, i := range order {
		if int(i) < e.n128 {
			o128 = append(o128, e.grid[i])
		} else {
			o64 = append(o64, e.grid[i])
		}
	}
	return o128, o64, span
}
