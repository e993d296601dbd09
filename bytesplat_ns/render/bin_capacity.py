"""How many tile entries the fused renderer's tile binning allocates in training, chosen without a host sync.

gsplat's binning reads the number of (splat, tile) entries back to the host to size its buffers, which makes
the host wait for the GPU once per step. The fused backend bins into buffers of a capacity fixed beforehand
(cuda/csrc/bin_tiles.h) and the true count is read `lag` renders later (late_read.py):
- the capacity is `headroom` times the larger of the largest count of the last `window` renders (on the tile
  side about to be binned) and the largest entries-per-splat of those renders times the splats now, rounded up
  to `granule` (so a refine that adds splats raises the capacity at once, and one that removes splats does not
  lower it);
- it is exact (one host read, its count known at once) for the first render, and whenever the splat count
  changed since the last render (densification ran);
- a render whose count exceeded its capacity loses the entries of its last splats (in index order) for that
  step; it is counted in `overflows` (shown in the run summary) and raises the capacity once read. On lego,
  7000 views, 0-4 renders per run overflowed (eighth session, benchmarks/RESULTS.md); none on the 2M-splat room.
- counts are kept with the tile side they were binned on (16 or 8 pixels, cuda/ops.py tile_size_for, which goes
  by the image size): the capacity comes from the counts of the side about to be binned; while the window holds
  none of that side yet, from the other side's counts bounded (`side_factor`): no host read, no overflow when the
  side changes at one image size (views of several sizes), and at a resolution change (splatfacto's schedule:
  8-pixel tiles at 100x100 become 16-pixel tiles at 200x200, the same tiles in the scene) the counts carry over
  as they do for a resolution change on one side (headroom, then the overflow rule).
Outside training (eval, viewer, export) the renderer bins exactly.
Each count read is also kept per training camera (`view`, set by the caller before a binning is observed) in
`entries_by_view`: what the datamanager's matched draws (datamanager.py) order each rank's cameras by.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from torch import Tensor

from bytesplat_ns.late_read import STEPS_LATE, LateQueue

EXACT = -1
"""Capacity that asks the binning for the exact count (one host read)."""


def side_factor(seen: int, side: int) -> int:
    """Bound on (entries on tiles of `side` pixels) / (entries on tiles of `seen` pixels), same splats and image.

    Sides are powers of two, so gsplat's tile range of a splat (floor and ceil of centre / side -+ radius / side:
    exact divisions) on tiles half as large lies within the halves of the larger tiles of its range, and meets each
    of those: per axis at least as many and at most twice as many tiles. Hence (seen / side)^2 going to a smaller
    side, 1 going to a larger one."""
    return (seen // side) ** 2 if side < seen else 1


@dataclass
class BinCapacity:
    headroom: float = 1.5
    """Capacity = this times the largest entry count of the last `window` renders (or their largest entries per
    splat times the splats now, when that is larger)."""
    window: int = 100
    granule: int = 1 << 14
    """Capacities are multiples of this many entries (fewer distinct buffer sizes for the allocator)."""
    overflows: int = 0
    """Renders whose entries exceeded the capacity (known when their counts are read)."""
    lag: int = STEPS_LATE
    """Renders between a binning and the host's read of its count."""
    view: int | None = None
    """The training camera whose binning is observed next (its index), or None."""
    entries_by_view: dict[int, int] = field(default_factory=dict)
    """Training camera index -> the entry count of its latest binning read."""
    _recent: dict[int, tuple[deque, deque]] = field(default_factory=dict)
    """Tile side -> (entry counts, entries per splat) of the last `window` renders read on it."""
    _late: LateQueue | None = None
    """The renders' counts, tagged with their capacities."""
    _splats: int = -1
    _tile_size: int = 0

    def __post_init__(self) -> None:
        self._late = LateQueue(self.lag)

    @property
    def used(self) -> bool:
        """Whether a binning has asked for a capacity (the fused renderer in training)."""
        return self._splats >= 0

    @property
    def tile_size(self) -> int:
        """The tile side of the last binning (0 before the first). The step graph's replays bin on it: they replay
        the resolution of the step before them (step_graph.py), and the side follows from the resolution."""
        return self._tile_size

    def needs_exact(self, num_splats: int) -> bool:
        """Whether the next binning of `num_splats` splats will be exact (`next` returns EXACT); changes nothing."""
        return num_splats != self._splats or not (self._recent or self._late.ready)

    def next(self, num_splats: int, tile_size: int) -> int:
        """The capacity of the next binning of `num_splats` splats on tiles of `tile_size` pixels, or EXACT."""
        exact = self.needs_exact(num_splats)
        self._read_pending()
        self._tile_size = tile_size
        if exact:
            self._splats = num_splats
            return EXACT
        if tile_size in self._recent:
            largest, per_splat = (max(values) for values in self._recent[tile_size])
        else:  # counts on the other tile side only, so far
            largest, per_splat = (
                max(max(values[i]) * side_factor(side, tile_size) for side, values in self._recent.items())
                for i in (0, 1)
            )
        rows = math.ceil(max(largest, per_splat * num_splats) * self.headroom)
        return max(self.granule, -(-rows // self.granule) * self.granule)

    def observe(self, total: Tensor, capacity: int) -> None:
        """Record a binning's true entry count (`total`, [1] on the device) and the capacity it had (the binning
        `next` was last asked for)."""
        if capacity == EXACT:  # the binning has just read it to the host: no wait, known before later renders
            self._add(int(total.item()), self._splats, self._tile_size, self.view)
        else:
            self._late.push(total, tag=(capacity, self._splats, self._tile_size, self.view))

    def _read_pending(self) -> None:
        for (count,), (capacity, splats, side, view) in self._late.pop_ready():
            self.overflows += int(count > capacity)
            self._add(count, splats, side, view)

    def _add(self, count: int, splats: int, side: int, view: int | None) -> None:
        if view is not None:
            self.entries_by_view[view] = count
        if side not in self._recent:
            self._recent[side] = deque(maxlen=self.window), deque(maxlen=self.window)
        entries, per_splat = self._recent[side]
        entries.append(count)  # C-level max over these each step: the host's step is short
        per_splat.append(count / max(1, splats))
