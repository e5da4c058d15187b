// Package archdetect says which GPU is present and what to load on it.
//
// For each device it builds a Profile: compute capability, SM count, name,
// memory, the blob chosen from the ptx manifest and why, and the width-rule
// variant (sm_90a, sm_100a, sm_103a, sm_107a or generic) that package sched
// uses. The choice is: the exact cubin for the compute capability if the
// manifest has it, else a family build the device can load, else the
// compute_80 PTX fallback, else an error naming the device. A blob can be
// forced with Options.Blob or the GDNKCP_BLOB environment variable, e.g.
// GDNKCP_BLOB=compute_80 to run the portable path on an H200.
//
// ProfileFor is the pure decision (no GPU needed); Detect and DetectAll ask
// the driver through package loader; Load loads the chosen blob and hands
// out kernels whose signatures come from the manifest. NVMLInfo reports
// NVML's view (driver version, architecture, MIG mode) in cgo builds,
// without creating a CUDA context.
package archdetect
