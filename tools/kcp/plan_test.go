package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/sched"
)

// execute runs the CLI in-process.
func execute(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestPlanJSONSchema(t *testing.T) {
	stdout, stderr, code := execute("plan", "--pack", "P3", "--cp", "8", "--layout", "D", "--arch", "sm_100a", "--json")
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, stderr)
	require.True(t, json.Valid([]byte(stdout)), "stdout holds only JSON")

	// The schema's names and types, read generically.
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &m))
	assert.Equal(t, "P3", m["pack"])
	assert.Equal(t, []any{200000.0, 59174.0}, m["docs"])
	assert.Equal(t, 8.0, m["cp"])
	assert.Equal(t, "D", m["layout"])
	assert.Equal(t, "sm_100a", m["arch"])
	assert.Equal(t, 148.0, m["sms"])
	assert.Equal(t, 48.0, m["hv"])
	assert.Equal(t, 64.0, m["chunk"])
	ranks, ok := m["ranks"].([]any)
	require.True(t, ok)
	require.Len(t, ranks, 8)
	walkNames := map[string]bool{"summary": true, "state": true, "offset": true, "tape": true}
	for i, r := range ranks {
		rm := r.(map[string]any)
		assert.Equal(t, float64(i), rm["rank"])
		assert.IsType(t, 0.0, rm["tokens"])
		segs := rm["segments"].([]any)
		for _, s := range segs {
			sm := s.(map[string]any)
			for _, k := range []string{"doc", "start", "len", "chunks"} {
				assert.IsType(t, 0.0, sm[k], k)
			}
		}
		walks := rm["walks"].([]any)
		require.Len(t, walks, 4)
		for _, w := range walks {
			wm := w.(map[string]any)
			assert.True(t, walkNames[wm["walk"].(string)])
			for _, k := range []string{"segments", "chains"} {
				assert.IsType(t, []any{}, wm[k], k)
			}
			for _, k := range []string{"n_walk", "makespan_1cta", "makespan_2cta"} {
				assert.IsType(t, 0.0, wm[k], k)
			}
			for _, k := range []string{"vh_a", "vh_b"} {
				v, present := wm[k]
				require.True(t, present, k)
				if wm["n_walk"].(float64) == 0 {
					assert.Nil(t, v, k)
				} else {
					assert.Contains(t, []any{64.0, 128.0}, v, k)
				}
			}
			assert.IsType(t, "", wm["reason"])
		}
	}

	// And against the plan itself.
	var pj planJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
	p, err := kcp.NewPlan(kcp.PlanConfig{Docs: []int{200000, 59174}, Ranks: 8, Layout: kcp.LayoutD})
	require.NoError(t, err)
	prof := sched.Profile{Variant: "sm_100a", SMs: 148}
	for r, rj := range pj.Ranks {
		rp := p.Ranks[r]
		assert.Equal(t, rp.Tokens, rj.Tokens)
		require.Len(t, rj.Segments, len(rp.Segments))
		for i, s := range rp.Segments {
			assert.Equal(t, []int{s.Doc, s.Start, s.Len, s.Chunks}, []int{rj.Segments[i].Doc, rj.Segments[i].Start,
				rj.Segments[i].Len, rj.Segments[i].Chunks})
		}
		for k, wj := range rj.Walks {
			kind := sched.WalkKind(k)
			assert.Equal(t, kind.String(), wj.Walk)
			assert.Equal(t, rp.WalkChains(kind), wj.Chains)
			d, err := p.Width(r, kind, prof, sched.RuleB)
			require.NoError(t, err)
			assert.Equal(t, d.Reason, wj.Reason)
			assert.Equal(t, d.Reason, wj.ReasonB)
			assert.Equal(t, d.Makespan2, wj.Makespan2)
		}
	}
}

func TestPlanEmptyWalkListsAreNull(t *testing.T) {
	// P4 is one document; at CP 1 nothing has a predecessor or a successor.
	stdout, stderr, code := execute("plan", "--pack", "p4", "--cp", "1", "--layout", "c", "--arch", "sm_103a", "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, `"walk": "summary",
     "segments": [],
     "chains": [],
     "n_walk": 0,`)
	var pj map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
	walk := pj["ranks"].([]any)[0].(map[string]any)["walks"].([]any)[0].(map[string]any)
	assert.Nil(t, walk["vh_a"])
	assert.Nil(t, walk["vh_b"])
	assert.Contains(t, walk["reason"], "launch nothing")
}

func TestPlanDocsAndRule(t *testing.T) {
	stdout, stderr, code := execute("plan", "--docs", "1000, 2000,30000", "--cp", "4", "--layout", "Z",
		"--arch", "generic", "--sms", "84", "--rule", "a", "--hv", "32", "--hqk", "8", "--json")
	require.Equal(t, 0, code, stderr)
	var pj planJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
	assert.Equal(t, "custom", pj.Pack)
	assert.Equal(t, []int{1000, 2000, 30000}, pj.Docs)
	assert.Equal(t, 84, pj.SMs)
	assert.Equal(t, 32, pj.HV)
	assert.Equal(t, 8, pj.HQK)
	assert.Equal(t, "A", pj.Rule)
	for _, rj := range pj.Ranks {
		for _, wj := range rj.Walks {
			assert.Equal(t, wj.ReasonA, wj.Reason)
			assert.Contains(t, wj.Reason, "rule A")
		}
	}
}

// --lean-forward plans a run whose walks store no fp32 per-chunk states (the
// GPU backend's v5 core stage), where sm_90a's rule costs a vh 128 forward
// chunk 2 vh 64 ones instead of 9/4. Two 32,768-token documents are that
// rule's tie (M64 = 2 M128), which takes vh 64: measured faster there on the
// v5.34 walks (2.161 against 2.179 ms, the twenty-sixth session's sweep; on
// v5.21-v5.33, with 15/8, vh 128 was, and the rule took it). The
// 120,908-token pack's tape walk takes vh 64 in both stages: with the v5.32
// walks it measured 8% faster than vh 128 in the core stage (5.161 against
// 5.606 ms, the twenty-fourth session's sweep), where v5.31's took vh 128 at
// 7% faster, the one lean-run decision the backward's own lean cost (10/7
// then, unset now) changed.
func TestPlanLeanForward(t *testing.T) {
	plan := func(docs string, extra ...string) (map[string]int, map[string]string) {
		args := append([]string{"plan", "--docs", docs, "--cp", "1", "--layout", "C", "--arch", "sm_90a", "--json"}, extra...)
		stdout, stderr, code := execute(args...)
		require.Equal(t, 0, code, stderr)
		var pj planJSON
		require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
		require.Len(t, pj.Ranks, 1)
		widths, reasons := map[string]int{}, map[string]string{}
		for _, wj := range pj.Ranks[0].Walks {
			if wj.VHB != nil {
				widths[wj.Walk], reasons[wj.Walk] = *wj.VHB, wj.Reason
			}
		}
		return widths, reasons
	}
	w, r := plan("32768,32768")
	assert.Equal(t, map[string]int{"state": 64, "tape": 128}, w)
	assert.Contains(t, r["state"], "M64 = 1024 x 4 = 4096 <= M128 = 512 x 9 = 4608")
	assert.NotContains(t, r["state"], "lean forward")
	w, r = plan("32768,32768", "--lean-forward")
	assert.Equal(t, map[string]int{"state": 64, "tape": 128}, w)
	assert.Contains(t, r["state"], "lean forward")
	assert.Contains(t, r["state"], "M64 = 1024 x 1 = 1024 <= M128 = 512 x 2 = 1024")
	w, _ = plan("40000,45000,35908")
	assert.Equal(t, map[string]int{"state": 64, "tape": 64}, w)
	w, _ = plan("40000,45000,35908", "--lean-forward")
	assert.Equal(t, map[string]int{"state": 64, "tape": 64}, w)
}

func TestPlanText(t *testing.T) {
	stdout, stderr, code := execute("plan", "--pack", "P1", "--cp", "8", "--layout", "D", "--arch", "sm_107a")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stdout, "pack P1: 6 documents, 241817 tokens; CP 8, layout D")
	assert.Contains(t, stdout, "arch sm_107a, 148 SMs (296 LPT slots)")
	for r := range 8 {
		assert.Contains(t, stdout, fmt.Sprintf("\nrank %d: ", r))
	}
	assert.Contains(t, stdout, "walk     segments")
	assert.Contains(t, stdout, "two-wave rule")
	assert.False(t, json.Valid([]byte(stdout)))
}

func TestPlanDetectedGPU(t *testing.T) {
	saved := detectGPU
	t.Cleanup(func() { detectGPU = saved })

	// The real detection: a GPU profile, or an error that asks for --arch.
	if prof, line, err := saved(); err != nil {
		assert.Contains(t, err.Error(), "pass --arch")
	} else {
		assert.NoError(t, prof.Validate())
		assert.NotEmpty(t, line)
	}

	detectGPU = func() (sched.Profile, string, error) {
		return sched.Profile{}, "", errors.New("no GPU detected (loader: CUDA driver library not found); pass --arch")
	}
	_, stderr, code := execute("plan", "--pack", "P2", "--cp", "2", "--layout", "C")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "kcp: error: no GPU detected")
	assert.Contains(t, stderr, "pass --arch")

	detectGPU = func() (sched.Profile, string, error) {
		return sched.Profile{Variant: "sm_90a", SMs: 132}, "GPU 0: NVIDIA H200 (CC 9.0, 132 SMs)", nil
	}
	stdout, stderr, code := execute("plan", "--pack", "P2", "--cp", "2", "--layout", "C", "--json")
	require.Equal(t, 0, code, stderr)
	var pj planJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
	assert.Equal(t, []any{"sm_90a", 132}, []any{pj.Arch, pj.SMs})
	assert.Equal(t, "GPU 0: NVIDIA H200 (CC 9.0, 132 SMs)", pj.Detected)
	stdout, _, code = execute("plan", "--pack", "P2", "--cp", "2", "--layout", "C")
	require.Equal(t, 0, code)
	assert.Contains(t, stdout, "detected GPU 0: NVIDIA H200")
	stdout, stderr, code = execute("plan", "--pack", "P2", "--cp", "2", "--layout", "C", "--sms", "114", "--json")
	require.Equal(t, 0, code, stderr)
	require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
	assert.Equal(t, 114, pj.SMs)
}

func TestPlanErrors(t *testing.T) {
	base := []string{"plan", "--cp", "4", "--layout", "D", "--arch", "sm_100a"}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	tests := []struct {
		name string
		args []string
		msg  string
	}{
		{"no pack or docs", with(), "give --pack P1..P5 or --docs"},
		{"pack and docs", with("--pack", "P1", "--docs", "5"), "not both"},
		{"unknown pack", with("--pack", "P9"), `unknown pack "P9"`},
		{"empty docs", with("--docs", ""), "no documents"},
		{"docs not a number", with("--docs", "10,x"), `document 1: "x" is not a token count`},
		{"zero length", with("--docs", "10,0"), "document 1 has length 0"},
		{"negative length", with("--docs", "-10"), "document 0 has length -10"},
		{"cp 0", []string{"plan", "--pack", "P1", "--cp", "0", "--layout", "D", "--arch", "sm_100a"}, "0 ranks, need 1..64"},
		{"cp 65", []string{"plan", "--pack", "P1", "--cp", "65", "--layout", "D", "--arch", "sm_100a"}, "65 ranks"},
		{"cp missing", []string{"plan", "--pack", "P1", "--layout", "D", "--arch", "sm_100a"}, "--cp is required"},
		{"cp not a number", with("--pack", "P1", "--cp", "four"), "invalid argument"},
		{"layout missing", []string{"plan", "--pack", "P1", "--cp", "2", "--arch", "sm_100a"}, "--layout is required"},
		{"unknown layout", with("--pack", "P1", "--layout", "Q"), `unknown layout "Q"`},
		{"HV not a multiple of HQK", with("--pack", "P1", "--hv", "40"), "HV 40 is not a multiple of HQK 16"},
		{"HV 0", with("--pack", "P1", "--hv", "0"), "head counts must be at least 1"},
		{"HQK negative", with("--pack", "P1", "--hqk", "-16"), "head counts must be at least 1"},
		{"SMs 0", with("--pack", "P1", "--sms", "0"), "--sms 0: the SM count must be at least 1"},
		{"SMs negative", with("--pack", "P1", "--sms", "-148"), "--sms -148"},
		{"unknown arch", []string{"plan", "--pack", "P1", "--cp", "2", "--layout", "D", "--arch", "sm_75"}, `unknown arch variant "sm_75"`},
		{"generic without SMs", []string{"plan", "--pack", "P1", "--cp", "2", "--layout", "D", "--arch", "generic"}, "no default SM count"},
		{"unknown rule", with("--pack", "P1", "--rule", "c"), `unknown rule "c"`},
		{"all with pack", []string{"plan", "--all", "--pack", "P1"}, "it does not take --pack"},
		{"all with arch and cp", []string{"plan", "--all", "--arch", "sm_90a", "--cp", "2"}, "--cp, --arch"},
		{"unknown flag", with("--pack", "P1", "--gpus", "2"), "unknown flag: --gpus"},
		{"positional argument", with("--pack", "P1", "extra"), `unknown command "extra"`},
		{"unknown command", []string{"plans"}, `unknown command "plans"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := execute(tc.args...)
			assert.Equal(t, 1, code)
			assert.Empty(t, stdout)
			assert.Contains(t, stderr, tc.msg)
			assert.True(t, strings.HasPrefix(stderr, "kcp: error: "), stderr)
		})
	}
}

// vectorRow is a row of testdata/width_vectors.json (written by package kcp's
// tests).
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

func TestPlanAllMatchesPinnedVectors(t *testing.T) {
	stdout, stderr, code := execute("plan", "--all", "--json")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "A/B summary", "the summary goes to stderr with --json")
	var plans []planJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &plans), "stdout holds only JSON")
	require.Len(t, plans, 5*3*3*4)

	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "width_vectors.json"))
	require.NoError(t, err)
	var file struct {
		HV   int         `json:"hv"`
		Rows []vectorRow `json:"rows"`
	}
	require.NoError(t, json.Unmarshal(data, &file))
	require.Equal(t, 48, file.HV)
	pinned := map[string]vectorRow{}
	for _, r := range file.Rows {
		pinned[fmt.Sprintf("%s/%d/%s/%s/%d/%d/%s", r.Pack, r.CP, r.Layout, r.Arch, r.SMs, r.Rank, r.Walk)] = r
	}
	matched := 0
	for _, pj := range plans {
		for _, rj := range pj.Ranks {
			for _, wj := range rj.Walks {
				key := fmt.Sprintf("%s/%d/%s/%s/%d/%d/%s", pj.Pack, pj.CP, pj.Layout, pj.Arch, pj.SMs, rj.Rank, wj.Walk)
				want, ok := pinned[key]
				require.True(t, ok, "no pinned row for %s", key)
				got := vectorRow{
					Pack: pj.Pack, CP: pj.CP, Layout: pj.Layout, Arch: pj.Arch, SMs: pj.SMs, Rank: rj.Rank, Walk: wj.Walk,
					Segments: wj.Segments, Chains: wj.Chains, NWalk: wj.NWalk, Longest: wj.LongestChain,
					Makespan1: wj.Makespan1, Makespan2: wj.Makespan2, VHA: wj.VHA, VHB: wj.VHB,
				}
				require.Equal(t, want, got, key)
				matched++
			}
		}
	}
	assert.Equal(t, len(file.Rows), matched, "every pinned row is planned")
}

func TestPlanAllText(t *testing.T) {
	stdout, stderr, code := execute("plan", "--all")
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, stderr)
	assert.Contains(t, stdout, "launches whose width rule B changes")
	assert.Contains(t, stdout, "A/B summary")
	for _, p := range sched.ReferenceProfiles() {
		assert.Contains(t, stdout, "\n"+p.String()+" ")
	}
	assert.Contains(t, stdout, "of 90")
	// The walks a split shortens: sm_90a only (the one cost rule), each one
	// faster by the model; --all plans runs that are not lean, whose state
	// walks the model does not split.
	block := stdout[strings.Index(stdout, "walks whose slowest rank a split between the widths shortens"):]
	block = block[:strings.Index(block, "\n\n")]
	lines := strings.Split(block, "\n")[3:]
	require.NotEmpty(t, lines)
	for _, l := range lines {
		f := strings.Fields(l)
		require.GreaterOrEqual(t, len(f), 9, l)
		assert.Equal(t, "sm_90a/132", f[3], l)
		assert.Contains(t, []string{"offset", "tape"}, f[4], l)
		before, err1 := strconv.Atoi(f[5])
		after, err2 := strconv.Atoi(f[7])
		require.NoError(t, errors.Join(err1, err2), l)
		assert.Less(t, after, before, l)
	}
	assert.Contains(t, block, "P5    2   Z       sm_90a/132  tape    4752 -> 4480 (-5.7%)")
	// Capped at half a chain's heads: the uncapped model put all 48 heads of
	// rank 1's longer chain at vh 128 (4011 -> 3538, -11.8%).
	assert.Contains(t, block, "P1    4   Z       sm_90a/132  offset  4011 -> 3765 (-6.1%)")
}

func TestSummarizeCounts(t *testing.T) {
	v := func(x int) *int { return &x }
	mk := func(walk string, a, b *int) walkJSON { return walkJSON{Walk: walk, VHA: a, VHB: b} }
	plans := []planJSON{
		{Arch: "sm_100a", SMs: 148, Ranks: []rankJSON{
			{Walks: []walkJSON{mk("summary", nil, nil), mk("state", v(128), v(64)), mk("offset", v(64), v(64)), mk("tape", v(128), v(64))}},
			{Walks: []walkJSON{mk("summary", v(64), v(64)), mk("state", v(128), v(64)), mk("offset", v(64), v(64)), mk("tape", v(64), v(64))}},
		}},
		{Arch: "sm_100a", SMs: 148, Ranks: []rankJSON{
			{Walks: []walkJSON{mk("summary", nil, nil), mk("state", v(64), v(64)), mk("offset", nil, nil), mk("tape", v(128), v(64))}},
		}},
		{Arch: "sm_100a", SMs: 148, Ranks: []rankJSON{
			{Walks: []walkJSON{mk("summary", nil, nil), mk("state", v(64), v(64)), mk("offset", nil, nil), mk("tape", v(64), v(64))}},
		}},
	}
	got := summarize(plans)
	require.Len(t, got, 1)
	assert.Equal(t, profileSummary{
		Profile: "sm_100a/148", Launches: 11, Changed: 4, ChangedFwd: 2, ChangedBwd: 2,
		WalkRows: 12, WalkRowsChange: 3, Rows: 3, RowsChanged: 2, B1Changed: 1, B3Changed: 2,
	}, got[0])
}

// TestPlanSplits: on sm_90a the plan shows the backward walks' best splits
// between the widths (sched.MixedWalk), and with --lean-forward the state
// walk's, and whether kcp run and bench take them: issue 6's three-document
// pack splits 72 of its 144 tape walks (and, lean, of its state walks) at 11%
// under vh 64's makespan; two equal documents do not split (vh 128 packs
// them); the summary walk, the state walk of a run that is not lean, and
// variants without a cost rule show none. P1 at CP 4 in layout Z splits rank
// 1's offset walk (two column sets a walk) 6.1% under its best single width,
// half the heads of its longer chain wide.
func TestPlanSplits(t *testing.T) {
	for _, c := range []struct {
		docs, arch string
		lean       bool
		taken      bool
		walks128   int
		none       bool
	}{
		{"40000,45000,35908", "sm_90a", false, true, 72, false},
		{"40000,45000,35908", "sm_90a", true, true, 72, false},
		{"32768,32768", "sm_90a", false, false, 0, false},
		{"40000,45000,35908", "sm_100a", true, false, 0, true},
	} {
		t.Run(fmt.Sprintf("%s/%s/lean %v", c.docs, c.arch, c.lean), func(t *testing.T) {
			args := []string{"plan", "--docs", c.docs, "--cp", "1", "--layout", "C", "--arch", c.arch}
			if c.lean {
				args = append(args, "--lean-forward")
			}
			stdout, stderr, code := execute(append(args, "--json")...)
			require.Equal(t, 0, code, stderr)
			var pj planJSON
			require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
			for _, wj := range pj.Ranks[0].Walks {
				if !(wj.Walk == "tape" || (wj.Walk == "state" && c.lean)) || c.none {
					assert.Nil(t, wj.Mixed, "%s walk", wj.Walk)
					continue
				}
				require.NotNil(t, wj.Mixed)
				assert.Equal(t, c.taken, wj.Mixed.Taken, wj.Mixed.Summary)
				if c.taken {
					assert.Equal(t, c.walks128, wj.Mixed.Walks128)
					assert.Equal(t, 3*1686, wj.Mixed.Single) // both walks' split costs are 5/3
					assert.Less(t, 100*wj.Mixed.Makespan, 98*wj.Mixed.Single)
				}
			}
			text, stderr, code := execute(args...)
			require.Equal(t, 0, code, stderr)
			switch {
			case c.none:
				assert.NotContains(t, text, "split between the widths")
			case c.taken:
				assert.Contains(t, text, "tape walk split between the widths (kcp run and bench unless --single-width): mixed: 72 of 144")
				assert.Contains(t, text, ": taken (margin 2%)")
				if c.lean {
					assert.Contains(t, text, "state walk split between the widths (kcp run and bench unless --single-width): mixed: 72 of 144")
				} else {
					assert.NotContains(t, text, "state walk split")
				}
			default:
				assert.Contains(t, text, ": not taken (margin 2%)")
			}
		})
	}
	stdout, stderr, code := execute("plan", "--pack", "P1", "--cp", "4", "--layout", "Z", "--arch", "sm_90a", "--json")
	require.Equal(t, 0, code, stderr)
	var pj planJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &pj))
	var off *mixedJSON
	for _, wj := range pj.Ranks[1].Walks {
		if wj.Walk == "offset" {
			off = wj.Mixed
		}
		if wj.Walk == "summary" || wj.Walk == "state" {
			assert.Nil(t, wj.Mixed, "%s walk", wj.Walk)
		}
	}
	require.NotNil(t, off, "rank 1's offset walk")
	assert.True(t, off.Taken, off.Summary)
	assert.Equal(t, 4011, off.Single, off.Summary)
	assert.Equal(t, 3765, off.Makespan, off.Summary)
	assert.Contains(t, off.Summary, "per chain [24 0]", "at most half the heads of a chain wide")
}
