package kcp

import (
	"fmt"
	"slices"

	"github.com/gdnkcp/gdnkcp/loader"
	"github.com/gdnkcp/gdnkcp/sched"
)

// mixedTape is the split of this rank's tape walk between the widths
// (GPUOptions.MixedTape, sched.MixedWalk), or nil where it runs at one
// width: the option unset; ForceVH or LaunchOrder set; a kernel set without
// the plane tape walk's two entries; a profile without a cost rule; a rank
// with an empty segment; or a split the model does not put
// sched.MixedMarginPercent below the better single width. Splits are
// remembered by the backend (its plan and profile are fixed), so a walk's is
// computed once.
func (b *bwdRun) mixedTape() (*sched.Mixed, error) {
	g, o, ks := b.f.be, b.f.opts, b.rk.dev.ks
	if !g.gopts.MixedTape || g.gopts.LaunchOrder || o.ForceVH != 0 || !ks.bwalkPlanes || ks.tape128 == "" {
		return nil, nil
	}
	chains := make([]int, len(b.rk.tb.SegNChunk))
	for i, c := range b.rk.tb.SegNChunk {
		if c < 1 {
			return nil, nil
		}
		chains[i] = int(c)
	}
	hv, slots := b.f.plan.Config.HV, walkSlots(o.Profile)
	cost, measured := sched.ChunkCost{Narrow: 3, Wide: 5}, false
	if rules, err := sched.RulesFor(o.Profile.Variant); err == nil && rules.Cost != nil {
		cost, measured = rules.Cost.ForRun(sched.Tape, o.Profile.LeanForward), true
	}
	if mixedTapeForce != nil {
		m, err := sched.SplitWalk(chains, mixedTapeForce(chains, hv), hv, slots, cost)
		if err != nil {
			return nil, nil // a forced split the walk cannot take: one width
		}
		return m, nil
	}
	if !measured {
		return nil, nil
	}
	key := fmt.Sprint(hv, cost, slots, chains)
	if v, ok := g.mixed.Load(key); ok {
		return v.(*sched.Mixed), nil
	}
	m, err := sched.MixedWalk(chains, hv, slots, cost)
	if err != nil {
		return nil, fmt.Errorf("rank %d: tape walk: %w", b.rk.rank, err)
	}
	if !m.Better() {
		m = nil
	}
	g.mixed.Store(key, m)
	return m, nil
}

// tapeMixed launches the tape walk split as m says, the vh = 128 launch
// first so that its CTAs, the longest, are handed SMs first (sched.Mixed's
// model): on the rank's stream, with the vh = 64 launch on a side stream that
// waits for everything before it on the rank's stream; or, with
// GPUOptions.MixedTapePriority, on a side stream of the greatest priority,
// with the vh = 64 launch on a second side stream, both waiting for the
// same event. The rank's stream then waits for the side streams, so what
// follows sees both halves. argsFor gives a width's arguments with a
// dispatch order.
func (b *bwdRun) tapeMixed(m *sched.Mixed, argsFor func(vh int, order uintptr) (*loader.Args, error)) (err error) {
	rk, ks := b.rk, b.rk.dev.ks
	prio := b.f.be.gopts.MixedTapePriority
	if err := b.sideStreams(prio); err != nil {
		return fmt.Errorf("rank %d: mixed tape walk: %w", rk.rank, err)
	}
	// One table, Order128 then Order64: 4 (2 S HV - W) bytes, less than the
	// vh 64 launch's dispatch order would take.
	orders, err := upload(b.mem, rk.stream, "tape walk orders (mixed)", slices.Concat(m.Order128, m.Order64), 4)
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
	s128, s64 := rk.stream, b.side[0]
	if prio {
		s128, s64 = b.side[1], b.side[0]
	}
	if err := b.sideEv[0].Record(rk.stream); err != nil {
		return fmt.Errorf("rank %d: mixed tape walk: record the side streams' start: %w", rk.rank, err)
	}
	for _, s := range []*loader.Stream{s128, s64} {
		if s == rk.stream {
			continue
		}
		if err := s.WaitEvent(b.sideEv[0]); err != nil {
			return fmt.Errorf("rank %d: mixed tape walk: side stream wait: %w", rk.rank, err)
		}
	}
	grid := func(g [3]int) [3]uint32 { return [3]uint32{uint32(g[0]), uint32(g[1]), uint32(g[2])} }
	for i, l := range []struct {
		s    *loader.Stream
		vh   int
		grid [3]int
		args *loader.Args
	}{{s128, 128, m.Grid128(), a128}, {s64, 64, m.Grid64(), a64}} {
		entry, smem := ks.tapeEntry(l.vh), ks.tapeSmem(l.vh)
		if bwdProbeHook != nil {
			b.launches = append(b.launches, recordedLaunch{entry, grid(l.grid), smem, l.args})
		}
		if err := launchOn(rk.dev, l.s, rk.rank, entry, grid(l.grid), smem, l.args); err != nil {
			return err
		}
		if l.s == rk.stream {
			continue
		}
		if err := b.sideEv[1+i].Record(l.s); err != nil {
			return fmt.Errorf("rank %d: mixed tape walk: record a side stream's end: %w", rk.rank, err)
		}
		if err := rk.stream.WaitEvent(b.sideEv[1+i]); err != nil {
			return fmt.Errorf("rank %d: mixed tape walk: wait for a side stream: %w", rk.rank, err)
		}
	}
	b.res.Mixed[rk.rank] = len(m.Order128)
	return nil
}

// sideStreams makes, once a run, tapeMixed's side stream of the default
// priority (side[0]) and, where prio asks for it, one of the context's
// greatest priority (side[1]), and their three events.
func (b *bwdRun) sideStreams(prio bool) (err error) {
	if b.side[0] == nil {
		if b.side[0], err = b.mem.stream(); err != nil {
			return err
		}
		for i := range b.sideEv {
			if b.sideEv[i], err = b.mem.event(); err != nil {
				return err
			}
		}
	}
	if prio && b.side[1] == nil {
		_, greatest, err := b.mem.ctx.StreamPriorities()
		if err != nil {
			return fmt.Errorf("stream priorities: %w", err)
		}
		if b.side[1], err = b.mem.priorityStream(greatest); err != nil {
			return err
		}
	}
	return nil
}

// mixedTapeForce, when set (tests only), replaces sched.MixedWalk's choice:
// the tape walk splits as sched.SplitWalk splits it with the counts it
// returns for the walk's chains and value heads, whatever the model says,
// and runs at one width where SplitWalk refuses them.
var mixedTapeForce func(chains []int, hv int) []int
