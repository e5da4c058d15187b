"""benchparse: the one reader of `kcp bench`'s text output for the A/B scripts (ab-bench.sh, knob-sweep.sh).

stages(path) yields (mode, stage, ms) in file order: the header line of each mode as stage "total"
("core, v5 kernels, ... median of 5: 3.469 ms ...") and each indented stage line after it ("  prep  1.268 ms")
of at least 0.01 ms (the empty stages print 0.001). A missing file yields nothing.
"""
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
