package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The launch tests launch this test binary itself: each rank runs TestLaunchHelperProcess, which acts
// out the mode given after "--" when GDNKCP_LAUNCH_HELPER is set (inherited from the test, naming a
// directory the ranks may use to synchronise).

const launchHelperEnv = "GDNKCP_LAUNCH_HELPER"

// helperArgs is the command line after launch's "--" that makes a rank run the helper in mode.
func helperArgs(mode ...string) []string {
	return append([]string{"-test.run=^TestLaunchHelperProcess$", "--"}, mode...)
}

// launchHelper runs kcp launch with the given flags over the helper in mode, and how long it took.
func launchHelper(t *testing.T, flags []string, mode ...string) (stdout, stderr string, code int, took time.Duration) {
	t.Helper()
	t.Setenv(launchHelperEnv, t.TempDir()) // also where the ranks mark themselves ready
	args := append(append([]string{"launch"}, flags...), "--")
	args = append(args, helperArgs(mode...)...)
	start := time.Now()
	stdout, stderr, code = execute(args...)
	return stdout, stderr, code, time.Since(start)
}

// TestLaunchHelperProcess is not a test: it is what a launched rank runs.
func TestLaunchHelperProcess(t *testing.T) {
	if os.Getenv(launchHelperEnv) == "" {
		return
	}
	os.Exit(helperMain(flag.Args()))
}

// helperMain acts out one mode; RANK comes from launch.
//
//	env                print the launch environment, a line to stderr, a last line without newline
//	fail R CODE        rank R exits with CODE after a moment; the others wait to be stopped
//	stubborn R         as fail R 3, but the others ignore SIGTERM
//	killself R         rank R kills itself with SIGKILL; the others wait
//	sleep              every rank waits to be stopped
//	kcp ARGS...        run the kcp command line ARGS
func helperMain(args []string) int {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	arg := func(i int) int {
		n, _ := strconv.Atoi(args[i])
		return n
	}
	wait := func() int {
		fmt.Println("waiting")
		time.Sleep(30 * time.Second)
		return 0
	}
	switch args[0] {
	case "env":
		for _, k := range []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
			"MASTER_PORT", "NCCL_COMM_ID", "NCCL_NVLS_ENABLE"} {
			fmt.Printf("%s=%s\n", k, os.Getenv(k))
		}
		fmt.Fprintln(os.Stderr, "a line on stderr")
		fmt.Print("no newline at the end")
		return 0
	case "fail", "stubborn":
		if rank == arg(1) {
			time.Sleep(150 * time.Millisecond)
			if args[0] == "stubborn" {
				awaitReady(rank) // the others ignore SIGTERM by now
				return 3
			}
			fmt.Fprintf(os.Stderr, "rank %d fails\n", rank)
			return arg(2)
		}
		if args[0] == "stubborn" {
			signal.Ignore(syscall.SIGTERM)
			markReady(rank)
		}
		return wait()
	case "killself":
		if rank == arg(1) {
			time.Sleep(100 * time.Millisecond)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		return wait()
	case "sleep":
		return wait()
	case "kcp":
		return run(args[1:], os.Stdout, os.Stderr)
	}
	fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", args)
	return 2
}

// markReady tells the other ranks that this one is set up (a file in the test's directory).
func markReady(rank int) {
	_ = os.WriteFile(filepath.Join(os.Getenv(launchHelperEnv), fmt.Sprintf("ready-%d", rank)), nil, 0o644)
}

// awaitReady waits (up to 5 s) until every rank but this one has marked itself ready.
func awaitReady(rank int) {
	n, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		ready := 0
		for r := range n {
			if _, err := os.Stat(filepath.Join(os.Getenv(launchHelperEnv), fmt.Sprintf("ready-%d", r))); err == nil || r == rank {
				ready++
			}
		}
		if ready == n {
			return
		}
	}
}

func TestLaunchEnvironmentAndPrefixes(t *testing.T) {
	// What launch sets replaces what it was given.
	t.Setenv("RANK", "99")
	t.Setenv("NCCL_NVLS_ENABLE", "1")
	t.Setenv("NCCL_COMM_ID", "example.com:1")
	stdout, stderr, code, _ := launchHelper(t, []string{"--nproc", "3"}, "env")
	require.Equal(t, 0, code, stderr)

	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 3*9, stdout)
	got := map[int]map[string]string{}
	linePat := regexp.MustCompile(`^\[rank (\d)\] (.*)$`)
	for _, line := range lines {
		m := linePat.FindStringSubmatch(line)
		require.NotNil(t, m, "every line is prefixed: %q", line)
		r, _ := strconv.Atoi(m[1])
		if got[r] == nil {
			got[r] = map[string]string{}
		}
		if k, v, ok := strings.Cut(m[2], "="); ok {
			got[r][k] = v
		} else {
			got[r]["last"] = m[2]
		}
	}
	require.Len(t, got, 3)
	port := got[0]["MASTER_PORT"]
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	for r := range 3 {
		assert.Equal(t, map[string]string{
			"RANK": strconv.Itoa(r), "WORLD_SIZE": "3", "LOCAL_RANK": strconv.Itoa(r), "LOCAL_WORLD_SIZE": "3",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NCCL_COMM_ID": fmt.Sprintf("127.0.0.1:%d", p+1),
			"NCCL_NVLS_ENABLE": "0", "last": "no newline at the end",
		}, got[r], "rank %d", r)
		assert.Contains(t, stderr, fmt.Sprintf("[rank %d] a line on stderr\n", r))
	}
	assert.NotContains(t, stderr, "kcp launch:", "nothing to report when every rank succeeds")
}

func TestLaunchFailures(t *testing.T) {
	tests := []struct {
		name     string
		flags    []string
		mode     []string
		want     []string // in stderr
		minTook  time.Duration
		wantKill bool
	}{
		{
			name:  "a failing rank stops the others",
			flags: []string{"--nproc", "3", "--grace", "3s"},
			mode:  []string{"fail", "1", "7"},
			want: []string{
				"[rank 1] rank 1 fails\n",
				"kcp launch: rank 1 exited with status 7; sent SIGTERM to ranks 0, 2\n",
				"kcp launch: rank 0 was killed by signal 15 (terminated) after SIGTERM\n",
				"kcp: error: rank 1 of 3 exited with status 7; stopped the others: sent SIGTERM to ranks 0, 2\n",
			},
		},
		{
			name:  "ranks that ignore SIGTERM get SIGKILL after the grace period",
			flags: []string{"--nproc", "2", "--grace", "300ms"},
			mode:  []string{"stubborn", "0"},
			want: []string{
				"kcp launch: rank 0 exited with status 3; sent SIGTERM to rank 1\n",
				"kcp launch: sent SIGKILL to rank 1, still running 300ms after SIGTERM\n",
				"kcp launch: rank 1 was killed by signal 9 (killed) after SIGKILL\n",
				"kcp: error: rank 0 of 2 exited with status 3; stopped the others: sent SIGTERM to rank 1, then SIGKILL to rank 1 after the 300ms grace period\n",
			},
			minTook: 300 * time.Millisecond,
		},
		{
			name:  "a rank killed by a signal",
			flags: []string{"--nproc", "2"},
			mode:  []string{"killself", "1"},
			want: []string{
				"kcp: error: rank 1 of 2 was killed by signal 9 (killed); stopped the others: sent SIGTERM to rank 0\n",
			},
		},
		{
			name:  "timeout",
			flags: []string{"--nproc", "2", "--timeout", "400ms", "--grace", "2s"},
			mode:  []string{"sleep"},
			want: []string{
				"kcp launch: timed out after 400ms; sent SIGTERM to ranks 0, 1\n",
				"kcp: error: timed out after 400ms; stopped the ranks: sent SIGTERM to ranks 0, 1\n",
			},
			minTook: 400 * time.Millisecond,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code, took := launchHelper(t, tc.flags, tc.mode...)
			assert.Equal(t, 1, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			for _, w := range tc.want {
				assert.Contains(t, stderr, w)
			}
			assert.GreaterOrEqual(t, took, tc.minTook)
			assert.Less(t, took, 3*time.Second, "the ranks were stopped, not waited for")
		})
	}
}

func TestLaunchBadArguments(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no --nproc", []string{"launch", "--", "plan"}, "kcp: error: --nproc is required: the number of ranks to start\n"},
		{"zero", []string{"launch", "--nproc", "0", "--", "plan"}, "kcp: error: --nproc must be at least 1, got 0\n"},
		{"negative", []string{"launch", "--nproc", "-2", "--", "plan"}, "kcp: error: --nproc must be at least 1, got -2\n"},
		{"not a number", []string{"launch", "--nproc", "two", "--", "plan"}, `invalid argument "two" for "--nproc"`},
		{"negative timeout", []string{"launch", "--nproc", "2", "--timeout", "-1s", "--", "plan"}, "kcp: error: --timeout must not be negative, got -1s\n"},
		{"negative grace", []string{"launch", "--nproc", "2", "--grace", "-1s", "--", "plan"}, "kcp: error: --grace must not be negative, got -1s\n"},
		{"no command", []string{"launch", "--nproc", "2"}, "kcp: error: no command to run: kcp launch --nproc N -- COMMAND [FLAGS...]"},
		{"no command after --", []string{"launch", "--nproc", "2", "--"}, "kcp: error: no command to run"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := execute(tc.args...)
			assert.Equal(t, 1, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tc.want)
		})
	}
}

func TestLaunchStartFailure(t *testing.T) {
	saved := launchExecutable
	t.Cleanup(func() { launchExecutable = saved })
	launchExecutable = func() (string, error) { return "/nonexistent/kcp", nil }
	_, stderr, code := execute("launch", "--nproc", "2", "--", "plan")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "kcp: error: rank 0: starting /nonexistent/kcp: ")

	launchExecutable = func() (string, error) { return "", errors.New("no /proc") }
	_, stderr, code = execute("launch", "--nproc", "2", "--", "plan")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "kcp: error: finding this program to start the ranks: no /proc")
}

func TestLaunchEnvReplaces(t *testing.T) {
	env := launchEnv([]string{"PATH=/bin", "RANK=7", "NCCL_NVLS_ENABLE=1", "HOME=/root", "WORLD_SIZE"}, 1, 2, 40000)
	assert.Equal(t, []string{"PATH=/bin", "HOME=/root", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
		"MASTER_PORT=40000", "NCCL_COMM_ID=127.0.0.1:40001", "NCCL_NVLS_ENABLE=0", "RANK=1", "WORLD_SIZE=2"}, env)

	port, err := freePortPair()
	require.NoError(t, err)
	assert.Greater(t, port, 0)
	assert.Less(t, port, 65535)
}

func TestPrefixWriter(t *testing.T) {
	var out strings.Builder
	w := &prefixWriter{prefix: "[rank 2] ", dst: &lockedWriter{w: &out}}
	for _, chunk := range []string{"one\ntw", "o\n", "", "\nthr", "ee"} {
		n, err := w.Write([]byte(chunk))
		require.NoError(t, err)
		assert.Equal(t, len(chunk), n)
	}
	assert.Equal(t, "[rank 2] one\n[rank 2] two\n[rank 2] \n", out.String())
	w.flush()
	w.flush()
	assert.Equal(t, "[rank 2] one\n[rank 2] two\n[rank 2] \n[rank 2] three\n", out.String())
	assert.Equal(t, "rank 3", rankList([]int{3}))
	assert.Equal(t, "ranks 0, 2, 5", rankList([]int{0, 2, 5}))
}
