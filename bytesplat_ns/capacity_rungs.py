"""Buffer capacities on a ladder of rungs, so that a recorded step graph outlives small changes of what it needs.

The step graph (step_graph.py) bakes in the binning's entry capacity and the gradient exchange's row capacities,
and is recorded again when one changes; a recording costs some 7 ms of host time, a replayed lego step 0.5 ms.
Both capacities follow counts that drift a little from view to view (a view's tile entries, the rows it touched,
as training goes on): rounded up to a fine granule only, they changed every few steps (2M-splat room, 2 GPUs: 101
recordings in 1000 steps; lego as rank 0 of two, benchmarks/lone_rank.py: 112 in 3500 steps, 96 on rungs, and its
host-bound steps 1.44 -> 1.16 ms; benchmarks/RESULTS.md, thirty-ninth session). On rungs RUNGS_PER_DOUBLING to a
doubling (each about 9% above the one below), a capacity moves only when what it must hold crosses a rung, at a cost
of at most one rung of unused room.
"""

from __future__ import annotations

import math

RUNGS_PER_DOUBLING = 8
"""Rungs per doubling of a capacity: 2^(1/8), about 9% apart."""
RUNG_RATIO = 2 ** (1 / RUNGS_PER_DOUBLING)
"""One rung over the one below it (before rounding to the granule)."""


def rung_above(value: int, granule: int) -> int:
    """The smallest rung >= `value`: rung k is granule x 2^(k / RUNGS_PER_DOUBLING) rounded up to a multiple of
    `granule`, k = 0, 1, ... (so at least `granule`, and a rung is its own rung)."""
    if value <= granule:
        return granule
    k = max(0, math.floor(RUNGS_PER_DOUBLING * (math.log2(value / granule) - 1)))  # a doubling low: rounding up
    while True:  # lifts rungs, so a lower k than the logarithm's may already reach `value`
        rung = -(-math.ceil(granule * 2 ** (k / RUNGS_PER_DOUBLING)) // granule) * granule
        if rung >= value:
            return rung
        k += 1
