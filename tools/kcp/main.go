// Command kcp is the gdnkcp command line.
//
//	kcp plan --pack P3 --cp 8 --layout D [--arch sm_100a] [--sms 148] [--json]
//	kcp plan --docs 1000,2000,3000 --cp 4 --layout Z --arch sm_90a
//	kcp plan --all [--json]
//
// plan lays a pack of documents out over CP ranks (package kcp) and shows,
// per rank, its segments and, per walk, the width the rules A and B pick
// (package sched). Errors go to stderr with a non-zero exit status.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		fmt.Fprintf(stderr, "kcp: error: %v\n", err)
		return 1
	}
	return 0
}
