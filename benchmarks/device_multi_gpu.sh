#!/usr/bin/env bash
# One call on the 2-GPU machine (after `source .device-kit/on-device.sh`): the multi-GPU benchmark of issue #4
# (2M-splat room exchange, then lego on 2 GPUs and on 1 GPU with the same views). Logs and JSON go to $OUT.
# MULTI_GPU_ARGS: more options of multi_gpu.py (e.g. --seeds 42 43); TRAIN_ARGS: ns-train options for the lego runs.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 benchmarks/multi_gpu.py --data .device-kit/data/lego --views "${LEGO_VIEWS:-7000}" \
  --json "$OUT/multi_gpu.json" ${MULTI_GPU_ARGS:-} ${TRAIN_ARGS:+--train-args "$TRAIN_ARGS"} \
  > "$OUT/multi_gpu.log" 2>&1
status=$?
grep -h -A3 "bytesplat rank\|Error\|error:" /tmp/bench-multi-gpu/*.log 2>/dev/null | tail -20
tail -8 "$OUT/multi_gpu.log"
exit $status
