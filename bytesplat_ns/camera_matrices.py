"""The rasterizer's camera matrices from nerfstudio's cameras, and the training cameras' matrices and images stored
once on the device.

A nerfstudio camera holds a camera-to-world pose (OpenGL axes) and fx, fy, cx, cy; the rasterizer takes a
world-to-camera matrix (OpenCV axes) and a pinhole intrinsics matrix. Built from the camera at every training step
they cost some twenty small GPU operations; and the step graph (step_graph.py) would copy the camera's pose,
intrinsics and image into its inputs before every replay. Training cameras do not change while the camera
optimizer is off, so `CameraStack` computes their matrices once, with the same functions, and holds them with the
training images in stacked device tensors: each training camera carries its rows as views (metadata "viewmat" and
"intrinsics", flattened [1, 16] and [1, 9] as Cameras metadata must be), and a replayed step reads its camera's
rows, and its image, by a device index (one small write per step instead of six copies).

The stored intrinsics are at full resolution; `IntrinsicsScale` divides them by splatfacto's downscale factor in
one multiplication, the same values as `intrinsics_matrix(camera, downscale)` for the power-of-two factors
splatfacto uses (a float times a power of two is exact either way; tests/test_camera_matrices.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from nerfstudio.cameras.cameras import Cameras
from torch import Tensor

VIEWMAT, INTRINSICS = "viewmat", "intrinsics"
"""Metadata keys of a training camera's stored matrices ([1, 16] and [1, 9] float32 views)."""


def viewmat_from_camera_to_world(c2w: Tensor) -> Tensor:
    """Nerfstudio camera-to-world [3, 4] (OpenGL axes) -> world-to-camera [4, 4] in OpenCV axes."""
    rot = torch.cat([c2w[:, :1], -c2w[:, 1:3]], dim=1)  # flip y and z
    viewmat = torch.eye(4, dtype=c2w.dtype, device=c2w.device)
    viewmat[:3, :3] = rot.T
    viewmat[:3, 3] = -rot.T @ c2w[:, 3]
    return viewmat


def intrinsics_matrix(camera: Cameras, downscale: int = 1) -> Tensor:
    """[3, 3] float32 pinhole intrinsics of the first camera at 1/downscale resolution, built where the camera's
    tensors are (nerfstudio's get_intrinsics_matrices builds them in host memory: a copy from the GPU per entry).
    Blender scenes hold fx and fy as float64: the values are rounded to float32 as nerfstudio does."""
    fx, fy, cx, cy = (getattr(camera, name).reshape(-1)[0] / downscale for name in ("fx", "fy", "cx", "cy"))
    fx, fy, cx, cy = (value.to(torch.float32) for value in (fx, fy, cx, cy))
    zero, one = torch.zeros_like(fx), torch.ones_like(fx)
    return torch.stack([fx, zero, cx, zero, fy, cy, zero, zero, one]).view(3, 3)


def stored_matrices(camera: Cameras) -> tuple[Tensor, Tensor] | None:
    """A training camera's stored (world-to-camera [4, 4], full-resolution intrinsics [3, 3]), or None."""
    metadata = camera.metadata or {}
    if VIEWMAT not in metadata:
        return None
    return metadata[VIEWMAT].view(4, 4), metadata[INTRINSICS].view(3, 3)


class IntrinsicsScale:
    """Full-resolution intrinsics -> intrinsics at 1/downscale resolution, one multiplication (the factors are
    made once per downscale and device, outside any graph recording: the first step at a new downscale runs op by
    op, step_graph.py)."""

    def __init__(self) -> None:
        self._factors: dict[tuple[int, torch.device], Tensor] = {}

    def __call__(self, intrinsics: Tensor, downscale: int) -> Tensor:
        """[3, 3] -> [3, 3]: rows fx/cx and fy/cy divided by `downscale`."""
        if downscale == 1:
            return intrinsics
        key = (downscale, intrinsics.device)
        if key not in self._factors:
            self._factors[key] = torch.tensor([[1 / downscale], [1 / downscale], [1.0]]).to(intrinsics.device)
        return intrinsics * self._factors[key]


@dataclass
class CameraStack:
    """Some training cameras' matrices and images, stacked on the training device (row r: camera cameras[r])."""

    cameras: list[int]
    """Training camera index of each row."""
    viewmats: Tensor
    """[R, 16] float32: each camera's world-to-camera matrix (viewmat_from_camera_to_world), flattened."""
    intrinsics: Tensor
    """[R, 9] float32: each camera's full-resolution intrinsics (intrinsics_matrix), flattened."""
    images: Tensor | None
    """[R, H, W, C]: the cached training images (the cache's entries become views of it), or None when they are not
    on the device or differ in shape or dtype (a replayed step then copies its image in)."""

    def __post_init__(self) -> None:
        self.rows = {camera: row for row, camera in enumerate(self.cameras)}
        """Training camera index -> row."""

    @classmethod
    def build(cls, cameras: Cameras, cached: list[dict | None], indices: list[int], device: torch.device | str):
        """The stack of training cameras `indices` (of `cameras`, [N] Cameras) and their cached images (`cached`,
        nerfstudio's cached_train: a dict with "image" per camera); the cached images on the device are moved into
        one tensor, one at a time (never two copies of all of them), and the cache keeps views of it. The matrices
        are computed where `cameras` are (nerfstudio keeps them in host memory) and moved in one copy each: built
        on the GPU, some twenty small operations per camera took 0.2 s for lego's 100 (benchmarks/RESULTS.md)."""
        viewmats, intrinsics = [], []
        for index in indices:
            camera = cameras[index : index + 1]
            viewmats.append(viewmat_from_camera_to_world(camera.camera_to_worlds[0]).reshape(16))
            intrinsics.append(intrinsics_matrix(camera).reshape(9))
        return cls(indices, torch.stack(viewmats).to(device), torch.stack(intrinsics).to(device),
                   _stack_images(cached, indices, device))  # fmt: skip

    def metadata(self, camera: int) -> dict[str, Tensor]:
        """Camera `camera`'s rows as views: its Cameras metadata."""
        row = self.rows[camera]
        return {VIEWMAT: self.viewmats[row : row + 1], INTRINSICS: self.intrinsics[row : row + 1]}


def _stack_images(cached: list[dict | None], indices: list[int], device: torch.device | str) -> Tensor | None:
    def layout(index: int) -> tuple:
        image = cached[index]["image"]
        return image.shape, image.dtype, image.device

    shape, dtype, on = layout(indices[0])
    if on.type != torch.device(device).type or any(layout(index) != (shape, dtype, on) for index in indices):
        return None
    stack = torch.empty((len(indices), *shape), dtype=dtype, device=on)
    for row, index in enumerate(indices):
        stack[row].copy_(cached[index]["image"])
        cached[index]["image"] = stack[row]  # the cached image is freed now: one image at a time is held twice
    return stack
