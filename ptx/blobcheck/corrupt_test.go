package blobcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// sectionRange returns the file offset and size of a cubin section.
func sectionRange(t *testing.T, data []byte, name string) (int, int) {
	t.Helper()
	f, err := elf.NewFile(versionPatch{bytes.NewReader(data)})
	require.NoError(t, err)
	s := f.Section(name)
	require.NotNil(t, s, name)
	return int(s.Offset), int(s.Size)
}

// symbolOffset returns the file offset of the named symbol's Elf64_Sym.
func symbolOffset(t *testing.T, data []byte, name string) int {
	t.Helper()
	f, err := elf.NewFile(versionPatch{bytes.NewReader(data)})
	require.NoError(t, err)
	syms, err := f.Symbols()
	require.NoError(t, err)
	st := f.Section(".symtab")
	for i, s := range syms {
		if s.Name == name {
			return int(st.Offset) + (i+1)*24
		}
	}
	t.Fatalf("no symbol %s", name)
	return 0
}

// findRecord returns the offset in data of the first .nv.info record of the
// given attribute inside the named section.
func findRecord(t *testing.T, data []byte, section string, attr byte, match func(NVInfoRecord) bool) int {
	t.Helper()
	off, size := sectionRange(t, data, section)
	recs, err := ParseNVInfo(data[off : off+size])
	require.NoError(t, err)
	for _, r := range recs {
		if r.Attr == attr && (match == nil || match(r)) {
			return off + r.Offset
		}
	}
	t.Fatalf("no record %#x in %s", attr, section)
	return 0
}

func replaceOnce(t *testing.T, data []byte, old, new string) []byte {
	t.Helper()
	require.Equal(t, 1, bytes.Count(data, []byte(old)), "want exactly one %q", old)
	return bytes.Replace(data, []byte(old), []byte(new), 1)
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// renameSection changes a section's name inside .shstrtab (same length).
func renameSection(t *testing.T, data []byte, old, new string) []byte {
	t.Helper()
	require.Len(t, new, len(old))
	off, size := sectionRange(t, data, ".shstrtab")
	d := clone(data)
	tab := d[off : off+size]
	i := bytes.Index(tab, []byte("\x00"+old+"\x00"))
	require.GreaterOrEqual(t, i, 0, old)
	copy(tab[i+1:], new)
	return d
}

const (
	ptx80  = "probe.compute_80.ptx"
	ptx90a = "probe.sm_90a.ptx"
	cub90  = "probe.sm_90a.cubin"
	cub100 = "probe.sm_100a.cubin"
	cub107 = "probe.sm_100f.cubin"
)

type corruption struct {
	name string
	// file, when set, is rewritten by edit and the manifest's size and hash
	// follow it, so that only the content check can catch the change.
	file string
	edit func(t *testing.T, data []byte) []byte
	// raw, when set, changes the file or the manifest without fixing hashes.
	raw func(t *testing.T, m *ptx.Manifest, files map[string][]byte)
	// want is the failure that must be reported; empty for a change that
	// must pass.
	blob, check, evidence string
	// others is set when the change rightly makes other blobs fail too.
	others bool
}

var corruptions = []corruption{
	// PTX.
	{name: "truncated PTX", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return d[:len(d)-200] },
		blob: ptx80, check: CheckPTXTruncated, evidence: "the text ends with"},
	{name: "truncated PTX inside a comment", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return append(clone(d), "\n/* cut"...) },
		blob: ptx80, check: CheckPTXTruncated, evidence: "never closed"},
	{name: "wrong .target for the slot", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return replaceOnce(t, d, ".target sm_80", ".target sm_90a") },
		blob: ptx80, check: CheckPTXTarget, evidence: ".target sm_90a, but the manifest says the blob was built as compute_80 (.target sm_80)"},
	{name: ".target not allowed", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return replaceOnce(t, d, ".target sm_80", ".target sm_75") },
		blob: ptx80, check: CheckPTXTarget, evidence: ".target sm_75 is not allowed"},
	{name: ".target debug option", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return replaceOnce(t, d, ".target sm_80", ".target sm_80, debug") },
		blob: ptx80, check: CheckPTXTarget, evidence: "option debug"},
	{name: ".version newer than the driver", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return replaceOnce(t, d, ".version 9.0", ".version 9.1") },
		blob: ptx80, check: CheckPTXVersion, evidence: ".version 9.1 is newer than 9.0"},
	{name: ".version older than the target", file: ptx90a, edit: func(t *testing.T, d []byte) []byte { return replaceOnce(t, d, ".version 9.0", ".version 7.8") },
		blob: ptx90a, check: CheckPTXVersion, evidence: ".version 7.8 is older than 8.0, the first PTX ISA that knows .target sm_90a"},
	{name: "header out of order", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, ".version 9.0\n.target sm_80\n", ".target sm_80\n.version 9.0\n")
	}, blob: ptx80, check: CheckPTXHeader, evidence: "want .version first"},
	{name: "32-bit addresses", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return replaceOnce(t, d, ".address_size 64", ".address_size 32") },
		blob: ptx80, check: CheckPTXHeader, evidence: ".address_size at line 11 is \"32\", want 64"},
	{name: "missing .address_size", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return replaceOnce(t, d, ".address_size 64", "") },
		blob: ptx80, check: CheckPTXHeader, evidence: "missing .address_size"},
	{name: "missing entry in PTX", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, ".visible .entry probe_axpy(", ".visible .entry probe_axpz(")
	}, blob: ptx80, check: CheckPTXEntries, evidence: "manifest entry probe_axpy has no .visible .entry with a body"},
	{name: "entry only a prototype", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		i := bytes.Index(d, []byte("\t// .globl\tprobe_mixed"))
		require.Positive(t, i)
		return append(clone(d[:i]), ".visible .entry probe_mixed(.param .u64 a);\n"...)
	}, blob: ptx80, check: CheckPTXEntries, evidence: "manifest entry probe_mixed has no .visible .entry with a body"},
	{name: "extra entry in PTX", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return append(clone(d), "\n.visible .entry probe_extra(\n\t.param .u32 probe_extra_param_0\n)\n{\n\tret;\n}\n"...)
	}, blob: ptx80, check: CheckPTXEntries, evidence: ".visible .entry probe_extra (line"},
	{name: "changed parameter size in PTX", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, ".param .u32 probe_axpy_param_3", ".param .u64 probe_axpy_param_3")
	}, blob: ptx80, check: CheckPTXParams, evidence: "entry probe_axpy: parameter 3: PTX probe_axpy_param_3 u64 size 8 align 8 @24, manifest probe_axpy_param_3 u32 size 4 align 4 @20"},
	{name: "changed struct alignment in PTX", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, ".param .align 8 .b8 probe_mixed_param_2[16]", ".param .align 4 .b8 probe_mixed_param_2[16]")
	}, blob: ptx80, check: CheckPTXParams, evidence: "parameter 2: PTX probe_mixed_param_2 b8 size 16 align 4 @16"},
	{name: "dropped parameter in PTX", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, ",\n\t.param .u32 probe_axpy_param_3", "")
	}, blob: ptx80, check: CheckPTXParams, evidence: "PTX has 3 parameters"},
	{name: "too many parameter bytes", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, ".param .align 8 .b8 probe_mixed_param_2[16]", ".param .align 8 .b8 probe_mixed_param_2[5000]")
	}, blob: ptx80, check: CheckPTXParamBytes, evidence: "entry probe_mixed: 5040 parameter bytes, limit 4096"},
	{name: "unbalanced brace", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, "$L__BB0_2:\n\tret;\n\n}", "$L__BB0_2:\n\tret;\n\n")
	}, blob: ptx80, check: CheckPTXBraces, evidence: "1 { never closed"},
	{name: "stray closing brace", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return append(clone(d), "}\n"...) },
		blob: ptx80, check: CheckPTXBraces, evidence: "closes nothing"},
	{name: "NUL inside the text", file: ptx80, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[100] = 0; return d },
		blob: ptx80, check: CheckPTXText, evidence: "NUL byte at offset 100"},
	{name: "binary junk", file: ptx80, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[300] = 0x01; return d },
		blob: ptx80, check: CheckPTXText, evidence: "control byte 0x01 at offset 300"},
	{name: "maxntid too large", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return replaceOnce(t, d, "\t.param .u32 probe_axpy_param_3\n)\n", "\t.param .u32 probe_axpy_param_3\n)\n.maxntid 2048, 1, 1\n")
	}, blob: ptx80, check: CheckPTXNTID, evidence: ".maxntid [2048 1 1] is 2048 threads"},
	{name: "one NUL at the end is fine", file: ptx80, edit: func(t *testing.T, d []byte) []byte { return append(clone(d), 0) }},
	{name: "comments and trailing whitespace are fine", file: ptx80, edit: func(t *testing.T, d []byte) []byte {
		return append(clone(d), "\n// } trailing comment\n/* { */\n\n"...)
	}},
	{name: "pointer qualifiers are fine", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		d := replaceOnce(t, files[ptx80], ".param .u64 probe_axpy_param_0", ".param .u64 .ptr .global .align 16 probe_axpy_param_0")
		files[ptx80] = d
		m.Blobs[4].SHA256, m.Blobs[4].Size = ptx.SHA256(d), len(d)
	}},

	// Every blob.
	{name: "flipped byte", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		off, _ := sectionRange(t, files[cub90], ".text.probe_axpy")
		d := clone(files[cub90])
		d[off+5] ^= 0x40
		files[cub90] = d
	}, blob: cub90, check: CheckSHA256, evidence: "manifest says " + "%sha"},
	{name: "stale hash in the manifest", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[1].SHA256 = ptx.SHA256([]byte("an older build"))
	}, blob: cub100, check: CheckSHA256, evidence: "manifest says " + ptx.SHA256([]byte("an older build"))},
	{name: "wrong size in the manifest", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) { m.Blobs[4].Size++ },
		blob: ptx80, check: CheckSize, evidence: "file is 2937 bytes, manifest says 2938"},
	{name: "missing file", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) { delete(files, cub100) },
		blob: cub100, check: CheckFile, evidence: "file does not exist"},

	// cubin.
	{name: "truncated cubin", file: cub90, edit: func(t *testing.T, d []byte) []byte { return d[:len(d)/2] },
		blob: cub90, check: CheckELFTruncated, evidence: "file is 3204 bytes"},
	{name: "section headers at an offset that wraps", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		binary.LittleEndian.PutUint64(d[0x28:], ^uint64(0)) // e_shoff 2^64 - 1: offset + size wraps to below the file size
		return d
	}, blob: cub90, check: CheckELFTruncated, evidence: "section headers (20 of 64 bytes at 18446744073709551615) run past its end"},
	{name: "program headers at an offset that wraps", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		binary.LittleEndian.PutUint64(d[0x20:], ^uint64(0)-63) // e_phoff
		return d
	}, blob: cub90, check: CheckELFTruncated, evidence: "program headers (5 of 56 bytes at 18446744073709551552) run past its end"},
	{name: "cubin cut inside the header", file: cub90, edit: func(t *testing.T, d []byte) []byte { return d[:40] },
		blob: cub90, check: CheckELFTruncated, evidence: "file is 40 bytes, an ELF64 header needs 64"},
	{name: "not an ELF", file: cub90, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[1] = 'X'; return d },
		blob: cub90, check: CheckELFHeader, evidence: "magic 7f 58 4c 46"},
	{name: "32-bit ELF", file: cub90, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[4] = 1; return d },
		blob: cub90, check: CheckELFHeader, evidence: "class ELFCLASS32"},
	{name: "relocatable cubin", file: cub90, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[0x10] = 1; return d },
		blob: cub90, check: CheckELFHeader, evidence: "type ET_REL"},
	{name: "wrong e_machine", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		binary.LittleEndian.PutUint16(d[0x12:], 62) // x86-64
		return d
	}, blob: cub90, check: CheckELFMachine, evidence: "e_machine 62, want 190"},
	{name: "wrong OS/ABI", file: cub90, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[7] = 0; return d },
		blob: cub90, check: CheckELFOSABI, evidence: "OS/ABI 0x00"},
	{name: "old OS/ABI 0x33 is fine", file: cub90, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[7] = 0x33; return d }},
	{name: "toolkit version in e_version is fine", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		binary.LittleEndian.PutUint32(d[0x14:], 0x82)
		return d
	}},
	{name: "wrong SM in e_flags", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		binary.LittleEndian.PutUint32(d[0x30:], 0x06006402) // sm_100 flags
		return d
	}, blob: cub90, check: CheckELFSM, evidence: "e_flags 0x6006402 (ABI version 8) give SM 100, but the manifest says sm_90a was built as sm_90a (SM 90)"},
	{name: "SM read by the V1 layout", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		d[8] = 7 // ABI version 7: SM in bits 0-7, here 0x04
		return d
	}, blob: cub90, check: CheckELFSM, evidence: "ABI version 7) give SM 4"},
	{name: "unknown ABI version", file: cub90, edit: func(t *testing.T, d []byte) []byte { d = clone(d); d[8] = 9; return d },
		blob: cub90, check: CheckELFSM, evidence: "ABI version 9: want 7 or 8"},
	{name: "sm_107a slot expects the family build's SM 100", file: cub107, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		binary.LittleEndian.PutUint32(d[0x30:], 0x06006b02) // SM 107
		return d
	}, blob: cub107, check: CheckELFSM, evidence: "give SM 107, but the manifest says sm_107a was built as sm_100f (SM 100)"},
	{name: "sm_100f build in the sm_100a slot", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		files[cub100] = files[cub107]
		m.Blobs[1].SHA256, m.Blobs[1].Size = ptx.SHA256(files[cub107]), len(files[cub107])
	}, blob: cub100, check: CheckCubinArch, evidence: "ptxas ran with -arch sm_100f (.note.nv.tkinfo), manifest says built as sm_100a"},
	{name: "accelerator flag cleared", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.compat", EICompatAcceleratorTarget, nil)
		d[off+2] = 0
		return d
	}, blob: cub90, check: CheckCubinArch, evidence: "accelerator-target flag is 0, want 1 for sm_90a"},
	{name: "missing entry symbol in cubin", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		d[symbolOffset(t, d, "probe_axpy")+5] &^= 0x10 // st_other: no longer STO_CUDA_ENTRY
		return d
	}, blob: cub90, check: CheckCubinEntries, evidence: "manifest entry probe_axpy has no entry symbol"},
	{name: "entry missing from the manifest", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		for i := range m.Blobs {
			m.Blobs[i].Entries = m.Blobs[i].Entries[1:]
		}
	}, blob: cub90, check: CheckCubinEntries, evidence: "entry symbol probe_axpy (symbol 12) is not in the manifest", others: true},
	{name: "missing .nv.info.K", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		return renameSection(t, d, ".nv.info.probe_axpy", ".nv.infx.probe_axpy")
	}, blob: cub90, check: CheckCubinSections, evidence: "entry probe_axpy has no .nv.info.probe_axpy"},
	{name: "missing .nv.constant0.K", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		return renameSection(t, d, ".nv.constant0.probe_mixed", ".nv.constant1.probe_mixed")
	}, blob: cub90, check: CheckCubinSections, evidence: "entry probe_mixed has no .nv.constant0.probe_mixed"},
	{name: "changed KPARAM size", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.info.probe_axpy", EIAttrKParamInfo, func(r NVInfoRecord) bool { return binary.LittleEndian.Uint16(r.Payload[4:]) == 3 })
		w := binary.LittleEndian.Uint32(d[off+4+8:])
		binary.LittleEndian.PutUint32(d[off+4+8:], w&0x3ffff|8<<18) // size 4 -> 8
		return d
	}, blob: cub90, check: CheckKParam, evidence: "entry probe_axpy: parameter 3 (probe_axpy_param_3): KPARAM_INFO offset 20 size 8, manifest offset 20 size 4"},
	{name: "changed KPARAM offset", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.info.probe_mixed", EIAttrKParamInfo, func(r NVInfoRecord) bool { return binary.LittleEndian.Uint16(r.Payload[4:]) == 5 })
		binary.LittleEndian.PutUint16(d[off+4+6:], 44)
		return d
	}, blob: cub90, check: CheckKParam, evidence: "parameter 5 (probe_mixed_param_5): KPARAM_INFO offset 44 size 8, manifest offset 48 size 8"},
	{name: "duplicate KPARAM ordinal", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.info.probe_axpy", EIAttrKParamInfo, func(r NVInfoRecord) bool { return binary.LittleEndian.Uint16(r.Payload[4:]) == 3 })
		binary.LittleEndian.PutUint16(d[off+4+4:], 2)
		return d
	}, blob: cub90, check: CheckKParam, evidence: "two KPARAM_INFO records for parameter 2"},
	{name: "changed parameter size in the manifest", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		for i := range m.Blobs {
			m.Blobs[i].Entries[0].Params[3] = ptx.Param{Name: "probe_axpy_param_3", Type: "u64", Size: 8, Align: 8, Offset: 24}
		}
	}, blob: cub90, check: CheckKParam, evidence: "KPARAM_INFO offset 20 size 4, manifest offset 24 size 8", others: true},
	{name: "changed CBANK_PARAM_SIZE", file: cub100, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.info.probe_mixed", EIAttrCBankParamSize, nil)
		binary.LittleEndian.PutUint16(d[off+2:], 0x40)
		return d
	}, blob: cub100, check: CheckCBankParamSize, evidence: "CBANK_PARAM_SIZE 64, manifest parameters end at 56"},
	{name: "changed PARAM_CBANK size", file: cub100, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.info.probe_axpy", EIAttrParamCBank, nil)
		binary.LittleEndian.PutUint16(d[off+4+6:], 0x1c)
		return d
	}, blob: cub100, check: CheckParamCBank, evidence: "PARAM_CBANK size 28, manifest parameters end at 24"},
	{name: "unknown .nv.info format", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.info.probe_mixed", EIAttrCBankParamSize, nil)
		d[off] = 9
		return d
	}, blob: cub90, check: CheckNVInfo, evidence: "unknown format 9"},
	{name: ".nv.info payload past the end", file: cub90, edit: func(t *testing.T, d []byte) []byte {
		d = clone(d)
		off := findRecord(t, d, ".nv.info.probe_axpy", EIAttrKParamInfo, nil)
		binary.LittleEndian.PutUint16(d[off+2:], 0x400)
		return d
	}, blob: cub90, check: CheckNVInfo, evidence: "payload of 1024 bytes runs past the section end"},
	{name: "registers differ from the manifest", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[0].Entries[1].Resources.Registers = 40
	}, blob: cub90, check: CheckResources, evidence: "entry probe_mixed: the cubin uses 18 registers, manifest says 40"},

	// Manifest.
	{name: "manifest lists no blobs", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) { m.Blobs = nil },
		blob: ManifestBlobName, check: CheckManifest, evidence: "lists no blobs"},
	{name: "sm_107a slot filled by an sm_100a build", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[3].BuiltAs = "sm_100a"
	}, blob: cub107, check: CheckManifest, evidence: "target sm_107a cannot be filled by a sm_100a build"},
	{name: "two blobs for one slot", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) { m.Blobs[2].Target = "sm_100a" },
		blob: ManifestBlobName, check: CheckManifest, evidence: "blobs 1 and 2 both fill target sm_100a", others: true},
	{name: "path in a file name", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[0].File = "../probe.sm_90a.cubin"
	},
		blob: "../probe.sm_90a.cubin", check: CheckManifest, evidence: "is not a plain file name"},
	{name: "cubin kind with a PTX build", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) { m.Blobs[4].Kind = ptx.KindCubin },
		blob: ptx80, check: CheckManifest, evidence: "a cubin cannot be built as compute_80"},
	{name: "entries differ between blobs", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[2].Entries = m.Blobs[2].Entries[:1]
	}, blob: "probe.sm_103a.cubin", check: CheckManifest, evidence: "entries differ from probe.sm_90a.cubin: names [probe_axpy], want [probe_axpy probe_mixed]"},
	{name: "resources on a PTX entry", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[4].Entries[0].Resources = &ptx.Resources{Registers: 10}
	}, blob: ptx80, check: CheckManifest, evidence: "entry probe_axpy: resources on a PTX blob"},
	{name: "negative resources", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[0].Entries[0].Resources.SpillStores = -4
	}, blob: cub90, check: CheckManifest, evidence: "entry probe_axpy: negative resources", others: true},
	{name: "manifest layout not aligned", raw: func(t *testing.T, m *ptx.Manifest, files map[string][]byte) {
		m.Blobs[0].Entries[1].Params[5].Offset = 44
	}, blob: cub90, check: CheckManifest, evidence: "entry probe_mixed: parameter 5 (probe_mixed_param_5): offset 44, want 48", others: true},
}

func TestCorruptedCopies(t *testing.T) {
	for _, tc := range corruptions {
		t.Run(tc.name, func(t *testing.T) {
			m, files := probeFixture(t)
			if tc.file != "" {
				d := tc.edit(t, clone(files[tc.file]))
				files[tc.file] = d
				for i := range m.Blobs {
					if m.Blobs[i].File == tc.file {
						m.Blobs[i].SHA256, m.Blobs[i].Size = ptx.SHA256(d), len(d)
					}
				}
			}
			if tc.raw != nil {
				tc.raw(t, m, files)
			}
			r := CheckFiles("probe", m, reader(files))
			if tc.check == "" {
				for _, f := range r.Failures {
					t.Error(f)
				}
				return
			}
			want := tc.evidence
			if strings.Contains(want, "%sha") {
				want = strings.ReplaceAll(want, "%sha", m.Blobs[0].SHA256)
			}
			assert.Truef(t, r.Has(tc.blob, tc.check, want), "want a failure %q; got:\n%s", Failure{tc.blob, tc.check, want}, failureLines(r))
			assert.False(t, r.OK())
			for _, f := range r.Failures {
				assert.Truef(t, tc.others || f.Blob == tc.blob || f.Blob == ManifestBlobName, "a failure on another blob: %s", f)
			}
		})
	}
}

func failureLines(r *Report) string {
	var b strings.Builder
	for _, f := range r.Failures {
		b.WriteString("\t" + f.String() + "\n")
	}
	return b.String()
}
