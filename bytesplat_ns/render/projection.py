"""EWA projection of 3D Gaussians to 2D conics, as gsplat's pinhole `fully_fused_projection`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from bytesplat_ns.render.types import RasterCamera, RasterizeOptions, Splats


@dataclass
class Projected:
    means2d: Tensor  # [N, 2] pixel coordinates of the centres
    conics: Tensor  # [N, 3] inverse 2D covariance (a, b, c) of [[a, b], [b, c]]
    depths: Tensor  # [N] camera-space z
    radii: Tensor  # [N] int32, 0 where culled


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """quats: [N, 4] (w, x, y, z), any length -> [N, 3, 3]."""
    w, x, y, z = (quats / quats.norm(dim=-1, keepdim=True)).unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(-1, 3, 3)


def covariance(quats: Tensor, scales: Tensor) -> Tensor:
    """World covariance R S S^T R^T. quats: [N, 4], scales: [N, 3] -> [N, 3, 3]."""
    m = quat_to_rotmat(quats) * scales[:, None, :]
    return m @ m.transpose(1, 2)


def project(splats: Splats, camera: RasterCamera, opts: RasterizeOptions) -> Projected:
    rot, trans = camera.viewmat[:3, :3], camera.viewmat[:3, 3]
    means_c = splats.means @ rot.T + trans  # [N, 3]
    cov_c = rot @ covariance(splats.quats, splats.scales) @ rot.T  # [N, 3, 3]

    fx, fy, cx, cy = camera.K[0, 0], camera.K[1, 1], camera.K[0, 2], camera.K[1, 2]
    x, y, z = means_c.unbind(-1)
    in_depth = (z >= opts.near_plane) & (z <= opts.far_plane)
    z = torch.where(in_depth, z, torch.ones_like(z))  # keeps culled splats finite (and their gradients zero)

    # Clamp the Jacobian's evaluation point to 1.3x the field of view, as gsplat does.
    tan_fovx, tan_fovy = 0.5 * camera.width / fx, 0.5 * camera.height / fy
    tx = z * torch.clamp(x / z, min=-(cx / fx + 0.3 * tan_fovx), max=(camera.width - cx) / fx + 0.3 * tan_fovx)
    ty = z * torch.clamp(y / z, min=-(cy / fy + 0.3 * tan_fovy), max=(camera.height - cy) / fy + 0.3 * tan_fovy)
    zeros = torch.zeros_like(z)
    jac = torch.stack([fx / z, zeros, -fx * tx / (z * z), zeros, fy / z, -fy * ty / (z * z)], dim=-1).reshape(
        -1, 2, 3
    )  # [N, 2, 3]
    cov2d = jac @ cov_c @ jac.transpose(1, 2)  # [N, 2, 2]
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)  # [N, 2]

    a = cov2d[:, 0, 0] + opts.eps2d
    b = 0.5 * (cov2d[:, 0, 1] + cov2d[:, 1, 0])
    c = cov2d[:, 1, 1] + opts.eps2d
    det = a * c - b * b
    ok = in_depth & (det > 0)
    det = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([c / det, -b / det, a / det], dim=-1)  # [N, 3]

    with torch.no_grad():
        half_trace = 0.5 * (a + c)
        v1 = half_trace + torch.sqrt(torch.clamp(half_trace * half_trace - det, min=0.01))
        radius = torch.ceil(3.0 * torch.sqrt(v1))
        mx, my = means2d.unbind(-1)
        on_screen = (mx + radius > 0) & (mx - radius < camera.width) & (my + radius > 0) & (my - radius < camera.height)
        radii = torch.where(ok & on_screen, radius, torch.zeros_like(radius)).to(torch.int32)
    return Projected(means2d=means2d, conics=conics, depths=means_c[:, 2], radii=radii)


def tile_grid(camera: RasterCamera, tile_size: int) -> tuple[int, int]:
    """Number of tiles along x and y."""
    return math.ceil(camera.width / tile_size), math.ceil(camera.height / tile_size)
