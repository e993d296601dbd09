#!/usr/bin/env bash
# One call on the 2-GPU machine, after `source .device-kit/on-device.sh` (carry .build-cache for the built fused
# module): the fused loss path's GPU test, then lego trained with renderer fused (fused loss path) on GPU 0 and
# renderer gsplat on GPU 1 at the same time, same seed, STEPS steps (default 7000), each evaluated with ns-eval
# on the test split. Files in $OUT: pytest_fused_loss.log, train_<renderer>.log, eval_<renderer>.json, and
# bytesplat_stats_<renderer>.json. Prints a table last.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
STEPS=${STEPS:-7000}
mkdir -p "$OUT"
export BYTESPLAT_EXT_DIR=${BYTESPLAT_EXT_DIR:-$PWD/.build-cache/ext} PYTHONUNBUFFERED=1
python3 -m pytest -p no:cacheprovider -q -rs tests/test_fused_loss_path.py > "$OUT/pytest_fused_loss.log" 2>&1
tail -1 "$OUT/pytest_fused_loss.log"
runs=/tmp/fused-training
lane() {  # renderer gpu
  CUDA_VISIBLE_DEVICES=$2 ns-train bytesplat --data .device-kit/data/lego --max-num-iterations "$STEPS" \
    --vis tensorboard --steps-per-eval-image 0 --steps-per-eval-all-images 0 --steps-per-save "$STEPS" \
    --output-dir "$runs" --experiment-name lego --timestamp "$1" --pipeline.model.renderer "$1" \
    --pipeline.model.background-color white blender-data > "$OUT/train_$1.log" 2>&1 &&
  CUDA_VISIBLE_DEVICES=$2 ns-eval --load-config "$runs/lego/bytesplat/$1/config.yml" \
    --output-path "$OUT/eval_$1.json" > /dev/null 2>&1
  cp "$runs/lego/bytesplat/$1/bytesplat_stats.json" "$OUT/bytesplat_stats_$1.json"
}
lane fused 0 & lane gsplat 1 & wait
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print(f"{'renderer':<8} {'PSNR':>7} {'SSIM':>7} {'ms/step':>8} {'views/s':>8} {'splats':>8}")
for name in ("fused", "gsplat"):
    try:
        test = json.loads((out / f"eval_{name}.json").read_text())["results"]
        stats = json.loads((out / f"bytesplat_stats_{name}.json").read_text())
    except (OSError, KeyError) as error:
        print(f"{name:<8} missing: {error}")
        continue
    ms = 1000 * stats["step_seconds"] / stats["steps"]
    print(f"{name:<8} {test['psnr']:7.2f} {test['ssim']:7.4f} {ms:8.2f} {stats['views_per_second']:8.1f} {stats['splats']:8d}")
PY
