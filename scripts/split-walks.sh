#!/usr/bin/env bash
# Walks split between the widths (docs/perf-notes.md, "Walks split between the widths"), in one device call:
#
#   here:  bash scripts/gpu.sh build && bash scripts/gpu.sh pack kcp kcp.test
#   there: run(command="bash scripts/split-walks.sh", carry=[".gpu/pack.tgz"])
#
# TestGPUSplitWalks first (split walks' outputs and gradients bitwise against vh 64; TESTS=0 skips it),
# then `kcp bench --modes core+bwd` on DOCS (default: issue 6's three documents) for each of VARIANTS
# (name=flags, ';'-separated; default: a = one width a walk (--single-width), d = the default splits, p = the same
# on prioritised streams, s36 = the state walk split 36 heads of 48), all variants in each of ROUNDS
# rounds, medians of REPS; then `kcp bench --modes core` (issue 5's core forward, the lean state walk) for each
# of FWD_VARIANTS (default: f = the rule's one width (--single-width), d = the default split (24 heads of 48 on
# issue 6's pack), s36 = 36 heads of 48; FWD_VARIANTS= skips them);
# a table of the state walk, tape walk and total last. Logs, JSON under $OUT.
# CP_PACK='P1 4 Z' (off by default) also times `kcp run` of that pack, CP and layout on this one GPU (core
# stage, B1, no check, --reps 3 after a warm-up, --serial-ranks: each rank's stages alone on the GPU) with
# --single-width (a) and without (m: the default splits): every rank's offset and tape walks (`kcp plan --all`
# lists the CP rows a split should shorten). Without --serial-ranks the ranks' streams run side by side and their
# stage times hold each other's work (the thirty-seventh session's try: unreadable).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu/pack.tgz ] && tar -C .gpu -xzf .gpu/pack.tgz
out=${OUT:-/tmp/split-walks}
mkdir -p "$out"
DOCS=${DOCS:-40000,45000,35908}
REPS=${REPS:-5}
ROUNDS=${ROUNDS:-2}
VARIANTS=${VARIANTS:-a=--single-width;d=;p=--split-priority;s36=--split state=36}
FWD_VARIANTS=${FWD_VARIANTS-f=--single-width;d=;s36=--split state=36}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
	(cd kcp && ../.gpu/kcp.test -test.run 'TestGPUSplitWalks|TestCheckSplitHeads' -test.v -test.timeout 400s) >"$out/test.log" 2>&1
	echo "TestGPUSplitWalks: rc=$? pass=$(grep -c -- '--- PASS' "$out/test.log") fail=$(grep -c -- '--- FAIL' "$out/test.log")"
	grep -E -- '--- FAIL|^panic|Error:|Messages:' "$out/test.log" | head -20
fi
IFS=';' read -r -a variants <<<"$VARIANTS"
fwd_variants=()
[ -n "$FWD_VARIANTS" ] && IFS=';' read -r -a fwd_variants <<<"$FWD_VARIANTS"
names=()
for r in $(seq 1 "$ROUNDS"); do
	for mv in "${variants[@]/#/core+bwd:}" "${fwd_variants[@]/#/core:}"; do
		mode=${mv%%:*}
		v=${mv#*:}
		name=${v%%=*}
		flags=${v#*=}
		[ "$r" = 1 ] && names+=("$mode:$name")
		# shellcheck disable=SC2086 # flags are words
		if ! .gpu/kcp bench --docs "$DOCS" --kernels v5 --modes "$mode" --reps "$REPS" --json $flags \
			>"$out/$mode-$name$r.json" 2>"$out/$mode-$name$r.err"; then
			echo "bench $name ($mode, round $r) failed:"
			tail -3 "$out/$mode-$name$r.err"
		fi
	done
done
if [ -n "${CP_PACK:-}" ]; then
	read -r pack cp layout <<<"$CP_PACK"
	for v in a m; do
		flag=
		[ "$v" = a ] && flag=--single-width
		# shellcheck disable=SC2086 # flag is a word or none
		if ! .gpu/kcp run --backend gpu --pack "$pack" --cp "$cp" --layout "$layout" --stage core --mode b1 \
			--check=false --reps 3 --warmup 1 --json --no-progress --serial-ranks $flag >"$out/cp-$v.json" 2>"$out/cp-$v.err"; then
			echo "kcp run $CP_PACK ($v) failed:"
			tail -3 "$out/cp-$v.err"
		fi
	done
	python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
for v in "am":
    try:
        rep = json.load(open(os.path.join(out, f"cp-{v}.json")))
    except Exception as e:
        print(f"cp {v}: no result: {e}")
        continue
    g = rep["gpu"]
    walks = {r["rank"]: {s["stage"]: s["ms"] for s in r["stages"]} for r in g["ranks"]}
    per = "  ".join(f"r{r}: offset {st.get('backward: offset walk', 0):.3f} tape {st.get('backward: tape walk', 0):.3f}"
                    for r, st in sorted(walks.items()))
    # With --serial-ranks a rank's stages other than the exchanges are its work alone on the GPU; kcp run's
    # kernels_ms leaves out the uploads too (host to device copies of the inputs, tens to hundreds of ms).
    print(f"cp {v}: serial {g.get('serial_ranks', False)}; slowest rank's kernels alone r{g['kernels_rank']} {g['kernels_ms']:.3f} ms "
          f"(slowest total {g['slowest_ms']:.3f}); {per}")
PY
fi
python3 - "$out" "$ROUNDS" "${names[@]}" <<'PY'
import json, sys, os
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'mode':8} {'variant':8} {'round':>5} {'state walk ms':>14} {'tape walk ms':>13} {'total ms':>9}  split walks at vh 128")
for mv in names:
    mode, v = mv.split(":", 1)
    for r in range(1, rounds + 1):
        p = os.path.join(out, f"{mode}-{v}{r}.json")
        try:
            row = json.load(open(p))[0]
        except Exception as e:
            print(f"{mode:8} {v:8} {r:5} (no result: {e})")
            continue
        st = row["stage_median_ms"]
        state = st.get("fwd state walk", st.get("state walk", 0))
        print(f"{mode:8} {v:8} {r:5} {state:14.3f} {st.get('bwd tape walk', 0):13.3f} "
              f"{row['median_ms']:9.3f}  {row.get('split_walks_vh128', {})}")
PY
