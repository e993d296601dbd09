"""Pure-PyTorch reference renderer: the oracle every kernel is tested against.

Whole path: world-to-camera, EWA projection with gsplat's eps2d blur, SH to colour, tile binning in
depth order, then front-to-back compositing per tile (opts.tile_size pixels a side, 16 by default) with gsplat's
cut-offs: a splat counts for a pixel when alpha >= 1/255 (alpha clamped to 0.999), and a pixel stops before the
splat that would bring its transmittance to 1e-4 or below. Differentiable by autograd; runs anywhere PyTorch
runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from bytesplat_ns.render.projection import tile_grid
from bytesplat_ns.render.screen_space import screen_space
from bytesplat_ns.render.tiles import TileBins, bin_tiles
from bytesplat_ns.render.types import RasterCamera, RasterizeOptions, RenderOutputs, Splats

ALPHA_MIN = 1.0 / 255.0
ALPHA_MAX = 0.999
TRANSMITTANCE_MIN = 1e-4
PAIRS_PER_CHUNK = 1 << 22
"""Bounds memory: (pixel, splat) pairs composited at once."""


def rasterize_torch(splats: Splats, camera: RasterCamera, opts: RasterizeOptions) -> RenderOutputs:
    screen = screen_space(splats, camera, opts, "torch")
    means2d = screen.means2d  # [1, N, 2]; densification reads its gradient
    features = [screen.colors]
    if opts.render_depth:
        features.append(screen.depths[:, None])
    features = torch.cat(features, dim=-1)  # [N, D]

    tiles_x, tiles_y = tile_grid(camera, opts.tile_size)
    radii = screen.radii[0]
    bins = bin_tiles(means2d[0].detach(), radii, screen.depths.detach(), tiles_x, tiles_y, opts.tile_size)
    absgrad = None
    if opts.absgrad and means2d.requires_grad:
        absgrad = means2d.new_zeros(splats.count + 1, 2)
        means2d.absgrad = absgrad[:-1][None]  # filled during backward, as gsplat does
    image, alpha = composite(means2d[0], screen.conics, screen.opacities, features, bins, camera, opts.tile_size,
                             absgrad)  # fmt: skip

    depth = None
    if opts.render_depth:
        depth = image[..., 3:4] / alpha.clamp_min(1e-10)
    rgb = image[..., :3]
    if opts.background is not None:
        rgb = rgb + (1.0 - alpha) * opts.background
    return RenderOutputs(
        rgb=rgb, alpha=alpha, depth=depth, means2d=means2d, radii=screen.radii,
        width=camera.width, height=camera.height, backend="torch", screen=screen,
    )  # fmt: skip


def composite(
    means2d: Tensor,  # [N, 2]
    conics: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    features: Tensor,  # [N, D]
    bins: TileBins,
    camera: RasterCamera,
    tile_size: int,
    absgrad: Tensor | None,  # [N + 1, 2] accumulator, or None
) -> tuple[Tensor, Tensor]:
    """Front-to-back alpha compositing per tile. Returns image [H, W, D] and alpha [H, W, 1]."""
    pad = lambda t: torch.cat([t, t.new_zeros(1, *t.shape[1:])])  # noqa: E731  row N: a splat of opacity 0
    means_p, conics_p, opac_p, feat_p = pad(means2d), pad(conics), pad(opacities), pad(features)

    num_tiles = bins.tile_splats.shape[0]
    side = torch.arange(tile_size, device=means2d.device, dtype=means2d.dtype)
    py, px = torch.meshgrid(side, side, indexing="ij")
    offsets = torch.stack([px.reshape(-1), py.reshape(-1)], dim=-1) + 0.5  # [P, 2] pixel centres in a tile
    tile_ids = torch.arange(num_tiles, device=means2d.device)
    origins = torch.stack([tile_ids % bins.tiles_x, tile_ids // bins.tiles_x], dim=-1).to(means2d.dtype) * tile_size

    colors, alphas = [], []
    by_count = torch.argsort(bins.counts)  # similar-length tiles together: little padding per chunk
    for tiles in _chunks(by_count, bins.counts, offsets.shape[0]):
        k = int(bins.counts[tiles[-1]])
        ids = bins.tile_splats[tiles, :k]  # [C, K]
        pixels = origins[tiles, None, :] + offsets  # [C, P, 2]
        mean = means_p[ids]  # [C, K, 2]
        dx = mean[:, None, :, 0] - pixels[:, :, None, 0]  # [C, P, K] per-pixel offsets: their gradients are
        dy = mean[:, None, :, 1] - pixels[:, :, None, 1]  # the per-pixel 2D-mean gradients (absgrad sums |.|)
        if absgrad is not None and dx.requires_grad:
            dx.register_hook(_absgrad_hook(absgrad, ids, 0))
            dy.register_hook(_absgrad_hook(absgrad, ids, 1))
        con = conics_p[ids][:, None]  # [C, 1, K, 3]
        sigma = 0.5 * (con[..., 0] * dx * dx + con[..., 2] * dy * dy) + con[..., 1] * dx * dy  # [C, P, K]
        alpha = torch.clamp_max(opac_p[ids][:, None] * torch.exp(-sigma), ALPHA_MAX)
        alpha = alpha * ((sigma >= 0) & (alpha >= ALPHA_MIN))
        transmit = torch.cumprod(1.0 - alpha, dim=-1)  # [C, P, K] transmittance after each splat
        # A pixel stops before the splat that would take it to TRANSMITTANCE_MIN; transmittance only falls,
        # so the splats kept form a prefix of the depth-ordered list.
        alpha = alpha * (transmit > TRANSMITTANCE_MIN)
        before = torch.cat([torch.ones_like(transmit[..., :1]), transmit[..., :-1]], dim=-1)
        weights = alpha * before  # [C, P, K]
        colors.append(torch.einsum("cpk,ckd->cpd", weights, feat_p[ids]))
        alphas.append(weights.sum(dim=-1, keepdim=True))
    inverse = torch.argsort(by_count)
    image = _untile(torch.cat(colors)[inverse], bins, tile_size, camera)
    alpha_img = _untile(torch.cat(alphas)[inverse], bins, tile_size, camera)
    return image, alpha_img


def _chunks(by_count: Tensor, counts: Tensor, pixels_per_tile: int):
    """Split tiles (sorted by splat count) into runs of about PAIRS_PER_CHUNK (pixel, splat) pairs or fewer;
    each run is padded to the count of its last (largest) tile."""
    sorted_counts = counts[by_count].tolist()
    start = 0
    for end in range(1, len(sorted_counts) + 1):
        if end == len(sorted_counts) or (end + 1 - start) * pixels_per_tile * sorted_counts[end] > PAIRS_PER_CHUNK:
            yield by_count[start:end]
            start = end


def _absgrad_hook(absgrad: Tensor, ids: Tensor, axis: int):
    """Sums |d loss / d mean2d[axis]| over pixels into absgrad, as gsplat's backward does with absgrad=True."""

    def hook(grad: Tensor) -> None:  # grad: [C, P, K]
        absgrad[:, axis].index_add_(0, ids.reshape(-1), grad.abs().sum(dim=1).reshape(-1))

    return hook


def _untile(per_tile: Tensor, bins: TileBins, tile_size: int, camera: RasterCamera) -> Tensor:
    """[T, P, D] per-tile pixels -> [H, W, D] image, cropped to the camera's size."""
    d = per_tile.shape[-1]
    grid = per_tile.reshape(bins.tiles_y, bins.tiles_x, tile_size, tile_size, d)
    grid = grid.permute(0, 2, 1, 3, 4).reshape(bins.tiles_y * tile_size, bins.tiles_x * tile_size, d)
    return grid[: camera.height, : camera.width]
