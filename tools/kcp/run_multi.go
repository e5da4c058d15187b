package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/loader"
)

// Where the GPU backend's ranks run: on the devices of this process (one or
// several GPUs, NCCL or the loopback between them), or, under a launcher
// (torchrun, kcp launch), one rank in this process over an NCCL
// communicator made from the launcher's environment.

// deviceCount says how many CUDA devices this process sees (a variable so
// tests can stand in a GPU count).
var deviceCount = loader.DeviceCount

// launchEnv reads a launcher's environment when one is present (a variable
// so tests can stand one in).
var launchEnvFromOS = func() (*comm.Env, error) {
	if !comm.EnvPresent() {
		return nil, nil
	}
	e, err := comm.EnvFromOS()
	if err != nil {
		return nil, fmt.Errorf("launcher environment: %w", err)
	}
	return &e, nil
}

// parseDevices reads --devices: comma-separated ordinals.
func parseDevices(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--devices: %q is not a device ordinal", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--devices %q: no device", s)
	}
	return out, nil
}

// gpuPlacement is where a GPU run's ranks go.
type gpuPlacement struct {
	devices []int     // this process's devices, rank blocks in order
	env     *comm.Env // set under a launcher: this process runs rank env.Rank on env.LocalRank
}

// firstDevice is the device of this process's first rank: LOCAL_RANK under a
// launcher, else the first of devices, else fallback (--device). Kernel
// choice (--kernels auto) asks it.
func (pl gpuPlacement) firstDevice(fallback int) int {
	switch {
	case pl.env != nil:
		return pl.env.LocalRank
	case len(pl.devices) > 0:
		return pl.devices[0]
	}
	return fallback
}

// placeGPU decides the devices (--devices, else every visible GPU, else
// --device) and, without --cp, the rank count: WORLD_SIZE under a launcher,
// else --ranks-per-gpu times the devices. Outside a launcher it returns cp
// unchanged when the GPU backend will not run (gpu false: --backend cpu or
// dims it does not take; or no driver), so that auto can fall back.
func (o *runOptions) placeGPU(changed func(string) bool, cp int, gpu bool) (gpuPlacement, int, error) {
	var pl gpuPlacement
	env, err := launchEnvFromOS()
	if err != nil {
		return pl, cp, err
	}
	if env != nil {
		switch {
		case o.backend == "cpu":
			return pl, cp, fmt.Errorf("launched as rank %d of %d (RANK, WORLD_SIZE set): only the GPU backend runs one rank a process; drop --backend cpu or run without the launcher", env.Rank, env.WorldSize)
		case changed("cp") && cp != env.WorldSize:
			return pl, cp, fmt.Errorf("--cp %d but WORLD_SIZE=%d: under a launcher every process runs one rank, so the plan has WORLD_SIZE ranks", cp, env.WorldSize)
		case changed("devices") || changed("ranks-per-gpu") || changed("comm"):
			return pl, cp, errors.New("--devices, --ranks-per-gpu and --comm do not apply under a launcher: each process runs rank RANK on GPU LOCAL_RANK through NCCL")
		}
		n, err := deviceCount()
		if err != nil {
			return pl, cp, fmt.Errorf("rank %d: %w", env.Rank, err)
		}
		if err := env.CheckDevices(n); err != nil {
			return pl, cp, fmt.Errorf("rank %d: %w", env.Rank, err)
		}
		pl.env, pl.devices = env, []int{env.LocalRank}
		return pl, env.WorldSize, nil
	}
	if !gpu {
		return pl, cp, nil
	}
	if o.ranksPerGPU < 1 {
		return pl, cp, fmt.Errorf("--ranks-per-gpu %d: need at least 1", o.ranksPerGPU)
	}
	switch {
	case changed("devices"):
		if pl.devices, err = parseDevices(o.devices); err != nil {
			return pl, cp, err
		}
	case changed("device"):
		pl.devices = []int{o.device}
	default:
		n, err := deviceCount()
		if err != nil || n == 0 {
			return pl, cp, nil // no GPU: the CPU backend, or a clear error from the GPU one
		}
		for i := range n {
			pl.devices = append(pl.devices, i)
		}
	}
	if !changed("cp") {
		cp = o.ranksPerGPU * len(pl.devices)
	}
	return pl, cp, nil
}

// gpuOptions adds the placement to opts; under a launcher it makes the NCCL
// communicator from the environment (closed by the returned func).
func (o *runOptions) gpuOptions(pl gpuPlacement, opts kcp.GPUOptions) (kcp.GPUOptions, func() error, error) {
	done := func() error { return nil }
	if pl.env == nil {
		ck, err := kcp.ParseCommKind(o.comm)
		if err != nil {
			return opts, done, fmt.Errorf("--comm: %w", err)
		}
		opts.Comm, opts.Devices, opts.Timeout, opts.HostExchange = ck, pl.devices, o.timeout, o.hostExchange
		if len(pl.devices) > 0 {
			opts.Device = pl.devices[0]
		}
		return opts, done, nil
	}
	e := pl.env
	ctx, err := loader.Primary(e.LocalRank)
	if err != nil {
		return opts, done, fmt.Errorf("rank %d: GPU %d: %w", e.Rank, e.LocalRank, err)
	}
	nc, err := comm.NewNCCLCommFromEnv(ctx, *e, comm.NCCLOptions{Timeout: o.timeout})
	if err != nil {
		return opts, done, errors.Join(fmt.Errorf("rank %d of %d: NCCL init through NCCL_COMM_ID=%s: %w", e.Rank, e.WorldSize, e.NCCLCommID, err), ctx.Close())
	}
	opts.Communicator, opts.Device, opts.Timeout, opts.HostExchange = nc, e.LocalRank, o.timeout, o.hostExchange
	return opts, func() error { return errors.Join(nc.Close(), ctx.Close()) }, nil
}

// faultSpec is --fault-kill / --fault-error: RANK:STAGE.
type faultSpec struct {
	rank  int
	stage string
}

func parseFault(flag, s string) (*faultSpec, error) {
	if s == "" {
		return nil, nil
	}
	r, st, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(r)
	if !ok || err != nil || n < 0 || st == "" {
		return nil, fmt.Errorf("%s %q: want RANK:STAGE, e.g. 1:tape walk", flag, s)
	}
	return &faultSpec{n, st}, nil
}

// stageHook returns the GPUOptions.StageHook of --fault-kill (the process
// kills itself with SIGKILL when the rank first reaches the stage, as a
// crashed rank would) and --fault-error (the rank fails there with an
// error), or nil without either.
func (o *runOptions) stageHook(stderr io.Writer) (func(int, string) error, error) {
	kill, err := parseFault("--fault-kill", o.faultKill)
	if err != nil {
		return nil, err
	}
	fail, err := parseFault("--fault-error", o.faultError)
	if err != nil {
		return nil, err
	}
	if kill == nil && fail == nil {
		return nil, nil
	}
	var once sync.Once
	return func(rank int, stage string) error {
		if kill != nil && rank == kill.rank && stage == kill.stage {
			once.Do(func() {
				fmt.Fprintf(stderr, "kcp run: --fault-kill: rank %d kills its process at stage %q\n", rank, stage)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // SIGKILL cannot be caught; wait for it
			})
		}
		if fail != nil && rank == fail.rank && stage == fail.stage {
			return fmt.Errorf("--fault-error: injected failure of rank %d at stage %q", rank, stage)
		}
		return nil
	}, nil
}

// maskRanks zeroes, in copies of the reference output and gradients, the
// token rows of ranks that did not run here, so that a process running some
// ranks compares only its own rows (the conv weight gradient, complete on
// every rank, stays whole).
func maskRanks(plan *kcp.Plan, local []int, out *kcp.Output, g *kcp.Grads) (*kcp.Output, *kcp.Grads) {
	if len(local) == len(plan.Ranks) {
		return out, g
	}
	keep := make([]bool, plan.Tokens)
	for _, r := range local {
		for _, seg := range plan.Ranks[r].Segments {
			for t := seg.Start; t < seg.Start+seg.Len; t++ {
				keep[t] = true
			}
		}
	}
	mask := func(x []float64) []float64 {
		if len(x) == 0 || len(x)%plan.Tokens != 0 {
			return x
		}
		row := len(x) / plan.Tokens
		y := make([]float64, len(x))
		for t, k := range keep {
			if k {
				copy(y[t*row:(t+1)*row], x[t*row:(t+1)*row])
			}
		}
		return y
	}
	var mo *kcp.Output
	if out != nil {
		mo = &kcp.Output{O: mask(out.O)}
	}
	var mg *kcp.Grads
	if g != nil {
		mg = &kcp.Grads{DQ: mask(g.DQ), DK: mask(g.DK), DV: mask(g.DV), DG: mask(g.DG), DBeta: mask(g.DBeta), DConvW: g.DConvW}
	}
	return mo, mg
}

// exchangeKind names how g's ranks exchange the summaries and offsets:
// "device" or "host".
func exchangeKind(g *kcp.GPU) string {
	if g.DeviceExchange() {
		return "device"
	}
	return "host"
}

// orUnknown is s, or "unknown" when empty (a report from before the field).
func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
