"""What a training run measured about itself: throughput, where the host's time per step goes, exchange bytes.

Rank 0 shows them in the closing summary and writes them to `<run folder>/bytesplat_stats.json`, which the
benchmarks read; every other rank writes its own beside it (`bytesplat_stats_rank<r>.json`). Times are host
wall times: a whole training iteration (densification callbacks included; evaluations, logging and
checkpoints between iterations excluded), split into phases: forward (data, render, loss), backward,
exchange (several GPUs: the gradient exchange), optimizer, and the callbacks; a step replayed as a CUDA graph
(step_graph.py) spends its forward-to-optimizer-update time in "graph" (input copies and the launch), and its
"optimizer" phase is then the learning-rate schedulers only.
Host time of a phase includes waiting for the GPU only where the phase syncs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bytesplat_ns.grad_compaction import ExchangeStats
from bytesplat_ns.phase_clock import PhaseClock


@dataclass
class RunStats:
    views_per_step: int = 1
    steps: int = 0
    step_seconds: float = 0.0
    """Sum of the training iterations' wall times."""
    phase_seconds: dict[str, float] = field(default_factory=dict)
    """Phase -> sum over steps of its host wall time (forward, backward, exchange, optimizer)."""
    exchange_sent_bytes: int = 0
    """Sum over steps of the bytes each rank sent in the compacted exchange."""
    exchange_dense_bytes: int = 0
    """Sum over steps of what a dense ring all-reduce of the same gradients would have sent per rank."""
    exchange_overflows: int = 0
    """Exchanges where a rank had more touched rows than the capacity (the rest went a step later)."""
    exchange_dense_steps: int = 0
    """Exchanges made as a dense all-reduce because the compacted buffers would have been larger."""
    exchange_part_seconds: dict[str, float] = field(default_factory=dict)
    """Part of the exchange -> sum over steps of its host wall time (inside the exchange phase)."""
    first_step_unix: float | None = None
    """Wall-clock time (time.time()) at which the first training step began: start-up ends there."""
    startup_unix: dict[str, float] = field(default_factory=dict)
    """Start-up mark -> wall-clock time (time.time()) it was passed (trainer.py: trainer made, pipeline set up,
    images cached, set-up done, training loop entered); with first_step_unix, where start-up goes."""
    saved_unix: dict[int, float] = field(default_factory=dict)
    """Checkpoint step -> wall-clock time its save began (benchmarks/time_to_target.py: quality against time)."""
    _started: float | None = None

    def start_step(self) -> None:
        if self.first_step_unix is None:
            self.first_step_unix = time.time()
        self._started = time.perf_counter()

    def end_step(self) -> None:
        if self._started is not None:
            self.steps += 1
            self.step_seconds += time.perf_counter() - self._started
            self._started = None

    def phase_clock(self) -> PhaseClock:
        return PhaseClock(self.phase_seconds)

    def add_exchange(self, exchange: ExchangeStats | None) -> None:
        if exchange is not None:
            self.exchange_sent_bytes += exchange.sent_bytes
            self.exchange_dense_bytes += exchange.dense_bytes
            self.exchange_overflows += exchange.overflows
            self.exchange_dense_steps += exchange.dense
            for part, seconds in exchange.part_seconds.items():
                self.exchange_part_seconds[part] = self.exchange_part_seconds.get(part, 0.0) + seconds

    @property
    def views_per_second(self) -> float:
        return self.steps * self.views_per_step / self.step_seconds if self.step_seconds else 0.0

    @property
    def exchange_reduction(self) -> float | None:
        """1 - compacted / dense bytes (None without an exchange)."""
        return 1 - self.exchange_sent_bytes / self.exchange_dense_bytes if self.exchange_dense_bytes else None

    def phase_ms(self) -> dict[str, float]:
        """Mean host milliseconds per step of each phase, the callbacks being the rest of the iteration."""
        steps = max(1, self.steps)
        phases = {name: 1000 * seconds / steps for name, seconds in self.phase_seconds.items()}
        phases["callbacks"] = 1000 * self.step_seconds / steps - sum(phases.values())
        return phases

    def summary_rows(self) -> list[tuple[str, str]]:
        step_ms = 1000 * self.step_seconds / max(1, self.steps)
        phases = ", ".join(f"{name} {ms:.2f}" for name, ms in self.phase_ms().items())
        rows = [
            ("Training throughput", f"{self.views_per_second:.1f} views/s ({self.views_per_step} per step, "
                                    f"{step_ms:.2f} ms/step: {phases})"),
        ]  # fmt: skip
        if self.exchange_reduction is not None:
            per_step = self.exchange_sent_bytes / self.steps / 2**20
            dense = self.exchange_dense_bytes / self.steps / 2**20
            less = 100 * self.exchange_reduction
            rows.append(("Gradient exchange", f"{per_step:.2f} MiB/step per GPU vs {dense:.2f} MiB for a dense "
                                              f"all-reduce ({less:.1f}% less; {self.exchange_overflows} "
                                              f"overflows, {self.exchange_dense_steps} steps dense)"))  # fmt: skip
        return rows

    def write(self, path: Path, **extra: object) -> None:
        record = {name: value for name, value in asdict(self).items() if not name.startswith("_")}
        parts_ms = {part: 1000 * seconds / max(1, self.steps) for part, seconds in self.exchange_part_seconds.items()}
        record.update(views_per_second=self.views_per_second, exchange_reduction=self.exchange_reduction,
                      phase_ms=self.phase_ms(), exchange_parts_ms=parts_ms, **extra)  # fmt: skip
        path.write_text(json.dumps(record, indent=2) + "\n")
