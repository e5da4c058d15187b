package sched

import (
	"container/heap"
	"fmt"
	"slices"
)

// maxMultifitCTAs bounds the launches DispatchOrder runs the multifit
// candidate for (a few passes of first-fit over the slots per CTA); larger
// launches take the better of launch order and LPT order.
const maxMultifitCTAs = 1 << 16

// DispatchOrder returns the order in which a walk launch's CTAs should reach
// the GPU, and the makespan (in chunks) it gives. The launch has, for each
// value head of hv, each chain of chains in order and perSegment column tiles,
// one CTA of that chain's length: CTA index x + perSegment*(s + len(chains)*h)
// in launch order (the grid's x fastest, then the segment, then the head). The
// GPU hands CTAs out in the order of their linear block index, each onto the
// first of slots to come free (ListMakespan's model, which fits the H200's
// measured walk times); a walk that reads its (tile, segment, head) from
// order[blockIdx] therefore runs its CTAs in this order.
//
// The order is the best, by that model, of three candidates: launch order
// itself, LPT order (longest chains first), and the order in which a multifit
// packing starts its CTAs (first-fit decreasing into slots bins under the
// smallest capacity that fits, found by bisection; each bin's CTAs back to
// back, longest first). So the makespan is never above ListMakespan's (launch
// order) or LPT's list makespan. Ties keep the earlier candidate. Three
// documents of 704, 625 and 562 chunks at HV 48 on 132 slots: at vh 64 launch
// order 1891, LPT 1812, multifit 1686 (the bound: 3 x 562, where 24 slots must
// run three CTAs); at vh 128 launch order 1266, multifit 1124.
//
// Changing the order changes no arithmetic of a walk: every CTA computes the
// same thing wherever and whenever it runs. It returns an error for slots < 1,
// a negative chain, hv or perSegment < 1, or more CTAs than an int32 indexes.
func DispatchOrder(chains []int, hv, perSegment, slots int) (order []int32, makespan int, err error) {
	switch {
	case slots < 1:
		return nil, 0, fmt.Errorf("sched: dispatch order: %d slots, need at least 1", slots)
	case hv < 1 || perSegment < 1:
		return nil, 0, fmt.Errorf("sched: dispatch order: %d heads x %d tiles a segment, need at least 1 each", hv, perSegment)
	}
	for i, c := range chains {
		if c < 0 {
			return nil, 0, fmt.Errorf("sched: dispatch order: chain %d has %d chunks", i, c)
		}
	}
	n := hv * len(chains) * perSegment
	if n/(hv*perSegment) != len(chains) || n > 1<<31-1 {
		return nil, 0, fmt.Errorf("sched: dispatch order: %d heads x %d chains x %d tiles overflow an int32 index", hv, len(chains), perSegment)
	}
	length := func(cta int32) int { return chains[(int(cta)/perSegment)%len(chains)] }
	launch := make([]int32, n)
	for i := range launch {
		launch[i] = int32(i)
	}
	best, bestSpan := launch, listMakespanOf(launch, length, slots)
	try := func(o []int32) {
		if o == nil {
			return
		}
		if m := listMakespanOf(o, length, slots); m < bestSpan {
			best, bestSpan = o, m
		}
	}
	lpt := slices.Clone(launch)
	slices.SortStableFunc(lpt, func(a, b int32) int { return length(b) - length(a) })
	try(lpt)
	if n <= maxMultifitCTAs {
		try(multifitOrder(lpt, length, slots, bestSpan))
	}
	return best, bestSpan, nil
}

// listMakespanOf is the makespan of handing the CTAs out in order, each onto
// the least-loaded of slots.
func listMakespanOf(order []int32, length func(int32) int, slots int) int {
	loads := make(minLoads, min(slots, len(order)))
	span := 0
	for i, cta := range order {
		l := length(cta)
		if i < len(loads) {
			loads[i] = l
			span = max(span, l)
			if i == len(loads)-1 {
				heap.Init(&loads)
			}
			continue
		}
		loads[0] += l
		span = max(span, loads[0])
		heap.Fix(&loads, 0)
	}
	return span
}

// multifitOrder packs the CTAs of desc (sorted longest first) into slots bins
// by first-fit decreasing under the smallest capacity in [lower bound, upper]
// that fits, and returns the order in which the bins' CTAs start when each
// bin runs its CTAs back to back, longest first (ties: the earlier bin, then
// the earlier CTA of desc). It returns nil where no capacity below upper fits.
func multifitOrder(desc []int32, length func(int32) int, slots, upper int) []int32 {
	total, longest := 0, 0
	for _, c := range desc {
		total += length(c)
		longest = max(longest, length(c))
	}
	lo := max(longest, (total+slots-1)/slots)
	var packed [][]int32
	hi := upper - 1
	for lo <= hi {
		mid := lo + (hi-lo)/2
		if bins := firstFitDecreasing(desc, length, slots, mid); bins != nil {
			packed, hi = bins, mid-1
		} else {
			lo = mid + 1
		}
	}
	if packed == nil {
		return nil
	}
	type start struct {
		at, bin, pos int
		cta          int32
	}
	var starts []start
	for b, bin := range packed {
		at := 0
		for p, cta := range bin {
			starts = append(starts, start{at, b, p, cta})
			at += length(cta)
		}
	}
	slices.SortFunc(starts, func(x, y start) int {
		if x.at != y.at {
			return x.at - y.at
		}
		if x.bin != y.bin {
			return x.bin - y.bin
		}
		return x.pos - y.pos
	})
	order := make([]int32, len(starts))
	for i, s := range starts {
		order[i] = s.cta
	}
	return order
}

// firstFitDecreasing puts each CTA of desc into the first of slots bins with
// room for it under capacity, or returns nil when one does not fit.
func firstFitDecreasing(desc []int32, length func(int32) int, slots, capacity int) [][]int32 {
	bins := make([][]int32, slots)
	loads := make([]int, slots)
	for _, cta := range desc {
		l, placed := length(cta), false
		for b := range bins {
			if loads[b]+l <= capacity {
				bins[b] = append(bins[b], cta)
				loads[b] += l
				placed = true
				break
			}
		}
		if !placed {
			return nil
		}
	}
	return bins
}

// minLoads is a min-heap of slot loads.
type minLoads []int

func (h minLoads) Len() int           { return len(h) }
func (h minLoads) Less(i, j int) bool { return h[i] < h[j] }
func (h minLoads) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *minLoads) Push(x any)        { *h = append(*h, x.(int)) }
func (h *minLoads) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
