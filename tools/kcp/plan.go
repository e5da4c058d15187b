package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/sched"
)

func init() { register(newPlanCmd) }

// The sweep of plan --all: every pack x these CP sizes x every layout x
// sched.ReferenceProfiles().
var allCPs = []int{2, 4, 8}

type planOptions struct {
	pack, docs, layout, arch, rule string
	cp, sms, hv, hqk               int
	json, all, lean                bool
}

func newPlanCmd() *cobra.Command {
	var o planOptions
	cmd := &cobra.Command{
		Use:   "plan (--pack NAME | --docs L1,L2,...) --cp R --layout C|Z|D [flags]  |  plan --all [--json]",
		Short: "Lay a pack out over CP ranks and show every walk's width under rules A and B",
		Long: `plan cuts a pack of documents over R context-parallel ranks in layout C (contiguous),
Z (whole-buffer zigzag) or D (per-document zigzag), and shows per rank its segments and,
per walk (summary, state, offset, tape), the walked chains (chunk counts), n_walk, the
LPT makespans of the one-CTA and two-CTA grids over 2*SM slots, the width vh under rule
A (previous) and rule B (current), and why.

Without --arch it plans for the GPU present, or says there is none. --sms defaults to
the architecture's SM count (sm_100a, sm_103a, sm_107a: 148; sm_90a: 132; generic: give it).
--lean-forward plans a run whose walks store no fp32 per-chunk states, as the GPU
backend's v5 core stage does (sm_90a's measured rule then costs a wide walk less: 2 narrow
ones in the forward, where it is 9/4; in the backward 5/3 in both, since the v5.32 walks).
On sm_90a each rank's offset and tape walks (and, with --lean-forward, its state walk) also
show their best split between the widths by that cost model (some (segment, head) walks at
vh 128, the rest at vh 64, launched side by side; the split's costs are 5/3 for all three, and
each puts at most half of a chain's heads at vh 128)
and whether kcp run and bench take it (2% or more under the better single width; not with
--single-width).

--all plans every pack P1-P5 x CP 2/4/8 x layout C/Z/D on the four reference profiles
(sm_100a, sm_103a, sm_107a with 148 SMs, sm_90a with 132) and summarizes which decisions
rule B changes, and which walks' slowest rank a split between the widths would shorten
(sm_90a, by its cost model; --all's runs are not lean, so only the offset and tape walks). With --json, stdout holds only JSON (for --all, an array of plans; the
A/B summary then goes to stderr).`,
		Example: `  kcp plan --pack P3 --cp 8 --layout D --arch sm_100a
  kcp plan --docs 1000,2000,30000 --cp 4 --layout Z --arch generic --sms 84 --json
  kcp plan --all`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVar(&o.pack, "pack", "", "benchmark pack: P1, P2, P3, P4 or P5")
	f.StringVar(&o.docs, "docs", "", "document lengths in tokens, comma-separated (instead of --pack)")
	f.IntVar(&o.cp, "cp", 0, "CP ranks R, 1..64")
	f.StringVar(&o.layout, "layout", "", "layout: C, Z or D")
	f.StringVar(&o.arch, "arch", "", "width-rule variant: "+strings.Join(sched.Variants(), ", ")+" (default: the GPU present)")
	f.IntVar(&o.sms, "sms", 0, "SM count (default: the architecture's)")
	f.IntVar(&o.hv, "hv", kcp.DefaultHV, "value heads HV")
	f.IntVar(&o.hqk, "hqk", kcp.DefaultHQK, "query/key heads; HV must be a multiple")
	f.StringVar(&o.rule, "rule", "b", "rule whose reason the output shows: a or b (both widths are always shown)")
	f.BoolVar(&o.json, "json", false, "write JSON to stdout, nothing else")
	f.BoolVar(&o.all, "all", false, "every pack x CP 2/4/8 x layout x reference profile, and an A/B summary")
	f.BoolVar(&o.lean, "lean-forward", false, "the walks store no fp32 per-chunk states (the GPU backend's v5 core stage)")
	return cmd
}

func (o *planOptions) run(cmd *cobra.Command) error {
	changed := cmd.Flags().Changed
	if o.hv < 1 || o.hqk < 1 {
		return fmt.Errorf("--hv %d, --hqk %d: head counts must be at least 1", o.hv, o.hqk)
	}
	rule, err := sched.ParseRule(o.rule)
	if err != nil {
		return fmt.Errorf("--rule: %w", err)
	}
	if changed("sms") && o.sms < 1 {
		return fmt.Errorf("--sms %d: the SM count must be at least 1", o.sms)
	}
	if o.all {
		var set []string
		for _, name := range []string{"pack", "docs", "cp", "layout", "arch", "sms"} {
			if changed(name) {
				set = append(set, "--"+name)
			}
		}
		if len(set) > 0 {
			return fmt.Errorf("--all plans every pack, CP 2/4/8, layout and reference profile; it does not take %s",
				strings.Join(set, ", "))
		}
		return o.runAll(cmd, rule)
	}

	name, docs, err := o.pickDocs(changed)
	if err != nil {
		return err
	}
	if !changed("cp") {
		return errors.New("--cp is required (the number of CP ranks, 1..64)")
	}
	if !changed("layout") {
		return errors.New("--layout is required (C, Z or D)")
	}
	layout, err := kcp.ParseLayout(o.layout)
	if err != nil {
		return fmt.Errorf("--layout: %w", err)
	}
	prof, detected, err := o.profile(changed)
	if err != nil {
		return err
	}
	prof.LeanForward = o.lean
	p, err := kcp.NewPlan(kcp.PlanConfig{Docs: docs, Ranks: o.cp, Layout: layout, HQK: o.hqk, HV: o.hv})
	if err != nil {
		return err
	}
	pj, err := buildPlanJSON(name, p, prof, rule)
	if err != nil {
		return err
	}
	pj.Detected = detected
	if o.json {
		return writeJSON(cmd.OutOrStdout(), pj)
	}
	return writePlanText(cmd.OutOrStdout(), pj, p)
}

// pickDocs returns the pack's name and lengths from --pack or --docs.
func (o *planOptions) pickDocs(changed func(string) bool) (string, []int, error) {
	switch {
	case changed("pack") && changed("docs"):
		return "", nil, errors.New("give --pack or --docs, not both")
	case changed("pack"):
		pk, err := kcp.PackByName(o.pack)
		if err != nil {
			return "", nil, fmt.Errorf("--pack: %w", err)
		}
		return pk.Name, pk.Docs, nil
	case changed("docs"):
		docs, err := parseDocs(o.docs)
		return "custom", docs, err
	}
	return "", nil, errors.New("give --pack P1..P5 or --docs L1,L2,... (or --all)")
}

// parseDocs reads comma-separated token counts; the plan checks their values.
func parseDocs(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("--docs: no documents")
	}
	var docs []int
	for i, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("--docs: document %d: %q is not a token count", i, f)
		}
		docs = append(docs, n)
	}
	return docs, nil
}

// profile is --arch with --sms, or the GPU present (then also a line naming
// it).
func (o *planOptions) profile(changed func(string) bool) (sched.Profile, string, error) {
	if !changed("arch") {
		prof, detected, err := detectGPU()
		if err != nil {
			return sched.Profile{}, "", err
		}
		if changed("sms") {
			prof.SMs = o.sms
			detected += fmt.Sprintf("; --sms %d", o.sms)
		}
		return prof, detected, prof.Validate()
	}
	prof, err := sched.NewProfile(strings.TrimSpace(o.arch), o.sms)
	if err != nil {
		return sched.Profile{}, "", fmt.Errorf("--arch %s: %w", o.arch, err)
	}
	return prof, "", nil
}

func (o *planOptions) runAll(cmd *cobra.Command, rule sched.Rule) error {
	var plans []planJSON
	for _, pk := range kcp.Packs() {
		for _, cp := range allCPs {
			for _, layout := range kcp.Layouts() {
				p, err := kcp.NewPlan(kcp.PlanConfig{Docs: pk.Docs, Ranks: cp, Layout: layout, HQK: o.hqk, HV: o.hv})
				if err != nil {
					return err
				}
				for _, prof := range sched.ReferenceProfiles() {
					pj, err := buildPlanJSON(pk.Name, p, prof, rule)
					if err != nil {
						return err
					}
					plans = append(plans, pj)
				}
			}
		}
	}
	sum := summarize(plans)
	if o.json {
		if err := writeAllJSON(cmd.OutOrStdout(), plans); err != nil {
			return err
		}
		return writeSummary(cmd.ErrOrStderr(), sum)
	}
	if err := writeAllText(cmd.OutOrStdout(), plans); err != nil {
		return err
	}
	if err := writeMixedText(cmd.OutOrStdout(), plans); err != nil {
		return err
	}
	return writeSummary(cmd.OutOrStdout(), sum)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(v)
}
