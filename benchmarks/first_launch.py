"""What the first CUDA call of a training step waits for (issues #4, #6).

py-spy put 90-105 us of each lego step's host time on `AdamAllGroups.load_learning_rates` (one `fill_`, the step's
first CUDA call after the step before's replay; benchmarks/RESULTS.md, forty-eighth session), where
benchmarks/launch_probe.py, the same calls alone in a process, took 18-27 us. This trains lego (one GPU, or
--lone-rank: rank 0 of two, lone_rank.py) with that call and the step graph's input load (its second call) timed
from inside the process, through a sitecustomize module on PYTHONPATH that wraps them (the library is unchanged):
per call its wall time, the thread's CPU time over it (wall well above CPU: the thread was off the CPU, waiting
for the interpreter lock or descheduled; wall near CPU: it spun, in the driver or in Python), and whether the
GPU's stream had finished its work just before (`torch.cuda.Stream.query`, timed too). --split times the
learning rates' parts instead (the select, the fill, the same fill once more). Table last, --json.

    python3 benchmarks/first_launch.py --data .device-kit/data/lego --steps 7000 [--lone-rank] --json $OUT/fl.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from host_samples import train, training_arguments  # noqa: E402

HOOK = """
import atexit, json, os, time
import torch
from bytesplat_ns import adam_all_groups, step_graph

_records = {}

def _timed(owner, name):
    inner = getattr(owner, name)
    calls = _records.setdefault(f"{owner.__name__}.{name}", [])
    def wrapper(*args, **kwargs):
        q0 = time.perf_counter_ns()
        idle = torch.cuda.current_stream().query() if torch.cuda.is_available() else False
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        out = inner(*args, **kwargs)
        w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
        calls.append((w1 - w0, c1 - c0, w0 - q0, idle))
        return out
    setattr(owner, name, wrapper)

def _split(self):
    # load_learning_rates with its parts timed: the selects, the fills, the same fills once more
    calls = _records.setdefault("load_learning_rates parts", [])
    parts = [0, 0, 0, 0]
    for index, opt in enumerate(self.optimizers.optimizers.values()):
        lr = opt.param_groups[0]["lr"]
        if lr != self._lr_values[index]:
            t0 = time.perf_counter_ns()
            view = self.lrs[index]
            t1 = time.perf_counter_ns()
            view.fill_(lr)
            t2 = time.perf_counter_ns()
            view.fill_(lr)  # the same value again: changes nothing
            t3 = time.perf_counter_ns()
            parts = [parts[0] + t1 - t0, parts[1] + t2 - t1, parts[2] + t3 - t2, parts[3] + 1]
            self._lr_values[index] = lr
    calls.append(parts)

if os.environ.get("BYTESPLAT_SPLIT_LR"):
    adam_all_groups.AdamAllGroups.load_learning_rates = _split
else:
    _timed(adam_all_groups.AdamAllGroups, "load_learning_rates")
_timed(step_graph._GraphInputs, "load")

@atexit.register
def _dump():
    path = os.path.join(os.environ["BYTESPLAT_CALL_TIMES"], f"calls_{os.getpid()}.json")
    with open(path, "w") as f:
        json.dump(_records, f)
"""


def summarise_parts(calls: list[list]) -> dict:
    """[(select ns, first fill ns, second fill ns, fills)] -> means in microseconds per step."""
    steady = calls[len(calls) // 10 :]
    mean = lambda i: statistics.mean(c[i] for c in steady) / (1 if i == 3 else 1000)  # noqa: E731
    return {"calls": len(steady), "select_us_mean": mean(0), "fill_us_mean": mean(1), "fill_again_us_mean": mean(2),
            "fills_per_step": mean(3)}  # fmt: skip


def summarise(calls: list[list]) -> dict:
    """[(wall ns, thread CPU ns, query ns, GPU idle before)] -> means and medians in microseconds."""
    steady = calls[len(calls) // 10 :]  # after the first tenth
    wall, cpu, query = ([c[i] / 1000 for c in steady] for i in range(3))
    idle = [c for c in steady if c[3]]
    busy = [c for c in steady if not c[3]]
    mean_wall = lambda cs: statistics.mean(c[0] / 1000 for c in cs) if cs else None  # noqa: E731
    return {
        "calls": len(steady), "wall_us_median": statistics.median(wall), "wall_us_mean": statistics.mean(wall),
        "cpu_us_mean": statistics.mean(cpu), "off_cpu_us_mean": statistics.mean(wall) - statistics.mean(cpu),
        "query_us_mean": statistics.mean(query), "gpu_idle_fraction": len(idle) / len(steady),
        "wall_us_mean_gpu_idle": mean_wall(idle), "wall_us_mean_gpu_busy": mean_wall(busy),
        "wall_us_p90": sorted(wall)[int(0.9 * len(wall))], "wall_us_over_50": sum(w > 50 for w in wall) / len(wall),
    }  # fmt: skip


def main() -> None:
    parser = training_arguments(__doc__, "/tmp/first-launch")
    parser.add_argument("--split", action="store_true", help="time load_learning_rates' parts instead")
    parser.add_argument("--options", nargs=argparse.REMAINDER, default=[], help="more ns-train options (last)")
    args = parser.parse_args()
    hook = args.out / "hook"
    hook.mkdir(parents=True, exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    for old in args.out.glob("calls_*.json"):
        old.unlink()
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)
    os.environ["BYTESPLAT_CALL_TIMES"] = str(args.out)
    if args.split:
        os.environ["BYTESPLAT_SPLIT_LR"] = "1"
    name = "lone-rank" if args.lone_rank else "one-gpu"
    run = train(args, name, wrapper=[])
    dumps = list(args.out.glob("calls_*.json"))
    records = {k: v for d in dumps for k, v in json.loads(d.read_text()).items() if v}
    if not records:
        raise SystemExit(f"No timed call in {args.out}: did the sitecustomize hook load? See {run.log}")
    parts = {name: summarise_parts(calls) for name, calls in records.items() if "parts" in name}
    calls = {name: summarise(calls) for name, calls in records.items() if "parts" not in name}
    report = {"steps": args.steps, "lone_rank": args.lone_rank, "options": args.options, "calls": calls, "parts": parts}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{name}, {args.steps} views; us per call after the first tenth of the steps")
    print("| call | calls | wall median | wall mean | CPU mean | off CPU | query | GPU idle | wall idle / busy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for call, s in report["calls"].items():
        idle, busy = (
            f"{v:.1f}" if v is not None else "-" for v in (s["wall_us_mean_gpu_idle"], s["wall_us_mean_gpu_busy"])
        )
        cells = [s["wall_us_median"], s["wall_us_mean"], s["cpu_us_mean"], s["off_cpu_us_mean"], s["query_us_mean"]]
        numbers = " | ".join(f"{v:.1f}" for v in cells)
        print(f"| {call} | {s['calls']} | {numbers} | {100 * s['gpu_idle_fraction']:.0f}% | {idle} / {busy} |")
    for call, s in report["parts"].items():
        print(
            f"{call}: select {s['select_us_mean']:.1f} us, fill {s['fill_us_mean']:.1f} us, the same fill again "
            f"{s['fill_again_us_mean']:.1f} us; {s['fills_per_step']:.2f} fills a step ({s['calls']} steps)"
        )


if __name__ == "__main__":
    main()
