// Package ptx holds the CUDA kernels of gdnkcp as prebuilt blobs embedded in
// the binary: one cubin per exact target (sm_90a, sm_100a, sm_103a), the
// sm_107a slot (an sm_100f family build until a toolkit knows sm_107a) and a
// compute_80 PTX fallback that the driver compiles at load time.
//
// The sources live in ptx/src and are built by tools/ptxgen, which also writes
// blobs/manifest.json: for every blob its target, what it was built as, the
// toolkit, the flags, the entries with their parameter layouts, and a sha256.
// This package imports nothing of gdnkcp's.
package ptx
