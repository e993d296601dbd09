"""Adam with torch's fused implementation, as a nerfstudio optimizer config.

nerfstudio's AdamOptimizerConfig builds torch.optim.Adam with its default (foreach) implementation: about ten
kernel launches and as many host operations per parameter group and step, for the six splat groups every step.
With `fused=True` torch updates a group in one kernel (plus one for the step counts, kept on the device), the
same Adam arithmetic in float32. The training step is bound by the host (benchmarks/RESULTS.md), so launches
saved are step time saved.
"""

from __future__ import annotations

from dataclasses import dataclass

from nerfstudio.engine.optimizers import AdamOptimizerConfig


@dataclass
class FusedAdamOptimizerConfig(AdamOptimizerConfig):
    """nerfstudio's Adam config, built with torch.optim.Adam(fused=...)."""

    fused: bool = True
    """One fused kernel per parameter group and step (CPU and CUDA); False: torch's foreach implementation."""
