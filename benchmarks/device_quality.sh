#!/usr/bin/env bash
# One call on the 2-GPU machine, after `source .device-kit/on-device.sh` (carry .build-cache for the built
# extension): held-out quality on lego over SEEDS for splatfacto and bytesplat (renderers gsplat and fused on
# 1 GPU, gsplat on 2 GPUs), every run at once (benchmarks/quality_seeds.py), each evaluated with ns-eval.
# VIEWS (default 7000) training views per run; LANES: quality_seeds.py --lane options replacing the default four.
# Files in $OUT: quality_seeds.json, quality_seeds.log. Table last.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export BYTESPLAT_EXT_DIR=${BYTESPLAT_EXT_DIR:-$PWD/.build-cache/ext}
python3 -c "from bytesplat_ns.cuda import ops; ops.ext()"  # build once, before the runs that load it
lanes=(--lane splatfacto=splatfacto --lane "gsplat=bytesplat --pipeline.model.renderer gsplat"
       --lane "fused=bytesplat --pipeline.model.renderer fused"
       --lane "2gpu=bytesplat --machine.num-devices 2 --pin-cpus False")
if [ -n "${LANES:-}" ]; then eval "lanes=($LANES)"; fi
python3 benchmarks/quality_seeds.py --data .device-kit/data/lego --views "${VIEWS:-7000}" --seeds ${SEEDS:-42 43 44} \
  "${lanes[@]}" --json "$OUT/quality_seeds.json" > "$OUT/quality_seeds.log" 2>&1
status=$?
grep -h "Error\|error" /tmp/quality-seeds/*.log 2>/dev/null | sort | uniq -c | head -8
tail -7 "$OUT/quality_seeds.log"
exit $status
