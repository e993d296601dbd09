"""Single-GPU step time (issue #6): bytesplat with its step graph, bytesplat op by op, and splatfacto, on lego.

Each lane trains alone on GPU 0, one after another (the step is bound by the host: runs sharing the machine
slow each other), for --steps steps on a white background, then ns-eval scores the test split. Per lane:
- step time (run_summary.py, the same figures for every method): the training loop's wall time per step (the
  headline: step_ms_*), and nerfstudio's "Train Iter (time)" events: the
  mean over the run and the median of its second half;
- wall time from launch to the end of training, and (bytesplat) start-up: launch to the first step;
- bytesplat lanes: a torch.profiler window of --profile-steps steady steps (host and GPU time per step, kernel
  launches, graph launches, host syncs: step_profile.py), the run's phase times and the graph's replay count.
time_to_target_speedup: splatfacto's wall time to its --steps-step held-out PSNR over bytesplat's wall time to
the same number of steps, when bytesplat's PSNR there is at least splatfacto's (else None): bytesplat may reach it
sooner, so this is a lower bound. With --time-to-target (time_to_target.py's JSON, which scores bytesplat's
checkpoints along the way over several seeds) it is that file's median over seeds of the speedup to splatfacto's
mean PSNR over seeds (a seed that never reaches it counts as 0). Writes --json
(benchmarks/results/step_time.json layout), table last.

    python3 benchmarks/step_time.py --data .device-kit/data/lego --steps 7000 --json $OUT/step_time.json

--wide: instead of --data, the built-in scene generator's still life at 1920x1080 (8 training views, 2 held out)
with 2,000,000 initial points, generated into --wide-dir unless there (84 s and 3 GB on the CPU machine), trained
at full resolution with densification off (so the splats stay at 2M) for --steps steps:

    python3 benchmarks/step_time.py --wide --steps 1000 --profile-start 500 --json $OUT/step_time_wide.json
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

from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene  # noqa: E402

LANES = {
    "bytesplat": "bytesplat --summary-eval False",
    "bytesplat-op-by-op": "bytesplat --summary-eval False --cuda-graph False",
    "bytesplat-visible-adam": "bytesplat --summary-eval False --adam-visible-only True",
    "splatfacto": "splatfacto",
}


WIDE_SCENE = DemoSceneConfig(width=1920, height=1080, num_train=8, num_eval=2, num_points=2_000_000, seed=0)
WIDE_OPTIONS = ["--pipeline.model.num-downscales", "0", "--pipeline.model.warmup-length", "1000000000"]
"""Full resolution from the first step; no refine (densification starts after the warm-up), so no splat is lost."""


STARTUP_PHASES = {
    "trainer": "imports and command line",
    "pipeline": "nerfstudio set-up: data, model, optimizers, writers",
    "images": "training images cached",
    "setup": "the rest of the trainer's set-up",
    "train": "to the training loop",
}


def startup_phases(launched: float, stats: dict) -> dict[str, float]:
    """Seconds of each start-up phase (the trainer's marks, RunStats.startup_unix), launch to the first step."""
    marks = [(mark, stats["startup_unix"][mark]) for mark in STARTUP_PHASES if mark in stats.get("startup_unix", {})]
    phases, last = {}, launched
    for mark, at in [*marks, ("first step", stats["first_step_unix"])]:
        phases[STARTUP_PHASES.get(mark, "to the first step")] = at - last
        last = at
    return phases


def run_lane(name: str, spec: str, args: argparse.Namespace) -> dict:
    method, *options = spec.split()
    if method == "bytesplat" and args.profile_steps > 0:
        options += ["--profile-steps", str(args.profile_steps), "--profile-start", str(args.profile_start)]
    options += WIDE_OPTIONS if args.wide else []
    run = Run(name, args.seed, method, [0], options, args.out / f"{name}.log")
    launched = time.time()
    start(run, args.steps, args.data, args.out, dataparser="bytesplat-data" if args.wide else "blender-data")
    run.process.wait()
    if start_eval(run):
        run.process.wait()
    result = {"lane": name, "command": spec, **record(run)}
    stats_path = run.folder / "bytesplat_stats.json"
    if stats_path.exists():
        stats = json.loads(stats_path.read_text())
        result["startup_s"] = stats["first_step_unix"] - launched
        result["startup_phases_s"] = startup_phases(launched, stats)
        keys = (
            "views_per_second",
            "phase_ms",
            "graph_replays",
            "graph_recordings",
            "graph_record_s",
            "graph_eager_steps",
            "binning_overflows",
            "steps",
        )
        result["bytesplat_stats"] = {k: stats.get(k) for k in keys}
    profile = run.folder / "step_profile.json"
    if profile.exists():
        result["step_profile"] = json.loads(profile.read_text())
    print(json.dumps({k: v for k, v in result.items() if k != "step_profile"}), flush=True)
    return result


def median_speedup(path: Path) -> float:
    """time_to_target.py's JSON -> the median over bytesplat seeds of the speedup to splatfacto's mean PSNR over
    seeds (or to its one run's)."""
    report = json.loads(path.read_text())
    target = "mean" if "mean" in report["targets"] else "run"  # "run": time_to_target.py without --target-json
    return statistics.median((r["reached"][target] or {"speedup": 0.0})["speedup"] for r in report["bytesplat"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="lego (blender-data)")
    parser.add_argument("--wide", action="store_true", help="the generated 1920x1080 scene with 2M splats instead")
    parser.add_argument("--wide-dir", type=Path, default=Path("/tmp/wide-scene"))
    parser.add_argument("--steps", type=int, default=7000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lanes", nargs="+", default=list(LANES), choices=list(LANES))
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--profile-start", type=int, default=2510, help="a window without a refine in it")
    parser.add_argument("--out", type=Path, default=Path("/tmp/step-time"))
    parser.add_argument("--json", type=Path, default=Path("step_time.json"))
    parser.add_argument("--time-to-target", type=Path, default=None, help="time_to_target.py's JSON")
    args = parser.parse_args()
    if args.wide:
        if not (args.wide_dir / "transforms.json").exists():
            generate_demo_scene(args.wide_dir, WIDE_SCENE)
        args.data = args.wide_dir
    elif args.data is None:
        parser.error("--data (lego) or --wide")

    import torch

    lanes = {name: run_lane(name, LANES[name], args) for name in args.lanes}
    ours, base = lanes.get("bytesplat"), lanes.get("splatfacto")
    wide = f"generated {WIDE_SCENE.width}x{WIDE_SCENE.height}, {WIDE_SCENE.num_points:,} initial splats"
    scene = wide if args.wide else "lego"
    report = {"gpu": torch.cuda.get_device_name(0), "scene": scene, "steps": args.steps, "seed": args.seed,
              "lanes": lanes}  # fmt: skip
    if ours and base and "psnr" in ours and "psnr" in base:
        profile = ours.get("step_profile", {})
        reached = ours["psnr"] >= base["psnr"]
        report.update(
            step_ms_bytesplat=ours["loop_ms_per_step"],  # the loop's wall time per step (run_summary.py)
            step_ms_splatfacto=base["loop_ms_per_step"],
            train_iter_ms_bytesplat=ours["step_ms_mean"],  # nerfstudio's "Train Iter (time)" mean
            train_iter_ms_splatfacto=base["step_ms_mean"],
            time_to_target_speedup=base["train_s"] / ours["train_s"] if reached else None,
            time_to_target_from=f"this run's {args.steps}-step PSNR (a lower bound)",
            psnr_bytesplat=ours["psnr"],
            psnr_splatfacto=base["psnr"],
            startup_s_bytesplat=ours.get("startup_s"),
            syncs_per_step=profile.get("syncs"),
            launches_per_step=(profile.get("launches", 0) + profile.get("graph_launches", 0)) if profile else None,
        )
    if args.time_to_target is not None:
        report.update(time_to_target_speedup=median_speedup(args.time_to_target),
                      time_to_target_from=str(args.time_to_target))  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    for name, r in lanes.items():
        for phase, seconds in r.get("startup_phases_s", {}).items():
            print(f"{name} start-up: {seconds:6.2f} s {phase}")
    print(f"\n{'lane':<22} {'loop ms':>7} {'iter ms':>7} {'2nd half':>8} {'train s':>8} {'start s':>7} {'PSNR':>6} "
          f"{'SSIM':>6} {'splats':>8} {'MB':>6} {'launch':>6} {'syncs':>5} {'gpu ms':>6}")  # fmt: skip
    fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
    for name, r in lanes.items():
        p = r.get("step_profile", {})
        launches = p.get("launches", 0) + p.get("graph_launches", 0) if p else None
        syncs, gpu_ms = p.get("syncs"), p.get("gpu_kernel_ms")
        print(f"{name:<22} {fmt(r.get('loop_ms_per_step'), '7.2f')} {fmt(r.get('step_ms_mean'), '7.2f')} "
              f"{fmt(r.get('step_ms_median_second_half'), '8.2f')} "
              f"{fmt(r.get('train_s'), '8.1f')} {fmt(r.get('startup_s'), '7.1f')} {fmt(r.get('psnr'), '6.2f')} "
              f"{fmt(r.get('ssim'), '6.4f')} {fmt(r.get('splats'), '8d')} {fmt(r.get('peak_memory_mb'), '6.0f')} "
              f"{fmt(launches, '6.1f')} {fmt(syncs, '5.2f')} {fmt(gpu_ms, '6.2f')}")  # fmt: skip
    if "time_to_target_speedup" in report:
        print(f"time to splatfacto's {args.steps}-step PSNR: {fmt(report['time_to_target_speedup'], '.2f')}x shorter "
              f"({report['time_to_target_from']}; None: not reached)")  # fmt: skip


if __name__ == "__main__":
    main()
