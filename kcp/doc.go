// Package kcp is the public API of gdnkcp: deterministic context-parallel
// Gated DeltaNet training over a packed batch of documents.
//
// Today it holds the plan (DESIGN.md §3): NewPlan cuts a pack of documents
// over R ranks in one of three layouts (C contiguous, Z whole-buffer zigzag,
// D per-document zigzag), and lays out, for every rank, its parts, its
// segments with their chunk counts, each segment's place in its document's
// chain, the source of its conv halo, and the four walk lists (summary, state,
// offset, tape). The width of every walk launch (package sched) is decided
// once per walk list and memoized in the plan (Plan.Width, Plan.Decisions),
// so the forward, the checkpoint recompute and the replay read one decision.
// Packs returns the five packs of the upstream benchmark.
//
// The forward, checkpoint recompute, replay and backward, with a CPU
// reference backend and a GPU backend, build on the plan and come later.
package kcp
