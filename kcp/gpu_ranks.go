package kcp

// Where the ranks of a plan run and how they exchange: the devices of a GPU
// backend (GPUOptions.Devices), the communicator kinds (GPUOptions.Comm,
// GPUOptions.Communicator), the NCCL groups a backend makes over its devices,
// and the one rank runner every entry point (Forward, ForwardCheckpoint,
// Recompute, Backward) goes through.

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gdnkcp/gdnkcp/archdetect"
	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/loader"
)

// CommKind says how the in-process ranks of a GPU backend exchange their
// summaries, offsets and conv halos (GPUOptions.Comm).
type CommKind string

// The communicator kinds.
const (
	// CommAuto (also the empty string, the default) takes NCCL when the plan
	// has more than one rank and they run on as many distinct devices as
	// there are ranks, else the loopback.
	CommAuto CommKind = "auto"
	// CommLoopback exchanges through host memory in this process, between
	// ranks on one device or on several (several ranks per GPU).
	CommLoopback CommKind = "loopback"
	// CommNCCL exchanges through an NCCL communicator over the ranks'
	// devices (comm.NewLocalNCCL); NCCL takes one GPU per rank, so two ranks
	// on one device are an error.
	CommNCCL CommKind = "nccl"
	// CommGiven is what GPU.Comm reports when GPUOptions.Communicator is set:
	// the backend runs one rank and exchanges through the caller's
	// communicator. It is not a valid GPUOptions.Comm.
	CommGiven CommKind = "communicator"
)

// ParseCommKind parses a GPUOptions.Comm value: "auto" (or ""), "loopback"
// or "nccl".
func ParseCommKind(s string) (CommKind, error) {
	switch CommKind(s) {
	case "", CommAuto:
		return CommAuto, nil
	case CommLoopback, CommNCCL:
		return CommKind(s), nil
	}
	return "", fmt.Errorf("kcp: gpu: unknown communicator kind %q (want auto, loopback or nccl)", s)
}

// ErrReopen is wrapped by the error of every run of a backend whose NCCL
// group was aborted by a failed run (and by GPU.Err): the group was closed
// and its device memory released; close the backend and make a new one
// with NewGPU.
var ErrReopen = errors.New("kcp: gpu: the backend's NCCL group was aborted; close the backend and open a new one")

// deviceList returns the CUDA devices of the options: Devices, or Device
// alone when Devices is empty. It refuses negative ordinals, a device listed
// twice, and a Device that disagrees with Devices.
func (o GPUOptions) deviceList() ([]int, error) {
	if len(o.Devices) == 0 {
		if o.Device < 0 {
			return nil, fmt.Errorf("kcp: gpu: device %d: a CUDA device ordinal is at least 0", o.Device)
		}
		return []int{o.Device}, nil
	}
	if o.Device != 0 && o.Device != o.Devices[0] {
		return nil, fmt.Errorf("kcp: gpu: GPUOptions.Device %d and Devices %v disagree: set Devices alone (or Device to Devices[0])",
			o.Device, o.Devices)
	}
	seen := map[int]int{}
	for i, d := range o.Devices {
		if d < 0 {
			return nil, fmt.Errorf("kcp: gpu: GPUOptions.Devices[%d] is %d: a CUDA device ordinal is at least 0", i, d)
		}
		if j, ok := seen[d]; ok {
			return nil, fmt.Errorf("kcp: gpu: device %d is listed twice in GPUOptions.Devices %v (entries %d and %d); list each device once (several ranks per device come from a plan with more ranks than devices)",
				d, o.Devices, j, i)
		}
		seen[d] = i
	}
	return slices.Clone(o.Devices), nil
}

// checkOrdinals refuses devices the driver does not show: count is
// loader.DeviceCount (CUDA_VISIBLE_DEVICES applied).
func checkOrdinals(devs []int, count int) error {
	shows := fmt.Sprintf("%d devices (ordinals 0-%d)", count, count-1)
	switch count {
	case 0:
		shows = "0 devices"
	case 1:
		shows = "1 device (ordinals 0-0)"
	}
	for _, d := range devs {
		if d >= count {
			return fmt.Errorf("kcp: gpu: device %d is out of range: the driver shows %s (CUDA_VISIBLE_DEVICES applied)", d, shows)
		}
	}
	return nil
}

// rankLayout is where the ranks of one backend's plan run and how they
// exchange.
type rankLayout struct {
	// devices is the CUDA device of every rank of the plan, -1 for a rank
	// that runs in another process (GPUOptions.Communicator).
	devices []int
	// local are the ranks this backend runs, ascending.
	local []int
	// kind is CommLoopback, CommNCCL or CommGiven.
	kind CommKind
}

// rankDevice is the device rank r of R runs on when the ranks share devs in
// contiguous blocks: devs[r*len(devs)/R].
func rankDevice(devs []int, r, R int) int { return devs[r*len(devs)/R] }

// resolveRanks places the R ranks of a plan on devs (the options' device
// list) and picks the communicator kind, checking the options against each
// other and against the plan.
func resolveRanks(R int, o GPUOptions, devs []int) (rankLayout, error) {
	if R < 1 {
		return rankLayout{}, fmt.Errorf("kcp: gpu: a plan of %d ranks", R)
	}
	if len(devs) == 0 {
		return rankLayout{}, errors.New("kcp: gpu: no devices")
	}
	if o.Timeout < 0 {
		return rankLayout{}, fmt.Errorf("kcp: gpu: negative GPUOptions.Timeout %v", o.Timeout)
	}
	kind, err := ParseCommKind(string(o.Comm))
	if err != nil {
		return rankLayout{}, err
	}
	if c := o.Communicator; c != nil {
		if kind != CommAuto {
			return rankLayout{}, fmt.Errorf("kcp: gpu: GPUOptions.Comm %q with a Communicator: the Communicator is the exchange; leave Comm empty", o.Comm)
		}
		if len(devs) != 1 {
			return rankLayout{}, fmt.Errorf("kcp: gpu: with a Communicator the backend runs one rank, on GPUOptions.Device; Devices lists %d devices %v",
				len(devs), devs)
		}
		size, rank := c.Size(), c.Rank()
		if size != R {
			return rankLayout{}, fmt.Errorf("kcp: gpu: the Communicator has %d ranks, the plan %d: they must be equal (one process per rank of the plan)", size, R)
		}
		if rank < 0 || rank >= R {
			return rankLayout{}, fmt.Errorf("kcp: gpu: the Communicator's rank %d is outside the plan's %d ranks", rank, R)
		}
		l := rankLayout{devices: make([]int, R), local: []int{rank}, kind: CommGiven}
		for r := range l.devices {
			l.devices[r] = -1
		}
		l.devices[rank] = devs[0]
		return l, nil
	}
	l := rankLayout{devices: make([]int, R), local: make([]int, R)}
	first := map[int]int{} // device -> its first rank
	shared := [3]int{-1}   // two ranks on one device, and the device
	for r := range R {
		d := rankDevice(devs, r, R)
		l.devices[r], l.local[r] = d, r
		if p, ok := first[d]; ok {
			if shared[0] < 0 {
				shared = [3]int{p, r, d}
			}
		} else {
			first[d] = r
		}
	}
	switch kind {
	case CommAuto:
		l.kind = CommLoopback
		if R > 1 && shared[0] < 0 {
			l.kind = CommNCCL
		}
	case CommNCCL:
		if shared[0] >= 0 {
			return rankLayout{}, fmt.Errorf("kcp: gpu: GPUOptions.Comm nccl: ranks %d and %d of %d both run on device %d (devices %v): NCCL takes one GPU per rank; list %d devices, or use the loopback (several ranks per GPU)",
				shared[0], shared[1], R, shared[2], devs, R)
		}
		l.kind = CommNCCL
	default:
		l.kind = kind
	}
	return l, nil
}

// gpuFleet is what the GPU values made from one NewGPU share through
// ForPlan: the loaded blob of every device they run on and the NCCL groups
// made over those devices. GPU values and the results that hold device
// memory (GPUForward) each hold a reference; the last release closes the
// NCCL groups, then unloads the blobs and releases the contexts.
type gpuFleet struct {
	mu     sync.Mutex
	refs   int
	order  []int                 // the device ordinals, in GPUOptions.Devices order
	devs   map[int]*gpuDevice    // by ordinal; each holds one reference of the fleet's
	groups map[string]*ncclGroup // by the ranks' device list, e.g. "[0 1]"

	kernels, kernelsWhy string // the kernel set every device runs (GPU.Kernels)
}

// newFleet takes over one reference of each device.
func newFleet(devs []*gpuDevice) *gpuFleet {
	f := &gpuFleet{refs: 1, devs: map[int]*gpuDevice{}, groups: map[string]*ncclGroup{}}
	for _, d := range devs {
		f.order = append(f.order, d.profile.Ordinal)
		f.devs[d.profile.Ordinal] = d
	}
	return f
}

// retain adds a reference; it fails once the fleet was released.
func (f *gpuFleet) retain() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs == 0 {
		return errors.New("kcp: gpu: the backend is closed")
	}
	f.refs++
	return nil
}

// release drops a reference; the last closes the NCCL groups and releases
// the devices in reverse order.
func (f *gpuFleet) release() error {
	f.mu.Lock()
	if f.refs == 0 {
		f.mu.Unlock()
		return nil
	}
	if f.refs--; f.refs > 0 {
		f.mu.Unlock()
		return nil
	}
	groups := f.groups
	f.groups = nil
	f.mu.Unlock()
	var errs []error
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		errs = append(errs, groups[k].close())
	}
	for i := len(f.order) - 1; i >= 0; i-- {
		if d := f.devs[f.order[i]]; d != nil {
			errs = append(errs, d.release())
		}
	}
	return errors.Join(errs...)
}

// device returns the loaded device of ordinal d, or nil.
func (f *gpuFleet) device(d int) *gpuDevice {
	if f == nil {
		return nil
	}
	return f.devs[d]
}

// ncclGroup is one NCCL communicator over a list of devices, rank r on the
// r-th, made on first use and kept for every run on those devices. Runs on
// one group are serialized (the collectives of two runs must not
// interleave). A failed run aborts it: it is closed then, and every later
// run reports ErrReopen.
type ncclGroup struct {
	key   string
	run   sync.Mutex          // held through a run
	comms []comm.Communicator // nil until first use, and once closed; guarded by run

	mu     sync.Mutex
	broken error // why the group can no longer run (wraps ErrReopen), or nil
}

// err returns why the group can no longer run, or nil.
func (grp *ncclGroup) err() error {
	grp.mu.Lock()
	defer grp.mu.Unlock()
	return grp.broken
}

// breakWith records why the group can no longer run, unless it already is
// broken.
func (grp *ncclGroup) breakWith(err error) {
	grp.mu.Lock()
	defer grp.mu.Unlock()
	if grp.broken == nil {
		grp.broken = err
	}
}

// openNCCLGroup makes the communicators of an NCCL group over ctxs (a
// variable so that tests can stand in for NCCL).
var openNCCLGroup = func(ctxs []*loader.Context) ([]comm.Communicator, error) {
	ncs, err := comm.NewLocalNCCL(ctxs)
	if err != nil {
		return nil, err
	}
	cs := make([]comm.Communicator, len(ncs))
	for i, c := range ncs {
		cs[i] = c
	}
	return cs, nil
}

// groupKey names the group of a device list.
func groupKey(devices []int) string { return fmt.Sprint(devices) }

// group returns the fleet's NCCL group over devices (rank r on devices[r]),
// made on first use, with its run lock held: the caller ends the run with
// ncclGroup.done. A group broken by an earlier run returns its ErrReopen
// error.
func (f *gpuFleet) group(devices []int, timeout time.Duration) (*ncclGroup, error) {
	key := groupKey(devices)
	f.mu.Lock()
	if f.refs == 0 || f.groups == nil {
		f.mu.Unlock()
		return nil, errors.New("kcp: gpu: the backend is closed")
	}
	grp := f.groups[key]
	if grp == nil {
		grp = &ncclGroup{key: key}
		f.groups[key] = grp
	}
	f.mu.Unlock()
	grp.run.Lock()
	if err := grp.err(); err != nil {
		grp.run.Unlock()
		return nil, err
	}
	if grp.comms == nil {
		ctxs := make([]*loader.Context, len(devices))
		for r, d := range devices {
			dev := f.device(d)
			if dev == nil {
				grp.run.Unlock()
				return nil, fmt.Errorf("kcp: gpu: NCCL group over devices %v: device %d is not loaded", devices, d)
			}
			ctxs[r] = dev.ctx
		}
		cs, err := openNCCLGroup(ctxs)
		if err != nil {
			grp.run.Unlock()
			return nil, fmt.Errorf("kcp: gpu: NCCL group over devices %v: %w", devices, err)
		}
		grp.comms = cs
	}
	for _, c := range grp.comms {
		if nc, ok := c.(*comm.NCCLComm); ok {
			nc.Timeout = timeout // 0: comm.DefaultNCCLTimeout; a context deadline wins
		}
	}
	return grp, nil
}

// done ends a run on the group and releases its run lock. After a failed
// run (the runner aborted the group) it aborts every rank that is not yet,
// closes the communicators (NCCL's device memory, streams and staging
// buffers) and marks the group broken with ErrReopen.
func (grp *ncclGroup) done(runErr error) error {
	defer grp.run.Unlock()
	if runErr == nil {
		return nil
	}
	cause := runErr
	var re *RunError
	if errors.As(runErr, &re) {
		cause = errors.New(re.headline())
	}
	var errs []error
	for _, c := range grp.comms {
		c.Abort(cause)
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close NCCL rank %d: %w", c.Rank(), err))
		}
	}
	grp.comms = nil
	grp.breakWith(fmt.Errorf("%w (the group over devices %s was aborted: %v)", ErrReopen, grp.key, cause))
	return errors.Join(errs...)
}

// close closes a healthy group's communicators for good (the fleet's last
// release).
func (grp *ncclGroup) close() error {
	grp.run.Lock()
	defer grp.run.Unlock()
	var errs []error
	for _, c := range grp.comms {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("kcp: gpu: close NCCL rank %d of the group over devices %s: %w", c.Rank(), grp.key, err))
		}
	}
	grp.comms = nil
	grp.breakWith(errors.New("kcp: gpu: the backend is closed"))
	return errors.Join(errs...)
}

// RankError is one rank's failure in a GPU run.
type RankError struct {
	// Rank is the rank that failed.
	Rank int
	// Device is the CUDA device it ran on.
	Device int
	// Stage is the stage it was in: one of GPUForwardStages,
	// GPURecomputeStages or GPUBackwardStages.
	Stage string
	// First is the rank that failed first: Rank itself, or the rank whose
	// failure stopped this one (a rank in another process when the
	// communicator says so).
	First int
	// Err is what went wrong.
	Err error
}

// Error renders `rank 1 (device 1), stage "prep", failed first: ...` or
// `rank 0 (device 0), stage "exchange summaries", stopped after rank 1
// failed: ...`.
func (e *RankError) Error() string {
	where := fmt.Sprintf("rank %d (device %d), stage %q", e.Rank, e.Device, e.Stage)
	if e.First == e.Rank {
		return fmt.Sprintf("%s, failed first: %v", where, e.Err)
	}
	return fmt.Sprintf("%s, stopped after rank %d failed: %v", where, e.First, e.Err)
}

// Unwrap returns Err.
func (e *RankError) Unwrap() error { return e.Err }

// RunError is the error of a GPU forward, recompute or backward in which
// ranks failed: which rank failed first, and every failed rank of this
// process, in rank order. errors.Is and errors.As see through it to each
// rank's error (a comm.AbortError, comm.ErrTimeout, a stage hook's error).
type RunError struct {
	// Op is "forward", "recompute" or "backward".
	Op string
	// First is the rank that failed first.
	First int
	// FirstStage is the stage First was in, or "" when it ran in another
	// process.
	FirstStage string
	// Ranks are this process's failed ranks, in rank order.
	Ranks []*RankError
}

// headline is the first line of Error.
func (e *RunError) headline() string {
	s := fmt.Sprintf("kcp: gpu %s: rank %d failed first", e.Op, e.First)
	if e.FirstStage != "" {
		s += fmt.Sprintf(", at stage %q", e.FirstStage)
	} else {
		s += " (in another process)"
	}
	return s
}

// Error renders the headline, then one line per failed rank:
//
//	kcp: gpu forward: rank 1 failed first, at stage "prep"
//	rank 0 (device 0), stage "exchange summaries", stopped after rank 1 failed: comm: rank 0: all-gather #2: aborted by rank 1: ...
//	rank 1 (device 1), stage "prep", failed first: ...
func (e *RunError) Error() string {
	var b strings.Builder
	b.WriteString(e.headline())
	for _, r := range e.Ranks {
		b.WriteString("\n")
		b.WriteString(r.Error())
	}
	return b.String()
}

// Unwrap returns the ranks' errors.
func (e *RunError) Unwrap() []error {
	out := make([]error, len(e.Ranks))
	for i, r := range e.Ranks {
		out[i] = r
	}
	return out
}

// stageTracker follows one rank through the stages of a run and calls the
// stage hooks before each. It is used by the rank's goroutine only.
type stageTracker struct {
	rank   int
	stages []string
	idx    int // the current stage, -1 before the first
	hook   func(rank int, stage string) error
	// turn is the device's turn where the rank takes turns with the others
	// on its device (GPUOptions.SerialRanks), else nil; held says the rank
	// has it; sync waits for the rank's stream (set by its stage clock)
	// before the turn is given back. A rank holds the turn all through its
	// run (callRank) but while it waits in a collective (turnComm).
	turn chan struct{}
	held bool
	sync func() error
}

// takeTurn waits for the rank's device turn, where it takes turns and does
// not hold it already.
func (s *stageTracker) takeTurn() {
	if s == nil || s.turn == nil || s.held {
		return
	}
	s.turn <- struct{}{}
	s.held = true
}

// endTurn gives the turn back, once the rank's stream has run what it was
// given: when it waits in a collective.
func (s *stageTracker) endTurn() error {
	if s == nil || !s.held {
		return nil
	}
	var err error
	if s.sync != nil {
		if err = s.sync(); err != nil {
			err = fmt.Errorf("rank %d: synchronize before giving the device's turn back: %w", s.rank, err)
		}
	}
	s.held = false
	<-s.turn
	return err
}

// dropTurn gives the turn back without waiting for the stream: a failed
// rank's, so that the others on its device can go on (to fail at their
// next exchange).
func (s *stageTracker) dropTurn() {
	if s == nil || !s.held {
		return
	}
	s.held = false
	<-s.turn
}

// current is the stage the rank is in, or "" before the first.
func (s *stageTracker) current() string {
	if s == nil || s.idx < 0 {
		return ""
	}
	return s.stages[s.idx]
}

// upTo enters every stage after the current one up to stage, in order,
// calling the hook before each: a rank that skips stages (one holding no
// tokens) still passes through them. Entering the current stage again does
// nothing.
func (s *stageTracker) upTo(stage string) error {
	if s == nil {
		return nil
	}
	j := slices.Index(s.stages, stage)
	if j < 0 {
		return fmt.Errorf("rank %d: unknown stage %q", s.rank, stage)
	}
	if j < s.idx {
		return fmt.Errorf("rank %d: stage %q after stage %q", s.rank, stage, s.current())
	}
	for s.idx < j {
		s.idx++
		if s.hook != nil {
			if err := s.hook(s.rank, s.stages[s.idx]); err != nil {
				return fmt.Errorf("stage hook: %w", err)
			}
		}
	}
	return nil
}

// finish enters the remaining stages.
func (s *stageTracker) finish() error {
	if s == nil || len(s.stages) == 0 {
		return nil
	}
	return s.upTo(s.stages[len(s.stages)-1])
}

// rankWork is one local rank of a run: where it runs, its communicator and
// its stage tracker.
type rankWork struct {
	rank   int
	device int
	dev    *gpuDevice        // nil in CPU tests
	cm     comm.Communicator // nil when the run exchanges nothing
	st     *stageTracker
}

// timeoutComm bounds every collective of a communicator by d
// (GPUOptions.Timeout) through its context.
type timeoutComm struct {
	comm.Communicator
	d time.Duration
}

// AllGather is the communicator's AllGather with at most d to wait.
func (c *timeoutComm) AllGather(ctx context.Context, send, recv []byte) error {
	tctx, cancel := context.WithTimeout(ctx, c.d)
	defer cancel()
	return c.explain(ctx, tctx, c.Communicator.AllGather(tctx, send, recv))
}

// Barrier is the communicator's Barrier with at most d to wait.
func (c *timeoutComm) Barrier(ctx context.Context) error {
	tctx, cancel := context.WithTimeout(ctx, c.d)
	defer cancel()
	return c.explain(ctx, tctx, c.Communicator.Barrier(tctx))
}

// turnComm is the communicator of a rank that takes turns with the others
// of its device (GPUOptions.SerialRanks): it gives the device's turn back,
// its stream synchronized, while it waits in a collective, and takes it
// again once the collective is done. A failed collective leaves the turn
// with the others: the rank's run is over. It has no device all-gather
// (deviceGatherOf): ranks that take turns share a device, which only the
// loopback allows, and the loopback has none.
type turnComm struct {
	comm.Communicator
	st *stageTracker
}

// AllGather is the communicator's AllGather out of the rank's turn.
func (c *turnComm) AllGather(ctx context.Context, send, recv []byte) error {
	return c.wait(func() error { return c.Communicator.AllGather(ctx, send, recv) })
}

// Barrier is the communicator's Barrier out of the rank's turn.
func (c *turnComm) Barrier(ctx context.Context) error {
	return c.wait(func() error { return c.Communicator.Barrier(ctx) })
}

// wait runs the collective f out of the rank's turn.
func (c *turnComm) wait(f func() error) error {
	if err := c.st.endTurn(); err != nil {
		return err
	}
	if err := f(); err != nil {
		return err
	}
	c.st.takeTurn()
	return nil
}

// deviceAllGather all-gathers device memory on a stream: every rank's send
// (the same size on every rank) lands in recv in rank order; it returns
// when the stream's work is done (comm.NCCLComm.AllGatherDevice).
type deviceAllGather func(ctx context.Context, send, recv *loader.Buffer, stream *loader.Stream) error

// deviceGatherer is a communicator that all-gathers device memory.
type deviceGatherer interface {
	AllGatherDevice(ctx context.Context, send, recv *loader.Buffer, stream *loader.Stream) error
}

// deviceGatherOf is c's device all-gather, bounded by a timeoutComm's
// timeout when c is one, or nil when c has none (the loopback).
func deviceGatherOf(c comm.Communicator) deviceAllGather {
	switch x := c.(type) {
	case *timeoutComm:
		inner := deviceGatherOf(x.Communicator)
		if inner == nil {
			return nil
		}
		return func(ctx context.Context, send, recv *loader.Buffer, stream *loader.Stream) error {
			tctx, cancel := context.WithTimeout(ctx, x.d)
			defer cancel()
			return x.explain(ctx, tctx, inner(tctx, send, recv, stream))
		}
	case deviceGatherer:
		return x.AllGatherDevice
	}
	return nil
}

// explain marks a collective that failed because its time ran out with
// comm.ErrTimeout (the loopback reports only the context's error).
func (c *timeoutComm) explain(parent, tctx context.Context, err error) error {
	if err == nil || parent.Err() != nil || !errors.Is(tctx.Err(), context.DeadlineExceeded) || errors.Is(err, comm.ErrTimeout) {
		return err
	}
	return fmt.Errorf("%w: the exchange waited longer than GPUOptions.Timeout %v: %w", comm.ErrTimeout, c.d, err)
}

// runSpec is one run of a set of local ranks.
type runSpec struct {
	op       string              // "forward", "recompute", "backward"
	stages   []string            // the stage names of the op
	ranks    []int               // the local ranks, ascending
	devices  []int               // the device of each local rank
	devs     []*gpuDevice        // the loaded device of each local rank; nil in CPU tests
	comms    []comm.Communicator // each local rank's communicator, or nil
	exchange bool                // the ranks get their communicators (else they only abort them on failure)
	timeout  time.Duration       // bounds every collective; 0: none of ours
	hook     func(rank int, stage string) error
	serial   bool // GPUOptions.SerialRanks: the ranks sharing a device take turns (stageTracker.takeTurn)
}

// deviceTurns makes one turn (a semaphore of one) for every device that
// two or more of the ranks share, indexed like ranks: nil for a rank alone
// on its device.
func deviceTurns(devices []int) []chan struct{} {
	byDev := map[int]chan struct{}{}
	count := map[int]int{}
	for _, d := range devices {
		count[d]++
	}
	out := make([]chan struct{}, len(devices))
	for i, d := range devices {
		if count[d] < 2 {
			continue
		}
		if byDev[d] == nil {
			byDev[d] = make(chan struct{}, 1)
		}
		out[i] = byDev[d]
	}
	return out
}

// runRankGroup runs fn once per local rank, each on its own goroutine, and
// waits for all. Each rank first enters the op's first stage. On a rank's
// first failure (an error or a panic) it aborts that rank's communicator,
// so that every rank waiting in a collective returns at once, and cancels
// the context the others see. It returns nil, or a *RunError naming the
// rank that failed first and every failed rank with the stage it was in.
func runRankGroup(ctx context.Context, spec runSpec, fn func(ctx context.Context, w *rankWork) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	n := len(spec.ranks)
	errs := make([]error, n)
	works := make([]*rankWork, n)
	var (
		mu    sync.Mutex
		first = -1 // index of the first local rank to fail
		wg    sync.WaitGroup
	)
	var turns []chan struct{}
	if spec.serial {
		turns = deviceTurns(spec.devices)
	}
	for i, r := range spec.ranks {
		w := &rankWork{rank: r, device: spec.devices[i], st: &stageTracker{rank: r, stages: spec.stages, idx: -1, hook: spec.hook}}
		if turns != nil {
			w.st.turn = turns[i]
		}
		if spec.devs != nil {
			w.dev = spec.devs[i]
		}
		var c comm.Communicator
		if spec.comms != nil && spec.comms[i] != nil {
			c = spec.comms[i]
			if spec.timeout > 0 {
				c = &timeoutComm{Communicator: c, d: spec.timeout}
			}
		}
		if c != nil && w.st.turn != nil {
			c = &turnComm{Communicator: c, st: w.st}
		}
		if spec.exchange {
			w.cm = c
		}
		works[i] = w
		wg.Go(func() {
			err := callRank(ctx, w, fn)
			if err == nil {
				return
			}
			mu.Lock()
			if first < 0 {
				first = i
			}
			mu.Unlock()
			errs[i] = err
			if c != nil {
				c.Abort(fmt.Errorf("stage %q: %w", w.st.current(), err))
			}
			cancel(fmt.Errorf("rank %d: %w", r, err))
		})
	}
	wg.Wait()
	if first < 0 {
		return nil
	}
	re := &RunError{Op: spec.op, First: spec.ranks[first], FirstStage: works[first].st.current()}
	// A rank stopped by an abort from elsewhere (another process, or a
	// local NCCL peer whose abort arrived before its own error returned)
	// names the rank that aborted.
	var ab *comm.AbortError
	if errors.As(errs[first], &ab) && ab.Rank != re.First {
		re.First, re.FirstStage = ab.Rank, ""
		if j := slices.Index(spec.ranks, ab.Rank); j >= 0 && errs[j] != nil {
			re.FirstStage = works[j].st.current()
		}
	}
	for i, err := range errs {
		if err != nil {
			re.Ranks = append(re.Ranks, &RankError{Rank: spec.ranks[i], Device: spec.devices[i], Stage: works[i].st.current(),
				First: re.First, Err: err})
		}
	}
	return re
}

// callRank enters the first stage and runs fn, turning a panic into an
// error with the stack.
func callRank(ctx context.Context, w *rankWork, fn func(context.Context, *rankWork) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
		// The turn goes back without a wait for the stream: a rank that
		// ran to its end synchronized it (its downloads) and freed what it
		// does not keep; a failed rank's launched work is what it is.
		w.st.dropTurn()
	}()
	// GPUOptions.SerialRanks: everything the rank does on its device, its
	// allocations, uploads, kernels, downloads and frees, runs in its turn;
	// it gives the turn back only while it waits for the others in a
	// collective (turnComm), so no stage but the exchanges holds another
	// rank's work, and no host call of another rank stalls its own.
	w.st.takeTurn()
	if len(w.st.stages) > 0 {
		if err := w.st.upTo(w.st.stages[0]); err != nil {
			return err
		}
	}
	return fn(ctx, w)
}

// stageHook is the hook the ranks call before each stage: StageHook, then
// the tests' fault.
func (o GPUOptions) stageHook() func(rank int, stage string) error {
	if o.StageHook == nil && o.fault == nil {
		return nil
	}
	return func(rank int, stage string) error {
		if o.StageHook != nil {
			if err := o.StageHook(rank, stage); err != nil {
				return err
			}
		}
		if o.fault != nil {
			return o.fault(rank, stage)
		}
		return nil
	}
}

// runRanks runs fn for every local rank of the backend: with exchange, each
// with its communicator (the given one, a fresh loopback over all ranks, or
// the fleet's NCCL group over the ranks' devices, made on first use), else
// none (a recompute; a given communicator is still aborted on failure so
// that its peers stop waiting). It returns fn's *RunError, or an error
// prefixed "kcp: gpu <op>:" when the communicators could not be had. A run
// that fails on an NCCL group closes the group, and the backend then
// reports ErrReopen.
func (g *GPU) runRanks(ctx context.Context, op string, stages []string, exchange bool,
	fn func(ctx context.Context, w *rankWork) error) error {
	l := g.layout
	if l.kind == CommGiven {
		g.runMu.Lock() // one run at a time on the caller's communicator
		defer g.runMu.Unlock()
	}
	spec := runSpec{op: op, stages: stages, ranks: l.local, exchange: exchange, timeout: g.gopts.Timeout, hook: g.gopts.stageHook(),
		serial: g.gopts.SerialRanks}
	for _, r := range l.local {
		spec.devices = append(spec.devices, l.devices[r])
		spec.devs = append(spec.devs, g.fleet.device(l.devices[r]))
	}
	var done func(error) error
	switch {
	case l.kind == CommGiven:
		spec.comms = []comm.Communicator{g.gopts.Communicator}
	case !exchange:
	case l.kind == CommNCCL:
		grp, err := g.fleet.group(l.devices, g.gopts.Timeout)
		if err != nil {
			return err // ErrReopen, a closed backend, or NCCL's init error
		}
		spec.comms, done = grp.comms, grp.done
	default:
		cs, err := comm.NewLoopback(len(l.devices))
		if err != nil {
			return fmt.Errorf("kcp: gpu %s: %w", op, err)
		}
		spec.comms = cs
		done = func(error) error {
			for _, c := range cs {
				_ = c.Close() // the group is done; closing an in-process endpoint cannot fail usefully
			}
			return nil
		}
	}
	err := runRankGroup(ctx, spec, fn)
	if done != nil {
		if derr := done(err); derr != nil {
			return errors.Join(err, fmt.Errorf("kcp: gpu %s: %w", op, derr))
		}
	}
	return err
}

// Devices returns the CUDA devices the backend loaded, in GPUOptions.Devices
// order (or GPUOptions.Device alone).
func (g *GPU) Devices() []int {
	if g == nil || g.fleet == nil {
		return nil
	}
	return slices.Clone(g.fleet.order)
}

// DeviceProfiles returns the detected device and loaded blob of each of
// Devices, in that order.
func (g *GPU) DeviceProfiles() []*archdetect.Profile {
	if g == nil || g.fleet == nil {
		return nil
	}
	out := make([]*archdetect.Profile, len(g.fleet.order))
	for i, d := range g.fleet.order {
		out[i] = g.fleet.devs[d].profile
	}
	return out
}

// RankDevices returns the CUDA device each rank of the plan runs on,
// indexed by rank: Devices[r*len(Devices)/R] (contiguous blocks), or, with
// GPUOptions.Communicator, Device for this process's rank and -1 for the
// others.
func (g *GPU) RankDevices() []int {
	if g == nil {
		return nil
	}
	return slices.Clone(g.layout.devices)
}

// LocalRanks returns the ranks this backend runs, ascending: every rank of
// the plan, or with GPUOptions.Communicator only Communicator.Rank().
func (g *GPU) LocalRanks() []int {
	if g == nil {
		return nil
	}
	return slices.Clone(g.layout.local)
}

// Local reports whether this backend runs rank.
func (g *GPU) Local(rank int) bool { return slices.Contains(g.LocalRanks(), rank) }

// Comm returns how the backend's ranks exchange: CommLoopback, CommNCCL, or
// CommGiven when GPUOptions.Communicator is set.
func (g *GPU) Comm() CommKind {
	if g == nil {
		return ""
	}
	return g.layout.kind
}

// DeviceExchange reports whether the backend's ranks exchange their state
// summaries and adjoint offsets by all-gathering device memory: an NCCL
// group (CommNCCL) or a given Communicator that can (a *comm.NCCLComm),
// unless GPUOptions.HostExchange. Otherwise they go through host memory.
func (g *GPU) DeviceExchange() bool {
	if g == nil || g.gopts.HostExchange {
		return false
	}
	switch g.layout.kind {
	case CommNCCL:
		return true
	case CommGiven:
		return deviceGatherOf(g.gopts.Communicator) != nil
	}
	return false
}

// Err reports why the backend can no longer run, or nil: it is closed, or
// the NCCL group its ranks exchange through was aborted by a failed run (an
// error wrapping ErrReopen).
func (g *GPU) Err() error {
	if err := g.alive(); err != nil {
		return err
	}
	if g.layout.kind != CommNCCL || g.fleet == nil {
		return nil
	}
	g.fleet.mu.Lock()
	grp := g.fleet.groups[groupKey(g.layout.devices)]
	g.fleet.mu.Unlock()
	if grp == nil {
		return nil
	}
	return grp.err()
}
