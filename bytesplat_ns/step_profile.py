"""A profile of a few steady-state training steps: where the host's time goes, what the GPU does, how often
the host waits for it.

With `--profile-steps K` (and `--profile-start S`) the trainer runs torch.profiler around training steps
S .. S+K-1 (whole iterations, densification callbacks included) and writes per-step means to
`<run folder>/step_profile.json` (every other rank: `step_profile_rank<r>.json`):
- host_ms: wall time per step under the profiler (the profiler adds host overhead; compare like with like);
- gpu_kernel_ms: summed duration of the GPU's kernels and copies per step (streams may overlap);
- launches: kernel launches per step (cudaLaunchKernel and its driver/ex variants);
- syncs: calls that block the host until the GPU catches up (stream/device/event synchronize, blocking
  copies), with the host time spent in them (sync_wait_ms): `.item()`, `nonzero`, `.tolist()` of CUDA
  tensors all end in one of these; memcpy_ms: host time in cudaMemcpyAsync (a copy to pageable host memory
  blocks there until the GPU reaches it);
- where the syncs come from (the innermost Python frame outside torch that led to each);
- the ops taking the most host time (self time) and the kernels taking the most GPU time.
"""

from __future__ import annotations

import json
import re
import time
from bisect import bisect_right
from collections import Counter
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel")  # fmt: skip
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
TOP = 15
FRAME = re.compile(r"^\S+\(\d+\): ")
"""A Python frame as the profiler names it: `path(line): function`."""


class StepProfiler:
    """Profiles training steps start .. start + steps - 1 and writes their summary to `path`."""

    def __init__(self, start: int, steps: int, path: Path) -> None:
        self.start, self.steps, self.path = start, steps, path
        self._profile: profile | None = None
        self._began = 0.0

    def before_step(self, step: int) -> None:
        if self.steps <= 0 or step != self.start:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profile = profile(activities=activities, with_stack=True)
        self._profile.__enter__()
        self._began = time.perf_counter()

    def after_step(self, step: int) -> None:
        if self._profile is None or step != self.start + self.steps - 1:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the last step's kernels finish inside the profile (once, not per step)
        host_s = time.perf_counter() - self._began
        self._profile.__exit__(None, None, None)
        summary = summarize(self._profile, self.steps, host_s)
        self._profile = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"first_step": self.start, **summary}, indent=2) + "\n")


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
        "syncs": sum(a.count for a in calls(SYNCS)) * per_step,
        "sync_wait_ms": sum(a.self_cpu_time_total for a in calls(SYNCS)) / 1000 * per_step,
        "sync_calls": {a.key: a.count * per_step for a in calls(SYNCS)},
        "memcpy_ms": sum(a.self_cpu_time_total for a in calls(("cudaMemcpyAsync",))) / 1000 * per_step,
        "sync_sources": {where: n * per_step for where, n in sync_sources(prof).most_common(TOP)},
        "top_host_ops_ms": {
            a.key: a.self_cpu_time_total / 1000 * per_step
            for a in sorted(host, key=lambda a: a.self_cpu_time_total, reverse=True)[:TOP]
        },
        "top_gpu_kernels_ms": {
            a.key[:120]: a.self_device_time_total / 1000 * per_step
            for a in sorted(device, key=lambda a: a.self_device_time_total, reverse=True)[:TOP]
        },
    }


def sync_sources(prof: profile, names: tuple[str, ...] = SYNCS) -> Counter:
    """Innermost Python frame outside torch around each of the `names` calls -> how many there were."""
    frames: dict[int, list] = {}
    for event in prof.events():
        if FRAME.match(event.name) and not event.name.startswith("torch/"):
            frames.setdefault(event.thread, []).append(event)
    for thread in frames.values():
        thread.sort(key=lambda e: e.time_range.start)
    starts = {thread: [e.time_range.start for e in events] for thread, events in frames.items()}
    sources: Counter = Counter()
    for event in prof.events():
        if event.name not in names:
            continue
        around = frames.get(event.thread, [])
        i = bisect_right(starts.get(event.thread, []), event.time_range.start) - 1
        while i >= 0 and around[i].time_range.end < event.time_range.end:  # ended before: not around it
            i -= 1
        sources[around[i].name if i >= 0 else "unknown"] += 1
    return sources
