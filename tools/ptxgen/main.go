// Command ptxgen builds the kernel blobs of package ptx from ptx/src with
// nvcc and writes them, with manifest.json, to an output directory. It runs
// where a CUDA toolkit is installed (the GPU machine); the Go binary itself
// needs no toolkit and builds with CGO_ENABLED=0.
//
//	ptxgen [-src ptx/src] [-out DIR] [-nvcc PATH] [-main gdnkcp.cu] [-sm107 auto|family|native] [-targets SLOTS]
//
// It compiles the one translation unit -main (which #includes every other
// .cu file of -src) for each target: sm_90a, sm_100a and sm_103a cubins, the
// sm_107a slot (an sm_100f family build while nvcc has no sm_107a) and
// compute_80 PTX, with -O3 -std=c++17 and without --use_fast_math. It reads
// each entry's parameter layout from the PTX, each cubin's resources from
// ptxas -v, cross-checks the layouts against every cubin's KPARAM_INFO
// records with package blobcheck, and only then writes manifest.json.
// -targets sm_90a builds that cubin and the compute_80 PTX alone: a quicker
// set to time through GDNKCP_BLOB_DIR (scripts/knob-sweep.sh), not one to
// embed (TestEmbeddedBlobsMatchSources wants every slot).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.Src, "src", "ptx/src", "directory of the CUDA sources")
	flag.StringVar(&cfg.Out, "out", "ptx/blobs", "directory to write the blobs and manifest.json to")
	flag.StringVar(&cfg.NVCC, "nvcc", "", "nvcc to run (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)")
	flag.StringVar(&cfg.Main, "main", "gdnkcp.cu", "the translation unit, inside -src, that #includes every other .cu file")
	flag.StringVar(&cfg.SM107, "sm107", "auto", "how to fill the sm_107a slot: family (an sm_100f build), native (sm_107a), or auto (native when nvcc lists sm_107)")
	flag.StringVar(&cfg.Targets, "targets", "", "build only these slots, comma-separated (e.g. sm_90a; compute_80 is always built, for the parameter layouts): quicker blobs to time with GDNKCP_BLOB_DIR, not to embed; empty: every slot")
	flag.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "limit for each nvcc run")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: ptxgen [flags]\n\nBuilds every blob of package ptx with nvcc and writes manifest.json.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "ptxgen: unexpected arguments %q\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg.Log = func(format string, args ...any) { fmt.Printf("ptxgen: "+format+"\n", args...) }
	if _, err := run(ctx, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "ptxgen: %v\n", err)
		os.Exit(1)
	}
}
