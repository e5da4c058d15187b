package kcp

import (
	"fmt"
	"strings"

	"github.com/gdnkcp/gdnkcp/archdetect"
)

// KernelsAuto is the kernel-set name that ChooseKernels resolves for a
// device: what NewGPU runs when GPUOptions choose no kernels.
const KernelsAuto = "auto"

// KernelsCustom is what GPU.Kernels reports for kernel switches set by hand
// that are not one of KernelSets.
const KernelsCustom = "custom"

// kernelPreference is the order ChooseKernels tries the kernel sets in:
// fastest first (docs/perf-notes.md: v5 5.6 ms, mma 5.9, tc 15.4, fp32 60 ms
// for the 32K-token core forward on an H200).
var kernelPreference = []string{"v5", "mma", "tc", "fp32"}

// ChooseKernels resolves KernelsAuto for GPU device with the blob override
// blob (empty: GDNKCP_BLOB or the automatic choice, as GPUOptions.Blob):
// the first of v5, mma, tc and fp32 whose every entry the chosen blob holds
// and whose largest shared memory a block the device allows (the tensor-core
// walks take ~230 KB, which Hopper and data-centre Blackwell allow and
// Ampere does not). why says which set and, for each faster set passed
// over, the reason. When no set fits it returns "fp32": NewGPU then names
// what is missing. The error is the device detection's (no driver, no GPU,
// a bad override).
func ChooseKernels(device int, blob string) (set, why string, err error) {
	p, err := archdetect.Detect(device, archdetect.Options{Blob: blob})
	if err != nil {
		return "", "", fmt.Errorf("kcp: gpu: %w", err)
	}
	set, why = chooseKernels(p)
	return set, why, nil
}

// KernelsFor is ChooseKernels on a device already detected (archdetect.Detect
// or DetectAll): the set NewGPU runs there when GPUOptions choose none, and
// why.
func KernelsFor(p *archdetect.Profile) (set, why string) {
	if p == nil || p.Blob == nil {
		return "fp32", "auto: fp32 (no blob detected)"
	}
	return chooseKernels(p)
}

// chooseKernels is ChooseKernels on a detected profile.
func chooseKernels(p *archdetect.Profile) (string, string) {
	var passed []string
	for _, name := range kernelPreference {
		var o GPUOptions
		_ = o.SetKernels(name) // every name of kernelPreference is one SetKernels takes (tested)
		es := o.kernelSet().allEntries()
		if miss := missingEntries(p.Blob, es); len(miss) > 0 {
			passed = append(passed, fmt.Sprintf("%s: blob %s lacks %s", name, p.Target, strings.Join(miss, ", ")))
			continue
		}
		need := 0
		for _, e := range es {
			need = max(need, e.smem)
		}
		if p.SharedOptin > 0 && need > p.SharedOptin {
			passed = append(passed, fmt.Sprintf("%s: needs %d bytes of shared memory a block, %s allows %d",
				name, need, p.Name, p.SharedOptin))
			continue
		}
		if len(passed) == 0 {
			return name, fmt.Sprintf("auto: %s (the fastest set; blob %s has it and %s allows its shared memory)", name, p.Target, p.Name)
		}
		return name, fmt.Sprintf("auto: %s (passed over: %s)", name, strings.Join(passed, "; "))
	}
	return "fp32", fmt.Sprintf("auto: fp32, though no kernel set fits (%s)", strings.Join(passed, "; "))
}

// kernelSwitches are o's kernel-set switches: SetKernels' eight (SplitGrads
// modifies the v5 set and is not one of them).
func (o GPUOptions) kernelSwitches() [8]bool {
	return [8]bool{o.TensorCoreWalks, o.TensorCoreChunk, o.MMAWalks, o.MMAChunk, o.MMABackwardWalks, o.MMABackwardChunk,
		o.MMAForward5, o.MMAGroupedGrads}
}

// switchesName is the name of KernelSets whose switches o has set, or
// KernelsCustom.
func (o GPUOptions) switchesName() string {
	for _, name := range KernelSets {
		var set GPUOptions
		_ = set.setSwitches(name) // every name of KernelSets is one setSwitches takes (tested)
		if set.kernelSwitches() == o.kernelSwitches() {
			return name
		}
	}
	return KernelsCustom
}

// kernelChoice reads the kernel choice of o: the set's name, or KernelsAuto
// when o chooses none (Kernels empty or KernelsAuto, no switch set). A name
// whose switches differ from those set, and a name SetKernels does not
// take, are errors.
func (o GPUOptions) kernelChoice() (string, error) {
	none := o.kernelSwitches() == [8]bool{}
	switch {
	case o.Kernels == "" && none:
		return KernelsAuto, nil
	case o.Kernels == "":
		return o.switchesName(), nil
	}
	var set GPUOptions
	if err := set.setSwitches(o.Kernels); err != nil {
		return "", fmt.Errorf("kcp: gpu: GPUOptions.Kernels: %w", err)
	}
	if !none && set.kernelSwitches() != o.kernelSwitches() {
		return "", fmt.Errorf("kcp: gpu: GPUOptions.Kernels %q and the kernel switches set (those of %s) disagree: SetKernels sets both",
			o.Kernels, o.switchesName())
	}
	return o.Kernels, nil
}

// resolveKernels settles o's kernel choice for NewGPU on device first
// (which exists): KernelsAuto takes ChooseKernels' set. It returns o with the
// set's name in Kernels and its switches set, and why the set runs.
func (o GPUOptions) resolveKernels(first int) (GPUOptions, string, error) {
	name, err := o.kernelChoice()
	if err != nil {
		return o, "", err
	}
	why := "GPUOptions: " + name
	if name == KernelsAuto {
		if name, why, err = ChooseKernels(first, o.Blob); err != nil {
			return o, "", err
		}
	}
	if name != KernelsCustom {
		_ = o.SetKernels(name) // kernelChoice and ChooseKernels return names SetKernels takes
	}
	return o, why, nil
}
