package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/gdnkcp/gdnkcp/kcp"
	"github.com/gdnkcp/gdnkcp/sched"
)

func vhString(v *int) string {
	if v == nil {
		return "-"
	}
	return strconv.Itoa(*v)
}

func intsString(xs []int) string {
	if len(xs) == 0 {
		return "-"
	}
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

func refString(r *kcp.SegRef) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("r%d.s%d", r.Rank, r.Seg)
}

// why is a decision's reason without its "<walk> walk, rule X: vh = N: "
// head, which the table's columns already say.
func why(reason string) string {
	if i := strings.Index(reason, ": vh = "); i >= 0 {
		rest := reason[i+len(": vh = "):]
		if j := strings.Index(rest, ": "); j >= 0 {
			return rest[j+2:]
		}
	}
	if i := strings.Index(reason, ": "); i >= 0 {
		return reason[i+2:]
	}
	return reason
}

// count is "1 token", "2 tokens".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// writePlanText writes one plan as tables, one block per rank.
func writePlanText(w io.Writer, pj planJSON, p *kcp.Plan) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "pack %s: %s, %s; CP %d, layout %s\n", pj.Pack, count(len(pj.Docs), "document"),
		count(pj.Tokens, "token"), pj.CP, pj.Layout)
	fmt.Fprintf(b, "arch %s, %d SMs (%d LPT slots); HV %d, HQK %d, chunk %d; reasons: rule %s\n",
		pj.Arch, pj.SMs, 2*pj.SMs, pj.HV, pj.HQK, pj.Chunk, pj.Rule)
	if pj.Detected != "" {
		fmt.Fprintf(b, "  detected %s\n", pj.Detected)
	}
	fmt.Fprintf(b, "  %s\n", pj.ArchNote)
	for r, rj := range pj.Ranks {
		rp := p.Ranks[r]
		parts := make([]string, len(rp.Parts))
		for i, pt := range rp.Parts {
			parts[i] = fmt.Sprintf("[%d,%d)", pt.Start, pt.End)
		}
		fmt.Fprintf(b, "\nrank %d: %s, %s; parts %s\n", r, count(rj.Tokens, "token"), count(len(rj.Segments), "segment"),
			strings.Join(parts, " "))
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  seg\tdoc\tstart\tlen\tchunks\tlocal\tpred\tsucc\thalo (rank.seg@offset+count)")
		for i, s := range rp.Segments {
			halo := make([]string, len(s.Halo))
			for j, h := range s.Halo {
				halo[j] = fmt.Sprintf("r%d.s%d@%d+%d", h.Rank, h.Seg, h.Offset, h.Count)
			}
			hs := strings.Join(halo, ",")
			if hs == "" {
				hs = "-"
			}
			fmt.Fprintf(tw, "  %d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", i, s.Doc, s.Start, s.Len, s.Chunks, s.LocalStart,
				refString(s.Pred), refString(s.Succ), hs)
		}
		if len(rp.Segments) == 0 {
			fmt.Fprintln(tw, "  (no tokens)")
		}
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "  walk\tsegments\tchains\tn_walk\tlongest\tLPT 1-CTA\tLPT 2-CTA\tvh A\tvh B\twhy (rule %s)\n", pj.Rule)
		for _, wj := range rj.Walks {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", wj.Walk, intsString(wj.Segments),
				intsString(wj.Chains), wj.NWalk, wj.LongestChain, wj.Makespan1, wj.Makespan2,
				vhString(wj.VHA), vhString(wj.VHB), why(wj.Reason))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, wj := range rj.Walks {
			if m := wj.Mixed; m != nil {
				taken := "not taken"
				if m.Taken {
					taken = "taken"
				}
				fmt.Fprintf(b, "  %s walk split between the widths (kcp run and bench unless --single-width): %s: %s (margin %d%%)\n",
					wj.Walk, m.Summary, taken, sched.MixedMarginPercent)
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeAllJSON writes the plans of --all as a JSON array, one plan a line.
func writeAllJSON(w io.Writer, plans []planJSON) error {
	b := &strings.Builder{}
	b.WriteString("[\n")
	for i, pj := range plans {
		line, err := json.Marshal(pj)
		if err != nil {
			return err
		}
		b.Write(line)
		if i < len(plans)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("]\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeAllText lists, for --all, every (plan, walk) whose width rule B
// changes on some rank.
func writeAllText(w io.Writer, plans []planJSON) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "launches whose width rule B changes (rank: vh under A -> under B); every other launch is the same under both rules")
	fmt.Fprintln(tw, "pack\tcp\tlayout\tarch\twalk\tchanged launches")
	for _, pj := range plans {
		for k := range pj.Ranks[0].Walks {
			var changes []string
			for _, rj := range pj.Ranks {
				wj := rj.Walks[k]
				if vhString(wj.VHA) != vhString(wj.VHB) {
					changes = append(changes, fmt.Sprintf("r%d: %s->%s", rj.Rank, vhString(wj.VHA), vhString(wj.VHB)))
				}
			}
			if len(changes) > 0 {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s/%d\t%s\t%s\n", pj.Pack, pj.CP, pj.Layout, pj.Arch, pj.SMs,
					pj.Ranks[0].Walks[k].Walk, strings.Join(changes, ", "))
			}
		}
	}
	fmt.Fprintln(tw)
	return tw.Flush()
}

// writeMixedText lists, for --all, the (row, walk) pairs whose slowest
// rank's walk a split between the widths (kcp run and bench unless
// --single-width) shortens by the cost model: the largest makespan of that
// walk over the ranks at the rule's width, and with each rank's split where
// it is taken.
func writeMixedText(w io.Writer, plans []planJSON) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "walks whose slowest rank a split between the widths shortens (kcp run and bench unless --single-width;")
	fmt.Fprintln(tw, "makespans in cost units: chunks x the rule's chunk cost; profiles with a measured cost rule only)")
	fmt.Fprintln(tw, "pack\tcp\tlayout\tarch\twalk\tslowest rank's walk: rule -> split\tranks split")
	rows := 0
	for _, pj := range plans {
		for k := range pj.Ranks[0].Walks {
			before, after := 0, 0
			var split []string
			for _, rj := range pj.Ranks {
				m := rj.Walks[k].Mixed
				if m == nil {
					continue
				}
				a := m.Single
				if m.Taken {
					a = m.Makespan
					split = append(split, fmt.Sprintf("r%d", rj.Rank))
				}
				before, after = max(before, m.Single), max(after, a)
			}
			if after < before {
				rows++
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s/%d\t%s\t%d -> %d (%.1f%%)\t%s\n", pj.Pack, pj.CP, pj.Layout, pj.Arch, pj.SMs,
					pj.Ranks[0].Walks[k].Walk, before, after, 100*float64(after-before)/float64(before), strings.Join(split, ", "))
			}
		}
	}
	if rows == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	fmt.Fprintln(tw)
	return tw.Flush()
}

// profileSummary counts, for one profile, what rule B changes.
type profileSummary struct {
	Profile                  string
	Launches, Changed        int // non-empty (row, rank, walk) launches; those whose vh differs
	ChangedFwd, ChangedBwd   int // of Changed: summary/state, offset/tape
	WalkRows, WalkRowsChange int // (row, walk kind) pairs; those with a changed launch on some rank
	Rows, RowsChanged        int // rows (pack x CP x layout); those with a changed launch
	B1Changed, B3Changed     int // rows whose forward launches change (B1); rows with any change (B3)
}

func summarize(plans []planJSON) []profileSummary {
	var out []profileSummary
	index := map[string]int{}
	for _, pj := range plans {
		name := fmt.Sprintf("%s/%d", pj.Arch, pj.SMs)
		i, ok := index[name]
		if !ok {
			i = len(out)
			index[name] = i
			out = append(out, profileSummary{Profile: name})
		}
		s := &out[i]
		s.Rows++
		rowFwd, rowAny := false, false
		for k := range pj.Ranks[0].Walks {
			s.WalkRows++
			walkChanged := false
			for _, rj := range pj.Ranks {
				wj := rj.Walks[k]
				if wj.VHB == nil {
					continue
				}
				s.Launches++
				if *wj.VHA == *wj.VHB {
					continue
				}
				s.Changed++
				walkChanged = true
				if wj.Walk == "summary" || wj.Walk == "state" {
					s.ChangedFwd++
					rowFwd = true
				} else {
					s.ChangedBwd++
				}
			}
			if walkChanged {
				s.WalkRowsChange++
				rowAny = true
			}
		}
		if rowAny {
			s.RowsChanged++
			s.B3Changed++
		}
		if rowFwd {
			s.B1Changed++
		}
	}
	return out
}

func writeSummary(w io.Writer, sums []profileSummary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "A/B summary: what rule B changes against rule A, per profile")
	fmt.Fprintln(tw, "  a row is pack x CP x layout (5 x 3 x 3 = 45 per profile); a launch is one (row, rank, walk) with a")
	fmt.Fprintln(tw, "  non-empty walk list; a (row, walk) pair changes when a launch of that walk changes on any rank.")
	fmt.Fprintln(tw, "  Upstream counts rows of pack x CP x layout x {B1, B3} and reports 33 of its 66 measured rows changed on")
	fmt.Fprintln(tw, "  GB200/GB300. Counted the same way here: a B1 row (forward only) changes when a summary or state launch")
	fmt.Fprintln(tw, "  changes; a B3 row (forward, recompute, replay and backward) when any launch changes; 90 rows per profile.")
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "profile\tlaunches changed\t(fwd / bwd)\t(row, walk) changed\trows changed\tB1 rows\tB3 rows\tB1+B3 rows")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%d of %d\t%d / %d\t%d of %d\t%d of %d\t%d of %d\t%d of %d\t%d of %d\n", s.Profile,
			s.Changed, s.Launches, s.ChangedFwd, s.ChangedBwd, s.WalkRowsChange, s.WalkRows, s.RowsChanged, s.Rows,
			s.B1Changed, s.Rows, s.B3Changed, s.Rows, s.B1Changed+s.B3Changed, 2*s.Rows)
	}
	return tw.Flush()
}
