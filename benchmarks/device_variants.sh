#!/usr/bin/env bash
# One call on the GPU machine (after `source .device-kit/on-device.sh`), issue #3: the fused kernel of other
# source trees timed beside this tree's, on the same machine. VARIANTS="dir ..." names copies of the project
# (e.g. `git archive <experiment branch> | tar -x -C <dir>`; an ignored dir travels when `carry` names it).
# Every tree's extension builds at once (this tree's through device_build.sh), then, for this tree and each
# variant in turn, the tests (THIS_TESTS for this tree, VARIANT_TESTS for the others; default
# tests/test_fused_backend.py) and benchmarks/fused_kernel.py with FUSED_ARGS (no ncu).
# $OUT: gpu.txt, build.log, variants.log (builds, tests, timings), <tree>_fused_kernel.json; a table of all trees
# last.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export BYTESPLAT_EXT_DIR=${BYTESPLAT_EXT_DIR:-$PWD/.build-cache/ext}
root=$PWD log="$OUT/variants.log"
start=$(date +%s)
: > "$log"
for dir in ${VARIANTS:-}; do  # the variants' builds in the background, while this tree's builds below
  (cd "$dir" && PYTHONPATH="$PWD:$PYTHONPATH" python3 -c "from bytesplat_ns.cuda import build; build.load()" \
    > "/tmp/build-$(basename "$dir").log" 2>&1) &
done
source benchmarks/device_build.sh
wait
for dir in ${VARIANTS:-}; do tail -3 "/tmp/build-$(basename "$dir").log" | sed "s|^|build $(basename "$dir"): |" >> "$log"; done
echo "builds: $(( $(date +%s) - start )) s"
for dir in "$root" ${VARIANTS:-}; do
  name=$(basename "$dir") tests=${VARIANT_TESTS:-tests/test_fused_backend.py}
  [ "$dir" = "$root" ] && name=this tests=${THIS_TESTS:-$tests}
  (
    cd "$dir" || exit 1
    export PYTHONPATH="$PWD:$PYTHONPATH"
    echo "== $name: $tests" >> "$log"
    python3 -m pytest -p no:cacheprovider -q -rs $tests 2>&1 | tail -4 >> "$log"
    python3 benchmarks/fused_kernel.py --json "$OUT/${name}_fused_kernel.json" ${FUSED_ARGS:-} 2>&1 | tail -30 >> "$log"
  )
  echo "$name: tests and timings done at $(( $(date +%s) - start )) s"
done
grep -h "^== \| passed\| failed\|rror" "$log" | head -30
python3 - "$OUT" "$root" ${VARIANTS:-} <<'PY'
import json, sys
from pathlib import Path

out, names = Path(sys.argv[1]), ["this"] + [Path(d).name for d in sys.argv[3:]]
print(f"{'tree':12} {'scene':6} {'variant':18} {'ms':>8} {'x gsplat':>9}")
for name in names:
    path = out / f"{name}_fused_kernel.json"
    if not path.exists():
        print(f"{name:12} no results (see variants.log)")
        continue
    for scene, row in json.loads(path.read_text())["scenes"].items():
        gsplat = row["ms"]["gsplat"]
        timed = {v: row["ms"][v] for v in ("gsplat", "fused_l1")}
        timed |= {f"fused_l1@{b}": t["fused_l1"] for b, t in row["ms_by_blocks_per_sm"].items()}
        for variant, ms in timed.items():
            print(f"{name:12} {scene:6} {variant:18} {ms:8.3f} {gsplat / ms:9.2f}")
PY
