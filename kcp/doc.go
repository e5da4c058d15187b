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
// GPU runs the same stages on the GPU, with the kernels embedded in package
// ptx, every rank of a plan in its own goroutine and stream. The ranks run
// on one GPU or on several (GPUOptions.Devices: rank r of R on
// Devices[r*len(Devices)/R], each device with its own loaded blob), and
// exchange host bytes through one of three communicators with the same code
// and bytes, so with bitwise-identical results: the in-process loopback
// (the default, also across GPUs with several ranks per GPU), NCCL over the
// ranks' GPUs (the default when every rank has a GPU of its own; the group
// is made once per backend family and kept), or a caller's communicator
// with which the backend runs one rank of the plan (one process per rank,
// under torchrun or `kcp launch`; the results then hold that rank's tokens,
// and RankDigest compares them across processes). One runner drives every
// entry point: a rank's failure aborts the group at once, so no rank hangs,
// and the *RunError names the rank that failed first and the stage each
// rank was in (GPUOptions.Timeout bounds every exchange wait, and
// GPUOptions.StageHook lets fault tests fail a rank at a stage); device
// memory is released on every path, and a backend whose NCCL group was
// aborted reports ErrReopen. Ranks sharing a GPU run side by side;
// GPUOptions.SerialRanks makes them take turns, so that each stage's time is
// one rank's work alone. Four kernel sets (KernelSets, GPUOptions.Kernels):
// fp32 on the CUDA cores, tc (WMMA tensor cores with hi/lo split products),
// mma (mma.sync) and v5 (wgmma on sm_90a, the walks on bf16 "walk planes",
// bf16 products where the output and gradients allow them); by default
// NewGPU runs the fastest set the device and its blob allow (ChooseKernels:
// v5 on Hopper). Every set keeps the fp32 states within 1e-4 of float64 and
// gives bitwise-identical results at both walk widths; with the v5 set the
// offset and tape walks, and the core stage's state walk, split between the
// widths where sched's cost model gains (GPUOptions.SingleWidth opts out),
// with the same bits.
//
// The GPU backward (docs/gpu-backward.md) runs on what a forward keeps on the
// device: GPU.Forward with GPUOptions.KeepDevice returns a GPUForward whose
// Backward (B1) uploads dO, runs dV'_local, the offset walk, the offset
// exchange and reverse compose, the tape walk, the chunk-parallel gradients,
// the l2norm backward and, in the module stage, the conv backward with its
// halo-gradient exchange and the conv weight gradient summed over the ranks
// in rank order; it may run any number of times on one forward, each with
// its own buffers, and gives the same bits each time. GPU.ForwardCheckpoint
// runs the forward and frees the device, keeping on the host each rank's
// boundary start states and conv halos; GPUCheckpoint.Recompute rebuilds the
// device state from them per rank with no communication (B3), through the
// forward's own code (upload, conv, l2norm, prep, state walk, output), so its
// intermediates and the gradients of its Backward are bitwise those of B1.
// Every walk of the forward, the recompute and the backward launches at the
// width of the plan's memo (or its split between the widths); every kernel
// sums in one fixed order per output element, with no floating-point
// atomics, so both widths give the same bits.
package kcp
