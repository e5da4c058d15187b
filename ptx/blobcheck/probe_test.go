package blobcheck

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
)

const probeDir = "../../testdata/probe"

// probeParams are the parameter layouts of probe.cu, worked out by hand.
var probeParams = map[string][]ptx.Param{
	"probe_axpy": {
		{Name: "probe_axpy_param_0", Type: "u64", Size: 8, Align: 8, Offset: 0},
		{Name: "probe_axpy_param_1", Type: "u64", Size: 8, Align: 8, Offset: 8},
		{Name: "probe_axpy_param_2", Type: "f32", Size: 4, Align: 4, Offset: 16},
		{Name: "probe_axpy_param_3", Type: "u32", Size: 4, Align: 4, Offset: 20},
	},
	"probe_mixed": {
		{Name: "probe_mixed_param_0", Type: "u64", Size: 8, Align: 8, Offset: 0},
		{Name: "probe_mixed_param_1", Type: "u64", Size: 8, Align: 8, Offset: 8},
		{Name: "probe_mixed_param_2", Type: "b8", Size: 16, Align: 8, Offset: 16},
		{Name: "probe_mixed_param_3", Type: "u64", Size: 8, Align: 8, Offset: 32},
		{Name: "probe_mixed_param_4", Type: "u8", Size: 1, Align: 1, Offset: 40},
		{Name: "probe_mixed_param_5", Type: "f64", Size: 8, Align: 8, Offset: 48},
	},
}

// probeResources is what ptxas.txt reports for every probe cubin.
var probeResources = map[string]ptx.Resources{
	"probe_axpy":  {Registers: 10},
	"probe_mixed": {Registers: 18, SharedStatic: 1024},
}

// probeSlots maps each probe file to its manifest slot and build.
var probeSlots = []struct{ file, target, kind, builtAs string }{
	{"probe.sm_90a.cubin", "sm_90a", ptx.KindCubin, "sm_90a"},
	{"probe.sm_100a.cubin", "sm_100a", ptx.KindCubin, "sm_100a"},
	{"probe.sm_103a.cubin", "sm_103a", ptx.KindCubin, "sm_103a"},
	{"probe.sm_100f.cubin", "sm_107a", ptx.KindCubin, "sm_100f"},
	{"probe.compute_80.ptx", "compute_80", ptx.KindPTX, "compute_80"},
	{"probe.sm_90a.ptx", "compute_90a", ptx.KindPTX, "compute_90a"},
}

// probeFixture returns a manifest for the probe blobs and their bytes.
func probeFixture(t testing.TB) (*ptx.Manifest, map[string][]byte) {
	t.Helper()
	m := &ptx.Manifest{Generator: "blobcheck test", Sources: map[string]string{}}
	files := map[string][]byte{}
	for _, s := range probeSlots {
		data, err := os.ReadFile(filepath.Join(probeDir, s.file))
		require.NoError(t, err)
		files[s.file] = data
		b := ptx.Blob{Target: s.target, Kind: s.kind, File: s.file, BuiltAs: s.builtAs, NVCC: "Cuda compilation tools, release 13.0, V13.0.88",
			SHA256: ptx.SHA256(data), Size: len(data)}
		for _, name := range []string{"probe_axpy", "probe_mixed"} {
			e := ptx.Entry{Name: name, Params: append([]ptx.Param(nil), probeParams[name]...)}
			if s.kind == ptx.KindCubin {
				r := probeResources[name]
				e.Resources = &r
			}
			b.Entries = append(b.Entries, e)
		}
		m.Blobs = append(m.Blobs, b)
	}
	return m, files
}

func reader(files map[string][]byte) func(string) ([]byte, error) {
	return func(name string) ([]byte, error) {
		d, ok := files[name]
		if !ok {
			return nil, os.ErrNotExist
		}
		return d, nil
	}
}

func TestProbeBlobsPass(t *testing.T) {
	m, files := probeFixture(t)
	r := CheckFiles("probe", m, reader(files))
	for _, f := range r.Failures {
		t.Error(f)
	}
	assert.True(t, r.OK())
	assert.Equal(t, "ptxcheck: probe: 6 blobs, 12 entries: all checks passed", r.Summary())
}

func TestParsePTXProbe(t *testing.T) {
	for _, tc := range []struct {
		file, target string
	}{{"probe.compute_80.ptx", "sm_80"}, {"probe.sm_90a.ptx", "sm_90a"}} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(probeDir, tc.file))
			require.NoError(t, err)
			m := ParsePTX(data)
			assert.Empty(t, m.Issues)
			assert.Equal(t, Version{9, 0}, m.Version)
			assert.Equal(t, tc.target, m.Target)
			assert.Equal(t, 64, m.AddressSize)
			require.Len(t, m.Exported(), 2)
			for _, e := range m.Exported() {
				assert.Equal(t, probeParams[e.Name], e.Params, e.Name)
			}
		})
	}
}

// cuobjdumpInfo is what cuobjdump -elf says about one cubin.
type cuobjdumpInfo struct {
	sm        string
	flags     uint32
	entries   []string // symbols with other 0x10
	kparams   map[string][]KParam
	cbankSize map[string]int
	paramBank map[string][3]int // symbol, offset, size
	regs      map[string]int
	frame     map[string]int
}

var (
	reELFLine  = regexp.MustCompile(`^64-bit ELF: .*sm=(\w+),.*flags=0x([0-9a-f]+)`)
	reSym      = regexp.MustCompile(`^\s*0x[0-9a-f]+\s+\S+\s+\S+\s+0x12\s+0x10\s+\S+\s+(\w+)$`)
	reKParam   = regexp.MustCompile(`Ordinal : 0x([0-9a-f]+)\s+Offset\s+: 0x([0-9a-f]+)\s+Size\s+: 0x([0-9a-f]+)`)
	reKParam2  = regexp.MustCompile(`logAlignment : 0x([0-9a-f]+)\s+Space : 0x([0-9a-f]+)\s+cbank : 0x([0-9a-f]+)\s+Parameter Space : (\w+)`)
	reRegs     = regexp.MustCompile(`function: (\w+)\(0x[0-9a-f]+\)\s+register count: (\d+)`)
	reFrame    = regexp.MustCompile(`function: (\w+)\(0x[0-9a-f]+\)\s+frame size: 0x([0-9a-f]+)`)
	reInfoHead = regexp.MustCompile(`^\.nv\.info(?:\.(\w+))?$`)
)

func hexInt(t *testing.T, s string) int {
	v, err := strconv.ParseUint(s, 16, 32)
	require.NoError(t, err)
	return int(v)
}

// parseElfTxt reads testdata/probe/elf.txt, cuobjdump's decoding of every
// probe cubin.
func parseElfTxt(t *testing.T) map[string]*cuobjdumpInfo {
	f, err := os.Open(filepath.Join(probeDir, "elf.txt"))
	require.NoError(t, err)
	defer f.Close()
	out := map[string]*cuobjdumpInfo{}
	var cur *cuobjdumpInfo
	block := ""   // "" outside a .nv.info dump, "global" or the entry name
	attr := ""    // attribute of the current record
	var kp KParam // KPARAM_INFO being read
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if name, ok := strings.CutPrefix(line, "== "); ok {
			cur = &cuobjdumpInfo{kparams: map[string][]KParam{}, cbankSize: map[string]int{}, paramBank: map[string][3]int{}, regs: map[string]int{}, frame: map[string]int{}}
			out[name] = cur
			block = ""
			continue
		}
		if cur == nil {
			continue
		}
		if m := reELFLine.FindStringSubmatch(line); m != nil {
			cur.sm, cur.flags = m[1], uint32(hexInt(t, m[2]))
		}
		if m := reSym.FindStringSubmatch(line); m != nil {
			cur.entries = append(cur.entries, m[1])
		}
		if m := reInfoHead.FindStringSubmatch(line); m != nil {
			block = "global"
			if m[1] != "" {
				block = m[1]
			}
			continue
		}
		if line != "" && !strings.HasPrefix(line, "\t") {
			block = ""
		}
		if block == "" {
			continue
		}
		if a, ok := strings.CutPrefix(line, "\tAttribute:\t"); ok {
			attr = a
			continue
		}
		switch attr {
		case "EIATTR_KPARAM_INFO":
			if m := reKParam.FindStringSubmatch(line); m != nil {
				kp = KParam{Ordinal: hexInt(t, m[1]), Offset: hexInt(t, m[2]), Size: hexInt(t, m[3])}
			} else if m := reKParam2.FindStringSubmatch(line); m != nil {
				kp.LogAlign, kp.Space, kp.CBank, kp.InCBank = hexInt(t, m[1]), hexInt(t, m[2]), hexInt(t, m[3]), m[4] == "CBANK"
				cur.kparams[block] = append(cur.kparams[block], kp)
			}
		case "EIATTR_CBANK_PARAM_SIZE":
			if v, ok := strings.CutPrefix(line, "\tValue:\t0x"); ok {
				cur.cbankSize[block] = hexInt(t, strings.TrimSpace(v))
			}
		case "EIATTR_PARAM_CBANK":
			if v, ok := strings.CutPrefix(line, "\tValue:\t"); ok {
				f := strings.Fields(v)
				require.Len(t, f, 2)
				w := hexInt(t, strings.TrimPrefix(f[1], "0x"))
				cur.paramBank[block] = [3]int{hexInt(t, strings.TrimPrefix(f[0], "0x")), w & 0xffff, w >> 16}
			}
		case "EIATTR_REGCOUNT":
			if m := reRegs.FindStringSubmatch(line); m != nil {
				n, _ := strconv.Atoi(m[2])
				cur.regs[m[1]] = n
			}
		case "EIATTR_FRAME_SIZE":
			if m := reFrame.FindStringSubmatch(line); m != nil {
				cur.frame[m[1]] = hexInt(t, m[2])
			}
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// TestParseCubinAgreesWithCuobjdump checks the cubin parser against
// cuobjdump's decoding of every probe cubin: SM, entries, every
// KPARAM_INFO field, CBANK_PARAM_SIZE, PARAM_CBANK, registers, frame size.
func TestParseCubinAgreesWithCuobjdump(t *testing.T) {
	dump := parseElfTxt(t)
	require.Len(t, dump, 4)
	for file, want := range dump {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(probeDir, file))
			require.NoError(t, err)
			c, err := ParseCubin(data)
			require.NoError(t, err)
			assert.Equal(t, want.flags, c.Flags)
			assert.Equal(t, strings.TrimRight(want.sm, "af"), strconv.Itoa(c.SM))
			assert.Equal(t, byte(0x41), c.OSABI)
			assert.Equal(t, byte(8), c.ABIVersion)
			assert.Equal(t, "sm_"+strings.TrimPrefix(strings.TrimSuffix(file, ".cubin"), "probe.sm_"), c.PtxasArch)
			var names []string
			for _, e := range c.Entries {
				names = append(names, e.Name)
			}
			assert.ElementsMatch(t, want.entries, names)
			require.Len(t, want.kparams, 2)
			for _, name := range want.entries {
				e, ok := c.Entry(name)
				require.True(t, ok, name)
				require.NoError(t, e.InfoErr)
				got := append([]KParam(nil), e.Params...)
				for i := range got {
					got[i].Index = 0
				}
				assert.Equal(t, want.kparams[name], got, name)
				assert.Equal(t, want.cbankSize[name], e.CBankParamSize, name)
				require.NotNil(t, e.ParamCBank, name)
				assert.Equal(t, want.paramBank[name], [3]int{int(e.ParamCBank.Symbol), e.ParamCBank.Offset, e.ParamCBank.Size}, name)
				assert.Equal(t, ".nv.constant0."+name, e.ParamCBank.Section)
				assert.Equal(t, want.regs[name], e.Registers, name)
				assert.Equal(t, want.frame[name], e.FrameSize, name)
				assert.Positive(t, e.TextSize)
				assert.Positive(t, e.Const0Size)
			}
		})
	}
}

func TestEmbeddedBlobs(t *testing.T) {
	m, err := ptx.Embedded().Manifest()
	require.NoError(t, err)
	if len(m.Blobs) == 0 {
		t.Skipf("the embedded manifest is a placeholder (generator %q): no blobs to check until the lead builds them with tools/ptxgen", m.Generator)
	}
	r := Check(ptx.Embedded())
	for _, f := range r.Failures {
		t.Error(f)
	}
	assert.True(t, r.OK(), r.Summary())
}
