package archdetect

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// CC is a compute capability, e.g. {9, 0} for Hopper.
type CC struct {
	Major, Minor int
}

// String renders "9.0".
func (c CC) String() string { return fmt.Sprintf("%d.%d", c.Major, c.Minor) }

// Less orders compute capabilities.
func (c CC) Less(o CC) bool {
	return c.Major < o.Major || c.Major == o.Major && c.Minor < o.Minor
}

// Blob slots: the targets a manifest may hold.
const (
	SlotSM90a     = "sm_90a"
	SlotSM100a    = "sm_100a"
	SlotSM103a    = "sm_103a"
	SlotSM107a    = "sm_107a" // an sm_100f family build while nvcc has no sm_107a
	SlotCompute80 = "compute_80"
)

// Slots lists every blob slot.
var Slots = []string{SlotSM90a, SlotSM100a, SlotSM103a, SlotSM107a, SlotCompute80}

// Width-rule variants (DESIGN.md §4).
const (
	VariantSM90a   = "sm_90a"
	VariantSM100a  = "sm_100a"
	VariantSM103a  = "sm_103a"
	VariantSM107a  = "sm_107a"
	VariantGeneric = "generic"
)

// MinCC is the oldest compute capability anything here runs on (the PTX
// fallback's target, compute_80).
var MinCC = CC{8, 0}

// slotBuiltAs says what each slot is built as when the manifest does not.
var slotBuiltAs = map[string]string{
	SlotSM90a:     "sm_90a",
	SlotSM100a:    "sm_100a",
	SlotSM103a:    "sm_103a",
	SlotSM107a:    "sm_100f",
	SlotCompute80: "compute_80",
}

// ccRow is what is known about one compute capability: the cubin built for
// exactly it, a family build it can load, and its width-rule variant.
type ccRow struct {
	CC      CC
	Arch    string
	Exact   string // slot of the exact cubin, or ""
	Family  string // slot of a family cubin it loads, or ""
	Variant string
}

// ccTable has one row per known compute capability. A capability not listed
// gets no exact cubin, any family build whose rule admits it, and the
// generic variant.
var ccTable = []ccRow{
	{CC{7, 5}, "Turing", "", "", VariantGeneric},
	{CC{8, 0}, "Ampere", "", "", VariantGeneric},
	{CC{8, 6}, "Ampere", "", "", VariantGeneric},
	{CC{8, 7}, "Ampere (Orin)", "", "", VariantGeneric},
	{CC{8, 9}, "Ada", "", "", VariantGeneric},
	{CC{9, 0}, "Hopper", SlotSM90a, "", VariantSM90a},
	{CC{10, 0}, "Blackwell", SlotSM100a, SlotSM107a, VariantSM100a},
	{CC{10, 3}, "Blackwell Ultra", SlotSM103a, SlotSM107a, VariantSM103a},
	{CC{10, 7}, "Blackwell", "", SlotSM107a, VariantSM107a},
	{CC{11, 0}, "Blackwell (Thor)", "", "", VariantGeneric},
	{CC{12, 0}, "Blackwell (GeForce, RTX PRO)", "", "", VariantGeneric},
	{CC{12, 1}, "Blackwell (GB10)", "", "", VariantGeneric},
}

// rowFor returns the table row for cc, or one derived from the slot rules.
func rowFor(cc CC) ccRow {
	for _, r := range ccTable {
		if r.CC == cc {
			return r
		}
	}
	r := ccRow{CC: cc, Arch: "unknown", Variant: VariantGeneric}
	for _, s := range Slots {
		if c, err := parseBuild(slotBuiltAs[s]); err == nil && c.kind == buildFamily && c.runs(cc) {
			r.Family = s
			break
		}
	}
	return r
}

// Build kinds, from the nvcc target a blob was built as.
const (
	buildExact  = iota // sm_XYa: exactly CC X.Y
	buildFamily        // sm_XYf: major X, minor >= Y
	buildSASS          // sm_XY: major X, minor >= Y
	buildPTX           // compute_XY: any CC >= X.Y
)

// build is a parsed nvcc target such as sm_100f.
type build struct {
	kind int
	cc   CC
	name string
}

var buildRE = regexp.MustCompile(`^(sm|compute)_(\d+)(\d)([af]?)$`)

// parseBuild reads an nvcc target: sm_90a, sm_100f, sm_86, compute_80.
func parseBuild(s string) (build, error) {
	m := buildRE.FindStringSubmatch(s)
	if m == nil {
		return build{}, fmt.Errorf("archdetect: %q is not an nvcc target like sm_90a, sm_100f or compute_80", s)
	}
	major, _ := strconv.Atoi(m[2])
	minor, _ := strconv.Atoi(m[3])
	b := build{cc: CC{major, minor}, name: s}
	switch {
	case m[1] == "compute" && m[4] == "":
		b.kind = buildPTX
	case m[1] == "sm" && m[4] == "a":
		b.kind = buildExact
	case m[1] == "sm" && m[4] == "f":
		b.kind = buildFamily
	case m[1] == "sm":
		b.kind = buildSASS
	default:
		return build{}, fmt.Errorf("archdetect: unsupported nvcc target %q", s)
	}
	return b, nil
}

// runs reports whether code built this way loads on a device of cc.
func (b build) runs(cc CC) bool {
	switch b.kind {
	case buildExact:
		return cc == b.cc
	case buildFamily, buildSASS:
		return cc.Major == b.cc.Major && cc.Minor >= b.cc.Minor
	case buildPTX:
		return !cc.Less(b.cc)
	}
	return false
}

// rule says in words where the build runs.
func (b build) rule() string {
	switch b.kind {
	case buildExact:
		return fmt.Sprintf("an %s cubin runs only on compute capability %s", b.name, b.cc)
	case buildFamily:
		return fmt.Sprintf("an %s family cubin runs on compute capability %d.x with minor >= %d", b.name, b.cc.Major, b.cc.Minor)
	case buildSASS:
		return fmt.Sprintf("an %s cubin runs on compute capability %d.x with minor >= %d", b.name, b.cc.Major, b.cc.Minor)
	default:
		return fmt.Sprintf("%s PTX runs on compute capability %s and newer", b.name, b.cc)
	}
}

// blobBuild returns what a manifest blob was built as: its BuiltAs, else
// the slot's default.
func blobBuild(b *ptx.Blob) (build, error) {
	as := b.BuiltAs
	if as == "" {
		as = slotBuiltAs[b.Target]
	}
	if as == "" {
		return build{}, fmt.Errorf("archdetect: blob %s says nothing of what it was built as", b.Target)
	}
	return parseBuild(as)
}

// validSlot reports whether s names a slot.
func validSlot(s string) bool {
	for _, v := range Slots {
		if v == s {
			return true
		}
	}
	return false
}
