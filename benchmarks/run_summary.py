"""What a finished nerfstudio training run folder says about itself, read the same way by every benchmark:
step time from the trainer's "Train Iter (time)" events (their mean, and the median of the second half), the
training loop's wall time per step (from those events' wall-clock stamps, first to last: every step's whole loop,
evaluation and checkpoints included, and immune to what the host does ahead of the GPU), peak GPU memory, splats
in the final checkpoint, and bytesplat's pruned tile entries per step when logged.

nerfstudio's "Train Iter (time)" is a running average of each iteration's host time; a step replayed as a CUDA
graph returns before its GPU work ends, so where the GPU is the bound the wait lands in other iterations or
outside the timed span (a 2M-splat 1080p run: 4.8 ms "Train Iter" mean against 23 ms of loop per step,
benchmarks/RESULTS.md). The loop's wall time per step is the figure to compare between methods."""

from __future__ import annotations

from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import bytesplat_ns  # noqa: F401  (lets torch.load read nerfstudio checkpoints)


def run_summary(run_dir: Path) -> dict:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0}).Reload()  # every event, not a sample
    tags = set(events.Tags()["scalars"])

    def scalar(tag: str) -> list[float]:
        return [e.value for e in events.Scalars(tag)] if tag in tags else []

    iter_s = scalar("Train Iter (time)")
    stamps = events.Scalars("Train Iter (time)") if "Train Iter (time)" in tags else []
    loop_steps = stamps[-1].step - stamps[0].step if len(stamps) > 1 else 0
    steady = sorted(iter_s[len(iter_s) // 2 :])
    pruned = scalar("Train Metrics Dict/pruned_tile_entries")
    ckpt = torch.load(next((run_dir / "nerfstudio_models").glob("*.ckpt")), map_location="cpu")
    return {
        "step_ms_mean": 1000 * sum(iter_s) / len(iter_s) if iter_s else None,
        "step_ms_median_second_half": 1000 * steady[len(steady) // 2] if steady else None,
        "loop_ms_per_step": 1000 * (stamps[-1].wall_time - stamps[0].wall_time) / loop_steps if loop_steps else None,
        "peak_memory_mb": max(scalar("GPU Memory (MB)"), default=None),
        "splats": ckpt["pipeline"]["_model.gauss_params.means"].shape[0],
        "pruned_tile_entries_mean": sum(pruned) / len(pruned) if pruned else None,
    }
