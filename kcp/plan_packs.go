package kcp

import (
	"fmt"
	"slices"
	"strings"
)

// Pack is a named batch of documents.
type Pack struct {
	Name   string `json:"name"`   // P1..P5
	Tokens int    `json:"tokens"` // total tokens, the sum of Docs
	Docs   []int  `json:"docs"`   // document lengths in tokens, in pack order
}

// packs are the five packs of the upstream benchmark (reference/seed-pr.md).
// testdata/packs.json is written from this table (TestPacksFile checks it).
var packs = []Pack{
	{"P1", 241817, []int{61440, 17953, 45056, 8192, 73728, 35448}},
	{"P2", 261987, []int{131072, 65536, 65379}},
	{"P3", 259174, []int{200000, 59174}},
	{"P4", 254976, []int{254976}}, // one document spans the whole group
	{"P5", 249856, []int{98304, 65536, 53248, 32768}},
}

// Packs returns the five packs of the upstream benchmark, P1..P5 (fresh
// copies).
func Packs() []Pack {
	out := make([]Pack, len(packs))
	for i, p := range packs {
		out[i] = Pack{p.Name, p.Tokens, slices.Clone(p.Docs)}
	}
	return out
}

// PackByName returns the pack named name ("P3" or "p3").
func PackByName(name string) (Pack, error) {
	for _, p := range Packs() {
		if strings.EqualFold(p.Name, strings.TrimSpace(name)) {
			return p, nil
		}
	}
	names := make([]string, len(packs))
	for i, p := range packs {
		names[i] = p.Name
	}
	return Pack{}, fmt.Errorf("kcp: unknown pack %q (known: %s)", name, strings.Join(names, ", "))
}
