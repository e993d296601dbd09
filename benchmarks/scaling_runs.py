"""Training runs of the multi-GPU scaling benchmark (multi_gpu.py, issue #4): `ns-train bytesplat` on one scene with
1 and with 2 GPUs and the same number of training views, each run alone on the machine.

Two scenes:
- `lego` (blender-data, white background): splatfacto's schedule, densification on; a step is short (about 1 ms
  on one H200 with the step graph), so fixed costs (refines, the exchange) weigh on it;
- `room` (the built-in generator's room layout, demo_scene.py): the still life inside a closed room at 1920x1080,
  24 training views from inside, 2,000,000 initial splats, full resolution from the first step and no refine (as
  step_time.py's 1080p scene), so every run trains the same 2M splats; each view sees only a part of the room,
  so each rank's gradients touch only part of the rows: the case the compacted exchange is for.
A run's record: bytesplat_stats.json (views per second over the training steps, phases, exchange bytes), and
ns-eval's PSNR/SSIM on the held-out views.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, stdev
from typing import IO

from step_time import WIDE_OPTIONS

from bytesplat_ns.demo_scene import DemoSceneConfig, generate_demo_scene

ROOM_SCENE = DemoSceneConfig(width=1920, height=1080, num_train=24, num_eval=4, num_points=2_000_000, layout="room")
ROOM_DESCRIPTION = (
    f"demo_scene.py's room layout, {ROOM_SCENE.width}x{ROOM_SCENE.height}, {ROOM_SCENE.num_train} training views from "
    f"inside, {ROOM_SCENE.num_points:,} splats, no refine"
)


@dataclass(frozen=True)
class TrainScene:
    """What the runs train on."""

    name: str
    """lego or room (the run folders' experiment name)."""
    data: Path
    """The scene's folder."""
    options: tuple[str, ...]
    """ns-train options of the scene (before the dataparser)."""
    dataparser: str
    """The dataparser subcommand."""


def lego_scene(data: Path) -> TrainScene:
    return TrainScene("lego", data, ("--pipeline.model.background-color", "white"), "blender-data")


def room_scene(folder: Path) -> TrainScene:
    """The room (ROOM_SCENE), generated into `folder` unless it is there (some 30-60 s with 16 processes)."""
    if not (folder / "transforms.json").exists():
        began = time.perf_counter()
        generate_demo_scene(folder, ROOM_SCENE, workers=min(16, os.cpu_count() or 1))
        print(f"room scene generated in {time.perf_counter() - began:.0f} s: {folder}", flush=True)
    return TrainScene("room", folder, tuple(WIDE_OPTIONS), "bytesplat-data")  # full resolution, no refine


EXIT_S = 60.0
"""How long a run may take to exit once rank 0 has written its stats (training over) before it counts as hung."""


@dataclass
class TrainJob:
    """A training run started in the background."""

    process: subprocess.Popen
    run_dir: Path
    started: float
    log: IO[str]
    gpus: int
    exchange: str
    views: int


EXCHANGES = ("compact", "late", "peer", "screen", "dense")
"""--pipeline.exchange of a several-GPU run, or late: compact with --pipeline.exchange-one-step-late True, or peer:
compact with --pipeline.exchange-peer-reads True."""


def exchange_options(exchange: str) -> list[str]:
    """The ns-train options of one of EXCHANGES."""
    if exchange == "late":
        return ["--pipeline.exchange", "compact", "--pipeline.exchange-one-step-late", "True"]
    if exchange == "peer":
        return ["--pipeline.exchange", "compact", "--pipeline.exchange-peer-reads", "True"]
    return ["--pipeline.exchange", exchange]


def start_run(scene: TrainScene, views: int, gpus: int, out: Path, name: str, exchange: str = "compact",
              profile_steps: int = 0, extra: list[str] = (), env: dict | None = None,
              launcher: tuple[str, ...] = ()) -> TrainJob:  # fmt: skip
    """Start `ns-train bytesplat` on `scene` in the background (behind `launcher`: a script that runs ns-train's
    arguments itself, e.g. lone_rank.py's)."""
    cmd = [
        *launcher, "ns-train", "bytesplat", "--data", str(scene.data), "--max-num-iterations", str(views),
        "--machine.num-devices", str(gpus), "--output-dir", str(out), "--experiment-name", scene.name,
        "--timestamp", name, "--vis", "tensorboard", "--steps-per-eval-image", "0", *exchange_options(exchange),
        "--steps-per-eval-all-images", "0", "--steps-per-save", str(views),
        "--profile-steps", str(profile_steps), "--profile-start", str(views // 2), *scene.options, *extra,
        scene.dataparser,
    ]  # fmt: skip
    print("$ " + " ".join(cmd), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"{scene.name}-{name}.log", "w")  # noqa: SIM115 (closed in finish_run)
    run_dir = out / scene.name / "bytesplat" / name
    (run_dir / "bytesplat_stats.json").unlink(missing_ok=True)  # its appearance says this run's training ended
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                               start_new_session=True)  # fmt: skip
    return TrainJob(process, run_dir, time.perf_counter(), log, gpus, exchange, views)


def _exited(job: TrainJob) -> bool:
    """Wait for a run's ns-train to exit. -> False if it was still running EXIT_S after rank 0 wrote its stats (it
    hung on its way out, after training): then it is killed, with the processes it started."""
    stats, ended = job.run_dir / "bytesplat_stats.json", None
    while job.process.poll() is None:
        ended = ended or (time.monotonic() if stats.exists() else None)
        if ended is not None and time.monotonic() - ended > EXIT_S:
            os.killpg(job.process.pid, signal.SIGKILL)
            job.process.wait()
            return False
        time.sleep(0.5)
    return True


def finish_run(job: TrainJob, evaluate: bool = True) -> dict:
    """Wait for a run from start_run; its stats (and with `evaluate`, ns-eval's test PSNR/SSIM). A run that trained
    but did not exit is recorded with `hung_at_exit` (its wall time then includes EXIT_S)."""
    exited = _exited(job)
    if exited and job.process.returncode != 0:
        raise RuntimeError(f"ns-train failed (exit {job.process.returncode}); see {job.log.name}")
    wall = time.perf_counter() - job.started
    if not exited:
        print(f"ns-train trained but had not exited {EXIT_S:.0f} s later: killed; see {job.log.name}", flush=True)
    job.log.close()
    run_dir = job.run_dir
    stats = json.loads((run_dir / "bytesplat_stats.json").read_text())
    others = [json.loads(p.read_text())["phase_ms"] for p in sorted(run_dir.glob("bytesplat_stats_rank*.json"))]
    profiles = [json.loads(p.read_text()) for p in sorted(run_dir.glob("step_profile*.json"))]
    record = {
        "run_dir": str(run_dir),
        "gpus": job.gpus,
        "exchange": job.exchange,
        "views": job.views,
        "wall_s": wall,
        "hung_at_exit": not exited,
        **stats,
        "phase_ms_other_ranks": others,
        "step_profiles": profiles,
    }
    if not evaluate:
        return record
    evaluate = ["ns-eval", "--load-config", str(run_dir / "config.yml"), "--output-path", str(run_dir / "eval.json")]
    subprocess.run(evaluate, check=True, stdout=subprocess.DEVNULL)
    test = json.loads((run_dir / "eval.json").read_text())["results"]
    return {**record, "test_psnr": test["psnr"], "test_ssim": test["ssim"]}


def train_run(scene: TrainScene, views: int, gpus: int, out: Path, exchange: str = "compact", evaluate: bool = True,
              profile_steps: int = 0, extra: list[str] = (), seed: int | None = None) -> dict:  # fmt: skip
    name = f"gpus{gpus}" + ("" if exchange == "compact" else f"-{exchange}") + ("" if seed is None else f"-s{seed}")
    extra = [*extra, *([] if seed is None else ["--machine.seed", str(seed)])]
    record = finish_run(start_run(scene, views, gpus, out, name, exchange, profile_steps, extra), evaluate)
    return {**record, "seed": seed}


def add_room_options(parser: argparse.ArgumentParser) -> None:
    """--room-data and --train-room, of the one-GPU benchmarks that measure a trained room run (`train_room`)."""
    parser.add_argument("--room-data", type=Path, default=Path("/tmp/room-scene"), help="the room run's scene")
    parser.add_argument("--train-room", type=int, default=0, metavar="VIEWS",
                        help="generate the room into --room-data, train it VIEWS views on one GPU")  # fmt: skip


def train_room(data: Path, views: int) -> Path:
    """The room (ROOM_SCENE) generated into `data` unless it is there and trained `views` views on one GPU (seed 43,
    no evaluation); prints "room trained: ... : <run folder>" (device_exchange.sh reads the folder from it). -> the
    run folder."""
    run = train_run(room_scene(data), views, 1, Path("/tmp/room-runs"), evaluate=False, seed=43)
    print(f"room trained: {views} views at {run['views_per_second']:.1f} views/s: {run['run_dir']}")
    return Path(run["run_dir"])


def scaling_summary(runs: list[dict], exchange: str = "compact") -> dict:
    """Means over seeds of the 1-GPU runs and the 2-GPU runs with `exchange` (each run alone on the machine)."""
    by_gpus = {
        1: [r for r in runs if r["gpus"] == 1],
        2: [r for r in runs if r["gpus"] == 2 and r["exchange"] == exchange],
    }
    speed = {g: mean(r["views_per_second"] for r in rs) for g, rs in by_gpus.items()}
    psnr = {g: [r["test_psnr"] for r in sorted(rs, key=lambda r: r["seed"])] for g, rs in by_gpus.items()}
    return {
        "exchange_2gpu": exchange,
        "views_seen": runs[0]["views"],
        "seeds": sorted({r["seed"] for r in runs}),
        "views_per_s_1gpu": speed[1],
        "views_per_s_2gpu": speed[2],
        "scaling_2gpu": speed[2] / speed[1],
        "psnr_1gpu": mean(psnr[1]),
        "psnr_2gpu": mean(psnr[2]),
        "psnr_1gpu_seeds": psnr[1],
        "psnr_2gpu_seeds": psnr[2],
        "psnr_std_1gpu": stdev(psnr[1]) if len(psnr[1]) > 1 else None,
        "psnr_std_2gpu": stdev(psnr[2]) if len(psnr[2]) > 1 else None,
        "comm_bytes_reduction": mean(r["exchange_reduction"] for r in by_gpus[2]),
    }


def print_runs(scene: str, runs: list[dict], summaries: list[dict]) -> None:
    """One row per run, then a scaling line per summary (one per 2-GPU exchange)."""
    print(f"{scene:<14} {'seed':>5} {'views':>6} {'views/s':>8} {'PSNR':>7} {'exch. less':>10} {'wall s':>7}")
    for run in sorted(runs, key=lambda r: (r["gpus"], r["exchange"], r["seed"])):
        less = "-" if run["exchange_reduction"] is None else f"{100 * run['exchange_reduction']:.1f}%"
        label = f"{run['gpus']} GPU" + (f" {run['exchange']}" if run["gpus"] > 1 else "")
        hung = "  hung at exit (killed)" if run.get("hung_at_exit") else ""
        print(f"{label:<14} {run['seed']:5d} {run['views']:6d} {run['views_per_second']:8.1f} "
              f"{run['test_psnr']:7.2f} {less:>10} {run['wall_s']:7.0f}{hung}")  # fmt: skip
    for summary in summaries:
        print(
            f"{scene} scaling 2 GPUs ({summary['exchange_2gpu']}) / 1 GPU: {summary['scaling_2gpu']:.2f}x (mean "
            f"views/s over seeds); PSNR {summary['psnr_2gpu']:.2f} vs {summary['psnr_1gpu']:.2f} dB (2 vs 1 GPU, mean "
            "over seeds)"
        )
