"""Who waits for whom in `ns-train bytesplat`'s replayed steps: the host for the GPU, or the GPU for the host (#6).

Trains bytesplat on lego with StepGraph.run wrapped (in the ns-train process, nothing else changed): before each
step's device work the host asks the stream whether the GPU is still busy with earlier steps (a non-blocking
query), and two timing events bracket the step's device work (the input copies and the graph replay). Read at the
end, per replayed step: the GPU's time from the step's first to its last device work, and the GPU's idle gap
before it (the previous step's end to this step's start, where both were replayed). A GPU busy at nearly every
step's start and gaps near zero mean the GPU sets the pace: the host's time then goes to waiting (in whatever
call finds the launch queue full), and only less GPU work shortens the step. Writes --json; table last.

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

    steps: list[tuple[int, bool, torch.cuda.Event, torch.cuda.Event]] = []
    replay = StepGraph.run

    def run(self, step, camera, batch, note=None):
        stream = torch.cuda.current_stream()
        busy = not stream.query()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        out = replay(self, step, camera, batch, note)
        end.record(stream)
        if out is not None:
            steps.append((step, busy, start, end))
        return out

    def write() -> None:
        torch.cuda.synchronize()
        rows = []
        for i, (step, busy, start, end) in enumerate(steps):
            previous = steps[i - 1] if i and steps[i - 1][0] == step - 1 else None
            gap = previous[3].elapsed_time(start) if previous else None
            rows.append({"step": step, "busy": busy, "gpu_ms": start.elapsed_time(end), "gap_ms": gap})
        Path(os.environ[RECORD_ENV]).write_text(json.dumps(rows))

    StepGraph.run = run
    atexit.register(write)
    sys.argv = sys.argv[3:]  # drop this script, --child and the interpreter: offline_nerfstudio.py ns-train ...
    import offline_nerfstudio

    offline_nerfstudio.main()


def main() -> None:
    from quality_seeds import Run, start
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
    run = Run("pace", args.seed, "bytesplat", [0], ["--summary-eval", "False", *args.options], args.out / "pace.log")
    start(run, args.steps, args.data, args.out, wrapper=[sys.executable, __file__, "--child"])
    if run.process.wait() != 0:
        raise SystemExit(f"ns-train failed (exit {run.process.returncode}); see {run.log}")
    rows = json.loads(record.read_text())
    gaps = [r["gap_ms"] for r in rows if r["gap_ms"] is not None]
    report = {
        "steps": args.steps, "seed": args.seed, "options": args.options, "replayed_steps": len(rows),
        "busy_at_start_fraction": sum(r["busy"] for r in rows) / len(rows),
        "gpu_ms_median": statistics.median(r["gpu_ms"] for r in rows),
        "gpu_ms_mean": statistics.fmean(r["gpu_ms"] for r in rows),
        "gap_ms_median": statistics.median(gaps), "gap_ms_mean": statistics.fmean(gaps),
        "gap_over_10us_fraction": sum(g > 0.01 for g in gaps) / len(gaps),
        "loop_ms_per_step": run_summary(run.folder)["loop_ms_per_step"],
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for key, value in report.items():
        print(f"{key:28s} {value:.4f}" if isinstance(value, float) else f"{key:28s} {value}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child()
    else:
        main()
