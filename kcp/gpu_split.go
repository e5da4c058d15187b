package kcp

import (
	"fmt"
	"slices"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// A walk split between the widths (sched.Mixed) runs as two launches side by
// side: the vh = 128 entry on some (segment, value head) walks and the vh =
// 64 entry on the others, each a partial grid whose dispatch order names
// CTAs of its full launch (dispatch_cta in ptx/src/mma.cuh decodes with the
// grid's x and y extents only). Both widths compute the same bits, so a
// split walk writes what either width writes. GPUOptions.SplitHeads forces
// a split of any walk; unless GPUOptions.SingleWidth, the width rule's cost
// model splits the walks that sched.CostRule.SplitFor names.

// splitStreams are a rank's side streams and events for split walks, made
// on first use in the rank's device memory.
type splitStreams struct {
	side [2]*loader.Stream // default priority; greatest priority (GPUOptions.SplitPriority)
	ev   [3]*loader.Event  // the side streams' start, and each one's end
}

// sync waits for the side streams' work (error paths, before memory goes).
func (s *splitStreams) sync() {
	for _, st := range s.side {
		if st != nil {
			_ = st.Synchronize()
		}
	}
}

// make creates the side streams and events that prio needs and m lacks.
func (s *splitStreams) make(m *devMem, prio bool) (err error) {
	if s.side[0] == nil {
		if s.side[0], err = m.stream(); err != nil {
			return err
		}
		for i := range s.ev {
			if s.ev[i], err = m.event(); err != nil {
				return err
			}
		}
	}
	if prio && s.side[1] == nil {
		_, greatest, err := m.ctx.StreamPriorities()
		if err != nil {
			return fmt.Errorf("stream priorities: %w", err)
		}
		if s.side[1], err = m.priorityStream(greatest); err != nil {
			return err
		}
	}
	return nil
}

// splitSupported reports whether ks's kernels of walk k can run split: the
// plane walks (the summary and state walks on the walk planes, the offset
// and tape walks on them, the tape walk with an entry a width), which read
// their CTA through dispatch_cta.
func splitSupported(ks kernelSet, k sched.WalkKind) bool {
	switch k {
	case sched.Summary, sched.State:
		return ks.planes
	case sched.Offset:
		return ks.bwalkPlanes
	case sched.Tape:
		return ks.bwalkPlanes && ks.tape128 != ""
	}
	return false
}

// walkSplit is how rk's walk k over chains (its walked segments' chunk
// counts, in list order) runs split between the widths, or nil where it
// runs at one width: GPUOptions.SplitHeads[k] heads of every chain at vh =
// 128 where set (newGPU refused it for kernels that cannot split); else,
// unless GPUOptions.SingleWidth, ForceVH or LaunchOrder, the profile's best
// split (sched.Profile.BestSplit) where its rule models walk k and the split
// comes sched.MixedMarginPercent under the better single width. Model
// splits are remembered by the backend (its plan and profile are fixed).
func (g *GPU) walkSplit(rk *gpuRank, k sched.WalkKind, chains32 []int32) (*sched.Mixed, error) {
	o, ks := g.opts, rk.dev.ks
	forced := g.gopts.SplitHeads[k]
	model := !g.gopts.SingleWidth && !g.gopts.LaunchOrder && o.ForceVH == 0
	if len(chains32) == 0 {
		return nil, nil
	}
	if forced == 0 && !model {
		return nil, nil
	}
	if !splitSupported(ks, k) {
		return nil, nil // the model's only: newGPU refuses SplitHeads for these kernels
	}
	chains := make([]int, len(chains32))
	for i, c := range chains32 {
		chains[i] = int(c)
	}
	hv := g.plan.Config.HV
	if forced > 0 {
		wide := make([]int, len(chains))
		for i := range wide {
			wide[i] = forced
		}
		// The costs only cost the split for its report; a walk the rule
		// does not model split takes the backward walks' 5/3.
		sm, ok := o.Profile.SplitModelFor(k)
		if !ok {
			sm.Cost = sched.ChunkCost{Narrow: 3, Wide: 5}
		}
		m, err := sched.SplitWalk(chains, wide, hv, k.ColumnSets(), walkSlots(o.Profile), sm.Cost)
		if err != nil {
			return nil, fmt.Errorf("rank %d: GPUOptions.SplitHeads[%s]: %w", rk.rank, k, err)
		}
		return m, nil
	}
	if slices.Contains(chains, 0) {
		return nil, nil
	}
	key := fmt.Sprint(k, hv, o.Profile, chains)
	if v, ok := g.mixed.Load(key); ok {
		return v.(*sched.Mixed), nil
	}
	m, err := o.Profile.BestSplit(k, chains, hv)
	if err != nil {
		return nil, fmt.Errorf("rank %d: %s walk: %w", rk.rank, k, err)
	}
	if !m.Better() {
		m = nil
	}
	g.mixed.Store(key, m)
	return m, nil
}

// splitLaunch is one of a split walk's two launches: its entry and dynamic
// shared memory.
type splitLaunch struct {
	entry string
	smem  int
}

// launchSplit launches walk m split as it says on rk (the vh = 128 launch
// first, so that its CTAs, the longest, are handed SMs first:
// sched.Mixed's model): on the rank's stream, with the vh = 64 launch on a
// side stream that waits for everything before it on the rank's stream; or,
// with GPUOptions.SplitPriority, on a side stream of the greatest priority,
// the vh = 64 launch on a second side stream, both waiting for the same
// event. The rank's stream then waits for the side streams, so what follows
// sees both halves. mem holds the order table; argsFor gives a width's
// arguments with a dispatch order; record, where not nil, sees each launch.
func (g *GPU) launchSplit(rk *gpuRank, mem *devMem, m *sched.Mixed, name string, l128, l64 splitLaunch,
	argsFor func(vh int, order uintptr) (*loader.Args, error), record func(recordedLaunch)) error {
	prio := g.gopts.SplitPriority
	if err := rk.split.make(rk.mem, prio); err != nil {
		return fmt.Errorf("rank %d: split %s: %w", rk.rank, name, err)
	}
	// One table, Order128 then Order64 (T (2 S HV - W) entries), reserved at
	// orderCapacity as every walk's table is: a split takes the device
	// memory either width takes.
	orders, err := uploadCap(mem, rk.stream, name+" orders (split)", slices.Concat(m.Order128, m.Order64), 4,
		orderCapacity(m.Tiles, m.Segments, m.HV))
	if err != nil {
		return fmt.Errorf("rank %d: %w", rk.rank, err)
	}
	a128, err := argsFor(128, orders.Ptr())
	if err != nil {
		return err
	}
	a64, err := argsFor(64, orders.Ptr()+uintptr(4*len(m.Order128)))
	if err != nil {
		return err
	}
	s128, s64 := rk.stream, rk.split.side[0]
	if prio {
		s128 = rk.split.side[1]
	}
	if err := rk.split.ev[0].Record(rk.stream); err != nil {
		return fmt.Errorf("rank %d: split %s: record the side streams' start: %w", rk.rank, name, err)
	}
	for _, s := range []*loader.Stream{s128, s64} {
		if s == rk.stream {
			continue
		}
		if err := s.WaitEvent(rk.split.ev[0]); err != nil {
			return fmt.Errorf("rank %d: split %s: side stream wait: %w", rk.rank, name, err)
		}
	}
	grid := func(g [3]int) [3]uint32 { return [3]uint32{uint32(g[0]), uint32(g[1]), uint32(g[2])} }
	for i, l := range []struct {
		s    *loader.Stream
		l    splitLaunch
		grid [3]uint32
		args *loader.Args
	}{{s128, l128, grid(m.Grid128()), a128}, {s64, l64, grid(m.Grid64()), a64}} {
		if record != nil {
			record(recordedLaunch{l.l.entry, l.grid, l.l.smem, l.args})
		}
		if err := launchOn(rk.dev, l.s, rk.rank, l.l.entry, l.grid, l.l.smem, l.args); err != nil {
			return err
		}
		if l.s == rk.stream {
			continue
		}
		if err := rk.split.ev[1+i].Record(l.s); err != nil {
			return fmt.Errorf("rank %d: split %s: record a side stream's end: %w", rk.rank, name, err)
		}
		if err := rk.stream.WaitEvent(rk.split.ev[1+i]); err != nil {
			return fmt.Errorf("rank %d: split %s: wait for a side stream: %w", rk.rank, name, err)
		}
	}
	return nil
}

// infallible adapts an argument builder that cannot fail to launchSplit's
// argsFor.
func infallible(f func(vh int, order uintptr) *loader.Args) func(int, uintptr) (*loader.Args, error) {
	return func(vh int, order uintptr) (*loader.Args, error) { return f(vh, order), nil }
}

// checkSplitHeads checks GPUOptions.SplitHeads against a plan of hv value
// heads: 0 < k < hv heads of every chain at vh = 128, and not with ForceVH.
func (o GPUOptions) checkSplitHeads(hv int) error {
	for k, n := range o.SplitHeads {
		kind := sched.WalkKind(k)
		switch {
		case n == 0:
		case n < 0 || n >= hv:
			return fmt.Errorf("kcp: gpu: SplitHeads[%s] = %d: want 1..%d heads of every chain at vh = 128 (HV %d), or 0", kind, n, hv-1, hv)
		case o.ForceVH != 0:
			return fmt.Errorf("kcp: gpu: SplitHeads[%s] = %d with ForceVH %d: a walk runs split or at one width", kind, n, o.ForceVH)
		}
	}
	return nil
}
