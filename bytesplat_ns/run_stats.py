"""What a training run measured about itself: training throughput and gradient-exchange bytes.

Rank 0 shows them in the closing summary and writes them to `<run folder>/bytesplat_stats.json`, which the
benchmarks read. Step times are host wall times around each training step (evaluations and checkpoints
excluded); every step ends in a host sync on the GPU (the exchange's, or the model's), so they add up to
the GPU's time too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from bytesplat_ns.grad_compaction import ExchangeStats


@dataclass
class RunStats:
    views_per_step: int = 1
    steps: int = 0
    step_seconds: float = 0.0
    """Sum of the training steps' wall times."""
    exchange_sent_bytes: int = 0
    """Sum over steps of the bytes each rank sent in the compacted exchange."""
    exchange_dense_bytes: int = 0
    """Sum over steps of what a dense ring all-reduce of the same gradients would have sent per rank."""
    exchange_seconds: float = 0.0
    """Sum of the host wall time spent in the gradient exchange (its host syncs included)."""

    def add_step(self, seconds: float, exchange: ExchangeStats | None, exchange_seconds: float = 0.0) -> None:
        self.steps += 1
        self.step_seconds += seconds
        self.exchange_seconds += exchange_seconds
        if exchange is not None:
            self.exchange_sent_bytes += exchange.sent_bytes
            self.exchange_dense_bytes += exchange.dense_bytes

    @property
    def views_per_second(self) -> float:
        return self.steps * self.views_per_step / self.step_seconds if self.step_seconds else 0.0

    @property
    def exchange_reduction(self) -> float | None:
        """1 - compacted / dense bytes (None without an exchange)."""
        return 1 - self.exchange_sent_bytes / self.exchange_dense_bytes if self.exchange_dense_bytes else None

    def summary_rows(self) -> list[tuple[str, str]]:
        rows = [
            ("Training throughput", f"{self.views_per_second:.1f} views/s ({self.views_per_step} per step, "
                                    f"{1000 * self.step_seconds / max(1, self.steps):.2f} ms/step)"),
        ]  # fmt: skip
        if self.exchange_reduction is not None:
            per_step = self.exchange_sent_bytes / self.steps / 2**20
            dense = self.exchange_dense_bytes / self.steps / 2**20
            ms = 1000 * self.exchange_seconds / self.steps
            less = 100 * self.exchange_reduction
            rows.append(("Gradient exchange", f"{per_step:.2f} MiB/step per GPU vs {dense:.2f} MiB for a dense "
                                              f"all-reduce ({less:.1f}% less), {ms:.2f} ms/step"))  # fmt: skip
        return rows

    def write(self, path: Path, **extra: object) -> None:
        record = {**asdict(self), "views_per_second": self.views_per_second,
                  "exchange_reduction": self.exchange_reduction, **extra}  # fmt: skip
        path.write_text(json.dumps(record, indent=2) + "\n")
