package main

import (
	"fmt"
	"strings"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/ptx/blobcheck"
)

// gpuDevice is one CUDA device as --gpu sees it.
type gpuDevice struct {
	Ordinal      int
	Name         string
	Major, Minor int
}

// String names the device for failure lines.
func (d gpuDevice) String() string {
	return fmt.Sprintf("device %d (%s, %d.%d)", d.Ordinal, d.Name, d.Major, d.Minor)
}

// gpuEntry is what the driver reports about one resolved entry.
type gpuEntry struct {
	Name      string
	Registers int
}

// gpuDriver is what --gpu needs from a CUDA driver binding. The real one is
// package loader (loader.go); tests use a fake.
type gpuDriver interface {
	// Devices lists the devices with their compute capability.
	Devices() ([]gpuDevice, error)
	// Load loads image on the device (PTX is NUL-terminated by the driver
	// binding), resolves every entry by name, checks each entry's parameter
	// layout, and unloads it. A failed load's error carries the JIT log.
	Load(dev gpuDevice, image []byte, entries []ptx.Entry) ([]gpuEntry, error)
	// Close releases what the driver holds.
	Close() error
}

// gpuResult is the outcome of the --gpu checks.
type gpuResult struct {
	Failures []blobcheck.Failure
	Info     []string // one line per load or skip
	Summary  string
}

// checkGPU loads, on each distinct compute capability present, every blob
// that the device can run and that passed the offline checks.
func checkGPU(store *ptx.Store, rep *blobcheck.Report, newDriver func() (gpuDriver, error)) gpuResult {
	var g gpuResult
	fail := func(blob, format string, args ...any) {
		g.Failures = append(g.Failures, blobcheck.Failure{Blob: blob, Check: blobcheck.CheckGPU, Evidence: fmt.Sprintf(format, args...)})
	}
	drv, err := newDriver()
	if err != nil {
		fail("driver", "no CUDA driver: %v (--gpu needs a machine with a GPU and its driver)", err)
		g.Summary = "gpu: no driver"
		return g
	}
	defer func() {
		if err := drv.Close(); err != nil {
			fail("driver", "release: %v", err)
		}
	}()
	devs, err := drv.Devices()
	if err != nil {
		fail("driver", "list devices: %v", err)
		g.Summary = "gpu: no devices"
		return g
	}
	if len(devs) == 0 {
		fail("driver", "the driver sees no CUDA device")
		g.Summary = "gpu: no devices"
		return g
	}
	m, err := store.Manifest()
	if err != nil {
		fail(blobcheck.ManifestBlobName, "%v", err)
		g.Summary = "gpu: no manifest"
		return g
	}
	badOffline := map[string]bool{}
	for _, b := range rep.Blobs {
		if len(b.Failures) > 0 {
			badOffline[b.File] = true
		}
	}

	seen := map[[2]int]bool{}
	var parts []string
	for _, d := range devs {
		cc := [2]int{d.Major, d.Minor}
		if seen[cc] {
			g.Info = append(g.Info, fmt.Sprintf("gpu: %s: same compute capability as a device already checked", d))
			continue
		}
		seen[cc] = true
		var loaded []string
		entries, runnable := 0, 0
		for i := range m.Blobs {
			b := &m.Blobs[i]
			ok, why := blobcheck.Runs(b.BuiltAs, d.Major, d.Minor)
			if !ok {
				g.Info = append(g.Info, fmt.Sprintf("gpu: %s: skip %s: %s", d, b.File, why))
				continue
			}
			runnable++
			if badOffline[b.File] {
				fail(b.File, "%s: not loaded: it failed the offline checks", d)
				continue
			}
			data, err := store.Load(b)
			if err != nil {
				fail(b.File, "%s: %v", d, err)
				continue
			}
			got, err := drv.Load(d, data, b.Entries)
			if err != nil {
				fail(b.File, "%s: %s", d, oneLine(err.Error()))
				continue
			}
			resolved := map[string]gpuEntry{}
			for _, e := range got {
				resolved[e.Name] = e
			}
			for _, e := range b.Entries {
				ge, ok := resolved[e.Name]
				if !ok {
					fail(b.File, "%s: entry %s was not resolved", d, e.Name)
					continue
				}
				entries++
				if e.Resources != nil && b.Kind == ptx.KindCubin && ge.Registers != e.Resources.Registers {
					fail(b.File, "%s: entry %s: the driver reports %d registers, manifest says %d", d, e.Name, ge.Registers, e.Resources.Registers)
				}
			}
			loaded = append(loaded, b.File)
			g.Info = append(g.Info, fmt.Sprintf("gpu: %s: loaded %s (%s), %d entries resolved", d, b.File, why, len(got)))
		}
		if runnable == 0 {
			fail("driver", "%s: no blob of the manifest runs on compute capability %d.%d", d, d.Major, d.Minor)
		}
		parts = append(parts, fmt.Sprintf("%s: %d blobs loaded [%s], %d entries resolved", d, len(loaded), strings.Join(loaded, " "), entries))
	}
	g.Summary = "gpu: " + strings.Join(parts, "; ")
	return g
}

// oneLine folds a multi-line error (a JIT log) into one failure line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " | ")), " ")
}
