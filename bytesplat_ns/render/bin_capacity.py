"""How many tile entries the fused renderer's tile binning allocates in training, chosen without a host sync.

gsplat's binning reads the number of (splat, tile) entries back to the host to size its buffers, which makes
the host wait for the GPU once per step. The fused backend bins into buffers of a capacity fixed beforehand
(cuda/csrc/bin_tiles.h) and the true count is read a step late (late_read.py):
- the capacity is `headroom` times the largest count of the last `window` renders, rounded up to `granule`;
- it is exact (one host read) for the first render, and whenever the splat count changed since the last
  render (densification ran: the counts seen before no longer bound the new ones);
- a render whose count exceeded its capacity loses the entries of its last splats (in index order) for that
  step; it is counted in `overflows` (shown in the run summary) and raises the next capacity. On lego (views
  alike) and on the 2M-splat room none was seen (benchmarks/RESULTS.md).
Outside training (eval, viewer, export) the renderer bins exactly.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from torch import Tensor

from bytesplat_ns.late_read import LateRead

EXACT = -1
"""Capacity that asks the binning for the exact count (one host read)."""


@dataclass
class BinCapacity:
    headroom: float = 1.5
    """Capacity = this times the largest entry count of the last `window` renders."""
    window: int = 100
    granule: int = 1 << 14
    """Capacities are multiples of this many entries (fewer distinct buffer sizes for the allocator)."""
    overflows: int = 0
    """Renders whose entries exceeded the capacity (known a step later)."""
    _counts: deque = field(default_factory=deque)
    _pending: tuple[LateRead, int] | None = None
    _splats: int = -1

    @property
    def used(self) -> bool:
        """Whether a binning has asked for a capacity (the fused renderer in training)."""
        return self._splats >= 0

    def next(self, num_splats: int) -> int:
        """The capacity of the next binning of `num_splats` splats, or EXACT."""
        self._read_pending()
        if num_splats != self._splats or not self._counts:
            self._splats = num_splats
            return EXACT
        rows = math.ceil(max(self._counts) * self.headroom)
        return max(self.granule, -(-rows // self.granule) * self.granule)

    def observe(self, total: Tensor, capacity: int) -> None:
        """Record a binning's true entry count (`total`, [1] on the device) and the capacity it had."""
        self._pending = (LateRead(total), capacity)

    def _read_pending(self) -> None:
        if self._pending is None:
            return
        late, capacity = self._pending
        self._pending = None
        (count,) = late.tolist()
        self.overflows += int(capacity != EXACT and count > capacity)
        self._counts.append(count)
        if len(self._counts) > self.window:
            self._counts.popleft()
