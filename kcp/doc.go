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
// On the plan run the backends. CPU is the float64 reference backend: it
// runs every rank's stages exactly as the GPU will (chunk prep, summary walk,
// all-gather of the summaries through an in-process communicator, compose,
// state walk, output; offset walk, reverse compose, tape walk, chunk-parallel
// gradients; the conv1d + SiLU module with its halo exchange), at the widths
// the plan decides. Forward keeps what the backward needs (upstream's B1);
// ForwardCheckpoint returns a handle whose Recompute rebuilds the activations
// with no communication (B3). Reference computes the same layer with the naive
// token-by-token recurrence, for checking.
//
// GPU is the forward on the GPU (the backward is not built yet): the same
// stages as the CPU backend, with the kernels embedded in package ptx, every
// rank of a plan on one GPU in its own goroutine and stream, exchanging
// through the loopback communicator via host memory. Two kernel sets: fp32
// on the CUDA cores (the default) and the tensor cores with hi/lo split
// products (GPUOptions.TensorCoreWalks, TensorCoreChunk); both keep the fp32
// states within 1e-5 of float64 and give bitwise-identical results at both
// walk widths.
package kcp
