#!/usr/bin/env bash
# One call on the 2-GPU machine (after `source .device-kit/on-device.sh`), issue #4: build the CUDA extension
# (device_build.sh), run GPU_TESTS, time the exchange's host work (exchange_host.py), then either
# PROBES (short lego runs without evaluation, once per renderer in RENDERERS: `PROBES="1 2:compact"
# RENDERERS="gsplat fused"`; with MULTI_GPU_ARGS="--probe-room --profile 40" the room's, profiled) or the benchmark
# (2M-splat room exchange, then lego on 2 GPUs and on 1 GPU with the same views). Logs and JSON go to $OUT.
# MULTI_GPU_ARGS: more options of multi_gpu.py (e.g. --seeds 42 43; --room-views 2000 adds the generated 1080p room,
# scaling_runs.py); TRAIN_ARGS: ns-train options for every training run; GPU_TESTS="" skips the tests
# (GPU_TESTS="-m two_gpus tests/..." runs only those needing two GPUs; GPU_TESTS_TIMEOUT caps them, device_build.sh);
# EXCHANGE_HOST=0 skips exchange_host.py.
set -uo pipefail
source benchmarks/device_build.sh  # also: $OUT made, the GPUs in $OUT/gpu.txt
run_gpu_tests tests/test_grad_compaction.py
[ "${EXCHANGE_HOST:-1}" = 0 ] || python3 benchmarks/exchange_host.py --json "$OUT/exchange_host.json" 2>&1 | tail -22
if [ -n "${PROBES:-}" ]; then
  for renderer in ${RENDERERS:-auto}; do
    python3 benchmarks/multi_gpu.py --data .device-kit/data/lego --views "${LEGO_VIEWS:-3000}" --out "/tmp/probe-$renderer" \
      --probe $PROBES ${MULTI_GPU_ARGS:-} --train-args "--pipeline.model.renderer $renderer ${TRAIN_ARGS:-}" 2>&1 | tail -6
    cp "/tmp/probe-$renderer/probes.json" "$OUT/probes_$renderer.json"
  done
  exit 0
fi
python3 benchmarks/multi_gpu.py --data .device-kit/data/lego --views "${LEGO_VIEWS:-7000}" \
  --json "$OUT/multi_gpu.json" ${MULTI_GPU_ARGS:-} ${TRAIN_ARGS:+--train-args "$TRAIN_ARGS"} \
  > "$OUT/multi_gpu.log" 2>&1
status=$?
grep -h -A3 "bytesplat rank\|Error\|error:" /tmp/bench-multi-gpu/*.log 2>/dev/null | tail -20
tail -8 "$OUT/multi_gpu.log"
exit $status
