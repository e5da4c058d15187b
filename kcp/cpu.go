package kcp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"

	"gonum.org/v1/gonum/mat"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/internal/gdnref"
	"github.com/gdnkcp/gdnkcp/sched"
)

// CPU is the float64 reference backend: it runs a plan rank by rank exactly
// as the GPU does (DESIGN.md §3): chunk prep, summary walk, an all-gather of
// the summaries through an in-process communicator, compose in fixed order,
// state walk, output; and backward through the offset walk, reverse compose,
// tape walk and chunk-parallel gradients. Every walk runs at the width the
// plan's memoized decision gives (or Options.ForceVH), split into column tiles
// the way the GPU's CTAs split it; both widths give bitwise-identical results.
//
// A CPU is safe for concurrent use; each call allocates its own state.
type CPU struct {
	plan *Plan
	opts Options
}

// NewCPU returns the CPU backend for plan with opts.
func NewCPU(plan *Plan, opts Options) (*CPU, error) {
	if plan == nil {
		return nil, fmt.Errorf("kcp: cpu: plan is nil")
	}
	o, err := opts.normalize()
	if err != nil {
		return nil, err
	}
	return &CPU{plan: plan, opts: o}, nil
}

// Plan returns the backend's plan.
func (c *CPU) Plan() *Plan {
	if c == nil {
		return nil
	}
	return c.plan
}

// Options returns the backend's options with defaults filled in.
func (c *CPU) Options() Options {
	if c == nil {
		return Options{}
	}
	return c.opts
}

// Activations is what a forward keeps for the backward (upstream's B1), or
// what Recompute rebuilds from a Checkpoint. It references the Inputs it was
// made from.
type Activations struct {
	// Out is the layer output.
	Out *Output
	// Decisions are the width decisions of every walk of every rank,
	// [rank][walk kind], as read from the plan's memo.
	Decisions [][sched.NumWalkKinds]sched.Decision

	be    *CPU
	in    *Inputs
	ranks []*cpuRank
}

// Checkpoint is the handle of a forward in checkpoint mode (upstream's B3):
// the plan and its width decisions, each segment's true start state per value
// head (the boundary states the exchange produced), the conv halo inputs, and
// references to the inputs. Recompute rebuilds the activations from it with no
// communication.
type Checkpoint struct {
	Out       *Output
	Decisions [][sched.NumWalkKinds]sched.Decision
	// FinalStateGrad is the terminal adjoint input of every document's last
	// segment; nil means zero (no final-state output is trained).
	FinalStateGrad []*mat.Dense

	be     *CPU
	in     *Inputs
	starts [][][]*mat.Dense // [rank][segment][value head]
	halos  [][]*mat.Dense   // [rank][segment] conv halo (module stage), nil at document starts
}

// cpuRank is one rank's forward state.
type cpuRank struct {
	rp   *RankPlan
	segs []*cpuSeg
}

// cpuSeg is one segment's forward state.
type cpuSeg struct {
	seg   *Segment
	x     *mat.Dense // module, naive reference only: pre-conv tokens, Len x C (the backend rebuilds them)
	halo  *mat.Dense // module: 3 x C halo, nil when the segment starts its document
	y     *mat.Dense // module: post-conv tokens, Len x C, from the conv until the chunk prep
	heads []*cpuHead
}

// cpuHead is one value head of one segment.
type cpuHead struct {
	prep   *gdnref.Segment
	start  *mat.Dense // true start state, K x V
	states *gdnref.States
}

// Forward runs the forward over every rank and keeps what the backward needs.
func (c *CPU) Forward(ctx context.Context, in *Inputs) (*Activations, error) {
	if c == nil || c.plan == nil {
		return nil, errors.New("kcp: cpu: nil backend")
	}
	if err := in.Validate(c.plan, c.opts.Stage, false); err != nil {
		return nil, err
	}
	act, _, err := c.forward(ctx, in, true)
	return act, err
}

// ForwardCheckpoint runs the forward in checkpoint mode: it returns the output
// and the handle, and keeps nothing else.
func (c *CPU) ForwardCheckpoint(ctx context.Context, in *Inputs) (*Checkpoint, error) {
	if c == nil || c.plan == nil {
		return nil, errors.New("kcp: cpu: nil backend")
	}
	if err := in.Validate(c.plan, c.opts.Stage, false); err != nil {
		return nil, err
	}
	_, ck, err := c.forward(ctx, in, false)
	return ck, err
}

func (c *CPU) decisions() ([][sched.NumWalkKinds]sched.Decision, error) {
	return c.plan.Decisions(c.opts.Profile, c.opts.Rule)
}

// tile returns the column-tile width a walk of kind k on rank runs with over
// cols columns: all of them at vh = 128 (one CTA per segment and head), half
// at vh = 64 (two CTAs).
func (c *CPU) tile(rank int, k sched.WalkKind, cols int) (int, error) {
	vh := c.opts.ForceVH
	if vh == 0 {
		d, err := c.plan.Width(rank, k, c.opts.Profile, c.opts.Rule)
		if err != nil {
			return 0, err
		}
		vh = d.VH
	}
	if vh == 64 {
		return (cols + 1) / 2, nil
	}
	return cols, nil
}

func (c *CPU) forward(ctx context.Context, in *Inputs, keep bool) (*Activations, *Checkpoint, error) {
	dec, err := c.decisions()
	if err != nil {
		return nil, nil, err
	}
	p := c.plan
	R := len(p.Ranks)
	out := &Output{O: make([]float64, p.OutputShape().Size())}
	ranks := make([]*cpuRank, R)
	comms, err := comm.NewLoopback(R)
	if err != nil {
		return nil, nil, err
	}
	err = comm.RunRanks(ctx, comms, func(ctx context.Context, cm comm.Communicator) error {
		r := cm.Rank()
		cr, err := c.forwardRank(ctx, cm, in, out)
		if err != nil {
			return err
		}
		ranks[r] = cr
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("kcp: cpu forward: %w", err)
	}
	if keep {
		return &Activations{Out: out, Decisions: dec, be: c, in: in, ranks: ranks}, nil, nil
	}
	ck := &Checkpoint{Out: out, Decisions: dec, be: c, in: in,
		starts: make([][][]*mat.Dense, R), halos: make([][]*mat.Dense, R)}
	for r, cr := range ranks {
		ck.starts[r] = make([][]*mat.Dense, len(cr.segs))
		ck.halos[r] = make([]*mat.Dense, len(cr.segs))
		for s, cs := range cr.segs {
			ck.halos[r][s] = cs.halo
			ck.starts[r][s] = make([]*mat.Dense, len(cs.heads))
			for h, hd := range cs.heads {
				ck.starts[r][s][h] = hd.start
			}
		}
	}
	return nil, ck, nil
}

// Recompute rebuilds the activations from a checkpoint with no communication:
// conv from the saved halos, chunk prep, state walks from the saved start
// states, and the output. It reproduces the forward's intermediates bit for
// bit.
func (ck *Checkpoint) Recompute(ctx context.Context) (*Activations, error) {
	if ck == nil || ck.be == nil {
		return nil, fmt.Errorf("kcp: recompute: the checkpoint is empty")
	}
	c := ck.be
	p := c.plan
	out := &Output{O: make([]float64, p.OutputShape().Size())}
	ranks := make([]*cpuRank, len(p.Ranks))
	err := parallel(len(p.Ranks), func(r int) error {
		cr := c.newRank(r, ck.in)
		for s, cs := range cr.segs {
			cs.halo = ck.halos[r][s]
		}
		if err := c.convForward(cr, ck.in); err != nil {
			return err
		}
		c.opts.progress(r, "conv")
		if err := c.prep(cr, ck.in); err != nil {
			return err
		}
		c.opts.progress(r, "prep")
		for s, cs := range cr.segs {
			for h, hd := range cs.heads {
				hd.start = ck.starts[r][s][h]
			}
		}
		if err := c.stateWalk(cr, out); err != nil {
			return err
		}
		c.opts.progress(r, "state walk")
		c.opts.progress(r, "output")
		ranks[r] = cr
		return ctx.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("kcp: recompute: %w", err)
	}
	return &Activations{Out: out, Decisions: ck.Decisions, be: c, in: ck.in, ranks: ranks}, nil
}

// newRank lays out rank r's segments.
func (c *CPU) newRank(r int, in *Inputs) *cpuRank {
	rp := &c.plan.Ranks[r]
	cr := &cpuRank{rp: rp, segs: make([]*cpuSeg, len(rp.Segments))}
	for s := range rp.Segments {
		cr.segs[s] = &cpuSeg{seg: &rp.Segments[s], heads: make([]*cpuHead, c.plan.Config.HV)}
	}
	return cr
}

// forwardRank runs one rank's forward; it writes the rank's tokens of out.
func (c *CPU) forwardRank(ctx context.Context, cm comm.Communicator, in *Inputs, out *Output) (*cpuRank, error) {
	r := cm.Rank()
	cr := c.newRank(r, in)
	if c.opts.Stage == StageModule {
		if err := c.exchangeHalo(ctx, cm, cr, in); err != nil {
			return nil, err
		}
	}
	if err := c.convForward(cr, in); err != nil {
		return nil, err
	}
	c.opts.progress(r, "conv")
	if err := c.prep(cr, in); err != nil {
		return nil, err
	}
	c.opts.progress(r, "prep")
	sums, err := c.summaryWalk(cr)
	if err != nil {
		return nil, err
	}
	c.opts.progress(r, "summary walk")
	all, err := c.exchangeSummaries(ctx, cm, sums)
	if err != nil {
		return nil, err
	}
	c.opts.progress(r, "exchange summaries")
	if err := c.compose(cr, all); err != nil {
		return nil, err
	}
	c.opts.progress(r, "compose")
	if err := c.stateWalk(cr, out); err != nil {
		return nil, err
	}
	c.opts.progress(r, "state walk")
	c.opts.progress(r, "output")
	return cr, nil
}

// parallel runs fn(0..n-1) on up to GOMAXPROCS goroutines and returns the
// first error by index. Each fn writes only its own results, so the outcome
// does not depend on scheduling.
func parallel(n int, fn func(i int) error) error {
	workers := min(runtime.GOMAXPROCS(0), n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				errs[i] = fn(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// SegmentStates returns, for value head head of segment seg of rank rank,
// the segment's true start state (from the compose) and its final state
// (the state walk's state at the segment's end), as row-major K x V copies
// (DK*DV values): what GPUForward.SegmentStates returns on the GPU backend.
func (a *Activations) SegmentStates(rank, seg, head int) (start, final []float64, err error) {
	if a == nil || a.be == nil {
		return nil, nil, fmt.Errorf("kcp: states: empty activations")
	}
	if err := checkStateIndex(a.be.plan, rank, seg, head); err != nil {
		return nil, nil, err
	}
	hd := a.ranks[rank].segs[seg].heads[head]
	if hd == nil || hd.start == nil || hd.states == nil || hd.states.Final == nil {
		return nil, nil, fmt.Errorf("kcp: states: rank %d segment %d head %d has no states", rank, seg, head)
	}
	return denseData(hd.start), denseData(hd.states.Final), nil
}

// denseData copies m's elements in row-major order.
func denseData(m *mat.Dense) []float64 {
	r, c := m.Dims()
	out := make([]float64, 0, r*c)
	for i := 0; i < r; i++ {
		out = append(out, m.RawRowView(i)...)
	}
	return out
}
