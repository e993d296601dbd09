#!/usr/bin/env bash
# One call on the GPU machine (after `source .device-kit/on-device.sh`): the GPU tests, the demo on the
# GPU, then lego with bytesplat (its default renderer, auto: fused on CUDA) beside splatfacto. Logs and JSON go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export TORCHDYNAMO_DISABLE=1  # splatfacto's torch.compile warm-up only; bytesplat compiles nothing
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -m pytest -p no:cacheprovider -q tests/test_gsplat_parity.py tests/test_reference_renderer.py \
  > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
if [ -z "${SKIP_DEMO:-}" ]; then
  /usr/bin/time -f "demo wall %e s" bytesplat-demo --output /tmp/demo > "$OUT/demo.log" 2>&1
  grep -A12 "bytesplat demo finished" "$OUT/demo.log"; tail -1 "$OUT/demo.log"
fi
python3 benchmarks/foundation_gpu.py --data .device-kit/data/lego --steps "${LEGO_STEPS:-7000}" \
  --methods ${METHODS:-bytesplat splatfacto} --json "$OUT/foundation_lego.json" > "$OUT/lego.log" 2>&1
tail -5 "$OUT/lego.log"
