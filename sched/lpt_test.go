package sched

import (
	"math/rand"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// naiveLPT is LPT as written: jobs longest first, each onto the least-loaded
// slot, ties to the lowest index.
func naiveLPT(jobs []int, slots int) int {
	sorted := slices.Clone(jobs)
	slices.SortFunc(sorted, func(a, b int) int { return b - a })
	loads := make([]int, slots)
	for _, j := range sorted {
		loads[leastLoaded(loads)] += j
	}
	return slices.Max(loads)
}

// leastLoaded is the index of the first smallest load.
func leastLoaded(loads []int) int {
	best := 0
	for i := 1; i < len(loads); i++ {
		if loads[i] < loads[best] {
			best = i
		}
	}
	return best
}

// naiveList is ListMakespan by a linear scan of the slot loads: the jobs in
// launch order (head, chain, CTA), each onto the first least-loaded slot.
func naiveList(chains []int, hv, perSegment, slots int) int {
	loads := make([]int, slots)
	for range hv {
		for _, c := range chains {
			for range perSegment {
				loads[leastLoaded(loads)] += c
			}
		}
	}
	return slices.Max(loads)
}

func TestListMakespan(t *testing.T) {
	tests := []struct {
		name              string
		chains            []int
		hv, per, slots, m int
	}{
		{"empty", nil, 4, 1, 3, 0},
		{"fewer CTAs than slots", []int{5, 9}, 1, 1, 4, 9},
		// Launch order 3, 1, 3, 1 on 2 slots: 3 | 1, then 3 onto 1 -> 4, 1 onto 3 -> 4.
		{"launch order", []int{3, 1}, 2, 1, 2, 4},
		// LPT would place 3, 3, 1, 1 -> 4 as well; 1, 3 order: 1 | 3, 1 -> 2, 3 -> 5.
		{"short chain first", []int{1, 3}, 2, 1, 2, 5},
		{"per segment", []int{2}, 1, 4, 3, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.m, mustList(t, tc.chains, tc.hv, tc.per, tc.slots))
		})
	}
	seed := uint64(11)
	next := func(n int) int {
		seed = seed*6364136223846793005 + 1442695040888963407
		return int((seed >> 33) % uint64(n))
	}
	for range 500 {
		chains := make([]int, next(10))
		for i := range chains {
			chains[i] = next(700)
		}
		hv, per, slots := 1+next(50), 1+next(4), 1+next(140)
		require.Equal(t, naiveList(chains, hv, per, slots), mustList(t, chains, hv, per, slots), "%v hv %d per %d slots %d", chains, hv, per, slots)
	}
}

func TestListMakespanErrors(t *testing.T) {
	tests := []struct {
		name           string
		chains         []int
		hv, per, slots int
		want           string
	}{
		{"no slot", []int{1}, 1, 1, 0, "0 slots, need at least 1"},
		{"negative slots", []int{1}, 1, 1, -3, "-3 slots"},
		{"negative chain", []int{4, -1}, 1, 1, 2, "chain 1 has -1 chunks"},
		{"negative heads", []int{1}, -1, 1, 2, "-1 heads x 1 tiles"},
		{"negative tiles", []int{1}, 1, -2, 2, "1 heads x -2 tiles"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ListMakespan(tc.chains, tc.hv, tc.per, tc.slots)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, m)
		})
	}
	m, err := ListMakespan([]int{3}, 0, 1, 2)
	require.NoError(t, err, "no head launches nothing")
	assert.Zero(t, m)
}

// mustLPT is LPT, failing the test on an error.
func mustLPT(t testing.TB, jobs []int, slots int) int {
	t.Helper()
	m, err := LPT(jobs, slots)
	require.NoError(t, err)
	return m
}

// mustList is ListMakespan, failing the test on an error.
func mustList(t testing.TB, chains []int, hv, per, slots int) int {
	t.Helper()
	m, err := ListMakespan(chains, hv, per, slots)
	require.NoError(t, err)
	return m
}

// optimum is the smallest makespan of any assignment, by exhaustive search
// (slots are interchangeable, so a job only ever opens the first empty slot).
func optimum(jobs []int, slots int) int {
	sorted := slices.Clone(jobs)
	slices.SortFunc(sorted, func(a, b int) int { return b - a })
	loads := make([]int, slots)
	best := 0
	for _, j := range sorted {
		best += j
	}
	var rec func(i, cur int)
	rec = func(i, cur int) {
		if cur >= best {
			return
		}
		if i == len(sorted) {
			best = cur
			return
		}
		for s := range loads {
			loads[s] += sorted[i]
			rec(i+1, max(cur, loads[s]))
			loads[s] -= sorted[i]
			if loads[s] == 0 {
				break
			}
		}
	}
	rec(0, 0)
	return best
}

func TestLPTHandCases(t *testing.T) {
	tests := []struct {
		name  string
		jobs  []int
		slots int
		want  int
	}{
		{"empty", nil, 3, 0},
		{"one job", []int{7}, 1, 7},
		{"one slot sums", []int{3, 1, 4, 1, 5}, 1, 14},
		{"fewer jobs than slots", []int{5, 9, 2}, 8, 9},
		{"zero-length jobs", []int{0, 0, 0}, 2, 0},
		{"even split", []int{4, 4, 4, 4}, 2, 8},
		// Classic LPT worst case for m = 2: OPT = 6 ({3,3},{2,2,2}), LPT = 7.
		{"lpt worst case m=2", []int{3, 3, 2, 2, 2}, 2, 7},
		// m = 3: OPT = 9, LPT = 11 = (4/3 - 1/9) * 9.
		{"lpt worst case m=3", []int{5, 5, 4, 4, 3, 3, 3}, 3, 11},
		{"unsorted input", []int{1, 5, 2, 4, 3}, 2, 8},
		{"repeated chains", []int{10, 10, 10, 6, 6, 6}, 4, 16},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.jobs)
			assert.Equal(t, tc.want, mustLPT(t, tc.jobs, tc.slots))
			assert.Equal(t, tc.want, naiveLPT(tc.jobs, tc.slots), "naive")
			assert.Equal(t, in, tc.jobs, "LPT must not modify its input")
		})
	}
}

func TestLPTMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewSource(11))
	for it := 0; it < 3000; it++ {
		slots := 1 + r.Intn(40)
		n := r.Intn(120)
		jobs := make([]int, n)
		for i := range jobs {
			if r.Intn(3) == 0 {
				jobs[i] = r.Intn(8) // many ties
			} else {
				jobs[i] = r.Intn(1000)
			}
		}
		require.Equal(t, naiveLPT(jobs, slots), mustLPT(t, jobs, slots), "jobs %v slots %d", jobs, slots)
	}
}

func TestLPTRepeatedMatchesExpanded(t *testing.T) {
	r := rand.New(rand.NewSource(12))
	var lp lptState
	for it := 0; it < 1000; it++ {
		chains := make([]int, 1+r.Intn(12))
		for i := range chains {
			chains[i] = 1 + r.Intn(600)
		}
		times := 1 + r.Intn(96)
		slots := 1 + r.Intn(300)
		var jobs []int
		for _, c := range chains {
			for range times {
				jobs = append(jobs, c)
			}
		}
		desc := slices.Clone(chains)
		slices.SortFunc(desc, func(a, b int) int { return b - a })
		require.Equal(t, naiveLPT(jobs, slots), lptRepeated(&lp, desc, times, slots))
	}
}

func TestLPTAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewSource(13))
	for it := 0; it < 1500; it++ {
		m := 1 + r.Intn(4)
		jobs := make([]int, 1+r.Intn(9))
		for i := range jobs {
			jobs[i] = 1 + r.Intn(20)
		}
		opt := optimum(jobs, m)
		got := mustLPT(t, jobs, m)
		require.GreaterOrEqual(t, got, opt, "jobs %v m %d", jobs, m)
		// Graham: LPT <= (4/3 - 1/(3m)) OPT, i.e. 3m*LPT <= (4m-1)*OPT.
		require.LessOrEqual(t, 3*m*got, (4*m-1)*opt, "jobs %v m %d: LPT %d OPT %d", jobs, m, got, opt)
		require.LessOrEqual(t, 3*got, 4*opt)
	}
}

func TestLPTErrors(t *testing.T) {
	tests := []struct {
		name  string
		jobs  []int
		slots int
		want  string
	}{
		{"no slot", []int{1}, 0, "0 slots, need at least 1"},
		{"no slot, no job", nil, 0, "0 slots"},
		{"negative job", []int{1, -1}, 2, "job 1 is -1, need >= 0"},
		{"negative job first", []int{-5, 3}, 1, "job 0 is -5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := LPT(tc.jobs, tc.slots)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, m)
		})
	}
}
