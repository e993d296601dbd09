"""The step profiler: a short CPU run writes per-step host times, syncs and the busiest ops."""

from __future__ import annotations

import gzip
import json

from tests.trainer_setup import cpu_config, small_scene

FIRST, PROFILED = 3, 4


def test_profile_of_training_steps_is_written(tmp_path):
    config = cpu_config(small_scene(tmp_path), tmp_path / "out", 10, "profile")
    config.profile_start, config.profile_steps, config.profile_trace = FIRST, PROFILED, True
    trainer = config.setup(local_rank=0, world_size=1)
    trainer.setup()
    trainer.train()
    summary = json.loads((config.get_base_dir() / "step_profile.json").read_text())
    assert summary["first_step"] == FIRST and summary["steps"] == PROFILED
    assert summary["host_ms"] > 0
    assert summary["launches"] == 0 and summary["gpu_kernel_ms"] == 0  # the CPU: no kernels, nothing to wait for
    assert summary["top_host_ops_ms"] and all(ms >= 0 for ms in summary["top_host_ops_ms"].values())
    with gzip.open(config.get_base_dir() / "step_trace.json.gz", "rt") as trace:
        events = json.load(trace)["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)  # the ops' host spans, in the timeline
