package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gdnkcp/gdnkcp/comm"
)

func init() { register(newLaunchCmd) }

// launchExecutable is the binary the ranks run: this one (a variable so tests can point it elsewhere).
var launchExecutable = os.Executable

// launchWaitDelay bounds how long a rank's output is still read after the rank exits (a process it
// started may hold its stdout open).
const launchWaitDelay = 5 * time.Second

type launchOptions struct {
	nproc   int
	timeout time.Duration
	grace   time.Duration
}

func newLaunchCmd() *cobra.Command {
	var o launchOptions
	cmd := &cobra.Command{
		Use:   "launch --nproc N [--timeout D] [--grace D] -- COMMAND [FLAGS...]",
		Short: "Start N ranks of a kcp command on this host, one process each, like torchrun",
		Long: `launch starts N processes of this kcp binary, each running COMMAND with its FLAGS, and
gives each torchrun's environment, so that they find each other through NCCL:

  RANK=i  WORLD_SIZE=N  LOCAL_RANK=i  LOCAL_WORLD_SIZE=N
  MASTER_ADDR=127.0.0.1  MASTER_PORT=P  (a free port)
  NCCL_COMM_ID=127.0.0.1:P+1  (NCCL's bootstrap root, made by rank 0; P itself stays free for torch)
  NCCL_NVLS_ENABLE=0  (NVLink multicast stays off)

These replace any values launch itself was given. Every line a rank writes to stdout or stderr is
copied to launch's stdout or stderr with the prefix "[rank i] ". launch waits for all ranks. When one
exits with a non-zero status or is killed, launch stops the others (SIGTERM, then SIGKILL after
--grace) and fails with an error naming that rank and its exit status. --timeout stops every rank
after the given time and says so; SIGINT or SIGTERM to launch stops them too.

kcp run reads this environment (comm.EnvFromOS): each process runs rank RANK of the plan on GPU
LOCAL_RANK, the plan has WORLD_SIZE ranks, and the ranks exchange through NCCL. Each prints its own
rank's times and digest (a sha256 of its rows of the output and gradients), which equal those of
the same plan run in one process. kcp sweep does the same over its whole matrix, gathers every
rank's results into every process, and rank 0 prints the table.`,
		Example: `  kcp launch --nproc 2 -- run --backend gpu --pack P1 --cp 2
  kcp launch --nproc 4 -- sweep --packs P1@8192,P4@8192 --reps 1 --warmup 0 --compare ref.json
  kcp launch --nproc 8 --timeout 30m -- bench`,
		RunE:                  func(cmd *cobra.Command, args []string) error { return o.run(cmd, args) },
		DisableFlagsInUseLine: true,
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // flags after COMMAND belong to it, with or without "--"
	f.IntVar(&o.nproc, "nproc", 0, "number of ranks (processes) to start on this host; required")
	f.DurationVar(&o.timeout, "timeout", 0, "stop every rank after this long, e.g. 10m (0: no limit)")
	f.DurationVar(&o.grace, "grace", 10*time.Second, "after SIGTERM, how long a rank has to exit before SIGKILL")
	return cmd
}

func (o *launchOptions) run(cmd *cobra.Command, args []string) error {
	switch {
	case !cmd.Flags().Changed("nproc"):
		return errors.New("--nproc is required: the number of ranks to start")
	case o.nproc < 1:
		return fmt.Errorf("--nproc must be at least 1, got %d", o.nproc)
	case o.timeout < 0:
		return fmt.Errorf("--timeout must not be negative, got %v", o.timeout)
	case o.grace < 0:
		return fmt.Errorf("--grace must not be negative, got %v", o.grace)
	case len(args) == 0:
		return errors.New("no command to run: kcp launch --nproc N -- COMMAND [FLAGS...], e.g. -- run --backend gpu")
	}
	exe, err := launchExecutable()
	if err != nil {
		return fmt.Errorf("finding this program to start the ranks: %w", err)
	}
	port, err := freePortPair()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	l := &launcher{
		exe: exe, args: args, n: o.nproc, grace: o.grace, timeout: o.timeout,
		env:    func(rank int) []string { return launchEnv(os.Environ(), rank, o.nproc, port) },
		stdout: &lockedWriter{w: cmd.OutOrStdout()},
		stderr: &lockedWriter{w: cmd.ErrOrStderr()},
	}
	return l.run(ctx)
}

// launchEnv is base with torchrun's variables for rank of n set (replacing any given), sorted last.
func launchEnv(base []string, rank, n, port int) []string {
	commID, _ := comm.NCCLCommIDFor("127.0.0.1", port) // port < 65535: freePortPair checked port+1
	set := map[string]string{
		comm.EnvRank:           strconv.Itoa(rank),
		comm.EnvWorldSize:      strconv.Itoa(n),
		comm.EnvLocalRank:      strconv.Itoa(rank),
		comm.EnvLocalWorldSize: strconv.Itoa(n),
		comm.EnvMasterAddr:     "127.0.0.1",
		comm.EnvMasterPort:     strconv.Itoa(port),
		comm.EnvNCCLCommID:     commID,
		comm.EnvNCCLNVLSEnable: "0",
	}
	env := make([]string, 0, len(base)+len(set))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+set[k])
	}
	return env
}

// freePortPair finds a port P such that P and P+1 are free (MASTER_PORT and NCCL_COMM_ID's port), by
// listening on them and closing again. Another program may still take them before the ranks do.
func freePortPair() (int, error) {
	var last error
	for range 32 {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return 0, fmt.Errorf("finding a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port >= 65535 {
			l.Close()
			continue
		}
		l2, err := net.Listen("tcp", ":"+strconv.Itoa(port+1))
		l.Close()
		if err != nil {
			last = err
			continue
		}
		l2.Close()
		return port, nil
	}
	return 0, fmt.Errorf("finding two consecutive free ports for MASTER_PORT and NCCL_COMM_ID: %v", last)
}

// launcher runs the ranks of one launch.
type launcher struct {
	exe     string
	args    []string
	n       int
	grace   time.Duration
	timeout time.Duration
	env     func(rank int) []string
	stdout  *lockedWriter
	stderr  *lockedWriter
}

// rankProc is one rank's process.
type rankProc struct {
	rank     int
	cmd      *exec.Cmd
	out, err *prefixWriter
	exited   bool
	sent     string // the last signal launch sent it: "", "SIGTERM" or "SIGKILL"
}

// status describes how the rank's process ended.
func (p *rankProc) status() string {
	ps := p.cmd.ProcessState
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("was killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("exited with status %d", ps.ExitCode())
}

// run starts the ranks and waits for all of them; see the command's help for the rules.
func (l *launcher) run(ctx context.Context) error {
	procs := make([]*rankProc, 0, l.n)
	done := make(chan *rankProc, l.n)
	for rank := range l.n {
		p := &rankProc{rank: rank}
		p.out = &prefixWriter{prefix: fmt.Sprintf("[rank %d] ", rank), dst: l.stdout}
		p.err = &prefixWriter{prefix: fmt.Sprintf("[rank %d] ", rank), dst: l.stderr}
		p.cmd = exec.Command(l.exe, l.args...)
		p.cmd.Env = l.env(rank)
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.err
		p.cmd.WaitDelay = launchWaitDelay
		if err := p.cmd.Start(); err != nil {
			startErr := fmt.Errorf("rank %d: starting %s: %w", rank, l.exe, err)
			for _, q := range procs {
				q.signal(syscall.SIGKILL)
			}
			for range procs {
				(<-done).flush()
			}
			return startErr
		}
		procs = append(procs, p)
		go func() {
			_ = p.cmd.Wait() // the outcome is in ProcessState
			done <- p
		}()
	}

	var (
		failed    *rankProc // the first rank that failed on its own
		stopWhy   string    // why launch stopped the ranks, "" while it has not
		killTimer <-chan time.Time
		ctxDone   = ctx.Done()
		running   = len(procs)
	)
	stop := func(why string) {
		stopWhy = why
		var ranks []int
		for _, p := range procs {
			if p.signal(syscall.SIGTERM) {
				ranks = append(ranks, p.rank)
			}
		}
		if len(ranks) > 0 {
			l.logf("%s; sent SIGTERM to %s", why, rankList(ranks))
			killTimer = time.After(l.grace)
		}
	}
	for running > 0 {
		select {
		case p := <-done:
			p.exited = true
			running--
			p.flush()
			if !p.cmd.ProcessState.Success() && stopWhy == "" {
				failed = p
				stop(fmt.Sprintf("rank %d %s", p.rank, p.status()))
			}
		case <-ctxDone:
			ctxDone = nil
			if stopWhy == "" {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					stop(fmt.Sprintf("timed out after %v", l.timeout))
				} else {
					stop("interrupted")
				}
			}
		case <-killTimer:
			killTimer = nil
			var ranks []int
			for _, p := range procs {
				if p.signal(syscall.SIGKILL) {
					ranks = append(ranks, p.rank)
				}
			}
			if len(ranks) > 0 {
				l.logf("sent SIGKILL to %s, still running %v after SIGTERM", rankList(ranks), l.grace)
			}
		}
	}
	if stopWhy == "" {
		return nil
	}
	return l.report(procs, failed, stopWhy)
}

// report builds launch's error once every rank has ended, and logs how each rank ended.
func (l *launcher) report(procs []*rankProc, failed *rankProc, why string) error {
	var termed, killed []int
	for _, p := range procs {
		how := p.status()
		switch p.sent {
		case "SIGTERM":
			termed = append(termed, p.rank)
			how += " after SIGTERM"
		case "SIGKILL":
			killed = append(killed, p.rank)
			how += " after SIGKILL"
		}
		l.logf("rank %d %s", p.rank, how)
	}
	var did []string
	if len(termed)+len(killed) > 0 {
		did = append(did, "sent SIGTERM to "+rankList(append(slices.Clone(termed), killed...)))
	}
	if len(killed) > 0 {
		did = append(did, fmt.Sprintf("SIGKILL to %s after the %v grace period", rankList(killed), l.grace))
	}
	stopped := "no other rank was still running"
	if len(did) > 0 {
		stopped = "stopped the others: " + strings.Join(did, ", then ")
	}
	if failed != nil {
		return fmt.Errorf("rank %d of %d %s; %s", failed.rank, l.n, failed.status(), stopped)
	}
	if len(did) > 0 {
		stopped = "stopped the ranks: " + strings.Join(did, ", then ")
	} else {
		stopped = "every rank had already ended"
	}
	return fmt.Errorf("%s; %s", why, stopped)
}

// signal sends sig unless the rank has exited, remembers it, and reports whether it was sent.
func (p *rankProc) signal(sig syscall.Signal) bool {
	if p.exited {
		return false
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return false // it exited meanwhile (os.ErrProcessDone)
	}
	p.sent = map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig]
	return true
}

// flush writes what is left of the rank's output (a last line without a newline).
func (p *rankProc) flush() {
	p.out.flush()
	p.err.flush()
}

// logf writes one of launch's own lines to stderr.
func (l *launcher) logf(format string, args ...any) {
	l.stderr.writeLine([]byte("kcp launch: " + fmt.Sprintf(format, args...) + "\n"))
}

// rankList writes "rank 3" or "ranks 0, 2, 5".
func rankList(ranks []int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	if len(ranks) == 1 {
		return "rank " + s[0]
	}
	return "ranks " + strings.Join(s, ", ")
}

// lockedWriter is an output shared by every rank; each line is written whole.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (w *lockedWriter) writeLine(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.w.Write(b)
}

// prefixWriter prefixes each line of one rank's stream. One goroutine (exec's copier) writes to it;
// flush runs after the process's Wait, when that goroutine is done.
type prefixWriter struct {
	prefix string
	dst    *lockedWriter
	buf    []byte
}

// Write buffers p and writes every complete line, prefixed.
func (w *prefixWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.dst.writeLine(append([]byte(w.prefix), w.buf[:i+1]...))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) == 0 {
		w.buf = nil
	}
	return len(p), nil
}

// flush writes a last line that had no newline, adding one.
func (w *prefixWriter) flush() {
	if len(w.buf) > 0 {
		w.dst.writeLine(append(append([]byte(w.prefix), w.buf...), '\n'))
		w.buf = nil
	}
}
