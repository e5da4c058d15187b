// Command ptxcheck validates gdnkcp's kernel blobs without a CUDA toolkit.
//
//	ptxcheck [--gpu] [-v] [DIR]
//	ptxcheck --diff [-v] A B
//
// With no DIR it checks the blobs embedded in the binary (package ptx); with
// DIR it checks DIR/manifest.json and the blobs it names. Every PTX and cubin
// is checked against its manifest record (package blobcheck): header, target,
// ISA version, entries, parameter layouts, ELF identity, SM, the .nv.info
// parameter records, size and sha256. With --gpu it also loads, on every
// device present, each blob the device can run and resolves every entry.
//
// It prints one line per failure, "BLOB: CHECK: evidence", then a summary
// line, and exits 0 when every check passed, 1 when one failed, 2 on a usage
// error.
//
// With --diff it compares the code of two blob sets instead (each a directory,
// a blob tarball, or "embedded"): for every target slot both have, every
// function's cubin .text (16-byte instruction words) or PTX body, and the
// manifest's registers and spills. It prints a line per function that differs
// and exits 0 when none does, 1 when some do: which kernels a rebuild really
// changed, since every kernel is one translation unit and an edit of one file
// can move another's code.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/ptx/blobcheck"
)

const usage = `usage: ptxcheck [--gpu] [-v] [DIR]
       ptxcheck --diff [-v] A B

Checks the kernel blobs embedded in this binary, or DIR/manifest.json and the
blobs it names. Prints one line per failure (BLOB: CHECK: evidence) and a
summary; exits 0 when all checks pass, 1 otherwise.

  --gpu   also load every blob the present GPU can run and resolve its entries
  -v      print a line for every blob, passed or not, and for every GPU load
          (with --diff: for every function, the same ones too)
  --diff  compare the code of blob sets A and B (directories, .tar.gz blob
          tarballs, or "embedded") function by function; exits 1 when any
          function differs
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, newLoaderDriver))
}

// run is the command: it returns the exit code.
func run(args []string, stdout, stderr io.Writer, driver func() (gpuDriver, error)) int {
	var gpu, verbose, diff bool
	var dirs []string
	for _, a := range args {
		switch a {
		case "--gpu", "-gpu":
			gpu = true
		case "--diff", "-diff":
			diff = true
		case "-v", "--v", "--verbose":
			verbose = true
		case "-h", "-help", "--help":
			fmt.Fprint(stdout, usage)
			return 0
		default:
			if strings.HasPrefix(a, "-") {
				fmt.Fprintf(stderr, "ptxcheck: unknown flag %s\n%s", a, usage)
				return 2
			}
			dirs = append(dirs, a)
		}
	}
	if diff {
		if gpu || len(dirs) != 2 {
			fmt.Fprintf(stderr, "ptxcheck: --diff takes two blob sets (A B) and no --gpu, got %q\n%s", dirs, usage)
			return 2
		}
		return runDiff(dirs[0], dirs[1], verbose, stdout, stderr)
	}
	if len(dirs) > 1 {
		fmt.Fprintf(stderr, "ptxcheck: one DIR at most, got %q\n%s", dirs, usage)
		return 2
	}
	store := ptx.Embedded()
	if len(dirs) == 1 {
		store = ptx.Dir(dirs[0])
	}

	rep := blobcheck.Check(store)
	for _, f := range rep.Failures {
		fmt.Fprintln(stdout, f)
	}
	if verbose {
		for _, b := range rep.Blobs {
			state := "ok"
			if len(b.Failures) > 0 {
				state = fmt.Sprintf("%d failures", len(b.Failures))
			}
			fmt.Fprintf(stdout, "blob %s (%s %s, %d entries): %s\n", b.File, b.Kind, b.Target, b.Entries, state)
		}
	}
	summary := rep.Summary()
	failed := !rep.OK()

	if gpu {
		g := checkGPU(store, rep, driver)
		for _, f := range g.Failures {
			fmt.Fprintln(stdout, f)
		}
		if verbose {
			for _, l := range g.Info {
				fmt.Fprintln(stdout, l)
			}
		}
		summary += "; " + g.Summary
		failed = failed || len(g.Failures) > 0
	}
	fmt.Fprintln(stdout, summary)
	if failed {
		return 1
	}
	return 0
}
