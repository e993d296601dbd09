"""Who waits for whom in `ns-train bytesplat`'s replayed steps: the host for the GPU, or the GPU for the host (#6).

Trains bytesplat on lego (--lone-rank: as rank 0 of two, lone_rank.py) with StepGraph.run wrapped (in the ns-train
process, nothing else changed): before each step's device work the host asks the stream whether the GPU is still
busy with earlier steps (a non-blocking query); timing events bracket the step's device work (the input copies and
the graph replay) and the graph's replay alone. Read at the end, per replayed step: the GPU's time from the step's
first to its last device work (idle time included where the GPU waited for the host inside the step), the graph's
own span, and the GPU's idle gap before the step (the previous step's end to this step's start, where both were
replayed); medians over all replayed steps and over those that found the GPU busy. A GPU busy at nearly every step's
start and gaps near zero mean the GPU sets the pace: the host's time then goes to waiting (in whatever call finds
the launch queue full), and only less GPU work shortens the step.

Where the rest of the loop goes on the GPU's timeline: from the first replayed step's start to the last one's end,
the replays' own spans, the gaps between consecutive replayed steps, and what lies between replays that are not
consecutive (the refines, the steps run op by op after them, and the recordings, which happen inside a replayed
step's `run` before its replay): that last part, per refine, is what densification costs each run, with one GPU
or several (its count of refines is the same for the same number of views). Writes --json and the per-step rows
beside it (<json stem>.steps.json); table last.

    python3 benchmarks/gpu_pace.py --data .device-kit/data/lego --steps 7000 --json $OUT/gpu_pace.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import runpy
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

RECORD_ENV = "BYTESPLAT_GPU_PACE_JSON"


def child() -> None:
    """In the ns-train process: wrap StepGraph.run, then run nerfstudio (argv: python offline_nerfstudio.py ...)."""
    import torch

    from bytesplat_ns.step_graph import StepGraph

    steps: list[tuple[int, bool, list[torch.cuda.Event]]] = []
    run_step, replay_graph = StepGraph.run, torch.cuda.CUDAGraph.replay
    events: list[torch.cuda.Event] = []  # this step's: start, graph start, graph end, end

    def mark() -> None:
        events.append(torch.cuda.Event(enable_timing=True))
        events[-1].record(torch.cuda.current_stream())

    def replay(graph) -> None:
        mark()
        replay_graph(graph)
        mark()

    def run(self, step, camera, batch, note=None):
        events.clear()
        busy = not torch.cuda.current_stream().query()
        captures = self.captures
        mark()
        out = run_step(self, step, camera, batch, note)
        mark()
        if out is not None and len(events) == 4:
            steps.append((step, busy, self.captures > captures, list(events)))
        return out

    def write() -> None:
        torch.cuda.synchronize()
        rows = []
        for i, (step, busy, recorded, (start, graph_start, graph_end, end)) in enumerate(steps):
            before = steps[i - 1] if i else None  # the replayed step before this one, consecutive or not
            since = before[3][3].elapsed_time(start) if before else None
            rows.append({"step": step, "busy": busy, "recorded": recorded, "gpu_ms": start.elapsed_time(end),
                         "graph_ms": graph_start.elapsed_time(graph_end),
                         "before_graph_ms": start.elapsed_time(graph_start),
                         "after_steps": step - before[0] if before else None, "since_ms": since,
                         "gap_ms": since if before and before[0] == step - 1 else None})  # fmt: skip
        if steps:
            rows.append({"timeline_ms": steps[0][3][0].elapsed_time(steps[-1][3][3])})
        Path(os.environ[RECORD_ENV]).write_text(json.dumps(rows))

    StepGraph.run = run
    torch.cuda.CUDAGraph.replay = replay
    atexit.register(write)
    sys.argv = sys.argv[3:]  # drop this script, --child and the interpreter: offline_nerfstudio.py ns-train ... (or
    # lone_rank.py --as-rank-0-of-2 ns-train ...)
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    from host_samples import train, training_arguments
    from run_summary import run_summary

    parser = training_arguments(__doc__, "/tmp/gpu-pace")
    parser.add_argument("--options", nargs=argparse.REMAINDER, default=[], help="more ns-train options (last)")
    args = parser.parse_args()
    record = args.out / "steps.json"
    os.environ[RECORD_ENV] = str(record)
    run = train(args, "pace", wrapper=[sys.executable, __file__, "--child"])
    rows = json.loads(record.read_text())
    timeline_ms = rows.pop()["timeline_ms"]
    busy = [r for r in rows if r["busy"]]
    gaps = [r["gap_ms"] for r in rows if r["gap_ms"] is not None]
    across = [r["since_ms"] for r in rows if (r["after_steps"] or 0) > 1]  # refines and steps op by op between
    recording = [r["before_graph_ms"] for r in rows if r["recorded"]]
    between_ms = sum(across) + sum(recording)
    report = {
        "steps": args.steps, "seed": args.seed, "options": args.options, "replayed_steps": len(rows),
        "busy_at_start_fraction": len(busy) / len(rows),
        "gpu_ms_median": statistics.median(r["gpu_ms"] for r in rows),
        "gpu_ms_mean": statistics.fmean(r["gpu_ms"] for r in rows),
        "gpu_ms_median_busy": statistics.median(r["gpu_ms"] for r in busy) if busy else None,
        "graph_ms_median": statistics.median(r["graph_ms"] for r in rows),
        "graph_ms_median_busy": statistics.median(r["graph_ms"] for r in busy) if busy else None,
        "gap_ms_median": statistics.median(gaps), "gap_ms_mean": statistics.fmean(gaps),
        "gap_over_10us_fraction": sum(g > 0.01 for g in gaps) / len(gaps),
        "timeline_ms": timeline_ms, "replays_ms": sum(r["graph_ms"] for r in rows),
        "steady_gaps_ms": sum(gaps) + sum(r["before_graph_ms"] for r in rows if not r["recorded"]),
        "across_op_by_op_ms": sum(across), "stretches_op_by_op": len(across),
        "recording_ms": sum(recording), "recordings": len(recording),
        "between_replays_ms_each": between_ms / max(1, len(across)),
        "loop_ms_per_step": run_summary(run.folder)["loop_ms_per_step"],
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.with_suffix(".steps.json").write_text(json.dumps(rows) + "\n")
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for key, value in report.items():
        print(f"{key:28s} {value:.4f}" if isinstance(value, float) else f"{key:28s} {value}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
    else:
        main()
