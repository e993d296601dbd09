"""One GPU standing in for rank 0 of two: how much of a two-GPU step's extra time is the rank's own work (#4).

On two H200s a replayed two-GPU lego step took 1.09 ms against 0.54 ms for a one-GPU step (benchmarks/RESULTS.md,
thirty-eighth session), though the exchange's device work measured on one GPU is some 60 us a step
(exchange_cost.py). This runs, on one GPU, the same `ns-train bytesplat` twice on the same machine:
- `1 GPU`: a plain one-GPU run;
- `lone rank`: the trainer told it is rank 0 of two (`world_size` 2: two views' schedule and learning rates, half
  the training cameras, the gradient exchange with its kernels inside the step graph, the notes, the late reads,
  the densification statistics reduced), over an NCCL process group of this one process, so the exchange's
  all-gather moves nothing and no other rank is waited for (the rank watchdog is told not to expect one).
What the lone rank's replayed step adds to the plain one is the rank's own share of a two-GPU step's extra time;
the rest of it (transfer, the unpack of the other rank's rows, waiting for the other rank, the other host) is what
only two GPUs show: a world of one keeps its own rows in place and unpacks nothing (grad_compaction.py). Each
run's closing stats (views per second, host ms per phase; "graph" is a replayed step's, its waits for the GPU
included) and, with --profile-steps, a torch profile of that many steady-state steps (host and GPU ms per step, the
GPU's kernels by name). Prints a table last; writes --json.

    python3 benchmarks/lone_rank.py --data .device-kit/data/lego --views 2000 --json $OUT/lone_rank.json
    python3 benchmarks/lone_rank.py --data .device-kit/data/lego --also "--pipeline.exchange-peer-reads True"
    python3 benchmarks/lone_rank.py --data .device-kit/data/lego --views 7000 --versions 726431a . --rounds 2

(--versions: earlier commits packed as versions_ab.py says, against this checkout, on the same machine.)

`python3 benchmarks/lone_rank.py --as-rank-0-of-2 ns-train bytesplat ...` is the lone rank's launcher (ns-train's
own arguments after it).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from scaling_runs import finish_run, lego_scene, room_scene, start_run  # noqa: E402
from versions_ab import HERE, build_extension, environment, unpack  # noqa: E402

PACKS = HERE / ".build-cache" / "versions"

LAUNCHER = "--as-rank-0-of-2"
RUNNER = (sys.executable, str(Path(__file__).resolve()), LAUNCHER)
"""The command that runs `ns-train ...` (its arguments after it) as the lone rank."""


def as_rank_0_of_2(ns_train_argv: list[str]) -> None:
    """Run ns-train with its trainer set up as rank 0 of two, in an NCCL process group of this process alone."""
    import nerfstudio.scripts.train as ns_train
    import torch
    import torch.distributed as dist

    from bytesplat_ns import trainer
    from bytesplat_ns.rank_watchdog import RankWatchdog

    trainer.RankWatchdog = functools.partial(RankWatchdog, silent_after_s=float("inf"))  # no rank 1 will beat

    def launch(main_func, config, **_) -> None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"  # gloo: a CPU check of this script
        dist.init_process_group(backend, init_method=f"file:///tmp/lone-rank-{time.time_ns()}", rank=0, world_size=1)
        try:
            main_func(0, 2, config)
        finally:
            dist.destroy_process_group()

    ns_train.launch = launch
    sys.argv = ns_train_argv
    ns_train.entrypoint()


def run(scene, views: int, out: Path, name: str, profile_steps: int, lone: bool, extra: list[str],
        version: str = ".") -> dict:  # fmt: skip
    """One run of `version` (versions_ab.py: "." this checkout, else a commit packed in .build-cache/versions)."""
    launcher = RUNNER if lone else ()
    env = None if version == "." else environment(unpack(version, PACKS, out / "versions"))
    job = start_run(scene, views, 1, out, name, profile_steps=profile_steps, extra=extra, env=env, launcher=launcher)
    record = finish_run(job, evaluate=False)
    return {"run": name, "version": version, "lone_rank_of_two": lone, "train_args": " ".join(extra), **record}


def replayed_ms(record: dict) -> float:
    """Host ms per replayed step ("graph" phase over the replays; the phase is summed over every step)."""
    replays = record.get("graph_replays") or 0
    return record["phase_ms"]["graph"] * record["steps"] / replays if replays else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--room", type=Path, default=None, help="train the generated room in this folder instead")
    parser.add_argument("--views", type=int, default=2000, help="training views of each run")
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--train-args", default="", help="more ns-train options for both runs")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        help="ns-train options of one more lone-rank run, on top of --train-args (repeatable)",
    )
    parser.add_argument(
        "--versions",
        nargs="+",
        default=["."],
        help='commits packed in .build-cache/versions (versions_ab.py), "." this checkout: both runs of each, '
        "in alternating order each round",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/lone-rank"))
    parser.add_argument("--json", type=Path, default=Path("lone_rank.json"))
    args = parser.parse_args()
    scene = room_scene(args.room) if args.room else lego_scene(args.data)
    extra = args.train_args.split()
    began = time.perf_counter()
    for version in args.versions:  # each version's extension built (or loaded) before the timed runs
        if version != ".":
            build_extension(unpack(version, PACKS, args.out / "versions"))
    runs = []
    record = {"scene": scene.name, "views": args.views, "train_args": args.train_args, "runs": runs}
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def add(run_record: dict) -> None:
        """Keep a finished run in --json at once: a call's time limit keeps the runs done before it."""
        runs.append(run_record)
        record["wall_s"] = time.perf_counter() - began
        args.json.write_text(json.dumps(record, indent=2) + "\n")

    for round_ in range(args.rounds):
        for version in args.versions if round_ % 2 == 0 else args.versions[::-1]:
            label = "" if args.versions == ["."] and args.rounds == 1 else f"-{version.strip('.') or 'here'}-{round_}"
            add(run(scene, args.views, args.out, f"gpus1{label}", args.profile_steps, False, extra, version))
            add(run(scene, args.views, args.out, f"lone-rank{label}", args.profile_steps, True, extra, version))
    for i, more in enumerate(args.also):
        add(run(scene, args.views, args.out, f"lone-rank-{i + 2}", args.profile_steps, True, extra + more.split()))
    for r in runs:
        top = r["step_profiles"][0]["top_gpu_kernels_ms"] if r["step_profiles"] else {}
        print(f"{r['run']}: GPU kernels ms/step: " + ", ".join(f"{k[:50]} {v:.3f}" for k, v in list(top.items())[:8]))
    print(f"{'run':<18} {'steps':>6} {'views/s':>8} {'replayed ms':>12} {'replays':>8} {'prof host':>10} "
          f"{'prof GPU':>9} {'launches':>9}  phases (host ms/step)")  # fmt: skip
    nan = float("nan")
    for r in runs:
        prof = r["step_profiles"][0] if r["step_profiles"] else {}
        phases = ", ".join(f"{k} {v:.3f}" for k, v in r["phase_ms"].items())
        print(f"{r['run']:<18} {r['steps']:6d} {r['views_per_second']:8.1f} {replayed_ms(r):12.3f} "
              f"{r.get('graph_replays') or 0:8d} {prof.get('host_ms', nan):10.3f} "
              f"{prof.get('gpu_kernel_ms', nan):9.3f} {prof.get('launches', nan):9.1f}  {phases}")  # fmt: skip
    for i, more in enumerate(args.also):
        print(f"lone-rank-{i + 2}: {more}")
    print(f"({scene.name}, {args.views} views each, one GPU; lone-rank: rank 0 of two without a second GPU, its "
          "views/s counting two views a step as two GPUs would)")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == LAUNCHER:
        as_rank_0_of_2(sys.argv[2:])
    else:
        main()
