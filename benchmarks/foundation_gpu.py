"""GPU check of the foundation: bytesplat (its default renderer: auto, fused on CUDA since the eighth session;
gsplat before) beside splatfacto on lego.

Trains both methods with the same options, evaluates the held-out test views with ns-eval, and prints
a table; writes benchmarks/results/foundation_lego.json (or --json). Run on the GPU machine:
    python benchmarks/foundation_gpu.py --data .device-kit/data/lego --steps 7000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from run_summary import run_summary

HERE = Path(__file__).resolve().parent


def train_and_eval(method: str, data: Path, steps: int, out: Path) -> dict:
    run_dir = out / "lego" / method / "bench"
    common = [
        "--data", str(data), "--max-num-iterations", str(steps), "--output-dir", str(out),
        "--experiment-name", "lego", "--timestamp", "bench", "--vis", "tensorboard",
        "--steps-per-eval-image", "0", "--steps-per-eval-all-images", "0", "--steps-per-save", str(steps),
        "--pipeline.model.background-color", "white",
    ]  # fmt: skip
    cmd = [sys.executable, str(HERE / "offline_nerfstudio.py"), "ns-train", method, *common, "blender-data"]
    print("$ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    wall = time.perf_counter() - start
    subprocess.run(
        [sys.executable, str(HERE / "offline_nerfstudio.py"), "ns-eval", "--load-config", str(run_dir / "config.yml"),
         "--output-path", str(run_dir / "eval.json")],
        check=True,
    )  # fmt: skip
    results = json.loads((run_dir / "eval.json").read_text())["results"]
    summary = run_summary(run_dir)
    return {
        "method": method,
        "steps": steps,
        "psnr": results["psnr"],
        "ssim": results["ssim"],
        "step_ms_median_second_half": summary["step_ms_median_second_half"],
        "train_wall_s": wall,
        "splats": summary["splats"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=7000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-foundation"))
    parser.add_argument("--json", type=Path, default=HERE / "results" / "foundation_lego.json")
    parser.add_argument("--methods", nargs="+", default=["bytesplat", "splatfacto"])
    args = parser.parse_args()
    rows = [train_and_eval(m, args.data, args.steps, args.out) for m in args.methods]
    record = {"gpu": torch.cuda.get_device_name(0), "scene": "lego 400x400 (blender-data), white background",
              "rows": rows}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2))
    print(f"\n{record['gpu']}, lego, {args.steps} steps")
    print(f"{'method':<11} {'PSNR':>7} {'SSIM':>7} {'step ms':>8} {'wall s':>7} {'splats':>8}")
    for r in rows:
        print(f"{r['method']:<11} {r['psnr']:7.2f} {r['ssim']:7.4f} {r['step_ms_median_second_half']:8.2f} "
              f"{r['train_wall_s']:7.0f} {r['splats']:8d}")  # fmt: skip


if __name__ == "__main__":
    main()
