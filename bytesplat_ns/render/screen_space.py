"""The splats as one camera sees them: projection to 2D conics, SH colours, opacities (`screen_space`).

The torch and fused renderers composite what this returns, and the screen exchange (screen_exchange.py) calls it
again for another rank's camera to carry that view's screen-space gradients back to the splat parameters; both
must compute it alike, so both call this.
- torch: render/projection.py's EWA projection and render/sh.py's SH, pure PyTorch (any device);
- fused: gsplat 1.4.0's projection kernel, called as gsplat's `rasterization()` calls it, and our SH kernels
  (`ops.sh_colors`: gsplat's values, +0.5 and clamped at 0; gsplat's own SH kernels launch on the legacy default
  stream, which a CUDA graph, step_graph.py, does not record), which skip the splats the projection culled, as
  gsplat's SH does with its mask (their colour 0: no tile composites them).
"""

from __future__ import annotations

from torch import Tensor

from bytesplat_ns.render.projection import project
from bytesplat_ns.render.sh import sh_to_rgb
from bytesplat_ns.render.types import RasterCamera, RasterizeOptions, ScreenSplats, Splats


def screen_space(splats: Splats, camera: RasterCamera, opts: RasterizeOptions, backend: str) -> ScreenSplats:
    """`splats` seen from `camera` with `opts`' SH degree and cut-offs, by `backend`'s operations (torch or fused)."""
    if backend == "torch":
        proj = project(splats, camera, opts)
        colors = splat_colors(splats, camera, opts.sh_degree)
        return ScreenSplats(proj.means2d[None], proj.conics, colors, splats.opacities, proj.depths, proj.radii[None])
    if backend != "fused":
        raise ValueError(f"screen_space() computes the torch and fused renderers' splats, not {backend!r}'s.")
    from gsplat.cuda._wrapper import fully_fused_projection

    from bytesplat_ns.cuda import ops

    radii, means2d, depths, conics, _ = fully_fused_projection(
        splats.means, None, splats.quats, splats.scales, camera.viewmat[None], camera.K[None], camera.width,
        camera.height, eps2d=opts.eps2d, near_plane=opts.near_plane, far_plane=opts.far_plane, radius_clip=0.0,
        packed=False, sparse_grad=False, calc_compensations=False, camera_model="pinhole",
    )  # fmt: skip
    if opts.sh_degree is None:
        colors = splats.colors  # [N, 3]
    else:
        dc, rest = splats.sh_parts()  # [N, 3], [N, K - 1, 3]
        dirs = splats.means - camera.position  # [N, 3]
        colors = ops.sh_colors(opts.sh_degree, dc, rest, dirs, radii=radii[0])  # [N, 3]; culled splats skipped
    return ScreenSplats(means2d, conics, colors, splats.opacities, depths[0], radii)


def splat_colors(splats: Splats, camera: RasterCamera, sh_degree: int | None) -> Tensor:
    """[N, 3] colour of each splat as seen from the camera (PyTorch)."""
    if sh_degree is None:
        return splats.colors
    return sh_to_rgb(sh_degree, splats.sh_coefficients(), splats.means - camera.position)
