"""The initial splat sizes: each point's mean distance to its 3 nearest neighbours, as splatfacto computes them
(sklearn, one thread), from scipy's KD-tree on every core (model.neighbour_distances)."""

from __future__ import annotations

import pytest
import torch
from nerfstudio.models.splatfacto import SplatfactoModel

from bytesplat_ns.model import neighbour_distances


def test_neighbour_distances_equal_splatfactos():
    gen = torch.Generator().manual_seed(0)
    points = torch.randn(20_000, 3, generator=gen)
    points[100:110] = points[0]  # duplicates: distance 0 to each other
    ours = neighbour_distances(points, 3)
    theirs, _ = SplatfactoModel.k_nearest_sklearn(None, points, 3)
    assert ours.dtype == torch.float32 and ours.shape == (20_000, 3)
    assert torch.equal(ours, torch.from_numpy(theirs))


def test_too_few_points_name_the_fix():
    with pytest.raises(ValueError, match="random-init True"):
        neighbour_distances(torch.zeros(3, 3), 3)
