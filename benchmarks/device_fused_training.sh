#!/usr/bin/env bash
# One call on the 2-GPU machine, after `source .device-kit/on-device.sh` (carry .build-cache for the built fused
# module): the fused loss path's GPU test, then lego trained by bytesplat with renderer fused (fused loss path) on
# GPU 0 and by SECOND on GPU 1 at the same time, STEPS steps (default 7000), seed 42, each evaluated with ns-eval
# on the test split (benchmarks/quality_seeds.py with these two lanes and one seed). SECOND: splatfacto (default;
# nerfstudio's, run through benchmarks/offline_nerfstudio.py, which keeps LPIPS from downloading), gsplat
# (bytesplat, renderer gsplat) or unpruned (bytesplat, renderer fused without on-chip pruning).
# Files in $OUT: pytest_fused_loss.log, fused_training.log, fused_training.json. Table last (PSNR, SSIM, step
# time = median "Train Iter (time)" of the second half, splats).
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
STEPS=${STEPS:-7000}
SECOND=${SECOND:-splatfacto}
mkdir -p "$OUT"
export BYTESPLAT_EXT_DIR=${BYTESPLAT_EXT_DIR:-$PWD/.build-cache/ext}
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -p no:cacheprovider -q -rs tests/test_fused_loss_path.py > "$OUT/pytest_fused_loss.log" 2>&1
  tail -1 "$OUT/pytest_fused_loss.log"
fi
python3 -c "from bytesplat_ns.cuda import ops; ops.ext()"  # build once, before the runs that load it
case "$SECOND" in
  splatfacto) second="splatfacto=splatfacto" ;;
  unpruned) second="unpruned=bytesplat --pipeline.model.renderer fused --pipeline.model.prune-on-chip False" ;;
  *) second="gsplat=bytesplat --pipeline.model.renderer gsplat" ;;
esac
python3 benchmarks/quality_seeds.py --data .device-kit/data/lego --views "$STEPS" --seeds 42 \
  --lane "fused=bytesplat --pipeline.model.renderer fused" --lane "$second" --out /tmp/fused-training \
  --json "$OUT/fused_training.json" > "$OUT/fused_training.log" 2>&1
status=$?
tail -4 "$OUT/fused_training.log"
exit $status
