#!/usr/bin/env bash
# One call on the GPU machine, after `source .device-kit/on-device.sh`: build the fused kernels once
# (device_build.sh: the .so goes to $OUT, so a later call can carry it back), run
# tests/test_fused_backend.py, then benchmarks/ssim_kernel.py (the SSIM term: kernel vs pytorch_msssim) and
# benchmarks/fused_kernel.py (timings, errors, DRAM bytes with ncu when present).
# Files in $OUT: build.log, bytesplat_cuda_<hash>.so, pytest.log, ssim_kernel.json, bench.log, fused_kernel.json.
# GPU_TESTS: the test files to run (default tests/test_fused_backend.py); FUSED_ARGS: more options of
# fused_kernel.py (e.g. --blocks-per-sm 3 4); SKIP_NCU=1: no DRAM bytes (saves ~2 min).
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
nvidia-smi -L
start=$(date +%s)
source benchmarks/device_build.sh

python3 -m pytest -p no:cacheprovider -q -rs ${GPU_TESTS:-tests/test_fused_backend.py} > "$OUT/pytest.log" 2>&1
tail -15 "$OUT/pytest.log"
echo "tests done: $(( $(date +%s) - start )) s"

python3 benchmarks/ssim_kernel.py --json "$OUT/ssim_kernel.json" 2>&1 | tail -6

ncu_flag=""
command -v ncu > /dev/null && [ -z "${SKIP_NCU:-}" ] && ncu_flag="--ncu"
python3 benchmarks/fused_kernel.py --json "$OUT/fused_kernel.json" $ncu_flag ${FUSED_ARGS:-} ${LEGO_CKPT:+--lego-ckpt "$LEGO_CKPT"} \
  > "$OUT/bench.log" 2>&1
echo "bench done: $(( $(date +%s) - start )) s"
tail -24 "$OUT/bench.log"
