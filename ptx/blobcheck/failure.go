package blobcheck

import (
	"fmt"
	"strings"
)

// Check names, the second field of a failure line.
const (
	CheckManifest       = "manifest"         // the manifest itself is incomplete or inconsistent
	CheckFile           = "file"             // the blob cannot be read
	CheckSize           = "size"             // file size differs from the manifest
	CheckSHA256         = "sha256"           // file hash differs from the manifest
	CheckPTXText        = "ptx-text"         // not plain text, or NUL bytes other than one at the end
	CheckPTXHeader      = "ptx-header"       // .version, .target, .address_size 64 missing or out of order
	CheckPTXTarget      = "ptx-target"       // .target not allowed, or not what the manifest says was built
	CheckPTXVersion     = "ptx-version"      // .version below the target's minimum or above what the driver JITs
	CheckPTXEntries     = "ptx-entries"      // .visible .entry names differ from the manifest
	CheckPTXParams      = "ptx-params"       // an entry's .param list differs from the manifest
	CheckPTXParamBytes  = "ptx-param-bytes"  // an entry's parameters exceed the limit
	CheckPTXNTID        = "ptx-ntid"         // .maxntid / .reqntid out of range
	CheckPTXSyntax      = "ptx-syntax"       // a declaration the checker cannot read
	CheckPTXBraces      = "ptx-braces"       // unbalanced braces
	CheckPTXTruncated   = "ptx-truncated"    // text ends before the last closing brace
	CheckELFHeader      = "elf-header"       // not an ELF64 LE executable cubin, or unreadable
	CheckELFTruncated   = "elf-truncated"    // sections or headers end past the end of the file
	CheckELFMachine     = "elf-machine"      // e_machine is not EM_CUDA (190)
	CheckELFOSABI       = "elf-osabi"        // OS/ABI is not 0x33 or 0x41
	CheckELFSM          = "elf-sm"           // the SM in e_flags differs from the manifest
	CheckCubinArch      = "cubin-arch"       // ptxas -arch or the .nv.compat accelerator flag differs from built_as
	CheckCubinEntries   = "cubin-entries"    // entry symbols differ from the manifest
	CheckCubinSections  = "cubin-sections"   // an entry lacks .text.K, .nv.info.K or .nv.constant0.K
	CheckNVInfo         = "nv-info"          // a .nv.info section does not parse
	CheckKParam         = "kparam"           // KPARAM_INFO records differ from the manifest's parameters
	CheckCBankParamSize = "cbank-param-size" // CBANK_PARAM_SIZE differs from the parameter buffer end
	CheckParamCBank     = "param-cbank"      // PARAM_CBANK disagrees with the parameter size or bank
	CheckResources      = "resources"        // registers or stack frame differ from the manifest's ptxas report
	CheckGPU            = "gpu"              // loading on the present GPU failed (tools/ptxcheck --gpu)
)

// Failure is one failed check.
type Failure struct {
	Blob     string // blob file name, or manifest.json
	Check    string // one of the Check constants
	Evidence string // what was found, and what was expected
}

// String formats the failure as "BLOB: CHECK: evidence".
func (f Failure) String() string {
	return fmt.Sprintf("%s: %s: %s", f.Blob, f.Check, f.Evidence)
}

// Issue is a problem found by a parser, before the blob is compared with its
// manifest: the check it fails and the evidence.
type Issue struct {
	Check    string
	Evidence string
}

// Error formats the issue as "CHECK: evidence".
func (i Issue) Error() string { return i.Check + ": " + i.Evidence }

func issuef(check, format string, args ...any) Issue {
	return Issue{Check: check, Evidence: fmt.Sprintf(format, args...)}
}

// BlobResult is the outcome for one blob.
type BlobResult struct {
	File     string
	Target   string
	Kind     string
	Entries  int
	Failures []Failure
}

// Report is the outcome of checking a blob directory.
type Report struct {
	Store    string       // where the blobs came from
	Blobs    []BlobResult // one per manifest blob, in manifest order
	Failures []Failure    // every failure, manifest-level ones first
}

// OK reports whether every check passed.
func (r *Report) OK() bool { return r != nil && len(r.Failures) == 0 }

// Has reports whether some failure of the given blob has the given check and
// evidence containing substr.
func (r *Report) Has(blob, check, substr string) bool {
	if r == nil {
		return false
	}
	for _, f := range r.Failures {
		if f.Blob == blob && f.Check == check && strings.Contains(f.Evidence, substr) {
			return true
		}
	}
	return false
}

// Summary is the one-line outcome.
func (r *Report) Summary() string {
	if r == nil {
		return "ptxcheck: no report"
	}
	entries := 0
	for _, b := range r.Blobs {
		entries += b.Entries
	}
	if r.OK() {
		return fmt.Sprintf("ptxcheck: %s: %d blobs, %d entries: all checks passed", r.Store, len(r.Blobs), entries)
	}
	bad := 0
	for _, b := range r.Blobs {
		if len(b.Failures) > 0 {
			bad++
		}
	}
	noun := "failures"
	if len(r.Failures) == 1 {
		noun = "failure"
	}
	return fmt.Sprintf("ptxcheck: %s: %d blobs (%d failing), %d entries: %d %s", r.Store, len(r.Blobs), bad, entries, len(r.Failures), noun)
}
