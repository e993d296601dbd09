"""Where a lego run's time goes, split by kind of step: the GPU's timeline (gpu_pace.py's per-step rows) and the
host's loop (host_samples.py's loop stacks), for one GPU and the lone rank of two alike (issue #4, #6).

GPU timeline (from <gpu_pace json stem>.steps.json): the replays' own spans; the GPU's idle time inside replayed
steps before their graph (the host's work from the step's start to the replay, when the GPU had caught up); the
gaps between consecutive replayed steps, split into those after a refine step (densification ran between them),
after another log step (nerfstudio's writers ran) and the rest; what lies between replays that are not
consecutive (refines followed by steps run op by op); and the recordings.
Host loop (from <host_samples json stem>.loop_stacks.txt, the loop's time per step from its json): each sample
falls in the first of: a recording, the training cameras' stack being built, a step run op by op, densification
(the strategy's step_post_backward), the end of training (the final checkpoint), else a steady replayed step.

    python3 benchmarks/time_split.py --pace gpu_pace.json --samples host_samples.json --refine-every 100

(--refine-every and --steps-per-log in steps: the lone rank of two refines every 50 steps on lego.)
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

HOST_KINDS = [  # (kind, a frame that marks it), the first that matches
    ("recording", "_record ("),
    ("camera stack", "camera_stack ("),
    ("op by op", "_update (bytesplat_ns/trainer.py"),
    ("densification", "step_post_backward ("),
    ("end of training", "_after_train ("),
]


def gpu_split(pace: Path, refine_every: int, steps_per_log: int) -> dict[str, float]:
    """ms of the GPU timeline by kind (pace: gpu_pace.py's json; its rows beside it)."""
    rows = [r for r in json.loads(pace.with_suffix(".steps.json").read_text()) if "step" in r]
    split: Counter[str] = Counter()
    for r in rows:
        split["replays"] += r["graph_ms"]
        if r["recorded"]:
            split["recordings"] += r["before_graph_ms"]
        else:
            split["idle in a step, before its graph"] += r["before_graph_ms"]
        if r["gap_ms"] is not None:
            before = r["step"] - 1
            kind = ("after a refine step" if before % refine_every == 0
                    else "after a log step" if before % steps_per_log == 0 else "other")  # fmt: skip
            split[f"gap, {kind}"] += r["gap_ms"]
        elif (r["after_steps"] or 0) > 1:
            split["refines and steps op by op between replays"] += r["since_ms"]
    return dict(split)


def host_split(samples: Path) -> dict[str, float]:
    """ms per step of the host's loop by kind (samples: host_samples.py's json; its loop stacks beside it)."""
    loop_ms = json.loads(samples.read_text())["loop_ms_per_step"]
    counts: Counter[str] = Counter()
    for line in samples.with_suffix(".loop_stacks.txt").read_text().splitlines():
        stack, n = line.rsplit(" ", 1)
        counts[next((kind for kind, frame in HOST_KINDS if frame in stack), "steady replayed steps")] += int(n)
    total = sum(counts.values())
    return {kind: loop_ms * n / total for kind, n in counts.most_common()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pace", type=Path, help="gpu_pace.py's json")
    parser.add_argument("--samples", type=Path, help="host_samples.py's json")
    parser.add_argument("--refine-every", type=int, default=100, help="steps")
    parser.add_argument("--steps-per-log", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = {}
    if args.pace:
        report["gpu_timeline_ms"] = gpu_split(args.pace, args.refine_every, args.steps_per_log)
        print("GPU timeline, ms:")
        for kind, ms in sorted(report["gpu_timeline_ms"].items(), key=lambda kv: -kv[1]):
            print(f"  {ms:9.1f}  {kind}")
    if args.samples:
        report["host_loop_ms_per_step"] = host_split(args.samples)
        print("host loop, ms per step:")
        for kind, ms in report["host_loop_ms_per_step"].items():
            print(f"  {ms:9.3f}  {kind}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
