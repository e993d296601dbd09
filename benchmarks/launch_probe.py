"""Does a small launch right after a CUDA graph's replay make the host wait? (issues #4, #6)

py-spy put 90-105 us of each lego training step's host time on one line, `AdamAllGroups.load_learning_rates`'s
`fill_` of one learning rate, the first CUDA call of a step after the step graph's replay (benchmarks/RESULTS.md,
forty-eighth session). This probe times that pattern alone, in a process of its own: a graph of `--nodes` small
kernels doing `--gpu-us` of GPU work in all is recorded once, then each of `--steps` host steps runs, as the
trainer does, a `fill_` of one value, a `fill_` of an index, the replay, a small copy to pinned host memory read
`--lag` steps later, and `--host-us` of Python work (the rest of the trainer's step). Host time per call by
percentile, for each GPU/host balance given; table last, --json.

    python3 benchmarks/launch_probe.py --json $OUT/launch_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import deque
from pathlib import Path

import torch

CALLS = ("fill lr", "fill index", "replay", "copy out", "late read")


def busy(us: float) -> None:
    """Python work for about `us` microseconds (holds the interpreter, as the trainer's own code does)."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def cycles_per_us() -> float:
    """The GPU's clock cycles per microsecond, as torch.cuda._sleep counts them (timed once)."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (1000 * start.elapsed_time(end))


def record(nodes: int, gpu_us: float) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A graph of `nodes` kernels taking about `gpu_us` in all: sleeps on the GPU, each reading the learning rate
    and index the host writes before a replay, so the graph depends on them as the step graph does."""
    lrs, index = torch.zeros(4, device="cuda"), torch.zeros(1, dtype=torch.int64, device="cuda")
    out = torch.zeros(1, device="cuda")
    cycles = int(gpu_us / (nodes / 2) * cycles_per_us())  # half the nodes sleep
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the graph (lazy module loading)
        torch.cuda._sleep(1)
        out.add_(lrs[0] + index[0])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for node in range(nodes):
            if node % 2:
                out.add_(lrs[0] + index[0])
            else:
                torch.cuda._sleep(max(1, cycles))
    return graph, lrs, index, out


def spread(values: list[float]) -> dict:
    ranked = sorted(values)
    at = lambda q: ranked[min(len(ranked) - 1, int(q * len(ranked)))]  # noqa: E731
    return {"median": at(0.5), "p90": at(0.9), "p99": at(0.99), "mean": statistics.mean(ranked)}


def run(nodes: int, gpu_us: float, host_us: float, steps: int, lag: int) -> dict:
    graph, lrs, index, out = record(nodes, gpu_us)
    pinned = [torch.empty(1, pin_memory=True) for _ in range(lag + 1)]
    events = [torch.cuda.Event() for _ in range(lag + 1)]
    pending: deque[int] = deque()
    times: dict[str, list[float]] = {call: [] for call in CALLS}
    torch.cuda.synchronize()
    began = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        lrs[0].fill_(1e-4 * (1 + step % 7))
        t1 = time.perf_counter()
        index.fill_(step % 100)
        t2 = time.perf_counter()
        graph.replay()
        t3 = time.perf_counter()
        slot = step % (lag + 1)
        pinned[slot].copy_(out, non_blocking=True)
        events[slot].record()
        pending.append(slot)
        t4 = time.perf_counter()
        if len(pending) > lag:
            old = pending.popleft()
            events[old].synchronize()
            pinned[old].item()
        t5 = time.perf_counter()
        busy(host_us)
        if step >= steps // 10:  # after the first tenth: steady state
            for call, a, b in zip(CALLS, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
                times[call].append(1e6 * (b - a))
    torch.cuda.synchronize()
    wall_us = 1e6 * (time.perf_counter() - began) / steps
    percentiles = {call: spread(values) for call, values in times.items()}
    return {"nodes": nodes, "gpu_us": gpu_us, "host_us": host_us, "steps": steps, "lag": lag,
            "wall_us_per_step": wall_us, "us_per_call": percentiles}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=300, help="kernels in the graph")
    parser.add_argument("--balances", nargs="+", default=["650:400", "650:800", "100:400"],
                        help="GPU_US:HOST_US pairs: the graph's GPU time and the Python work per step")  # fmt: skip
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--lag", type=int, default=4, help="steps before a copy to the host is read")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    results = []
    for balance in args.balances:
        gpu_us, host_us = (float(v) for v in balance.split(":"))
        results.append(run(args.nodes, gpu_us, host_us, args.steps, args.lag))
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{report['gpu']}, {args.nodes} graph nodes, us per call (median / p90 / mean) after the first tenth")
    print("| GPU us | host us | step us | " + " | ".join(CALLS) + " |")
    print("|---" * (3 + len(CALLS)) + "|")
    for r in results:
        cells = [f"{c['median']:.1f} / {c['p90']:.1f} / {c['mean']:.1f}" for c in r["us_per_call"].values()]
        print(f"| {r['gpu_us']:.0f} | {r['host_us']:.0f} | {r['wall_us_per_step']:.0f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
