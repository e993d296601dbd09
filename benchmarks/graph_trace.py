"""Where a replayed step's time goes, read from a profiled run's trace (issue #6).

`ns-train bytesplat ... --profile-steps 20 --profile-start 6510 --profile-trace True` writes the profiled steps'
timeline beside the run (step_trace.json.gz, step_profile.py). This reads it per interval between two CUDA graph
launches (one replayed step):
- the graph's GPU work: its kernels, copies and memsets (matched to their launch by its correlation id), their
  span and busy time, and how many are tiny (under 3 us);
- the host: cudaGraphLaunch's own duration (it grows with the graph's node count), the time from the launch to
  the first kernel, and the launch-to-launch interval (the step as the profiled run paced it);
prints one interval's host timeline (top-level torch ops and CUDA calls; the gaps between them are Python), and
the graph's kernels by name: how many run per replayed step and their GPU time (medians), the largest first.
Medians over the intervals; the profiler slows host ops, so compare host figures only between traces.

    python3 benchmarks/graph_trace.py <run folder>/step_trace.json.gz [--show 8] [--json kernels.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

TINY_US = 3.0
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
HOST = ("cpu_op", "cuda_runtime")


def intervals(trace: dict) -> tuple[list[dict], list[list[dict]], list[dict]]:
    """-> (graph launches, each launch's device events, host events), sorted by time. A graph's nodes carry their
    launch's correlation id; where the GPU runs behind the host they run after the next launch, so they are
    matched by that id, not by time."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    launches = sorted((e for e in events if e["name"] == "cudaGraphLaunch"), key=lambda e: e["ts"])
    launch_of = {e["args"]["correlation"]: i for i, e in enumerate(launches)}
    device: list[list[dict]] = [[] for _ in launches]
    for e in sorted((e for e in events if e.get("cat") in DEVICE), key=lambda e: e["ts"]):
        i = launch_of.get(e.get("args", {}).get("correlation"))
        if i is not None:
            device[i].append(e)
    host = sorted((e for e in events if e.get("cat") in HOST), key=lambda e: e["ts"])
    return launches, device, host


def replay_figures(launch: dict, next_launch: dict, graph: list[dict]) -> dict[str, float]:
    """One replay's figures."""
    tiny = [e for e in graph if e["dur"] < TINY_US]
    return {
        "graph nodes run": len(graph),
        "graph span us": graph[-1]["ts"] + graph[-1]["dur"] - graph[0]["ts"],
        "graph busy us": sum(e["dur"] for e in graph),
        "tiny kernels": len(tiny),
        "tiny kernels busy us": sum(e["dur"] for e in tiny),
        "cudaGraphLaunch host us": launch["dur"],
        "launch to first kernel us": graph[0]["ts"] - launch["ts"],
        "launch to launch us": next_launch["ts"] - launch["ts"],
    }


def kernels_by_name(graphs: list[list[dict]], width: int = 120) -> list[dict]:
    """The graph's nodes grouped by name (cut to `width` characters): per replayed step, the median count and
    GPU time; sorted by time, the largest first."""
    names = {e["name"][:width] for graph in graphs for e in graph}
    rows = []
    for name in names:
        counts = [sum(1 for e in g if e["name"][:width] == name) for g in graphs]
        times = [sum(e["dur"] for e in g if e["name"][:width] == name) for g in graphs]
        rows.append({"name": name, "per_step": statistics.median(counts), "us": statistics.median(times)})
    return sorted(rows, key=lambda r: -r["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--show", type=int, default=8, help="the interval whose host timeline is printed")
    parser.add_argument("--json", type=Path, default=None, help="write the figures and the kernel table here")
    args = parser.parse_args()
    launches, device, host = intervals(json.loads(gzip.open(args.trace).read()))
    # the first interval holds the profiler's start-up; an interval without kernels is not a replay
    replays = [i for i, work in enumerate(device[:-1]) if i > 0 and work]
    rows = [replay_figures(launches[i], launches[i + 1], device[i]) for i in replays]
    print(f"{len(rows)} replayed steps")
    medians = {}
    for name in rows[0]:
        values = [r[name] for r in rows]
        medians[name] = statistics.median(values)
        print(f"{name:28s} median {medians[name]:8.1f}  min {min(values):8.1f}  max {max(values):8.1f}")
    kernels = kernels_by_name([device[i] for i in replays])
    print("\nthe graph's nodes by name, per replayed step (medians):\n   count       us  name")
    for row in kernels:
        print(f"{row['per_step']:8.1f} {row['us']:8.1f}  {row['name']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        figures = {"replayed_steps": len(rows), "medians": medians, "kernels": kernels}
        args.json.write_text(json.dumps(figures, indent=1))
    begin, end = launches[args.show]["ts"], launches[args.show + 1]["ts"]
    print(f"\nhost timeline of interval {args.show} (us from its launch; top-level ops only):")
    last = begin
    for e in host:
        if begin <= e["ts"] < end and e["ts"] >= last:
            print(f"{e['ts'] - begin:8.1f} {e['dur']:7.1f}  gap before {e['ts'] - last:6.1f}  {e['name'][:60]}")
            last = e["ts"] + e["dur"]


if __name__ == "__main__":
    main()
