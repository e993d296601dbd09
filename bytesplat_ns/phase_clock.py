"""Laps of host wall time, summed by name: the training step's phases (run_stats.py) and the parts of the
gradient exchange (grad_compaction.py)."""

from __future__ import annotations

import time


class PhaseClock:
    """Adds the host time since the last lap (or since it was made) to `phases[name]` at each `lap(name)`."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.last = phases, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now
