#!/usr/bin/env bash
# One call on the 2-GPU machine, after `source .device-kit/on-device.sh` (carry .build-cache for the built fused
# module): the fused loss path's GPU test, then lego trained by bytesplat with renderer fused (fused loss path) on
# GPU 0 and by SECOND on GPU 1 at the same time, STEPS steps (default 7000), each evaluated with ns-eval on the
# test split. SECOND: splatfacto (default; nerfstudio's, TORCHDYNAMO_DISABLE=1, run through
# benchmarks/offline_nerfstudio.py, which keeps LPIPS from downloading), gsplat (bytesplat, renderer gsplat) or
# unpruned (bytesplat, renderer fused without on-chip pruning).
# Files in $OUT: pytest_fused_loss.log, train_<lane>.log, eval_<lane>.json, fused_training.json. Table last.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
STEPS=${STEPS:-7000}
SECOND=${SECOND:-splatfacto}
mkdir -p "$OUT"
export BYTESPLAT_EXT_DIR=${BYTESPLAT_EXT_DIR:-$PWD/.build-cache/ext} PYTHONUNBUFFERED=1
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -p no:cacheprovider -q -rs tests/test_fused_loss_path.py > "$OUT/pytest_fused_loss.log" 2>&1
  tail -1 "$OUT/pytest_fused_loss.log"
fi
runs=/tmp/fused-training
ns() { python3 benchmarks/offline_nerfstudio.py "$@"; }
lane() {  # name gpu method [ns-train options]
  local name=$1 gpu=$2 method=$3
  shift 3
  CUDA_VISIBLE_DEVICES=$gpu TORCHDYNAMO_DISABLE=1 ns ns-train "$method" --data .device-kit/data/lego \
    --max-num-iterations "$STEPS" --vis tensorboard --steps-per-eval-image 0 --steps-per-eval-all-images 0 \
    --steps-per-save "$STEPS" --output-dir "$runs" --experiment-name lego --timestamp "$name" \
    --pipeline.model.background-color white "$@" blender-data > "$OUT/train_$name.log" 2>&1 &&
  CUDA_VISIBLE_DEVICES=$gpu ns ns-eval --load-config "$runs/lego/$method/$name/config.yml" \
    --output-path "$OUT/eval_$name.json" > "$OUT/eval_$name.log" 2>&1
}
lane fused 0 bytesplat --pipeline.model.renderer fused &
case "$SECOND" in
  splatfacto) lane splatfacto 1 splatfacto & ;;
  unpruned) lane unpruned 1 bytesplat --pipeline.model.renderer fused --pipeline.model.prune-on-chip False & ;;
  *) lane gsplat 1 bytesplat --pipeline.model.renderer gsplat & ;;
esac
wait
python3 - "$OUT" "$runs" "$STEPS" fused "$SECOND" <<'PY'
import json, sys
from pathlib import Path

import torch

sys.path.insert(0, "benchmarks")
from run_summary import run_summary

out, runs, steps, lanes = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = []
print(f"{'lane':<10} {'PSNR':>7} {'SSIM':>7} {'ms/step':>8} {'peak MB':>8} {'splats':>8} {'pruned/step':>11}")
for name in lanes:
    run = next(runs.glob(f"lego/*/{name}"), None)
    try:
        test = json.loads((out / f"eval_{name}.json").read_text())["results"]
        row = {"lane": name, "steps": steps, "psnr": test["psnr"], "ssim": test["ssim"], **run_summary(run)}
    except (OSError, KeyError, TypeError, StopIteration) as error:
        print(f"{name:<10} missing: {error!r}")
        continue
    rows.append(row)
    fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
    print(f"{name:<10} {row['psnr']:7.2f} {row['ssim']:7.4f} {fmt(row['step_ms_median_second_half'], '8.2f')} "
          f"{fmt(row['peak_memory_mb'], '8.0f')} {row['splats']:8d} {fmt(row['pruned_tile_entries_mean'], '11.1f')}")
(out / "fused_training.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "rows": rows}, indent=2))
PY
