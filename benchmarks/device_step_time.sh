#!/usr/bin/env bash
# One call on the 1-GPU machine (after `source .device-kit/on-device.sh`; carry .build-cache), issue #6: build the
# CUDA extension (device_build.sh), run GPU_TESTS, then benchmarks/step_time.py on lego (STEP_TIME_ARGS: its
# options, e.g. "--steps 7000"). Files in $OUT: build.log, pytest.log, step_time.log, step_time.json; table last.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
source benchmarks/device_build.sh
if [ -n "${GPU_TESTS-tests/test_step_graph.py}" ]; then
  python3 -m pytest -p no:cacheprovider -q -rs ${GPU_TESTS-tests/test_step_graph.py} > "$OUT/pytest.log" 2>&1
  tail -3 "$OUT/pytest.log"
fi
python3 benchmarks/step_time.py --data .device-kit/data/lego --out /tmp/step-time --json "$OUT/step_time.json" \
  ${STEP_TIME_ARGS:-} > "$OUT/step_time.log" 2>&1
status=$?
grep -h -B2 -A12 "Traceback" /tmp/step-time/*.log 2>/dev/null | tail -40
tail -6 "$OUT/step_time.log"
exit $status
