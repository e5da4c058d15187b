#!/usr/bin/env python3
"""grad-errors.py LOG: the worst checked error of each gradient in a kcp GPU test log (-test.v), by kernel set
(the word before " kernels" in the test's log line; the lines without one are TestGPUBackward's fp32 set) and
stage (module lines carry dconv_w). Lines logged but not checked (a 3-token pack whose bf16 conv output
dominates) are left out. Used by scripts/grads-verify.sh and scripts/post-land.sh."""
import re
import sys

worst = {}
for line in open(sys.argv[1]):
    if ' dq ' not in line or 'dominates' in line:
        continue
    m = re.search(r'(\S+) kernels', line)
    tag = '%s %s' % (m.group(1) if m else 'fp32', 'module' if 'dconv_w' in line else 'core')
    for name, v in re.findall(r'\b(dq|dk|dv|dg|dbeta|dconv_w) ([0-9.e+-]+)', line):
        worst[(tag, name)] = max(worst.get((tag, name), 0.0), float(v))
for tag in sorted({k[0] for k in worst}):
    print('worst errors, %-22s' % tag, ' '.join('%s %.3g' % (n, worst[(tag, n)])
                                                for n in ['dq', 'dk', 'dv', 'dg', 'dbeta', 'dconv_w'] if (tag, n) in worst))
