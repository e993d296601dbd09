"""A profile of a few steady-state training steps: where the host's time goes, what the GPU does, how often
the host waits for it.

With `--profile-steps K` (and `--profile-start S`) the trainer runs torch.profiler around training steps
S .. S+K-1 (whole iterations, densification callbacks included) and writes per-step means to
`<run folder>/step_profile.json` (every other rank: `step_profile_rank<r>.json`):
- host_ms: wall time per step under the profiler (the profiler adds host overhead; compare like with like);
- gpu_kernel_ms: summed duration of the GPU's kernels and copies per step (streams may overlap);
- launches: kernel launches per step (cudaLaunchKernel and its driver/ex variants); graph_launches: CUDA graph
  replays per step (step_graph.py; each runs the recorded step's kernels);
- syncs: calls that block the host until the GPU catches up (stream/device/event synchronize, blocking
  copies), with the host time spent in them (sync_wait_ms): `.item()`, `nonzero`, `.tolist()` of CUDA
  tensors all end in one of these; memcpy_ms: host time in cudaMemcpyAsync (a copy to pageable host memory
  blocks there until the GPU reaches it);
- where the syncs come from: the Python line of each synchronizing call (torch.cuda.set_sync_debug_mode's
  warnings, so the explicit ones, NCCL's and event waits, are not among them);
- the ops taking the most host time (self time) and the kernels taking the most GPU time.
With `--profile-trace True` the profile's timeline goes beside it as a gzipped Chrome trace
(`step_trace.json.gz`, other ranks `step_trace_rank<r>.json.gz`; open it in Perfetto or chrome://tracing): every
op's host span in order, to see where a phase's host time goes.
"""

from __future__ import annotations

import json
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel")  # fmt: skip
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
TOP = 15


class StepProfiler:
    """Profiles training steps start .. start + steps - 1 and writes their summary to `path`."""

    def __init__(self, start: int, steps: int, path: Path, trace: Path | None = None) -> None:
        self.start, self.steps, self.path, self.trace = start, steps, path, trace
        self._profile: profile | None = None
        self._began = 0.0

    def before_step(self, step: int) -> None:
        if self.steps <= 0 or step != self.start:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profile = profile(activities=activities)
        self._profile.__enter__()
        self._sync_warnings = warnings.catch_warnings(record=True)
        self._caught = self._sync_warnings.__enter__()
        warnings.simplefilter("always")
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")  # every synchronizing call warns, naming its Python line
        self._began = time.perf_counter()

    def after_step(self, step: int) -> None:
        if self._profile is None or step != self.start + self.steps - 1:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the last step's kernels finish inside the profile (once, not per step)
        host_s = time.perf_counter() - self._began
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode(0)
        self._sync_warnings.__exit__(None, None, None)
        self._profile.__exit__(None, None, None)
        summary = summarize(self._profile, self.steps, host_s)
        sources = Counter(f"{w.filename}:{w.lineno}" for w in self._caught if "synchroniz" in str(w.message))
        summary["sync_sources"] = {where: n / self.steps for where, n in sources.most_common(TOP)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"first_step": self.start, **summary}, indent=2) + "\n")
        if self.trace is not None:
            self._profile.export_chrome_trace(str(self.trace))  # gzipped: the path ends in .gz
        self._profile = None


def summarize(prof: profile, steps: int, host_s: float) -> dict:
    """Per-step means of a finished profile of `steps` steps that took `host_s` seconds."""
    averages = prof.key_averages()
    host = [a for a in averages if a.device_type == DeviceType.CPU]
    device = [a for a in averages if a.device_type != DeviceType.CPU]
    per_step = 1.0 / steps

    def calls(names: tuple[str, ...]) -> list:
        return [a for a in host if a.key in names]

    return {
        "steps": steps,
        "host_ms": 1000 * host_s * per_step,
        "gpu_kernel_ms": sum(a.self_device_time_total for a in device) / 1000 * per_step,
        "launches": sum(a.count for a in calls(LAUNCHES)) * per_step,
        "graph_launches": sum(a.count for a in calls(("cudaGraphLaunch",))) * per_step,
        "syncs": sum(a.count for a in calls(SYNCS)) * per_step,
        "sync_wait_ms": sum(a.self_cpu_time_total for a in calls(SYNCS)) / 1000 * per_step,
        "sync_calls": {a.key: a.count * per_step for a in calls(SYNCS)},
        "memcpy_ms": sum(a.self_cpu_time_total for a in calls(("cudaMemcpyAsync",))) / 1000 * per_step,
        "top_host_ops_ms": {
            a.key: a.self_cpu_time_total / 1000 * per_step
            for a in sorted(host, key=lambda a: a.self_cpu_time_total, reverse=True)[:TOP]
        },
        "top_gpu_kernels_ms": {
            a.key[:120]: a.self_device_time_total / 1000 * per_step
            for a in sorted(device, key=lambda a: a.self_device_time_total, reverse=True)[:TOP]
        },
    }
