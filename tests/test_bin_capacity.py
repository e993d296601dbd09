"""The training binning's capacity rule (render/bin_capacity.py), on the CPU: exact at first and after the splat
count changes, then headroom x the largest count in the window (or its largest entries per splat x the splats
now), counts read `lag` renders later (exact counts at once), overflows counted when read; counts kept per tile
side, the other side's bounded while a side has none."""

from __future__ import annotations

import math

import torch

from bytesplat_ns.render.bin_capacity import EXACT, BinCapacity, side_factor


def _render(bins: BinCapacity, splats: int, entries: int, tile_size: int = 16) -> int:
    capacity = bins.next(splats, tile_size)
    bins.observe(torch.tensor([entries]), capacity)
    return capacity


def test_exact_first_then_from_recent_counts():
    bins = BinCapacity(headroom=1.5, granule=1000, lag=1)
    assert not bins.used
    assert _render(bins, 100, 40_000) == EXACT
    assert bins.used
    assert _render(bins, 100, 50_000) == 60_000  # 1.5 x 40,000
    assert _render(bins, 100, 30_000) == math.ceil(1.5 * 50_000 / 1000) * 1000  # the largest of the window
    assert bins.overflows == 0


def test_a_new_splat_count_asks_for_the_exact_count():
    bins = BinCapacity(granule=1, lag=1)
    _render(bins, 100, 1000)
    assert _render(bins, 100, 1000) != EXACT
    assert _render(bins, 120, 1500) == EXACT  # densification ran: earlier counts bound nothing
    assert _render(bins, 120, 1500) == 2250


def test_overflows_are_counted_and_raise_the_capacity():
    bins = BinCapacity(headroom=1.0, granule=1, window=2, lag=1)
    _render(bins, 10, 100)
    assert _render(bins, 10, 300) == 100  # this render needs 300 entries: an overflow
    assert bins.next(10, 16) == 300 and bins.overflows == 1
    bins = BinCapacity(headroom=1.0, granule=1, window=2, lag=1)
    for entries in (500, 100, 100):
        _render(bins, 10, entries)
    assert bins.next(10, 16) == 100  # the 500 has left the window of 2


def test_counts_are_read_lag_renders_later_and_exact_counts_at_once():
    bins = BinCapacity(headroom=1.0, granule=1, lag=3)
    assert _render(bins, 10, 100) == EXACT
    assert _render(bins, 10, 500) == 100  # the exact count is known at once; 500 (an overflow) is read 3 later
    assert _render(bins, 10, 100) == 100
    assert _render(bins, 10, 100) == 100
    assert bins.overflows == 0
    assert _render(bins, 10, 100) == 500 and bins.overflows == 1
    assert _render(bins, 20, 300) == EXACT  # densification ran
    assert _render(bins, 20, 300) == 1000  # 50 entries per splat (the 500) x 20 splats, without waiting 3 renders


def test_more_splats_raise_the_capacity_at_once_fewer_do_not_lower_it():
    bins = BinCapacity(headroom=1.0, granule=1, lag=1)
    _render(bins, 100, 1000)
    _render(bins, 100, 1000)
    _render(bins, 150, 1400)  # a refine added half the splats: exact
    assert bins.next(150, 16) == 1500  # 10 entries per splat x 150, above the 1400 seen
    bins = BinCapacity(headroom=1.0, granule=1, lag=1)
    _render(bins, 100, 1000)
    _render(bins, 50, 400)  # a refine removed half the splats: exact
    assert bins.next(50, 16) == 1000  # the largest count seen still bounds it


def test_the_side_factor_bounds_the_entries_of_another_tile_side():
    assert side_factor(16, 8) == 4 and side_factor(8, 16) == 1 and side_factor(16, 16) == side_factor(8, 8) == 1


def test_counts_are_kept_per_tile_side_and_the_other_side_bounds_a_new_one():
    bins = BinCapacity(headroom=1.0, granule=1, lag=1)
    assert _render(bins, 100, 1000, tile_size=16) == EXACT
    assert bins.tile_size == 16
    assert _render(bins, 100, 2500, tile_size=8) == 4000  # no count on 8-pixel tiles yet: 4 x the 16-pixel count
    assert bins.tile_size == 8
    assert _render(bins, 100, 2500, tile_size=8) == 2500  # its own count, read a render later
    assert _render(bins, 100, 1000, tile_size=16) == 1000  # the 16-pixel counts alone, not the larger 8-pixel ones
    assert bins.overflows == 0
    bins = BinCapacity(headroom=1.0, granule=1, lag=1)
    _render(bins, 100, 2500, tile_size=8)
    assert _render(bins, 100, 1000, tile_size=16) == 2500  # larger tiles make no more entries: unscaled
    assert bins.next(100, 16) == 1000


def test_counts_are_kept_per_training_view_when_read():
    """Each count read is kept for the camera named in `view` when its binning was observed (exact counts at once,
    the others `lag` renders later); renders of no named camera are not kept (datamanager.py's matched draws)."""
    bins = BinCapacity(granule=1, lag=2)
    for view, entries in [(3, 100), (5, 300), (3, 120), (None, 999), (7, 50)]:
        bins.view = view
        _render(bins, 10, entries)
    assert bins.entries_by_view == {3: 120, 5: 300}  # the exact first count, then those read 2 renders late
    bins.next(10, 16)  # reads the count due: the unnamed render's
    assert bins.entries_by_view == {3: 120, 5: 300}
    _render(bins, 10, 10)
    bins.next(10, 16)
    assert bins.entries_by_view == {3: 120, 5: 300, 7: 50}
