package main

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gdnkcp/gdnkcp/ptx"
	"github.com/gdnkcp/gdnkcp/ptx/blobcheck"
)

// runDiff is ptxcheck --diff A B: which functions' code differs between two
// blob sets (directories, blob tarballs such as scripts/knob-sweep.sh brings
// back, or "embedded"). It prints one line per function that differs (every
// function with verbose) and a summary, and returns 0 when none differs, 1
// when some do, 2 when a set cannot be read.
func runDiff(a, b string, verbose bool, stdout, stderr io.Writer) int {
	var cleanup []string
	defer func() {
		for _, d := range cleanup {
			os.RemoveAll(d)
		}
	}()
	open := func(arg string) (*ptx.Store, error) {
		if arg == "embedded" {
			return ptx.Embedded(), nil
		}
		if strings.HasSuffix(arg, ".tar.gz") || strings.HasSuffix(arg, ".tgz") || strings.HasSuffix(arg, ".tar") {
			dir, err := os.MkdirTemp("", "ptxcheck-diff-")
			if err != nil {
				return nil, err
			}
			cleanup = append(cleanup, dir)
			root, err := untar(arg, dir)
			if err != nil {
				return nil, err
			}
			return ptx.Dir(root), nil
		}
		st, err := os.Stat(arg)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("%s: not a directory, a .tar(.gz) or \"embedded\"", arg)
		}
		return ptx.Dir(arg), nil
	}
	sa, err := open(a)
	if err != nil {
		fmt.Fprintf(stderr, "ptxcheck: --diff: A: %v\n", err)
		return 2
	}
	sb, err := open(b)
	if err != nil {
		fmt.Fprintf(stderr, "ptxcheck: --diff: B: %v\n", err)
		return 2
	}
	diffs, err := blobcheck.Diff(sa, sb)
	if err != nil {
		fmt.Fprintf(stderr, "ptxcheck: --diff: %v\n", err)
		return 2
	}
	byTarget := map[string]int{}
	var order []string
	n := 0
	for _, d := range diffs {
		if d.Code != blobcheck.CodeSame {
			n++
			if byTarget[d.Target] == 0 {
				order = append(order, d.Target)
			}
			byTarget[d.Target]++
		}
		if d.Code != blobcheck.CodeSame || verbose {
			fmt.Fprintln(stdout, diffLine(d))
		}
	}
	sort.Strings(order)
	parts := make([]string, 0, len(order))
	for _, t := range order {
		parts = append(parts, fmt.Sprintf("%s %d", t, byTarget[t]))
	}
	detail := ""
	if len(parts) > 0 {
		detail = " (" + strings.Join(parts, ", ") + ")"
	}
	fmt.Fprintf(stdout, "ptxcheck: --diff %s %s: %d of %d functions differ%s\n", sa.Name(), sb.Name(), n, len(diffs), detail)
	if n > 0 {
		return 1
	}
	return 0
}

// diffLine formats one function's comparison.
func diffLine(d blobcheck.EntryDiff) string {
	unit := "instructions"
	if strings.HasPrefix(d.Target, "compute_") {
		unit = "lines"
	}
	var s string
	switch d.Code {
	case blobcheck.CodeSame:
		s = fmt.Sprintf("%s %s: same (%d %s)", d.Target, d.Name, d.LenA, unit)
	case blobcheck.CodeDiffers:
		s = fmt.Sprintf("%s %s: differs, %d of %d %s (%d -> %d)", d.Target, d.Name, d.Changed, max(d.LenA, d.LenB), unit, d.LenA, d.LenB)
	default:
		s = fmt.Sprintf("%s %s: %s", d.Target, d.Name, d.Code)
	}
	if d.ResA != nil && d.ResB != nil {
		s += fmt.Sprintf("; registers %d -> %d, spill stores %d -> %d", d.ResA.Registers, d.ResB.Registers, d.ResA.SpillStores, d.ResB.SpillStores)
	}
	return s
}

// untar extracts a blob tarball into dir and returns the folder that holds its
// manifest.json (the tarball's root or one folder down).
func untar(path, dir string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var r io.Reader = f
	if !strings.HasSuffix(path, ".tar") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	tr := tar.NewReader(r)
	root := ""
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return "", fmt.Errorf("%s: entry %q leaves the archive", path, h.Name)
		}
		target := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return "", err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return "", err
			}
			out, err := os.Create(target)
			if err != nil {
				return "", err
			}
			_, cerr := io.Copy(out, tr)
			if err := out.Close(); cerr == nil {
				cerr = err
			}
			if cerr != nil {
				return "", fmt.Errorf("%s: %s: %w", path, h.Name, cerr)
			}
			if filepath.Base(name) == ptx.ManifestName && (root == "" || len(filepath.Dir(target)) < len(root)) {
				root = filepath.Dir(target)
			}
		}
	}
	if root == "" {
		return "", fmt.Errorf("%s: no %s inside", path, ptx.ManifestName)
	}
	return root, nil
}
