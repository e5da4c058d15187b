#!/usr/bin/env python3
"""same-sass.py: whether a blob rebuild changed any kernel's machine code.

    python3 scripts/same-sass.py OLD_DIR NEW_DIR

On the GPU machine (cuobjdump there). For every cubin in both folders it splits `cuobjdump -sass` into
functions and compares each function's SASS text (instructions and their encodings) between OLD and NEW;
for the PTX files it compares each .entry's text. Prints a line a blob (functions compared, identical,
changed, only in one) and the changed functions with their instruction counts; exit 1 where any differs.
For a source change meant to change no code (a macro, a helper factored out): identical SASS means every
timing and GPU test of the old blobs holds for the new ones.
"""
import os
import re
import subprocess
import sys

FUNC = re.compile(r"^\s*Function : (\S+)", re.M)
INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+\S")


def sass_functions(path):
    text = subprocess.run(["cuobjdump", "-sass", path], check=True, capture_output=True, text=True).stdout
    marks = list(FUNC.finditer(text))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out[m.group(1)] = text[m.end():end].strip()
    return out


def ptx_entries(path):
    text = open(path).read()
    out, name, buf = {}, None, []
    for line in text.split("\n"):
        m = re.match(r"\.visible \.entry (\w+)\(", line)
        if m:
            if name:
                out[name] = "\n".join(buf)
            name, buf = m.group(1), []
        if name:
            buf.append(line)
    if name:
        out[name] = "\n".join(buf)
    return out


def main():
    old, new = sys.argv[1], sys.argv[2]
    bad = 0
    for f in sorted(os.listdir(old)):
        if f.endswith(".cubin"):
            read = sass_functions
        elif f.endswith(".ptx"):
            read = ptx_entries
        else:
            continue
        if not os.path.exists(os.path.join(new, f)):
            print(f"{f}: not in {new}")
            bad += 1
            continue
        a, b = read(os.path.join(old, f)), read(os.path.join(new, f))
        changed = sorted(n for n in a.keys() & b.keys() if a[n] != b[n])
        only = sorted(a.keys() ^ b.keys())
        same = len(a.keys() & b.keys()) - len(changed)
        print(f"{f}: {len(a.keys() | b.keys())} functions, {same} identical, {len(changed)} changed, {len(only)} in one only")
        for n in changed:
            print(f"  changed: {n} ({len(INSN.findall(a[n]))} -> {len(INSN.findall(b[n]))} instructions)"
                  if read is sass_functions else f"  changed: {n} ({a[n].count(chr(10))} -> {b[n].count(chr(10))} lines)")
        for n in only:
            print(f"  only in {'old' if n in a else 'new'}: {n}")
        bad += len(changed) + len(only)
    print(f"same-sass: {'identical' if bad == 0 else f'{bad} differences'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
