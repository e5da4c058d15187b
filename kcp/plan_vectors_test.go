package kcp

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/sched"
)

var update = flag.Bool("update", false, "rewrite testdata/packs.json and testdata/width_vectors.json")

var (
	packsFile   = filepath.Join("..", "testdata", "packs.json")
	vectorsFile = filepath.Join("..", "testdata", "width_vectors.json")
)

// vectorCPs are the CP sizes of the pinned vectors.
var vectorCPs = []int{2, 4, 8}

// packsJSON is testdata/packs.json as written from the packs table.
func packsJSON(t *testing.T) []byte {
	var b bytes.Buffer
	b.WriteString(`{"note":"the five packs of the upstream benchmark (shared/reference/seed-pr.md); written from kcp/plan_packs.go by go test ./kcp -run TestPacksFile -update",` + "\n")
	b.WriteString(`"packs":[` + "\n")
	for i, p := range Packs() {
		line, err := json.Marshal(p)
		require.NoError(t, err)
		b.Write(line)
		if i < len(packs)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString("]}\n")
	return b.Bytes()
}

func TestPacksFile(t *testing.T) {
	// Totals as upstream reports them.
	want := map[string]int{"P1": 241817, "P2": 261987, "P3": 259174, "P4": 254976, "P5": 249856}
	docs := map[string]int{"P1": 6, "P2": 3, "P3": 2, "P4": 1, "P5": 4}
	require.Len(t, Packs(), 5)
	for _, p := range Packs() {
		sum := 0
		for _, l := range p.Docs {
			sum += l
		}
		assert.Equal(t, want[p.Name], sum, p.Name)
		assert.Equal(t, want[p.Name], p.Tokens, p.Name)
		assert.Len(t, p.Docs, docs[p.Name], p.Name)
	}
	gen := packsJSON(t)
	if *update {
		require.NoError(t, os.WriteFile(packsFile, gen, 0o644))
	}
	pinned, err := os.ReadFile(packsFile)
	require.NoError(t, err, "run go test ./kcp -run TestPacksFile -update to write it")
	var file struct{ Packs []Pack }
	require.NoError(t, json.Unmarshal(pinned, &file))
	assert.Equal(t, Packs(), file.Packs, "%s differs from kcp/plan_packs.go", packsFile)
	assert.Equal(t, string(gen), string(pinned), "%s is not as written (go test ./kcp -run TestPacksFile -update)", packsFile)
}

func TestPackByName(t *testing.T) {
	p, err := PackByName("p3")
	require.NoError(t, err)
	assert.Equal(t, []int{200000, 59174}, p.Docs)
	p.Docs[0] = 1
	again, _ := PackByName("P3")
	assert.Equal(t, 200000, again.Docs[0], "packs are copies")
	_, err = PackByName("P6")
	assert.ErrorContains(t, err, `unknown pack "P6" (known: P1, P2, P3, P4, P5)`)
}

// vectorRow is one line of testdata/width_vectors.json: one walk of one rank
// of one (pack, CP, layout, profile).
type vectorRow struct {
	Pack      string `json:"pack"`
	CP        int    `json:"cp"`
	Layout    string `json:"layout"`
	Arch      string `json:"arch"`
	SMs       int    `json:"sms"`
	Rank      int    `json:"rank"`
	Walk      string `json:"walk"`
	Segments  []int  `json:"segments"`
	Chains    []int  `json:"chains"`
	NWalk     int    `json:"n_walk"`
	Longest   int    `json:"longest_chain"`
	Makespan1 int    `json:"makespan_1cta"`
	Makespan2 int    `json:"makespan_2cta"`
	VHA       *int   `json:"vh_a"`
	VHB       *int   `json:"vh_b"`
}

func (r vectorRow) key() string {
	return fmt.Sprintf("%s CP%d %s %s/%d rank %d %s", r.Pack, r.CP, r.Layout, r.Arch, r.SMs, r.Rank, r.Walk)
}

func vhPtr(vh int) *int {
	if vh == 0 {
		return nil
	}
	return &vh
}

func widthVectorRows(t *testing.T) []vectorRow {
	var rows []vectorRow
	for _, pk := range Packs() {
		for _, cp := range vectorCPs {
			for _, layout := range Layouts() {
				p, err := NewPlan(PlanConfig{Docs: pk.Docs, Ranks: cp, Layout: layout})
				require.NoError(t, err)
				for _, prof := range sched.ReferenceProfiles() {
					for r := range p.Ranks {
						for _, k := range sched.WalkKinds() {
							a, err := p.Width(r, k, prof, sched.RuleA)
							require.NoError(t, err)
							b, err := p.Width(r, k, prof, sched.RuleB)
							require.NoError(t, err)
							segs := p.Ranks[r].Walk(k)
							if segs == nil {
								segs = []int{}
							}
							rows = append(rows, vectorRow{
								Pack: pk.Name, CP: cp, Layout: string(layout), Arch: prof.Variant, SMs: prof.SMs,
								Rank: r, Walk: k.String(), Segments: segs, Chains: p.Ranks[r].WalkChains(k),
								NWalk: b.NWalk, Longest: b.LongestChain, Makespan1: b.Makespan1, Makespan2: b.Makespan2,
								VHA: vhPtr(a.VH), VHB: vhPtr(b.VH),
							})
						}
					}
				}
			}
		}
	}
	return rows
}

func vectorsJSON(t *testing.T, rows []vectorRow) []byte {
	var b bytes.Buffer
	b.WriteString(`{"note":"pinned width decisions: packs P1-P5 x CP 2/4/8 x layouts C/Z/D x profiles x rank x walk; ` +
		`HV 48, chunk 64; vh_a/vh_b are the widths under rules A and B (null: empty walk list); ` +
		`written by go test ./kcp -run TestWidthVectors -update",` + "\n")
	b.WriteString(`"hv":48,"chunk":64,"rows":[` + "\n")
	for i, r := range rows {
		line, err := json.Marshal(r)
		require.NoError(t, err)
		b.Write(line)
		if i < len(rows)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString("]}\n")
	return b.Bytes()
}

// rowLines maps each row's key to its JSON line.
func rowLines(t *testing.T, data []byte) map[string]string {
	var file struct {
		Rows []json.RawMessage `json:"rows"`
	}
	require.NoError(t, json.Unmarshal(data, &file))
	out := map[string]string{}
	for _, raw := range file.Rows {
		var r vectorRow
		require.NoError(t, json.Unmarshal(raw, &r))
		out[r.key()] = string(raw)
	}
	return out
}

// fieldDiff names the fields that differ between two JSON rows.
func fieldDiff(t *testing.T, pinned, now string) string {
	var a, b map[string]any
	require.NoError(t, json.Unmarshal([]byte(pinned), &a))
	require.NoError(t, json.Unmarshal([]byte(now), &b))
	var out []string
	for k, v := range b {
		if w, _ := json.Marshal(a[k]); string(w) != mustJSON(t, v) {
			out = append(out, fmt.Sprintf("%s pinned %s, now %s", k, w, mustJSON(t, v)))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestWidthVectors(t *testing.T) {
	rows := widthVectorRows(t)
	require.Len(t, rows, 5*(2+4+8)*3*4*4)
	gen := vectorsJSON(t, rows)
	require.Less(t, len(gen), 2<<20, "keep the pinned vectors under 2 MB")
	if *update {
		require.NoError(t, os.WriteFile(vectorsFile, gen, 0o644))
	}
	pinned, err := os.ReadFile(vectorsFile)
	require.NoError(t, err, "run go test ./kcp -run TestWidthVectors -update to write it")
	if bytes.Equal(gen, pinned) {
		return
	}
	// Say which rows differ and how.
	now, was := rowLines(t, gen), rowLines(t, pinned)
	var diff []string
	for _, r := range rows {
		k := r.key()
		switch old, ok := was[k]; {
		case !ok:
			diff = append(diff, fmt.Sprintf("%s: new row\n    now    %s", k, now[k]))
		case old != now[k]:
			diff = append(diff, fmt.Sprintf("%s: %s\n    pinned %s\n    now    %s", k, fieldDiff(t, old, now[k]), old, now[k]))
		}
		delete(was, k)
	}
	for k, old := range was {
		diff = append(diff, fmt.Sprintf("%s: row gone\n    pinned %s", k, old))
	}
	n := len(diff)
	if n > 20 {
		diff = append(diff[:20], fmt.Sprintf("... and %d more", n-20))
	}
	if n == 0 {
		diff = []string{"rows are equal; the header or formatting differs"}
	}
	t.Fatalf("%s differs from the decisions computed now in %d rows (rewrite on purpose with "+
		"go test ./kcp -run TestWidthVectors -update):\n%s", vectorsFile, n, strings.Join(diff, "\n"))
}
