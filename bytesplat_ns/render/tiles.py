"""Tile binning: which splats touch which tile (`tile_size` pixels a side), each tile's list in front-to-back
order."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TileBins:
    tile_splats: Tensor  # [T, K] splat index per slot, front to back; padded with N (one past the last splat)
    counts: Tensor  # [T] splats per tile
    tiles_x: int
    tiles_y: int

    @property
    def max_per_tile(self) -> int:
        return self.tile_splats.shape[1]


@torch.no_grad()
def bin_tiles(
    means2d: Tensor,  # [N, 2]
    radii: Tensor,  # [N] int, 0 = culled
    depths: Tensor,  # [N]
    tiles_x: int,
    tiles_y: int,
    tile_size: int,
) -> TileBins:
    """Assign every visible splat to each tile its screen-space square (centre +- radius) overlaps,
    like gsplat's `isect_tiles`, then order each tile's splats by depth (ties by index)."""
    n, device = means2d.shape[0], means2d.device
    r = radii.to(means2d.dtype)[:, None] / tile_size
    lo = torch.floor(means2d / tile_size - r).long()  # [N, 2]
    hi = torch.ceil(means2d / tile_size + r).long()
    limit = torch.tensor([tiles_x, tiles_y], device=device)
    lo = torch.minimum(lo.clamp_min(0), limit)
    hi = torch.minimum(hi.clamp_min(0), limit)
    span = hi - lo  # [N, 2]
    counts = span[:, 0] * span[:, 1] * (radii > 0)  # [N]

    splat_ids = torch.repeat_interleave(torch.arange(n, device=device), counts)  # [M]
    first = torch.cumsum(counts, 0) - counts
    local = torch.arange(splat_ids.shape[0], device=device) - first[splat_ids]
    width = span[splat_ids, 0]
    tile_ids = (lo[splat_ids, 1] + local // width) * tiles_x + lo[splat_ids, 0] + local % width  # [M]

    # Sort by (tile, depth): a stable depth sort, then a stable tile sort.
    order = torch.sort(depths[splat_ids], stable=True).indices
    order = order[torch.sort(tile_ids[order], stable=True).indices]
    tile_ids, splat_ids = tile_ids[order], splat_ids[order]

    num_tiles = tiles_x * tiles_y
    per_tile = torch.bincount(tile_ids, minlength=num_tiles)  # [T]
    width_k = int(per_tile.max()) if splat_ids.numel() else 0
    start = torch.cumsum(per_tile, 0) - per_tile
    slot = torch.arange(splat_ids.shape[0], device=device) - start[tile_ids]
    table = torch.full((num_tiles, width_k), n, dtype=torch.long, device=device)
    table[tile_ids, slot] = splat_ids
    return TileBins(tile_splats=table, counts=per_tile, tiles_x=tiles_x, tiles_y=tiles_y)
