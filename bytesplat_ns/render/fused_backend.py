"""The `fused` renderer backend: gsplat 1.4.0's projection, then our own kernels (bytesplat_ns/cuda/csrc) for SH
colours (csrc/sh.h: render/sh.py's reference in one launch each way, which a CUDA graph records), tile binning
(gsplat's entries and order, without its host sync: csrc/bin_tiles.h, render/bin_capacity.py), compositing and
its backward pass.

Two ways in:
  * `rasterize_fused(splats, camera, opts)`: the `rasterize()` interface, under ordinary autograd. Forward is a
    batched per-tile compositing kernel, which keeps the state a backward resumes from when a gradient is wanted;
    backward is the fused kernel fed with dL/d rgb from torch, resuming from that state (no second compositing):
    it reduces the per-splat gradients on-chip, one atomicAdd per splat, tile and quantity.
  * `fused_loss_step(splats, camera, opts, gt, loss)`: the fused loss path for training (a later change in
    model.py calls it). The loss is splatfacto's by default, 0.8 L1 + 0.2 (1 - SSIM), on the clamped image with
    the background composited.
      - L1 and L2 terms: formed per pixel inside the fused kernel from the ground-truth tile; for these no
        rendered image, transmittance or last-index buffer goes through device memory (one launch).
      - D-SSIM term: its 11x11 window crosses tile borders, so it is handled in two passes ("a fused
        SSIM-gradient pass feeding the backward"): the forward kernel renders the image (one image write) and
        keeps what the backward resumes from (each pixel's final transmittance and last splat, each warp's bits
        of which splats it composited: ops.ForwardState), SSIM and its gradient w.r.t. the clamped image come from
        `FusedLoss.ssim_fn` (in training the model's SSIM term, bytesplat_ns/ssim.py: two kernel launches on CUDA;
        pytorch_msssim by default), and that gradient enters the fused kernel as v_extra [H, W, 3], added on-chip
        to the L1 gradient; the kernel then runs the backward pass alone, from the kept state. So with SSIM the
        step reads the splats twice, as gsplat's two kernels do, and costs one image round trip, the kept state
        and the SSIM pass, but composites once; benchmarks/fused_kernel.py measures it ("fused_ssim" against
        "fused_l1").
    It returns the loss as a tensor whose backward hands out the gradients already computed (scaled), so
    `loss.backward()` in the trainer reaches the splat parameters through gsplat's projection and our SH.

Tiles: 16x16 pixels, or 8x8 when the image has fewer 16-pixel tiles than two waves of blocks (`ops.tile_size_for`:
then more, shorter tile lists keep every SM busy). The side depends on the image size only; RasterizeOptions.tile_size
(gsplat's and the torch reference's tile side) is not read here.

Shared-memory-aware pruning (RasterizeOptions.prune_on_chip): the fused kernel holds up to `tile_capacity`
splats per tile on-chip (per tile side), from the device's shared memory per block read at run time
(cuda/ops.py). A tile with more entries keeps the `capacity` that contribute most there, by opacity x peak
falloff inside the tile x footprint area (capped at the tile's area), in depth order (csrc/prune_tiles.h). The
count of dropped entries comes back as a device tensor (RenderOutputs.pruned), read by no one here: no host
sync. With pruning off, long tiles are composited in chunks and reloaded for the backward pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from bytesplat_ns.cuda import ops
from bytesplat_ns.render.bin_capacity import EXACT
from bytesplat_ns.render.screen_space import screen_space
from bytesplat_ns.render.types import (
    RasterCamera,
    RasterizeOptions,
    RenderOutputs,
    ScreenSplats,
    Splats,
    strategy_info,
)
from bytesplat_ns.ssim import SSIMTerm


@dataclass
class FusedLoss:
    """Weights of the training loss: l1 * L1 + l2 * MSE + ssim * (1 - SSIM), as splatfacto's with l2 = 0."""

    l1: float = 0.8
    l2: float = 0.0
    ssim: float = 0.2
    clamp: bool = True
    """Clamp the prediction to [0, 1] before the loss, as the model does."""
    ssim_fn: Callable[[Tensor, Tensor], Tensor] | None = field(default=None, repr=False)
    """SSIM of (gt, pred) as [H, W, 3] images; None: pytorch_msssim's, as splatfacto (data_range 1)."""


@dataclass
class FusedLossOutputs:
    loss: Tensor  # [] differentiable: backward hands out the fused kernel's gradients
    rgb: Tensor | None  # [H, W, 3] the clamped prediction (detached), when rendered (the SSIM pass or want_image)
    alpha: Tensor | None  # [H, W, 1]
    means2d: Tensor  # [1, N, 2] .grad / .absgrad after backward, for densification
    radii: Tensor  # [1, N] int32
    pruned: Tensor  # [1] int32 tile entries dropped by on-chip pruning
    width: int
    height: int
    screen: ScreenSplats  # the splats in screen space the kernels read

    def strategy_info(self) -> dict[str, object]:
        return strategy_info(self.means2d, self.radii, self.width, self.height)


@dataclass
class Prepared:
    """One camera's splats after gsplat's projection, our SH and binning (and our pruning)."""

    means2d: Tensor  # [1, N, 2]
    conics: Tensor  # [1, N, 3]
    colors: Tensor  # [1, N, D]
    opacities: Tensor  # [1, N]
    radii: Tensor  # [1, N] int32
    tiles: ops.TileLists
    capacity: int
    screen: ScreenSplats


def prepare(splats: Splats, camera: RasterCamera, opts: RasterizeOptions, with_depth: bool) -> Prepared:
    """Projection through gsplat's kernel, called as gsplat's `rasterization()` calls it; SH colours through ours
    (`ops.sh_colors`: gsplat's values, +0.5 and clamped at 0); then our tile binning on tiles of
    `ops.tile_size_for` the image size (16 or 8 pixels; opts.tile_size is gsplat's, unused here), into a buffer
    sized by `opts.bins` (no host sync) or exactly."""
    screen = screen_space(splats, camera, opts, "fused")
    means2d, conics, radii = screen.means2d, screen.conics, screen.radii  # [1, N, 2], [1, N, 3], [1, N]
    colors = screen.colors[None]  # [1, N, 3]
    if with_depth:
        colors = torch.cat([colors, screen.depths[None, :, None]], dim=-1)  # [1, N, 4]
    opacities = screen.opacities[None]  # [1, N]

    tile_size = ops.tile_size_for(camera.width, camera.height, means2d.device)
    tiles_x, tiles_y = math.ceil(camera.width / tile_size), math.ceil(camera.height / tile_size)
    entries = opts.bins.next(splats.count, tile_size) if opts.bins is not None else EXACT
    bins = ops.bin_tiles(means2d[0], radii[0], screen.depths, tiles_x, tiles_y, tile_size, entries)
    if opts.bins is not None:
        opts.bins.observe(bins.total, entries)
    capacity = ops.tile_capacity(means2d.device, colors.shape[-1], tile_size)
    tiles = ops.tile_lists(bins, means2d[0], conics[0], opacities[0], capacity if opts.prune_on_chip else None)
    return Prepared(means2d, conics, colors, opacities, radii, tiles, capacity, screen)


def rasterize_fused(splats: Splats, camera: RasterCamera, opts: RasterizeOptions) -> RenderOutputs:
    _check_dtype(splats)
    prep = prepare(splats, camera, opts, with_depth=opts.render_depth)
    render, alpha = ops.rasterize_pixels(
        prep.means2d, prep.conics[0], prep.colors[0], prep.opacities[0], prep.tiles, camera.width, camera.height,
        prep.capacity, absgrad=opts.absgrad,
    )  # fmt: skip
    rgb = render[..., :3]
    if opts.background is not None:
        rgb = rgb + (1.0 - alpha) * opts.background
    depth = render[..., 3:4] / alpha.clamp_min(1e-10) if opts.render_depth else None
    return RenderOutputs(
        rgb=rgb, alpha=alpha, depth=depth, means2d=prep.means2d, radii=prep.radii, width=camera.width,
        height=camera.height, backend="fused", pruned=prep.tiles.pruned, screen=prep.screen,
    )  # fmt: skip


def fused_loss_step(
    splats: Splats,
    camera: RasterCamera,
    opts: RasterizeOptions,
    gt: Tensor,  # [H, W, 3] target, already composited over opts.background as the model does
    loss: FusedLoss | None = None,
    want_image: bool = False,
) -> FusedLossOutputs:
    """Render and compute the loss and all rasterizer gradients with the fused kernel (module docstring)."""
    _check_dtype(splats)
    loss = FusedLoss() if loss is None else loss
    if tuple(gt.shape) != (camera.height, camera.width, 3):
        raise ValueError(
            f"fused_loss_step(): gt has shape {tuple(gt.shape)}, expected ({camera.height}, {camera.width}, 3)."
        )
    prep = prepare(splats, camera, opts, with_depth=False)
    value, rgb, alpha = fused_loss_raster(
        prep.means2d, prep.conics[0], prep.colors[0], prep.opacities[0], prep.tiles, gt, opts.background, loss,
        prep.capacity, absgrad=opts.absgrad, want_image=want_image,
    )  # fmt: skip
    return FusedLossOutputs(
        loss=value, rgb=rgb, alpha=alpha, means2d=prep.means2d, radii=prep.radii, pruned=prep.tiles.pruned,
        width=camera.width, height=camera.height, screen=prep.screen,
    )  # fmt: skip


def fused_loss_raster(
    means2d: Tensor,  # [1, N, 2] or [N, 2]
    conics: Tensor,  # [N, 3]
    colors: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    tiles: ops.TileLists,
    gt: Tensor,  # [H, W, 3]
    background: Tensor | None,  # [3]
    loss: FusedLoss,
    capacity: int,
    absgrad: bool = False,
    want_image: bool = False,
    poison: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The loss path on projected splats: -> loss [] (differentiable), rgb [H, W, 3] (clamped prediction,
    detached) and alpha [H, W, 1], both None unless rendered (SSIM pass or want_image)."""
    height, width = gt.shape[:2]
    gt = gt.detach().to(torch.float32).contiguous()
    v_extra = ssim_term = rgb = alpha = state = None
    if loss.ssim > 0:
        render, alpha, state = ops.render_pixels(
            means2d, conics, colors, opacities, tiles, width, height, keep=True, poison=poison
        )
        rgb = _compose(render, alpha, background, loss.clamp)
        v_extra, ssim_term = _ssim_gradient(rgb, gt, loss)
        want_image = False  # already rendered
    weights = ops.LossWeights(l1=loss.l1, l2=loss.l2, clamp=loss.clamp)
    value, render_k, alpha_k = ops.loss_pixels(
        means2d, conics, colors, opacities, tiles, gt, background, weights, capacity, v_extra=v_extra,
        extra_loss=ssim_term, absgrad=absgrad, want_image=want_image, resume=state, poison=poison,
    )  # fmt: skip
    if want_image:
        rgb, alpha = _compose(render_k, alpha_k, background, loss.clamp), alpha_k
    return value, rgb, alpha


def _compose(render: Tensor, alpha: Tensor, background: Tensor | None, clamp: bool) -> Tensor:
    rgb = render if background is None else render + (1.0 - alpha) * background
    return rgb.clamp(0.0, 1.0) if clamp else rgb


def _ssim_gradient(pred: Tensor, gt: Tensor, loss: FusedLoss) -> tuple[Tensor, Tensor]:
    """-> (d [ssim * (1 - SSIM(gt, pred))] / d pred [H, W, 3], that term's value [])."""
    ssim_fn = loss.ssim_fn if loss.ssim_fn is not None else SSIMTerm(kernel=False)  # pytorch_msssim's, as splatfacto
    with torch.enable_grad():
        leaf = pred.detach().requires_grad_(True)
        term = loss.ssim * (1.0 - ssim_fn(gt, leaf))
        (grad,) = torch.autograd.grad(term, leaf)
    return grad.contiguous(), term.detach()


def _check_dtype(splats: Splats) -> None:
    if splats.means.dtype != torch.float32 or not splats.means.is_cuda:
        raise ValueError(
            f"The fused renderer takes float32 CUDA tensors, got {splats.means.dtype} on {splats.means.device}; "
            "use the torch renderer otherwise."
        )
