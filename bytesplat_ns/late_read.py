"""Reading small device values on the host some steps late, so that the host does not wait for the GPU.

The exchange's row counts and notes (grad_compaction.py), the tile binning's entry counts
(render/bin_capacity.py) and the logged loss and metrics (train_log.py) are needed on the host only to size
later buffers, to agree on pause/stop and to log: they are copied to pinned host memory as soon as they are
computed and read `lag` pushes later, when the copy has long finished. The lag is the slack the host has: it
waits only when it runs more than `lag` steps ahead of the GPU (with several GPUs, a GPU also waits for the
other ranks in each exchange, so the slack absorbs one rank's slower steps before the others wait for it).
"""

from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

STEPS_LATE = 4
"""How many steps late the training step's small values are read by default: the host's slack."""


class LateQueue:
    """Small device tensors copied to the host when pushed, and read late: `pop_ready()`, called before each
    push, returns what was pushed `lag` pushes back (and anything older), oldest first."""

    def __init__(self, lag: int = 1) -> None:
        if lag < 1:
            raise ValueError(f"LateQueue needs a lag of 1 or more pushes, got {lag}.")
        self.lag = lag
        self._pending: deque[tuple[Tensor, torch.cuda.Event | None, object]] = deque()
        self._spare: list[tuple[Tensor, torch.cuda.Event]] = []  # pinned buffers and events already read

    def push(self, values: Tensor, tag: object = None) -> None:
        """Start copying `values` to the host; `tag` comes back with them."""
        if not values.is_cuda:
            self._pending.append((values.clone(), None, tag))
            return
        host, ready = self._spare_for(values)
        host.copy_(values, non_blocking=True)
        ready.record()
        self._pending.append((host, ready, tag))

    @property
    def ready(self) -> bool:
        """Whether `pop_ready()` would return something."""
        return len(self._pending) >= self.lag

    def pop_ready(self) -> list[tuple[list, object]]:
        """The values pushed `lag` or more pushes back (as lists) with their tags, oldest first. Their copies have
        finished unless the host ran `lag` steps ahead of the GPU: then this waits for them."""
        ready = []
        while len(self._pending) >= self.lag:
            host, event, tag = self._pending.popleft()
            if event is not None:
                event.synchronize()
            ready.append((host.tolist(), tag))
            if event is not None and len(self._spare) <= self.lag:
                self._spare.append((host, event))
        return ready

    def _spare_for(self, values: Tensor) -> tuple[Tensor, torch.cuda.Event]:
        """A pinned host buffer of `values`' shape and an event, reused once read (no allocation per push)."""
        for index, (host, _) in enumerate(self._spare):
            if host.shape == values.shape and host.dtype == values.dtype:
                return self._spare.pop(index)
        return torch.empty(values.shape, dtype=values.dtype, pin_memory=True), torch.cuda.Event()
