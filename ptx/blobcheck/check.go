package blobcheck

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// ManifestBlobName is the blob name of failures about the manifest as a whole.
const ManifestBlobName = ptx.ManifestName

// Check runs every offline check on a blob store: the manifest, then each
// blob it names against its manifest record.
func Check(s *ptx.Store) *Report {
	m, err := s.Manifest()
	if err != nil {
		r := &Report{Store: s.Name()}
		r.Failures = append(r.Failures, Failure{ManifestBlobName, CheckManifest, err.Error()})
		return r
	}
	return CheckFiles(s.Name(), m, s.ReadFile)
}

// CheckFiles checks a manifest and, through read, every blob it names.
// store names the blob directory in the summary.
func CheckFiles(store string, m *ptx.Manifest, read func(name string) ([]byte, error)) *Report {
	r := &Report{Store: store}
	r.Failures = append(r.Failures, manifestFailures(m)...)
	perBlob := map[int][]Failure{}
	for i := range m.Blobs {
		b := &m.Blobs[i]
		name := blobLabel(b, i)
		fs := blobManifestFailures(b, name)
		if i > 0 && len(m.Blobs[0].Entries) > 0 {
			if err := sameEntries(m.Blobs[0].Entries, b.Entries); err != nil {
				fs = append(fs, Failure{name, CheckManifest, fmt.Sprintf("entries differ from %s: %v", blobLabel(&m.Blobs[0], 0), err)})
			}
		}
		if validFileName(b.File) {
			data, err := read(b.File)
			if err != nil {
				fs = append(fs, Failure{name, CheckFile, err.Error()})
			} else {
				fs = append(fs, CheckBlob(b, data)...)
			}
		}
		perBlob[i] = fs
	}
	for i := range m.Blobs {
		b := &m.Blobs[i]
		r.Blobs = append(r.Blobs, BlobResult{File: blobLabel(b, i), Target: b.Target, Kind: b.Kind, Entries: len(b.Entries), Failures: perBlob[i]})
		r.Failures = append(r.Failures, perBlob[i]...)
	}
	return r
}

func blobLabel(b *ptx.Blob, i int) string {
	if b.File != "" {
		return b.File
	}
	if b.Target != "" {
		return "blob for " + b.Target
	}
	return fmt.Sprintf("blob %d", i)
}

func validFileName(name string) bool {
	return name != "" && name != "." && name != ".." && name != ptx.ManifestName &&
		!strings.ContainsAny(name, `/\`) && path.Clean(name) == name
}

// manifestFailures are the checks on the manifest as a whole.
func manifestFailures(m *ptx.Manifest) []Failure {
	var out []Failure
	bad := func(format string, args ...any) {
		out = append(out, Failure{ManifestBlobName, CheckManifest, fmt.Sprintf(format, args...)})
	}
	if len(m.Blobs) == 0 {
		bad("lists no blobs: a binary without kernels cannot launch anything (generator %q)", m.Generator)
		return out
	}
	targets, files := map[string]int{}, map[string]int{}
	for i, b := range m.Blobs {
		if j, ok := targets[b.Target]; ok && b.Target != "" {
			bad("blobs %d and %d both fill target %s", j, i, b.Target)
		}
		targets[b.Target] = i
		if j, ok := files[b.File]; ok && b.File != "" {
			bad("blobs %d and %d both name file %s", j, i, b.File)
		}
		files[b.File] = i
	}
	return out
}

// blobManifestFailures are the checks on one blob's manifest record.
func blobManifestFailures(b *ptx.Blob, name string) []Failure {
	var out []Failure
	bad := func(format string, args ...any) {
		out = append(out, Failure{name, CheckManifest, fmt.Sprintf(format, args...)})
	}
	if !validFileName(b.File) {
		bad("file %q is not a plain file name in the blob directory", b.File)
	}
	if b.Kind != ptx.KindCubin && b.Kind != ptx.KindPTX {
		bad("kind %q, want %s or %s", b.Kind, ptx.KindCubin, ptx.KindPTX)
	}
	if a, err := ParseArch(b.BuiltAs); err != nil {
		bad("built_as: %v", err)
	} else {
		if b.Kind == ptx.KindCubin && a.Virtual {
			bad("a cubin cannot be built as %s (a virtual architecture)", b.BuiltAs)
		}
		if b.Kind == ptx.KindPTX && !a.Virtual {
			bad("PTX is built for compute_NN, not %s", b.BuiltAs)
		}
		if err := SlotAccepts(b.Target, b.BuiltAs); err != nil {
			bad("%v", err)
		}
	}
	if len(b.SHA256) != 64 || strings.Trim(b.SHA256, "0123456789abcdef") != "" {
		bad("sha256 %q is not 64 lower-case hex digits", b.SHA256)
	}
	if b.Size <= 0 {
		bad("size %d", b.Size)
	}
	if len(b.Entries) == 0 {
		bad("lists no entries")
	}
	seen := map[string]bool{}
	for _, e := range b.Entries {
		if e.Name == "" || seen[e.Name] {
			bad("entry name %q is empty or repeated", e.Name)
		}
		seen[e.Name] = true
		if err := LayoutError(e.Params); err != nil {
			bad("entry %s: %v", e.Name, err)
		}
		if n := e.ParamBytes(); n > MaxParamBytes {
			bad("entry %s: %d parameter bytes, limit %d", e.Name, n, MaxParamBytes)
		}
		switch r := e.Resources; {
		case r != nil && b.Kind == ptx.KindPTX:
			bad("entry %s: resources on a PTX blob (ptxas reports them for cubins; PTX is assembled at load)", e.Name)
		case r != nil && (r.Registers < 0 || r.SpillStores < 0 || r.SpillLoads < 0 || r.StackFrame < 0 || r.SharedStatic < 0):
			bad("entry %s: negative resources %+v", e.Name, *r)
		}
	}
	return out
}

// sameEntries reports how two blobs' entry lists differ (every blob of one
// build has the same entries with the same parameters).
func sameEntries(want, got []ptx.Entry) error {
	names := func(es []ptx.Entry) []string {
		var n []string
		for _, e := range es {
			n = append(n, e.Name)
		}
		slices.Sort(n)
		return n
	}
	if a, b := names(want), names(got); !slices.Equal(a, b) {
		return fmt.Errorf("names %v, want %v", b, a)
	}
	for _, w := range want {
		for _, g := range got {
			if g.Name == w.Name && !slices.Equal(g.Params, w.Params) {
				return fmt.Errorf("entry %s: parameters %s, want %s", w.Name, formatParams(g.Params), formatParams(w.Params))
			}
		}
	}
	return nil
}

func formatParams(ps []ptx.Param) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, formatParam(p))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatParam(p ptx.Param) string {
	return fmt.Sprintf("%s %s size %d align %d @%d", p.Name, p.Type, p.Size, p.Align, p.Offset)
}

// CheckBlob checks one blob's bytes against its manifest record: size and
// sha256, then the PTX or cubin checks for its kind.
func CheckBlob(b *ptx.Blob, data []byte) []Failure {
	name := b.File
	var out []Failure
	if len(data) != b.Size {
		out = append(out, Failure{name, CheckSize, fmt.Sprintf("file is %d bytes, manifest says %d", len(data), b.Size)})
	}
	if got := ptx.SHA256(data); got != b.SHA256 {
		out = append(out, Failure{name, CheckSHA256, fmt.Sprintf("file hashes to %s, manifest says %s", got, b.SHA256)})
	}
	switch b.Kind {
	case ptx.KindPTX:
		out = append(out, checkPTX(b, data)...)
	case ptx.KindCubin:
		out = append(out, checkCubin(b, data)...)
	}
	return out
}

func checkPTX(b *ptx.Blob, data []byte) []Failure {
	name := b.File
	var out []Failure
	fail := func(check, format string, args ...any) {
		out = append(out, Failure{name, check, fmt.Sprintf(format, args...)})
	}
	m := ParsePTX(data)
	for _, is := range m.Issues {
		fail(is.Check, "%s", is.Evidence)
	}
	if m.Target != "" {
		min, ok := MinPTXVersion(m.Target)
		if !ok {
			fail(CheckPTXTarget, ".target %s is not allowed (want sm_80 or a newer plain target, sm_90a, sm_100a/f or sm_103a/f)", m.Target)
		}
		if a, err := ParseArch(b.BuiltAs); err == nil && m.Target != a.PTXTarget() {
			fail(CheckPTXTarget, ".target %s, but the manifest says the blob was built as %s (.target %s)", m.Target, b.BuiltAs, a.PTXTarget())
		}
		for _, o := range m.TargetOptions {
			if o != "texmode_unified" && o != "texmode_independent" {
				fail(CheckPTXTarget, ".target option %s is not allowed in a shipped blob", o)
			}
		}
		if ok && m.Version != (Version{}) && m.Version.Less(min) {
			fail(CheckPTXVersion, ".version %s is older than %s, the first PTX ISA that knows .target %s", m.Version, min, m.Target)
		}
	}
	if MaxPTXVersion.Less(m.Version) {
		fail(CheckPTXVersion, ".version %s is newer than %s, the newest the r580 (CUDA 13.0) driver compiles", m.Version, MaxPTXVersion)
	}
	exported := map[string]PTXEntry{}
	for _, e := range m.Exported() {
		if _, dup := exported[e.Name]; dup {
			fail(CheckPTXEntries, ".visible .entry %s is defined twice", e.Name)
		}
		exported[e.Name] = e
	}
	for _, e := range b.Entries {
		if _, ok := exported[e.Name]; !ok {
			fail(CheckPTXEntries, "manifest entry %s has no .visible .entry with a body", e.Name)
		}
	}
	for _, e := range m.Exported() {
		if _, ok := b.Entry(e.Name); !ok {
			fail(CheckPTXEntries, ".visible .entry %s (line %d) is not in the manifest", e.Name, e.Line)
		}
	}
	for _, want := range b.Entries {
		got, ok := exported[want.Name]
		if !ok {
			continue
		}
		if err := compareParams(got.Params, want.Params); err != nil {
			fail(CheckPTXParams, "entry %s: %v", want.Name, err)
		}
		end := 0
		for _, p := range got.Params {
			end = max(end, p.Offset+p.Size)
		}
		if end > MaxParamBytes {
			fail(CheckPTXParamBytes, "entry %s: %d parameter bytes, limit %d", want.Name, end, MaxParamBytes)
		}
		if err := ntidError(got); err != nil {
			fail(CheckPTXNTID, "entry %s: %v", want.Name, err)
		}
	}
	return out
}

func compareParams(got, want []ptx.Param) error {
	if len(got) != len(want) {
		return fmt.Errorf("PTX has %d parameters %s, manifest %d %s", len(got), formatParams(got), len(want), formatParams(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("parameter %d: PTX %s, manifest %s", i, formatParam(got[i]), formatParam(want[i]))
		}
	}
	return nil
}

func ntidError(e PTXEntry) error {
	prod := func(d []int) int {
		n := 1
		for _, v := range d {
			n *= v
		}
		return n
	}
	for _, d := range []struct {
		name string
		dims []int
	}{{".maxntid", e.MaxNTID}, {".reqntid", e.ReqNTID}} {
		for _, v := range d.dims {
			if v <= 0 {
				return fmt.Errorf("%s %v has a dimension below 1", d.name, d.dims)
			}
		}
		if d.dims != nil && prod(d.dims) > 1024 {
			return fmt.Errorf("%s %v is %d threads, more than 1024", d.name, d.dims, prod(d.dims))
		}
	}
	if e.MaxNTID != nil && e.ReqNTID != nil {
		for i := range min(len(e.MaxNTID), len(e.ReqNTID)) {
			if e.ReqNTID[i] > e.MaxNTID[i] {
				return fmt.Errorf(".reqntid %v exceeds .maxntid %v", e.ReqNTID, e.MaxNTID)
			}
		}
	}
	return nil
}

func checkCubin(b *ptx.Blob, data []byte) []Failure {
	name := b.File
	var out []Failure
	fail := func(check, format string, args ...any) {
		out = append(out, Failure{name, check, fmt.Sprintf(format, args...)})
	}
	c, err := ParseCubin(data)
	if err != nil {
		var is Issue
		if errors.As(err, &is) {
			fail(is.Check, "%s", is.Evidence)
		} else {
			fail(CheckELFHeader, "%v", err)
		}
		return out
	}
	if a, err := ParseArch(b.BuiltAs); err == nil {
		if c.SM != a.Number {
			fail(CheckELFSM, "e_flags %#x (ABI version %d) give SM %d, but the manifest says %s was built as %s (SM %d)",
				c.Flags, c.ABIVersion, c.SM, b.Target, b.BuiltAs, a.Number)
		}
		if c.PtxasArch != "" && c.PtxasArch != b.BuiltAs {
			fail(CheckCubinArch, "ptxas ran with -arch %s (.note.nv.tkinfo), manifest says built as %s", c.PtxasArch, b.BuiltAs)
		}
		if want := boolInt(a.Suffix == 'a'); c.AcceleratorTarget >= 0 && c.AcceleratorTarget != want {
			fail(CheckCubinArch, ".nv.compat accelerator-target flag is %d, want %d for %s", c.AcceleratorTarget, want, b.BuiltAs)
		}
	}
	if c.GlobalInfoErr != nil {
		fail(CheckNVInfo, "%v", c.GlobalInfoErr)
	}
	for _, e := range b.Entries {
		if _, ok := c.Entry(e.Name); !ok {
			fail(CheckCubinEntries, "manifest entry %s has no entry symbol (STT_FUNC with STO_CUDA_ENTRY)", e.Name)
		}
	}
	for _, ce := range c.Entries {
		if _, ok := b.Entry(ce.Name); !ok {
			fail(CheckCubinEntries, "entry symbol %s (symbol %d) is not in the manifest", ce.Name, ce.Symbol)
		}
	}
	for _, want := range b.Entries {
		ce, ok := c.Entry(want.Name)
		if !ok {
			continue
		}
		switch {
		case ce.TextSize < 0:
			fail(CheckCubinSections, "entry %s has no .text.%s", want.Name, want.Name)
		case ce.TextSize == 0 || ce.TextSize%16 != 0:
			fail(CheckCubinSections, "entry %s: .text.%s is %d bytes, want a positive multiple of 16", want.Name, want.Name, ce.TextSize)
		}
		if !ce.HasInfo {
			fail(CheckCubinSections, "entry %s has no .nv.info.%s", want.Name, want.Name)
		}
		if ce.Const0Size < 0 {
			fail(CheckCubinSections, "entry %s has no .nv.constant0.%s", want.Name, want.Name)
		}
		if ce.InfoErr != nil {
			fail(CheckNVInfo, "entry %s: %v", want.Name, ce.InfoErr)
			continue
		}
		if !ce.HasInfo {
			continue
		}
		if err := compareKParams(ce.Params, want.Params); err != nil {
			fail(CheckKParam, "entry %s: %v", want.Name, err)
		}
		end := want.ParamBytes()
		if len(want.Params) > 0 && ce.CBankParamSize != end {
			if ce.CBankParamSize < 0 {
				fail(CheckCBankParamSize, "entry %s has no CBANK_PARAM_SIZE record, want %d", want.Name, end)
			} else {
				fail(CheckCBankParamSize, "entry %s: CBANK_PARAM_SIZE %d, manifest parameters end at %d", want.Name, ce.CBankParamSize, end)
			}
		}
		if pc := ce.ParamCBank; pc != nil {
			if pc.Size != end {
				fail(CheckParamCBank, "entry %s: PARAM_CBANK size %d, manifest parameters end at %d", want.Name, pc.Size, end)
			}
			if want := ".nv.constant0." + want.Name; pc.Section != want {
				fail(CheckParamCBank, "entry %s: PARAM_CBANK names symbol %d in section %q, want %s", ce.Name, pc.Symbol, pc.Section, want)
			}
			if ce.Const0Size >= 0 && int64(pc.Offset+pc.Size) > ce.Const0Size {
				fail(CheckParamCBank, "entry %s: parameters at %#x+%d run past .nv.constant0 (%d bytes)", want.Name, pc.Offset, pc.Size, ce.Const0Size)
			}
		}
		if r := want.Resources; r != nil {
			if ce.Registers >= 0 && ce.Registers != r.Registers {
				fail(CheckResources, "entry %s: the cubin uses %d registers, manifest says %d", want.Name, ce.Registers, r.Registers)
			}
			if ce.FrameSize >= 0 && ce.FrameSize != r.StackFrame {
				fail(CheckResources, "entry %s: stack frame %d bytes, manifest says %d", want.Name, ce.FrameSize, r.StackFrame)
			}
		}
		if ce.Registers > 255 {
			fail(CheckResources, "entry %s uses %d registers, more than 255", want.Name, ce.Registers)
		}
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// compareKParams checks the KPARAM_INFO records against the manifest:
// ordinals 0..n-1 once each, and per ordinal the offset and size.
func compareKParams(got []KParam, want []ptx.Param) error {
	byOrd := map[int]KParam{}
	for _, k := range got {
		if _, dup := byOrd[k.Ordinal]; dup {
			return fmt.Errorf("two KPARAM_INFO records for parameter %d", k.Ordinal)
		}
		if !k.V2 && !k.InCBank {
			return fmt.Errorf("parameter %d is not in the constant bank", k.Ordinal)
		}
		byOrd[k.Ordinal] = k
	}
	if len(got) != len(want) {
		return fmt.Errorf("%d KPARAM_INFO records, manifest has %d parameters", len(got), len(want))
	}
	for i, p := range want {
		k, ok := byOrd[i]
		if !ok {
			return fmt.Errorf("no KPARAM_INFO record for parameter %d (%s)", i, p.Name)
		}
		if k.Offset != p.Offset || k.Size != p.Size {
			return fmt.Errorf("parameter %d (%s): KPARAM_INFO offset %d size %d, manifest offset %d size %d", i, p.Name, k.Offset, k.Size, p.Offset, p.Size)
		}
	}
	return nil
}
