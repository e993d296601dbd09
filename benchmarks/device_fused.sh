#!/usr/bin/env bash
# One call on the GPU machine, after `source .device-kit/on-device.sh`: build the fused kernels once
# (device_build.sh: the .so goes to $OUT, so a later call can carry it back), run
# tests/test_fused_backend.py, then benchmarks/ssim_kernel.py (the SSIM term: kernel vs pytorch_msssim) and
# benchmarks/fused_kernel.py (timings, errors, DRAM bytes with ncu when present).
# Files in $OUT: gpu.txt, build.log, bytesplat_cuda_<hash>.so, pytest.log, ssim_kernel.json, bench.log,
# fused_kernel.json.
# GPU_TESTS: the test files to run (default tests/test_fused_backend.py); FUSED_ARGS: more options of
# fused_kernel.py (e.g. --blocks-per-sm 3 4); SKIP_NCU=1: no DRAM bytes (saves ~2 min).
# PROFILE="scene:variant ...": afterwards a full Nsight Compute profile of one step of each (the rasterization
# kernels only), as text: every section's details and the per-instruction SASS counters (CSV), in $OUT/profile.tgz.
set -uo pipefail
start=$(date +%s)
source benchmarks/device_build.sh  # also: $OUT made, the GPUs in $OUT/gpu.txt

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

if [ -n "${PROFILE:-}" ] && command -v ncu > /dev/null; then
  mkdir -p /tmp/profile
  for item in $PROFILE; do
    scene=${item%%:*} variant=${item#*:} rep=/tmp/profile/${item/:/-}  # kernels: fused_kernel.py's RASTER_KERNELS
    ncu --set full --import-source yes --profile-from-start off --clock-control none \
      -k regex:"fused_kernel|rasterize_to_pixels|forward_kernel" -o "$rep" -f \
      python3 benchmarks/fused_kernel.py --ncu-child "$scene" "$variant" ${LEGO_CKPT:+--lego-ckpt "$LEGO_CKPT"} \
      > "$rep.log" 2>&1
    ncu -i "$rep.ncu-rep" --page details --print-details all > "$rep.details.txt" 2>&1
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
    grep -E "^  [a-z_]|Duration|Executed Ipc A|Registers Per|Achieved Occupancy|Executed Instructions  " \
      "$rep.details.txt" | head -40 | sed "s|^|$item |"
  done
  rm -f /tmp/profile/*.ncu-rep
  tar -czf "$OUT/profile.tgz" -C /tmp profile
  echo "profile done: $(( $(date +%s) - start )) s"
fi
