"""Which splat parameters a one-step gradient delay hurts, on the CPU (issue #4, after one_step_late_cpu.py).

Applying each step's gradients one step late (late_update.py) cost about 0.26 dB held-out PSNR on the built-in scene
with two gloo ranks (benchmarks/RESULTS.md, forty-first session). This trains the same scene in one process and
delays the gradients of chosen parameter groups by one step (their optimizer steps on the gradient of the step
before; a refine, which renumbers the splats, drops the gradient it held), to see which groups the delay hurts:
none (the reference), all, the colours (features_dc, features_rest: 48 of a row's 59 values at SH degree 3) or the
geometry (means, scales, quats, opacities). One view a step, so the delay alone differs from the reference; an
indication for a scheme that sends some groups late and the others in their step. --lr-scale 1.414: every learning
rate as two GPUs' rule sets it (view_schedule.py), one view a step still. Prints a table last; writes --json.

    python benchmarks/stale_gradients_cpu.py --views 1000 --seeds 42 --json benchmarks/results/stale_gradients_cpu.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).parent))
from built_in_scene_cpu import MACHINE, built_in_scene, cpu_config  # noqa: E402

COLOURS = ("features_dc", "features_rest")
GEOMETRY = ("means", "scales", "quats", "opacities")
DELAYED = {"none": (), "all": COLOURS + GEOMETRY, "colours": COLOURS, "geometry": GEOMETRY}


def delay_groups(trainer, groups: tuple[str, ...]) -> None:
    """Make `trainer`'s optimizers step `groups` on the gradients of the step before (see the module docstring)."""
    optimizers = trainer.optimizers
    step_some = optimizers.optimizer_scaler_step_some
    held: dict[str, object] = {}

    def delayed_step(grad_scaler, stepping: list[str]) -> None:
        ready = []
        for name in stepping:
            if name not in groups:
                ready.append(name)
                continue
            param = optimizers.optimizers[name].param_groups[0]["params"][0]  # the current tensor (refines replace it)
            previous = held.get(name)
            held[name] = param.grad.detach().clone() if param.grad is not None else None
            if previous is not None and previous.shape == param.shape:  # none after a refine renumbered the splats
                param.grad = previous
                ready.append(name)
        step_some(grad_scaler, ready)

    optimizers.optimizer_scaler_step_some = delayed_step


def train(scene: Path, out: Path, views: int, seed: int, groups: tuple[str, ...], lr_scale: float = 1.0) -> dict:
    config = cpu_config(scene, out, views, seed, lr_scale)
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    delay_groups(trainer, groups)
    started = time.perf_counter()
    trainer.train()
    return {"heldout_psnr": trainer.heldout_psnr, "splats": trainer.pipeline.model.num_points,
            "train_s": time.perf_counter() - started}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--views", type=int, default=1000, help="training steps of each run (one view each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--delayed", nargs="+", default=list(DELAYED), choices=list(DELAYED))
    parser.add_argument("--lr-scale", type=float, default=1.0,
                        help="every learning rate times this (two GPUs' rule: 1.414)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("/tmp/stale-gradients-cpu"))
    parser.add_argument("--json", type=Path, default=Path("stale_gradients_cpu.json"))
    args = parser.parse_args()

    scene = built_in_scene(args.out)
    runs = []
    for seed in args.seeds:
        for delayed in args.delayed:
            out = args.out / f"s{seed}-{delayed}-lr{args.lr_scale:g}"
            result = train(scene, out, args.views, seed, DELAYED[delayed], args.lr_scale)
            runs.append({"seed": seed, "delayed": delayed, "lr_scale": args.lr_scale, **result})
            print(f"seed {seed}, delayed {delayed}: held-out PSNR {result['heldout_psnr']:.2f} dB", flush=True)
    means = {d: mean(r["heldout_psnr"] for r in runs if r["delayed"] == d) for d in args.delayed}
    record = {
        "what": "one process on the CPU, the built-in scene (128x128, 48 training / 8 held-out views), one view a "
        "step: the gradients of some parameter groups applied one step late",
        "command": f"python benchmarks/stale_gradients_cpu.py --views {args.views} --seeds "
        + " ".join(map(str, args.seeds))
        + " --delayed "
        + " ".join(args.delayed)
        + f" --lr-scale {args.lr_scale:g}",
        "machine": MACHINE,
        "runs": runs,
        "mean_heldout_psnr": means,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\n{'delayed':>10} {'held-out PSNR':>14} {'vs none':>8}")
    for delayed, psnr in means.items():
        versus = f"{psnr - means['none']:+.3f}" if "none" in means else ""
        print(f"{delayed:>10} {psnr:>14.2f} {versus:>8}")


if __name__ == "__main__":
    main()
