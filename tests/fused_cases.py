"""GPU helpers of tests/test_fused_backend.py: random 2D scenes, the float64 reference on the same numbers and
tile lists, and the comparisons, on tiles of 16 or 8 pixels (Scene.tile_size). Imported only where CUDA is
available."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor

from bytesplat_ns.cuda import ops
from bytesplat_ns.render import RasterCamera, RasterizeOptions, rasterize
from bytesplat_ns.render import torch_backend as ref
from bytesplat_ns.render.fused_backend import FusedLoss, fused_loss_raster, fused_loss_step
from bytesplat_ns.render.tiles import TileBins, bin_tiles

DEVICE = "cuda"
F64 = torch.float64


@dataclass
class Scene:
    means2d: Tensor  # [N, 2] float32
    conics: Tensor  # [N, 3]
    colors: Tensor  # [N, D]
    opacities: Tensor  # [N]
    depths: Tensor  # [N]
    radii: Tensor  # [N] int32
    bins: TileBins
    width: int
    height: int
    tile_size: int  # tile side of `bins` in pixels, 16 or 8: the kernels run on the same tiles


def tolerances(image_atol, grad_rtol, shift, flipped_fraction, flipped_atol) -> dict:
    return dict(image_atol=image_atol, grad_rtol=grad_rtol, shift=shift, flipped_fraction=flipped_fraction,
                flipped_atol=flipped_atol)  # fmt: skip


def device_capacity(channels: int, tile_size: int) -> int:
    return ops.tile_capacity(torch.device(DEVICE), channels, tile_size)


@contextlib.contextmanager
def tile_side(side: int):
    """The fused backend on tiles of `side` pixels whatever the image size (ops.tile_size_for stood in for)."""
    saved = ops.tile_size_for
    ops.tile_size_for = lambda width, height, device: side
    try:
        yield
    finally:
        ops.tile_size_for = saved


def random_2d_scene(count, width, height, seed, placement, channels, footprint=(0.5, 6.0), opacity=(0.05, 0.95),
                    box=None, color_max=1.0, tile_size=16) -> Scene:  # fmt: skip
    """Projected splats drawn in float64, rounded to float32 once; depths on a shuffled grid (no ties); binned by
    the reference on tiles of `tile_size` pixels.
    placement "left": small splats in the left 30% only, so the tiles on the right stay empty; "needles": long thin
    splats (axes 8x and 1/4 of the footprint) of opacity from just over the 1/255 cut-off, where the kernels' per-warp
    row test (csrc/raster_device.cuh, WarpRect::may_reach) is tightest."""
    g = torch.Generator().manual_seed(seed)
    if placement == "left":
        footprint = (0.5, 1.5)
    if placement == "needles":
        opacity = (1.001 * ref.ALPHA_MIN, 0.3)
    u = torch.rand(count, 2, generator=g, dtype=F64)
    m = 0.1 * max(width, height)
    x0, x1, y0, y1 = box or (-m, (0.3 * width if placement == "left" else width + m), -m, height + m)
    means2d = torch.stack([x0 + (x1 - x0) * u[:, 0], y0 + (y1 - y0) * u[:, 1]], dim=-1)
    lo, hi = footprint
    std = lo * (hi / lo) ** torch.rand(count, generator=g, dtype=F64)
    s = std[:, None] * torch.exp(0.4 * torch.randn(count, 2, generator=g, dtype=F64))
    if placement == "needles":
        s = s * torch.tensor([8.0, 0.25], dtype=F64)
    angle = math.pi * torch.rand(count, generator=g, dtype=F64)
    c, sn = torch.cos(angle), torch.sin(angle)
    cxx = c * c * s[:, 0] ** 2 + sn * sn * s[:, 1] ** 2 + 0.3
    cyy = sn * sn * s[:, 0] ** 2 + c * c * s[:, 1] ** 2 + 0.3
    cxy = c * sn * (s[:, 0] ** 2 - s[:, 1] ** 2)
    det = cxx * cyy - cxy * cxy
    conics = torch.stack([cyy / det, -cxy / det, cxx / det], dim=-1)
    half = 0.5 * (cxx + cyy)
    radii = torch.ceil(3.0 * torch.sqrt(half + torch.sqrt(torch.clamp(half * half - det, min=0.01))))
    radii[torch.rand(count, generator=g) < 0.03] = 0  # a few culled splats: they must get no gradient
    o_lo, o_hi = opacity
    opacities = o_lo + (o_hi - o_lo) * torch.rand(count, generator=g, dtype=F64)
    colors = color_max * torch.rand(count, 3, generator=g, dtype=F64)
    depths = 1.0 + 9.0 * (torch.randperm(count, generator=g).to(F64) + 0.5) / count
    if channels == 4:
        colors = torch.cat([colors, depths[:, None]], dim=-1)
    f32 = lambda t: t.to(device=DEVICE, dtype=torch.float32).contiguous()  # noqa: E731
    means2d, conics, colors, opacities, depths = map(f32, (means2d, conics, colors, opacities, depths))
    radii = radii.to(device=DEVICE, dtype=torch.int32)
    tiles_x, tiles_y = math.ceil(width / tile_size), math.ceil(height / tile_size)
    bins = bin_tiles(means2d, radii, depths, tiles_x, tiles_y, tile_size)
    return Scene(means2d, conics, colors, opacities, depths, radii, bins, width, height, tile_size)


def overflowing_scene(seed: int, width: int, height: int, tile_size: int, channels: int = 4) -> Scene:
    """8000 small splats over the 16x16 pixels at x 16..32, y 0..16 (one 16-pixel tile, four 8-pixel ones): lists
    longer than any GPU's on-chip capacity. On 8-pixel tiles, fainter splats: a list a quarter as long, a larger
    capacity, so more splats per pixel must stay below saturation for a pixel to use splats past the capacity."""
    opacity = (0.05, 0.6) if tile_size == 16 else (0.02, 0.3)
    return random_2d_scene(8000, width, height, seed, "spread", channels, footprint=(0.3, 1.0), opacity=opacity,
                           box=(16.0, 32.0, 0.0, 16.0), tile_size=tile_size)  # fmt: skip


def deepest_used_entry(scene: Scene, lists: ops.TileLists) -> int:
    """The largest position, in its tile's list, of a splat composited into some pixel (float64, gsplat's rules
    as in the reference). At or past the capacity the fused kernel composites the tile in chunks and reloads the
    first one for the backward pass."""
    side, deepest = scene.tile_size, -1
    offsets = torch.arange(side, device=DEVICE, dtype=F64) + 0.5
    py, px = (t.reshape(-1) for t in torch.meshgrid(offsets, offsets, indexing="ij"))  # [P] pixel centres in a tile
    for tile in range(lists.tiles_x * lists.tiles_y):
        ids = lists.ids[int(lists.start[tile]) : int(lists.end[tile])].long()  # [K]
        x, y = px + tile % lists.tiles_x * side, py + tile // lists.tiles_x * side
        inside = (x < scene.width) & (y < scene.height)
        if ids.numel() == 0 or not inside.any():
            continue
        dx = scene.means2d[ids, 0].to(F64)[None] - x[inside, None]  # [P, K]
        dy = scene.means2d[ids, 1].to(F64)[None] - y[inside, None]
        a, b, c = scene.conics[ids].to(F64).unbind(-1)
        sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
        alpha = torch.clamp_max(scene.opacities[ids].to(F64) * torch.exp(-sigma), ref.ALPHA_MAX)
        valid = (sigma >= 0) & (alpha >= ref.ALPHA_MIN)
        used = valid & (torch.cumprod(1.0 - alpha * valid, dim=-1) > ref.TRANSMITTANCE_MIN)
        positions = torch.arange(ids.numel(), device=DEVICE)
        deepest = max(deepest, int(torch.where(used, positions, -1).max()))
    return deepest


def lists_from_bins(bins: TileBins, tile_size: int) -> ops.TileLists:
    k = bins.max_per_tile
    counts = bins.counts
    mask = torch.arange(k, device=counts.device)[None] < counts[:, None]
    start = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    ids = bins.tile_splats[mask].to(torch.int32).contiguous()
    none = torch.zeros(1, dtype=torch.int32, device=counts.device)
    end = (start + counts).to(torch.int32)
    return ops.TileLists(start=start, end=end, ids=ids, tiles_x=bins.tiles_x, tiles_y=bins.tiles_y, pruned=none,
                         tile_size=tile_size)  # fmt: skip


def bins_from_lists(lists: ops.TileLists, n: int) -> TileBins:
    counts = (lists.end - lists.start).long()
    k = int(counts.max()) if counts.numel() else 0
    slots = torch.arange(k, device=counts.device)
    index = (lists.start.long()[:, None] + slots[None]).clamp_max(max(lists.ids.numel() - 1, 0))
    table = torch.where(slots[None] < counts[:, None], lists.ids.long()[index], n)
    return TileBins(tile_splats=table, counts=counts, tiles_x=lists.tiles_x, tiles_y=lists.tiles_y)


@contextlib.contextmanager
def shifted_cutoffs(factor: float):
    saved = ref.ALPHA_MIN, ref.TRANSMITTANCE_MIN
    ref.ALPHA_MIN, ref.TRANSMITTANCE_MIN = saved[0] * factor, saved[1] * factor
    try:
        yield
    finally:
        ref.ALPHA_MIN, ref.TRANSMITTANCE_MIN = saved


def reference(scene: Scene, bins: TileBins, grad: bool = True):
    """float64 composite of the same float32 numbers: -> image [H, W, D], alpha [H, W, 1], leaves, absgrad."""
    leaves = [t.to(F64).requires_grad_(grad) for t in (scene.means2d, scene.conics, scene.colors, scene.opacities)]
    cam = RasterCamera(torch.eye(4, dtype=F64), torch.eye(3, dtype=F64), scene.width, scene.height)
    absgrad = torch.zeros(scene.means2d.shape[0] + 1, 2, dtype=F64, device=DEVICE)
    image, alpha = ref.composite(leaves[0], leaves[1], leaves[3], leaves[2], bins, cam, scene.tile_size,
                                 absgrad if grad else None)  # fmt: skip
    return image, alpha, leaves, absgrad


def flipped_pixels(scene: Scene, bins: TileBins, shift: float) -> Tensor:
    """[H, W] pixels where a cut-off moved by `shift` (relative) changes the reference."""
    with torch.no_grad():
        with shifted_cutoffs(1.0 - shift):
            lo = torch.cat(reference(scene, bins, grad=False)[:2], dim=-1)
        with shifted_cutoffs(1.0 + shift):
            hi = torch.cat(reference(scene, bins, grad=False)[:2], dim=-1)
    return (lo - hi).abs().amax(dim=-1) > 1e-9


def assert_image_close(actual: Tensor, expected: Tensor, flipped: Tensor, tol: dict, what: str) -> None:
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{what}: NaN or unwritten (poisoned) values"
    diff = (actual.double() - expected).abs().amax(dim=-1)
    share = flipped.double().mean().item()
    assert share <= tol["flipped_fraction"], f"{what}: {share:.2%} of pixels sit on a cut-off"
    assert diff[~flipped].max().item() <= tol["image_atol"], f"{what}: max diff {diff[~flipped].max().item():.3g}"
    if flipped.any():
        assert diff[flipped].max().item() <= tol["flipped_atol"], f"{what}: {diff[flipped].max().item():.3g}"


def assert_grad_close(actual: Tensor, expected: Tensor, rtol: float, what: str) -> None:
    assert actual is not None and actual.shape == expected.shape, what
    assert torch.isfinite(actual).all(), f"{what}: non-finite gradient"
    ref_norm = expected.norm().item()
    err = (actual.double() - expected).norm().item()
    assert err <= rtol * ref_norm or (ref_norm == 0 and err == 0), f"{what}: |err| {err:.3g}, |ref| {ref_norm:.3g}"


def _capacity(capacity, channels: int, tile_size: int) -> int:
    return device_capacity(channels, tile_size) if capacity == "device" else int(capacity)


def _leaves(scene: Scene) -> list[Tensor]:
    return [scene.means2d[None].clone().requires_grad_(True)] + [
        t.clone().requires_grad_(True) for t in (scene.conics, scene.colors, scene.opacities)
    ]


def _compare_grads(leaves, ref_leaves, ref_absgrad, scene: Scene, rtol: float) -> None:
    names = ("means2d", "conics", "colors", "opacities")
    for name, leaf, ref_leaf in zip(names, leaves, ref_leaves):
        assert_grad_close(leaf.grad.reshape(ref_leaf.shape), ref_leaf.grad, rtol, name)
    assert_grad_close(leaves[0].absgrad[0], ref_absgrad[:-1], rtol, "means2d.absgrad")
    culled = scene.radii == 0
    for leaf in leaves:
        assert (leaf.grad.reshape(scene.radii.shape[0], -1)[culled] == 0).all(), "culled splats got a gradient"


def check_autograd_path(scene: Scene, capacity, tol: dict, lists: ops.TileLists | None = None) -> None:
    bins = scene.bins if lists is None else bins_from_lists(lists, scene.means2d.shape[0])
    lists = lists_from_bins(scene.bins, scene.tile_size) if lists is None else lists
    assert lists.tile_size == scene.tile_size
    channels = scene.colors.shape[-1]
    leaves = _leaves(scene)
    render, alpha = ops.rasterize_pixels(*leaves, lists, scene.width, scene.height,
                                         _capacity(capacity, channels, scene.tile_size), absgrad=True,
                                         poison=True)  # fmt: skip
    g = torch.Generator(device=DEVICE).manual_seed(scene.means2d.shape[0])
    w_render = torch.randn(*render.shape, generator=g, device=DEVICE, dtype=F64)
    w_alpha = torch.randn(*alpha.shape, generator=g, device=DEVICE, dtype=F64)
    ((render * w_render.float()).sum() + (alpha * w_alpha.float()).sum()).backward()

    image64, alpha64, ref_leaves, absgrad64 = reference(scene, bins)
    ((image64 * w_render).sum() + (alpha64 * w_alpha).sum()).backward()
    flipped = flipped_pixels(scene, bins, tol["shift"])
    assert_image_close(render, image64, flipped, tol, "render")
    assert_image_close(alpha, alpha64, flipped, tol, "alpha")
    _compare_grads(leaves, ref_leaves, absgrad64, scene, tol["grad_rtol"])


def check_loss_path(scene: Scene, weights: dict, background, loss_rtol: float, tol: dict, capacity="device") -> None:
    from pytorch_msssim import ssim

    lists = lists_from_bins(scene.bins, scene.tile_size)
    g = torch.Generator(device=DEVICE).manual_seed(scene.means2d.shape[0] + 1)
    gt = torch.rand(scene.height, scene.width, 3, generator=g, device=DEVICE)
    bg = torch.tensor(background, device=DEVICE)
    leaves = _leaves(scene)
    loss = FusedLoss(**weights)
    value, rgb, _ = fused_loss_raster(*leaves, lists, gt, bg, loss, _capacity(capacity, 3, scene.tile_size),
                                      absgrad=True, want_image=True, poison=True)  # fmt: skip
    value.backward()

    image64, alpha64, ref_leaves, absgrad64 = reference(scene, scene.bins)
    pred = torch.clamp(image64 + (1.0 - alpha64) * bg.to(F64), 0.0, 1.0)
    diff = pred - gt.to(F64)
    expected = loss.l1 * diff.abs().mean() + loss.l2 * (diff * diff).mean()
    if loss.ssim > 0:
        expected = expected + loss.ssim * (1.0 - ssim(gt.to(F64).permute(2, 0, 1)[None], pred.permute(2, 0, 1)[None],
                                                      data_range=1.0, size_average=True))  # fmt: skip
    expected.backward()
    assert abs(value.item() - expected.item()) <= loss_rtol * abs(expected.item()), (value.item(), expected.item())
    assert_image_close(rgb, pred.detach(), flipped_pixels(scene, scene.bins, tol["shift"]), tol, "rgb")
    _compare_grads(leaves, ref_leaves, absgrad64, scene, tol["grad_rtol"])


def check_loss_scale(scene: Scene, factor: float) -> None:
    """backward of factor * loss hands out factor times the loss path's gradients (|factor| times the absolute
    2D-mean ones), and a second backward of the same loss raises."""
    lists = lists_from_bins(scene.bins, scene.tile_size)
    gt = torch.rand(scene.height, scene.width, 3, generator=torch.Generator(device=DEVICE).manual_seed(3),
                    device=DEVICE)  # fmt: skip
    runs = []
    for scale in (1.0, factor):
        leaves = _leaves(scene)
        value, _, _ = fused_loss_raster(*leaves, lists, gt, None, FusedLoss(l1=0.7, l2=0.3, ssim=0.0),
                                        device_capacity(3, scene.tile_size), absgrad=True)  # fmt: skip
        (value * scale).backward(retain_graph=True)
        runs.append([leaf.grad for leaf in leaves] + [leaves[0].absgrad])
        with pytest.raises(RuntimeError, match="hands out its gradients once"):
            value.backward()
    names = ("means2d", "conics", "colors", "opacities", "absgrad")
    for name, one, scaled in zip(names, *runs):
        expected = one.double() * (abs(factor) if name == "absgrad" else factor)
        assert one.abs().sum() > 0, name
        assert_grad_close(scaled, expected, 1e-5, f"{factor} x loss: {name}")


def prune_scores(scene: Scene, ids: Tensor, tile: int, tiles_x: int) -> Tensor:
    """The pruning criterion (csrc/prune_tiles.h) in float64, on the scene's tiles."""
    side = scene.tile_size
    x0, y0 = float(tile % tiles_x * side), float(tile // tiles_x * side)
    m = scene.means2d[ids].to(F64)
    a, b, c = scene.conics[ids].to(F64).unbind(-1)
    dx = m[:, 0] - m[:, 0].clamp(x0, x0 + side)
    dy = m[:, 1] - m[:, 1].clamp(y0, y0 + side)
    sigma = (0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy).clamp_min(0)
    area = (2 * math.pi / torch.sqrt((a * c - b * b).clamp_min(1e-30))).clamp_max(float(side * side))
    return scene.opacities[ids].to(F64) * torch.exp(-sigma) * area


def check_pruning(scene: Scene, capacity: int, score_rtol: float) -> None:
    full = lists_from_bins(scene.bins, scene.tile_size)
    kept = torch.tensor([full.ids.numel()], dtype=torch.int32, device=DEVICE)
    bins = ops.TileEntries(ids=full.ids.clone(), offsets=full.start, kept=kept, total=kept.long(), tiles_x=full.tiles_x,
                           tiles_y=full.tiles_y, tile_size=scene.tile_size)  # fmt: skip
    pruned = ops.tile_lists(bins, scene.means2d, scene.conics, scene.opacities, capacity)
    assert pruned.tile_size == scene.tile_size
    counts = (full.end - full.start).long()
    assert torch.equal((pruned.end - pruned.start).long(), counts.clamp_max(capacity))
    assert int(pruned.pruned.item()) == int((counts - capacity).clamp_min(0).sum())
    overflowing = (counts > capacity).nonzero().flatten().tolist()
    assert overflowing, "the scene must overflow the small capacity"
    for tile in overflowing[:40]:
        s = int(full.start[tile])
        orig = full.ids[s : int(full.end[tile])].long()
        kept = pruned.ids[s : s + capacity].long()
        where = {int(v): i for i, v in enumerate(orig.tolist())}
        positions = [where[int(v)] for v in kept.tolist()]
        assert positions == sorted(positions) and len(set(positions)) == capacity, "depth order lost"
        dropped = torch.ones(orig.shape[0], dtype=torch.bool, device=orig.device)
        dropped[positions] = False
        scores = prune_scores(scene, orig, tile, full.tiles_x)
        assert scores[~dropped].min() >= scores[dropped].max() * (1 - score_rtol), f"tile {tile}: weaker kept"
    check_autograd_path(scene, "device", tolerances(1e-4, 1e-3, 1e-4, 0.02, 0.02), lists=pruned)


def check_backend_against_gsplat(seed: int, image_atol: float, grad_rtol: float, tile_size: int) -> None:
    """The whole fused backend on tiles of `tile_size` pixels against the gsplat backend on tiles of the same side
    (which pixels a splat reaches depends on the tiles: its radius square picks them); the fused backend takes the
    SH coefficients in two parts, as the model passes them."""
    from tests.scenes import in_two_parts
    from tests.test_gsplat_parity import _assert_mostly_close, _on_device, _render_and_backprop, build_scene

    scene, cam32, _ = build_scene(20000, 203, 157, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    weights = {name: torch.randn(157, 203, d, generator=gen, dtype=F64).to(DEVICE)
               for name, d in (("rgb", 3), ("alpha", 1), ("depth", 1))}  # fmt: skip
    weights["depth"] *= 0.1
    gs = _render_and_backprop(_on_device(scene, torch.float32, True), cam32, "gsplat", weights, tile_size)
    with tile_side(tile_size):
        fu = _render_and_backprop(in_two_parts(_on_device(scene, torch.float32, True)), cam32, "fused", weights)
    one = torch.ones((), dtype=F64, device=DEVICE)
    for name in ("rgb", "alpha"):
        assert torch.isfinite(fu[name]).all(), name
        _assert_mostly_close(fu[name], gs[name].double(), one, image_atol, 0.03, name)
    assert torch.equal(fu["radii"], gs["radii"])
    for name in ("means", "quats", "scales", "opacities", "colors", "means2d"):
        assert_grad_close(fu[f"{name}.grad"], gs[f"{name}.grad"].double(), grad_rtol, f"fused vs gsplat: {name}.grad")
    assert_grad_close(fu["means2d.absgrad"], gs["means2d.absgrad"].double(), grad_rtol, "fused vs gsplat: absgrad")


def check_fused_loss_step(seed: int, grad_rtol: float, loss_rtol: float, tile_size: int) -> None:
    """`fused_loss_step` against autograd through `rasterize(backend="fused")`, both on tiles of `tile_size`."""
    from pytorch_msssim import ssim

    from tests.test_gsplat_parity import _on_device, build_scene

    scene, cam, _ = build_scene(20000, 203, 157, seed)
    gt = torch.rand(157, 203, 3, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    opts = RasterizeOptions(sh_degree=3, background=torch.tensor([0.2, 0.4, 0.6], device=DEVICE), absgrad=True,
                            backend="fused")  # fmt: skip
    results = []
    for fused in (True, False):
        splats = _on_device(scene, torch.float32, True)
        with tile_side(tile_size):
            if fused:
                out = fused_loss_step(splats, cam, opts, gt, FusedLoss(), want_image=True)
                out.means2d.retain_grad()
                loss = out.loss
            else:
                out = rasterize(splats, cam, opts)
                out.means2d.retain_grad()
                pred = out.rgb.clamp(0.0, 1.0)
                pair = (gt.permute(2, 0, 1)[None], pred.permute(2, 0, 1)[None])
                loss = 0.8 * (pred - gt).abs().mean() + 0.2 * (1 - ssim(*pair, data_range=1.0, size_average=True))
            loss.backward()
        grads = {n: getattr(splats, n).grad for n in ("means", "quats", "scales", "opacities", "colors")}
        grads["means2d"], grads["absgrad"] = out.means2d.grad, out.means2d.absgrad
        results.append((loss.item(), grads, int(out.pruned.item())))
    (fused_loss, fused_grads, pruned), (auto_loss, auto_grads, _) = results
    assert abs(fused_loss - auto_loss) <= loss_rtol * abs(auto_loss), (fused_loss, auto_loss)
    assert pruned >= 0
    for name, grad in fused_grads.items():
        assert_grad_close(grad, auto_grads[name].double(), grad_rtol, f"fused_loss_step: {name}")


def check_binning(scene: Scene, mode: str) -> None:
    """The sync-free binning (csrc/bin_tiles.h) against gsplat's isect_tiles + isect_offset_encode: the same sorted
    entries and tile offsets. mode: "exact" (capacity read from the device), "spare" (a larger buffer: padding
    after the entries) or "short" (a smaller one: the first entries in splat order, sorted)."""
    from gsplat.cuda._wrapper import isect_offset_encode, isect_tiles

    side = scene.tile_size
    tiles_x, tiles_y = math.ceil(scene.width / side), math.ceil(scene.height / side)
    args = (scene.means2d[None], scene.radii[None], scene.depths[None], side, tiles_x, tiles_y)
    _, unsorted, unsorted_ids = isect_tiles(*args, sort=False)
    total = unsorted.numel()
    capacity = {"exact": -1, "spare": total + 1000, "short": max(1, total // 2)}[mode]
    keys, ids, offsets, kept, counted = ops.ext().bin_tiles(
        scene.means2d, scene.radii, scene.depths, tiles_x, tiles_y, side, capacity
    )
    used = min(total, keys.numel())
    assert int(counted.item()) == total and int(kept.item()) == used
    order = torch.sort(unsorted[:used], stable=True).indices  # gsplat's sort (cub radix) is stable too
    expected_keys, expected_ids = unsorted[:used][order], unsorted_ids[:used][order]
    if mode != "short":
        _, sorted_keys, sorted_ids = isect_tiles(*args)
        assert torch.equal(sorted_keys, expected_keys) and torch.equal(sorted_ids, expected_ids)
    assert torch.equal(keys[:used], expected_keys)
    assert torch.equal(ids[:used], expected_ids)
    assert torch.equal(offsets, isect_offset_encode(expected_keys, 1, tiles_x, tiles_y).reshape(-1))
    assert bool(((keys[used:] >> 32) == tiles_x * tiles_y).all()), "padding must sort after every tile"


def check_bin_capacity_renders(seed: int, tile_size: int) -> None:
    """Training renders with a BinCapacity (buffers sized from earlier counts, no host read) equal exact binning's,
    bit for bit; a capacity too small is counted as an overflow a render later. On tiles of `tile_size`."""
    from bytesplat_ns.render.bin_capacity import EXACT, BinCapacity
    from tests.test_gsplat_parity import _on_device, build_scene

    @dataclass
    class Recorded(BinCapacity):
        given: list = field(default_factory=list)

        def next(self, num_splats: int, tile_size: int) -> int:
            self.given.append(super().next(num_splats, tile_size))
            return self.given[-1]

    scene, cam, _ = build_scene(20000, 203, 157, seed)
    splats = _on_device(scene, torch.float32, False)
    with tile_side(tile_size):
        exact = rasterize(splats, cam, RasterizeOptions(backend="fused"))
        bins = Recorded(lag=1)  # counts read a render later (training reads them STEPS_LATE renders later)
        for _ in range(3):
            out = rasterize(splats, cam, RasterizeOptions(backend="fused", bins=bins))
            assert torch.equal(out.rgb, exact.rgb) and torch.equal(out.alpha, exact.alpha)
        assert bins.given[0] == EXACT and bins.given[1] == bins.given[2] > 0 and bins.given[1] % bins.granule == 0
        assert bins.tile_size == tile_size
        bins.next(splats.count, tile_size)
        assert bins.overflows == 0
        small = BinCapacity(headroom=0.25, granule=1, lag=1)
        for _ in range(3):
            rasterize(splats, cam, RasterizeOptions(backend="fused", bins=small))
        small.next(splats.count, tile_size)
        assert small.overflows == 2  # the second and third renders had a quarter of the entries they needed


def check_backend_tile_side(seed: int) -> None:
    """The fused backend bins an image on 8-pixel tiles when it has fewer 16-pixel tiles than two waves of blocks,
    else on 16-pixel tiles, with the on-chip capacity of that side."""
    from bytesplat_ns.render.fused_backend import prepare
    from tests.test_gsplat_parity import _on_device, build_scene

    sms = torch.cuda.get_device_properties(torch.device(DEVICE)).multi_processor_count
    assert ops.sm_count(torch.cuda.current_device()) == sms
    two_waves = ops.SMALL_TILE_WAVES * ops.BLOCKS_PER_SM * sms
    for width, height in ((100, 100), (320, 240), (800, 608)):
        scene, cam, _ = build_scene(2000, width, height, seed)
        with torch.no_grad():
            prep = prepare(_on_device(scene, torch.float32, False), cam, RasterizeOptions(), with_depth=False)
        side = 8 if math.ceil(width / 16) * math.ceil(height / 16) < two_waves else 16
        assert ops.tile_size_for(width, height, prep.means2d.device) == side
        assert prep.tiles.tile_size == side, (width, height, sms)
        assert (prep.tiles.tiles_x, prep.tiles.tiles_y) == (math.ceil(width / side), math.ceil(height / side))
        assert prep.capacity == device_capacity(3, side)
