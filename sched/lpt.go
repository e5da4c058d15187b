package sched

import (
	"fmt"
	"slices"
)

// LPT returns the makespan of the longest-processing-time-first schedule of
// jobs over slots identical slots: the jobs are taken longest first and each
// goes onto the least-loaded slot (ties to the lowest slot index); the
// makespan is the largest load at the end. An empty job list has makespan 0.
//
// The makespan depends only on the multiset of slot loads, never on which of
// several equally loaded slots takes a job, so LPT tracks the loads as a
// min-heap of (load, number of slots at that load) buckets and places a run of
// equal jobs onto a bucket in one step. A decision's 2*HV*n_walk jobs over
// 2*SM slots therefore cost a few heap operations per distinct job length, not
// one per job.
//
// LPT does not modify jobs. It returns an error, and makespan 0, if slots < 1
// or a job is negative.
func LPT(jobs []int, slots int) (int, error) {
	if slots < 1 {
		return 0, fmt.Errorf("sched: LPT: %d slots, need at least 1", slots)
	}
	for i, j := range jobs {
		if j < 0 {
			return 0, fmt.Errorf("sched: LPT: job %d is %d, need >= 0", i, j)
		}
	}
	if len(jobs) == 0 {
		return 0, nil
	}
	sorted := slices.Clone(jobs)
	slices.SortFunc(sorted, func(a, b int) int { return b - a })
	var lp lptState
	lp.reset(slots)
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && sorted[j] == sorted[i] {
			j++
		}
		lp.place(sorted[i], j-i)
		i = j
	}
	return lp.makespan, nil
}

// lptRepeated is LPT of every length in desc (sorted longest first, all >= 0)
// taken times times, without building the job list.
func lptRepeated(lp *lptState, desc []int, times, slots int) int {
	lp.reset(slots)
	for i := 0; i < len(desc); {
		j := i + 1
		for j < len(desc) && desc[j] == desc[i] {
			j++
		}
		lp.place(desc[i], (j-i)*times)
		i = j
	}
	return lp.makespan
}

// bucket is count slots that all carry load.
type bucket struct {
	load, count int
}

// lptState is a min-heap of buckets keyed by load, plus the largest load seen.
type lptState struct {
	heap     []bucket
	makespan int
}

func (s *lptState) reset(slots int) {
	s.heap = append(s.heap[:0], bucket{0, slots})
	s.makespan = 0
}

// place puts n jobs of length size onto the least-loaded slots, one at a time
// in LPT order. While a bucket at the minimum load L has slots left, every
// job goes onto one of them (L < L+size), so a bucket takes min(count, n)
// jobs in one step and the slots it fills form a new bucket at L+size.
func (s *lptState) place(size, n int) {
	for n > 0 {
		top := s.heap[0]
		t := min(top.count, n)
		n -= t
		load := top.load + size
		s.makespan = max(s.makespan, load)
		if t == top.count {
			// Every slot of the bucket moves up: replace it in place.
			s.heap[0] = bucket{load, t}
			s.down(0)
		} else {
			s.heap[0].count -= t // same load, heap order unchanged
			s.push(bucket{load, t})
		}
	}
}

func (s *lptState) push(b bucket) {
	s.heap = append(s.heap, b)
	i := len(s.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if s.heap[p].load <= s.heap[i].load {
			break
		}
		s.heap[p], s.heap[i] = s.heap[i], s.heap[p]
		i = p
	}
}

func (s *lptState) down(i int) {
	h := s.heap
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r].load < h[l].load {
			m = r
		}
		if h[i].load <= h[m].load {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// ListMakespan returns the makespan of a walk launch's CTAs as the GPU hands
// them out: in launch order (for each value head of hv, each chain of chains
// in order, perSegment CTAs of that chain's length), each onto the least-loaded
// of slots (the first to come free). This is LPT's placement without LPT's
// sort, so it runs on the same bucket heap (lptState.place). It returns an
// error, and makespan 0, if slots < 1, hv or perSegment is negative, or a chain
// is negative (hv or perSegment 0 launch nothing: makespan 0).
func ListMakespan(chains []int, hv, perSegment, slots int) (int, error) {
	switch {
	case slots < 1:
		return 0, fmt.Errorf("sched: list makespan: %d slots, need at least 1", slots)
	case hv < 0 || perSegment < 0:
		return 0, fmt.Errorf("sched: list makespan: %d heads x %d tiles a segment, need >= 0 each", hv, perSegment)
	}
	for i, c := range chains {
		if c < 0 {
			return 0, fmt.Errorf("sched: list makespan: chain %d has %d chunks", i, c)
		}
	}
	lp := lptPool.Get().(*lptState)
	defer lptPool.Put(lp)
	lp.reset(slots)
	for range hv {
		for _, c := range chains {
			lp.place(c, perSegment)
		}
	}
	return lp.makespan, nil
}
