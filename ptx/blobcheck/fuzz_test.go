package blobcheck

import (
	"encoding/binary"
	"encoding/json"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/ptx"
)

// fuzzSeeds adds the probe blobs (testdata/probe: real nvcc output, a few KB
// each) and a few truncations of each to f.
func fuzzSeeds(f *testing.F, names ...string) {
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(probeDir, name))
		require.NoError(f, err)
		for _, n := range []int{len(data), len(data) / 2, 64, 16, 0} {
			f.Add(data[:min(n, len(data))])
		}
	}
}

// FuzzParseCubin feeds the cubin reader (ParseCubin, CubinText, and the
// .nv.info records of every section) arbitrary bytes: a corrupt or hostile
// blob handed to ptxcheck must give errors, never a panic or a hang.
func FuzzParseCubin(f *testing.F) {
	fuzzSeeds(f, "probe.sm_90a.cubin", "probe.sm_100a.cubin", "probe.sm_103a.cubin")
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCubin(data)
		if err != nil {
			require.Nil(t, c)
		} else {
			require.NotNil(t, c)
		}
		text, terr := CubinText(data)
		if err != nil {
			require.Error(t, terr, "CubinText parses what ParseCubin refused")
			require.Nil(t, text)
		}
		_, _ = ParseNVInfo(data)
	})
}

// FuzzParsePTX feeds the PTX reader arbitrary text: it never fails (what it
// cannot read goes into Issues) and must never panic.
func FuzzParsePTX(f *testing.F) {
	fuzzSeeds(f, "probe.compute_80.ptx", "probe.sm_90a.ptx")
	f.Add([]byte(".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry e(.param .u64 p[\n"))
	f.Add([]byte("/* unterminated"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := ParsePTX(data)
		require.NotNil(t, m)
		_ = PTXBodies(data)
	})
}

// TestCubinMutations is a fixed-seed stand-in for FuzzParseCubin in plain
// `go test` (CI does not fuzz): 20,000 corruptions of the probe cubins (bit
// flips, boundary values written over header and table fields, cuts,
// insertions), each read by ParseCubin and CubinText without a panic. It
// found e_shoff near 2^64 wrapping checkExtents' bound (a slice panic).
func TestCubinMutations(t *testing.T) {
	var bases [][]byte
	for _, name := range []string{"probe.sm_90a.cubin", "probe.sm_100a.cubin"} {
		data, err := os.ReadFile(filepath.Join(probeDir, name))
		require.NoError(t, err)
		bases = append(bases, data)
	}
	r := rand.New(rand.NewSource(1))
	bounds := []uint64{0, 1, 0x7f, 0x80, 0xff, 0xffff, 0x7fffffff, 0xffffffff, 1 << 40, ^uint64(0) - 63, ^uint64(0)}
	for it := range 20000 {
		d := append([]byte(nil), bases[it%len(bases)]...)
		for range 1 + r.Intn(6) {
			if len(d) < 16 {
				break
			}
			off := r.Intn(len(d) - 8)
			if r.Intn(2) == 0 {
				off %= 0x40 // the ELF header's fields
			}
			switch r.Intn(6) {
			case 0:
				d[off] ^= byte(1 << r.Intn(8))
			case 1:
				binary.LittleEndian.PutUint32(d[off:], uint32(bounds[r.Intn(len(bounds))]))
			case 2:
				binary.LittleEndian.PutUint64(d[off:], bounds[r.Intn(len(bounds))])
			case 3:
				d = append(d[:off], d[off+r.Intn(len(d)-off):]...)
			case 4:
				d = append(d[:off], append(make([]byte, r.Intn(64)), d[off:]...)...)
			default:
				d = d[:off+8]
			}
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("mutation %d: panic %v on %x", it, p, d[:min(len(d), 64)])
				}
			}()
			_, _ = ParseCubin(d)
			_, _ = CubinText(d)
		}()
	}
}

// FuzzCheckManifest runs the whole check (CheckFiles, what ptxcheck DIR runs)
// on the probe blobs under arbitrary manifest JSON: a manifest that decodes
// must give a report (failures, or a pass), never a panic.
func FuzzCheckManifest(f *testing.F) {
	m, files := probeFixture(f)
	seed, err := json.Marshal(m)
	require.NoError(f, err)
	f.Add(seed)
	f.Add([]byte(`{"blobs":[{"target":"sm_90a","kind":"cubin","file":"probe.sm_90a.cubin","entries":[{"name":"probe_axpy","params":[{"type":"b8","size":-8,"align":0,"offset":-1}]}]}]}`))
	f.Add([]byte(`{"blobs":[{"target":"","kind":"","file":"","entries":null}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m ptx.Manifest
		if json.Unmarshal(data, &m) != nil {
			return
		}
		r := CheckFiles("fuzz", &m, reader(files))
		require.True(t, strings.HasPrefix(r.Summary(), "ptxcheck: fuzz: "), r.Summary())
	})
}

// TestManifestMutations is FuzzCheckManifest's fixed-seed stand-in in plain
// `go test`: 5,000 manifests of the probe blobs with fields set to boundary
// values (negative, zero and huge sizes, offsets, alignments and registers;
// empty, foreign and path-like names; entries and blobs dropped or
// duplicated), each checked without a panic and, as every one differs from
// the blobs, with a failure.
func TestManifestMutations(t *testing.T) {
	base, files := probeFixture(t)
	raw, err := json.Marshal(base)
	require.NoError(t, err)
	r := rand.New(rand.NewSource(2))
	ints := []int{-1 << 62, -4096, -1, 0, 1, 3, 7, 4097, 1 << 31, 1<<62 + 1}
	strs := []string{"", "sm_90a", "sm_107a", "compute_80", "cubin", "ptx", "u64", "b8", "f128", "../x", "probe_axpy", "\x00"}
	for it := range 5000 {
		var m ptx.Manifest
		require.NoError(t, json.Unmarshal(raw, &m))
		for range 1 + r.Intn(3) {
			b := &m.Blobs[r.Intn(len(m.Blobs))]
			e := &b.Entries[r.Intn(len(b.Entries))]
			switch r.Intn(9) {
			case 0:
				b.Target = strs[r.Intn(len(strs))]
			case 1:
				b.Kind, b.BuiltAs = strs[r.Intn(len(strs))], strs[r.Intn(len(strs))]
			case 2:
				b.File = strs[r.Intn(len(strs))]
			case 3:
				b.Size = ints[r.Intn(len(ints))]
			case 4:
				p := &e.Params[r.Intn(len(e.Params))]
				p.Size, p.Align, p.Offset = ints[r.Intn(len(ints))], ints[r.Intn(len(ints))], ints[r.Intn(len(ints))]
			case 5:
				e.Params[r.Intn(len(e.Params))].Type = strs[r.Intn(len(strs))]
			case 6:
				if e.Resources != nil {
					e.Resources.Registers, e.Resources.SharedStatic = ints[r.Intn(len(ints))], ints[r.Intn(len(ints))]
				} else {
					e.Resources = &ptx.Resources{Registers: ints[r.Intn(len(ints))]}
				}
			case 7:
				e.Name = strs[r.Intn(len(strs))]
			default:
				if r.Intn(2) == 0 {
					b.Entries = b.Entries[:r.Intn(len(b.Entries))+0]
				} else {
					m.Blobs = append(m.Blobs, m.Blobs[r.Intn(len(m.Blobs))])
				}
			}
			if len(b.Entries) == 0 {
				break
			}
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("mutation %d: panic %v", it, p)
				}
			}()
			rep := CheckFiles("probe", &m, reader(files))
			if got, err := json.Marshal(m); err == nil && string(got) != string(raw) {
				require.False(t, rep.OK(), "mutation %d changed the manifest and passed:\n%s\nwas\n%s", it, got, raw)
			}
		}()
	}
}
