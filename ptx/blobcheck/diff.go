package blobcheck

import (
	"bytes"
	"debug/elf"
	"fmt"
	"sort"
	"strings"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// Code states of an EntryDiff.
const (
	CodeSame    = "same"
	CodeDiffers = "differs"
	CodeOnlyA   = "only in A"
	CodeOnlyB   = "only in B"
)

// EntryDiff compares one function's code in two builds of the same target
// slot: a cubin's .text section of that name (kernel entries and any device
// function ptxas kept out of line) or a PTX file's .entry / .func body.
type EntryDiff struct {
	Target string // the manifest's target slot, e.g. sm_90a
	Name   string // the function
	Code   string // CodeSame, CodeDiffers, CodeOnlyA or CodeOnlyB
	// LenA and LenB are the code's length on each side: 16-byte instructions
	// for a cubin, lines of the body for PTX; -1 on the side that lacks it.
	LenA, LenB int
	// Changed counts the units (instruction words of a cubin: a different
	// register or scheduling bit counts; lines of PTX) of the longer side that
	// are not in a longest common subsequence of the two. 0 when Code is
	// CodeSame.
	Changed int
	// ResA and ResB are the manifest's ptxas resources for a kernel entry,
	// nil where the manifest has none (PTX, device functions, one side).
	ResA, ResB *ptx.Resources
}

// Diff compares the code of every function of every target slot two blob
// stores share, in the order of A's manifest (then the slots only B has);
// within a slot, functions are sorted by name. It reads both manifests and
// loads every blob (checking its sha256), and fails on the first that cannot
// be read or parsed. Slots present on one side only give one EntryDiff each,
// named "*".
func Diff(a, b *ptx.Store) ([]EntryDiff, error) {
	ma, err := a.Manifest()
	if err != nil {
		return nil, err
	}
	mb, err := b.Manifest()
	if err != nil {
		return nil, err
	}
	var out []EntryDiff
	seen := map[string]bool{}
	for i := range ma.Blobs {
		ba := &ma.Blobs[i]
		seen[ba.Target] = true
		bb, ok := mb.Blob(ba.Target)
		if !ok {
			out = append(out, EntryDiff{Target: ba.Target, Name: "*", Code: CodeOnlyA, LenA: -1, LenB: -1})
			continue
		}
		d, err := diffBlob(a, ba, b, bb)
		if err != nil {
			return nil, err
		}
		out = append(out, d...)
	}
	for i := range mb.Blobs {
		if !seen[mb.Blobs[i].Target] {
			out = append(out, EntryDiff{Target: mb.Blobs[i].Target, Name: "*", Code: CodeOnlyB, LenA: -1, LenB: -1})
		}
	}
	return out, nil
}

// diffBlob compares the functions of one target slot.
func diffBlob(sa *ptx.Store, ba *ptx.Blob, sb *ptx.Store, bb *ptx.Blob) ([]EntryDiff, error) {
	if ba.Kind != bb.Kind {
		return nil, fmt.Errorf("blobcheck: diff: target %s is a %s in %s and a %s in %s", ba.Target, ba.Kind, sa.Name(), bb.Kind, sb.Name())
	}
	code := func(s *ptx.Store, b *ptx.Blob) (map[string][]string, error) {
		raw, err := s.Load(b)
		if err != nil {
			return nil, err
		}
		if b.Kind == ptx.KindPTX {
			return PTXBodies(raw), nil
		}
		return CubinText(raw)
	}
	ca, err := code(sa, ba)
	if err != nil {
		return nil, fmt.Errorf("blobcheck: diff: %s %s: %w", sa.Name(), ba.File, err)
	}
	cb, err := code(sb, bb)
	if err != nil {
		return nil, fmt.Errorf("blobcheck: diff: %s %s: %w", sb.Name(), bb.File, err)
	}
	names := map[string]bool{}
	for n := range ca {
		names[n] = true
	}
	for n := range cb {
		names[n] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	res := func(b *ptx.Blob, name string) *ptx.Resources {
		if e, ok := b.Entry(name); ok {
			return e.Resources
		}
		return nil
	}
	out := make([]EntryDiff, 0, len(sorted))
	for _, n := range sorted {
		x, inA := ca[n]
		y, inB := cb[n]
		d := EntryDiff{Target: ba.Target, Name: n, LenA: -1, LenB: -1, ResA: res(ba, n), ResB: res(bb, n)}
		if inA {
			d.LenA = len(x)
		}
		if inB {
			d.LenB = len(y)
		}
		switch {
		case !inB:
			d.Code = CodeOnlyA
		case !inA:
			d.Code = CodeOnlyB
		default:
			d.Changed = changedUnits(x, y)
			d.Code = CodeSame
			if d.Changed > 0 {
				d.Code = CodeDiffers
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// changedUnits counts the units of the longer of x and y that are not in a
// longest common subsequence of the two: 0 when they are equal, and an
// inserted or removed unit counts once rather than shifting everything after
// it. It runs Myers' O((N+M)D) forward pass keeping only the furthest-reaching
// diagonals, so it needs O(N+M) memory for code of any size.
func changedUnits(x, y []string) int {
	n, m := len(x), len(y)
	maxD := n + m
	off := maxD + 1
	v := make([]int, 2*maxD+3)
	d := maxD
	for e := 0; e <= maxD; e++ {
		done := false
		for k := -e; k <= e; k += 2 {
			var i int
			if k == -e || (k != e && v[off+k-1] < v[off+k+1]) {
				i = v[off+k+1]
			} else {
				i = v[off+k-1] + 1
			}
			j := i - k
			for i < n && j < m && x[i] == y[j] {
				i++
				j++
			}
			v[off+k] = i
			if i >= n && j >= m {
				done = true
				break
			}
		}
		if done {
			d = e
			break
		}
	}
	common := (n + m - d) / 2
	return max(n, m) - common
}

// CubinText returns a cubin's .text sections by function name (the section
// name without ".text."), each split into its 16-byte instruction words (a
// trailing partial word, which no sm_70+ cubin has, is kept as a short one).
func CubinText(data []byte) (text map[string][]string, err error) {
	if _, err := ParseCubin(data); err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			text, err = nil, issuef(CheckELFHeader, "the ELF reader failed: %v", p)
		}
	}()
	f, err := elf.NewFile(versionPatch{bytes.NewReader(data)})
	if err != nil {
		return nil, issuef(CheckELFHeader, "%v", err)
	}
	text = map[string][]string{}
	for _, s := range f.Sections {
		name, ok := strings.CutPrefix(s.Name, ".text.")
		if !ok || s.Type == elf.SHT_NOBITS {
			continue
		}
		b, err := s.Data()
		if err != nil {
			return nil, issuef(CheckELFTruncated, "section %s: %v", s.Name, err)
		}
		words := make([]string, 0, (len(b)+15)/16)
		for i := 0; i < len(b); i += 16 {
			words = append(words, string(b[i:min(i+16, len(b))]))
		}
		text[name] = words
	}
	return text, nil
}

// PTXBodies returns a PTX file's function definitions (.entry and .func, with
// or without .visible / .extern / .weak) by name, each as its lines from the
// directive to the line before the next definition or the end of the file,
// with comments and trailing blanks as they are. Declarations without a body
// are kept too (a changed prototype is a change).
func PTXBodies(data []byte) map[string][]string {
	lines := strings.Split(string(data), "\n")
	out := map[string][]string{}
	name, start := "", -1
	flush := func(end int) {
		if start >= 0 {
			body := lines[start:end]
			for len(body) > 0 && strings.TrimSpace(body[len(body)-1]) == "" {
				body = body[:len(body)-1]
			}
			out[name] = append([]string(nil), body...)
		}
	}
	for i, l := range lines {
		if n, ok := ptxFuncName(l); ok {
			flush(i)
			name, start = n, i
		}
	}
	flush(len(lines))
	return out
}

// ptxFuncName reports whether a line opens a function definition or
// declaration, and its name.
func ptxFuncName(line string) (string, bool) {
	f := strings.Fields(line)
	for i, w := range f {
		switch w {
		case ".visible", ".extern", ".weak":
			continue
		case ".entry", ".func":
			if i+1 >= len(f) {
				return "", false
			}
			rest := strings.Join(f[i+1:], " ")
			if w == ".func" && strings.HasPrefix(rest, "(") { // .func (.reg .b32 r) name(...)
				if j := strings.Index(rest, ")"); j >= 0 {
					rest = strings.TrimSpace(rest[j+1:])
				}
			}
			n := rest
			if j := strings.IndexAny(n, "( ;"); j >= 0 {
				n = n[:j]
			}
			return n, n != ""
		default:
			return "", false
		}
	}
	return "", false
}
