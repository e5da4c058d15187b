#!/usr/bin/env bash
# knob-sweep.sh: one device call that times several values of compile-time knobs of the kernel sources
# against the committed blobs, so that a staged change with a knob (or two) is answered in one call instead
# of one land-check call per value.
#   VARIANTS (required): space-separated NAME=MACRO=V[,MACRO2=V2...]; every MACRO must have a `#define MACRO V`
#            default in some file of SRC (the value is rewritten there in a copy of SRC; nothing is passed
#            with -D, so what is timed is exactly what ptxgen would embed).
#   SRC:     the sources the variants start from (default ptx/src: after scripts/land-prep.sh, the tree
#            with the staged patches applied).
# Steps:
#   1. per variant, a copy of SRC with its defaults, and ptxas on its plane walks alone (scripts/walk-regs.sh);
#      a variant whose walks spill, do not compile or have their wgmmas serialised by ptxas (its "Potential
#      Performance Loss" warning) is dropped (reported, not timed); SPILL_GATE=0 skips it;
#   2. ptxgen on every remaining variant, all at once;
#   3. kcp bench on A (ptx/blobs, the committed blobs) and each variant in turn, ROUNDS rounds (default 2),
#      MODES (default core) at DOCS (default 32768) and, unless DOCS2 is empty, at DOCS2 (default
#      40000,45000,35908); REPS (default 5) medians; BENCH_FLAGS: more flags for kcp bench (e.g. --split-grads);
#   4. the table: one line per (pack, mode, stage), one column per set, the rounds side by side;
#   5. with TEST_VARIANT=NAME (or best: the least sum of the totals) and TESTS=REGEX, the kcp GPU tests of
#      REGEX on that variant's blobs;
#   6. with BITS=1 (and TEST_VARIANT), scripts/ab-bits.sh on that variant's blobs against A (BITS_CONFIGS:
#      its CONFIGS).
# TARGETS=sm_90a builds only that cubin and the compute_80 PTX (ptxgen -targets): step 2 in about a third
# of the time, but blobs to time and test, not to install (scripts/land-suite.sh builds the full set).
# After step 2 every sm_90a entry whose spill stores grew against ptx/blobs is named per variant; SPILL_MORE=drop
# leaves such a variant out of the benches (default: report only).
# STRICT=1 stops the call after step 2 when any variant fails to build (its nvcc errors printed), rather than
# timing the others; after step 2 the registers and spills of the entries matching REGS_GREP (default
# chunk_grads) are printed for every variant (sm_90a, from its manifest).
# Here, after the call: `go run ./tools/ptxcheck --diff ptx/blobs FILES_AT/blobs-NAME.tar.gz` lists the kernels
# whose code a variant changed (every kernel is one translation unit: a knob can move another kernel's code).
# Each variant's blobs come back as $OUT/blobs-NAME.tar.gz (install the winner: scripts/blobs-local.sh install,
# after setting its defaults in ptx/src); logs in $OUT/logs-sweep.tar.gz. At most 6 variants (what comes back
# from a call is 8 files).
# Here first: scripts/land-prep.sh (or scripts/gpu.sh build && scripts/gpu.sh pack kcp kcp.test ptxgen).
# There: run(command="VARIANTS='c0=GDNKCP_WP_COPIERS_FIRST=0 c1=GDNKCP_WP_COPIERS_FIRST=1 c2=GDNKCP_WP_COPIERS_FIRST=2'
#            bash scripts/knob-sweep.sh", carry=[".gpu/pack.tgz"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?}
export PATH=/usr/local/cuda/bin:$PATH
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
src=${SRC:-ptx/src}
variants=${VARIANTS:?VARIANTS: NAME=MACRO=V[,MACRO2=V2] ..., space-separated}
work=/tmp/knob-sweep
rm -rf "$work" && mkdir -p "$work/logs"
names=()
for v in $variants; do
	name=${v%%=*}
	[[ $name =~ ^[A-Za-z0-9_]+$ ]] || { echo "knob-sweep: variant name '$name': letters, digits and _ only" >&2; exit 2; }
	[ "$name" != A ] || { echo "knob-sweep: 'A' names the committed blobs; pick another variant name" >&2; exit 2; }
	rm -rf "$work/src-$name" && cp -r "$src" "$work/src-$name"
	IFS=, read -r -a defs <<<"${v#*=}"
	for d in "${defs[@]}"; do
		m=${d%%=*} val=${d#*=}
		[ "$m" != "$d" ] || { echo "knob-sweep: $name: '$d' is not MACRO=V" >&2; exit 2; }
		f=$(grep -l "^#define $m " "$work/src-$name"/* | head -1)
		[ -n "$f" ] || { echo "knob-sweep: $name: no '#define $m' default in $src" >&2; exit 2; }
		sed -i -E "s|^#define $m .*|#define $m $val|" "$f"
		echo "knob-sweep: $name: $(basename "$f"): $(grep "^#define $m " "$f")"
	done
	names+=("$name")
done
[ ${#names[@]} -le 6 ] || { echo "knob-sweep: ${#names[@]} variants; at most 6" >&2; exit 2; }
# 1. The spill gate, per variant.
kept=()
for n in "${names[@]}"; do
	if [ "${SPILL_GATE:-1}" = 0 ]; then
		kept+=("$n")
		continue
	fi
	SRC="$work/src-$n" bash scripts/walk-regs.sh >"$work/logs/walk-regs-$n.txt" 2>&1
	if ! grep -qE 'gdn_(state|tape)_walk_planes: [0-9]+ regs' "$work/logs/walk-regs-$n.txt"; then
		echo "knob-sweep: $n: walk-regs.sh reported no plane walk, dropped:"
		head -5 "$work/logs/walk-regs-$n.txt"
		continue
	fi
	if grep -qE 'walk[a-z0-9_]*: [0-9]+ regs, [1-9][0-9]* bytes spill stores' "$work/logs/walk-regs-$n.txt"; then
		echo "knob-sweep: $n: a plane walk spills, dropped:"
		grep -E 'bytes spill stores' "$work/logs/walk-regs-$n.txt" | grep -vE ' 0 bytes spill stores'
		continue
	fi
	# (the plane walks only: the v4 wgmma walks, compiled in the same sources, are printed by walk-regs.sh)
	if grep -qE 'ptxas: .*[Pp]erformance [Ll]oss.*walk_planes' "$work/logs/walk-regs-$n.txt"; then
		echo "knob-sweep: $n: ptxas serialises a plane walk's wgmmas, dropped:"
		grep -E 'ptxas: .*walk_planes' "$work/logs/walk-regs-$n.txt" | sort -u | head -3
		continue
	fi
	grep 'ptxas: ' "$work/logs/walk-regs-$n.txt" | sort -u | head -3 | sed "s/^/knob-sweep: $n: /"  # other functions'
	echo "knob-sweep: $n: $(grep -E 'gdn_(state|summary|tape|offset)_walk_planes' "$work/logs/walk-regs-$n.txt" |
		awk '{printf "%s %s, ", $1, $2}')no spill"
	kept+=("$n")
done
[ ${#kept[@]} -gt 0 ] || { echo "knob-sweep: no variant passed the spill gate" >&2; exit 3; }
# 2. The blobs, all at once.
t0=$(date +%s)
for n in "${kept[@]}"; do
	(rm -rf "$work/blobs-$n" && mkdir -p "$work/blobs-$n" &&
		.gpu/ptxgen -src "$work/src-$n" -out "$work/blobs-$n" ${TARGETS:+-targets "$TARGETS"} >"$work/logs/ptxgen-$n.log" 2>&1
		echo $? >"$work/ptxgen-$n.rc") &
done
wait
built=()
for n in "${kept[@]}"; do
	if [ "$(cat "$work/ptxgen-$n.rc")" != 0 ]; then
		echo "knob-sweep: $n: ptxgen failed:"
		{ grep -m 12 -E 'error|Error' "$work/logs/ptxgen-$n.log" || tail -5 "$work/logs/ptxgen-$n.log"; } | cut -c1-300
		failed=1
		continue
	fi
	tar -C "$work/blobs-$n" -czf "$out/blobs-$n.tar.gz" .
	built+=("$n")
done
echo "knob-sweep: blobs of ${built[*]:-none} in $(($(date +%s) - t0)) s"
[ ${#built[@]} -gt 0 ] || exit 1
if [ "${STRICT:-0}" = 1 ] && [ "${failed:-0}" = 1 ]; then
	tar -C "$work" -czf "$out/logs-sweep.tar.gz" logs
	echo "knob-sweep: STRICT=1 and a variant failed to build: stopping before the benches" >&2
	exit 1
fi
# Registers and spills of the entries named by REGS_GREP (a regex; default the chunk-gradient entries), per
# variant, from ptxgen's manifest (sm_90a).
for n in "${built[@]}"; do
	python3 - "$work/blobs-$n/manifest.json" "${REGS_GREP:-chunk_grads}" "$n" <<'PY' || true
import json, re, sys
f, pat, name = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3]
for b in json.load(open(f))["blobs"]:
    if b["target"] != "sm_90a":
        continue
    for e in b["entries"]:
        if pat.search(e["name"]):
            r = e["resources"]
            print(f"knob-sweep: {name}: {e['name']}: {r['registers']} regs, spill {r['spill_stores']}/{r['spill_loads']} bytes")
PY
done
# Spills against the committed blobs (ptx/blobs, sm_90a): every entry whose spill stores grew is named; with
# SPILL_MORE=drop such a variant is not timed (the thirty-first session timed three wgmma variants whose output
# kernel spilled 180-272 bytes, and lost to the spill: a line here would have said so before the benches).
timed=()
for n in "${built[@]}"; do
	grew=$(python3 - ptx/blobs/manifest.json "$work/blobs-$n/manifest.json" <<'PY'
import json, sys
def spills(f):
    for b in json.load(open(f))["blobs"]:
        if b["target"] == "sm_90a":
            return {e["name"]: e["resources"]["spill_stores"] for e in b["entries"]}
    return {}
a, v = spills(sys.argv[1]), spills(sys.argv[2])
print(" ".join(f"{k}:{a.get(k, 0)}->{x}" for k, x in sorted(v.items()) if x > a.get(k, 0)))
PY
	)
	if [ -n "$grew" ]; then
		echo "knob-sweep: $n: spill stores grew against ptx/blobs (sm_90a): $grew"
		if [ "${SPILL_MORE:-report}" = drop ]; then
			echo "knob-sweep: $n: dropped (SPILL_MORE=drop)"
			continue
		fi
	fi
	timed+=("$n")
done
built=("${timed[@]}")
[ ${#built[@]} -gt 0 ] || { echo "knob-sweep: every variant dropped for its spills" >&2; exit 3; }
# 3. The benches: A and every variant in turn, each round, each pack.
sets=(A "${built[@]}")
packs=("${DOCS:-32768}")
[ -n "${DOCS2-40000,45000,35908}" ] && packs+=("${DOCS2-40000,45000,35908}")
for r in $(seq 1 "${ROUNDS:-2}"); do
	for p in "${packs[@]}"; do
		for s in "${sets[@]}"; do
			dir=ptx/blobs
			[ "$s" = A ] || dir=$work/blobs-$s
			GDNKCP_BLOB_DIR=$dir timeout "${BENCH_TIMEOUT:-240}" .gpu/kcp bench --docs "$p" --kernels "${KERNELS:-v5}" \
				--modes "${MODES:-core}" --reps "${REPS:-5}" --warmup 2 ${BENCH_FLAGS:-} >"$work/logs/bench-$s-$p-$r.txt" 2>&1 ||
				echo "knob-sweep: bench $s at $p, round $r: rc $? (logs/bench-$s-$p-$r.txt)"
		done
	done
done
# 4. The table.
PYTHONPATH=scripts python3 - "$work/logs" "${ROUNDS:-2}" "${sets[*]}" "${packs[*]}" "$work/best" <<'PY'
import sys
from benchparse import print_sweep, sweep_rows
logs, rounds, sets, packs, bestf = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5]
rows = sweep_rows(logs, rounds, sets, packs)
print_sweep(rows, sets, rounds)
# The best variant: the least sum of the totals over packs, modes and rounds, among variants with every total.
want = sum(len(v["A"]) for (p, mode, stage), v in rows.items() if stage == "total")
sums = {s: sum(sum(v[s]) for (p, mode, stage), v in rows.items() if stage == "total") for s in sets[1:]
        if sum(len(v[s]) for (p, mode, stage), v in rows.items() if stage == "total") == want}
if sums:
    best = min(sums, key=sums.get)
    a = sum(sum(v["A"]) for (p, mode, stage), v in rows.items() if stage == "total")
    print(f"knob-sweep: best variant {best}: the totals sum to {sums[best]:.3f} ms, A's to {a:.3f}")
    open(bestf, "w").write(best)
PY
# 5. Tests on one variant's blobs (TEST_VARIANT=best: the one step 4 names).
tv=${TEST_VARIANT:-}
[ "$tv" = best ] && tv=$(cat "$work/best" 2>/dev/null)
TEST_VARIANT=$tv
if [ -n "${TEST_VARIANT:-}" ] && [ -n "${TESTS:-}" ]; then
	if [ -d "$work/blobs-$TEST_VARIANT" ]; then
		t0=$(date +%s)
		(cd kcp && GDNKCP_BLOB_DIR=$work/blobs-$TEST_VARIANT ../.gpu/kcp.test -test.run "$TESTS" -test.v -test.timeout 300s \
			>"$work/logs/kcp-$TEST_VARIANT.log" 2>&1)
		echo "knob-sweep: kcp tests on $TEST_VARIANT's blobs: rc=$? ($(($(date +%s) - t0)) s)"
		grep -E "^(--- |FAIL|ok|panic)" "$work/logs/kcp-$TEST_VARIANT.log" | head -20
	else
		echo "knob-sweep: TEST_VARIANT $TEST_VARIANT has no blobs (dropped or failed above)"
	fi
fi
# 6. With BITS=1, scripts/ab-bits.sh on the same variant's blobs against A (the committed blobs): whether a
# change that claims the same bits keeps them (BITS_CONFIGS: ab-bits.sh's CONFIGS, default its own).
if [ "${BITS:-0}" = 1 ] && [ -n "${TEST_VARIANT:-}" ] && [ -d "$work/blobs-$TEST_VARIANT" ]; then
	echo "knob-sweep: ab-bits on $TEST_VARIANT's blobs"
	B=$work/blobs-$TEST_VARIANT CONFIGS=${BITS_CONFIGS:-} bash scripts/ab-bits.sh 2>&1 | tee "$work/logs/ab-bits-$TEST_VARIANT.txt"
fi
tar -C "$work" -czf "$out/logs-sweep.tar.gz" logs
