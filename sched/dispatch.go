package sched

import (
	"fmt"
	"slices"
)

// maxMultifitCTAs bounds the launches DispatchOrder runs the multifit
// candidate for; larger launches take the better of launch order and LPT
// order.
const maxMultifitCTAs = 1 << 20

// DispatchOrder returns the order in which a walk launch's CTAs should reach
// the GPU, and the makespan (in chunks) it gives. The launch has, for each
// value head of hv, each chain of chains in order and perSegment column tiles,
// one CTA of that chain's length: CTA index x + perSegment*(s + len(chains)*h)
// in launch order (the grid's x fastest, then the segment, then the head). The
// GPU hands CTAs out in the order of their linear block index, each onto the
// first of slots to come free (ListMakespan's model, which fits the H200's
// measured walk times; CUDA itself leaves the block order unspecified); a
// walk that reads its (tile, segment, head) from order[blockIdx] therefore
// runs its CTAs in this order.
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
	lens := make([]int, n) // CTA -> its chain's length
	launch := make([]int32, n)
	for i := range launch {
		launch[i] = int32(i)
		lens[i] = chains[(i/perSegment)%len(chains)]
	}
	length := func(cta int32) int { return lens[cta] }
	best, bestSpan := launch, listMakespanOf(launch, length, slots)
	try := func(o []int32) {
		if o == nil {
			return
		}
		if m := listMakespanOf(o, length, slots); m < bestSpan {
			best, bestSpan = o, m
		}
	}
	lpt := lptOrder(lens)
	try(lpt)
	if n <= maxMultifitCTAs {
		try(multifitOrder(lpt, length, slots, bestSpan))
	}
	return best, bestSpan, nil
}

// lptOrder is the CTAs sorted longest first, launch order among equals (a
// stable sort by length, as buckets: lens holds few distinct values).
func lptOrder(lens []int) []int32 {
	buckets := map[int][]int32{}
	for i, l := range lens {
		buckets[l] = append(buckets[l], int32(i))
	}
	keys := make([]int, 0, len(buckets))
	for l := range buckets {
		keys = append(keys, l)
	}
	slices.Sort(keys)
	order := make([]int32, 0, len(lens))
	for i := len(keys) - 1; i >= 0; i-- {
		order = append(order, buckets[keys[i]]...)
	}
	return order
}

// listMakespanOf is the makespan of handing the CTAs out in order, each onto
// the least-loaded of slots. A run of CTAs of one length is placed in one
// step (lptState.place: each onto the least-loaded slot in turn, as handing
// them out one at a time does).
func listMakespanOf(order []int32, length func(int32) int, slots int) int {
	lp := lptPool.Get().(*lptState)
	defer lptPool.Put(lp)
	lp.reset(slots)
	for i := 0; i < len(order); {
		l := length(order[i])
		j := i + 1
		for j < len(order) && length(order[j]) == l {
			j++
		}
		lp.place(l, j-i)
		i = j
	}
	return lp.makespan
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
	loads := make([]int, slots)
	best := -1
	for hi := upper - 1; lo <= hi; {
		mid := lo + (hi-lo)/2
		if firstFitDecreasing(desc, length, loads, mid, nil) {
			best, hi = mid, mid-1
		} else {
			lo = mid + 1
		}
	}
	if best < 0 {
		return nil
	}
	packed := make([][]int32, slots)
	firstFitDecreasing(desc, length, loads, best, packed)
	// Each CTA's start as one sortable key: start time, bin, position in the
	// bin (start times fit 31 bits: they are below upper, an int makespan of
	// int32-indexed CTAs' chunk counts; bins and positions fit 16 bits each
	// where the launch does, else the order comes from a slower comparison).
	keys := make([]uint64, 0, len(desc))
	wide := slots >= 1<<16
	for b, bin := range packed {
		at := 0
		for p, cta := range bin {
			wide = wide || p >= 1<<16 || at >= 1<<31
			keys = append(keys, uint64(at)<<32|uint64(b)<<16|uint64(p))
			at += length(cta)
		}
	}
	if wide {
		return nil
	}
	slices.Sort(keys)
	order := make([]int32, len(keys))
	for i, k := range keys {
		order[i] = packed[(k>>16)&0xffff][k&0xffff]
	}
	return order
}

// firstFitDecreasing reports whether the CTAs of desc fit slots bins (loads,
// whose length is slots, is overwritten) under capacity, each into the first
// bin with room for it; where bins is not nil (len slots), each bin's CTAs are
// appended to it. A run of CTAs of one length (desc is sorted, so each
// chain's CTAs are one run) fills the bins in index order, each with as many
// as it has room for: what placing them one at a time does (a bin passed over
// stays too full, loads only grow), in one pass over the bins a run.
func firstFitDecreasing(desc []int32, length func(int32) int, loads []int, capacity int, bins [][]int32) bool {
	clear(loads)
	for i := 0; i < len(desc); {
		l := length(desc[i])
		j := i + 1
		for j < len(desc) && length(desc[j]) == l {
			j++
		}
		for b := 0; b < len(loads) && i < j; b++ {
			fit := j - i
			if l > 0 {
				fit = min(fit, (capacity-loads[b])/l)
			}
			if fit <= 0 {
				continue
			}
			if bins != nil {
				bins[b] = append(bins[b], desc[i:i+fit]...)
			}
			loads[b] += fit * l
			i += fit
		}
		if i < j {
			return false
		}
	}
	return true
}
