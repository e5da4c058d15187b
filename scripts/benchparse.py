"""benchparse: the one reader of `kcp bench`'s text output for the A/B scripts (ab-bench.sh, knob-sweep.sh).

stages(path) yields (mode, stage, ms) in file order: the header line of each mode as stage "total"
("core, v5 kernels, ... median of 5: 3.469 ms ...") and each indented stage line after it ("  prep  1.268 ms")
of at least 0.01 ms (the empty stages print 0.001). A missing file yields nothing.
"""
import collections
import re

_HEADER = re.compile(r"(\S+), .* median of \d+: ([\d.]+) ms")
_STAGE = re.compile(r"\s+(.+?)\s+([\d.]+) ms$")


def stages(path):
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return
    mode = None
    for line in lines:
        m = _HEADER.match(line)
        if m:
            mode = m.group(1)
            yield mode, "total", float(m.group(2))
            continue
        m = _STAGE.match(line)
        if m and mode and float(m.group(2)) >= 0.01:
            yield mode, m.group(1), float(m.group(2))


def sweep_rows(logs, rounds, sets, packs):
    """The stages of logs/bench-SET-PACK-ROUND.txt for every pack, round and set (the A/B scripts' file names):
    an ordered dict from (pack, mode, stage) to {set: [ms of each round]}."""
    rows = collections.OrderedDict()
    for p in packs:
        for r in range(1, rounds + 1):
            for s in sets:
                for mode, stage, ms in stages(f"{logs}/bench-{s}-{p}-{r}.txt"):
                    rows.setdefault((p, mode, stage), collections.defaultdict(list))[s].append(ms)
    return rows


def print_sweep(rows, sets, rounds):
    """Prints sweep_rows' table: one line per (pack, mode, stage), one column per set, the rounds side by side."""
    w = 7 * rounds
    print(f"{'pack':18s} {'mode':9s} {'stage':18s} " + " ".join(f"{s:>{w}s}" for s in sets))
    for (p, mode, stage), v in rows.items():
        print(f"{p[:18]:18s} {mode:9s} {stage[:18]:18s} " + " ".join(f"{' '.join(f'{x:.3f}' for x in v[s]):>{w}s}" for s in sets))
