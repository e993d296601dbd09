#!/usr/bin/env bash
# One call on the 1-GPU machine (after `source .device-kit/on-device.sh`; carry .build-cache), issue #6: build the
# CUDA extension (device_build.sh), run GPU_TESTS, then, if TIME_TO_TARGET_ARGS is set, benchmarks/time_to_target.py
# with those options, then, if VERSIONS_ARGS is set, benchmarks/versions_ab.py with those (earlier commits' step
# time against this checkout's), then, if HOST_SAMPLES_ARGS is set, benchmarks/host_samples.py with those (where
# the loop's host time goes, sampled by py-spy), then, if GPU_PACE_ARGS is set, benchmarks/gpu_pace.py with those
# (whether the host or the GPU sets the replayed steps' pace), then, if GRAPH_TRACE_START is set, a profiled run
# with its timeline from that step (20 steps) read by benchmarks/graph_trace.py (the replayed graph's kernels by
# name), then benchmarks/step_time.py on lego
# (STEP_TIME_ARGS: its options, e.g. "--steps 7000"; "skip": not run). Files in $OUT: build.log, pytest.log,
# {time_to_target,versions_ab,host_samples,gpu_pace,graph_trace,step_time}.{log,json}, step_trace.json.gz;
# table last.
# The lent machine sets PYTHONDONTWRITEBYTECODE=1 and its packages carry no bytecode, so there every Python process
# compiles the sources of torch, nerfstudio and the rest anew: ns-train's imports took 15-18 s against 8 s with the
# bytecode kept (benchmarks/RESULTS.md, twelfth session). An installed Python environment keeps its bytecode, so
# by default (KEEP_BYTECODE=1) the lanes do too, in /tmp/pycache, compiled once by a warm-up import before they
# start (every lane alike); KEEP_BYTECODE=0 measures the machine as it comes.
set -uo pipefail
if [ "${KEEP_BYTECODE:-1}" = 1 ]; then
  unset PYTHONDONTWRITEBYTECODE
  export PYTHONPYCACHEPREFIX=/tmp/pycache
  python3 -W ignore -c "from nerfstudio.scripts.train import entrypoint; import nerfstudio.scripts.eval, gsplat, \
torch.utils.tensorboard, bytesplat_ns.trainer, bytesplat_ns.model" > /dev/null 2>&1
fi
source benchmarks/device_build.sh  # also: $OUT made, the GPUs in $OUT/gpu.txt
run_gpu_tests tests/test_step_graph.py
status=0
bench() {  # bench NAME ARGS...: benchmarks/NAME.py on lego; its log and JSON in $OUT; tracebacks, table
  local name=$1 runs=/tmp/${1//_/-}; shift  # runs: /tmp/step-time, /tmp/time-to-target, /tmp/versions-ab, ...
  python3 "benchmarks/$name.py" --data .device-kit/data/lego --out "$runs" --json "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1 || status=1
  grep -h -B2 -A12 "Traceback" "$OUT/$name.log" "$runs"/*.log 2>/dev/null | tail -40
  tail -7 "$OUT/$name.log"
}
if [ -n "${TIME_TO_TARGET_ARGS:-}" ]; then
  bench time_to_target $TIME_TO_TARGET_ARGS
fi
if [ -n "${VERSIONS_ARGS:-}" ]; then
  bench versions_ab $VERSIONS_ARGS
fi
if [ -n "${HOST_SAMPLES_ARGS:-}" ]; then
  bench host_samples $HOST_SAMPLES_ARGS
fi
if [ -n "${GPU_PACE_ARGS:-}" ]; then
  bench gpu_pace $GPU_PACE_ARGS
fi
if [ -n "${GRAPH_TRACE_START:-}" ]; then
  rm -rf /tmp/graph-trace
  python3 benchmarks/offline_nerfstudio.py ns-train bytesplat --data .device-kit/data/lego \
    --max-num-iterations $((GRAPH_TRACE_START + 40)) --vis tensorboard --steps-per-eval-image 0 \
    --steps-per-eval-all-images 0 --steps-per-save 100000 --output-dir /tmp/graph-trace --experiment-name t \
    --timestamp t --summary-eval False --profile-steps 20 --profile-start "$GRAPH_TRACE_START" --profile-trace True \
    --pipeline.model.background-color white blender-data > /tmp/graph-trace.log 2>&1 || status=1
  python3 benchmarks/graph_trace.py /tmp/graph-trace/t/bytesplat/t/step_trace.json.gz --json "$OUT/graph_trace.json" \
    > "$OUT/graph_trace.log" 2>&1 || { status=1; tail -40 /tmp/graph-trace.log >> "$OUT/graph_trace.log"; }
  cp /tmp/graph-trace/t/bytesplat/t/step_trace.json.gz "$OUT/" 2>/dev/null
  head -40 "$OUT/graph_trace.log"
fi
if [ "${STEP_TIME_ARGS:-}" != skip ]; then
  bench step_time ${STEP_TIME_ARGS:-}
fi
exit $status
