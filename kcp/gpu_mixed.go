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

// tapeMixed launches the tape walk split as m says: the vh = 128 CTAs on the
// rank's stream, then the vh = 64 CTAs on a side stream that waits for
// everything before them on the rank's stream; the rank's stream then waits
// for the side stream, so what follows sees both. argsFor gives a width's
// arguments with a dispatch order. The vh = 128 launch is issued first so
// that its CTAs, the longest, are handed SMs first (sched.Mixed's model).
func (b *bwdRun) tapeMixed(m *sched.Mixed, argsFor func(vh int, order uintptr) (*loader.Args, error)) (err error) {
	rk, ks := b.rk, b.rk.dev.ks
	if b.side == nil {
		if b.side, err = b.mem.stream(); err != nil {
			return fmt.Errorf("rank %d: mixed tape walk: %w", rk.rank, err)
		}
		for i := range b.sideEv {
			if b.sideEv[i], err = b.mem.event(); err != nil {
				return fmt.Errorf("rank %d: mixed tape walk: %w", rk.rank, err)
			}
		}
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
	if err := b.sideEv[0].Record(rk.stream); err != nil {
		return fmt.Errorf("rank %d: mixed tape walk: record the side stream's start: %w", rk.rank, err)
	}
	if err := b.side.WaitEvent(b.sideEv[0]); err != nil {
		return fmt.Errorf("rank %d: mixed tape walk: side stream wait: %w", rk.rank, err)
	}
	grid := func(g [3]int) [3]uint32 { return [3]uint32{uint32(g[0]), uint32(g[1]), uint32(g[2])} }
	if err := b.launch(ks.tapeEntry(128), grid(m.Grid128()), ks.tapeSmem(128), a128); err != nil {
		return err
	}
	if bwdProbeHook != nil {
		b.launches = append(b.launches, recordedLaunch{ks.tapeEntry(64), grid(m.Grid64()), ks.tapeSmem(64), a64})
	}
	if err := launchOn(rk.dev, b.side, rk.rank, ks.tapeEntry(64), grid(m.Grid64()), ks.tapeSmem(64), a64); err != nil {
		return err
	}
	if err := b.sideEv[1].Record(b.side); err != nil {
		return fmt.Errorf("rank %d: mixed tape walk: record the side stream's end: %w", rk.rank, err)
	}
	if err := rk.stream.WaitEvent(b.sideEv[1]); err != nil {
		return fmt.Errorf("rank %d: mixed tape walk: wait for the side stream: %w", rk.rank, err)
	}
	b.res.Mixed[rk.rank] = len(m.Order128)
	return nil
}

// mixedTapeForce, when set (tests only), replaces sched.MixedWalk's choice:
// the tape walk splits as sched.SplitWalk splits it with the counts it
// returns for the walk's chains and value heads, whatever the model says,
// and runs at one width where SplitWalk refuses them.
var mixedTapeForce func(chains []int, hv int) []int
