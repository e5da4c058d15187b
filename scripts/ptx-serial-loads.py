#!/usr/bin/env python3
"""ptx-serial-loads.py: finds global loads that a kernel issues one round trip after another.

The pattern (found in the thirty-fourth session in mma8r's copy_raw and the fold phase's copies): a loop or an
unrolled sequence where each global load sits in its own branch (`x = i < n ? load : 0`) and its store comes after
the join, so the next load is issued only after that store has consumed this one. Each link costs a full memory
round trip (~1-1.5 us under load). Issuing every load before the first store (into registers) removes the chain.

It reads PTX (the blobs' compute_80 PTX, or `nvcc -ptx` of a staged tree with any local nvcc: the structure is
the source's), splits it into entries, and per entry walks the global loads (ld.global, not cp.async, not param
loads) in order: a load that comes after a store which itself follows an earlier load (with a label or branch
between that load and the store) extends a chain. Chains of at least --min links are printed with their PTX line
numbers. It is a heuristic: a rolled loop with one load and one store an iteration shows as one link (count its
trips by hand), and ptxas may still overlap what it can prove independent; read the source before changing it.

  python3 scripts/ptx-serial-loads.py ptx/blobs/gdnkcp.compute_80.ptx [--entry REGEX] [--min 3]
"""
import argparse
import re
import sys


def entries(text):
    """(name, lines) of each .entry / .func in the PTX text."""
    for part in re.split(r"\n(?=\.visible \.entry |\.entry |\.func |\.visible \.func )", text):
        m = re.match(r"\.(?:visible\s+\.)?(?:entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", part)
        if m:
            yield m.group(1), part.split("\n")


LOAD = re.compile(r"^(@!?%p\d+\s+)?ld\.global\b")
STORE = re.compile(r"^(@!?%p\d+\s+)?st\.(shared|global)\b")


def chains(lines):
    """The chains of serialized loads in one entry: lists of (line number, text)."""
    out, cur = [], []
    state = "idle"  # idle -> loaded -> (joined) -> stored -> next load extends the chain
    for i, raw in enumerate(lines):
        s = raw.strip()
        if LOAD.match(s):
            if state == "stored" and cur:
                cur.append((i, s))
            else:
                if len(cur) > 1:
                    out.append(cur)
                cur = [(i, s)]
            state = "loaded"
        elif s.startswith("$L__") or re.search(r"\bbra(\.uni)?\b", s):
            if state == "loaded":
                state = "joined"
        elif STORE.match(s) and state in ("loaded", "joined"):
            state = "stored"  # (a store in the load's own block counts too: ptxas may not move the next load above it)
    if len(cur) > 1:
        out.append(cur)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ptx")
    ap.add_argument("--entry", default="", help="only entries whose name matches this regex")
    ap.add_argument("--min", type=int, default=3, help="report chains of at least this many loads (default 3)")
    a = ap.parse_args()
    text = open(a.ptx).read()
    found = 0
    for name, lines in entries(text):
        if a.entry and not re.search(a.entry, name):
            continue
        for c in chains(lines):
            if len(c) < a.min:
                continue
            found += 1
            print(f"{name}: {len(c)} loads in a chain, PTX lines {c[0][0]}-{c[-1][0]} of the entry:")
            for i, s in c[:4]:
                print(f"    {i:6d}  {s[:100]}")
            if len(c) > 4:
                print(f"    ... {len(c) - 4} more")
    print(f"ptx-serial-loads: {found} chain(s) of {a.min} or more loads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
