"""Data passed into and out of `rasterize()`: splats, one camera, options, outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from bytesplat_ns.render.bin_capacity import BinCapacity

Backend = Literal["auto", "torch", "gsplat", "fused"]
"""Renderer backends. `auto` picks the fastest one available for the tensors' device: fused on CUDA, else torch."""


@dataclass
class Splats:
    """Activated splat attributes, as the rasterizer consumes them."""

    means: Tensor  # [N, 3] world-space centres
    quats: Tensor  # [N, 4] rotations (w, x, y, z); normalised inside the renderer
    scales: Tensor  # [N, 3] standard deviations along the rotated axes (already exp()'d)
    opacities: Tensor  # [N] in [0, 1] (already sigmoid()'d)
    colors: Tensor  # [N, 3] RGB without RasterizeOptions.sh_degree; with it [N, K, 3] SH coefficients, or only
    # the first of them [N, 3] when sh_rest holds the others
    sh_rest: Tensor | None = None  # [N, K - 1, 3] SH coefficients past the first, kept apart from colors (the model's
    # features_dc and features_rest as they are: the fused renderer reads both in place, nothing joins them)

    @property
    def count(self) -> int:
        return self.means.shape[0]

    def sh_coefficients(self) -> Tensor:
        """[N, K, 3] every SH coefficient (joined here when they come in two parts)."""
        return self.colors if self.sh_rest is None else torch.cat([self.colors[:, None, :], self.sh_rest], dim=1)

    def sh_parts(self) -> tuple[Tensor, Tensor]:
        """(the first SH coefficient [N, 3], the others [N, K - 1, 3])."""
        return (self.colors[:, 0], self.colors[:, 1:]) if self.sh_rest is None else (self.colors, self.sh_rest)


@dataclass
class RasterCamera:
    """One pinhole camera in OpenCV axes (x right, y down, z forward), as gsplat uses them."""

    viewmat: Tensor  # [4, 4] world-to-camera, rigid
    K: Tensor  # [3, 3] intrinsics in pixels
    width: int
    height: int

    @property
    def position(self) -> Tensor:
        """[3] the camera centre in world space: -R^T t (the viewmat is rigid; no matrix inverse, which would
        make the host wait for the GPU to check for a singular matrix)."""
        return -self.viewmat[:3, :3].T @ self.viewmat[:3, 3]


@dataclass
class RasterizeOptions:
    """How to render. Defaults follow splatfacto's call of gsplat's `rasterization()`."""

    sh_degree: int | None = 3
    """SH degree to evaluate (may be below the coefficients' degree); None: `colors` are RGB already."""
    background: Tensor | None = None  # [3]
    """Colour behind the splats; None leaves the image premultiplied (black)."""
    render_depth: bool = False
    """Also render expected depth (gsplat's "RGB+ED")."""
    absgrad: bool = True
    """After backward, `means2d.absgrad` holds the per-pixel absolute 2D-mean gradients, summed."""
    near_plane: float = 0.01
    far_plane: float = 1e10
    eps2d: float = 0.3
    """Screen-space blur added to each 2D covariance's diagonal, in pixels squared."""
    tile_size: int = 16
    """Tile side in pixels of the torch and gsplat backends. The fused backend picks its own, 16 or 8 by the image
    size (cuda/ops.py, tile_size_for), and does not read this."""
    backend: Backend = "auto"
    prune_on_chip: bool = True
    """fused backend: a tile with more splats than fit on-chip keeps those that contribute most there."""
    bins: BinCapacity | None = None
    """fused backend: sizes the tile binning's buffers without a host sync (the model keeps one for training);
    None: exact binning, one host read (render/bin_capacity.py)."""


@dataclass
class ScreenSplats:
    """The splats as one camera sees them (render/screen_space.py): what the compositing reads, and where its
    gradients arrive. The screen exchange (screen_exchange.py) sends the gradients of `differentiable()`."""

    means2d: Tensor  # [1, N, 2] projected centres in pixels
    conics: Tensor  # [1, N, 3] (fused) or [N, 3] (torch) inverse 2D covariances (a, b, c) of [[a, b], [b, c]]
    colors: Tensor  # [N, 3] RGB seen from the camera (SH evaluated), or the RGB colours without SH
    opacities: Tensor  # [N] in [0, 1]
    depths: Tensor  # [N] camera-space z
    radii: Tensor  # [1, N] int32 screen radius in pixels, 0 for culled splats

    def differentiable(self) -> list[Tensor]:
        """The tensors the compositing's gradients reach (2 + 3 + 3 + 1 values a splat)."""
        return [self.means2d, self.conics, self.colors, self.opacities]

    def detached(self) -> ScreenSplats:
        """The same values without their autograd graph, the differentiable tensors carrying their .grad."""
        held = ScreenSplats(*(t.detach() for t in (*self.differentiable(), self.depths, self.radii)))
        for mine, theirs in zip(held.differentiable(), self.differentiable()):
            mine.grad = theirs.grad
        return held


@dataclass
class RenderOutputs:
    """What a backend returns for one camera."""

    rgb: Tensor  # [H, W, 3] colour composited over the background (not clamped)
    alpha: Tensor  # [H, W, 1] accumulated opacity, 1 - final transmittance
    depth: Tensor | None  # [H, W, 1] expected depth, or None
    means2d: Tensor  # [1, N, 2] projected centres in pixels; densification reads .grad / .absgrad
    radii: Tensor  # [1, N] int32 screen radius in pixels, 0 for culled splats
    width: int
    height: int
    backend: str = field(default="torch")
    pruned: Tensor | None = None  # [1] int32 tile entries dropped by on-chip pruning (fused backend), on the device
    screen: ScreenSplats | None = None  # the splats in screen space the compositing read (torch and fused backends)

    def strategy_info(self) -> dict[str, object]:
        return strategy_info(self.means2d, self.radii, self.width, self.height)


def strategy_info(means2d: Tensor, radii: Tensor, width: int, height: int) -> dict[str, object]:
    """The `info` dict that gsplat's DefaultStrategy reads (unpacked, one camera).

    means2d: [1, N, 2]; radii: [1, N]."""
    return {"means2d": means2d, "radii": radii, "width": width, "height": height, "n_cameras": 1, "gaussian_ids": None}
