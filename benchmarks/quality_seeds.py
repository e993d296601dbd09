"""Held-out quality over several seeds: lanes (a method and its ns-train options) trained on lego with each seed,
many runs at once on the machine's GPUs, each evaluated with ns-eval on the test split.

A run's quality depends on its seed, not on what ran beside it. Its step time (from run_summary.py) is that of a
run sharing the machine: comparable between lanes only when they ran alone together, one per GPU (as
device_fused_training.sh runs two lanes with one seed); multi_gpu.py measures speed with each run alone.

    python3 benchmarks/quality_seeds.py --data .device-kit/data/lego --views 7000 --seeds 42 43 44 \
        --lane splatfacto=splatfacto --lane gsplat="bytesplat --pipeline.model.renderer gsplat" \
        --lane 2gpu="bytesplat --machine.num-devices 2" --json $OUT/quality_seeds.json

Every lane trains on `--views` training views: a lane on N GPUs runs views / N steps (view_schedule.py does that
for bytesplat). The first lane is the reference of the paired differences. Table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from run_summary import run_summary  # noqa: E402

OFFLINE = str(Path(__file__).parent / "offline_nerfstudio.py")
RUNNER = (sys.executable, OFFLINE)
"""The command that runs `ns-train ...` (its arguments after it) offline, as every run here."""


@dataclass
class Run:
    lane: str
    seed: int
    method: str
    gpus: list[int]
    args: list[str]
    log: Path
    folder: Path | None = None  # the run folder, once started
    process: subprocess.Popen | None = None  # ns-train, then ns-eval
    started: float = 0.0
    evaluating: bool = False
    train_s: float | None = None
    error: str | None = None


def parse_lane(spec: str) -> tuple[str, str, list[str]]:
    """ "name=method [ns-train options]" -> (name, method, options)."""
    name, _, command = spec.partition("=")
    words = shlex.split(command)
    if not name or not words:
        raise SystemExit(f"--lane {spec!r}: expected NAME=METHOD [ns-train options]")
    return name, words[0], words[1:]


def gpus_of(args: list[str]) -> int:
    return int(args[args.index("--machine.num-devices") + 1]) if "--machine.num-devices" in args else 1


def plan(lanes: list[str], seeds: list[int], gpu_count: int, out: Path) -> list[Run]:
    """Every (lane, seed) run, 1-GPU runs spread round-robin over the GPUs."""
    runs, turn = [], 0
    for seed in seeds:
        for spec in lanes:
            name, method, args = parse_lane(spec)
            need = gpus_of(args)
            if need > gpu_count:
                raise SystemExit(f"lane {name} needs {need} GPUs; this machine has {gpu_count}")
            if need > 1 and method != "bytesplat":
                raise SystemExit(f"lane {name}: only bytesplat lanes run on several GPUs here")
            gpus = [(turn + k) % gpu_count for k in range(need)]
            turn += need
            runs.append(Run(name, seed, method, gpus, args, out / f"{name}-{seed}.log"))
    return runs


def start(run: Run, views: int, data: Path, out: Path, dataparser: str = "blender-data",
          save_every: int | None = None, wrapper: Sequence[str] = (),
          runner: Sequence[str] = RUNNER) -> None:  # fmt: skip
    """Start ns-train for `run` in a new run folder (an earlier run's there is removed: its events would count as
    this run's): a checkpoint at the end (and every `save_every` views, all kept, if given); `wrapper`: a command
    that runs it (a profiler); `runner`: the script that takes ns-train's arguments (`ns-train METHOD ...`)."""
    # bytesplat reads --max-num-iterations (and --steps-per-save) as views: views / N steps on N GPUs
    keep_all = ["--save-only-latest-checkpoint", "False"] if save_every else []
    # a lane's options may end with the dataparser and its own options (e.g. "blender-data --alpha-color None")
    cut = run.args.index(dataparser) if dataparser in run.args else len(run.args)
    cmd = [
        *wrapper, *runner, "ns-train", run.method, "--data", str(data),
        "--max-num-iterations", str(views),
        "--machine.seed", str(run.seed), "--vis", "tensorboard", "--steps-per-eval-image", "0",
        "--steps-per-eval-all-images", "0", "--steps-per-save", str(save_every or views), *keep_all,
        "--output-dir", str(out / "runs"), "--experiment-name", run.lane, "--timestamp", str(run.seed),
        *run.args[:cut], "--pipeline.model.background-color", "white", *(run.args[cut:] or [dataparser]),
    ]  # fmt: skip
    env = {**_env(run.gpus), "TORCHDYNAMO_DISABLE": "1", "PYTHONUNBUFFERED": "1"}
    run.folder = out / "runs" / run.lane / run.method / str(run.seed)
    shutil.rmtree(run.folder, ignore_errors=True)
    run.log.parent.mkdir(parents=True, exist_ok=True)
    with open(run.log, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        run.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    run.started = time.perf_counter()


def _env(gpus: list[int]) -> dict:
    """A run's environment: its GPUs, and two threads per process unless OMP_NUM_THREADS says otherwise (many runs
    share the CPUs)."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}  # fmt: skip


def start_eval(run: Run) -> bool:
    """Start ns-eval on a finished run (in the background); False when training failed."""
    if run.process.returncode != 0:
        run.error = f"ns-train exit {run.process.returncode}; see {run.log.name}"
        return False
    run.train_s = time.perf_counter() - run.started
    env = _env(run.gpus[:1])
    cmd = [sys.executable, OFFLINE, "ns-eval", "--load-config", str(run.folder / "config.yml"),
           "--output-path", str(run.folder / "eval.json")]  # fmt: skip
    with open(run.log, "a") as log:
        run.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return True


def record(run: Run) -> dict:
    """ns-eval's test-split PSNR/SSIM and the run's summary (run_summary.py: step time, peak memory, splats, pruned
    entries), or the error."""
    base = {"lane": run.lane, "seed": run.seed, "train_s": run.train_s}
    if run.error is None and run.process.returncode != 0:
        run.error = f"ns-eval exit {run.process.returncode}; see {run.log.name}"
    if run.error is not None:
        return {**base, "error": run.error}
    test = json.loads((run.folder / "eval.json").read_text())["results"]
    return {**base, "psnr": test["psnr"], "ssim": test["ssim"], **run_summary(run.folder)}


def mean_std(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}  # fmt: skip


def write_report(args: argparse.Namespace, results: dict, gpu_count: int, wall_s: float) -> dict:
    """Per-lane means over seeds and paired differences to the first lane, written to args.json; -> the table."""
    import torch

    lanes = [parse_lane(spec)[0] for spec in args.lane]
    reference = lanes[0]
    table = {}
    for lane in lanes:
        rows = [results[(lane, s)] for s in args.seeds if "psnr" in results.get((lane, s), {})]
        paired = [results[(lane, s)]["psnr"] - results[(reference, s)]["psnr"] for s in args.seeds
                  if "psnr" in results.get((lane, s), {}) and "psnr" in results.get((reference, s), {})]  # fmt: skip
        table[lane] = {
            "psnr": mean_std([r["psnr"] for r in rows]),
            "ssim": mean_std([r["ssim"] for r in rows]),
            "psnr_minus_reference": mean_std(paired),
            "splats": mean_std([r["splats"] for r in rows]),
            "step_ms": mean_std([r["step_ms_median_second_half"] for r in rows if r["step_ms_median_second_half"]]),
        }
    report = {
        "gpu": f"{gpu_count}x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu",
        "views": args.views,
        "seeds": args.seeds,
        "lanes": args.lane,
        "reference": reference,
        "wall_s": wall_s,
        "runs": [results[k] for k in sorted(results)],
        "summary": table,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--views", type=int, default=7000, help="training views per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--lane", action="append", required=True, help="NAME=METHOD [ns-train options], repeatable")
    parser.add_argument("--parallel", type=int, default=12, help="runs training at once (each 2-GPU run counts 1)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/quality-seeds"))
    parser.add_argument("--json", type=Path, default=Path("quality_seeds.json"))
    args = parser.parse_args()

    import torch

    gpu_count = max(1, torch.cuda.device_count())
    runs = plan(args.lane, args.seeds, gpu_count, args.out)
    waiting, active, results = list(runs), [], {}
    began = time.perf_counter()
    while waiting or active:
        training = [r for r in active if not r.evaluating]
        while waiting and len(training) < args.parallel:
            run = waiting.pop(0)
            start(run, args.views, args.data, args.out)
            active.append(run)
            training.append(run)
        time.sleep(2)
        for run in [r for r in active if r.process.poll() is not None]:
            if not run.evaluating and start_eval(run):
                run.evaluating = True
                continue
            active.remove(run)
            results[(run.lane, run.seed)] = record(run)
            print(json.dumps(results[(run.lane, run.seed)]), flush=True)
            write_report(args, results, gpu_count, time.perf_counter() - began)  # partial results survive a kill
    table = write_report(args, results, gpu_count, time.perf_counter() - began)
    reference = parse_lane(args.lane[0])[0]
    print(f"\n{'lane':<14} {'PSNR mean':>9} {'std':>5} {'SSIM':>7} {'vs ' + reference:>14} {'ms/step':>8} "
          f"{'splats':>8} {'n':>2}")  # fmt: skip
    for lane, row in table.items():
        p, s, d, ms, n = row["psnr"], row["ssim"], row["psnr_minus_reference"], row["step_ms"], row["splats"]
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        print(f"{lane:<14} {fmt(p['mean'], '9.2f')} {fmt(p['std'], '5.2f')} {fmt(s['mean'], '7.4f')} "
              f"{fmt(d['mean'], '+8.2f')} ±{fmt(d['std'], '4.2f')} {fmt(ms['mean'], '8.2f')} "
              f"{fmt(n['mean'], '8.0f')} {p['n']:>2}")  # fmt: skip


if __name__ == "__main__":
    main()
