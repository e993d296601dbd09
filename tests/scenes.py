"""Small scene builders shared by the renderer tests (test_reference_renderer.py, test_gsplat_parity.py).

Everything is generated on the CPU in float64 from a seeded `torch.Generator` and only then cast and
moved, so a scene is the same on every machine. Cameras use OpenCV axes (x right, y down, z forward)
and world-to-camera view matrices, as `RasterCamera` expects.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from bytesplat_ns.render import RasterCamera, Splats


def intrinsics(fx: float, fy: float, cx: float, cy: float, dtype=torch.float64, device="cpu") -> Tensor:
    return torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=dtype, device=device)


def rotation(axis: Sequence[float], angle: float) -> Tensor:
    """[3, 3] float64 rotation by `angle` radians about `axis` (Rodrigues)."""
    k = torch.tensor(axis, dtype=torch.float64)
    k = k / k.norm()
    cross = torch.tensor([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + math.sin(angle) * cross + (1.0 - math.cos(angle)) * cross @ cross


def viewmat(cam_to_world_rot: Tensor | None = None, cam_pos: Sequence[float] = (0.0, 0.0, 0.0)) -> Tensor:
    """[4, 4] float64 world-to-camera matrix of a camera at `cam_pos` whose axes are the columns of
    `cam_to_world_rot` (identity: looking down world +z)."""
    rot = torch.eye(3, dtype=torch.float64) if cam_to_world_rot is None else cam_to_world_rot.to(torch.float64)
    pos = torch.tensor(cam_pos, dtype=torch.float64)
    view = torch.eye(4, dtype=torch.float64)
    view[:3, :3] = rot.T
    view[:3, 3] = -rot.T @ pos
    return view


def camera(
    width: int,
    height: int,
    focal: float,
    view: Tensor | None = None,
    principal: Sequence[float] | None = None,
    dtype=torch.float64,
    device="cpu",
) -> RasterCamera:
    """A pinhole camera; the principal point defaults to the image centre."""
    cx, cy = (0.5 * width, 0.5 * height) if principal is None else principal
    view = viewmat() if view is None else view
    return RasterCamera(
        viewmat=view.to(dtype=dtype, device=device),
        K=intrinsics(focal, focal, cx, cy, dtype=dtype, device=device),
        width=width,
        height=height,
    )


def camera_to_world(points_cam: Tensor, cam: RasterCamera) -> Tensor:
    """Map [N, 3] camera-space points to world space, in float64."""
    view = cam.viewmat.detach().to(device="cpu", dtype=torch.float64)
    rot, trans = view[:3, :3], view[:3, 3]
    return (points_cam.to(torch.float64) - trans) @ rot


def unproject(pixels: Tensor, depths: Tensor, cam: RasterCamera) -> Tensor:
    """Camera-space points at `depths` [N] that project to `pixels` [N, 2]."""
    k = cam.K.detach().to(device="cpu", dtype=torch.float64)
    fx, fy, cx, cy = k[0, 0], k[1, 1], k[0, 2], k[1, 2]
    x = (pixels[:, 0] - cx) / fx * depths
    y = (pixels[:, 1] - cy) / fy * depths
    return torch.stack([x, y, depths], dim=-1)


def identity_quats(n: int) -> Tensor:
    quats = torch.zeros(n, 4, dtype=torch.float64)
    quats[:, 0] = 1.0
    return quats


def make_splats(
    means: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    quats: Tensor | None = None,
    dtype=torch.float64,
    device="cpu",
    requires_grad: bool = False,
) -> Splats:
    """Splats from plain tensors (any float dtype), cast to `dtype` on `device` as fresh leaves."""
    quats = identity_quats(means.shape[0]) if quats is None else quats

    def leaf(t: Tensor) -> Tensor:
        return t.detach().to(device=device, dtype=dtype).clone().requires_grad_(requires_grad)

    return Splats(
        means=leaf(means), quats=leaf(quats), scales=leaf(scales), opacities=leaf(opacities), colors=leaf(colors)
    )


def in_two_parts(splats: Splats) -> Splats:
    """The same splats with their SH coefficients [N, K, 3] as the model passes them: the first [N, 3] in colors,
    the others [N, K - 1, 3] in sh_rest, each a fresh leaf."""

    dc, rest = (t.detach().clone().requires_grad_(splats.colors.requires_grad) for t in splats.sh_parts())
    return dataclasses.replace(splats, colors=dc, sh_rest=rest)


def colors_grad(splats: Splats) -> Tensor | None:
    """[N, K, 3] (or [N, 3] for RGB) the gradient of the colours, joined when the SH coefficients come in two parts."""
    if splats.sh_rest is None:
        return splats.colors.grad
    return torch.cat([splats.colors.grad[:, None], splats.sh_rest.grad], dim=1)


@dataclass
class SceneSpec:
    """How `random_scene` draws splats. Sizes are in pixels on screen, so they mean the same at any depth."""

    count: int
    sh_degree: int | None = 3  # None: RGB colours [N, 3]
    depth_range: tuple = (2.0, 8.0)
    pixel_margin: float = 0.0
    """Centres are drawn over the image grown by this many pixels on every side."""
    footprint_px: tuple = (0.7, 6.0)
    """Range (log-uniform) of each splat's screen-space standard deviation before anisotropy."""
    anisotropy: float = 0.4
    """Std of the per-axis log-scale jitter."""
    opacity_range: tuple = (0.05, 0.95)
    sh_scale: float = 0.4
    """Std of the higher-order SH coefficients; the DC term has std 1."""
    separated_depths: bool = False
    """Place depths on a shuffled even grid (with small jitter) so no two splats are within
    about (depth range / count) / 2 of each other: float32 and float64 then sort them the same."""


def random_scene(spec: SceneSpec, cam: RasterCamera, generator: torch.Generator) -> dict:
    """Random splats in front of `cam` as float64 CPU tensors: a dict with means, quats, scales,
    opacities, colors (pass to `make_splats`)."""
    g = generator
    n = spec.count
    lo, hi = spec.depth_range
    if spec.separated_depths:
        slots = torch.randperm(n, generator=g).to(torch.float64)
        jitter = 0.25 * (torch.rand(n, generator=g, dtype=torch.float64) - 0.5)
        depths = lo + (hi - lo) * (slots + 0.5 + jitter) / n
    else:
        depths = lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)
    m = spec.pixel_margin
    uv = torch.rand(n, 2, generator=g, dtype=torch.float64)
    pixels = torch.stack([uv[:, 0] * (cam.width + 2 * m) - m, uv[:, 1] * (cam.height + 2 * m) - m], dim=-1)
    means = camera_to_world(unproject(pixels, depths, cam), cam)

    focal = float(cam.K[0, 0])
    f_lo, f_hi = spec.footprint_px
    footprint = f_lo * (f_hi / f_lo) ** torch.rand(n, generator=g, dtype=torch.float64)
    base = footprint * depths / focal  # world-space std giving that many pixels at that depth
    scales = base[:, None] * torch.exp(spec.anisotropy * torch.randn(n, 3, generator=g, dtype=torch.float64))

    # Unnormalised on purpose: the renderer normalises quaternions itself.
    quats = torch.randn(n, 4, generator=g, dtype=torch.float64)
    quats = quats * (0.5 + torch.rand(n, 1, generator=g, dtype=torch.float64))
    o_lo, o_hi = spec.opacity_range
    opacities = o_lo + (o_hi - o_lo) * torch.rand(n, generator=g, dtype=torch.float64)
    if spec.sh_degree is None:
        colors = torch.rand(n, 3, generator=g, dtype=torch.float64)
    else:
        k = (spec.sh_degree + 1) ** 2
        colors = spec.sh_scale * torch.randn(n, k, 3, generator=g, dtype=torch.float64)
        colors[:, 0] = torch.randn(n, 3, generator=g, dtype=torch.float64)
    return {"means": means, "quats": quats, "scales": scales, "opacities": opacities, "colors": colors}


def tilted_camera(width: int, height: int, focal: float, dtype=torch.float64, device="cpu") -> RasterCamera:
    """A camera that is neither at the origin nor axis-aligned, so world and camera frames differ."""
    rot = rotation((0.3, 1.0, 0.2), 0.35) @ rotation((1.0, 0.0, 0.0), -0.2)
    return camera(width, height, focal, view=viewmat(rot, (0.4, -0.3, -1.5)), dtype=dtype, device=device)
