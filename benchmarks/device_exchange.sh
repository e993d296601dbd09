#!/usr/bin/env bash
# One call on the 1-GPU machine (after `source .device-kit/on-device.sh`; carry .build-cache), issue #4: build the
# CUDA extension (device_build.sh), run GPU_TESTS, then benchmarks/exchange_cost.py with EXCHANGE_ARGS (e.g.
# "--scenes room object --train-room 2000": the exchange's device part on one GPU, on the generated room trained
# 2000 views). With BEFORE=<commit>, the same measurement by that commit's tree (.build-cache/versions/<commit>.tar.gz,
# made here by `git archive --format=tar.gz -o .build-cache/versions/<commit>.tar.gz <commit>`) on the same trained
# run, its extension loaded from the carried cache. Files in $OUT: build.log, pytest.log, exchange_cost.{log,json},
# exchange_cost_before.{log,json}; tables last.
set -uo pipefail
source benchmarks/device_build.sh  # also: $OUT made, the GPUs in $OUT/gpu.txt
run_gpu_tests tests/test_grad_compaction.py
status=0
python3 benchmarks/exchange_cost.py --json "$OUT/exchange_cost.json" ${EXCHANGE_ARGS:-} > "$OUT/exchange_cost.log" 2>&1 \
  || status=1
grep -h -B2 -A12 "Traceback" "$OUT/exchange_cost.log" /tmp/room-runs/*.log 2>/dev/null | tail -30
if [ -n "${BEFORE:-}" ]; then
  run=$(grep -o "room trained: .*: .*" "$OUT/exchange_cost.log" | sed 's/.*: //')
  rm -rf /tmp/before && mkdir -p /tmp/before && tar -xzf ".build-cache/versions/$BEFORE.tar.gz" -C /tmp/before
  (cd /tmp/before && PYTHONPATH="/tmp/before:$PYTHONPATH" python3 benchmarks/exchange_cost.py --scenes room object \
    ${run:+--trained-room "$run" --room-data /tmp/room-scene} --json "$OUT/exchange_cost_before.json") \
    > "$OUT/exchange_cost_before.log" 2>&1 || status=1
  grep -h -B2 -A12 "Traceback" "$OUT/exchange_cost_before.log" | tail -20
  echo "before ($BEFORE):"
  tail -6 "$OUT/exchange_cost_before.log"
fi
echo "this checkout:"
tail -7 "$OUT/exchange_cost.log"
exit $status
