package main

import (
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/comm"
	"github.com/gdnkcp/gdnkcp/kcp"
)

// standIn replaces the launcher environment and the device count for one test.
func standIn(t *testing.T, env *comm.Env, devices int, devErr error) {
	t.Helper()
	savedEnv, savedCount := launchEnvFromOS, deviceCount
	t.Cleanup(func() { launchEnvFromOS, deviceCount = savedEnv, savedCount })
	launchEnvFromOS = func() (*comm.Env, error) { return env, nil }
	deviceCount = func() (int, error) { return devices, devErr }
}

// placeGPU: the rank count and devices from the launcher's environment, the
// visible GPUs or the flags, and the errors of contradicting flags.
func TestRunPlaceGPU(t *testing.T) {
	env := &comm.Env{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, NCCLCommID: "127.0.0.1:29501"}
	for _, tc := range []struct {
		name    string
		env     *comm.Env
		gpus    int
		gpuErr  error
		o       runOptions
		changed []string
		wantCP  int
		wantDev []int
		wantErr string
	}{
		{name: "cpu backend keeps --cp", gpus: 2, o: runOptions{cp: 2, ranksPerGPU: 1, backend: "cpu"}, wantCP: 2},
		{name: "no gpu keeps --cp", gpuErr: errors.New("no driver"), o: runOptions{cp: 2, ranksPerGPU: 1}, wantCP: 2},
		{name: "every visible gpu", gpus: 2, o: runOptions{cp: 2, ranksPerGPU: 1}, wantCP: 2, wantDev: []int{0, 1}},
		{name: "ranks per gpu", gpus: 2, o: runOptions{cp: 2, ranksPerGPU: 4}, changed: []string{"ranks-per-gpu"}, wantCP: 8, wantDev: []int{0, 1}},
		{name: "explicit cp wins", gpus: 2, o: runOptions{cp: 3, ranksPerGPU: 1}, changed: []string{"cp"}, wantCP: 3, wantDev: []int{0, 1}},
		{name: "devices flag", gpus: 4, o: runOptions{devices: "3,1", ranksPerGPU: 1}, changed: []string{"devices"}, wantCP: 2, wantDev: []int{3, 1}},
		{name: "device flag", gpus: 4, o: runOptions{device: 2, ranksPerGPU: 2}, changed: []string{"device"}, wantCP: 2, wantDev: []int{2}},
		{name: "bad devices", gpus: 2, o: runOptions{devices: "0,x", ranksPerGPU: 1}, changed: []string{"devices"}, wantErr: `"x" is not a device ordinal`},
		{name: "zero ranks per gpu", gpus: 2, o: runOptions{ranksPerGPU: 0}, wantErr: "--ranks-per-gpu 0"},
		{name: "launcher", env: env, gpus: 2, o: runOptions{cp: 2, ranksPerGPU: 1}, wantCP: 2, wantDev: []int{1}},
		{name: "launcher cp mismatch", env: env, gpus: 2, o: runOptions{cp: 3}, changed: []string{"cp"}, wantErr: "--cp 3 but WORLD_SIZE=2"},
		{name: "launcher cpu", env: env, gpus: 2, o: runOptions{backend: "cpu"}, wantErr: "only the GPU backend runs one rank a process"},
		{name: "launcher devices", env: env, gpus: 2, o: runOptions{devices: "0"}, changed: []string{"devices"}, wantErr: "do not apply under a launcher"},
		{name: "launcher missing gpu", env: env, gpus: 1, o: runOptions{}, wantErr: "LOCAL_RANK"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			standIn(t, tc.env, tc.gpus, tc.gpuErr)
			changed := func(f string) bool {
				for _, c := range tc.changed {
					if c == f {
						return true
					}
				}
				return false
			}
			pl, cp, err := tc.o.placeGPU(changed, tc.o.cp, tc.o.backend != "cpu")
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantCP, cp)
			require.Equal(t, tc.wantDev, pl.devices)
			require.Equal(t, tc.env, pl.env)
		})
	}
}

// --fault-error fails the named rank at the named stage only; bad specs are errors.
func TestRunStageHook(t *testing.T) {
	o := runOptions{faultError: "1:tape walk"}
	hook, err := o.stageHook(io.Discard)
	require.NoError(t, err)
	require.NoError(t, hook(0, "tape walk"))
	require.NoError(t, hook(1, "offset walk"))
	require.ErrorContains(t, hook(1, "tape walk"), `injected failure of rank 1 at stage "tape walk"`)
	none, err := (&runOptions{}).stageHook(io.Discard)
	require.NoError(t, err)
	require.Nil(t, none)
	for _, bad := range []string{"tape walk", "x:tape walk", "-1:prep", "1:"} {
		_, err := (&runOptions{faultKill: bad}).stageHook(io.Discard)
		require.ErrorContains(t, err, "want RANK:STAGE", bad)
	}
}

// maskRanks keeps the rows of the ranks run here and the whole conv weight gradient.
func TestRunMaskRanks(t *testing.T) {
	plan, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{7, 5}, Ranks: 2, Layout: kcp.LayoutC, HQK: 1, HV: 2, DK: 16, DV: 16})
	require.NoError(t, err)
	fill := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = float64(i + 1)
		}
		return x
	}
	T, cfg := plan.Tokens, plan.Config
	out := &kcp.Output{O: fill(T * cfg.HV * cfg.DV)}
	g := &kcp.Grads{DQ: fill(T * cfg.HQK * cfg.DK), DK: fill(T * cfg.HQK * cfg.DK), DV: fill(T * cfg.HV * cfg.DV),
		DG: fill(T * cfg.HV), DBeta: fill(T * cfg.HV), DConvW: fill(5)}
	mo, mg := maskRanks(plan, []int{1}, out, g)
	row := cfg.HV * cfg.DV
	for r, rp := range plan.Ranks {
		for _, seg := range rp.Segments {
			for tok := seg.Start; tok < seg.Start+seg.Len; tok++ {
				if r == 1 {
					require.Equal(t, out.O[tok*row:(tok+1)*row], mo.O[tok*row:(tok+1)*row])
					require.Equal(t, g.DG[tok*cfg.HV], mg.DG[tok*cfg.HV])
				} else {
					require.Zero(t, mo.O[tok*row])
					require.Zero(t, mg.DQ[tok*cfg.HQK*cfg.DK])
				}
			}
		}
	}
	require.Equal(t, g.DConvW, mg.DConvW)
	same, sameG := maskRanks(plan, []int{0, 1}, out, g)
	require.Same(t, out, same)
	require.Same(t, g, sameG)
}

// The first rank's device, which --kernels auto is chosen for: LOCAL_RANK
// under a launcher, else the first listed device, else --device.
func TestPlacementFirstDevice(t *testing.T) {
	for _, tc := range []struct {
		name string
		pl   gpuPlacement
		want int
	}{
		{"launcher", gpuPlacement{devices: []int{0}, env: &comm.Env{Rank: 3, WorldSize: 4, LocalRank: 2}}, 2},
		{"devices", gpuPlacement{devices: []int{5, 6}}, 5},
		{"none", gpuPlacement{}, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.pl.firstDevice(7))
		})
	}
}
