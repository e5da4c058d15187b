package ptx

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed blobs
var embedded embed.FS

// ManifestName is the manifest's file name inside a blob directory.
const ManifestName = "manifest.json"

// Blob kinds.
const (
	KindCubin = "cubin"
	KindPTX   = "ptx"
)

// Param is one kernel parameter as laid out in the parameter buffer.
type Param struct {
	Name   string `json:"name"`
	Type   string `json:"type"` // u64 (pointers), u32, s32, s64, f32, or b8 (byte struct)
	Size   int    `json:"size"`
	Align  int    `json:"align"`
	Offset int    `json:"offset"`
}

// Resources is what ptxas reported for one entry on one target.
type Resources struct {
	Registers    int `json:"registers"`
	SpillStores  int `json:"spill_stores"`
	SpillLoads   int `json:"spill_loads"`
	StackFrame   int `json:"stack_frame"`
	SharedStatic int `json:"shared_static"`
}

// Entry is one extern "C" kernel entry point.
type Entry struct {
	Name      string     `json:"name"`
	Params    []Param    `json:"params"`
	Resources *Resources `json:"resources,omitempty"`
}

// ParamBytes is the total size of the entry's parameter buffer.
func (e *Entry) ParamBytes() int {
	if e == nil {
		return 0
	}
	n := 0
	for _, p := range e.Params {
		if end := p.Offset + p.Size; end > n {
			n = end
		}
	}
	return n
}

// Blob describes one built file.
type Blob struct {
	Target  string   `json:"target"`   // the slot: sm_90a, sm_100a, sm_103a, sm_107a, compute_80
	Kind    string   `json:"kind"`     // cubin or ptx
	File    string   `json:"file"`     // file name inside the blob directory
	BuiltAs string   `json:"built_as"` // what nvcc was asked for, e.g. sm_100f for the sm_107a slot
	Note    string   `json:"note,omitempty"`
	NVCC    string   `json:"nvcc"`
	Flags   []string `json:"flags"`
	SHA256  string   `json:"sha256"`
	Size    int      `json:"size"`
	Entries []Entry  `json:"entries"`
}

// Entry returns the named entry of the blob.
func (b *Blob) Entry(name string) (*Entry, bool) {
	if b == nil {
		return nil, false
	}
	for i := range b.Entries {
		if b.Entries[i].Name == name {
			return &b.Entries[i], true
		}
	}
	return nil, false
}

// Manifest lists every blob of a blob directory.
type Manifest struct {
	Generator string            `json:"generator"`
	Sources   map[string]string `json:"sources"` // source file -> sha256
	Blobs     []Blob            `json:"blobs"`
}

// Blob returns the blob built for the given target slot.
func (m *Manifest) Blob(target string) (*Blob, bool) {
	if m == nil {
		return nil, false
	}
	for i := range m.Blobs {
		if m.Blobs[i].Target == target {
			return &m.Blobs[i], true
		}
	}
	return nil, false
}

// Store is a blob directory: the embedded one or one on disk.
type Store struct {
	fsys fs.FS
	name string
}

// Embedded returns the blobs compiled into this binary.
func Embedded() *Store {
	sub, err := fs.Sub(embedded, "blobs")
	if err != nil {
		panic(err) // the embed directive guarantees the folder exists
	}
	return &Store{fsys: sub, name: "embedded"}
}

// EnvBlobDir names the environment variable that points Default at a blob
// directory on disk (with its manifest.json) instead of the embedded blobs:
// a way to try freshly built blobs without rebuilding the binary.
const EnvBlobDir = "GDNKCP_BLOB_DIR"

// Default returns the blobs a run uses: the directory named by GDNKCP_BLOB_DIR
// when it is set, else the embedded blobs.
func Default() *Store {
	if d := os.Getenv(EnvBlobDir); d != "" {
		return Dir(d)
	}
	return Embedded()
}

// Dir returns the blob directory at path on disk.
func Dir(path string) *Store {
	return &Store{fsys: os.DirFS(path), name: filepath.Clean(path)}
}

// Name says where the store's files come from.
func (s *Store) Name() string {
	if s == nil {
		return ""
	}
	return s.name
}

// Manifest reads and decodes the store's manifest.
func (s *Store) Manifest() (*Manifest, error) {
	if s == nil {
		return nil, errNilStore
	}
	raw, err := fs.ReadFile(s.fsys, ManifestName)
	if err != nil {
		return nil, fmt.Errorf("ptx: %s: read manifest: %w", s.name, err)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("ptx: %s: decode %s: %w", s.name, ManifestName, err)
	}
	return &m, nil
}

// ReadFile returns the raw bytes of one file of the store.
func (s *Store) ReadFile(name string) ([]byte, error) {
	if s == nil {
		return nil, errNilStore
	}
	raw, err := fs.ReadFile(s.fsys, name)
	if err != nil {
		return nil, fmt.Errorf("ptx: %s: %w", s.name, err)
	}
	return raw, nil
}

// Load returns the bytes of a manifest blob after checking its sha256.
func (s *Store) Load(b *Blob) ([]byte, error) {
	if b == nil {
		return nil, errors.New("ptx: Load: nil blob")
	}
	raw, err := s.ReadFile(b.File)
	if err != nil {
		return nil, err
	}
	if got := SHA256(raw); got != b.SHA256 {
		return nil, fmt.Errorf("ptx: %s: blob %s (%s): sha256 %s, manifest says %s", s.name, b.File, b.Target, got, b.SHA256)
	}
	return raw, nil
}

// errNilStore is what the methods of a nil *Store return.
var errNilStore = errors.New("ptx: nil blob store")

// SHA256 returns the lower-case hex sha256 of data.
func SHA256(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
