package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/ptx/blobcheck"
)

// config is what the flags set.
type config struct {
	Src, Out, NVCC, Main, SM107 string
	// Targets, comma-separated slots, limits the build to those blobs and
	// compute_80 (whose PTX gives every entry's parameter layout); empty
	// builds every slot.
	Targets string
	Timeout time.Duration
	Log     func(format string, args ...any)
}

// target is one blob to build.
type target struct {
	Slot    string   // manifest target
	Kind    string   // ptx.KindCubin or ptx.KindPTX
	BuiltAs string   // what nvcc builds
	Arch    []string // nvcc flags that choose the output and architecture
	Note    string
}

// commonFlags go on every nvcc command line. --use_fast_math is not among
// them, on purpose: the kernels keep IEEE division, square roots and expf.
var commonFlags = []string{"-O3", "-std=c++17"}

// ptxasFlags go on cubin builds to get the per-entry resource report.
var ptxasFlags = []string{"-Xptxas", "-v"}

// sm107Note explains the sm_107a slot when it holds a family build.
const sm107Note = "nvcc 13.0 has no sm_107a; this is an sm_100f family build that 10.x devices, 10.7 included, load"

// targets lists the blobs, in manifest order. native107 says whether nvcc
// can build sm_107a itself.
func targets(native107 bool) []target {
	cubin := func(arch string) target {
		return target{Slot: "sm_" + arch, Kind: ptx.KindCubin, BuiltAs: "sm_" + arch,
			Arch: []string{"-cubin", fmt.Sprintf("-gencode=arch=compute_%s,code=sm_%s", arch, arch)}}
	}
	ts := []target{cubin("90a"), cubin("100a"), cubin("103a")}
	if native107 {
		ts = append(ts, cubin("107a"))
	} else {
		ts = append(ts, target{Slot: "sm_107a", Kind: ptx.KindCubin, BuiltAs: "sm_100f",
			Arch: []string{"-cubin", "-gencode=arch=compute_100f,code=sm_100f"}, Note: sm107Note})
	}
	return append(ts, target{Slot: "compute_80", Kind: ptx.KindPTX, BuiltAs: "compute_80", Arch: []string{"-ptx", "-arch=compute_80"},
		Note: "portable PTX, JIT-compiled by the driver on compute capability 8.0 and newer"})
}

// pick keeps the targets of ts whose slot the comma-separated list names, and
// compute_80 always (the parameter layouts come from its PTX), in ts's order.
// An empty list keeps all of them; an unknown or repeated slot is an error.
func pick(ts []target, list string) ([]target, error) {
	if strings.TrimSpace(list) == "" {
		return ts, nil
	}
	want := map[string]bool{"compute_80": true}
	var known []string
	for _, t := range ts {
		known = append(known, t.Slot)
	}
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		switch {
		case !slices.Contains(known, s):
			return nil, fmt.Errorf("-targets: unknown slot %q (slots: %s)", s, strings.Join(known, ", "))
		case want[s] && s != "compute_80":
			return nil, fmt.Errorf("-targets: slot %s named twice", s)
		}
		want[s] = true
	}
	var out []target
	for _, t := range ts {
		if want[t.Slot] {
			out = append(out, t)
		}
	}
	return out, nil
}

// fileName is the blob's file name: gdnkcp.sm_90a.cubin, gdnkcp.compute_80.ptx.
func (t target) fileName(base string) string { return base + "." + t.BuiltAs + "." + t.Kind }

// flags is the nvcc command line without the input and output paths.
func (t target) flags() []string {
	f := append(append([]string{}, t.Arch...), commonFlags...)
	if t.Kind == ptx.KindCubin {
		f = append(f, ptxasFlags...)
	}
	return f
}

var reInclude = regexp.MustCompile(`(?m)^\s*#\s*include\s+"([^"]+)"`)

// sources hashes every source file of src and checks that every .cu file
// other than the main one is #included by it.
func sources(src, main string) (map[string]string, error) {
	mainText, err := os.ReadFile(filepath.Join(src, main))
	if err != nil {
		return nil, fmt.Errorf("the translation unit: %w", err)
	}
	included := map[string]bool{}
	for _, m := range reInclude.FindAllStringSubmatch(string(mainText), -1) {
		included[filepath.Clean(m[1])] = true
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return nil, err
	}
	hashes := map[string]string{}
	var missing []string
	for _, e := range ents {
		name := e.Name()
		switch filepath.Ext(name) {
		case ".cu", ".cuh", ".h", ".hpp", ".inc":
		default:
			continue
		}
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return nil, err
		}
		hashes[name] = ptx.SHA256(data)
		if filepath.Ext(name) == ".cu" && name != main && !included[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s does not #include %s: every blob must contain every entry, so every .cu file of %s goes into the one translation unit",
			main, strings.Join(missing, ", "), src)
	}
	return hashes, nil
}

// findNVCC resolves the nvcc to run.
func findNVCC(flagValue string) (string, error) {
	if flagValue != "" {
		p, err := exec.LookPath(flagValue)
		if err != nil {
			return "", fmt.Errorf("nvcc %q: %w", flagValue, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("nvcc"); err == nil {
		return p, nil
	}
	const fallback = "/usr/local/cuda/bin/nvcc"
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", errors.New("no nvcc on PATH nor at /usr/local/cuda/bin/nvcc: ptxgen runs where a CUDA toolkit is installed (pass -nvcc)")
}

// runCmd runs a command and returns its stdout and stderr.
func runCmd(ctx context.Context, timeout time.Duration, dir, name string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (limit %v)", ctx.Err(), timeout)
	}
	return stdout.String(), stderr.String(), err
}

// nvccVersion returns the "Cuda compilation tools, release X, VY" line.
func nvccVersion(ctx context.Context, cfg config, nvcc string) (string, error) {
	out, errOut, err := runCmd(ctx, cfg.Timeout, "", nvcc, "--version")
	if err != nil {
		return "", fmt.Errorf("%s --version: %v\n%s%s", nvcc, err, out, errOut)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "Cuda compilation tools") {
			return strings.TrimSpace(line), nil
		}
	}
	return "", fmt.Errorf("%s --version printed no \"Cuda compilation tools\" line:\n%s", nvcc, out)
}

// nvccHas107 reports whether nvcc lists sm_107 among its GPU codes.
func nvccHas107(ctx context.Context, cfg config, nvcc string) bool {
	out, _, err := runCmd(ctx, cfg.Timeout, "", nvcc, "--list-gpu-code")
	return err == nil && slices.Contains(strings.Fields(out), "sm_107")
}

// generator names the program that wrote the manifest, with its revision.
func generator() string {
	g := "gdnkcp tools/ptxgen"
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			g += " @" + rev
			if dirty {
				g += "+modified"
			}
		}
	}
	return g
}

// run builds every blob and writes the manifest. It returns the manifest.
func run(ctx context.Context, cfg config) (*ptx.Manifest, error) {
	logf := cfg.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if cfg.Main == "" || filepath.Base(cfg.Main) != cfg.Main || filepath.Ext(cfg.Main) != ".cu" {
		return nil, fmt.Errorf("-main %q: want a .cu file name inside -src", cfg.Main)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Minute
	}
	src, err := filepath.Abs(cfg.Src)
	if err != nil {
		return nil, err
	}
	out, err := filepath.Abs(cfg.Out)
	if err != nil {
		return nil, err
	}
	srcs, err := sources(src, cfg.Main)
	if err != nil {
		return nil, err
	}
	nvcc, err := findNVCC(cfg.NVCC)
	if err != nil {
		return nil, err
	}
	version, err := nvccVersion(ctx, cfg, nvcc)
	if err != nil {
		return nil, err
	}
	var native107 bool
	switch cfg.SM107 {
	case "family":
	case "native":
		native107 = true
	case "auto", "":
		native107 = nvccHas107(ctx, cfg, nvcc)
	default:
		return nil, fmt.Errorf("-sm107 %q: want auto, family or native", cfg.SM107)
	}
	logf("nvcc %s (%s)", nvcc, version)
	logf("sources %s: %d files, translation unit %s", src, len(srcs), cfg.Main)

	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	// A failed run must not leave an old manifest beside new blobs.
	if err := os.Remove(filepath.Join(out, ptx.ManifestName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}

	base := strings.TrimSuffix(cfg.Main, ".cu")
	all := targets(native107)
	ts, err := pick(all, cfg.Targets)
	if err != nil {
		return nil, err
	}
	if len(ts) < len(all) {
		var slots []string
		for _, t := range ts {
			slots = append(slots, t.Slot)
		}
		logf("targets %s only (-targets): this manifest is not one to embed", strings.Join(slots, ", "))
	}
	m := &ptx.Manifest{Generator: generator(), Sources: srcs}
	resources := map[string]map[string]*ptx.Resources{} // slot -> entry -> resources
	// The targets compile concurrently (each nvcc is single-threaded and a
	// translation unit takes about a minute); the manifest keeps their order.
	type built struct {
		data           []byte
		stdout, stderr string
		secs           float64
		err            error
	}
	results := make([]built, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		logf("[%d/%d] %s: nvcc %s", i+1, len(ts), t.Slot, strings.Join(t.flags(), " "))
		wg.Add(1)
		go func(i int, t target) {
			defer wg.Done()
			file := t.fileName(base)
			args := append(t.flags(), "-o", filepath.Join(out, file), filepath.Join(src, cfg.Main))
			start := time.Now()
			r := &results[i]
			r.stdout, r.stderr, r.err = runCmd(ctx, cfg.Timeout, src, nvcc, args...)
			r.secs = time.Since(start).Seconds()
			if r.err != nil {
				r.err = fmt.Errorf("%s: nvcc %s: %v\n%s%s", t.Slot, strings.Join(args, " "), r.err, r.stdout, r.stderr)
				return
			}
			if r.data, r.err = os.ReadFile(filepath.Join(out, file)); r.err != nil {
				r.err = fmt.Errorf("%s: nvcc wrote no %s: %w", t.Slot, file, r.err)
			}
		}(i, t)
	}
	wg.Wait()
	for i, t := range ts {
		r := results[i]
		if r.err != nil {
			return nil, r.err
		}
		file := t.fileName(base)
		for _, line := range strings.Split(r.stdout+r.stderr, "\n") {
			if strings.Contains(line, "warning") || strings.Contains(line, "error") {
				logf("  %s", strings.TrimSpace(line))
			}
		}
		data := r.data
		if t.Kind == ptx.KindCubin {
			res, err := parsePtxas(r.stdout + r.stderr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", t.Slot, err)
			}
			if len(res) != 1 || res[t.BuiltAs] == nil {
				return nil, fmt.Errorf("%s: ptxas -v reported %d architectures, want only %s:\n%s", t.Slot, len(res), t.BuiltAs, r.stderr)
			}
			resources[t.Slot] = res[t.BuiltAs]
		}
		m.Blobs = append(m.Blobs, ptx.Blob{Target: t.Slot, Kind: t.Kind, File: file, BuiltAs: t.BuiltAs, Note: t.Note,
			NVCC: version, Flags: t.flags(), SHA256: ptx.SHA256(data), Size: len(data)})
		logf("[%d/%d] %s: %s, %d bytes, %.1fs", i+1, len(ts), t.Slot, file, len(data), r.secs)
	}

	// The parameter layouts come from the PTX.
	pb, ok := m.Blob("compute_80")
	if !ok {
		return nil, errors.New("no compute_80 PTX was built")
	}
	text, err := os.ReadFile(filepath.Join(out, pb.File))
	if err != nil {
		return nil, err
	}
	mod := blobcheck.ParsePTX(text)
	if len(mod.Issues) > 0 {
		var lines []string
		for _, is := range mod.Issues {
			lines = append(lines, "  "+is.Error())
		}
		return nil, fmt.Errorf("%s does not parse:\n%s", pb.File, strings.Join(lines, "\n"))
	}
	var entries []ptx.Entry
	for _, e := range mod.Exported() {
		entries = append(entries, ptx.Entry{Name: e.Name, Params: e.Params})
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%s has no .visible .entry: are the kernels extern \"C\" __global__?", pb.File)
	}
	slices.SortFunc(entries, func(a, b ptx.Entry) int { return strings.Compare(a.Name, b.Name) })
	for i := range m.Blobs {
		b := &m.Blobs[i]
		for _, e := range entries {
			e.Params = slices.Clone(e.Params)
			if b.Kind == ptx.KindCubin {
				r, ok := resources[b.Target][e.Name]
				if !ok {
					return nil, fmt.Errorf("%s: ptxas -v reported nothing for entry %s", b.Target, e.Name)
				}
				rc := *r
				e.Resources = &rc
			}
			b.Entries = append(b.Entries, e)
		}
	}
	for _, e := range entries {
		logf("entry %s: %d parameters, %d bytes", e.Name, len(e.Params), e.ParamBytes())
		for _, b := range m.Blobs {
			if be, _ := b.Entry(e.Name); be.Resources != nil {
				r := be.Resources
				logf("  %-10s %3d registers, %d spill stores, %d spill loads, %d bytes stack, %d bytes static shared",
					b.Target, r.Registers, r.SpillStores, r.SpillLoads, r.StackFrame, r.SharedStatic)
			}
		}
	}

	// Cross-check everything, cubin KPARAM_INFO records against the PTX
	// layouts included, before the manifest is written.
	rep := blobcheck.CheckFiles(out, m, func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(out, name)) })
	if !rep.OK() {
		var lines []string
		for _, f := range rep.Failures {
			lines = append(lines, "  "+f.String())
		}
		if raw, err := json.MarshalIndent(m, "", "  "); err == nil {
			_ = os.WriteFile(filepath.Join(out, "manifest.rejected.json"), append(raw, '\n'), 0o644)
		}
		return nil, fmt.Errorf("the built blobs fail their checks (manifest.rejected.json written for inspection):\n%s\n%s", strings.Join(lines, "\n"), rep.Summary())
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, ptx.ManifestName), append(raw, '\n'), 0o644); err != nil {
		return nil, err
	}
	_ = os.Remove(filepath.Join(out, "manifest.rejected.json"))
	logf("wrote %s: %d blobs, %d entries each; %s", filepath.Join(out, ptx.ManifestName), len(m.Blobs), len(entries), rep.Summary())
	return m, nil
}
