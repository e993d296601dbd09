"""Who waits for whom in `ns-train bytesplat`'s replayed steps: the host for the GPU, or the GPU for the host (#6).

Trains bytesplat on lego with StepGraph.run wrapped (in the ns-train process, nothing else changed): before each
step's device work the host asks the stream whether the GPU is still busy with earlier steps (a non-blocking
query); timing events bracket the step's device work (the input copies and the graph replay) and the graph's
replay alone. Read at the end, per replayed step: the GPU's time from the step's first to its last device work
(idle time included where the GPU waited for the host inside the step), the graph's own span, and the GPU's idle
gap before the step (the previous step's end to this step's start, where both were replayed); medians over all
replayed steps and over those that found the GPU busy. A GPU busy at nearly every step's start and gaps near zero
mean the GPU sets the pace: the host's time then goes to waiting (in whatever call finds the launch queue full),
and only less GPU work shortens the step. Writes --json and the per-step rows beside it (<json
stem>.steps.json); table last.

    python3 benchmarks/gpu_pace.py --data .device-kit/data/lego --steps 7000 --json $OUT/gpu_pace.json
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
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
        mark()
        out = run_step(self, step, camera, batch, note)
        mark()
        if out is not None and len(events) == 4:
            steps.append((step, busy, list(events)))
        return out

    def write() -> None:
        torch.cuda.synchronize()
        rows = []
        for i, (step, busy, (start, graph_start, graph_end, end)) in enumerate(steps):
            previous = steps[i - 1] if i and steps[i - 1][0] == step - 1 else None
            gap = previous[2][3].elapsed_time(start) if previous else None
            rows.append({"step": step, "busy": busy, "gpu_ms": start.elapsed_time(end),
                         "graph_ms": graph_start.elapsed_time(graph_end), "gap_ms": gap})  # fmt: skip
        Path(os.environ[RECORD_ENV]).write_text(json.dumps(rows))

    StepGraph.run = run
    torch.cuda.CUDAGraph.replay = replay
    atexit.register(write)
    sys.argv = sys.argv[3:]  # drop this script, --child and the interpreter: offline_nerfstudio.py ns-train ...
    import offline_nerfstudio

    offline_nerfstudio.main()


def main() -> None:
    from host_samples import train
    from run_summary import run_summary

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="lego (blender-data)")
    parser.add_argument("--steps", type=int, default=7000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--options", nargs=argparse.REMAINDER, default=[], help="more ns-train options (last)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu-pace"))
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    record = args.out / "steps.json"
    os.environ[RECORD_ENV] = str(record)
    run = train(args, "pace", wrapper=[sys.executable, __file__, "--child"])
    rows = json.loads(record.read_text())
    busy = [r for r in rows if r["busy"]]
    gaps = [r["gap_ms"] for r in rows if r["gap_ms"] is not None]
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
