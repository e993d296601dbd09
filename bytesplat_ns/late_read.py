"""Reading small device values on the host a step late, so that the host never waits for the GPU.

The exchange's row counts and notes (grad_compaction.py) and the tile binning's entry counts
(render/bin_capacity.py) are needed on the host only to size later buffers: they are copied to pinned host
memory as soon as they are computed and read one step later, when the copy has long finished.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LateRead:
    """A small device tensor's values, copied to the host now and read later without making the host wait."""

    def __init__(self, values: Tensor) -> None:
        self._ready: torch.cuda.Event | None = None
        if values.is_cuda:
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = values.clone()

    def tolist(self) -> list:
        if self._ready is not None:
            self._ready.synchronize()  # long done by the time this is called: no wait
        return self._host.tolist()
