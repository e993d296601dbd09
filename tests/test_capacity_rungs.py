"""Capacities on rungs (capacity_rungs.py) and the exchange's capacity kept through small drifts of its counts."""

from __future__ import annotations

from collections import deque

import pytest

from bytesplat_ns.capacity_rungs import RUNG_RATIO, RUNGS_PER_DOUBLING, rung_above
from bytesplat_ns.grad_compaction import CAPACITY_GRANULE, SparseRowExchange


@pytest.mark.parametrize("granule", [1, 1024, 1 << 14])
def test_rungs_hold_the_value_with_little_room_to_spare(granule):
    step = 2 ** (1 / RUNGS_PER_DOUBLING)
    rungs = set()
    for value in [1, granule, granule + 1, *range(granule, 300 * granule, max(1, granule // 3))]:
        rung = rung_above(value, granule)
        assert rung >= value and rung % granule == 0
        assert rung <= max(granule, value * step + granule), (value, rung)
        assert rung_above(rung, granule) == rung  # a rung is its own rung
        rungs.add(rung)
    assert len(rungs) < 60 + 12  # some 8 a doubling over 300 granules, granule multiples below 12 granules


def test_a_drifting_count_moves_the_rung_rarely():
    """Counts drifting by a few percent around 880,000 rows (a 2M-splat room's largest view, 2 GPUs) touch at most
    two rungs, where rounding to 1024 rows would have moved the capacity at almost every step."""
    values = [880_000 + (7919 * i) % 40_000 for i in range(200)]
    assert len({rung_above(v, CAPACITY_GRANULE) for v in values}) <= 2
    assert len({-(-v // CAPACITY_GRANULE) for v in values}) > 30


def test_the_exchange_keeps_its_capacity_through_small_drifts():
    """A new capacity has a rung of room above what the counts ask for; it stays while they ask for at most that
    and not less than keep_above of it, grows as soon as they ask for more and shrinks once they ask for clearly
    less."""
    exchange = SparseRowExchange()
    limit = 2_000_000
    first = exchange._next_capacity(deque([0.35]), limit, 0, reshaped=False)
    asked = 0.35 * exchange.headroom * limit
    assert asked * RUNG_RATIO <= first <= rung_above(int(asked * RUNG_RATIO * RUNG_RATIO), CAPACITY_GRANULE)
    for fraction in (0.35, 0.345, 0.33, 0.34, 0.32, 0.37):  # drifts, and growth within the rung of room
        assert exchange._next_capacity(deque([fraction]), limit, first, reshaped=False) == first
    grown = exchange._next_capacity(deque([0.45]), limit, first, reshaped=False)
    assert grown > first and grown >= 0.45 * exchange.headroom * limit
    assert exchange._next_capacity(deque([0.2]), limit, first, reshaped=False) < first
    assert exchange._next_capacity(deque(), limit, first, reshaped=False) == limit  # no counts read yet: every row
    assert exchange._next_capacity(deque([0.9]), limit, first, reshaped=False) == limit  # never past every row


def test_the_exchange_chooses_its_capacity_anew_when_the_gradients_change_shape():
    """The step graph records the exchange again when the splats' rows or the SH degree change: the capacity then
    moves to what the counts ask for now (a rung of room above it), though the one in use would still do."""
    exchange = SparseRowExchange()
    limit = 2_000_000
    first = exchange._next_capacity(deque([0.35]), limit, 0, reshaped=False)
    kept = exchange._next_capacity(deque([0.32]), limit, first, reshaped=False)
    anew = exchange._next_capacity(deque([0.32]), limit, first, reshaped=True)
    assert kept == first and anew < first
    assert anew == exchange._next_capacity(deque([0.32]), limit, 0, reshaped=False)
