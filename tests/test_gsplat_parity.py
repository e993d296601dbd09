"""gsplat 1.4.0's CUDA rasterizer (backend "gsplat") against the PyTorch reference (backend "torch").

Both backends render the same random scenes (SH degree 3, a background, expected depth): the gsplat
backend in float32, as in training, and the reference in float64 from the very same float32 numbers,
as the oracle. Compared: rgb, alpha, depth, radii, means2d, then the gradients of one random-weighted
loss with respect to means, quats, scales, opacities and SH coefficients, and means2d.grad/.absgrad.

What float32 legitimately changes is kept out of the comparison, not hidden by loose tolerances:
  * Discrete per-splat decisions (radius = ceil(...), tile range, on-screen test, the Jacobian's
    field-of-view clamp) are made with a margin: splats within RADIUS_MARGIN, SCREEN_MARGIN_PX,
    TILE_MARGIN or FOV_MARGIN of such a boundary, as the float64 oracle sees them, are dropped from
    the scene before rendering (a handful at most).
  * Depths sit on a shuffled grid, so no two splats are close enough in depth to sort differently.
  * Per-pixel cut-offs (alpha >= 1/255, transmittance > 1e-4) cannot be steered clear of in a dense
    random scene: the images must match to IMAGE_ATOL except on at most OUTLIER_FRACTION of the
    values, and those must still be within OUTLIER_ATOL (about what one splat at alpha 1/255 moves).
Gradients are compared norm-wise: ||g_gsplat - g_ref|| <= GRAD_RTOL ||g_ref||.
"""

from __future__ import annotations

import pytest
import torch

from bytesplat_ns.render import RasterCamera, RasterizeOptions, Splats, rasterize
from bytesplat_ns.render.projection import project
from tests.scenes import SceneSpec, colors_grad, make_splats, random_scene, tilted_camera

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="gsplat's CUDA rasterizer needs a CUDA GPU")

CASES = {
    # name: (splats in front of the camera, width, height, seed)
    "n200-64x48": (200, 64, 48, 101),
    "n2000-200x150": (2000, 200, 150, 102),
    "n20000-37x23": (20000, 37, 23, 103),
    "n20000-200x150": (20000, 200, 150, 104),
}
DEVICE = "cuda"
SH_DEGREE = 3
BACKGROUND = (0.25, 0.5, 0.75)
NEAR_PLANE = 0.01
FAR_PLANE = 1e10

# Margins that keep discrete decisions clear of float32 rounding (float32 errs by ~1e-5 px here).
RADIUS_MARGIN = 1e-3
"""pixels between 3 sqrt(v1) and the nearest integer (radius = its ceiling)."""
SCREEN_MARGIN_PX = 1e-3
"""pixels between the radius square's edge and the image border (on-screen test)."""
TILE_MARGIN = 1e-4
"""tiles between the radius square's edge and a tile border (tile range)."""
FOV_MARGIN = 1e-5
"""between x/z (y/z) and the field-of-view limit at which gsplat clamps the Jacobian."""
DEPTH_MARGIN = 1e-4
"""between a depth and the near plane."""
MAX_DROPPED_FRACTION = 0.01

# Tolerances.
IMAGE_ATOL = 1e-4
"""rgb and alpha, per value."""
DEPTH_RTOL = 1e-4
"""expected depth, relative, per value."""
OUTLIER_FRACTION = 2e-3
"""share of values allowed past IMAGE_ATOL / DEPTH_RTOL, where a pixel sits on a per-pixel cut-off."""
OUTLIER_ATOL = 0.03
"""rgb/alpha bound even there: a splat at alpha 1/255 moves a pixel by at most ~(1/255) |colour diff|."""
MEANS2D_ATOL = 1e-3
"""pixels."""
GRAD_RTOL = 1e-3
"""norm-wise, for every gradient."""


# ----------------------------------------------------------------------------------------------
# Scenes
# ----------------------------------------------------------------------------------------------


def _on_device(scene: dict, dtype: torch.dtype, requires_grad: bool) -> Splats:
    return make_splats(**scene, dtype=dtype, device=DEVICE, requires_grad=requires_grad)


def _camera_as(cam: RasterCamera, dtype: torch.dtype) -> RasterCamera:
    return RasterCamera(viewmat=cam.viewmat.to(dtype), K=cam.K.to(dtype), width=cam.width, height=cam.height)


def _near_integer(values: torch.Tensor, margin: float) -> torch.Tensor:
    return (values - torch.round(values)).abs() < margin


def _ambiguous(scene: dict, cam: RasterCamera) -> torch.Tensor:
    """[N] True for splats whose radius, tile range, on-screen test or Jacobian clamp sits within
    float32 rounding of a boundary, as the float64 oracle's projection sees them."""
    splats = _on_device(scene, torch.float64, requires_grad=False)
    opts = RasterizeOptions(near_plane=NEAR_PLANE, far_plane=FAR_PLANE)
    with torch.no_grad():
        proj = project(splats, cam, opts)
        rot, trans = cam.viewmat[:3, :3], cam.viewmat[:3, 3]
        x, y, z = (splats.means @ rot.T + trans).unbind(-1)
        in_depth = (z >= NEAR_PLANE) & (z <= FAR_PLANE)
        bad = (z - NEAR_PLANE).abs() < DEPTH_MARGIN

        # Blurred 2D covariance back from the conic, then gsplat's radius before the ceiling.
        ca, cb, cc = proj.conics.unbind(-1)
        inv_det = ca * cc - cb * cb
        a, b, c = cc / inv_det, -cb / inv_det, ca / inv_det
        half = 0.5 * (a + c)
        extent = 3.0 * torch.sqrt(half + torch.sqrt(torch.clamp(half * half - (a * c - b * b), min=0.01)))
        radius = torch.ceil(extent)
        bad |= in_depth & _near_integer(extent, RADIUS_MARGIN)

        mx, my = proj.means2d.unbind(-1)
        borders = ((mx + radius, 0.0), (mx - radius, cam.width), (my + radius, 0.0), (my - radius, cam.height))
        for edge, limit in borders:
            bad |= in_depth & ((edge - limit).abs() < SCREEN_MARGIN_PX)
        tile = opts.tile_size
        for edge in (mx - radius, mx + radius, my - radius, my + radius):
            bad |= in_depth & _near_integer(edge / tile, TILE_MARGIN)

        fx, fy, cx, cy = cam.K[0, 0], cam.K[1, 1], cam.K[0, 2], cam.K[1, 2]
        zs = torch.where(in_depth, z, torch.ones_like(z))
        for ratio, f, centre, size in ((x / zs, fx, cx, cam.width), (y / zs, fy, cy, cam.height)):
            spare = 0.3 * 0.5 * size / f
            for limit in ((size - centre) / f + spare, -(centre / f + spare)):
                bad |= in_depth & ((ratio - limit).abs() < FOV_MARGIN)
    return bad.cpu()


def build_scene(count: int, width: int, height: int, seed: int):
    """A random scene in float32-representable numbers, the camera in float32 and float64 on CUDA.

    Besides `count` splats spread in depth in front of the camera (some off screen, some beyond the
    field-of-view clamp, on a shuffled depth grid), a few sit behind the camera.
    """
    gen = torch.Generator().manual_seed(seed)
    cam64 = tilted_camera(width, height, focal=0.9 * width)
    front = SceneSpec(
        count=count,
        sh_degree=SH_DEGREE,
        depth_range=(1.5, 12.0),
        pixel_margin=0.25 * max(width, height),
        footprint_px=(0.4, 8.0),
        opacity_range=(0.02, 0.98),
        separated_depths=True,
    )
    behind = SceneSpec(count=max(4, count // 50), sh_degree=SH_DEGREE, depth_range=(-6.0, -0.5))
    parts = [random_scene(front, cam64, gen), random_scene(behind, cam64, gen)]
    scene = {k: torch.cat([p[k] for p in parts]).float().double() for k in parts[0]}

    cam32 = _camera_as(cam64, torch.float32)
    cam32 = RasterCamera(cam32.viewmat.to(DEVICE), cam32.K.to(DEVICE), width, height)
    cam_ref = _camera_as(cam32, torch.float64)  # the same numbers as the float32 camera

    bad = _ambiguous(scene, cam_ref)
    assert bad.float().mean() <= MAX_DROPPED_FRACTION, f"{int(bad.sum())} of {bad.numel()} splats dropped"
    scene = {k: v[~bad] for k, v in scene.items()}
    return scene, cam32, cam_ref


# ----------------------------------------------------------------------------------------------
# Rendering both backends
# ----------------------------------------------------------------------------------------------


def _render_and_backprop(splats: Splats, cam: RasterCamera, backend: str, weights: dict, tile_size: int = 16) -> dict:
    """`tile_size`: the gsplat and torch backends' tile side (the fused backend picks its own)."""
    dtype = splats.means.dtype
    opts = RasterizeOptions(
        sh_degree=SH_DEGREE,
        background=torch.tensor(BACKGROUND, dtype=dtype, device=DEVICE),
        render_depth=True,
        absgrad=True,
        near_plane=NEAR_PLANE,
        far_plane=FAR_PLANE,
        tile_size=tile_size,
        backend=backend,
    )
    out = rasterize(splats, cam, opts)
    assert out.backend == backend
    out.means2d.retain_grad()
    loss = sum((getattr(out, name) * w.to(dtype)).sum() for name, w in weights.items())
    loss.backward()
    result = {name: getattr(out, name).detach() for name in ("rgb", "alpha", "depth", "means2d", "radii")}
    for name in ("means", "quats", "scales", "opacities"):
        result[f"{name}.grad"] = getattr(splats, name).grad
    result["colors.grad"] = colors_grad(splats)
    result["means2d.grad"] = out.means2d.grad
    result["means2d.absgrad"] = getattr(out.means2d, "absgrad", None)
    return result


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def rendered(request):
    pytest.importorskip("gsplat")
    from bytesplat_ns.render.rasterize import gsplat_available

    assert gsplat_available(), "gsplat is installed but its CUDA extension does not load"
    count, width, height, seed = CASES[request.param]
    torch.manual_seed(seed)
    scene, cam32, cam_ref = build_scene(count, width, height, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    weights = {
        "rgb": torch.randn(height, width, 3, generator=gen, dtype=torch.float64).to(DEVICE),
        "alpha": torch.randn(height, width, 1, generator=gen, dtype=torch.float64).to(DEVICE),
        "depth": 0.1 * torch.randn(height, width, 1, generator=gen, dtype=torch.float64).to(DEVICE),
    }
    gs = _render_and_backprop(_on_device(scene, torch.float32, True), cam32, "gsplat", weights)
    ref = _render_and_backprop(_on_device(scene, torch.float64, True), cam_ref, "torch", weights)
    yield {"gsplat": gs, "ref": ref, "name": request.param, "count": scene["means"].shape[0]}
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------
# Comparisons
# ----------------------------------------------------------------------------------------------


def _assert_mostly_close(actual: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor, tol: float, cap, what: str):
    """|actual - expected| <= tol * scale everywhere but on OUTLIER_FRACTION of the values, and
    <= cap (if given) everywhere."""
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{what}: non-finite values from gsplat"
    diff = (actual.double() - expected.double()).abs()
    outliers = diff > tol * scale
    share = outliers.double().mean().item()
    assert share <= OUTLIER_FRACTION, (
        f"{what}: {int(outliers.sum())} of {diff.numel()} values ({share:.2%}) differ beyond tolerance; "
        f"max diff {diff.max().item():.3g}, mean {diff.mean().item():.3g}"
    )
    if cap is not None:
        assert diff.max().item() <= cap, f"{what}: max diff {diff.max().item():.3g} > {cap}"


def _assert_grad_close(actual, expected, what: str):
    assert actual is not None and expected is not None, f"{what}: missing gradient"
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    assert torch.isfinite(actual).all(), f"{what}: non-finite gradient from gsplat"
    ref_norm = expected.double().norm().item()
    assert ref_norm > 0, f"{what}: the reference gradient is zero; the comparison would be empty"
    err = (actual.double() - expected.double()).norm().item() / ref_norm
    assert err <= GRAD_RTOL, f"{what}: relative error {err:.3g} > {GRAD_RTOL} (reference norm {ref_norm:.3g})"


def test_images_match(rendered):
    gs, ref = rendered["gsplat"], rendered["ref"]
    assert gs["rgb"].dtype == torch.float32 and ref["rgb"].dtype == torch.float64
    one = torch.ones((), dtype=torch.float64, device=DEVICE)
    _assert_mostly_close(gs["rgb"], ref["rgb"], one, IMAGE_ATOL, OUTLIER_ATOL, "rgb")
    _assert_mostly_close(gs["alpha"], ref["alpha"], one, IMAGE_ATOL, OUTLIER_ATOL, "alpha")
    # Depth is a ratio: where alpha is tiny a cut-off can move it a lot, so it gets no cap.
    scale = ref["depth"].abs().clamp_min(1.0)
    _assert_mostly_close(gs["depth"], ref["depth"], scale, DEPTH_RTOL, None, "depth")
    assert (ref["alpha"] > 0.5).float().mean() > 0.2, "scene too sparse to test compositing"


def test_radii_and_means2d_match(rendered):
    gs, ref = rendered["gsplat"], rendered["ref"]
    n = rendered["count"]
    assert gs["radii"].shape == ref["radii"].shape == (1, n)
    assert gs["radii"].dtype == ref["radii"].dtype == torch.int32
    mismatch = (gs["radii"] != ref["radii"]).nonzero()
    assert mismatch.numel() == 0, (
        f"{mismatch.shape[0]} radii differ, e.g. splat {mismatch[0, 1].item()}: "
        f"gsplat {gs['radii'][tuple(mismatch[0])].item()} vs reference {ref['radii'][tuple(mismatch[0])].item()}"
    )
    visible = ref["radii"] > 0
    culled = ~visible
    assert visible.float().mean() > 0.3 and culled.any(), "the scene should have both visible and culled splats"
    # gsplat leaves means2d of culled splats unwritten (zero); compare the visible ones.
    torch.testing.assert_close(
        gs["means2d"][visible].double(), ref["means2d"][visible], atol=MEANS2D_ATOL, rtol=0, msg="means2d"
    )


@pytest.mark.parametrize("name", ["means", "quats", "scales", "opacities", "colors"])
def test_parameter_gradients_match(rendered, name: str):
    gs, ref = rendered["gsplat"], rendered["ref"]
    _assert_grad_close(gs[f"{name}.grad"], ref[f"{name}.grad"], f"{rendered['name']}: {name}.grad")


@pytest.mark.parametrize("name", ["means2d.grad", "means2d.absgrad"])
def test_means2d_gradients_match(rendered, name: str):
    gs, ref = rendered["gsplat"], rendered["ref"]
    assert gs[name] is not None and gs[name].shape == ref["means2d"].shape, name
    _assert_grad_close(gs[name], ref[name], f"{rendered['name']}: {name}")
    if name == "means2d.absgrad":
        assert (gs[name] >= gs["means2d.grad"].abs() * (1 - 1e-5) - 1e-9).all()
    culled = ref["radii"] == 0
    assert (gs[name][culled] == 0).all() and (ref[name][culled] == 0).all()


def test_culled_splats_get_no_gradient(rendered):
    gs, ref = rendered["gsplat"], rendered["ref"]
    culled = (ref["radii"][0] == 0).cpu()
    for name in ("means", "quats", "scales", "opacities", "colors"):
        for result in (gs, ref):
            grad = result[f"{name}.grad"].cpu()
            assert (grad[culled] == 0).all(), name
