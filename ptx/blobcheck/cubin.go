package blobcheck

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"strings"
)

// ELF constants of CUDA cubins (blob_formats.md §2).
const (
	EMCUDA          = 190  // e_machine of a cubin
	ELFOSABICUDA    = 0x33 // OS/ABI of older toolkits
	ELFOSABICUDAV2  = 0x41 // OS/ABI written by CUDA 13
	ABIVersionV1    = 7    // SM in e_flags bits 0-7
	ABIVersionV2    = 8    // SM in e_flags bits 8-15
	stoCUDAEntry    = 0x10 // st_other bit of a kernel entry symbol
	shtCUDAInfo     = 0x70000000
	eiOSABI         = 7
	eiABIVersion    = 8
	offEVersion     = 0x14
	offEFlags       = 0x30
	elf64HeaderSize = 64
)

// .nv.info record formats and the attributes the checker reads.
const (
	EIFmtNVal = 1 // no payload; the u16 is the value
	EIFmtBVal = 2 // byte value in the u16
	EIFmtHVal = 3 // half-word value in the u16
	EIFmtSVal = 4 // the u16 is the payload length

	EIAttrParamCBank     = 0x0a // u32 symbol of .nv.constant0.K, u16 offset, u16 size
	EIAttrFrameSize      = 0x11 // global: u32 symbol, u32 frame bytes
	EIAttrKParamInfo     = 0x17 // u32 index, u16 ordinal, u16 offset, u32 packed size/space
	EIAttrCBankParamSize = 0x19 // HVAL: parameter bytes
	EIAttrRegCount       = 0x2f // global: u32 symbol, u32 registers
	EIAttrKParamInfoV2   = 0x45 // u32 index, u16 ordinal, u16 offset, u16 size, u16 attributes

	// EICompatAcceleratorTarget is the .nv.compat attribute set to 1 in
	// cubins built for an arch-specific (sm_XYa) target.
	EICompatAcceleratorTarget = 0x09
)

// NVInfoRecord is one record of a .nv.info section.
type NVInfoRecord struct {
	Format  byte
	Attr    byte
	Value   uint16 // the value for formats 1-3, the payload length for 4
	Payload []byte // format 4 only
	Offset  int    // offset of the record in its section
}

// ParseNVInfo walks the records of a .nv.info section, checking every bound.
// An unknown format or a payload past the end is an error.
func ParseNVInfo(b []byte) ([]NVInfoRecord, error) {
	var recs []NVInfoRecord
	for off := 0; off < len(b); {
		if len(b)-off < 4 {
			return recs, fmt.Errorf("record at offset %#x: %d bytes left, a record header needs 4", off, len(b)-off)
		}
		r := NVInfoRecord{Format: b[off], Attr: b[off+1], Value: binary.LittleEndian.Uint16(b[off+2:]), Offset: off}
		off += 4
		switch r.Format {
		case EIFmtNVal, EIFmtBVal, EIFmtHVal:
		case EIFmtSVal:
			n := int(r.Value)
			if n > len(b)-off {
				return recs, fmt.Errorf("record at offset %#x (attribute %#02x): payload of %d bytes runs past the section end (%d bytes left)", r.Offset, r.Attr, n, len(b)-off)
			}
			r.Payload = b[off : off+n]
			off += n
		default:
			return recs, fmt.Errorf("record at offset %#x: unknown format %d (attribute %#02x)", r.Offset, r.Format, r.Attr)
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// KParam is one KPARAM_INFO or KPARAM_INFO_V2 record: where the driver puts
// one kernel parameter.
type KParam struct {
	Index   uint32
	Ordinal int
	Offset  int
	Size    int
	V2      bool // from KPARAM_INFO_V2
	// From the packed word of KPARAM_INFO (V1 only): the pointee's log2
	// alignment, the space, the constant bank, and whether the parameter
	// lives in the constant bank (cuobjdump: "Parameter Space : CBANK").
	LogAlign, Space, CBank int
	InCBank                bool
}

func decodeKParam(r NVInfoRecord) (KParam, error) {
	if len(r.Payload) != 12 {
		return KParam{}, fmt.Errorf("KPARAM_INFO record at offset %#x has %d bytes, want 12", r.Offset, len(r.Payload))
	}
	p := r.Payload
	k := KParam{
		Index:   binary.LittleEndian.Uint32(p),
		Ordinal: int(binary.LittleEndian.Uint16(p[4:])),
		Offset:  int(binary.LittleEndian.Uint16(p[6:])),
	}
	if r.Attr == EIAttrKParamInfoV2 {
		// Layout from blob_formats.md (seen on kernels with more than 4 KiB of
		// parameters); not present in the probe cubins.
		k.V2 = true
		k.Size = int(binary.LittleEndian.Uint16(p[8:]))
		return k, nil
	}
	// The last word packs: bits 0-7 log2 alignment of the pointee, bits 8-11
	// space, bits 12-16 constant bank, bit 17 set when not in the constant
	// bank, bits 18-31 size in bytes. cuobjdump agrees on the probe cubins.
	w := binary.LittleEndian.Uint32(p[8:])
	k.LogAlign = int(w & 0xff)
	k.Space = int(w >> 8 & 0xf)
	k.CBank = int(w >> 12 & 0x1f)
	k.InCBank = w>>17&1 == 0
	k.Size = int(w >> 18)
	return k, nil
}

// ParamCBank is the PARAM_CBANK record: where the parameter buffer sits in
// constant bank 0.
type ParamCBank struct {
	Symbol  uint32 // symbol index of .nv.constant0.K
	Offset  int
	Size    int
	Section string // name of the symbol's section
}

// CubinEntry is one kernel entry of a cubin.
type CubinEntry struct {
	Name        string
	Symbol      int   // ELF symbol index
	TextSize    int64 // size of .text.K, -1 when the section is missing
	HasInfo     bool  // .nv.info.K exists
	Const0Size  int64 // size of .nv.constant0.K, -1 when missing
	SharedBytes int64 // size of .nv.shared.K, 0 when missing
	InfoErr     error // .nv.info.K does not parse
	Params      []KParam
	// CBankParamSize is the CBANK_PARAM_SIZE value, -1 when absent.
	CBankParamSize int
	ParamCBank     *ParamCBank // nil when absent
	// Registers and FrameSize come from the global .nv.info (REGCOUNT and
	// FRAME_SIZE records naming this entry), -1 when absent.
	Registers int
	FrameSize int
}

// Cubin is what ParseCubin reads from a cubin.
type Cubin struct {
	OSABI      byte
	ABIVersion byte
	Type       elf.Type
	Version    uint32 // e_version as stored: NVIDIA writes the toolkit version there
	Flags      uint32 // e_flags
	SM         int    // decoded from e_flags by ABI version
	// PtxasArch is the -arch ptxas ran with, from .note.nv.tkinfo; empty
	// when the note is missing.
	PtxasArch string
	// AcceleratorTarget is .nv.compat attribute 0x09 (1 for sm_XYa builds),
	// -1 when absent.
	AcceleratorTarget int
	Entries           []CubinEntry // STT_FUNC symbols with STO_CUDA_ENTRY, in symbol order
	// GlobalInfoErr is set when the global .nv.info does not parse.
	GlobalInfoErr error
}

// Entry returns the named entry.
func (c *Cubin) Entry(name string) (*CubinEntry, bool) {
	if c == nil {
		return nil, false
	}
	for i := range c.Entries {
		if c.Entries[i].Name == name {
			return &c.Entries[i], true
		}
	}
	return nil, false
}

// SMFromFlags decodes the SM number from e_flags for the given ABI version:
// 8 (CUDA 13 and later) keeps it in bits 8-15, 7 in bits 0-7.
func SMFromFlags(abiVersion byte, flags uint32) (int, error) {
	switch abiVersion {
	case ABIVersionV2:
		return int(flags >> 8 & 0xff), nil
	case ABIVersionV1:
		return int(flags & 0xff), nil
	}
	return 0, fmt.Errorf("ABI version %d: want %d or %d, cannot decode e_flags %#x", abiVersion, ABIVersionV1, ABIVersionV2, flags)
}

// versionPatch presents e_version as 1 to debug/elf, which rejects any other
// value while NVIDIA stores the toolkit version there.
type versionPatch struct{ r io.ReaderAt }

// ReadAt reads from the wrapped reader and overlays e_version with 1.
func (v versionPatch) ReadAt(p []byte, off int64) (int, error) {
	n, err := v.r.ReadAt(p, off)
	patch := [4]byte{1, 0, 0, 0}
	for i := 0; i < n; i++ {
		if at := off + int64(i); at >= offEVersion && at < offEVersion+4 {
			p[i] = patch[at-offEVersion]
		}
	}
	return n, err
}

// ParseCubin reads the header, the entries and their .nv.info records. The
// error is an Issue naming the failed check when the file is not a cubin at
// all (header, machine, OS/ABI, truncation); per-entry problems are left in
// the entries for the caller to judge.
func ParseCubin(data []byte) (c *Cubin, err error) {
	if len(data) < elf64HeaderSize {
		return nil, issuef(CheckELFTruncated, "file is %d bytes, an ELF64 header needs %d", len(data), elf64HeaderSize)
	}
	if !bytes.Equal(data[:4], []byte(elf.ELFMAG)) {
		return nil, issuef(CheckELFHeader, "magic % x, want 7f 45 4c 46", data[:4])
	}
	if elf.Class(data[elf.EI_CLASS]) != elf.ELFCLASS64 {
		return nil, issuef(CheckELFHeader, "class %v, want ELFCLASS64", elf.Class(data[elf.EI_CLASS]))
	}
	if elf.Data(data[elf.EI_DATA]) != elf.ELFDATA2LSB {
		return nil, issuef(CheckELFHeader, "data encoding %v, want ELFDATA2LSB (little endian)", elf.Data(data[elf.EI_DATA]))
	}
	if m := binary.LittleEndian.Uint16(data[0x12:]); m != EMCUDA {
		return nil, issuef(CheckELFMachine, "e_machine %d, want %d (EM_CUDA)", m, EMCUDA)
	}
	c = &Cubin{
		OSABI:             data[eiOSABI],
		ABIVersion:        data[eiABIVersion],
		Type:              elf.Type(binary.LittleEndian.Uint16(data[0x10:])),
		Version:           binary.LittleEndian.Uint32(data[offEVersion:]),
		Flags:             binary.LittleEndian.Uint32(data[offEFlags:]),
		AcceleratorTarget: -1,
	}
	if c.OSABI != ELFOSABICUDA && c.OSABI != ELFOSABICUDAV2 {
		return nil, issuef(CheckELFOSABI, "OS/ABI %#02x, want %#02x or %#02x", c.OSABI, ELFOSABICUDA, ELFOSABICUDAV2)
	}
	if c.SM, err = SMFromFlags(c.ABIVersion, c.Flags); err != nil {
		return nil, issuef(CheckELFSM, "%v", err)
	}
	if c.Type != elf.ET_EXEC {
		return nil, issuef(CheckELFHeader, "type %v, want ET_EXEC (a relocatable cubin needs linking first)", c.Type)
	}
	if err := checkExtents(data); err != nil {
		return nil, err
	}

	defer func() {
		if p := recover(); p != nil {
			c, err = nil, issuef(CheckELFHeader, "the ELF reader failed: %v", p)
		}
	}()
	f, err := elf.NewFile(versionPatch{bytes.NewReader(data)})
	if err != nil {
		return nil, issuef(CheckELFHeader, "%v", err)
	}
	if st := f.SectionByType(elf.SHT_SYMTAB); st == nil || st.Name != ".symtab" {
		return nil, issuef(CheckELFHeader, "no .symtab section")
	}
	syms, err := f.Symbols()
	if err != nil {
		return nil, issuef(CheckELFHeader, "symbols: %v", err)
	}
	sectionName := func(i elf.SectionIndex) string {
		if int(i) < len(f.Sections) {
			return f.Sections[i].Name
		}
		return ""
	}
	// debug/elf drops the null symbol, so ELF index i is syms[i-1].
	bySymbol := map[uint32]int{}
	for i, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Other&stoCUDAEntry == 0 {
			continue
		}
		e := CubinEntry{Name: s.Name, Symbol: i + 1, TextSize: -1, Const0Size: -1, CBankParamSize: -1, Registers: -1, FrameSize: -1}
		if sec := f.Section(".text." + s.Name); sec != nil {
			e.TextSize = int64(sec.Size)
		}
		if sec := f.Section(".nv.constant0." + s.Name); sec != nil {
			e.Const0Size = int64(sec.Size)
		}
		if sec := f.Section(".nv.shared." + s.Name); sec != nil {
			e.SharedBytes = int64(sec.Size)
		}
		if sec := f.Section(".nv.info." + s.Name); sec != nil {
			e.HasInfo = true
			e.InfoErr = readEntryInfo(sec, &e, syms, sectionName)
		}
		bySymbol[uint32(i+1)] = len(c.Entries)
		c.Entries = append(c.Entries, e)
	}
	if sec := f.Section(".nv.info"); sec != nil {
		c.GlobalInfoErr = readGlobalInfo(sec, c, bySymbol)
	}
	if sec := f.Section(".nv.compat"); sec != nil {
		if b, err := sec.Data(); err == nil {
			if recs, err := ParseNVInfo(b); err == nil {
				for _, r := range recs {
					if r.Attr == EICompatAcceleratorTarget && r.Format != EIFmtSVal {
						c.AcceleratorTarget = int(r.Value)
					}
				}
			}
		}
	}
	if sec := f.Section(".note.nv.tkinfo"); sec != nil {
		if b, err := sec.Data(); err == nil {
			c.PtxasArch = ptxasArch(b)
		}
	}
	return c, nil
}

// checkExtents reports a file that ends before its section headers, program
// headers or the contents of a section.
func checkExtents(data []byte) error {
	size := uint64(len(data))
	shoff := binary.LittleEndian.Uint64(data[0x28:])
	phoff := binary.LittleEndian.Uint64(data[0x20:])
	phentsize, phnum := uint64(binary.LittleEndian.Uint16(data[0x36:])), uint64(binary.LittleEndian.Uint16(data[0x38:]))
	shentsize, shnum := uint64(binary.LittleEndian.Uint16(data[0x3a:])), uint64(binary.LittleEndian.Uint16(data[0x3c:]))
	// Offsets are compared before they are added to: a hostile header's
	// offset near 2^64 would wrap the sum past the check (the table sizes are
	// products of 16-bit fields: no overflow).
	if phnum > 0 && (phoff > size || phentsize*phnum > size-phoff) {
		return issuef(CheckELFTruncated, "file is %d bytes, program headers (%d of %d bytes at %d) run past its end", size, phnum, phentsize, phoff)
	}
	if shnum == 0 || shentsize != 64 {
		return issuef(CheckELFHeader, "%d section headers of %d bytes, want section headers of 64 bytes", shnum, shentsize)
	}
	if shoff > size || shentsize*shnum > size-shoff {
		return issuef(CheckELFTruncated, "file is %d bytes, section headers (%d of %d bytes at %d) run past its end", size, shnum, shentsize, shoff)
	}
	for i := uint64(0); i < shnum; i++ {
		h := data[shoff+i*shentsize:]
		typ := elf.SectionType(binary.LittleEndian.Uint32(h[4:]))
		off, sz := binary.LittleEndian.Uint64(h[0x18:]), binary.LittleEndian.Uint64(h[0x20:])
		if typ == elf.SHT_NOBITS || typ == elf.SHT_NULL {
			continue
		}
		if off > size || sz > size-off {
			return issuef(CheckELFTruncated, "file is %d bytes, section %d ends at %d", size, i, off+sz)
		}
	}
	return nil
}

func readEntryInfo(sec *elf.Section, e *CubinEntry, syms []elf.Symbol, sectionName func(elf.SectionIndex) string) error {
	b, err := sec.Data()
	if err != nil {
		return fmt.Errorf("%s: %v", sec.Name, err)
	}
	recs, err := ParseNVInfo(b)
	if err != nil {
		return fmt.Errorf("%s: %v", sec.Name, err)
	}
	for _, r := range recs {
		switch r.Attr {
		case EIAttrKParamInfo, EIAttrKParamInfoV2:
			if r.Format != EIFmtSVal {
				return fmt.Errorf("%s: KPARAM_INFO record at offset %#x has format %d, want %d", sec.Name, r.Offset, r.Format, EIFmtSVal)
			}
			k, err := decodeKParam(r)
			if err != nil {
				return fmt.Errorf("%s: %v", sec.Name, err)
			}
			e.Params = append(e.Params, k)
		case EIAttrCBankParamSize:
			if r.Format != EIFmtHVal {
				return fmt.Errorf("%s: CBANK_PARAM_SIZE record at offset %#x has format %d, want %d", sec.Name, r.Offset, r.Format, EIFmtHVal)
			}
			e.CBankParamSize = int(r.Value)
		case EIAttrParamCBank:
			if r.Format != EIFmtSVal || len(r.Payload) != 8 {
				return fmt.Errorf("%s: PARAM_CBANK record at offset %#x: format %d with %d bytes, want format 4 with 8", sec.Name, r.Offset, r.Format, len(r.Payload))
			}
			pc := &ParamCBank{
				Symbol: binary.LittleEndian.Uint32(r.Payload),
				Offset: int(binary.LittleEndian.Uint16(r.Payload[4:])),
				Size:   int(binary.LittleEndian.Uint16(r.Payload[6:])),
			}
			if i := int(pc.Symbol); i >= 1 && i <= len(syms) {
				pc.Section = sectionName(syms[i-1].Section)
			}
			e.ParamCBank = pc
		}
	}
	return nil
}

func readGlobalInfo(sec *elf.Section, c *Cubin, bySymbol map[uint32]int) error {
	b, err := sec.Data()
	if err != nil {
		return fmt.Errorf("%s: %v", sec.Name, err)
	}
	recs, err := ParseNVInfo(b)
	if err != nil {
		return fmt.Errorf("%s: %v", sec.Name, err)
	}
	for _, r := range recs {
		if (r.Attr != EIAttrRegCount && r.Attr != EIAttrFrameSize) || r.Format != EIFmtSVal || len(r.Payload) != 8 {
			continue
		}
		i, ok := bySymbol[binary.LittleEndian.Uint32(r.Payload)]
		if !ok {
			continue
		}
		v := int(binary.LittleEndian.Uint32(r.Payload[4:]))
		if r.Attr == EIAttrRegCount {
			c.Entries[i].Registers = v
		} else {
			c.Entries[i].FrameSize = v
		}
	}
	return nil
}

// ptxasArch finds "-arch sm_XY" in the tool command line of .note.nv.tkinfo.
func ptxasArch(note []byte) string {
	s := string(note)
	i := strings.Index(s, "-arch ")
	if i < 0 {
		return ""
	}
	rest := strings.TrimLeft(s[i+len("-arch "):], " ")
	end := strings.IndexAny(rest, " \x00\n")
	if end < 0 {
		end = len(rest)
	}
	return rest[:end]
}
