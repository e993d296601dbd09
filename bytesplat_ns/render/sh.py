"""Real spherical harmonics up to degree 3, in the sign convention of 3DGS and gsplat: the torch renderer's SH, and
the reference the fused renderer's SH kernels (cuda/csrc/sh.h) are tested against."""

from __future__ import annotations

import torch
from torch import Tensor

MAX_DEGREE = 3
_Y0 = 0.28209479177387814  # 1 / (2 sqrt(pi))
_Y1 = 0.4886025119029199  # sqrt(3 / (4 pi))
_Y2 = (1.0925484305920792, 0.31539156525252005, 0.5462742152960396)
_Y3 = (0.5900435899266435, 2.890611442640554, 0.4570457994644658, 0.3731763325901154, 1.445305721320277)


def num_bases(degree: int) -> int:
    return (degree + 1) ** 2


def sh_basis(degree: int, dirs: Tensor) -> Tensor:
    """Basis values at unit directions. dirs: [..., 3] -> [..., (degree + 1) ** 2]."""
    if not 0 <= degree <= MAX_DEGREE:
        raise ValueError(f"SH degree {degree} is not supported by the torch renderer; use sh_degree <= {MAX_DEGREE}.")
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, _Y0)]
    if degree >= 1:
        out += [-_Y1 * y, _Y1 * z, -_Y1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            _Y2[0] * x * y,
            -_Y2[0] * y * z,
            _Y2[1] * (3.0 * zz - 1.0),
            -_Y2[0] * x * z,
            _Y2[2] * (xx - yy),
        ]
    if degree >= 3:
        out += [
            -_Y3[0] * y * (3.0 * xx - yy),
            _Y3[1] * x * y * z,
            -_Y3[2] * y * (5.0 * zz - 1.0),
            _Y3[3] * z * (5.0 * zz - 3.0),
            -_Y3[2] * x * (5.0 * zz - 1.0),
            _Y3[4] * z * (xx - yy),
            -_Y3[0] * x * (xx - 3.0 * yy),
        ]
    return torch.stack(out, dim=-1)


def sh_to_rgb(degree: int, coeffs: Tensor, dirs: Tensor) -> Tensor:
    """Colour seen along dirs, clamped at 0 after the +0.5 offset as gsplat does.

    coeffs: [N, K, 3] with K >= (degree + 1) ** 2; dirs: [N, 3] (any length) -> [N, 3].
    """
    k = num_bases(degree)
    if coeffs.shape[-2] < k:
        raise ValueError(f"SH degree {degree} needs {k} coefficients per splat, got {coeffs.shape[-2]}.")
    unit = dirs / dirs.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    basis = sh_basis(degree, unit)  # [N, k]
    return torch.clamp_min((basis[..., None] * coeffs[..., :k, :]).sum(dim=-2) + 0.5, 0.0)
