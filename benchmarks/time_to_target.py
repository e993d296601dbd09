"""Wall time to splatfacto's held-out quality (issue #6): how long after launch bytesplat's test-split PSNR first
reaches splatfacto's 7000-step PSNR, against splatfacto's launch-to-end time, on lego.

1. splatfacto trains alone on GPU 0 for --steps steps (seed --splatfacto-seed), then ns-eval: its wall time from
   launch to the end of training, and its PSNR;
2. the target: splatfacto's PSNR over seeds, from --target-json (a quality_seeds.py JSON with a splatfacto lane,
   e.g. of the same call; mean, median and best of its seeds) or else the run of step 1 alone;
3. bytesplat trains alone for --bytesplat-steps steps (default --steps) for each of --seeds, keeping a checkpoint
   every --save-every steps
   (the trainer stamps the wall-clock time each save began: RunStats.saved_unix); afterwards every checkpoint from
   --from-step on is scored on the test split in this process (nerfstudio's eval_setup once, then each
   checkpoint's pipeline state; the metrics ns-eval reports);
4. per seed, the first checkpoint at or above each target: its wall time from launch, and splatfacto's time over
   that (the speedup).

    python3 benchmarks/time_to_target.py --data .device-kit/data/lego --target-json $OUT/quality_seeds.json \
        --json $OUT/time_to_target.json

Checkpoints cost the bytesplat runs a little time (each save copies the splats to the host and writes them): the
times here include it. Writes --json; table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from quality_seeds import Run, record, start, start_eval  # noqa: E402
from step_time import startup_phases  # noqa: E402


def train(
    method: str, seed: int, steps: int, args: argparse.Namespace, save_every: int | None = None
) -> tuple[Run, float]:
    """Train alone on GPU 0 for `steps` steps; -> the run and its launch time (time.time())."""
    name = f"{method}-ttt"
    options = ["--summary-eval", "False"] if method == "bytesplat" else []
    run = Run(name, seed, method, [0], options, args.out / f"{name}-{seed}.log")
    launched = time.time()
    start(run, steps, args.data, args.out, save_every=save_every)
    if run.process.wait() != 0:
        raise SystemExit(f"{method} seed {seed}: ns-train failed; see {run.log}")
    return run, launched


def score_checkpoints(run: Run, from_step: int) -> dict[int, dict]:
    """Test-split metrics of each kept checkpoint at or past `from_step`: step -> {psnr, ssim}."""
    import torch
    from nerfstudio.utils.eval_utils import eval_setup

    from bytesplat_ns.lpips import stand_in_lpips_unless_on_disk

    stand_in_lpips_unless_on_disk()
    _, pipeline, _, _ = eval_setup(run.folder / "config.yml", test_mode="test")
    scores = {}
    for path in sorted((run.folder / "nerfstudio_models").glob("step-*.ckpt")):
        step = int(path.stem.split("-")[1])
        if step < from_step:
            continue
        state = torch.load(path, map_location="cpu", weights_only=False)
        pipeline.load_pipeline(state["pipeline"], step)
        metrics = pipeline.get_average_eval_image_metrics()
        scores[step] = {"psnr": float(metrics["psnr"]), "ssim": float(metrics["ssim"])}
        print(f"  {run.method} seed {run.seed} step {step}: {scores[step]['psnr']:.3f} dB", flush=True)
    del pipeline
    torch.cuda.empty_cache()
    return scores


def targets(splatfacto_psnr: float, target_json: Path | None) -> dict[str, float]:
    """Splatfacto's PSNR over its seeds: mean, median, best (or the single run's)."""
    if target_json is None:
        return {"run": splatfacto_psnr}
    runs = json.loads(target_json.read_text())["runs"]
    values = [r["psnr"] for r in runs if r["lane"] == "splatfacto" and "psnr" in r]
    if not values:
        raise SystemExit(f"{target_json}: no splatfacto runs with a PSNR")
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "best": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--steps", type=int, default=7000, help="splatfacto's steps: the target's step count")
    parser.add_argument(
        "--bytesplat-steps",
        type=int,
        default=None,
        help="bytesplat's steps (default --steps); more let a seed below a target at --steps go on "
        "towards it, timed from launch all the same (the schedules do not depend on it)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44], help="bytesplat runs")
    parser.add_argument("--splatfacto-seed", type=int, default=42)
    parser.add_argument("--target-json", type=Path, default=None, help="quality_seeds.py JSON with splatfacto runs")
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--from-step", type=int, default=3500, help="score checkpoints from this step on")
    parser.add_argument("--out", type=Path, default=Path("/tmp/time-to-target"))
    parser.add_argument("--json", type=Path, default=Path("time_to_target.json"))
    args = parser.parse_args()

    import torch

    bytesplat_steps = args.bytesplat_steps or args.steps
    base, launched = train("splatfacto", args.splatfacto_seed, args.steps, args)
    base_s = time.time() - launched
    start_eval(base)
    base.process.wait()
    splatfacto = {"seed": args.splatfacto_seed, "launch_to_end_s": base_s, **record(base)}
    goal = targets(splatfacto["psnr"], args.target_json)
    runs = []
    for seed in args.seeds:
        run, launched = train("bytesplat", seed, bytesplat_steps, args, save_every=args.save_every)
        stats = json.loads((run.folder / "bytesplat_stats.json").read_text())
        saved = {int(step): at - launched for step, at in stats["saved_unix"].items()}
        scores = score_checkpoints(run, args.from_step)
        curve = [{"step": s, "wall_s": saved[s], **scores[s]} for s in sorted(scores)]
        reached = {}
        for name, psnr in goal.items():
            first = next((point for point in curve if point["psnr"] >= psnr), None)
            reached[name] = None if first is None else {
                "step": first["step"], "wall_s": first["wall_s"], "speedup": base_s / first["wall_s"]}  # fmt: skip
        runs.append({"seed": seed, "startup_s": stats["first_step_unix"] - launched,
                     "startup_phases_s": startup_phases(launched, stats), "curve": curve,
                     "reached": reached})  # fmt: skip
    report = {"gpu": torch.cuda.get_device_name(0), "steps": args.steps, "bytesplat_steps": bytesplat_steps,
              "splatfacto": splatfacto, "targets": goal,
              "target_json": str(args.target_json) if args.target_json else None, "bytesplat": runs}  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")

    print(f"\nsplatfacto seed {args.splatfacto_seed}: {splatfacto['psnr']:.2f} dB, {base_s:.1f} s launch to end")
    print("targets: " + ", ".join(f"{name} {psnr:.2f} dB" for name, psnr in goal.items()))
    at_steps = f"PSNR@{args.steps}"
    print(f"{'seed':>4} {'start s':>7} {at_steps:>9} {'end PSNR':>8} " + " ".join(f"{n + ' (s, x)':>18}" for n in goal))
    for r in runs:
        there = next((point["psnr"] for point in r["curve"] if point["step"] >= args.steps - 1), float("nan"))
        cells = []
        for name in goal:
            hit = r["reached"][name]
            cells.append(f"{'not reached':>18}" if hit is None else
                         f"{hit['step']:>5} {hit['wall_s']:5.1f} s {hit['speedup']:4.2f}x")  # fmt: skip
        print(f"{r['seed']:>4} {r['startup_s']:7.1f} {there:9.2f} {r['curve'][-1]['psnr']:8.2f} " + " ".join(cells))


if __name__ == "__main__":
    main()
