"""Rasterization of 3D Gaussian splats: one `rasterize()` entry, backends chosen by name."""

from bytesplat_ns.render.rasterize import BACKENDS, rasterize, resolve_backend
from bytesplat_ns.render.types import Backend, RasterCamera, RasterizeOptions, RenderOutputs, Splats

__all__ = [
    "BACKENDS",
    "Backend",
    "RasterCamera",
    "RasterizeOptions",
    "RenderOutputs",
    "Splats",
    "rasterize",
    "resolve_backend",
]
