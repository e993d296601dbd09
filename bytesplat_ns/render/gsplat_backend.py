"""gsplat 1.4.0's `rasterization()`, called as splatfacto calls it (classic mode, unpacked).

One difference: the SH colours are evaluated here (gsplat's kernel, the same formula, the colours of every
splat rather than of the visible ones only), from the camera centre of the rigid viewmat. `rasterization()`
would invert the viewmat with torch.inverse, whose singularity check makes the host wait for the GPU.
"""

from __future__ import annotations

import torch

from bytesplat_ns.render.types import RasterCamera, RasterizeOptions, RenderOutputs, Splats


def rasterize_gsplat(splats: Splats, camera: RasterCamera, opts: RasterizeOptions) -> RenderOutputs:
    from gsplat.cuda._wrapper import spherical_harmonics
    from gsplat.rendering import rasterization

    colors = splats.colors  # [N, 3] RGB
    if opts.sh_degree is not None:
        coeffs = splats.sh_coefficients()  # [N, K, 3]
        colors = spherical_harmonics(opts.sh_degree, splats.means - camera.position, coeffs)  # [N, 3]
        colors = torch.clamp_min(colors + 0.5, 0.0)
    render, alpha, info = rasterization(
        means=splats.means,
        quats=splats.quats,
        scales=splats.scales,
        opacities=splats.opacities,
        colors=colors,
        viewmats=camera.viewmat[None],  # [1, 4, 4]
        Ks=camera.K[None],  # [1, 3, 3]
        width=camera.width,
        height=camera.height,
        near_plane=opts.near_plane,
        far_plane=opts.far_plane,
        eps2d=opts.eps2d,
        tile_size=opts.tile_size,
        sh_degree=None,
        packed=False,
        absgrad=opts.absgrad,
        sparse_grad=False,
        rasterize_mode="classic",
        render_mode="RGB+ED" if opts.render_depth else "RGB",
    )
    render, alpha = render[0], alpha[0]  # [H, W, D], [H, W, 1]
    rgb = render[..., :3]
    if opts.background is not None:
        rgb = rgb + (1.0 - alpha) * opts.background
    return RenderOutputs(
        rgb=rgb,
        alpha=alpha,
        depth=render[..., 3:4] if opts.render_depth else None,
        means2d=info["means2d"],
        radii=info["radii"],
        width=camera.width,
        height=camera.height,
        backend="gsplat",
    )
