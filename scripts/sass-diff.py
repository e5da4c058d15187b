#!/usr/bin/env python3
"""sass-diff.py: what changed in one kernel's SASS between two builds, by opcode.

    python3 scripts/sass-diff.py A.sass[.gz] B.sass[.gz] FUNCTION_REGEX [--top N]

A and B are `cuobjdump -sass` dumps (scripts/sass-stats.sh writes them to $OUT/NAME.sass.gz on the GPU
machine; bring both back and run this here, no GPU needed). For every function whose name matches the regex
in both dumps it prints the instruction count of each, then the opcodes whose counts differ, largest
difference first (an opcode is the mnemonic with its modifiers, e.g. LDS.U.128, STG.E.64, MEMBAR.ALL.GPU,
predicates dropped), and the counts of a few kinds that usually explain a slower kernel: local memory
(LDL / STL), barriers (BAR), memory fences (MEMBAR / FENCE), warpgroup waits (WARPGROUP.DEPBAR /
WARPGROUP.ARRIVE), warp syncs (WARPSYNC / BSSY / BSYNC). The 2026-12-03 finding it was written for: a
never-executed thread-0 branch made the bf16 tape walk 2.50 -> 3.82 ms with the same HGMMA structure
(ptx/staging/parked/README.md, walk_overlap.patch).
"""
import argparse
import collections
import gzip
import re
import sys

FUNC = re.compile(r"Function : (\S+)")
# "        /*0120*/                   @!P0 LDG.E.128 R4, desc[UR6][R2.64] ;"
INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)")
KINDS = {
    "local memory (LDL, STL)": ("LDL", "STL"),
    "barriers (BAR)": ("BAR",),
    "fences (MEMBAR, FENCE)": ("MEMBAR", "FENCE"),
    "warpgroup (WARPGROUP.*)": ("WARPGROUP",),
    "warp sync (WARPSYNC, BSSY, BSYNC)": ("WARPSYNC", "BSSY", "BSYNC"),
    "tensor (HGMMA, HMMA)": ("HGMMA", "HMMA"),
}


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", errors="replace") as f:
        return f.read().split("\n")


def histograms(lines, pat):
    out, fn = {}, None
    for line in lines:
        m = FUNC.search(line)
        if m:
            fn = m.group(1)
            if pat.search(fn):
                out[fn] = collections.Counter()
            else:
                fn = None
            continue
        if fn is None:
            continue
        m = INSN.search(line)
        if m:
            out[fn][m.group(1)] += 1
    return out


def kind_count(h, prefixes):
    return sum(n for op, n in h.items() if op.startswith(prefixes))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("function")
    ap.add_argument("--top", type=int, default=25, help="opcodes to list (largest differences)")
    args = ap.parse_args()
    pat = re.compile(args.function)
    ha, hb = histograms(read(args.a), pat), histograms(read(args.b), pat)
    common = [f for f in ha if f in hb]
    if not common:
        print(f"sass-diff: no function matching {args.function!r} in both dumps "
              f"(A: {sorted(ha) or 'none'}, B: {sorted(hb) or 'none'})", file=sys.stderr)
        return 1
    for fn in common:
        a, b = ha[fn], hb[fn]
        print(f"== {fn}: {sum(a.values())} instructions in A, {sum(b.values())} in B")
        for kind, prefixes in KINDS.items():
            ka, kb = kind_count(a, prefixes), kind_count(b, prefixes)
            mark = "" if ka == kb else "   <-"
            print(f"   {kind:38s} {ka:6d} {kb:6d}{mark}")
        diffs = sorted(((b[op] - a[op], op) for op in set(a) | set(b) if a[op] != b[op]), key=lambda d: (-abs(d[0]), d[1]))
        if not diffs:
            print("   every opcode's count is the same")
            continue
        print(f"   {'opcode':38s} {'A':>6s} {'B':>6s} {'B - A':>6s}")
        for d, op in diffs[: args.top]:
            print(f"   {op:38s} {a[op]:6d} {b[op]:6d} {d:+6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
