"""The reader of an ncu source page (ncu -i REP --page source --csv --print-source sass, as
scripts/ncu-source.sh writes it) shared by scripts/ncu-sass.py and scripts/ncu-phases.py."""
import csv
import sys


def num(s):
    """A counter cell as a float (thousands separators dropped; 0 for an empty or non-numeric cell)."""
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return 0.0


def read(path, who):
    """The table's header names, its instruction rows and a column index by name; exits with a message
    naming WHO when the file has no header row with a Source column."""
    rows = list(csv.reader(open(path, newline="")))
    hi = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if hi is None:
        sys.exit(f"{who}: no header row with a Source column")
    head = [c.strip() for c in rows[hi]]
    body = [r for r in rows[hi + 1:] if len(r) == len(head)]
    return head, body, {h: i for i, h in enumerate(head)}


def opcode(source):
    """A SASS line's opcode without its modifiers and predicate ("@P0 BRA ..." -> "BRA"); "?" for an empty line."""
    t = source.strip().split()
    if not t:
        return "?"
    return (t[1] if t[0].startswith("@") and len(t) > 1 else t[0]).split(".")[0]
