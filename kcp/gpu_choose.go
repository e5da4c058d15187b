package kcp

import (
	"fmt"
	"strings"

	"github.com/gdnkcp/gdnkcp/archdetect"
)

// KernelsAuto is the kernel-set name that ChooseKernels resolves for a
// device; SetKernels does not take it.
const KernelsAuto = "auto"

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
