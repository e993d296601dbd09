"""`bytesplat-demo`: the built-in scene end to end, on the GPU when there is one, else on the CPU.

Generates the scene, trains `ns-train bytesplat` on it (live viewer on), evaluates the held-out
views with `ns-eval`, renders a short fly-through (an mp4 where ffmpeg exists, PNG frames otherwise),
exports the splats with `ns-export gaussian-splat`, and prints where each output went.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene

CPU_STEPS = 400
"""Enough for >= 25 dB held-out PSNR on the built-in scene, within 5 minutes on 2 CPU cores."""
GPU_STEPS = 3000


def ns_tool(name: str) -> str:
    """Path of a nerfstudio command installed beside this Python."""
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else name


def run(cmd: list[str]) -> float:
    """Run a command, streaming its output; returns its wall time in seconds."""
    print("$ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def train(scene: Path, runs: Path, device: str, steps: int) -> tuple[Path, float]:
    seconds = run([
        ns_tool("ns-train"), "bytesplat",
        "--data", str(scene),
        "--machine.device-type", device,
        "--max-num-iterations", str(steps),
        "--output-dir", str(runs),
        "--experiment-name", "demo",
        "--timestamp", "latest",
        "--steps-per-eval-all-images", "0",
        "--pipeline.model.num-downscales", "0",  # the built-in scene is small: train at full resolution
        "--vis", "viewer+tensorboard",
        "--viewer.quit-on-train-completion", "True",
    ])  # fmt: skip
    return runs / "demo" / "bytesplat" / "latest" / "config.yml", seconds


def render_video(config: Path, output: Path) -> Path:
    """Fly through the held-out views with ns-render: an mp4 with ffmpeg, PNG frames without (bytesplat's
    ns-render fallback)."""
    video = output / "video.mp4"
    run([ns_tool("ns-render"), "interpolate", "--load-config", str(config), "--output-path", str(video),
         "--interpolation-steps", "6", "--order-poses", "True", "--frame-rate", "24"])  # fmt: skip
    return video if shutil.which("ffmpeg") else video.with_suffix("")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("demo-output"), help="where everything is written")
    parser.add_argument(
        "--steps", type=int, default=None, help=f"training steps (default {CPU_STEPS} CPU, {GPU_STEPS} GPU)"
    )
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = args.steps or (GPU_STEPS if device == "cuda" else CPU_STEPS)
    out = args.output.resolve()
    scene = generate_demo_scene(out / "scene", DemoSceneConfig())
    config, train_seconds = train(scene, out / "runs", device, steps)
    run([ns_tool("ns-eval"), "--load-config", str(config), "--output-path", str(out / "eval.json"),
         "--render-output-path", str(out / "eval-renders")])  # fmt: skip
    video = render_video(config, out)
    run([ns_tool("ns-export"), "gaussian-splat", "--load-config", str(config), "--output-dir", str(out / "export")])

    results = json.loads((out / "eval.json").read_text())["results"]
    print("\nbytesplat demo finished")
    print(f"  device, steps:      {device}, {steps}")
    print(f"  training wall time: {train_seconds:.0f} s (ns-train, start-up included)")
    print(f"  held-out PSNR/SSIM: {results['psnr']:.2f} dB / {results['ssim']:.4f}")
    print(f"  scene:              {scene}")
    print(f"  run (config, ckpt): {config.parent}")
    print(f"  metrics:            {out / 'eval.json'}")
    print(f"  held-out renders:   {out / 'eval-renders'}")
    print(f"  fly-through:        {video}")
    print(f"  exported splats:    {out / 'export' / 'splat.ply'}")


if __name__ == "__main__":
    main()
