"""The one entry point: `rasterize(splats, camera, opts)`, with interchangeable backends."""

from __future__ import annotations

import functools

import torch

from bytesplat_ns.render.fused_backend import rasterize_fused
from bytesplat_ns.render.gsplat_backend import rasterize_gsplat
from bytesplat_ns.render.torch_backend import rasterize_torch
from bytesplat_ns.render.types import RasterCamera, RasterizeOptions, RenderOutputs, Splats

BACKENDS = {"torch": rasterize_torch, "gsplat": rasterize_gsplat, "fused": rasterize_fused}


def rasterize(splats: Splats, camera: RasterCamera, opts: RasterizeOptions) -> RenderOutputs:
    """Render one camera. Every backend returns the same outputs for the same inputs (see tests)."""
    backend = resolve_backend(opts.backend, splats.means.device)
    _check_inputs(splats, camera, opts, backend)
    return BACKENDS[backend](splats, camera, opts)


def resolve_backend(name: str, device: torch.device) -> str:
    """Map "auto" to the best backend available on `device`: fused on CUDA (it needs gsplat's projection; its
    kernels build at first use, and a failed build names the fix), else torch. Fail loudly when a named one
    cannot run there."""
    if name == "auto":
        return "fused" if device.type == "cuda" and gsplat_available() else "torch"
    if name not in BACKENDS:
        raise ValueError(f"Unknown renderer {name!r}; choose one of: auto, {', '.join(BACKENDS)}.")
    if name in ("gsplat", "fused") and device.type != "cuda":
        raise RuntimeError(
            f"The {name} renderer needs CUDA tensors, got {device}. "
            "Use --pipeline.model.renderer torch (or auto) on CPU."
        )
    return name


@functools.cache
def gsplat_available() -> bool:
    """True when gsplat's CUDA module loads (it may JIT-build on first use)."""
    if not torch.cuda.is_available():
        return False
    try:
        from gsplat.cuda._backend import _C
    except ImportError:
        return False
    return _C is not None


def _check_inputs(splats: Splats, camera: RasterCamera, opts: RasterizeOptions, backend: str) -> None:
    n = splats.count
    expect = {
        "means": (splats.means, (n, 3)),
        "quats": (splats.quats, (n, 4)),
        "scales": (splats.scales, (n, 3)),
        "opacities": (splats.opacities, (n,)),
        "viewmat": (camera.viewmat, (4, 4)),
        "K": (camera.K, (3, 3)),
    }
    for name, (tensor, shape) in expect.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"rasterize(): {name} has shape {tuple(tensor.shape)}, expected {shape}.")
        if tensor.device != splats.means.device:
            raise ValueError(f"rasterize(): {name} is on {tensor.device}, means on {splats.means.device}; move both.")
    colors = tuple(splats.colors.shape)
    rest = None if splats.sh_rest is None else tuple(splats.sh_rest.shape)
    if opts.sh_degree is None:
        if colors != (n, 3) or rest is not None:
            raise ValueError(f"rasterize(): RGB colors need shape ({n}, 3) and no sh_rest, got {colors}.")
    elif rest is None:
        if len(colors) != 3 or colors[::2] != (n, 3):
            raise ValueError(f"rasterize(): SH colors need shape ({n}, K, 3), got {colors}.")
    elif colors != (n, 3) or len(rest) != 3 or rest[::2] != (n, 3):
        raise ValueError(
            f"rasterize(): SH coefficients in two parts need colors ({n}, 3) and sh_rest ({n}, K - 1, 3), got "
            f"{colors} and {rest}."
        )
    if camera.width <= 0 or camera.height <= 0:
        raise ValueError(f"rasterize(): image size {camera.width}x{camera.height} is empty.")
    if backend in ("gsplat", "fused") and splats.means.dtype != torch.float32:
        raise ValueError(f"The {backend} renderer takes float32, got {splats.means.dtype}; use the torch renderer.")
