"""The training binning's capacity rule (render/bin_capacity.py), on the CPU: exact at first and after the splat
count changes, then headroom x the largest recent count, overflows counted a render later."""

from __future__ import annotations

import math

import torch

from bytesplat_ns.render.bin_capacity import EXACT, BinCapacity


def _render(bins: BinCapacity, splats: int, entries: int) -> int:
    capacity = bins.next(splats)
    bins.observe(torch.tensor([entries]), capacity)
    return capacity


def test_exact_first_then_from_recent_counts():
    bins = BinCapacity(headroom=1.5, granule=1000)
    assert not bins.used
    assert _render(bins, 100, 40_000) == EXACT
    assert bins.used
    assert _render(bins, 100, 50_000) == 60_000  # 1.5 x 40,000
    assert _render(bins, 100, 30_000) == math.ceil(1.5 * 50_000 / 1000) * 1000  # the largest of the window
    assert bins.overflows == 0


def test_a_new_splat_count_asks_for_the_exact_count():
    bins = BinCapacity(granule=1)
    _render(bins, 100, 1000)
    assert _render(bins, 100, 1000) != EXACT
    assert _render(bins, 120, 1500) == EXACT  # densification ran: earlier counts bound nothing
    assert _render(bins, 120, 1500) == 2250


def test_overflows_are_counted_and_raise_the_capacity():
    bins = BinCapacity(headroom=1.0, granule=1, window=2)
    _render(bins, 10, 100)
    assert _render(bins, 10, 300) == 100  # this render needs 300 entries: an overflow
    assert bins.next(10) == 300 and bins.overflows == 1
    bins = BinCapacity(headroom=1.0, granule=1, window=2)
    for entries in (500, 100, 100):
        _render(bins, 10, entries)
    assert bins.next(10) == 100  # the 500 has left the window of 2
