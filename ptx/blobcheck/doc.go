// Package blobcheck parses and validates the kernel blobs of package ptx
// without a CUDA toolkit: PTX text (header, target, ISA version, entries and
// their parameter layouts) and cubins (ELF header, SM, entry symbols, the
// .nv.info parameter records), each against the manifest that describes it.
//
// Check runs every check on a blob directory and returns a Report whose
// failures read "BLOB: CHECK: evidence". ParsePTX and ParseCubin are the
// parsers underneath; tools/ptxgen uses them to derive and cross-check the
// manifest it writes.
package blobcheck
